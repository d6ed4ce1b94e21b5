"""Policy losses: clipped surrogate, KL estimators and loss aggregation.

All per-token functions take [B, L] arrays; aggregation uses the POLICY loss mask,
so prompt, tool-observation and padding tokens never contribute to a loss or to its
denominator.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# Log-ratios are clamped to this range inside the KL estimators so that an extreme
# (e.g. -inf) log-prob cannot turn the loss into inf/nan.
KL_LOG_RATIO_CLAMP = 20.0


def kl_k3(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
  """Per-token k3 estimator of KL(pi || pi_ref): exp(d) - d - 1, d = ref - logp.

  Schulman, "Approximating KL divergence" (2020), used by GRPO (arXiv:2402.03300,
  eq. 4). Unbiased for samples from pi and always >= 0. d is clamped to
  [-KL_LOG_RATIO_CLAMP, KL_LOG_RATIO_CLAMP] to keep the value finite.

  Args:
    logp, ref_logp: same-shape float32 log-probs of the sampled tokens under the
      policy and the reference model.
  """
  d = jnp.clip(ref_logp - logp, -KL_LOG_RATIO_CLAMP, KL_LOG_RATIO_CLAMP)
  return jnp.exp(d) - d - 1.0


def clipped_surrogate(
    logp: jax.Array,
    behaviour_logp: jax.Array,
    advantage: jax.Array,
    clip_low: float,
    clip_high: float,
) -> tuple[jax.Array, jax.Array]:
  """PPO clipped surrogate loss per token (to minimise).

  loss = -min(rho * A, clip(rho, 1 - clip_low, 1 + clip_high) * A),
  rho = exp(logp - behaviour_logp). Schulman et al., arXiv:1707.06347, eq. 7; the
  separate low/high clip is DAPO's clip-higher (arXiv:2503.14476).

  Returns:
    (loss [same shape], ratio rho [same shape]).
  """
  ratio = jnp.exp(logp - behaviour_logp)
  unclipped = ratio * advantage
  clipped = jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantage
  return -jnp.minimum(unclipped, clipped), ratio


def token_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
  """sum(x * mask) / max(sum(mask), 1): the mean over masked tokens of the batch."""
  mask = mask.astype(jnp.float32)
  return jnp.sum(x * mask) / jnp.maximum(jnp.sum(mask), 1.0)
