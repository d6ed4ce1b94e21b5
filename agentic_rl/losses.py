"""Policy and value losses, KL estimators and loss aggregation.

All per-token functions take [B, L] arrays (B sequences, L token positions); the
aggregation uses the POLICY loss mask `mask_bl` (bool, True exactly on sampled
tokens), so prompt, tool-observation, template and padding tokens never
contribute to a loss or to its denominator. Per-token losses are returned
unaggregated; `aggregate` (or `token_mean`) reduces them. An entropy bonus is
`aggregate(entropy_bl, mask_bl, mode)` scaled by its coefficient; it needs no
function of its own.

`POLICY_LOSSES` is the table of policy-loss types by `rl.loss_type` (the
learner looks them up there): `PolicyLoss` entries, each an array function in
rlax's style (the arrays its `inputs` name, from `INPUTS`, positionally; the
scalar settings its `settings` name, from `SETTINGS`, as keywords; arrays out;
chex shape checks) and what it needs declared: sequence-level aggregation,
one reward per episode (`reward_hat_b`), FlowRL's learned log partition
(`log_z_b`, with `LOG_PARTITION_SETTINGS`). The learner's one adapter from the
config (`learner.update.policy_loss_settings`) reads the `rl` fields the
entry declares; config validation reads the names (`LOSS_TYPES`, its keys),
those needs and which settings apply from it, and uses `AGG_MODES` and
`KL_ESTIMATORS`.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Callable

import chex
import jax
import jax.numpy as jnp
from flax import nnx

# Log-ratios d = ref_logp - logp are clamped to [-KL_LOG_RATIO_CLAMP,
# KL_LOG_RATIO_CLAMP] inside the KL estimators so that an extreme (e.g. -inf)
# log-prob cannot turn the loss into inf/nan. Consequences: |k1| <= 20,
# k2 <= 0.5 * 20**2 = 200, k3 <= exp(20) - 21 (about 4.85e8), and the gradient
# w.r.t. logp is 0 wherever the clamp is active.
KL_LOG_RATIO_CLAMP = 20.0

# Loss-aggregation modes, see `aggregate`.
AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
# Per-token KL(pi || pi_ref) estimators, see `kl_estimate`.
KL_ESTIMATORS = ("k1", "k2", "k3")


def _static_number(x) -> bool:
  """True when x is a concrete Python/NumPy number (so it can be validated)."""
  return isinstance(x, numbers.Number)


def _log_ratio(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
  """d = clip(ref_logp - logp, -KL_LOG_RATIO_CLAMP, KL_LOG_RATIO_CLAMP)."""
  return jnp.clip(ref_logp - logp, -KL_LOG_RATIO_CLAMP, KL_LOG_RATIO_CLAMP)


# ----------------------------------------------------------------------------
# KL estimators.
# ----------------------------------------------------------------------------


def kl_k1(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
  """Per-token k1 estimator of KL(pi || pi_ref): -d = logp - ref_logp.

  Schulman, "Approximating KL divergence" (2020,
  joschu.net/blog/kl-approx.html). d = ref_logp - logp, clamped to
  [-KL_LOG_RATIO_CLAMP, KL_LOG_RATIO_CLAMP]. Unbiased for tokens sampled from pi
  but can be negative per token. As a loss term its gradient is grad(logp),
  whose expectation under pi is 0: use it in the reward
  (`kl_penalized_rewards`), not in the loss.

  Args:
    logp: log-probs of the sampled tokens under the policy pi, any shape,
      float32 (nats).
    ref_logp: log-probs of the same tokens under the reference model, same
      shape and dtype.

  Returns:
    Per-token estimate, same shape as logp, float32; |value| <= 20.
  """
  return -_log_ratio(logp, ref_logp)


def kl_k2(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
  """Per-token k2 estimator of KL(pi || pi_ref): 0.5 * d**2, d = ref - logp.

  Schulman, "Approximating KL divergence" (2020). Biased (low variance), always
  >= 0. As a loss term its gradient -d * grad(logp) has expectation under pi
  equal to grad KL(pi || pi_ref). d is clamped to
  [-KL_LOG_RATIO_CLAMP, KL_LOG_RATIO_CLAMP].

  Args:
    logp: policy log-probs of the sampled tokens, any shape, float32 (nats).
    ref_logp: reference-model log-probs, same shape and dtype.

  Returns:
    Per-token estimate, same shape as logp, float32, in [0, 200].
  """
  d = _log_ratio(logp, ref_logp)
  return 0.5 * jnp.square(d)


def kl_k3(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
  """Per-token k3 estimator of KL(pi || pi_ref): exp(d) - d - 1, d = ref - logp.

  Schulman, "Approximating KL divergence" (2020), used by GRPO (arXiv:2402.03300,
  eq. 4). Unbiased for samples from pi and always >= 0. d is clamped to
  [-KL_LOG_RATIO_CLAMP, KL_LOG_RATIO_CLAMP] to keep the value finite.

  Args:
    logp, ref_logp: same-shape float32 log-probs of the sampled tokens under the
      policy and the reference model.

  Returns:
    Per-token estimate, same shape, float32, in [0, exp(20) - 21].
  """
  d = _log_ratio(logp, ref_logp)
  return jnp.exp(d) - d - 1.0


_KL_FNS = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}


def kl_estimate(name: str, logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
  """Per-token KL(pi || pi_ref) estimate by name: 'k1', 'k2' or 'k3'.

  k1 = -d, k2 = 0.5 d**2, k3 = exp(d) - d - 1 with d = ref_logp - logp clamped
  to +-KL_LOG_RATIO_CLAMP (Schulman, "Approximating KL divergence", 2020).

  Args:
    name: one of KL_ESTIMATORS.
    logp: policy log-probs, any shape, float32.
    ref_logp: reference log-probs, same shape, float32.

  Returns:
    Per-token estimate, same shape as logp, float32.

  Raises:
    ValueError: unknown name.
  """
  if name not in _KL_FNS:
    raise ValueError(
        f"Unknown KL estimator {name!r}; expected one of {KL_ESTIMATORS}."
    )
  return _KL_FNS[name](logp, ref_logp)


# ----------------------------------------------------------------------------
# Policy losses (per token / per sequence, to minimise).
# ----------------------------------------------------------------------------


def clipped_surrogate(
    logp: jax.Array,
    behaviour_logp: jax.Array,
    advantage: jax.Array,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None = None,
) -> tuple[jax.Array, jax.Array]:
  """PPO clipped surrogate loss per token (to minimise).

  loss = -min(rho * A, clip(rho, 1 - clip_low, 1 + clip_high) * A),
  rho = exp(logp - behaviour_logp). Schulman et al., arXiv:1707.06347, eq. 7; the
  separate low/high clip is DAPO's clip-higher (arXiv:2503.14476).

  With `dual_clip = c` (dual-clip PPO, Ye et al., arXiv:1912.09729), for
  A < 0 the objective is max(min(rho A, clip(rho) A), c A), i.e. the loss is
  bounded by -c * A and has zero gradient once rho > c; tokens with A >= 0 are
  unchanged. `dual_clip=None` (default) is plain PPO.

  Args:
    logp: policy log-probs of the sampled tokens, any shape, float32.
    behaviour_logp: log-probs under the behaviour (sampling) policy, same shape.
    advantage: advantages, broadcastable to logp's shape, float32.
    clip_low: lower clip epsilon (ratio floor 1 - clip_low), Python float.
    clip_high: upper clip epsilon (ratio ceiling 1 + clip_high), Python float.
    dual_clip: None, or the dual-clip constant c > 1 (a Python float; it is
      validated eagerly).

  Returns:
    (loss [same shape as logp], ratio rho [same shape]).

  Raises:
    ValueError: dual_clip is given and is not > 1.
  """
  if dual_clip is not None and not dual_clip > 1.0:
    raise ValueError(f"dual_clip must be > 1, got {dual_clip!r}.")
  ratio = jnp.exp(logp - behaviour_logp)
  unclipped = ratio * advantage
  clipped = jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantage
  objective = jnp.minimum(unclipped, clipped)
  if dual_clip is not None:
    objective = jnp.where(
        advantage < 0, jnp.maximum(objective, dual_clip * advantage), objective
    )
  return -objective, ratio


def _masked_log_ratio_mean(
    logp_bl: jax.Array, behaviour_logp_bl: jax.Array, mask_bl: jax.Array
) -> tuple[jax.Array, jax.Array]:
  """(mean over POLICY tokens of logp - behaviour [B], count [B] float32)."""
  mask = mask_bl.astype(bool)
  log_ratio = jnp.where(mask, logp_bl - behaviour_logp_bl, 0.0)
  count_b = jnp.sum(mask, axis=-1).astype(jnp.float32)
  return jnp.sum(log_ratio, axis=-1) / jnp.maximum(count_b, 1.0), count_b


def gspo_loss(
    logp_bl: jax.Array,
    behaviour_logp_bl: jax.Array,
    advantage_b: jax.Array,
    mask_bl: jax.Array,
    clip_low: float,
    clip_high: float,
) -> tuple[jax.Array, jax.Array]:
  """GSPO sequence-level clipped loss (to minimise).

  Zheng et al., "Group Sequence Policy Optimization", arXiv:2507.18071:

    s_i = exp( (1 / |y_i|) * sum_{t in y_i} (logp_t - behaviour_logp_t) ),
    loss_i = -min(s_i * A_i, clip(s_i, 1 - clip_low, 1 + clip_high) * A_i),

  where y_i are the POLICY tokens of sequence i. The GSPO objective is the mean
  of -loss_i over sequences (e.g. `jnp.mean(loss_b)`, or divide the sum by the
  number of non-empty sequences). The paper's clip ranges are small (3e-4 /
  4e-4) because s_i is a per-token geometric mean. Non-POLICY positions may hold
  any value (even +-inf): they are excluded with `jnp.where`. A sequence without
  POLICY tokens gets s_i = 1 and loss_i = 0.

  Args:
    logp_bl: [B, L] float32 policy log-probs of the sampled tokens.
    behaviour_logp_bl: [B, L] float32 behaviour-policy log-probs.
    advantage_b: [B] float32 sequence advantages.
    mask_bl: [B, L] bool POLICY loss mask.
    clip_low: lower clip epsilon on s_i.
    clip_high: upper clip epsilon on s_i.

  Returns:
    (loss_b [B] float32, s_b [B] float32 sequence importance ratios).

  Raises:
    AssertionError (chex): wrong ranks or shapes.
  """
  chex.assert_rank(
      [logp_bl, behaviour_logp_bl, mask_bl, advantage_b], [2, 2, 2, 1]
  )
  chex.assert_equal_shape([logp_bl, behaviour_logp_bl, mask_bl])
  chex.assert_equal_shape_prefix([logp_bl, advantage_b], 1)
  mean_log_ratio_b, count_b = _masked_log_ratio_mean(
      logp_bl, behaviour_logp_bl, mask_bl
  )
  s_b = jnp.exp(mean_log_ratio_b)
  objective_b = jnp.minimum(
      s_b * advantage_b,
      jnp.clip(s_b, 1.0 - clip_low, 1.0 + clip_high) * advantage_b,
  )
  loss_b = jnp.where(count_b > 0, -objective_b, 0.0)
  return loss_b, s_b


def gspo_token_loss(
    logp_bl: jax.Array,
    behaviour_logp_bl: jax.Array,
    advantage: jax.Array,
    mask_bl: jax.Array,
    clip_low: float,
    clip_high: float,
) -> tuple[jax.Array, jax.Array]:
  """GSPO-token per-token clipped loss (to minimise).

  Zheng et al., arXiv:2507.18071 (GSPO-token):

    s_{i,t} = sg[s_i] * exp(logp_t - sg[logp_t]),
    loss_{i,t} = -min(s_{i,t} A_{i,t}, clip(s_{i,t}, 1 - lo, 1 + hi) A_{i,t}),

  with s_i as in `gspo_loss` and sg = stop_gradient. The value of s_{i,t} is
  s_i, so with A_{i,t} = A_i every token's loss equals `gspo_loss`'s loss_i,
  and d loss_{i,t} / d logp_t = -A_i s_i when unclipped (0 when clipped).
  Aggregated with `aggregate(..., 'seq-mean-token-mean')` over sequences that
  all have POLICY tokens, the gradient equals that of `mean(gspo_loss(...)[0])`,
  namely -A_i s_i / (B |y_i|) per unclipped token. Non-POLICY positions may hold
  any value; they get no gradient.

  Args:
    logp_bl: [B, L] float32 policy log-probs.
    behaviour_logp_bl: [B, L] float32 behaviour-policy log-probs.
    advantage: [B] float32 sequence advantages (broadcast over tokens) or
      [B, L] float32 per-token advantages.
    mask_bl: [B, L] bool POLICY loss mask.
    clip_low: lower clip epsilon on s_{i,t}.
    clip_high: upper clip epsilon on s_{i,t}.

  Returns:
    (loss_bl [B, L] float32, unaggregated and 0 on rows without POLICY tokens;
     ratio_bl [B, L] float32, the value s_i broadcast over the row).

  Raises:
    AssertionError (chex): wrong ranks or shapes.
  """
  chex.assert_rank([logp_bl, behaviour_logp_bl, mask_bl], 2)
  chex.assert_rank(advantage, {1, 2})
  chex.assert_equal_shape([logp_bl, behaviour_logp_bl, mask_bl])
  chex.assert_equal_shape_prefix([logp_bl, advantage], advantage.ndim)
  mask = mask_bl.astype(bool)
  advantage_bl = advantage if advantage.ndim == 2 else advantage[:, None]
  mean_log_ratio_b, count_b = _masked_log_ratio_mean(
      logp_bl, behaviour_logp_bl, mask
  )
  s_b = jax.lax.stop_gradient(jnp.exp(mean_log_ratio_b))
  own = jnp.where(mask, logp_bl - jax.lax.stop_gradient(logp_bl), 0.0)
  ratio_bl = s_b[:, None] * jnp.exp(own)
  objective_bl = jnp.minimum(
      ratio_bl * advantage_bl,
      jnp.clip(ratio_bl, 1.0 - clip_low, 1.0 + clip_high) * advantage_bl,
  )
  loss_bl = jnp.where(count_b[:, None] > 0, -objective_bl, 0.0)
  return loss_bl, ratio_bl


def cispo_loss(
    logp: jax.Array,
    behaviour_logp: jax.Array,
    advantage: jax.Array,
    clip_low: float,
    clip_high: float,
) -> tuple[jax.Array, jax.Array]:
  """CISPO per-token loss (to minimise): -sg(clip(rho, 1-lo, 1+hi)) * A * logp.

  MiniMax-M1, "Scaling Test-Time Compute Efficiently with Lightning Attention",
  arXiv:2506.13585; rho = exp(logp - behaviour_logp), sg =
  stop_gradient. The importance weight is clipped and stopped, never the
  token: every token keeps the gradient -clip(rho) * A * grad(logp), including
  tokens whose ratio is clipped. The loss value itself is a surrogate (it
  scales with logp) and is only meaningful through its gradient. Aggregate with
  `aggregate` (which masks with `jnp.where`) so that junk log-probs at
  non-POLICY positions cannot leak in.

  Args:
    logp: policy log-probs of the sampled tokens, any shape, float32.
    behaviour_logp: behaviour-policy log-probs, same shape.
    advantage: advantages, broadcastable to logp's shape, float32.
    clip_low: lower clip epsilon of the weight (MiniMax-M1 effectively uses no
      lower clip: pass a large value, e.g. 1.0).
    clip_high: upper clip epsilon of the weight.

  Returns:
    (loss [same shape as logp], ratio rho [same shape], not clipped).
  """
  ratio = jnp.exp(logp - behaviour_logp)
  weight = jax.lax.stop_gradient(
      jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
  )
  return -weight * advantage * logp, jax.lax.stop_gradient(ratio)


def value_loss(
    values: jax.Array,
    old_values: jax.Array,
    returns: jax.Array,
    mask: jax.Array,
    clip_eps: float,
    *,
    denominator: jax.Array | float | None = None,
) -> jax.Array:
  """PPO clipped value loss, token-mean over the mask.

  loss_t = 0.5 * max((V_t - R_t)**2,
                     (V_old_t + clip(V_t - V_old_t, -eps, eps) - R_t)**2),
  aggregated by 'token-mean' (sum over masked tokens / number of masked tokens).
  Schulman et al., arXiv:1707.06347; the clipped form is OpenAI baselines' ppo2
  (`baselines/ppo2/model.py`).

  Args:
    values: [B, L] float32 value predictions V of the current parameters.
    old_values: [B, L] float32 value predictions at rollout time V_old.
    returns: [B, L] float32 value targets R.
    mask: [B, L] bool loss mask (POLICY tokens).
    clip_eps: value clip range eps >= 0 (in return units).
    denominator: optional full-batch token count, as in `aggregate`.

  Returns:
    Scalar float32 loss.

  Raises:
    ValueError: clip_eps is a concrete number < 0.
    AssertionError (chex): wrong ranks or shapes.
  """
  if _static_number(clip_eps) and clip_eps < 0:
    raise ValueError(f"clip_eps must be >= 0, got {clip_eps!r}.")
  chex.assert_rank([values, old_values, returns, mask], 2)
  chex.assert_equal_shape([values, old_values, returns, mask])
  clipped = old_values + jnp.clip(values - old_values, -clip_eps, clip_eps)
  loss_bl = 0.5 * jnp.maximum(
      jnp.square(values - returns), jnp.square(clipped - returns)
  )
  return aggregate(loss_bl, mask, "token-mean", denominator=denominator)


# ----------------------------------------------------------------------------
# Aggregation.
# ----------------------------------------------------------------------------


def token_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
  """sum(x * mask) / max(sum(mask), 1): the mean over masked tokens of the batch."""
  mask = mask.astype(jnp.float32)
  return jnp.sum(x * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def length_mask(
    length_b: jax.Array, num_positions: int, start_b: jax.Array | None = None
) -> jax.Array:
  """[B, L] bool mask of each row's real positions, from lengths only.

  mask[b, t] = start_b[b] <= t < start_b[b] + length_b[b] (start defaults
  to 0). Masks never come from comparing token ids with a pad or eos id
  (docs/design.md): with pad id == eos id, a response [7, 8, 2, 2, 2]
  of real length 3 (its eos included) gets [1, 1, 1, 0, 0].

  Args:
    length_b: [B] int real lengths.
    num_positions: L (static).
    start_b: optional [B] int first real position of each row.

  Returns:
    [B, L] bool.
  """
  t = jnp.arange(num_positions)[None, :]
  start = 0 if start_b is None else start_b[:, None]
  return (t >= start) & (t < start + length_b[:, None])


def _check_mode(mode: str) -> None:
  if mode not in AGG_MODES:
    raise ValueError(
        f"Unknown aggregation mode {mode!r}; expected one of {AGG_MODES}."
    )


def aggregation_denominator(
    mask_bl: jax.Array,
    mode: str,
    norm_constant: float | None = None,
) -> jax.Array:
  """The denominator `aggregate` uses, computed on a (full) batch's mask.

  'token-mean': sum(mask), the number of POLICY tokens.
  'seq-mean-token-mean': the number of sequences with >= 1 POLICY token.
  'seq-mean-token-sum-norm': B * norm_constant (norm_constant defaults to L).

  The value is not clamped and is additive over disjoint parts of a batch: the
  denominator of the whole optimizer batch is the sum of the parts' values
  (across micro-batches, or `jax.lax.psum` across devices; for the last mode all
  parts must use the same norm_constant). Pass it as `aggregate(...,
  denominator=...)` for every micro-batch; the micro-batch aggregates then sum
  to the full-batch aggregate.

  Args:
    mask_bl: [B, L] bool POLICY loss mask of the whole batch.
    mode: one of AGG_MODES.
    norm_constant: for 'seq-mean-token-sum-norm' only (e.g. the maximum response
      length); defaults to L. Ignored by the other modes.

  Returns:
    Scalar float32 denominator.

  Raises:
    ValueError: unknown mode.
    AssertionError (chex): mask not rank 2.
  """
  _check_mode(mode)
  chex.assert_rank(mask_bl, 2)
  mask = mask_bl.astype(bool)
  if mode == "token-mean":
    return jnp.sum(mask).astype(jnp.float32)
  if mode == "seq-mean-token-mean":
    return jnp.sum(jnp.any(mask, axis=-1)).astype(jnp.float32)
  b, l = mask.shape
  c = l if norm_constant is None else norm_constant
  return jnp.asarray(b * c, jnp.float32)


def aggregate(
    x_bl: jax.Array,
    mask_bl: jax.Array,
    mode: str,
    *,
    num_sequences: int | None = None,
    norm_constant: float | None = None,
    denominator: jax.Array | float | None = None,
) -> jax.Array:
  """Reduces a per-token [B, L] quantity over the POLICY mask to a scalar.

  With m = mask_bl, n_i = sum_t m_it and sums over masked tokens only:

  'token-mean' (GRPO as implemented by most trainers; DAPO, arXiv:2503.14476):
      sum_{i,t} m x / D,   D = sum_{i,t} m.
  'seq-mean-token-mean' (GRPO as written, Shao et al., arXiv:2402.03300):
      sum_i (sum_t m x / n_i) / D,   D = #{i : n_i >= 1}.
  'seq-mean-token-sum-norm' (Dr.GRPO constant normaliser, Liu et al.,
  arXiv:2503.20783):
      sum_{i,t} m x / D,   D = num_sequences * norm_constant,
      num_sequences defaults to B and norm_constant to L.

  `denominator`, when given, replaces D (num_sequences and norm_constant are
  then ignored). Pass `aggregation_denominator(full_mask, mode, norm_constant)`
  of the whole optimizer batch (summed over micro-batches / psum-ed over
  devices) so that micro-batch results sum to the full-batch result. A
  denominator <= 0 is treated as 1 (the numerator is then 0), so an all-masked
  batch gives 0.
  Masking uses `jnp.where`, so non-POLICY positions may hold any value (even
  inf/nan) without changing the result. An entropy bonus is
  `coef * aggregate(entropy_bl, mask_bl, mode)`.

  Args:
    x_bl: [B, L] float32 per-token values (loss, KL, entropy...).
    mask_bl: [B, L] bool POLICY loss mask.
    mode: one of AGG_MODES.
    num_sequences: 'seq-mean-token-sum-norm' only: the sequence count
      (default B).
    norm_constant: 'seq-mean-token-sum-norm' only: the per-sequence token
      normaliser (e.g. maximum response length); default L.
    denominator: optional scalar replacing D (see above).

  Returns:
    Scalar float32.

  Raises:
    ValueError: unknown mode.
    AssertionError (chex): x and mask not the same rank-2 shape.
  """
  _check_mode(mode)
  chex.assert_rank([x_bl, mask_bl], 2)
  chex.assert_equal_shape([x_bl, mask_bl])
  mask = mask_bl.astype(bool)
  x = jnp.where(mask, x_bl, 0.0).astype(jnp.float32)
  if mode == "seq-mean-token-mean":
    count_b = jnp.sum(mask, axis=-1).astype(jnp.float32)
    numerator = jnp.sum(jnp.sum(x, axis=-1) / jnp.maximum(count_b, 1.0))
  else:
    numerator = jnp.sum(x)
  if denominator is None:
    if mode == "seq-mean-token-sum-norm":
      b, l = mask.shape
      n = b if num_sequences is None else num_sequences
      c = l if norm_constant is None else norm_constant
      denominator = jnp.asarray(n * c, jnp.float32)
    else:
      denominator = aggregation_denominator(mask, mode)
  denominator = jnp.asarray(denominator, jnp.float32)
  return numerator / jnp.where(denominator > 0, denominator, 1.0)


# ----------------------------------------------------------------------------
# KL in the reward and adaptive KL coefficient.
# ----------------------------------------------------------------------------


def kl_penalized_rewards(
    rewards_b: jax.Array,
    logp_bl: jax.Array,
    ref_logp_bl: jax.Array,
    mask_bl: jax.Array,
    coef: float | jax.Array,
    estimator: str = "k1",
) -> jax.Array:
  """Sequence rewards with a KL penalty: r_i - coef * sum_{t in y_i} KL_t.

  KL_t is the per-token `kl_estimate(estimator, logp, ref_logp)` and the sum
  runs over POLICY tokens only (Ziegler et al., arXiv:1909.08593; Ouyang et
  al., arXiv:2203.02155; both use k1). The penalty is part of the reward: the
  result is wrapped in `jax.lax.stop_gradient`, so no gradient flows through it
  into logp, ref_logp or coef.

  Args:
    rewards_b: [B] float32 sequence rewards.
    logp_bl: [B, L] float32 log-probs of the sampled tokens under the policy
      that generated them (behaviour log-probs).
    ref_logp_bl: [B, L] float32 reference-model log-probs.
    mask_bl: [B, L] bool POLICY loss mask.
    coef: KL coefficient beta >= 0, scalar.
    estimator: one of KL_ESTIMATORS.

  Returns:
    [B] float32 penalised rewards.

  Raises:
    ValueError: unknown estimator.
    AssertionError (chex): wrong ranks or shapes.
  """
  chex.assert_rank([rewards_b, logp_bl, ref_logp_bl, mask_bl], [1, 2, 2, 2])
  chex.assert_equal_shape([logp_bl, ref_logp_bl, mask_bl])
  chex.assert_equal_shape_prefix([rewards_b, logp_bl], 1)
  kl_bl = kl_estimate(estimator, logp_bl, ref_logp_bl)
  kl_b = jnp.sum(jnp.where(mask_bl.astype(bool), kl_bl, 0.0), axis=-1)
  return jax.lax.stop_gradient(rewards_b - coef * kl_b)


def adaptive_kl_update(
    coef: float | jax.Array,
    observed_kl: float | jax.Array,
    target_kl: float,
    horizon: float,
    batch_size: int | jax.Array,
) -> jax.Array:
  """Adaptive KL coefficient (proportional controller on the observed KL).

  beta' = beta * (1 + clip(KL / KL_target - 1, -0.2, 0.2) * n / H).
  Ziegler et al., "Fine-Tuning Language Models from Human Preferences",
  arXiv:1909.08593 (proportional controller, error clipped to
  [-0.2, 0.2]); the gain n / H (batch_size / horizon) is their released code's
  `AdaptiveKLController` (openai/lm-human-preferences).

  Args:
    coef: current coefficient beta >= 0, scalar.
    observed_kl: measured KL(pi || pi_ref) of the batch (nats per sequence, in
      the same units as target_kl), scalar.
    target_kl: target KL > 0.
    horizon: controller horizon H > 0 (in samples).
    batch_size: samples n seen since the last update.

  Returns:
    Scalar float32 new coefficient.

  Raises:
    ValueError: target_kl or horizon is a concrete number <= 0.
  """
  if _static_number(target_kl) and target_kl <= 0:
    raise ValueError(f"target_kl must be > 0, got {target_kl!r}.")
  if _static_number(horizon) and horizon <= 0:
    raise ValueError(f"horizon must be > 0, got {horizon!r}.")
  error = jnp.clip(
      jnp.asarray(observed_kl, jnp.float32) / target_kl - 1.0, -0.2, 0.2
  )
  return jnp.asarray(coef, jnp.float32) * (1.0 + error * batch_size / horizon)


# ----------------------------------------------------------------------------
# Self-imitation.
# ----------------------------------------------------------------------------


def self_imitation_loss(
    logp_bl: jax.Array,
    mask_bl: jax.Array,
    return_b: jax.Array,
    baseline_b: jax.Array,
    valid_b: jax.Array | None = None,
) -> jax.Array:
  """Self-imitation loss on replayed episodes.

  L_SIL = - sum_{b,t} m_bt w_b log pi(a_bt | s_bt) / max(sum_{b,t} m_bt, 1),
  w_b = max(R_b - b_b, 0) (no gradient through w), m_bt = mask_bt * valid_b.

  Oh et al., "Self-Imitation Learning", arXiv:1806.05635, eq. 2 (policy term,
  with the episode return R and a baseline b in place of V(s)); as used for
  agentic LLMs by SPEAR (Qin et al., arXiv:2509.22601) with b recomputed for
  the current policy (`replay.sil_baselines`). Episodes that did no better
  than the baseline contribute 0 (but still count in the denominator).

  Args:
    logp_bl: [B, L] float32 current-policy log-probs of the episode tokens.
    mask_bl: [B, L] bool POLICY-token mask.
    return_b: [B] float returns R of the replayed episodes.
    baseline_b: [B] float baselines.
    valid_b: optional [B] bool; rows with False are left out entirely.

  Returns:
    float32 scalar loss.
  """
  chex.assert_rank([logp_bl, mask_bl], 2)
  chex.assert_rank([return_b, baseline_b], 1)
  m = mask_bl.astype(bool)
  if valid_b is not None:
    m = m & valid_b.astype(bool)[:, None]
  w_b = jax.lax.stop_gradient(
      jnp.maximum(jnp.asarray(return_b, jnp.float32) - baseline_b, 0.0)
  )
  x = jnp.where(m, -w_b[:, None] * logp_bl, 0.0)
  return jnp.sum(x) / jnp.maximum(jnp.sum(m.astype(jnp.float32)), 1.0)


# ----------------------------------------------------------------------------
# FlowRL: reward-distribution matching with a learned log-partition.
# ----------------------------------------------------------------------------


def flowrl_loss(
    logp_bl: jax.Array,
    behaviour_logp_bl: jax.Array,
    ref_logp_bl: jax.Array,
    mask_bl: jax.Array,
    reward_hat_b: jax.Array,
    log_z_b: jax.Array,
    *,
    beta: float,
    clip_eps: float = 0.2,
    denominator: jax.Array | float | None = None,
) -> tuple[jax.Array, jax.Array]:
  """FlowRL trajectory-balance loss (reverse KL to a reward-tilted target).

  Zhu et al., "FlowRL: Matching Reward Distributions for LLM Reasoning",
  arXiv:2509.15207: the target p*(y|x) = pi_ref(y|x) exp(beta r(x, y)) / Z(x)
  with a learned log Z_phi(x); minimising the reverse KL is (in expected
  gradient) the GFlowNet trajectory-balance loss, with length normalisation
  and a clipped, detached importance weight for off-policy samples:

    delta_b = log Z_phi(x_b) + (1/|y_b|) log pi_theta(y_b|x_b)
              - beta r_hat_b - (1/|y_b|) log pi_ref(y_b|x_b),
    w_b     = sg(clip(pi_theta(y_b|x_b) / pi_old(y_b|x_b), 1 - eps, 1 + eps)),
    L       = sum_b w_b delta_b^2 / D,  D = #{b : |y_b| >= 1} (or `denominator`).

  What is from where: the target distribution, the reverse-KL / trajectory-
  balance equivalence and the learned log Z_phi(x) are in the paper's
  abstract and in our reading of it (docs/papers.md), which marks the squared
  form as inferred and names length normalisation and importance weighting
  as the full paper's additions. Their exact form here (1/|y| on both
  log-probs, w = detached clip(pi/pi_old, 1 - eps, 1 + eps), r_hat = group
  z-scored reward) follows the paper's final objective as we read it; the
  paper text was not available while writing this, and the form was
  cross-checked against the authors' code and secondary summaries, so treat
  it as inferred-and-cross-checked. The authors' released verl code
  (github.com/Xuekai-Zhu/FlowRL, `compute_flowrl_objective`) differs in two
  details that we do NOT follow: it clamps the weight only from above (at 10)
  instead of to [1 - eps, 1 + eps], and it averages over all rows. Their
  beta = 15 is our config default (`rl.flowrl_beta`). The sequence log-prob is
  the sum over POLICY tokens (observation and template tokens of a multi-turn
  episode are conditioning, not part of y): our extension to multi-turn
  episodes, inferred.

  r_hat is the group-normalised reward (e.g. `advantages.grpo_advantages`),
  as in the paper. log p of a sequence = sum of its POLICY-token log-probs.
  Passing `denominator` = `aggregation_denominator(full_mask,
  'seq-mean-token-mean')` of the whole optimizer batch makes micro-batch
  losses sum to the full-batch loss.

  Args:
    logp_bl: [B, L] float32 current-policy log-probs (gradient flows).
    behaviour_logp_bl: [B, L] float32 behaviour log-probs (pi_old).
    ref_logp_bl: [B, L] float32 reference-model log-probs.
    mask_bl: [B, L] bool POLICY-token mask.
    reward_hat_b: [B] float normalised rewards.
    log_z_b: [B] float32 log-partition estimates (gradient flows to phi).
    beta: reward temperature (> 0).
    clip_eps: importance-weight clip.
    denominator: optional row count replacing D (see above); <= 0 is
      treated as 1.

  Returns:
    (loss float32 scalar, delta_b [B] float32 for logging).

  Raises:
    ValueError: a concrete beta <= 0.
  """
  if _static_number(beta) and beta <= 0:
    raise ValueError(f"beta must be > 0, got {beta!r}.")
  chex.assert_equal_shape([logp_bl, behaviour_logp_bl, ref_logp_bl, mask_bl])
  chex.assert_rank([reward_hat_b, log_z_b], 1)
  m = mask_bl.astype(jnp.float32)
  n_b = jnp.sum(m, axis=1)
  safe_n = jnp.maximum(n_b, 1.0)
  seq = lambda x: jnp.sum(jnp.where(mask_bl, x, 0.0), axis=1)
  delta_b = (
      log_z_b
      + seq(logp_bl) / safe_n
      - beta * reward_hat_b
      - seq(ref_logp_bl) / safe_n
  )
  log_w = jnp.clip(seq(logp_bl - behaviour_logp_bl), -20.0, 20.0)
  w_b = jax.lax.stop_gradient(
      jnp.clip(jnp.exp(log_w), 1.0 - clip_eps, 1.0 + clip_eps)
  )
  valid = (n_b > 0).astype(jnp.float32)
  if denominator is None:
    denominator = jnp.sum(valid)
  denominator = jnp.asarray(denominator, jnp.float32)
  loss = jnp.sum(valid * w_b * jnp.square(delta_b)) / jnp.where(
      denominator > 0, denominator, 1.0
  )
  return loss, delta_b


class LogPartition(nnx.Module):
  """Learned log Z_phi(x) for FlowRL (arXiv:2509.15207).

  hidden_dim == 0: one scalar shared by all prompts. hidden_dim > 0: an MLP
  (Linear -> GELU -> Linear) on a pooled prompt embedding, as in the paper's
  partition network (there a 3-layer MLP on the policy's prompt states). The
  output layer starts at zero, so log Z = 0 at initialisation.
  """

  def __init__(self, in_dim: int, hidden_dim: int, *, rngs: nnx.Rngs):
    self.hidden_dim = hidden_dim
    if hidden_dim == 0:
      self.log_z = nnx.Param(jnp.zeros((), jnp.float32))
    else:
      self.hidden = nnx.Linear(in_dim, hidden_dim, rngs=rngs)
      self.out = nnx.Linear(
          hidden_dim, 1, kernel_init=nnx.initializers.zeros, rngs=rngs
      )

  def __call__(self, pooled_bd: jax.Array) -> jax.Array:
    """[B, D] pooled prompt embeddings -> [B] float32 log Z."""
    if self.hidden_dim == 0:
      return jnp.broadcast_to(self.log_z[...], pooled_bd.shape[:1])
    return self.out(jax.nn.gelu(self.hidden(pooled_bd)))[:, 0]


def masked_mean_pool(h_bld: jax.Array, mask_bl: jax.Array) -> jax.Array:
  """[B, D] mean of h over the positions where mask (e.g. PROMPT role) is set."""
  m = mask_bl.astype(h_bld.dtype)[..., None]
  return jnp.sum(h_bld * m, axis=1) / jnp.maximum(jnp.sum(m, axis=1), 1.0)


# ----------------------------------------------------------------------------
# The policy-loss table (`rl.loss_type`).
# ----------------------------------------------------------------------------

# The positional arrays a policy-loss entry may take (`PolicyLoss.inputs`), as
# the learner's update passes them for one micro-batch
# (`learner.update._rl_loss`). B rows, L token positions.
INPUTS = {
    "logp_bl": "[B, L] float32 log-probs under the current parameters (the "
    "gradient flows through them)",
    "behaviour_logp_bl": "[B, L] float32 behaviour log-probs of the "
    "importance ratio",
    "advantage_bl": "[B, L] float32 per-token advantages",
    "mask_bl": "[B, L] bool POLICY-token loss mask",
    "ref_logp_bl": "[B, L] float32 reference-model log-probs",
    "denominator": "[] float32 aggregation denominator of the optimizer batch "
    "(`aggregation_denominator` for rl.loss_agg_mode), or None for the "
    "micro-batch's own",
    "reward_hat_b": "[B] float32 normalised episode reward "
    "(`LearnerBatch.reward_hat`, the episode-level advantage; the batch "
    "carries it only for an entry that takes it)",
    "log_z_b": "[B] float32 FlowRL's learned log Z_phi(x): `LogPartition` "
    "(state `TrainState.features['flowrl']`) on "
    "`LearnerBatch.prompt_embedding` (carried only for an entry that takes "
    "it)",
}

# The keyword settings an entry may take (`PolicyLoss.settings`) and the `rl`
# config field each comes from (read by `learner.update.policy_loss_settings`
# and passed as the config holds them).
SETTINGS = {
    "clip_low": "rl.clip_low",
    "clip_high": "rl.clip_high",
    "dual_clip": "rl.dual_clip",
    "beta": "rl.flowrl_beta",
    "clip_eps": "rl.flowrl_clip",
}

# The `rl` fields the learner reads around the policy term for every entry:
# the aggregation of the per-token loss (`aggregate`) and the clip-fraction
# metrics (also the clip of the auxiliary dense surrogate).
SHARED_SETTINGS = (
    "rl.loss_agg_mode",
    "rl.loss_norm_constant",
    "rl.clip_low",
    "rl.clip_high",
)

# The `rl` fields of FlowRL's log-partition network, read for an entry that
# takes `log_z_b`: its hidden width (`LogPartition`, 0 = one scalar) and the
# learning rate of its own Adam (`learner.update.make_log_partition_optimizer`).
LOG_PARTITION_SETTINGS = ("rl.flowrl_log_z_hidden", "rl.flowrl_log_z_lr")


def _check_bl(*arrays_bl: jax.Array) -> None:
  """chex: every array is rank 2 and they share one [B, L] shape."""
  chex.assert_rank(list(arrays_bl), 2)
  chex.assert_equal_shape(list(arrays_bl))


def ppo_policy_loss(
    logp_bl: jax.Array,
    behaviour_logp_bl: jax.Array,
    advantage_bl: jax.Array,
    *,
    clip_low: float,
    clip_high: float,
    dual_clip: float,
) -> tuple[jax.Array, jax.Array, None]:
  """'ppo': the clipped surrogate per token (`clipped_surrogate`).

  loss_t = -min(rho_t A_t, clip(rho_t, 1 - clip_low, 1 + clip_high) A_t),
  rho_t = exp(logp_t - behaviour_logp_t) (Schulman et al., arXiv:1707.06347,
  eq. 7; separate low / high clip: DAPO, arXiv:2503.14476); with
  dual_clip = c > 0, for A_t < 0 the objective is max(that, c A_t) (dual-clip
  PPO, Ye et al., arXiv:1912.09729); dual_clip = 0 is plain PPO.

  Args:
    logp_bl: [B, L] float32 current-policy log-probs.
    behaviour_logp_bl: [B, L] float32 behaviour log-probs.
    advantage_bl: [B, L] float32 advantages.
    clip_low: lower clip epsilon (`rl.clip_low`).
    clip_high: upper clip epsilon (`rl.clip_high`).
    dual_clip: `rl.dual_clip`: 0 (off) or the constant c > 1.

  Returns:
    (loss_bl [B, L] float32 unaggregated, ratio_bl [B, L] float32, None: the
    learner aggregates loss_bl by `rl.loss_agg_mode`).

  Raises:
    ValueError: dual_clip in (0, 1].
    AssertionError (chex): the arrays are not one [B, L] shape.
  """
  _check_bl(logp_bl, behaviour_logp_bl, advantage_bl)
  pg, ratio = clipped_surrogate(
      logp_bl,
      behaviour_logp_bl,
      advantage_bl,
      clip_low,
      clip_high,
      dual_clip=dual_clip if dual_clip > 0 else None,
  )
  return pg, ratio, None


def cispo_policy_loss(
    logp_bl: jax.Array,
    behaviour_logp_bl: jax.Array,
    advantage_bl: jax.Array,
    *,
    clip_low: float,
    clip_high: float,
) -> tuple[jax.Array, jax.Array, None]:
  """'cispo': clipped, stopped importance weights (`cispo_loss`).

  loss_t = -sg(clip(rho_t, 1 - clip_low, 1 + clip_high)) A_t logp_t
  (MiniMax-M1, arXiv:2506.13585); every token keeps its gradient.

  Args:
    logp_bl: [B, L] float32 current-policy log-probs.
    behaviour_logp_bl: [B, L] float32 behaviour log-probs.
    advantage_bl: [B, L] float32 advantages.
    clip_low: lower clip epsilon of the weight (`rl.clip_low`).
    clip_high: upper clip epsilon of the weight (`rl.clip_high`).

  Returns:
    (loss_bl [B, L] float32, ratio_bl [B, L] float32 unclipped and stopped,
    None: aggregated by `rl.loss_agg_mode`).

  Raises:
    AssertionError (chex): the arrays are not one [B, L] shape.
  """
  _check_bl(logp_bl, behaviour_logp_bl, advantage_bl)
  pg, ratio = cispo_loss(
      logp_bl, behaviour_logp_bl, advantage_bl, clip_low, clip_high
  )
  return pg, ratio, None


def gspo_policy_loss(
    logp_bl: jax.Array,
    behaviour_logp_bl: jax.Array,
    advantage_bl: jax.Array,
    mask_bl: jax.Array,
    *,
    clip_low: float,
    clip_high: float,
) -> tuple[jax.Array, jax.Array, None]:
  """'gspo' and 'gspo_token': GSPO-token per token (`gspo_token_loss`).

  s_i = exp(mean over row i's POLICY tokens of (logp - behaviour_logp)),
  loss_{i,t} = -min(s_i A_{i,t}, clip(s_i, 1 - clip_low, 1 + clip_high)
  A_{i,t}) in value, with the gradient of GSPO-token (Zheng et al.,
  arXiv:2507.18071); with 'seq-mean-token-mean' aggregation (required for
  'gspo' by validation) it is GSPO's sequence-level loss.

  Args:
    logp_bl: [B, L] float32 current-policy log-probs.
    behaviour_logp_bl: [B, L] float32 behaviour log-probs.
    advantage_bl: [B, L] float32 advantages.
    mask_bl: [B, L] bool POLICY-token mask.
    clip_low: lower clip epsilon on s (`rl.clip_low`).
    clip_high: upper clip epsilon on s (`rl.clip_high`).

  Returns:
    (loss_bl [B, L] float32, 0 on rows without POLICY tokens; ratio_bl
    [B, L] float32, s_i broadcast over row i; None).

  Raises:
    AssertionError (chex): the arrays are not one [B, L] shape.
  """
  _check_bl(logp_bl, behaviour_logp_bl, advantage_bl, mask_bl)
  pg, ratio = gspo_token_loss(
      logp_bl,
      behaviour_logp_bl,
      advantage_bl,
      mask_bl,
      clip_low,
      clip_high,
  )
  return pg, ratio, None


def flowrl_policy_loss(
    logp_bl: jax.Array,
    behaviour_logp_bl: jax.Array,
    ref_logp_bl: jax.Array,
    mask_bl: jax.Array,
    reward_hat_b: jax.Array,
    log_z_b: jax.Array,
    denominator: jax.Array | float | None,
    *,
    beta: float,
    clip_eps: float,
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """'flowrl': the trajectory-balance loss (`flowrl_loss`, arXiv:2509.15207).

  L = sum_b w_b delta_b^2 / D with delta_b = log Z_b + logp(y_b) / |y_b|
  - beta r_hat_b - ref_logp(y_b) / |y_b| and w_b = sg(clip(pi / pi_old,
  1 - clip_eps, 1 + clip_eps)) (equation and sources: `flowrl_loss`). The
  per-token loss is 0; the scalar replaces its aggregate.

  Args:
    logp_bl: [B, L] float32 current-policy log-probs.
    behaviour_logp_bl: [B, L] float32 behaviour log-probs (pi_old).
    ref_logp_bl: [B, L] float32 reference log-probs.
    mask_bl: [B, L] bool POLICY-token mask.
    reward_hat_b: [B] float32 normalised episode rewards.
    log_z_b: [B] float32 log-partition estimates (gradient flows).
    denominator: D, the optimizer batch's 'seq-mean-token-mean' denominator,
      or None for this batch's count of rows with POLICY tokens.
    beta: reward temperature > 0 (`rl.flowrl_beta`).
    clip_eps: importance-weight clip (`rl.flowrl_clip`).

  Returns:
    (zeros [B, L] float32, ratio_bl [B, L] float32 = exp(logp -
    behaviour_logp), loss [] float32).

  Raises:
    ValueError: a concrete beta <= 0.
    AssertionError (chex): wrong ranks or shapes.
  """
  _check_bl(logp_bl, behaviour_logp_bl, ref_logp_bl, mask_bl)
  flow, _ = flowrl_loss(
      logp_bl,
      behaviour_logp_bl,
      ref_logp_bl,
      mask_bl,
      reward_hat_b,
      log_z_b,
      beta=beta,
      clip_eps=clip_eps,
      denominator=denominator,
  )
  ratio = jnp.exp(logp_bl - behaviour_logp_bl)
  return jnp.zeros_like(logp_bl), ratio, flow


@dataclasses.dataclass(frozen=True)
class PolicyLoss:
  """One policy-loss type of `POLICY_LOSSES`: its array function and needs.

  Attributes:
    fn: fn(*arrays, **settings): the arrays named by `inputs` positionally,
      the keyword settings named by `settings` (Python scalars, as the
      config holds them). Returns (pg_bl [B, L] float32 per-token loss,
      ratio_bl [B, L] float32 importance ratio, loss: a float32 scalar that
      replaces the aggregated pg_bl, or None to aggregate pg_bl by
      `rl.loss_agg_mode`).
    inputs: names of the positional arrays (keys of `INPUTS`).
    settings: names of the keyword settings (keys of `SETTINGS`).
    sequence_level: a sequence-level objective: its loss is defined with
      `rl.loss_agg_mode` 'seq-mean-token-mean' only (`SEQUENCE_AGG_MODE`).

  Raises:
    ValueError: an input or setting that `INPUTS` / `SETTINGS` do not name.
  """

  fn: Callable[..., tuple[jax.Array, jax.Array, jax.Array | None]]
  inputs: tuple[str, ...]
  settings: tuple[str, ...] = ()
  sequence_level: bool = False

  def __post_init__(self):
    unknown = [i for i in self.inputs if i not in INPUTS] + [
        s for s in self.settings if s not in SETTINGS
    ]
    if unknown:
      raise ValueError(f"unknown inputs or settings: {unknown}")

  @property
  def episode_reward(self) -> bool:
    """Reads one normalised reward per episode (input `reward_hat_b`): the
    batch carries reward_hat, and the config's estimator must be episode
    level."""
    return "reward_hat_b" in self.inputs

  @property
  def needs_log_partition(self) -> bool:
    """Reads FlowRL's learned log Z (input `log_z_b`): the batch carries
    prompt_embedding, the state has the 'flowrl' feature and the
    `LOG_PARTITION_SETTINGS` apply."""
    return "log_z_b" in self.inputs

  @property
  def fields(self) -> tuple[str, ...]:
    """The `rl` fields this entry reads beyond `SHARED_SETTINGS`: those of
    its settings, then `LOG_PARTITION_SETTINGS` when it needs log Z."""
    own = tuple(SETTINGS[s] for s in self.settings)
    return own + (LOG_PARTITION_SETTINGS if self.needs_log_partition else ())


# The aggregation a sequence-level loss needs (`PolicyLoss.sequence_level`).
SEQUENCE_AGG_MODE = "seq-mean-token-mean"

_RATIO = ("logp_bl", "behaviour_logp_bl", "advantage_bl")
_CLIP = ("clip_low", "clip_high")

POLICY_LOSSES: dict[str, PolicyLoss] = {
    "ppo": PolicyLoss(ppo_policy_loss, _RATIO, _CLIP + ("dual_clip",)),
    "gspo": PolicyLoss(
        gspo_policy_loss, _RATIO + ("mask_bl",), _CLIP, sequence_level=True
    ),
    "gspo_token": PolicyLoss(gspo_policy_loss, _RATIO + ("mask_bl",), _CLIP),
    "cispo": PolicyLoss(cispo_policy_loss, _RATIO, _CLIP),
    "flowrl": PolicyLoss(
        flowrl_policy_loss,
        (
            "logp_bl",
            "behaviour_logp_bl",
            "ref_logp_bl",
            "mask_bl",
            "reward_hat_b",
            "log_z_b",
            "denominator",
        ),
        ("beta", "clip_eps"),
        sequence_level=True,
    ),
}
# Policy-loss types, for config validation (`rl.loss_type`).
LOSS_TYPES = tuple(POLICY_LOSSES)
