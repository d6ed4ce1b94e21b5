"""Potential-based reward shaping (PBRS) of per-turn rewards and returns.

Ng, Harada & Russell, "Policy invariance under reward transformations",
ICML 1999: F_k = discount * Phi(s_{k+1}) - Phi(s_k), Phi(terminal) = 0.
Potentials are [B, K + 1] arrays over the states s_0 .. s_K; per-turn
quantities are [B, K] with a turn mask (docs/design.md). The core math is
written for one episode (`pbrs_shaping`) and vmapped by the batched wrappers.
See the package docstring (agentic_rl/credit/__init__.py) for how shaping
reaches the policy and the float32 caveat of the trajectory path.
"""

from __future__ import annotations

import numbers

import chex
import jax
import jax.numpy as jnp


def _check_discount(discount) -> None:
  """Raises ValueError for a concrete discount outside [0, 1]."""
  if isinstance(discount, numbers.Real) and not 0.0 <= discount <= 1.0:
    raise ValueError(f"discount must lie in [0, 1], got {discount!r}.")


# ---------------------------------------------------------------------------
# Potential-based reward shaping (one episode; batched wrapper).
# ---------------------------------------------------------------------------


def pbrs_shaping(
    phi_k: jax.Array,
    turn_mask_k: jax.Array,
    discount: float | jax.Array,
    terminated: bool | jax.Array,
) -> jax.Array:
  """Potential-based shaping F_k = discount * Phi'(s_{k+1}) - Phi(s_k).

  Ng, Harada & Russell, "Policy invariance under reward transformations:
  theory and application to reward shaping", ICML 1999 (no arXiv id).

  One episode of n = sum(turn_mask_k) valid turns (a prefix of the K slots);
  s_k is the state after k turns. Phi' = Phi except Phi'(s_n) = 0 when the
  episode terminated (s_n is an absorbing terminal state, whose potential
  must be 0 for policy invariance); when it was truncated (turn budget,
  context full) s_n is not terminal and Phi(s_n) is kept. Invalid turns
  (k >= n) get F_k = 0, and Phi(s_{n+1..K}) are never read.

  Telescoping (n >= 1):

      sum_{k<n} discount^k F_k = discount^n Phi'(s_n) - Phi(s_0),

  so with discount = 1 and termination every trajectory return is shifted by
  -Phi(s_0). An episode with n = 0 gets F = 0 everywhere (sum 0).

  The mask is assumed to be a prefix (not checked: its values may be traced);
  for any other mask F_k is still masked per slot and Phi' zeroes Phi at slot
  n = sum(mask).

  Args:
    phi_k: [K + 1] float potentials Phi(s_0) .. Phi(s_K) (cast to float32).
    turn_mask_k: [K] bool (or 0/1) mask of valid turns, a prefix.
    discount: per-turn discount in [0, 1], Python float or float scalar.
    terminated: bool scalar; True if the episode ended in a terminal state
      (e.g. answered), False if it was cut off (truncated).

  Returns:
    [K] float32 shaping rewards F_k, 0 at invalid turns.

  Raises:
    ValueError: if a Python-number discount lies outside [0, 1].
    AssertionError: (chex) if phi_k is not [K + 1] for turn_mask_k of [K], or
      terminated is not a scalar.
  """
  chex.assert_rank([phi_k, turn_mask_k], 1)
  chex.assert_axis_dimension(phi_k, 0, turn_mask_k.shape[0] + 1)
  chex.assert_rank(jnp.asarray(terminated), 0)
  _check_discount(discount)
  return _pbrs_shaping(phi_k, turn_mask_k, discount, terminated)


# Jitted so that eager callers run one compiled program instead of dispatching
# each op; inside an outer jit/vmap it is simply inlined.
@jax.jit
def _pbrs_shaping(phi_k, turn_mask_k, discount, terminated):
  k = turn_mask_k.shape[0]
  m_k = jnp.asarray(turn_mask_k).astype(jnp.bool_)
  phi = jnp.asarray(phi_k, jnp.float32)
  d = jnp.asarray(discount, jnp.float32)
  n = jnp.sum(m_k.astype(jnp.int32))
  # Slot k + 1 of Phi(s_{k+1}); the terminal state s_n has potential 0.
  next_index_k = jnp.arange(1, k + 1)
  is_terminal_k = jnp.asarray(terminated, jnp.bool_) & (next_index_k == n)
  phi_next_k = jnp.where(is_terminal_k, 0.0, phi[1:])
  f_k = d * phi_next_k - phi[:-1]
  return jnp.where(m_k, f_k, 0.0)


def shape_turn_rewards(
    rewards_bk: jax.Array,
    phi_bk1: jax.Array,
    turn_mask_bk: jax.Array,
    discount: float | jax.Array,
    terminated_b: jax.Array,
) -> jax.Array:
  """Shaped per-turn rewards r_bk + F_bk, F from `pbrs_shaping` (vmapped).

  Ng, Harada & Russell, ICML 1999. Feed the result to
  `advantages.turn_reward_to_go` (same discount) for per-turn returns, where
  (discount 1, terminated) G_k = unshaped reward-to-go - Phi(s_k); or to
  `episode_returns_with_shaping` for trajectory-level returns.

  Args:
    rewards_bk: [B, K] float per-turn rewards (e.g. the outcome at the last
      valid turn).
    phi_bk1: [B, K + 1] float potentials Phi(s_0) .. Phi(s_K) per episode.
    turn_mask_bk: [B, K] bool (or 0/1) valid-turn mask, a prefix per row.
    discount: per-turn discount in [0, 1], shared by the batch.
    terminated_b: [B] bool; True for terminated, False for truncated episodes.

  Returns:
    [B, K] float32 shaped rewards, 0 at invalid turns.

  Raises:
    ValueError: if a Python-number discount lies outside [0, 1].
    AssertionError: (chex) on rank/shape mismatch of the inputs.
  """
  chex.assert_rank([rewards_bk, phi_bk1, turn_mask_bk], 2)
  chex.assert_rank(terminated_b, 1)
  chex.assert_equal_shape([rewards_bk, turn_mask_bk])
  chex.assert_equal_shape_prefix([rewards_bk, phi_bk1, terminated_b], 1)
  _check_discount(discount)
  f_bk = jax.vmap(pbrs_shaping, in_axes=(0, 0, None, 0))(
      phi_bk1, turn_mask_bk, discount, terminated_b
  )
  m_bk = jnp.asarray(turn_mask_bk).astype(jnp.bool_)
  return jnp.where(m_bk, jnp.asarray(rewards_bk, jnp.float32) + f_bk, 0.0)


