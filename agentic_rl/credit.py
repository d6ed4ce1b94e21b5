"""Credit assignment: PBRS, potentials, shaped returns, HDPO, SPA.

Per-turn quantities are [B, K] arrays with a turn mask (docs/design.md);
potentials are [B, K + 1] (Phi(s_0) .. Phi(s_K), s_k = the state after k
turns). Core math is written for one episode (`pbrs_shaping`) and vmapped by
the batched wrappers; group statistics are segment ops on `group_b` (via
`advantages.grpo_advantages`).

How shaping reaches the policy (docs/rewards_and_credit.md, "How shaping
reaches the policy"):

* Trajectory-level returns, discount 1, Phi(terminal) = 0: every shaped return
  is outcome - Phi(s_0). When all episodes of a task share s_0 (same prompt,
  so the same Phi(s_0)), group-relative advantages (GRPO, with or without std
  normalisation) are unchanged: PBRS has no effect on this path.
* Per-turn returns (reward-to-go, `advantages.turn_reward_to_go` on
  `shape_turn_rewards`): the shaped return at turn k is the unshaped
  reward-to-go - Phi(s_k) (discount 1, terminated), i.e. Phi is a
  state-dependent baseline.
* A dense term that does NOT telescope (e.g. lambda * s_b added to the
  outcome) under z-scored GRPO: in an all-fail group the advantage does not
  depend on lambda > 0 ("dark room"); `hdpo_advantages` is the
  conditional alternative for efficiency terms.

Floating-point caveat: on the trajectory path the shift -Phi(s_0) is exact
only in real arithmetic. Summing the float32 F_k
(`episode_returns_with_shaping`) leaves a residue of a few ulp(max |Phi|)
that differs between episodes. In a group whose outcomes are all equal,
GRPO's std division (std ~ ulp, eps = 1e-6) turns that residue into
advantages of order 0.1 (up to ~0.4 seen with O(1) random potentials,
K = 4) instead of exactly 0. On the trajectory path use
`telescoped_episode_returns` (closed form: the shift is one rounding of
-Phi(s_0), identical within a group), or mean-only advantages.
"""

from __future__ import annotations

import math
import numbers

from typing import Any

import chex
import flax.struct
import jax
import jax.numpy as jnp
import optax
from flax import nnx

from agentic_rl import advantages
from agentic_rl import types


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


# ---------------------------------------------------------------------------
# Potentials: [B, K + 1] arrays over the states s_0 .. s_K.
# ---------------------------------------------------------------------------


def progress_potential(
    progress_bk1: jax.Array, scale: float = 1.0
) -> jax.Array:
  """Oracle progress potential Phi(s_k) = scale * progress(s_k).

  A control arm for PBRS (docs/rewards_and_credit.md, potential sources):
  progress is an environment fact, e.g. hops resolved / depth on
  KV-CHAIN, in [0, 1].

  Args:
    progress_bk1: [B, K + 1] float progress after 0 .. K turns.
    scale: multiplier of the potential (reward units per unit progress).

  Returns:
    [B, K + 1] float32 potentials.

  Raises:
    AssertionError: (chex) if progress_bk1 is not rank 2.
  """
  chex.assert_rank(progress_bk1, 2)
  return jnp.asarray(scale, jnp.float32) * jnp.asarray(
      progress_bk1, jnp.float32
  )


