"""Advantage estimators beyond one scalar per episode: HDPO's conditional
efficiency channel, GiGPO's step groups and PORTool's tree forks.

The estimator table (every estimator by config name, with its declared
needs) is `agentic_rl.estimators.ESTIMATORS`; `learner.token_credit` passes
it the arrays and settings of a config.
"""

from __future__ import annotations

import math
import numbers

import chex
import jax
import jax.numpy as jnp

from agentic_rl import advantages
from agentic_rl import types

# ---------------------------------------------------------------------------
# HDPO: conditional efficiency advantages.
# ---------------------------------------------------------------------------


def hdpo_advantages(
    correct_b: jax.Array,
    cost_b: jax.Array,
    group_b: jax.Array,
    *,
    efficiency_weight: float | jax.Array,
    eps: float = 1e-6,
    valid_b: jax.Array | None = None,
) -> jax.Array:
  """HDPO two-channel advantages (inferred form).

  A_i = z_G(correct)_i + w * 1[correct_i] * z_{C(G)}(-cost)_i,

  z_S(x)_i = (x_i - mean_S x) / (std_S x + eps), population std, where G is
  the episode's group and C(G) its correct episodes. The accuracy channel is
  GRPO on correctness; the efficiency channel is GRPO on -cost restricted to
  the correct episodes of the group, so a cost penalty is never washed out by
  (or traded against) accuracy variance. HDPO / Metis (docs/papers.md; arXiv
  id not given there); the formula is inferred from the abstract's
  "conditional advantage estimation" restricted to accurate trajectories.

  The efficiency channel is exactly 0 for incorrect episodes, for groups with
  fewer than 2 correct episodes, and for groups whose correct episodes all
  have the same cost; either channel is exactly 0 on an all-equal group
  (`advantages.grpo_advantages`). Group statistics are segment ops on
  `group_b`.

  Args:
    correct_b: [B] bool (or 0/1) outcome correctness.
    cost_b: [B] float cost, e.g. tool calls (lower is better).
    group_b: [B] int group ids in [0, B).
    efficiency_weight: w, weight of the efficiency channel (>= 0).
    eps: added to both channels' std.
    valid_b: optional [B] bool; invalid rows are left out of every statistic
      and get 0. Default: all rows valid.

  Returns:
    [B] float32 advantages.

  Raises:
    ValueError: if a Python-number efficiency_weight is negative.
    AssertionError: (chex) on rank/shape/dtype mismatch of the inputs.
  """
  chex.assert_rank([correct_b, cost_b, group_b], 1)
  chex.assert_equal_shape([correct_b, cost_b, group_b])
  chex.assert_type(group_b, int)
  if isinstance(efficiency_weight, numbers.Real) and efficiency_weight < 0:
    raise ValueError(
        f"efficiency_weight must be >= 0, got {efficiency_weight!r}."
    )
  correct = jnp.asarray(correct_b).astype(jnp.bool_)
  valid = (
      jnp.ones(correct.shape, jnp.bool_)
      if valid_b is None
      else jnp.asarray(valid_b).astype(jnp.bool_)
  )
  chex.assert_equal_shape([correct, valid])
  acc_b = advantages.grpo_advantages(
      correct.astype(jnp.float32), group_b, eps=eps, valid_b=valid
  )
  eff_b = advantages.grpo_advantages(
      -jnp.asarray(cost_b, jnp.float32),
      group_b,
      eps=eps,
      valid_b=valid & correct,
  )
  return acc_b + jnp.asarray(efficiency_weight, jnp.float32) * eff_b


# ---------------------------------------------------------------------------
# GiGPO: step groups by identical state within a task group.
# ---------------------------------------------------------------------------


