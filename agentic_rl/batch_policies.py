"""Batch policies with static shapes: DAPO dynamic sampling and overlong handling.

Everything here keeps shapes static so the whole iteration stays one jitted program:
dynamic sampling oversamples groups in one rollout and *selects* rows with a gather
instead of growing a Python list.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from agentic_rl import types

OVERLONG_MODES = ("none", "mask", "reward")


def select_groups(
    metric_gk: jax.Array, num_keep: int
) -> tuple[jax.Array, jax.Array]:
  """DAPO dynamic sampling: keep groups whose metric is not constant.

  Yu et al., "DAPO", arXiv:2503.14476, section 3.2: groups whose episodes all get
  the same outcome (all correct or all wrong) give zero GRPO advantage and only
  dilute the batch, so more groups are sampled and those are filtered out. With
  static shapes: among the G oversampled groups, the first `num_keep` groups with
  non-constant metric are kept in their original order; if fewer exist, the batch
  is filled with constant groups (in original order), which are flagged unusable
  and contribute zero advantage.

  Args:
    metric_gk: [G, K] float per-episode metric (e.g. reward or correctness) of G
      groups of K episodes.
    num_keep: number of groups to keep (static), <= G.

  Returns:
    (keep_idx [num_keep] int32 indices into the G groups, usable [num_keep] bool:
     whether each kept group has non-constant metric).

  Raises:
    ValueError: num_keep > G.
  """
  chex.assert_rank(metric_gk, 2)
  g = metric_gk.shape[0]
  if num_keep > g:
    raise ValueError(f"num_keep={num_keep} > number of groups {g}")
  varied_g = jnp.max(metric_gk, axis=1) != jnp.min(metric_gk, axis=1)
  # Stable order: varied groups first, each class in original order.
  order = jnp.argsort(
      jnp.where(varied_g, 0, 1) * g + jnp.arange(g), stable=True
  )
  keep_idx = order[:num_keep].astype(jnp.int32)
  return keep_idx, varied_g[keep_idx]


def gather_groups(tree, keep_idx: jax.Array, group_size: int):
  """Rows of the kept groups from a group-major batch pytree ([G*K, ...] leaves)."""
  rows = (
      keep_idx[:, None] * group_size + jnp.arange(group_size)[None, :]
  ).reshape(-1)
  return jax.tree.map(lambda x: jnp.take(x, rows, axis=0), tree)


def soft_overlong_penalty(
    length_b: jax.Array, max_len: int, cache_len: int
) -> jax.Array:
  """DAPO soft overlong punishment (arXiv:2503.14476, eq. 13).

  R_length(y) = 0 if |y| <= L_max - L_cache; ((L_max - L_cache) - |y|) / L_cache
  if L_max - L_cache < |y| <= L_max; -1 beyond L_max.

  Args:
    length_b: [B] int32 response lengths |y| (POLICY tokens).
    max_len: L_max.
    cache_len: L_cache, the width of the linear penalty zone (> 0).

  Returns:
    [B] float32 penalties in [-1, 0].
  """
  if cache_len <= 0 or cache_len > max_len:
    raise ValueError(f"cache_len={cache_len} must be in (0, max_len={max_len}]")
  y = length_b.astype(jnp.float32)
  soft = max_len - cache_len
  return jnp.where(
      y <= soft, 0.0, jnp.where(y <= max_len, (soft - y) / cache_len, -1.0)
  )


def apply_overlong(
    reward_b: jax.Array,
    mask_bl: jax.Array,
    finish_b: jax.Array,
    mode: str,
    value: float = 0.0,
) -> tuple[jax.Array, jax.Array]:
  """Overlong (TRUNCATED) episodes: keep, mask out, or give a fixed reward.

  'none': unchanged. 'mask': the episode's tokens leave the loss mask (DAPO
  overlong filtering, arXiv:2503.14476), so it gets no gradient and does not count
  in any denominator; its reward still enters the group statistics. 'reward': its
  reward is replaced by `value`.

  Args:
    reward_b: [B] float32.
    mask_bl: [B, L] bool loss mask.
    finish_b: [B] int32 finish reasons (types.TRUNCATED marks overlong).
    mode: one of OVERLONG_MODES.
    value: reward of overlong episodes in mode 'reward'.

  Returns:
    (reward [B], mask [B, L]).

  Raises:
    ValueError: unknown mode.
  """
  if mode not in OVERLONG_MODES:
    raise ValueError(f"overlong mode {mode!r}: unknown; known {OVERLONG_MODES}")
  over = finish_b == types.TRUNCATED
  if mode == "mask":
    mask_bl = mask_bl & ~over[:, None]
  elif mode == "reward":
    reward_b = jnp.where(over, jnp.float32(value), reward_b)
  return reward_b, mask_bl


def refill_groups(
    kept_tree,
    num_filled: jax.Array,
    new_tree,
    new_metric_gk: jax.Array,
    group_size: int,
):
  """One DAPO refill round with static shapes: varied new groups fill the gaps.

  Yu et al., "DAPO", arXiv:2503.14476, section 3.2 and Algorithm 1: sampling
  continues until the batch holds enough groups with non-constant outcome.
  The kept batch has N group slots; slots [0, num_filled) hold varied groups,
  slots [num_filled, N) hold constant (unusable) fillers. The varied groups of
  a freshly sampled round (in their original order) replace the fillers from
  slot num_filled on, until the batch is full; extra varied groups are
  dropped. Kept groups are never split or reordered.

  Args:
    kept_tree: group-major pytree with [N * group_size, ...] leaves (the batch
      being filled).
    num_filled: int32 scalar in [0, N], number of leading usable slots.
    new_tree: pytree of the same structure with [G * group_size, ...] leaves
      (the new round).
    new_metric_gk: [G, group_size] float metric of the new round's groups.
    group_size: K, episodes per group (static).

  Returns:
    (kept_tree with the gaps filled, num_filled' = min(N, num_filled +
     number of varied new groups) int32 scalar).

  Raises:
    AssertionError: (chex) if new_metric_gk is not [G, group_size].
  """
  chex.assert_rank(new_metric_gk, 2)
  chex.assert_axis_dimension(new_metric_gk, 1, group_size)
  n = jax.tree.leaves(kept_tree)[0].shape[0] // group_size
  g = new_metric_gk.shape[0]
  varied_g = jnp.max(new_metric_gk, axis=1) != jnp.min(new_metric_gk, axis=1)
  order_g = jnp.argsort(
      jnp.where(varied_g, 0, 1) * g + jnp.arange(g), stable=True
  )
  num_varied = jnp.sum(varied_g.astype(jnp.int32))
  slot_n = jnp.arange(n, dtype=jnp.int32)
  src_n = slot_n - num_filled  # index among the new round's varied groups
  take_n = (src_n >= 0) & (src_n < num_varied)
  src_group_n = order_g[jnp.clip(src_n, 0, g - 1)]
  take_rows = jnp.repeat(take_n, group_size)
  new_rows = gather_groups(new_tree, src_group_n, group_size)

  def pick(old, new):
    m = take_rows.reshape(take_rows.shape + (1,) * (old.ndim - 1))
    return jnp.where(m, new, old)

  filled = jnp.minimum(n, num_filled + num_varied).astype(jnp.int32)
  return jax.tree.map(pick, kept_tree, new_rows), filled