def log_ratio_potential(gold_logp_bk1: jax.Array) -> jax.Array:
  """TRACE-style log-ratio state values (inferred form).

  V(s_k) = log p_ref(y* | s_k) - log p_ref(y* | s_0), where log p_ref(y*|s_k)
  is the frozen reference model's log-probability of the gold answer y*
  appended after the k-th tool boundary. TRACE (docs/papers.md; arXiv id not
  given there). From the abstract: states at tool-call boundaries, a frozen
  reference model's gold-answer log-probability per state, "log-ratio state
  values", a per-action reward equal to the TD change of those values, and
  telescoping over redundant calls. Inferred (docs/papers.md, matched here): the
  ratio is taken against the initial state s_0, and r_k = V(s_{k+1}) - V(s_k)
  with discount 1. Our choice: y* is appended after an answer-opening prefix
  (`gold_answer_logprobs`). V(s_0) = 0 by construction.

  As a PBRS potential: `pbrs_shaping(..., discount=1, terminated=False)`
  gives TRACE's inferred r_k, whose sum telescopes to V(s_n) - V(s_0) =
  V(s_n) (the final value is kept, an outcome-like term: not policy
  invariant); `terminated=True` gives policy-invariant PBRS whose sum is
  -V(s_0) = 0.

  Args:
    gold_logp_bk1: [B, K + 1] float log p_ref(y* | s_k), k = 0 .. K (nats;
      summed over the gold-answer tokens).

  Returns:
    [B, K + 1] float32 values V(s_k); column 0 is exactly 0.

  Raises:
    AssertionError: (chex) if gold_logp_bk1 is not rank 2.
  """
  chex.assert_rank(gold_logp_bk1, 2)
  logp = jnp.asarray(gold_logp_bk1, jnp.float32)
  return logp - logp[:, :1]


def success_probability_potential(p_bk1: jax.Array) -> jax.Array:
  """PiCA-style potential Phi(h_k) = P(correct final answer | h_k) (inferred).

  PiCA (docs/papers.md; arXiv id not given there): process rewards are
  history-conditioned success probabilities used as PBRS potentials, with
  discount 1; the exact form Phi = P(correct | h_k), F_k = Phi(h_{k+1}) -
  Phi(h_k) is inferred from the abstract. P comes from a learned value head
  or a reward model; pivot steps are the turns where it jumps.

  Args:
    p_bk1: [B, K + 1] float probabilities in [0, 1] after 0 .. K turns.

  Returns:
    [B, K + 1] float32 potentials (the probabilities, unchanged).

  Raises:
    AssertionError: (chex) if p_bk1 is not rank 2.
  """
  chex.assert_rank(p_bk1, 2)
  return jnp.asarray(p_bk1, jnp.float32)


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
      -jnp.asarray(cost_b, jnp.float32), group_b, eps=eps,
      valid_b=valid & correct,
  )
  return acc_b + jnp.asarray(efficiency_weight, jnp.float32) * eff_b


# ---------------------------------------------------------------------------
# SPA: learned stepwise progress attribution.
# ---------------------------------------------------------------------------


def spa_progress_loss(
    contrib_bk: jax.Array,
    turn_mask_bk: jax.Array,
    outcome_b: jax.Array,
) -> jax.Array:
  """SPA progress-estimator loss mean_b (sum_k m_bk c_bk - R_b)^2 (inferred).

  Stepwise Progress Attribution (Wang et al., SPA-RL, arXiv:2505.20732;
  docs/papers.md):
  a progress estimator c_psi(s_k, a_k) is trained so that its per-turn
  contributions summed over a trajectory match the task outcome; the squared
  loss is inferred from the abstract. The step reward (also inferred) is
  r_k = c_psi(s_k, a_k) + beta * grounding_k, built by the caller.
  Gradients flow into contrib_bk (masked turns get zero gradient).

  Args:
    contrib_bk: [B, K] float per-turn contributions c_psi.
    turn_mask_bk: [B, K] bool (or 0/1) valid-turn mask.
    outcome_b: [B] float outcome R_b (e.g. 1[correct]).

  Returns:
    float32 scalar loss.

  Raises:
    AssertionError: (chex) on rank/shape mismatch of the inputs.
  """
  chex.assert_rank([contrib_bk, turn_mask_bk], 2)
  chex.assert_rank(outcome_b, 1)
  chex.assert_equal_shape([contrib_bk, turn_mask_bk])
  chex.assert_equal_shape_prefix([contrib_bk, outcome_b], 1)
  m_bk = jnp.asarray(turn_mask_bk).astype(jnp.bool_)
  total_b = jnp.sum(jnp.where(m_bk, jnp.asarray(contrib_bk, jnp.float32), 0.0),
                    axis=1)
  return jnp.mean(jnp.square(total_b - jnp.asarray(outcome_b, jnp.float32)))


