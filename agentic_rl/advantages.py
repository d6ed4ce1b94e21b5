"""Advantage estimators. Output is per-token [B, L], zero off POLICY.

Episode-level estimators map [B] scalar rewards to [B] advantages; per-turn
estimators map [B, K] turn rewards to [B, K] advantages; `broadcast_to_tokens`
and `broadcast_turn_to_tokens` turn either into the per-token [B, L] array the
learner consumes (docs/rewards_and_credit.md).

Groups are given by the trajectory's `group` field (an int32 id per row, the
task index), never by row position, so any batch order is fine. Group
statistics are segment ops with `num_segments = B`, so group ids must lie in
[0, B); use `group_ids_from_keys` on the host to turn arbitrary keys into such
ids.

Every estimator that divides by a standard deviation returns exactly 0 for a
group (or batch) whose valid rewards are all equal, whatever eps is, and is
finite (values and gradients) for rewards float32 cannot represent exactly.

Estimators (episode level; the estimator table, with each entry's needs, is
`estimators.ESTIMATORS`):

| name                  | A_i                                              |
|-----------------------|--------------------------------------------------|
| grpo                  | (r_i - mean_g) / (std_g + eps)                   |
| drgrpo                | r_i - mean_g                                     |
| rloo                  | G / (G - 1) (r_i - mean_g)  [/ (std_g + eps)]    |
| reinforce_pp          | (r_i - mean_batch) / (std_batch + eps)           |
| reinforce_pp_baseline | c_i / (std_batch(c) + eps), c_i = r_i - mean_g   |
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
import functools
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

from agentic_rl import types

# ---------------------------------------------------------------------------
# Shared group statistics.
# ---------------------------------------------------------------------------


class _GroupStats(NamedTuple):
  """Per-row statistics of the row's group, over the group's valid rows.

  Attributes:
    centred_b: [B] float32, x_i - mean_g; exactly 0 on constant groups and on
      invalid rows.
    std_b: [B] float32, std_g with the requested ddof; 0 when the group has
      fewer than ddof + 1 valid rows or zero variance.
    count_b: [B] float32, number of valid rows in the row's group.
    zero_b: [B] bool, True where the advantage must be exactly 0: invalid row,
      or all valid values of the group are equal (max == min).
  """

  centred_b: jax.Array
  std_b: jax.Array
  count_b: jax.Array
  zero_b: jax.Array


def _check_ddof(std_ddof: int) -> None:
  if not isinstance(std_ddof, (int, np.integer)) or std_ddof < 0:
    raise ValueError(f"std_ddof must be a non-negative int, got {std_ddof!r}.")


def _valid_or_ones(x_b: jax.Array, valid_b: jax.Array | None) -> jax.Array:
  if valid_b is None:
    return jnp.ones(x_b.shape, jnp.bool_)
  chex.assert_rank(valid_b, 1)
  chex.assert_equal_shape([x_b, valid_b])
  return valid_b.astype(jnp.bool_)


def _safe_sqrt(x: jax.Array) -> jax.Array:
  """sqrt with a finite gradient at 0 (the gradient there is taken as 0)."""
  pos = x > 0
  return jnp.where(pos, jnp.sqrt(jnp.where(pos, x, 1.0)), 0.0)


# Jitted so that eager callers run one compiled program instead of dispatching
# ~20 ops one by one; inside an outer jit/vmap/grad it is simply inlined.
@functools.partial(jax.jit, static_argnames=("std_ddof",))
def _group_stats(
    x_b: jax.Array,
    group_b: jax.Array,
    valid_b: jax.Array,
    std_ddof: int,
) -> _GroupStats:
  """Group mean/std of x over valid rows, by segment ops on `group_b`."""
  b = x_b.shape[0]
  x = x_b.astype(jnp.float32)
  valid = valid_b.astype(jnp.bool_)
  group = group_b.astype(jnp.int32)
  w = valid.astype(jnp.float32)
  seg = lambda v: jax.ops.segment_sum(v, group, num_segments=b)
  count_g = seg(w)
  mean_g = seg(jnp.where(valid, x, 0.0)) / jnp.maximum(count_g, 1.0)
  # max == min is exact in floating point: an all-equal group is detected
  # without relying on the (rounded) mean or variance being exactly 0.
  max_g = jax.ops.segment_max(
      jnp.where(valid, x, -jnp.inf), group, num_segments=b
  )
  min_g = jax.ops.segment_min(
      jnp.where(valid, x, jnp.inf), group, num_segments=b
  )
  zero_b = (max_g == min_g)[group] | ~valid
  centred_b = jnp.where(zero_b, 0.0, x - mean_g[group])
  var_g = seg(jnp.square(centred_b)) / jnp.maximum(count_g - std_ddof, 1.0)
  var_g = jnp.where(count_g > std_ddof, var_g, 0.0)
  return _GroupStats(
      centred_b=centred_b,
      std_b=_safe_sqrt(var_g)[group],
      count_b=count_g[group],
      zero_b=zero_b,
  )


def _check_episode_inputs(rewards_b: jax.Array, group_b: jax.Array) -> None:
  chex.assert_rank([rewards_b, group_b], 1)
  chex.assert_equal_shape([rewards_b, group_b])
  chex.assert_type(group_b, int)


# ---------------------------------------------------------------------------
# Episode-level estimators: [B] rewards -> [B] advantages.
# ---------------------------------------------------------------------------


def grpo_advantages(
    rewards_b: jax.Array,
    group_b: jax.Array,
    *,
    scale_by_std: bool = True,
    eps: float = 1e-6,
    std_ddof: int = 0,
    valid_b: jax.Array | None = None,
) -> jax.Array:
  """GRPO group-relative advantages A_i = (r_i - mean_g(r)) / (std_g(r) + eps).

  Shao et al., "DeepSeekMath", arXiv:2402.03300, eq. in section 4.1.2 (outcome
  supervision). With `scale_by_std=False` the advantage is mean-centred only
  (Dr.GRPO, Liu et al., arXiv:2503.20783).

  std_g = sqrt(sum_{j in g} (r_j - mean_g)^2 / (G - std_ddof)), G = |g|:
  `std_ddof=0` (default) is the population std, `std_ddof=1` the sample
  (Bessel-corrected) std. A group with G <= std_ddof has std 0; in particular
  a group of size 1 gives 0 with either ddof, never NaN.

  A group whose rewards are all equal gets exactly 0 (not a rounding residue),
  whatever eps is: equality is tested as max_g == min_g, which is exact even
  for values float32 cannot represent (e.g. -11.000002, whose rounded mean
  need not equal the value). Values and gradients w.r.t. rewards are finite.

  Args:
    rewards_b: [B] float rewards (cast to float32).
    group_b: [B] int group ids in [0, B).
    scale_by_std: divide by the group std (+ eps).
    eps: added to the std; must be > 0 when scale_by_std and a non-constant
      group may have zero std (only possible with ddof >= G).
    std_ddof: delta degrees of freedom of the std, a Python int >= 0.
    valid_b: optional [B] bool; invalid rows are left out of every statistic
      and get advantage 0. Default: all rows valid.

  Returns:
    [B] float32 advantages.

  Raises:
    ValueError: if std_ddof is not a non-negative int.
    AssertionError: (chex) on rank/shape/dtype mismatch of the inputs.
  """
  _check_episode_inputs(rewards_b, group_b)
  _check_ddof(std_ddof)
  valid = _valid_or_ones(rewards_b, valid_b)
  st = _group_stats(rewards_b, group_b, valid, std_ddof)
  adv_b = st.centred_b
  if scale_by_std:
    adv_b = adv_b / (st.std_b + eps)
  return jnp.where(st.zero_b, 0.0, adv_b).astype(jnp.float32)


def drgrpo_advantages(
    rewards_b: jax.Array,
    group_b: jax.Array,
    *,
    valid_b: jax.Array | None = None,
) -> jax.Array:
  """Dr.GRPO mean-centred advantages A_i = r_i - mean_g(r).

  Liu et al., "Understanding R1-Zero-Like Training: A Critical Perspective"
  (Dr.GRPO), arXiv:2503.20783: GRPO without the std division (which biases
  towards too-easy/too-hard questions). The matching length-unbiased loss
  aggregation lives in the learner. All-equal groups give exactly 0.

  Args:
    rewards_b: [B] float rewards (cast to float32).
    group_b: [B] int group ids in [0, B).
    valid_b: optional [B] bool; invalid rows are left out of the group mean and
      get 0.

  Returns:
    [B] float32 advantages.

  Raises:
    AssertionError: (chex) on rank/shape/dtype mismatch of the inputs.
  """
  return grpo_advantages(
      rewards_b, group_b, scale_by_std=False, valid_b=valid_b
  )


def rloo_advantages(
    rewards_b: jax.Array,
    group_b: jax.Array,
    *,
    scale_by_std: bool = False,
    eps: float = 1e-6,
    std_ddof: int = 0,
    valid_b: jax.Array | None = None,
) -> jax.Array:
  """REINFORCE leave-one-out advantages A_i = r_i - mean_{j in g, j != i} r_j.

  Kool, van Hoof & Welling, "Buy 4 REINFORCE Samples, Get a Baseline for
  Free!", ICLR 2019 workshop; Ahmadian et al., "Back to Basics: Revisiting
  REINFORCE Style Optimization for Learning from Human Feedback in LLMs",
  arXiv:2402.14740, eq. (6). Equivalently A_i = G / (G - 1) (r_i - mean_g),
  G = |g|. A group of size 1 has no baseline and gets 0. With `scale_by_std`
  the result is further divided by (std_g + eps) (std_g as in
  `grpo_advantages`, with `std_ddof`). All-equal groups give exactly 0.

  Args:
    rewards_b: [B] float rewards (cast to float32).
    group_b: [B] int group ids in [0, B).
    scale_by_std: divide by the group std (+ eps).
    eps: added to the std when scale_by_std.
    std_ddof: delta degrees of freedom of the std, a Python int >= 0.
    valid_b: optional [B] bool; invalid rows are left out (G counts valid rows
      only) and get 0.

  Returns:
    [B] float32 advantages.

  Raises:
    ValueError: if std_ddof is not a non-negative int.
    AssertionError: (chex) on rank/shape/dtype mismatch of the inputs.
  """
  _check_episode_inputs(rewards_b, group_b)
  _check_ddof(std_ddof)
  valid = _valid_or_ones(rewards_b, valid_b)
  st = _group_stats(rewards_b, group_b, valid, std_ddof)
  adv_b = st.centred_b * st.count_b / jnp.maximum(st.count_b - 1.0, 1.0)
  if scale_by_std:
    adv_b = adv_b / (st.std_b + eps)
  zero_b = st.zero_b | (st.count_b < 2.0)
  return jnp.where(zero_b, 0.0, adv_b).astype(jnp.float32)


def reinforce_pp_advantages(
    rewards_b: jax.Array,
    valid_b: jax.Array | None = None,
    *,
    eps: float = 1e-6,
    std_ddof: int = 0,
) -> jax.Array:
  """REINFORCE++ global-batch normalised advantages.

  A_i = (r_i - mean_batch(r)) / (std_batch(r) + eps), statistics over the valid
  rows of the whole batch (no grouping).

  Hu, "REINFORCE++: A Simple and Efficient Approach for Aligning Large Language
  Models", arXiv:2501.03262, section 3 (global advantage normalisation). This
  is the outcome-reward, episode-level form: the per-token KL penalty of the
  paper is applied by the learner, not folded into the reward here. A batch
  whose valid rewards are all equal gives exactly 0.

  Args:
    rewards_b: [B] float rewards (cast to float32).
    valid_b: optional [B] bool; invalid rows are left out of the statistics and
      get 0. Default: all rows valid.
    eps: added to the batch std.
    std_ddof: delta degrees of freedom of the batch std (default population).

  Returns:
    [B] float32 advantages.

  Raises:
    ValueError: if std_ddof is not a non-negative int.
    AssertionError: (chex) on rank/shape mismatch of the inputs.
  """
  chex.assert_rank(rewards_b, 1)
  zeros_b = jnp.zeros(rewards_b.shape, jnp.int32)
  return grpo_advantages(
      rewards_b,
      zeros_b,
      scale_by_std=True,
      eps=eps,
      std_ddof=std_ddof,
      valid_b=valid_b,
  )


def reinforce_pp_baseline_advantages(
    rewards_b: jax.Array,
    group_b: jax.Array,
    valid_b: jax.Array | None = None,
    *,
    eps: float = 1e-6,
    std_ddof: int = 0,
) -> jax.Array:
  """REINFORCE++-baseline: group mean baseline, then global batch std.

  c_i = r_i - mean_g(r);  A_i = c_i / (std_batch(c) + eps).

  Hu, "REINFORCE++", arXiv:2501.03262 (the "REINFORCE++-baseline" variant for
  multi-sample prompts). The batch mean of c is 0 by construction (each group
  sums to 0), so only the batch std is applied; std_batch(c) is taken about
  the batch mean of c over valid rows. Statistics use valid rows only. If
  every group is constant (in particular an all-equal batch) the result is
  exactly 0.

  Args:
    rewards_b: [B] float rewards (cast to float32).
    group_b: [B] int group ids in [0, B).
    valid_b: optional [B] bool; invalid rows are left out of every statistic
      and get 0. Default: all rows valid.
    eps: added to the batch std.
    std_ddof: delta degrees of freedom of the batch std (default population).

  Returns:
    [B] float32 advantages.

  Raises:
    ValueError: if std_ddof is not a non-negative int.
    AssertionError: (chex) on rank/shape/dtype mismatch of the inputs.
  """
  _check_episode_inputs(rewards_b, group_b)
  _check_ddof(std_ddof)
  valid = _valid_or_ones(rewards_b, valid_b)
  c_b = _group_stats(rewards_b, group_b, valid, 0).centred_b
  zeros_b = jnp.zeros(rewards_b.shape, jnp.int32)
  batch = _group_stats(c_b, zeros_b, valid, std_ddof)
  adv_b = c_b / (batch.std_b + eps)
  return jnp.where(batch.zero_b, 0.0, adv_b).astype(jnp.float32)


# ---------------------------------------------------------------------------
# Generalized advantage estimation (one sequence; vmap over a batch).
# ---------------------------------------------------------------------------


def gae_advantages(
    rewards_t: jax.Array,
    values_t: jax.Array,
    bootstrap_value: jax.Array,
    discount_t: jax.Array,
    lambda_: float | jax.Array,
) -> tuple[jax.Array, jax.Array]:
  """Generalized advantage estimation over one sequence of T steps.

  delta_t = r_t + discount_t * V_{t+1} - V_t,  V_T = bootstrap_value;
  A_t = delta_t + discount_t * lambda_t * A_{t+1},  A_T = 0;
  returns G_t = A_t + V_t (the TD(lambda) targets).

  Schulman et al., "High-Dimensional Continuous Control Using Generalized
  Advantage Estimation", arXiv:1506.02438, eq. (16). discount_t = 0 marks
  step t as terminal: neither V_{t+1} nor later advantages leak back past it.
  Computed by a reverse `lax.scan`. No gradient is stopped; wrap the inputs in
  `jax.lax.stop_gradient` for value targets. Unbatched: vmap over a batch.

  Args:
    rewards_t: [T] float rewards r_0..r_{T-1}.
    values_t: [T] float values V(s_0)..V(s_{T-1}).
    bootstrap_value: [] float V(s_T).
    discount_t: [T] float discounts (gamma, or 0 at terminal steps).
    lambda_: scalar or [T] float, the GAE lambda in [0, 1].

  Returns:
    (advantages_t [T] float32, returns_t [T] float32).

  Raises:
    AssertionError: (chex) on rank/shape mismatch of the inputs.
  """
  chex.assert_rank([rewards_t, values_t, discount_t], 1)
  chex.assert_rank(bootstrap_value, 0)
  chex.assert_equal_shape([rewards_t, values_t, discount_t])
  f32 = lambda x: jnp.asarray(x, jnp.float32)
  r_t, v_t, d_t = f32(rewards_t), f32(values_t), f32(discount_t)
  lambda_t = jnp.broadcast_to(f32(lambda_), r_t.shape)
  v_tp1 = jnp.concatenate([v_t[1:], f32(bootstrap_value)[None]])
  delta_t = r_t + d_t * v_tp1 - v_t

  def step(adv_tp1, xs):
    delta, discount, lam = xs
    adv = delta + discount * lam * adv_tp1
    return adv, adv

  _, adv_t = jax.lax.scan(
      step, jnp.zeros((), jnp.float32), (delta_t, d_t, lambda_t), reverse=True
  )
  return adv_t, adv_t + v_t


def token_gae(
    rewards_l: jax.Array,
    values_l: jax.Array,
    mask_l: jax.Array,
    discount: float | jax.Array,
    lambda_: float | jax.Array,
) -> tuple[jax.Array, jax.Array]:
  """GAE over the POLICY tokens of one episode; other tokens add no step.

  The MDP steps are the episode's POLICY tokens t_1 < t_2 < ... < t_N in
  position order (docs/rewards_and_credit.md: prompt, observation (TOOL) and
  TEMPLATE tokens are part of the next state, not actions, so they add no
  discount step and no value estimate of their own). With V_n = values_l[t_n]
  (the value of the state just before POLICY token t_n is emitted),
  r_n = rewards_l[t_n] and V_{N+1} = 0 (every episode ends after its last
  POLICY token: the outcome reward is final, no bootstrap):

    delta_n = r_n + discount * V_{n+1} - V_n,
    A_n     = delta_n + discount * lambda * A_{n+1},   A_{N+1} = 0,
    G_n     = A_n + V_n   (the TD(lambda) value target),

  i.e. `gae_advantages` (Schulman et al., arXiv:1506.02438, eq. 16) on the
  POLICY-token subsequence. Computed as one reverse `lax.scan` over all L
  positions that carries (A_{n+1}, V_{n+1}) unchanged across non-POLICY
  positions. Unbatched: vmap over a batch.

  Args:
    rewards_l: [L] float per-token rewards (e.g. the episode's outcome reward
      at its last POLICY token, 0 elsewhere); read at POLICY positions only.
    values_l: [L] float values; read at POLICY positions only.
    mask_l: [L] bool, True on POLICY tokens.
    discount: per-POLICY-token discount gamma in [0, 1].
    lambda_: GAE lambda in [0, 1].

  Returns:
    (advantages_l [L] float32, returns_l [L] float32), both 0 off POLICY.

  Raises:
    AssertionError: (chex) on rank/shape mismatch of the inputs.
  """
  chex.assert_rank([rewards_l, values_l, mask_l], 1)
  chex.assert_equal_shape([rewards_l, values_l, mask_l])
  m = mask_l.astype(jnp.bool_)
  r = jnp.where(m, rewards_l.astype(jnp.float32), 0.0)
  v = jnp.where(m, values_l.astype(jnp.float32), 0.0)
  d = jnp.asarray(discount, jnp.float32)
  lam = jnp.asarray(lambda_, jnp.float32)

  def step(carry, xs):
    adv_next, v_next = carry
    r_t, v_t, m_t = xs
    adv = r_t + d * v_next - v_t + d * lam * adv_next
    new = (jnp.where(m_t, adv, adv_next), jnp.where(m_t, v_t, v_next))
    return new, jnp.where(m_t, adv, 0.0)

  zero = jnp.zeros((), jnp.float32)
  _, adv_l = jax.lax.scan(step, (zero, zero), (r, v, m), reverse=True)
  return adv_l, jnp.where(m, adv_l + v, 0.0)


# ---------------------------------------------------------------------------
# Per-turn credit: [B, K] turn rewards -> [B, K] advantages.
# ---------------------------------------------------------------------------


def reward_to_go(
    rewards_k: jax.Array, turn_mask_k: jax.Array, discount: float
) -> jax.Array:
  """Discounted reward-to-go of one episode: G_k = sum_{j>=k} d^{j-k} m_j r_j.

  Sutton & Barto, "Reinforcement Learning: An Introduction" (2nd ed., 2018),
  eq. (3.8), restricted to valid turns: masked-out turns contribute no reward
  and get G_k = 0. The exponent counts turn positions (j - k), which equals
  counting valid turns for the usual prefix mask. Computed by a reverse
  `lax.scan`, G_k = m_k (r_k + d G_{k+1}).

  Args:
    rewards_k: [K] float per-turn rewards.
    turn_mask_k: [K] bool (or 0/1) mask of valid turns.
    discount: per-turn discount d in [0, 1].

  Returns:
    [K] float32 reward-to-go, 0 at invalid turns.

  Raises:
    AssertionError: (chex) on rank/shape mismatch of the inputs.
  """
  chex.assert_rank([rewards_k, turn_mask_k], 1)
  chex.assert_equal_shape([rewards_k, turn_mask_k])
  m_k = turn_mask_k.astype(jnp.bool_)
  r_k = jnp.where(m_k, rewards_k.astype(jnp.float32), 0.0)
  d = jnp.asarray(discount, jnp.float32)

  def step(g_kp1, xs):
    r, m = xs
    g = r + d * g_kp1
    return g, jnp.where(m, g, 0.0)

  _, g_k = jax.lax.scan(
      step, jnp.zeros((), jnp.float32), (r_k, m_k), reverse=True
  )
  return g_k


def turn_reward_to_go(
    rewards_bk: jax.Array, turn_mask_bk: jax.Array, discount: float
) -> jax.Array:
  """Batched `reward_to_go`: G_bk = sum_{j>=k} discount^{j-k} m_bj r_bj.

  See `reward_to_go` (vmapped over the batch axis).

  Args:
    rewards_bk: [B, K] float per-turn rewards.
    turn_mask_bk: [B, K] bool (or 0/1) mask of valid turns.
    discount: per-turn discount in [0, 1].

  Returns:
    [B, K] float32 reward-to-go, 0 at invalid turns.

  Raises:
    AssertionError: (chex) on rank/shape mismatch of the inputs.
  """
  chex.assert_rank([rewards_bk, turn_mask_bk], 2)
  chex.assert_equal_shape([rewards_bk, turn_mask_bk])
  return jax.vmap(reward_to_go, in_axes=(0, 0, None))(
      rewards_bk, turn_mask_bk, discount
  )


def per_turn_grpo_advantages(
    returns_bk: jax.Array,
    turn_mask_bk: jax.Array,
    group_b: jax.Array,
    *,
    scale_by_std: bool = True,
    eps: float = 1e-6,
    std_ddof: int = 0,
) -> jax.Array:
  """Per-turn GRPO: A_bk = (G_bk - mean_{g,k}(G)) / (std_{g,k}(G) + eps).

  The statistics of turn k are taken over the episodes of the same group that
  have a valid turn k (turn_mask_bk[b, k]): turn k is compared only with the
  same turn index of its siblings, and episodes that stopped earlier do not
  count as a return of 0. A turn that is valid in only one episode of its
  group, or whose valid returns are all equal, gets exactly 0. Invalid turns
  get 0. This is GRPO's group normalisation (Shao et al., arXiv:2402.03300,
  section 4.1.3 process supervision, normalising per step) applied to
  reward-to-go returns (e.g. from `turn_reward_to_go`, optionally PBRS-shaped).

  Args:
    returns_bk: [B, K] float per-turn returns.
    turn_mask_bk: [B, K] bool (or 0/1) mask of valid turns.
    group_b: [B] int group ids in [0, B).
    scale_by_std: divide by the (group, turn) std (+ eps); else mean-centred.
    eps: added to the std.
    std_ddof: delta degrees of freedom of the std, a Python int >= 0.

  Returns:
    [B, K] float32 advantages, 0 at invalid turns.

  Raises:
    ValueError: if std_ddof is not a non-negative int.
    AssertionError: (chex) on rank/shape/dtype mismatch of the inputs.
  """
  chex.assert_rank([returns_bk, turn_mask_bk], 2)
  chex.assert_equal_shape([returns_bk, turn_mask_bk])
  chex.assert_rank(group_b, 1)
  chex.assert_equal_shape_prefix([returns_bk, group_b], 1)
  chex.assert_type(group_b, int)
  _check_ddof(std_ddof)

  def one_turn(g_b, m_b):
    return grpo_advantages(
        g_b,
        group_b,
        scale_by_std=scale_by_std,
        eps=eps,
        std_ddof=std_ddof,
        valid_b=m_b,
    )

  return jax.vmap(one_turn, in_axes=(1, 1), out_axes=1)(
      returns_bk, turn_mask_bk.astype(jnp.bool_)
  )


# ---------------------------------------------------------------------------
# To tokens.
# ---------------------------------------------------------------------------


def broadcast_to_tokens(adv_b: jax.Array, role_bl: jax.Array) -> jax.Array:
  """Per-episode advantages to per-token [B, L], zero off POLICY tokens.

  A_bl = adv_b if role_bl == POLICY else 0.

  Args:
    adv_b: [B] float advantages.
    role_bl: [B, L] int roles (types.PAD/PROMPT/POLICY/TOOL/TEMPLATE).

  Returns:
    [B, L] float32.
  """
  return jnp.where(role_bl == types.POLICY, adv_b[:, None], 0.0).astype(
      jnp.float32
  )


def broadcast_turn_to_tokens(
    adv_bk: jax.Array, turn_bl: jax.Array, role_bl: jax.Array
) -> jax.Array:
  """Per-turn advantages to per-token [B, L], zero off POLICY tokens.

  A_bl = adv_bk[b, turn_bl[b, l]] if role_bl == POLICY and
  0 <= turn_bl < K, else 0 (turn -1 marks prompt/padding; docs/design.md).

  Args:
    adv_bk: [B, K] float per-turn advantages.
    turn_bl: [B, L] int turn index of each token.
    role_bl: [B, L] int roles.

  Returns:
    [B, L] float32.

  Raises:
    AssertionError: (chex) on rank/shape mismatch of the inputs.
  """
  chex.assert_rank([adv_bk, turn_bl, role_bl], 2)
  chex.assert_equal_shape([turn_bl, role_bl])
  chex.assert_equal_shape_prefix([adv_bk, turn_bl], 1)
  k = adv_bk.shape[1]
  turn = turn_bl.astype(jnp.int32)
  in_range = (turn >= 0) & (turn < k)
  adv_bl = jnp.take_along_axis(
      adv_bk.astype(jnp.float32), jnp.clip(turn, 0, k - 1), axis=1
  )
  keep = in_range & (role_bl == types.POLICY)
  return jnp.where(keep, adv_bl, 0.0).astype(jnp.float32)


# ---------------------------------------------------------------------------
# Host-side helpers.
# ---------------------------------------------------------------------------


def group_ids_from_keys(keys: Sequence[Hashable]) -> np.ndarray:
  """Dense int32 group ids for arbitrary hashable keys, by first appearance.

  E.g. ["ds:2", "ds:1", "ds:2"] -> [0, 1, 0]. Host-side (numpy, not jittable);
  ids lie in [0, len(keys)), as the segment ops of this module require.

  Args:
    keys: length-B sequence of hashable group keys (str, int, tuples, ...).

  Returns:
    [B] int32 numpy array.

  Raises:
    TypeError: if a key is not hashable.
  """
  ids: dict[Hashable, int] = {}
  out = [ids.setdefault(key, len(ids)) for key in keys]
  return np.asarray(out, dtype=np.int32).reshape(len(out))