def observation_state_keys(
    tokens_bl: jax.Array,
    role_bl: jax.Array,
    turn_bl: jax.Array,
    num_turns: int,
    match_turn: bool = True,
) -> jax.Array:
  """[B, K] uint32 key of the state s_k seen before turn k.

  s_0 is keyed by the PROMPT tokens; s_k (k >= 1) by the observation (TOOL
  tokens) returned after turn k - 1 (FNV-1a over the tokens in order; an
  empty observation hashes to the FNV offset basis [mixed with k]).

  From the paper (GiGPO, arXiv:2505.10978, section 4.2):
  anchor states are identical *environment states* shared by trajectories of
  one task group, wherever they occur (any time step). Ours: the observation
  stands in for the environment state (it is all the environment shows),
  and by default (`match_turn`) the turn index is part of the key, so only
  steps at the same turn are grouped: in our environments one observation
  (e.g. 'error', or a number) can follow different states at different turns.
  `match_turn=False` groups equal observations at any turn, as in the paper.
  Any other [B, K] key array (e.g. a hash of the env state) can be passed to
  `gigpo_step_advantages` instead.

  Args:
    tokens_bl, role_bl, turn_bl: [B, L] trajectory fields.
    num_turns: K (static).
  """
  k_k = jnp.arange(num_turns)
  prompt = role_bl == types.PROMPT
  obs = role_bl == types.TOOL
  # sel[b, k, l]: token l belongs to the state key of s_k.
  sel = jnp.where(
      k_k[None, :, None] == 0,
      prompt[:, None, :],
      obs[:, None, :] & (turn_bl[:, None, :] == k_k[None, :, None] - 1),
  )
  tok = jnp.where(sel, tokens_bl[:, None, :].astype(jnp.uint32) + 1, 0)
  tok = tok.astype(jnp.uint32)

  def step(h, t):
    return jnp.where(t != 0, (h ^ t) * jnp.uint32(16777619), h), None

  salt_k = (
      k_k.astype(jnp.uint32)
      if match_turn
      else jnp.minimum(k_k, 1).astype(jnp.uint32)
  )  # the prompt key stays apart from observations
  h0 = jnp.broadcast_to(
      (jnp.uint32(2166136261) ^ salt_k)[None, :], tok.shape[:2]
  )
  h, _ = jax.lax.scan(step, h0, jnp.moveaxis(tok, 2, 0))
  return h


def gigpo_step_advantages(
    returns_bk: jax.Array,
    state_key_bk: jax.Array,
    turn_mask_bk: jax.Array,
    group_b: jax.Array,
    *,
    scale_by_std: bool = True,
    eps: float = 1e-6,
) -> jax.Array:
  """GiGPO step-level advantages over anchor-state groups.

  Feng et al., "Group-in-Group Policy Optimization for LLM Agent Training",
  arXiv:2505.10978, section 4.2: steps (b, k) of the same task group whose
  states are identical (same `state_key`) form a step group; each step's
  discounted return R_bk is normalised within its step group,
  A^S_bk = (R_bk - mean) / (std + eps) (population std; mean-only when
  scale_by_std is False). A step group of one step, or of equal returns, gives
  exactly 0. Pairwise comparison over the B * K steps (fine for agent batches
  of a few hundred steps).

  Args:
    returns_bk: [B, K] float discounted step returns
      (`advantages.turn_reward_to_go`).
    state_key_bk: [B, K] int/uint keys of the state before each step.
    turn_mask_bk: [B, K] bool valid steps.
    group_b: [B] int task group ids.
    scale_by_std: divide by the step group's std.
    eps: added to the std.

  Returns:
    [B, K] float32 step advantages, 0 at invalid steps.
  """
  chex.assert_rank([returns_bk, state_key_bk, turn_mask_bk], 2)
  chex.assert_equal_shape([returns_bk, state_key_bk, turn_mask_bk])
  b, k = returns_bk.shape
  r = jnp.asarray(returns_bk, jnp.float32).reshape(-1)
  key = state_key_bk.reshape(-1)
  valid = jnp.asarray(turn_mask_bk).astype(bool).reshape(-1)
  grp = jnp.repeat(group_b, k)
  same = (
      (grp[:, None] == grp[None, :])
      & (key[:, None] == key[None, :])
      & valid[:, None]
      & valid[None, :]
  )
  w = same.astype(jnp.float32)
  count = jnp.sum(w, 1)
  mean = (w @ r) / jnp.maximum(count, 1.0)
  rmax = jnp.max(jnp.where(same, r[None, :], -jnp.inf), 1)
  rmin = jnp.min(jnp.where(same, r[None, :], jnp.inf), 1)
  zero = ~valid | (rmax == rmin)
  centred = jnp.where(zero, 0.0, r - mean)
  if scale_by_std:
    dev = jnp.where(same, r[None, :] - mean[:, None], 0.0)
    var = jnp.sum(jnp.square(dev), 1) / jnp.maximum(count, 1.0)
    centred = jnp.where(zero, 0.0, centred / (jnp.sqrt(var) + eps))
  return centred.reshape(b, k)


# ---------------------------------------------------------------------------
# PORTool: fork-relative advantages on a static tree of rollouts.
# ---------------------------------------------------------------------------