@flax.struct.dataclass
class SpaState:
  """The SPA progress estimator inside `TrainState.spa` (checkpointed).

  Attributes:
    params: {'weight': [D] float32, 'bias': [] float32}, a linear head on the
      policy's (stop-gradient) final hidden state at the end of each turn.
    opt_state: its own optax state (`make_spa_optimizer`).
  """

  params: Any
  opt_state: Any


def make_spa_optimizer(learning_rate: float) -> optax.GradientTransformation:
  """Adam (arXiv:1412.6980) at `learning_rate` for the SPA head."""
  return optax.adam(learning_rate)


def spa_init(d_model: int, learning_rate: float) -> SpaState:
  """Zero-initialised SPA head (every contribution, so every potential, is 0
  until the head has been trained), with a fresh optimizer state."""
  params = {"weight": jnp.zeros((d_model,), jnp.float32),
            "bias": jnp.zeros((), jnp.float32)}
  return SpaState(params=params,
                  opt_state=make_spa_optimizer(learning_rate).init(params))


def spa_turn_features(hidden_bld: jax.Array, end_bk1: jax.Array) -> jax.Array:
  """[B, K, D] float32 features of turn k: the hidden state at the last token
  of s_{k+1} (the context after turn k and its observation).

  Causal attention makes hidden[b, t] a function of tokens[b, :t + 1] only, so
  feature k depends on the history s_{k+1} alone; with `spa_potential` the
  potential Phi(s_k) is then a function of the state (history) s_k, as PBRS
  requires. Gradients are stopped (the head never trains the policy).

  Args:
    hidden_bld: [B, L, D] final hidden states of the policy
      (`Transformer.hidden_states`).
    end_bk1: [B, K + 1] int32 context lengths (`state_ends`).
  """
  chex.assert_rank([hidden_bld, end_bk1], [3, 2])
  pos_bk = jnp.clip(end_bk1[:, 1:] - 1, 0, hidden_bld.shape[1] - 1)
  feat = jnp.take_along_axis(hidden_bld, pos_bk[:, :, None], axis=1)
  return jax.lax.stop_gradient(feat.astype(jnp.float32))


def spa_contributions(params: Any, feat_bkd: jax.Array) -> jax.Array:
  """Per-turn contributions c_psi(s_k, a_k) = weight . feat_bk + bias, [B, K]
  float32 (SPA, arXiv:2505.20732: a progress estimator whose per-step
  contributions accumulate to the task completion; the linear head on the
  policy's stop-gradient hidden states is our choice)."""
  return jnp.einsum("bkd,d->bk", feat_bkd, params["weight"]) + params["bias"]


def spa_potential(contrib_bk: jax.Array, turn_mask_bk: jax.Array) -> jax.Array:
  """SPA potential Phi(s_k) = sum_{j<k} m_j c_j, [B, K + 1] float32.

  The progress credited so far: Phi(s_0) = 0 and Phi(s_n) = the estimator's
  prediction of the outcome after the n valid turns. As a PBRS potential
  (`shape_turn_rewards`, discount 1) a non-final turn k gets F_k = c_k, the
  last turn of a terminated episode gets -Phi(s_{n-1}) (Phi(terminal) = 0,
  so the shaping telescopes to -Phi(s_0) = 0), and per-turn returns become
  G_k = R - Phi(s_k): the outcome minus the progress already credited. Using
  the cumulative contributions as the potential is our choice (SPA itself
  pays r_k = c_k + beta * grounding_k, which does not telescope).

  Args:
    contrib_bk: [B, K] float contributions (`spa_contributions`).
    turn_mask_bk: [B, K] bool valid turns (prefix per row).
  """
  chex.assert_rank([contrib_bk, turn_mask_bk], 2)
  c = jnp.where(jnp.asarray(turn_mask_bk, bool),
                jnp.asarray(contrib_bk, jnp.float32), 0.0)
  return jnp.concatenate(
      [jnp.zeros((c.shape[0], 1), jnp.float32), jnp.cumsum(c, axis=1)], axis=1)


