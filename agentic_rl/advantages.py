"""Advantage estimators (GRPO family). Output is per-token [B, L], zero off POLICY.

Groups are given by the trajectory's `group` field (the task index), never by row
position, so any batch order is fine.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from agentic_rl import types


def grpo_advantages(
    rewards_b: jax.Array,
    group_b: jax.Array,
    *,
    scale_by_std: bool = True,
    eps: float = 1e-6,
) -> jax.Array:
  """GRPO group-relative advantages A_i = (r_i - mean_g(r)) / (std_g(r) + eps).

  Shao et al., "DeepSeekMath", arXiv:2402.03300, eq. in section 4.1.2 (outcome
  supervision). The std is the population std (ddof = 0) over the group's members.
  With `scale_by_std=False` the advantage is mean-centred only (Dr.GRPO,
  Liu et al., arXiv:2503.20783). A group whose rewards are all equal gets exactly 0
  (not a rounding residue), whatever eps is.

  Args:
    rewards_b: [B] float32 scalar rewards.
    group_b: [B] int32 group ids in [0, B).
    scale_by_std: divide by the group std (+ eps).
    eps: added to the std; must be > 0 when scale_by_std.

  Returns:
    [B] float32 advantages.
  """
  chex.assert_rank([rewards_b, group_b], 1)
  chex.assert_equal_shape([rewards_b, group_b])
  b = rewards_b.shape[0]
  r = rewards_b.astype(jnp.float32)
  seg = lambda x: jax.ops.segment_sum(x, group_b, num_segments=b)
  count_g = seg(jnp.ones_like(r))
  mean_g = seg(r) / jnp.maximum(count_g, 1.0)
  centred = r - mean_g[group_b]
  var_g = seg(jnp.square(centred)) / jnp.maximum(count_g, 1.0)
  max_g = jax.ops.segment_max(r, group_b, num_segments=b)
  min_g = jax.ops.segment_min(r, group_b, num_segments=b)
  constant = (max_g == min_g)[group_b]
  adv = centred
  if scale_by_std:
    adv = centred / (jnp.sqrt(var_g)[group_b] + eps)
  return jnp.where(constant, 0.0, adv)


def broadcast_to_tokens(adv_b: jax.Array, role_bl: jax.Array) -> jax.Array:
  """Per-episode advantages to per-token [B, L], zero off POLICY tokens."""
  return jnp.where(role_bl == types.POLICY, adv_b[:, None], 0.0).astype(jnp.float32)