def episode_returns_with_shaping(
    outcome_b: jax.Array,
    shaping_bk: jax.Array,
    turn_mask_bk: jax.Array,
    discount: float | jax.Array,
) -> jax.Array:
  """Trajectory-level shaped return R_b + sum_k discount^k m_bk F_bk.

  Ng, Harada & Russell, ICML 1999. With F from `pbrs_shaping` this equals
  R_b + discount^n Phi'(s_n) - Phi(s_0) (telescoping); with discount = 1 and
  terminated episodes it is R_b - Phi(s_0), so GRPO advantages of a group
  whose episodes share Phi(s_0) equal those of R_b alone (up to float32
  rounding of the sum; see the module docstring for all-equal groups, and
  `telescoped_episode_returns` for the closed form).

  Args:
    outcome_b: [B] float outcome rewards R_b (undiscounted, e.g. correct).
    shaping_bk: [B, K] float per-turn shaping F_bk.
    turn_mask_bk: [B, K] bool (or 0/1) valid-turn mask.
    discount: per-turn discount in [0, 1]; turn k is weighted discount^k.

  Returns:
    [B] float32 returns.

  Raises:
    ValueError: if a Python-number discount lies outside [0, 1].
    AssertionError: (chex) on rank/shape mismatch of the inputs.
  """
  chex.assert_rank(outcome_b, 1)
  chex.assert_rank([shaping_bk, turn_mask_bk], 2)
  chex.assert_equal_shape([shaping_bk, turn_mask_bk])
  chex.assert_equal_shape_prefix([outcome_b, shaping_bk], 1)
  _check_discount(discount)
  k = shaping_bk.shape[1]
  d = jnp.asarray(discount, jnp.float32)
  weight_k = jnp.power(d, jnp.arange(k, dtype=jnp.float32))
  m_bk = jnp.asarray(turn_mask_bk).astype(jnp.bool_)
  f_bk = jnp.where(m_bk, jnp.asarray(shaping_bk, jnp.float32), 0.0)
  return jnp.asarray(outcome_b, jnp.float32) + jnp.sum(f_bk * weight_k, axis=1)


def telescoped_episode_returns(
    outcome_b: jax.Array,
    phi_bk1: jax.Array,
    turn_mask_bk: jax.Array,
    discount: float | jax.Array,
    terminated_b: jax.Array,
) -> jax.Array:
  """Trajectory-level PBRS return in closed form R_b + d^n Phi'(s_n) - Phi(s_0).

  Ng, Harada & Russell, ICML 1999. Equals `episode_returns_with_shaping` of
  the `pbrs_shaping` F in real arithmetic (telescoping), with n_b = number of
  valid turns and Phi'(s_n) = 0 for terminated episodes; an episode with
  n = 0 gets R_b (no turn to shape, as in `pbrs_shaping`). Preferred on the
  trajectory path: with discount 1 and termination the shaped return is
  R_b - Phi(s_0) rounded once, so episodes with equal (R_b, Phi(s_0)) get
  bit-identical returns and an all-equal group still gets exactly 0 GRPO
  advantage (summed float32 F_k do not guarantee this; see module docstring).

  Args:
    outcome_b: [B] float outcome rewards R_b.
    phi_bk1: [B, K + 1] float potentials Phi(s_0) .. Phi(s_K).
    turn_mask_bk: [B, K] bool (or 0/1) valid-turn mask, a prefix per row.
    discount: per-turn discount d in [0, 1].
    terminated_b: [B] bool; True for terminated, False for truncated episodes.

  Returns:
    [B] float32 returns.

  Raises:
    ValueError: if a Python-number discount lies outside [0, 1].
    AssertionError: (chex) on rank/shape mismatch of the inputs.
  """
  chex.assert_rank([outcome_b, terminated_b], 1)
  chex.assert_rank([phi_bk1, turn_mask_bk], 2)
  chex.assert_equal_shape_prefix(
      [outcome_b, phi_bk1, turn_mask_bk, terminated_b], 1
  )
  chex.assert_axis_dimension(phi_bk1, 1, turn_mask_bk.shape[1] + 1)
  _check_discount(discount)
  phi = jnp.asarray(phi_bk1, jnp.float32)
  d = jnp.asarray(discount, jnp.float32)
  n_b = jnp.sum(jnp.asarray(turn_mask_bk).astype(jnp.int32), axis=1)
  phi_n_b = jnp.take_along_axis(phi, n_b[:, None], axis=1)[:, 0]
  phi_n_b = jnp.where(jnp.asarray(terminated_b, jnp.bool_), 0.0, phi_n_b)
  shift_b = jnp.power(d, n_b.astype(jnp.float32)) * phi_n_b - phi[:, 0]
  shift_b = jnp.where(n_b > 0, shift_b, 0.0)
  return jnp.asarray(outcome_b, jnp.float32) + shift_b