def spa_policy_features(graphdef, params, tokens_bl, role_bl, turn_bl,
                        num_turns: int) -> jax.Array:
  """[B, K, D] SPA features from one batched forward pass of the policy.

  `spa_turn_features` of `Transformer.hidden_states(tokens_bl)` at the turn
  boundaries `state_ends(role_bl, turn_bl, K)`; stop-gradient.

  Args:
    graphdef, params: the policy (nnx.split).
    tokens_bl, role_bl, turn_bl: [B, L] trajectory fields.
    num_turns: K (static).
  """
  model = nnx.merge(graphdef, params)
  hidden_bld, _ = model.hidden_states(tokens_bl)
  return spa_turn_features(hidden_bld, state_ends(role_bl, turn_bl, num_turns))


def spa_update(spa: SpaState, feat_bkd: jax.Array, turn_mask_bk: jax.Array,
               outcome_b: jax.Array, *, learning_rate: float,
               num_steps: int = 1) -> tuple[SpaState, jax.Array]:
  """`num_steps` full-batch Adam steps on `spa_progress_loss` of the head.

  Args:
    spa: current head and optimizer state.
    feat_bkd: [B, K, D] float32 features (`spa_turn_features`).
    turn_mask_bk: [B, K] bool valid turns.
    outcome_b: [B] float targets R_b (e.g. 1[correct]).
    learning_rate: Adam step size (static; must match `spa_init`'s).
    num_steps: gradient steps (static, >= 1), run with `lax.scan`.

  Returns:
    (new SpaState, float32 loss before the first step).
  """
  tx = make_spa_optimizer(learning_rate)
  loss_fn = lambda p: spa_progress_loss(
      spa_contributions(p, feat_bkd), turn_mask_bk, outcome_b)

  def one(carry, _):
    p, o = carry
    loss, g = jax.value_and_grad(loss_fn)(p)
    upd, o = tx.update(g, o, p)
    return (optax.apply_updates(p, upd), o), loss

  (p, o), losses = jax.lax.scan(one, (spa.params, spa.opt_state), None,
                                length=num_steps)
  return SpaState(params=p, opt_state=o), losses[0]


# ---------------------------------------------------------------------------
# Reference-model log-probs of the gold answer after each turn (TRACE-style
# potentials, likelihood reward), in one batched forward pass.
# ---------------------------------------------------------------------------


def state_ends(role_bl: jax.Array, turn_bl: jax.Array, num_turns: int) -> jax.Array:
  """[B, K + 1] int32 end position of the context s_k (the state after k turns).

  s_k = the prompt plus turns 0 .. k-1 with their observations: the number of
  non-PAD tokens whose turn index is < k (prompt tokens have turn -1; a turn's
  observation tokens carry the turn's index). For k past the episode's last
  turn this is the full episode length.

  Args:
    role_bl: [B, L] int8 roles.
    turn_bl: [B, L] int32 turn index per token.
    num_turns: K (static).
  """
  chex.assert_rank([role_bl, turn_bl], 2)
  real_bl = role_bl != types.PAD
  k_k1 = jnp.arange(num_turns + 1)
  inside = real_bl[:, None, :] & (turn_bl[:, None, :] < k_k1[None, :, None])
  return jnp.sum(inside, axis=-1).astype(jnp.int32)