def tree_fork_advantages(
    leaf_reward_g: jax.Array,
    branching: tuple[int, ...],
    *,
    alpha: float,
    scale_by_std: bool = True,
    eps: float = 1e-6,
    step_bonus_gd: jax.Array | None = None,
) -> jax.Array:
  """PORTool fork-relative advantages blended with the trajectory advantage.

  PORTool (Wu et al., arXiv:2510.26020; docs/papers.md). From the
  abstract: rollouts share their first tool-call steps (a tree); each step is
  rewarded for its ability to lead to a correct answer AND for making
  successful tool calls; a shared step gets one reward, different steps under
  the same fork get different rewards; fork-relative advantages are blended
  with trajectory-relative ones. Inferred (docs/papers.md, not from the paper):
  the node value as the leaves' success rate (the paper's wording, "whether
  the offspring of that step can eventually produce the correct final
  answer", might instead mean any-leaf-correct) plus a call-success bonus,
  the sibling z-score, and the alpha blend. Our choices: A_traj of a shared step
  = mean of its leaves' GRPO advantages; the call-success part is an optional
  per-step bonus (`step_bonus_gd`, e.g. beta * 1[the step's call executed]);
  the RL loop passes none, since our environments expose no per-turn
  call-success fact. A static tree: the root (prompt)
  forks into branching[0] children, each of those into branching[1], ...;
  leaf g (G = prod(branching) leaves, in lexicographic order of their
  branch indices) is one complete episode, and the node at depth j (j = 1 ..
  d) is the step (segment) taken after the j-th fork, shared by every leaf
  below it. Then:

    v(node)      = mean outcome of the leaves under the node (one reward for
                   a shared step) [+ mean of step_bonus_gd[:, j - 1] over
                   those leaves, i.e. the shared step's bonus];
    A_fork(node) = (v(node) - mean_siblings v) [/ (std_siblings v + eps)],
                   siblings = the children of the same fork (node included);
    A_traj(node) = mean over the node's leaves of the GRPO advantage of the
                   leaves' outcomes (so a shared step gets one value);
    A(node)      = alpha * A_fork(node) + (1 - alpha) * A_traj(node).

  With alpha = 0 every leaf's deepest step gets its plain GRPO advantage.
  Constant sibling sets give A_fork exactly 0.

  Args:
    leaf_reward_g: [G] float leaf outcomes.
    branching: static fork sizes (b_1, .., b_d), each >= 1; prod = G.
    alpha: blend weight in [0, 1].
    scale_by_std: divide by the siblings' (population) std.
    eps: added to the std.
    step_bonus_gd: optional [G, d] float per-step bonus of leaf g's step at
      depth j (column j - 1); leaves sharing a step must carry equal values
      (their mean is used).

  Returns:
    [G, d] float32: column j - 1 is the advantage of leaf g's step at depth j
    (identical for leaves sharing that step).

  Raises:
    ValueError: prod(branching) != G, a branching < 1, or alpha outside [0, 1].
  """
  chex.assert_rank(leaf_reward_g, 1)
  g = leaf_reward_g.shape[0]
  if (
      not branching
      or any(b < 1 for b in branching)
      or math.prod(branching) != g
  ):
    raise ValueError(
        f"branching={branching!r} must be >= 1 each with product " f"G={g}"
    )
  if not 0.0 <= alpha <= 1.0:
    raise ValueError(f"alpha={alpha!r} must be in [0, 1]")
  d = len(branching)
  r = jnp.asarray(leaf_reward_g, jnp.float32)
  traj_g = advantages.grpo_advantages(
      r, jnp.zeros((g,), jnp.int32), scale_by_std=scale_by_std, eps=eps
  )
  r_t = r.reshape(branching)
  a_t = traj_g.reshape(branching)
  if step_bonus_gd is not None:
    chex.assert_shape(step_bonus_gd, (g, d))
  cols = []
  for j in range(1, d + 1):
    tail = tuple(range(j, d))
    v = jnp.mean(r_t, axis=tail) if tail else r_t  # shape branching[:j]
    if step_bonus_gd is not None:
      bonus_t = jnp.asarray(step_bonus_gd[:, j - 1], jnp.float32).reshape(
          branching
      )
      v = v + (jnp.mean(bonus_t, axis=tail) if tail else bonus_t)
    a_traj = jnp.mean(a_t, axis=tail) if tail else a_t
    vmax = jnp.max(v, axis=-1, keepdims=True)
    vmin = jnp.min(v, axis=-1, keepdims=True)
    centred = v - jnp.mean(v, axis=-1, keepdims=True)
    if scale_by_std:
      centred = centred / (jnp.std(v, axis=-1, keepdims=True) + eps)
    fork = jnp.where(vmax == vmin, 0.0, centred)
    node = alpha * fork + (1.0 - alpha) * a_traj
    cols.append(
        jnp.broadcast_to(
            node.reshape(node.shape + (1,) * (d - j)), branching
        ).reshape(g)
    )
  return jnp.stack(cols, axis=1)


def tree_turn_advantages(adv_gd: jax.Array, num_turns: int) -> jax.Array:
  """[G, K] per-turn advantages from `tree_fork_advantages` when the j-th fork
  happens before turn j - 1: turn k gets depth min(k + 1, d)'s advantage (the
  last depth's segment runs to the end of the episode)."""
  d = adv_gd.shape[1]
  col_k = jnp.minimum(jnp.arange(num_turns), d - 1)
  return adv_gd[:, col_k]
