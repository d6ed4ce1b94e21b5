"""Behaviour stage: trainer-side behaviour log-probs (and values) of a batch,
recomputed once per batch with the sampling parameters.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from agentic_rl import sharding
from agentic_rl.learner.common import policy_forward
from agentic_rl.learner.common import shared_prefix

# Where the behaviour log-probs of the importance ratio come from
# (`rl.behaviour_logprobs`, see `behaviour_forward`).
BEHAVIOUR_LOGPROBS = ("trainer", "sampler")


def behaviour_forward(
    config,
    graphdef: nnx.GraphDef,
    params,
    tokens_bl: jax.Array,
    with_values: bool = False,
):
  """Trainer-side behaviour log-probs (and values) of a batch, before the update.

  `rl.behaviour_logprobs='trainer'`: the behaviour log-probs of the importance
  ratio are recomputed once per batch by `policy_forward` (exactly the
  function the loss calls: a teacher-forced forward over the whole
  trajectory) on the same micro-batches the update uses (the batch cut into
  n = num_minibatches * num_microbatches blocks by the strided split
  `sharding.split_rows`, row i in block i % n, mapped with `lax.map`: block
  j + num_minibatches * k holds, in the same order, the rows of micro-batch k
  of minibatch j; with `rl.shared_prefix_len`, `sharding.split_blocks` of
  the update's micro-batches of whole prompt groups, `common.shared_prefix`,
  block j * num_microbatches + k), with the parameters that sampled the
  batch. The loss then
  reproduces them bit for bit on the first optimizer step, so the first
  epoch's ratios are exactly 1 (no float drift from the sampler's cached
  one-token decode). Values are the behaviour values V_old of GAE.

  Args:
    config: experiment config (rl.num_minibatches, rl.num_microbatches,
      rl.temperature).
    graphdef, params: the policy that sampled the batch.
    tokens_bl: [B, L] int32 trajectories.
    with_values: also return the value head's values.

  Returns:
    (logp [B, L] float32, values [B, L] float32 or None); see
    `policy_forward` for the alignment.
  """
  rl_cfg = config.rl
  n = rl_cfg.num_minibatches * rl_cfg.num_microbatches
  prefix = shared_prefix(rl_cfg)
  if prefix is None:
    blocks = sharding.split_rows(tokens_bl, n)
    unblock = sharding.merge_rows
  else:
    # The same rows as the update's micro-batches of whole prompt groups.
    counts = (rl_cfg.num_minibatches, rl_cfg.num_microbatches, prefix.group)
    blocks = sharding.split_blocks(tokens_bl, *counts)
    unblock = lambda x: sharding.merge_blocks(x, *counts)
  logp, _, values = jax.lax.map(
      lambda t: policy_forward(
          graphdef,
          params,
          sharding.constrain_batch(t),
          rl_cfg.temperature,
          with_values,
          prefix=prefix,
      ),
      blocks,
  )
  return unblock(logp), None if values is None else unblock(values)


def masked_behaviour_logprobs(
    config,
    graphdef: nnx.GraphDef,
    params,
    tokens_bl: jax.Array,
    logp_bl: jax.Array,
    rows_b: jax.Array,
    banned_tokens: tuple[int, ...],
):
  """Behaviour log-probs of rows sampled with `banned_tokens` masked.

  Dual-path tool-free rows (`rl.dual_path_tool_free`) sample every token from
  the policy renormalised over the allowed tokens (`rollout.mask_logits`):
  log p_masked(a_t) = log p(a_t) - log(1 - P_t), P_t = sum over banned v of
  p(v | tokens[:, :t]), all at the sampling temperature. P_t comes from
  `policy_forward` scoring each banned id at every position (one extra
  teacher-forced pass per banned id, on `behaviour_forward`'s strided blocks).

  Args:
    config: experiment config (rl.temperature, rl.num_minibatches,
      rl.num_microbatches).
    graphdef, params: the policy that sampled the batch.
    tokens_bl: [B, L] int32 trajectories.
    logp_bl: [B, L] float32 unmasked log-probs (`behaviour_forward`).
    rows_b: [B] bool, rows sampled with the mask.
    banned_tokens: static tuple of banned ids (`rollout.tool_call_tokens`).

  Returns:
    (logp [B, L] float32: logp_bl + shift on `rows_b`, shift [B, L] float32:
     -log(1 - P_t) on `rows_b` from position 1, 0 elsewhere).
  """
  rl_cfg = config.rl
  n = rl_cfg.num_minibatches * rl_cfg.num_microbatches

  def banned_mass(t):
    t = sharding.constrain_batch(t)
    total = jnp.zeros(t.shape, jnp.float32)
    for v in banned_tokens:
      lp, _, _ = policy_forward(
          graphdef,
          params,
          t,
          rl_cfg.temperature,
          targets_bl=jnp.full_like(t, v),
      )
      total = total + jnp.exp(lp)
    return total

  # Strided blocks of rows (each keeps every device's share of the rows on a
  # data-sharded mesh); every row is computed on its own, so these need not
  # be `behaviour_forward`'s blocks, and they run unshared.
  mass = sharding.merge_rows(
      jax.lax.map(banned_mass, sharding.split_rows(tokens_bl, n))
  )
  mass = jnp.clip(mass, 0.0, 1.0 - 1e-7).at[:, 0].set(0.0)
  shift = jnp.where(jnp.asarray(rows_b, bool)[:, None], -jnp.log1p(-mass), 0.0)
  return logp_bl + shift, shift