def gold_answer_sequences(
    tokens_bl: jax.Array,
    end_bk1: jax.Array,
    gold_ba: jax.Array,
    gold_len_b: jax.Array,
    answer_prefix: tuple[int, ...],
    pad_id: int,
) -> tuple[jax.Array, jax.Array]:
  """Sequences s_k ++ answer_prefix ++ gold answer, one per (episode, k).

  Args:
    tokens_bl: [B, L] int32 episode tokens.
    end_bk1: [B, K + 1] int32 context lengths (`state_ends`).
    gold_ba: [B, A] int32 gold-answer tokens (env fact `gold_answer`).
    gold_len_b: [B] int32 real gold lengths (env fact `gold_answer_len`).
    answer_prefix: tokens opening an answer (e.g. (tokenizers.ANSWER,)).
    pad_id: filler token id after the gold answer (never scored).

  Returns:
    (seq [B, K + 1, L + P + A] int32, gold_mask [B, K + 1, L + P + A] bool
     marking the gold-answer positions).
  """
  b, l = tokens_bl.shape
  a = gold_ba.shape[1]
  p = len(answer_prefix)
  t = jnp.arange(l + p + a)
  end = end_bk1[..., None]  # [B, K+1, 1]
  ctx = jnp.concatenate([tokens_bl, jnp.full((b, p + a), pad_id, tokens_bl.dtype)],
                        axis=1)[:, None, :]
  pre = jnp.asarray(answer_prefix + (pad_id,), jnp.int32)[
      jnp.clip(t[None, None, :] - end, 0, p)]
  gold_idx = jnp.clip(t[None, None, :] - end - p, 0, a - 1)
  gold = jnp.take_along_axis(gold_ba[:, None, :], gold_idx, axis=2)
  in_gold = (t >= end + p) & (t < end + p + gold_len_b[:, None, None])
  seq = jnp.where(t < end, ctx, jnp.where(t < end + p, pre,
                                          jnp.where(in_gold, gold, pad_id)))
  return seq.astype(jnp.int32), in_gold


def gold_answer_logprobs(
    logprob_fn,
    tokens_bl: jax.Array,
    role_bl: jax.Array,
    turn_bl: jax.Array,
    gold_ba: jax.Array,
    gold_len_b: jax.Array,
    *,
    num_turns: int,
    answer_prefix: tuple[int, ...],
    pad_id: int,
) -> jax.Array:
  """log p_ref(y* | s_k) for k = 0 .. K, all in one batched forward pass.

  TRACE-style (docs/papers.md; arXiv id not given there): the frozen
  reference model scores the gold answer y* appended (after `answer_prefix`)
  to the context after each turn; with `log_ratio_potential` this gives the
  log-ratio state values, and the value at the final context is the
  likelihood reward (docs/papers.md: log-prob, not prob).

  Args:
    logprob_fn: tokens [N, T] int32 -> teacher-forced log-probs [N, T] float32
      (logp[:, t] = log p(tokens[:, t] | tokens[:, :t]); e.g.
      `lambda x: sampling.token_logprobs(graphdef, ref_params, x)[0]`).
    tokens_bl, role_bl, turn_bl: [B, L] trajectory fields.
    gold_ba: [B, A] int32 gold-answer tokens; gold_len_b: [B] int32 lengths.
    num_turns: K (static).
    answer_prefix: tokens opening an answer.
    pad_id: filler token id.

  Returns:
    [B, K + 1] float32 summed log-probs (nats) of the gold tokens.
  """
  b = tokens_bl.shape[0]
  end = state_ends(role_bl, turn_bl, num_turns)
  seq, gold_mask = gold_answer_sequences(
      tokens_bl, end, gold_ba, gold_len_b, answer_prefix, pad_id)
  n = b * (num_turns + 1)
  logp = logprob_fn(seq.reshape(n, -1)).reshape(seq.shape)
  return jnp.sum(jnp.where(gold_mask, logp, 0.0), axis=-1).astype(jnp.float32)


def likelihood_reward(
    gold_logp_bk1: jax.Array, num_turns_b: jax.Array, finish_b: jax.Array
) -> jax.Array:
  """[B] log p_ref(y* | final context): the likelihood reward (docs/papers.md).

  The final context is the state before the answering turn for ANSWERED
  episodes (the gold answer replaces the policy's answer), and the state after
  the last turn otherwise (index num_turns).

  Args:
    gold_logp_bk1: [B, K + 1] float (`gold_answer_logprobs`).
    num_turns_b: [B] int32 turns taken.
    finish_b: [B] int32 finish reasons.
  """
  idx = jnp.where(finish_b == types.ANSWERED, num_turns_b - 1, num_turns_b)
  idx = jnp.clip(idx, 0, gold_logp_bk1.shape[1] - 1)
  return jnp.take_along_axis(gold_logp_bk1, idx[:, None], axis=1)[:, 0]


# ---------------------------------------------------------------------------
# GiGPO: step groups by identical state within a task group.
# ---------------------------------------------------------------------------


def observation_state_keys(
    tokens_bl: jax.Array, role_bl: jax.Array, turn_bl: jax.Array, num_turns: int,
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
  sel = jnp.where(k_k[None, :, None] == 0, prompt[:, None, :],
                  obs[:, None, :] & (turn_bl[:, None, :] == k_k[None, :, None] - 1))
  tok = jnp.where(sel, tokens_bl[:, None, :].astype(jnp.uint32) + 1, 0)
  tok = tok.astype(jnp.uint32)

  def step(h, t):
    return jnp.where(t != 0, (h ^ t) * jnp.uint32(16777619), h), None

  salt_k = k_k.astype(jnp.uint32) if match_turn else jnp.minimum(
      k_k, 1).astype(jnp.uint32)  # the prompt key stays apart from observations
  h0 = jnp.broadcast_to((jnp.uint32(2166136261) ^ salt_k)[None, :],
                        tok.shape[:2])
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
  same = ((grp[:, None] == grp[None, :]) & (key[:, None] == key[None, :])
          & valid[:, None] & valid[None, :])
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
  if not branching or any(b < 1 for b in branching) or math.prod(branching) != g:
    raise ValueError(f"branching={branching!r} must be >= 1 each with product "
                     f"G={g}")
  if not 0.0 <= alpha <= 1.0:
    raise ValueError(f"alpha={alpha!r} must be in [0, 1]")
  d = len(branching)
  r = jnp.asarray(leaf_reward_g, jnp.float32)
  traj_g = advantages.grpo_advantages(
      r, jnp.zeros((g,), jnp.int32), scale_by_std=scale_by_std, eps=eps)
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
          branching)
      v = v + (jnp.mean(bonus_t, axis=tail) if tail else bonus_t)
    a_traj = jnp.mean(a_t, axis=tail) if tail else a_t
    vmax = jnp.max(v, axis=-1, keepdims=True)
    vmin = jnp.min(v, axis=-1, keepdims=True)
    centred = v - jnp.mean(v, axis=-1, keepdims=True)
    if scale_by_std:
      centred = centred / (jnp.std(v, axis=-1, keepdims=True) + eps)
    fork = jnp.where(vmax == vmin, 0.0, centred)
    node = alpha * fork + (1.0 - alpha) * a_traj
    cols.append(jnp.broadcast_to(node.reshape(node.shape + (1,) * (d - j)),
                                 branching).reshape(g))
  return jnp.stack(cols, axis=1)


def tree_turn_advantages(adv_gd: jax.Array, num_turns: int) -> jax.Array:
  """[G, K] per-turn advantages from `tree_fork_advantages` when the j-th fork
  happens before turn j - 1: turn k gets depth min(k + 1, d)'s advantage (the
  last depth's segment runs to the end of the episode)."""
  d = adv_gd.shape[1]
  col_k = jnp.minimum(jnp.arange(num_turns), d - 1)
  return adv_gd[:, col_k]


# ---------------------------------------------------------------------------
# Next-observation prediction (docs/papers.md "dark room"): the policy's own
# teacher-forced prediction of the tool observations, as a PBRS potential or
# as an auxiliary cross-entropy target (with a shuffled-label placebo).
# ---------------------------------------------------------------------------


def observation_prediction_scores(
    graphdef: nnx.GraphDef, params, tokens_bl: jax.Array,
    temperature: float | jax.Array = 1.0,
) -> tuple[jax.Array, jax.Array]:
  """Per-token next-token prediction scores of a batch under the policy.

  Teacher forced: position t is predicted from tokens[:, :t] (the policy's
  LM head on the hidden state of position t - 1, at `temperature`), exactly
  the distribution `sampling.token_logprobs` scores. Used on TOOL positions
  (the environment's observation tokens, which the policy never samples), it
  measures how well the policy predicts what the tool will return (docs/papers.md,
  the "dark room" study, next-observation prediction; no arXiv id there). One
  trunk pass; the
  full [B, L, V] logits are formed at once (fine for byte vocabularies; a
  large-vocabulary model would want the chunked path of `sampling`).

  Args:
    graphdef, params: the policy.
    tokens_bl: [B, L] int32 trajectories.
    temperature: > 0, the policy's sampling temperature.

  Returns:
    (prob_bl [B, L] float32, p(tokens[:, t] | tokens[:, :t]) in [0, 1];
     hit_bl [B, L] bool, True where that token is the arg-max prediction).
    Position 0 (nothing to predict from) gets prob 0 and hit False.
    Gradient-free (stop_gradient): a reward or a metric, not a loss.
  """
  model = nnx.merge(graphdef, params)
  hidden_bld, _ = model.hidden_states(tokens_bl[:, :-1])
  logits_blv = model.logits(hidden_bld) / jnp.asarray(temperature, jnp.float32)
  logp_blv = jax.nn.log_softmax(logits_blv, axis=-1)
  target_bl = tokens_bl[:, 1:]
  logp_bl = jnp.take_along_axis(logp_blv, target_bl[..., None], axis=-1)[..., 0]
  hit_bl = jnp.argmax(logits_blv, axis=-1) == target_bl
  pad_f = jnp.zeros((tokens_bl.shape[0], 1), jnp.float32)
  prob = jnp.concatenate([pad_f, jnp.exp(logp_bl)], axis=1)
  hit = jnp.concatenate([jnp.zeros_like(pad_f, bool), hit_bl], axis=1)
  return jax.lax.stop_gradient(prob), hit


def observation_prediction_potential(
    score_bl: jax.Array, role_bl: jax.Array, turn_bl: jax.Array,
    num_turns: int,
) -> jax.Array:
  """[B, K + 1] potential Phi(s_k) = mean prediction score of s_k's observations.

  Phi(s_k) = mean of score_bl over the TOOL tokens of the context s_k (the
  prompt plus turns 0 .. k-1 and their observations; an observation carries
  its turn's index, as in `state_ends`), and 0 when s_k holds no
  observation (so Phi(s_0) = 0). With score = the policy's probability of
  each observation token (`observation_prediction_scores`), Phi is bounded in
  [0, 1] and `pbrs_shaping` turns it into the potential-based
  next-observation-prediction reward of docs/papers.md ("dark room"):
  with discount 1 and trajectory returns the shaped return is
  R + Phi(s_n) for an episode cut off at the horizon (MAX_TURNS / TRUNCATED
  keep their last potential) and R for a terminated one (Phi(terminal) = 0).

  Args:
    score_bl: [B, L] float per-token scores (e.g. probabilities in [0, 1]).
    role_bl: [B, L] int8 roles (types.TOOL marks observation tokens).
    turn_bl: [B, L] int32 turn index per token.
    num_turns: K (static).

  Returns:
    [B, K + 1] float32 potentials.
  """
  chex.assert_rank([score_bl, role_bl, turn_bl], 2)
  chex.assert_equal_shape([score_bl, role_bl, turn_bl])
  obs_bl = role_bl == types.TOOL
  k_k1 = jnp.arange(num_turns + 1)
  inside = obs_bl[:, None, :] & (turn_bl[:, None, :] < k_k1[None, :, None])
  total = jnp.sum(jnp.where(inside, jnp.asarray(score_bl, jnp.float32)[:, None, :],
                            0.0), axis=-1)
  count = jnp.sum(inside, axis=-1)
  return jnp.where(count > 0, total / jnp.maximum(count, 1), 0.0).astype(
      jnp.float32)


def shuffle_observation_targets(
    tokens_bl: jax.Array, obs_mask_bl: jax.Array, key: jax.Array,
) -> jax.Array:
  """Placebo labels: observation tokens permuted at random across the batch.

  The shuffled-gold placebo of docs/papers.md: the auxiliary
  next-observation loss is trained on targets that keep the marginal
  distribution of observation tokens but lose their relation to the context.
  The N = sum(obs_mask) observation tokens of the whole batch (all rows) are
  permuted uniformly at random (`key`); position i-th observation slot (in
  row-major order) receives the token of the i-th slot of the random order.
  Tokens outside the mask are returned unchanged, so the inputs of the
  policy (and its POLICY-token targets) are untouched. Static shapes
  (jittable): two argsorts over B * L.

  Args:
    tokens_bl: [B, L] int32 tokens.
    obs_mask_bl: [B, L] bool, True on observation (TOOL) tokens.
    key: PRNG key.

  Returns:
    [B, L] int32 targets: a permutation of tokens_bl's masked entries placed
    at the masked positions, tokens_bl elsewhere.
  """
  chex.assert_equal_shape([tokens_bl, obs_mask_bl])
  flat = tokens_bl.reshape(-1)
  mask = obs_mask_bl.reshape(-1).astype(bool)
  u = jax.random.uniform(key, flat.shape)
  # Masked slots first, in random order (sources) / in row-major order (dest).
  src = jnp.argsort(jnp.where(mask, u, 2.0))
  dst = jnp.argsort(jnp.where(mask, 0, 1), stable=True)
  n = jnp.sum(mask.astype(jnp.int32))
  moved = jnp.where(jnp.arange(flat.shape[0]) < n, flat[src], flat[dst])
  return flat.at[dst].set(moved).reshape(tokens_bl.shape).astype(tokens_bl.dtype)


def observation_prediction_loss(
    logp_bl: jax.Array, obs_mask_bl: jax.Array,
    denominator: jax.Array | float | None = None,
) -> jax.Array:
  """Auxiliary next-observation cross-entropy -sum(mask * logp) / denominator.

  docs/papers.md ("auxiliary-loss channel instead of reward"): the same
  prediction target as the dense reward, trained as a self-supervised CE on
  the policy's LM head at observation (TOOL) positions instead of entering
  the returns. `logp_bl` are the teacher-forced log-probs of the targets
  (the observation tokens, or `shuffle_observation_targets` for the
  placebo).

  Args:
    logp_bl: [B, L] float32 log-probs of the targets.
    obs_mask_bl: [B, L] bool observation positions.
    denominator: token count to divide by (e.g. over the whole optimizer
      batch, so micro-batch losses sum to the batch loss); None = this
      batch's mask count (at least 1).

  Returns:
    float32 scalar, nats per observation token.
  """
  m = jnp.asarray(obs_mask_bl).astype(jnp.float32)
  if denominator is None:
    denominator = jnp.maximum(jnp.sum(m), 1.0)
  return -jnp.sum(jnp.asarray(logp_bl, jnp.float32) * m) / denominator
