"""Credit assignment (PBRS, potentials, HDPO, SPA) against hand values."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentic_rl import advantages
from agentic_rl import credit

# ---------------------------------------------------------------------------
# PBRS: hand values and telescoping.
# ---------------------------------------------------------------------------

# K = 3, discount 0.9, n = 2 valid turns.
_PHI = jnp.array([0.5, 1.0, 2.0, 3.0])
_MASK = jnp.array([True, True, False])


def test_pbrs_hand_terminated_truncated_and_invalid_turns():
  # Terminated: Phi'(s_2) = 0. F_0 = 0.9 * 1.0 - 0.5 = 0.4,
  # F_1 = 0.9 * 0 - 1.0 = -1.0, F_2 = 0 (invalid).
  f_term = credit.pbrs_shaping(_PHI, _MASK, 0.9, True)
  np.testing.assert_allclose(f_term, [0.4, -1.0, 0.0], atol=1e-6)
  # Sum 0.4 + 0.9 * -1.0 = -0.5 = 0.9^2 * 0 - Phi(s_0).
  np.testing.assert_allclose(f_term[0] + 0.9 * f_term[1], -0.5, atol=1e-6)

  # Truncated: Phi(s_2) = 2 kept. F_1 = 0.9 * 2.0 - 1.0 = 0.8.
  f_trunc = credit.pbrs_shaping(_PHI, _MASK, 0.9, False)
  np.testing.assert_allclose(f_trunc, [0.4, 0.8, 0.0], atol=1e-6)
  # Sum 0.4 + 0.72 = 1.12 = 0.81 * 2.0 - 0.5.
  np.testing.assert_allclose(f_trunc[0] + 0.9 * f_trunc[1], 1.12, atol=1e-6)

  # All 3 turns valid, terminated: F = [0.4, 0.8, 0 - 2.0].
  f_full = credit.pbrs_shaping(_PHI, jnp.ones(3, bool), 0.9, True)
  np.testing.assert_allclose(f_full, [0.4, 0.8, -2.0], atol=1e-6)

  # No valid turn: nothing to shape.
  f_none = credit.pbrs_shaping(_PHI, jnp.zeros(3, bool), 0.9, True)
  np.testing.assert_array_equal(f_none, [0.0, 0.0, 0.0])

  # Trajectory-level helper: outcome 1 + sum_k 0.9^k F_k.
  ret = credit.episode_returns_with_shaping(
      jnp.array([1.0, 1.0]),
      jnp.stack([f_term, f_trunc]),
      jnp.stack([_MASK, _MASK]),
      0.9,
  )
  np.testing.assert_allclose(ret, [0.5, 2.12], atol=1e-6)
  # Closed form; a third episode with n = 0 keeps its outcome.
  closed = credit.telescoped_episode_returns(
      jnp.ones(3),
      jnp.stack([_PHI] * 3),
      jnp.stack([_MASK, _MASK, jnp.zeros(3, bool)]),
      0.9,
      jnp.array([True, False, True]),
  )
  np.testing.assert_allclose(closed, [0.5, 2.12, 1.0], atol=1e-6)


def test_pbrs_telescopes_for_random_potentials():
  # 512 random episodes (seeded): random K-prefix length n >= 1, discount,
  # termination and potentials; compared with the closed form in float64.
  rng = np.random.default_rng(0)
  b, k = 512, 5
  phi = rng.normal(size=(b, k + 1)) * 3.0
  n = rng.integers(1, k + 1, size=b)
  mask = np.arange(k)[None, :] < n[:, None]
  term = rng.random(b) < 0.5
  disc = rng.random(b)
  disc[:64] = 1.0
  f = jax.vmap(credit.pbrs_shaping)(
      jnp.asarray(phi, jnp.float32),
      jnp.asarray(mask),
      jnp.asarray(disc, jnp.float32),
      jnp.asarray(term),
  )
  f = np.asarray(f, np.float64)
  assert np.all(f[~mask] == 0.0)
  lhs = np.sum(f * disc[:, None] ** np.arange(k)[None, :], axis=1)
  phi_n = np.where(term, 0.0, phi[np.arange(b), n])
  rhs = disc**n * phi_n - phi[:, 0]
  np.testing.assert_allclose(lhs, rhs, atol=1e-5)
  closed = credit.telescoped_episode_returns(
      jnp.zeros(b),
      jnp.asarray(phi, jnp.float32),
      jnp.asarray(mask),
      1.0,
      jnp.asarray(term),
  )
  np.testing.assert_allclose(closed[:64], lhs[:64], atol=1e-5)  # discount 1


def test_discount_out_of_range_raises():
  with pytest.raises(ValueError, match="1.5"):
    credit.pbrs_shaping(_PHI, _MASK, 1.5, True)


# ---------------------------------------------------------------------------
# PBRS under group-relative advantages.
# ---------------------------------------------------------------------------


def test_trajectory_grpo_advantages_invariant_to_pbrs():
  # Assumption: every episode of a task starts from the same state, so
  # Phi(s_0) is shared within a group. Discount 1, all terminated: each
  # shaped return is outcome - Phi(s_0), a per-group constant shift, so GRPO
  # advantages (z-scored and mean-only) are those of the outcome alone.
  rng = np.random.default_rng(1)
  b, k = 16, 4
  group = np.array([0, 1, 2, 3] * 4, np.int32)  # interleaved groups of 4
  # Groups 0-2 mixed; group 3 all-fail.
  outcome = np.array(
      [1, 0, 1, 0, 1, 0, 0, 0, 0, 1, 1, 0, 0, 1, 0, 0], np.float32
  )
  outcome_j, group_j = jnp.asarray(outcome), jnp.asarray(group)
  term = jnp.ones(b, bool)
  mixed = group != 3
  base = advantages.grpo_advantages(outcome_j, group_j)
  base_mean_only = advantages.grpo_advantages(
      outcome_j, group_j, scale_by_std=False
  )
  assert np.all(np.abs(np.asarray(base)[mixed]) > 0.1)
  for scale in (0.1, 0.3, 1.0, 100.0):
    mask = np.arange(k)[None, :] < rng.integers(1, k + 1, size=b)[:, None]
    phi = rng.normal(size=(b, k + 1)) * scale
    phi[:, 0] = rng.normal(size=4)[group] * scale
    phi_j = jnp.asarray(phi, jnp.float32)
    f = credit.shape_turn_rewards(jnp.zeros((b, k)), phi_j, mask, 1.0, term)
    summed = credit.episode_returns_with_shaping(outcome_j, f, mask, 1.0)
    closed = credit.telescoped_episode_returns(
        outcome_j, phi_j, mask, 1.0, term
    )
    np.testing.assert_allclose(
        summed, outcome - phi[:, 0], atol=1e-6 * scale * k + 1e-6
    )
    np.testing.assert_allclose(closed, summed, atol=1e-6 * scale * k + 1e-6)
    # Closed form: the all-fail group keeps exactly 0 advantage, any scale.
    a_closed = np.asarray(advantages.grpo_advantages(closed, group_j))
    assert np.all(a_closed[~mixed] == 0.0)
    if scale > 1.0:
      continue  # float32: the shift is exact only up to ulp(|Phi|) / std.
    for ret in (summed, closed):
      np.testing.assert_allclose(
          np.asarray(advantages.grpo_advantages(ret, group_j))[mixed],
          np.asarray(base)[mixed],
          atol=1e-6,
      )
      np.testing.assert_allclose(
          advantages.grpo_advantages(ret, group_j, scale_by_std=False),
          base_mean_only,
          atol=1e-6,
      )
    np.testing.assert_allclose(a_closed, base, atol=1e-6)


def test_per_turn_returns_potential_is_state_baseline():
  # Discount 1, terminated, K = 3. Row 0: 3 turns, outcome 1 at turn 2,
  # Phi = [0.2, 0.5, 0.9, (unused)]: F = [0.3, 0.4, -0.9], shaped
  # r = [0.3, 0.4, 0.1], reward-to-go [0.8, 0.5, 0.1] = [1, 1, 1] - Phi(s_k).
  # Row 1: 2 turns, outcome 1 at turn 1, Phi = [0.2, 0.6, ...]:
  # F = [0.4, -0.6, 0], shaped [0.4, 0.4, 0], reward-to-go [0.8, 0.4, 0].
  rewards = jnp.array([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
  phi = jnp.array([[0.2, 0.5, 0.9, 7.0], [0.2, 0.6, 0.7, 0.3]])
  mask = jnp.array([[True, True, True], [True, True, False]])
  shaped = credit.shape_turn_rewards(
      rewards, phi, mask, 1.0, jnp.array([True, True])
  )
  np.testing.assert_allclose(
      shaped, [[0.3, 0.4, 0.1], [0.4, 0.4, 0.0]], atol=1e-6
  )
  g_shaped = advantages.turn_reward_to_go(shaped, mask, 1.0)
  g_plain = advantages.turn_reward_to_go(rewards, mask, 1.0)
  expected = [[0.8, 0.5, 0.1], [0.8, 0.4, 0.0]]
  np.testing.assert_allclose(g_shaped, expected, atol=1e-6)
  np.testing.assert_allclose(
      g_shaped, np.where(mask, g_plain - phi[:, :3], 0.0), atol=1e-6
  )


def test_dark_room_zscore_ignores_dense_coefficient():
  # the "dark room" study: in an all-fail group (outcome 0) the reward is lambda * s_b alone;
  # its z-score is (s - mean s) / std s whatever lambda > 0 is, so a bounded
  # dense bonus exerts full-strength pressure however small lambda is (and
  # annealing lambda cannot help). This is the mechanism behind GRPO's
  # collapse onto dense rewards. s = [0.1, 0.3, 0.1, 0.3]: mean 0.2, std 0.1.
  s = jnp.array([0.1, 0.3, 0.1, 0.3])
  group = jnp.zeros(4, jnp.int32)
  outcome = jnp.zeros(4)
  for lam in (0.01, 1.0, 100.0):
    # eps = 0: exact invariance (with eps > 0 it holds while lambda*std >> eps).
    a = advantages.grpo_advantages(outcome + lam * s, group, eps=0.0)
    np.testing.assert_allclose(a, [-1.0, 1.0, -1.0, 1.0], rtol=1e-5)
    # Mean-only advantages (the fix in the "dark room" study) scale with lambda instead.
    a_mean = advantages.grpo_advantages(
        outcome + lam * s, group, scale_by_std=False
    )
    np.testing.assert_allclose(
        a_mean, lam * np.array([-0.1, 0.1, -0.1, 0.1]), rtol=1e-4
    )


# ---------------------------------------------------------------------------
# HDPO.
# ---------------------------------------------------------------------------

_S3 = math.sqrt(0.1875)  # population std of one 1 among four 0/1 values


def _hdpo_batch():
  # Four interleaved groups of 4 (group id = row % 4).
  # g0: correct [1,1,1,0], calls [1,3,2,5].
  # g1: correct [0,1,0,0], calls [2,4,1,3] (one correct: no efficiency).
  # g2: correct [0,0,0,0], calls [1,2,3,4] (none correct: all 0).
  # g3: correct [1,1,1,1], calls [1,2,3,2] (accuracy channel all-equal).
  correct = np.array([[1, 1, 1, 0], [0, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]])
  calls = np.array(
      [[1, 3, 2, 5], [2, 4, 1, 3], [1, 2, 3, 4], [1, 2, 3, 2]], np.float32
  )
  # Row r holds episode r // 4 of group r % 4: transpose, then flatten.
  group_b = np.tile(np.arange(4, dtype=np.int32), 4)
  return correct.T.reshape(-1), calls.T.reshape(-1), group_b


def _hdpo_expected(w):
  # g0 accuracy: mean 0.75, std sqrt(0.1875): 0.25/s for correct, -0.75/s.
  # g0 efficiency over correct {1,3,2}: -cost [-1,-3,-2], mean -2,
  # deviations [1,-1,0], std sqrt(2/3): z = [1.2247449, -1.2247449, 0].
  z = 1.0 / math.sqrt(2.0 / 3.0)
  g0 = [0.25 / _S3 + w * z, 0.25 / _S3 - w * z, 0.25 / _S3, -0.75 / _S3]
  # g1: accuracy only: one 1 among 0s.
  g1 = [-0.25 / _S3, 0.75 / _S3, -0.25 / _S3, -0.25 / _S3]
  g2 = [0.0] * 4
  # g3: accuracy 0; efficiency -cost [-1,-2,-3,-2], mean -2, std sqrt(0.5).
  r2 = math.sqrt(2.0)
  g3 = [w * r2, 0.0, -w * r2, 0.0]
  return np.array([g0, g1, g2, g3]).T.reshape(-1)


def test_hdpo_hand_values():
  corr, calls, group = _hdpo_batch()
  for eps, rtol in ((0.0, 1e-6), (1e-6, 1e-5)):
    a = credit.hdpo_advantages(
        jnp.asarray(corr, bool),
        jnp.asarray(calls),
        jnp.asarray(group),
        efficiency_weight=0.5,
        eps=eps,
    )
    np.testing.assert_allclose(a, _hdpo_expected(0.5), rtol=rtol, atol=1e-6)
  # Literal check of g0 (rows 0, 4, 8, 12): [1.1897227, -0.0350221,
  # 0.5773503, -1.7320508].
  np.testing.assert_allclose(
      np.asarray(a)[group == 0],
      [1.1897227, -0.0350221, 0.5773503, -1.7320508],
      atol=1e-5,
  )
  # Groups with 0 or 1 correct episodes: efficiency channel exactly 0, so A
  # does not depend on w; the all-fail group is exactly 0.
  a0 = credit.hdpo_advantages(
      jnp.asarray(corr),
      jnp.asarray(calls),
      jnp.asarray(group),
      efficiency_weight=0.0,
  )
  a9 = credit.hdpo_advantages(
      jnp.asarray(corr),
      jnp.asarray(calls),
      jnp.asarray(group),
      efficiency_weight=9.0,
  )
  sel = (group == 1) | (group == 2)
  np.testing.assert_array_equal(np.asarray(a0)[sel], np.asarray(a9)[sel])
  assert np.all(np.asarray(a9)[group == 2] == 0.0)


def test_hdpo_all_equal_cost_and_negative_weight():
  corr = jnp.array([1, 1, 0, 1])
  calls = jnp.array([2.0, 2.0, 7.0, 2.0])
  a = credit.hdpo_advantages(
      corr, calls, jnp.zeros(4, jnp.int32), efficiency_weight=3.0, eps=1e-30
  )
  # Efficiency channel exactly 0 (all correct costs equal): accuracy only.
  np.testing.assert_allclose(
      a, [0.25 / _S3] * 2 + [-0.75 / _S3, 0.25 / _S3], rtol=1e-6
  )
  with pytest.raises(ValueError, match="-1"):
    credit.hdpo_advantages(
        corr, calls, jnp.zeros(4, jnp.int32), efficiency_weight=-1.0
    )


# ---------------------------------------------------------------------------
# Potentials and SPA.
# ---------------------------------------------------------------------------


def test_potentials_hand_values():
  logp = jnp.array([[-3.0, -2.0, -0.5, -0.1], [-1.0, -1.0, -4.0, -1.0]])
  np.testing.assert_allclose(
      credit.log_ratio_potential(logp),
      [[0.0, 1.0, 2.5, 2.9], [0.0, 0.0, -3.0, 0.0]],
      atol=1e-6,
  )
  # TRACE (inferred): terminated=False keeps V(s_n); r sums to V(s_3) = 2.9.
  v = credit.log_ratio_potential(logp)[0]
  r = credit.pbrs_shaping(v, jnp.ones(3, bool), 1.0, False)
  np.testing.assert_allclose(r, [1.0, 1.5, 0.4], atol=1e-6)
  np.testing.assert_allclose(
      credit.progress_potential(jnp.array([[0.0, 0.25, 0.5]]), scale=2.0),
      [[0.0, 0.5, 1.0]],
  )
  p = jnp.array([[0.1, 0.7, 0.9]])
  np.testing.assert_array_equal(credit.success_probability_potential(p), p)


def test_spa_progress_loss_hand_value_and_gradient():
  # Row 0: 0.2 + 0.3 (0.9 masked) - 1 = -0.5; row 1: 0.5 + 0.1 + 0 - 0 = 0.6.
  # Loss (0.25 + 0.36) / 2 = 0.305; d/dc = 2 / B * error on valid turns.
  contrib = jnp.array([[0.2, 0.3, 0.9], [0.5, 0.1, 0.0]])
  mask = jnp.array([[True, True, False], [True, True, True]])
  outcome = jnp.array([1.0, 0.0])
  loss, grad = jax.value_and_grad(credit.spa_progress_loss)(
      contrib, mask, outcome
  )
  np.testing.assert_allclose(loss, 0.305, rtol=1e-6)
  np.testing.assert_allclose(
      grad, [[-0.5, -0.5, 0.0], [0.6, 0.6, 0.6]], rtol=1e-6
  )


# ---------------------------------------------------------------------------
# jit / vmap variants.
# ---------------------------------------------------------------------------


def test_jit_and_vmap_match_eager():
  rewards = jnp.array([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
  phi = jnp.array([[0.2, 0.5, 0.9, 7.0], [0.2, 0.6, 0.7, 0.3]])
  mask = jnp.array([[True, True, True], [True, True, False]])
  term = jnp.array([True, False])
  outcome = jnp.array([1.0, 0.0])

  def pipeline(rewards, phi, mask, term, outcome, discount):
    shaped = credit.shape_turn_rewards(rewards, phi, mask, discount, term)
    f = shaped - jnp.where(mask, rewards, 0.0)
    ret = credit.episode_returns_with_shaping(outcome, f, mask, discount)
    loss = credit.spa_progress_loss(shaped, mask, outcome)
    return shaped, ret, loss

  eager = pipeline(rewards, phi, mask, term, outcome, 0.9)
  jitted = jax.jit(pipeline)(
      rewards, phi, mask, term, outcome, jnp.float32(0.9)
  )
  chex_tree_close = lambda x, y: jax.tree.map(
      lambda u, v: np.testing.assert_allclose(u, v, atol=1e-6), x, y
  )
  chex_tree_close(eager, jitted)
  # The batched wrapper equals a Python loop over the unbatched core.
  loop = jnp.stack(
      [credit.pbrs_shaping(phi[i], mask[i], 0.9, term[i]) for i in range(2)]
  )
  np.testing.assert_allclose(
      eager[0] - jnp.where(mask, rewards, 0.0), loop, atol=1e-6
  )

  # HDPO under jit, and vmapped over a leading axis of 2 independent batches.
  corr, calls, group = _hdpo_batch()
  corr, calls, group = map(jnp.asarray, (corr, calls, group))
  hdpo = lambda c, x, g: credit.hdpo_advantages(c, x, g, efficiency_weight=0.5)
  a = hdpo(corr, calls, group)
  np.testing.assert_allclose(jax.jit(hdpo)(corr, calls, group), a, atol=1e-6)
  stacked = jax.vmap(hdpo)(
      jnp.stack([corr, 1 - corr]),
      jnp.stack([calls, calls[::-1]]),
      jnp.stack([group, group]),
  )
  np.testing.assert_allclose(stacked[0], a, atol=1e-6)
  np.testing.assert_allclose(
      stacked[1], hdpo(1 - corr, calls[::-1], group), atol=1e-6
  )


def _gold_traj():
  """ep 0: prompt (2), turn 0 = 2 POLICY + 1 TOOL, turn 1 = 2 POLICY, answered.
  ep 1: prompt (2), turn 0 = 2 POLICY, answered; PAD after."""
  from agentic_rl import types

  P, Q, T, D = types.PROMPT, types.POLICY, types.TOOL, types.PAD
  tokens = jnp.array([[1, 2, 3, 4, 5, 6, 7], [1, 9, 8, 7, 0, 0, 0]], jnp.int32)
  role = jnp.array([[P, P, Q, Q, T, Q, Q], [P, P, Q, Q, D, D, D]], jnp.int8)
  turn = jnp.array([[-1, -1, 0, 0, 0, 1, 1], [-1, -1, 0, 0, -1, -1, -1]])
  gold = jnp.array([[40, 41, 42], [50, 0, 0]], jnp.int32)
  gold_len = jnp.array([2, 1])
  return tokens, role, turn, gold, gold_len


def test_state_ends_and_gold_sequences_hand_layout():
  tokens, role, turn, gold, gold_len = _gold_traj()
  # Jitted, as the learner runs them (integer index arithmetic: the same
  # values as op by op, without a compile per op).
  ends = jax.jit(credit.state_ends, static_argnums=2)(role, turn, 2)
  np.testing.assert_array_equal(ends, [[2, 5, 7], [2, 4, 4]])
  seq, gmask = jax.jit(credit.gold_answer_sequences, static_argnums=(4, 5))(
      tokens, ends, gold, gold_len, (99,), 0
  )
  assert seq.shape == (2, 3, 7 + 1 + 3)
  np.testing.assert_array_equal(seq[0, 1], [1, 2, 3, 4, 5, 99, 40, 41, 0, 0, 0])
  np.testing.assert_array_equal(seq[1, 0], [1, 9, 99, 50, 0, 0, 0, 0, 0, 0, 0])
  np.testing.assert_array_equal(np.nonzero(gmask[0, 1])[0], [6, 7])


def test_gold_answer_logprobs_position_probe_and_likelihood_reward():
  """A probe model with log p(token at t) = -t: the gold positions of s_k are
  end_k + 1 .. end_k + len, so the sum is -(len * end_k + len (len + 1) / 2
  + len * 0) ... written out per entry below."""
  from agentic_rl import types

  tokens, role, turn, gold, gold_len = _gold_traj()
  probe = lambda x: -jnp.broadcast_to(
      jnp.arange(x.shape[1], dtype=jnp.float32), x.shape
  )
  lp = jax.jit(
      lambda *a: credit.gold_answer_logprobs(
          probe, *a, num_turns=2, answer_prefix=(99,), pad_id=0
      )
  )(tokens, role, turn, gold, gold_len)
  # ep 0 (len 2): ends 2, 5, 7 -> positions {3,4}, {6,7}, {8,9}.
  # ep 1 (len 1): ends 2, 4, 4 -> positions {3}, {5}, {5}.
  np.testing.assert_allclose(lp, [[-7, -13, -17], [-3, -5, -5]])
  r = credit.likelihood_reward(
      lp, jnp.array([2, 1]), jnp.array([types.ANSWERED, types.MAX_TURNS])
  )
  # ep 0 answered at turn 1: context s_1; ep 1 not answered: s_1 (n = 1).
  np.testing.assert_allclose(r, [-13, -5])
  np.testing.assert_allclose(
      credit.log_ratio_potential(lp), [[0, -6, -10], [0, -2, -2]]
  )


def test_gold_answer_logprobs_match_a_direct_reference_forward(_policy):
  from agentic_rl import sampling

  graphdef, params = _policy  # fakes.tiny_policy(3), one block (_policy)
  tokens, role, turn, gold, gold_len = _gold_traj()
  # Compiled forwards (op by op each shape was hundreds of small compiles).
  fn = jax.jit(lambda x: sampling.token_logprobs(graphdef, params, x)[0])
  lp = credit.gold_answer_logprobs(
      fn,
      tokens,
      role,
      turn,
      gold,
      gold_len,
      num_turns=2,
      answer_prefix=(99,),
      pad_id=0,
  )
  # Independent: score [1 2 3 4 5 99 40 41] directly (ep 0, s_1).
  direct = fn(jnp.array([[1, 2, 3, 4, 5, 99, 40, 41]]))
  np.testing.assert_allclose(lp[0, 1], direct[0, 6] + direct[0, 7], rtol=1e-5)


def test_gigpo_step_advantages_hand_values():
  # One task group of 3 (K = 2): ep 0 and ep 1 call the tool (same
  # observation -> same s_1), then ep 0 answers right, ep 1 wrong; ep 2
  # answers wrong at once. Returns (gamma 1): [1, 1], [0, 0], [0, -].
  returns = jnp.array([[1.0, 1.0], [0.0, 0.0], [0.0, 0.0]])
  keys = jnp.array([[7, 3], [7, 3], [7, 5]], jnp.uint32)
  mask = jnp.array([[1, 1], [1, 1], [1, 0]], bool)
  group = jnp.zeros(3, jnp.int32)
  a = jax.jit(functools.partial(credit.gigpo_step_advantages, eps=0.0))(
      returns, keys, mask, group
  )
  # s_0 group: [1, 0, 0], mean 1/3, std sqrt(2)/3 -> [sqrt 2, -1/sqrt 2 x2];
  # s_1 group {ep0, ep1}: [1, 0] -> [1, -1]; ep 2 has no turn 1.
  r2 = np.sqrt(2.0)
  np.testing.assert_allclose(
      a, [[r2, 1], [-1 / r2, -1], [-1 / r2, 0]], rtol=1e-5
  )
  a = credit.gigpo_step_advantages(
      returns, keys, mask, group, scale_by_std=False
  )
  np.testing.assert_allclose(
      a, [[2 / 3, 0.5], [-1 / 3, -0.5], [-1 / 3, 0]], rtol=1e-6
  )
  # Another task group with the same keys is a separate step group.
  a = credit.gigpo_step_advantages(
      returns, keys, mask, jnp.array([0, 1, 1]), scale_by_std=False
  )
  np.testing.assert_allclose(a, [[0, 0], [0, 0], [0, 0]], atol=1e-7)


def test_observation_state_keys_group_identical_observations():
  from agentic_rl import types

  P, Q, T, D = types.PROMPT, types.POLICY, types.TOOL, types.PAD
  tokens = jnp.array(
      [
          [1, 2, 3, 4, 50, 6],
          [1, 2, 8, 9, 50, 7],
          [1, 2, 3, 4, 51, 6],
          [1, 2, 6, 0, 0, 0],
      ],
      jnp.int32,
  )
  role = jnp.array([[P, P, Q, Q, T, Q]] * 3 + [[P, P, Q, D, D, D]], jnp.int8)
  turn = jnp.array([[-1, -1, 0, 0, 0, 1]] * 3 + [[-1, -1, 0, -1, -1, -1]])
  k = np.asarray(credit.observation_state_keys(tokens, role, turn, 2))
  assert len(set(k[:, 0])) == 1  # same prompt
  assert k[0, 1] == k[1, 1]  # same observation, different calls
  assert k[2, 1] != k[0, 1]  # different observation
  assert k[3, 1] != k[0, 1]  # no observation


def test_portool_tree_advantages_hand_drawn_2x2_tree():
  """Root -> A1 (leaves 0, 1), A2 (leaves 2, 3); outcomes [1, 0, 0, 0].

  v(A1) = .5, v(A2) = 0 -> A_fork = +-1 (z) / +-.25 (mean-only).
  Under A1: leaves 1, 0 -> +-1 / +-.5; under A2: 0, 0 -> 0.
  Leaf GRPO: mean .25, std sqrt(.1875) -> [sqrt 3, -1/sqrt 3 x3];
  A_traj(A1) = mean(sqrt 3, -1/sqrt 3) = 1/sqrt 3, A_traj(A2) = -1/sqrt 3.
  """
  r = jnp.array([1.0, 0.0, 0.0, 0.0])
  s3 = np.sqrt(3.0)
  a = jax.jit(
      functools.partial(
          credit.tree_fork_advantages, branching=(2, 2), alpha=0.5, eps=0.0
      )
  )(r)
  np.testing.assert_allclose(
      a,
      [
          [0.5 * 1 + 0.5 / s3, 0.5 * 1 + 0.5 * s3],
          [0.5 * 1 + 0.5 / s3, -0.5 - 0.5 / s3],
          [-0.5 - 0.5 / s3, -0.5 / s3],
          [-0.5 - 0.5 / s3, -0.5 / s3],
      ],
      rtol=1e-5,
  )
  m = credit.tree_fork_advantages(r, (2, 2), alpha=1.0, scale_by_std=False)
  np.testing.assert_allclose(
      m, [[0.25, 0.5], [0.25, -0.5], [-0.25, 0], [-0.25, 0]], atol=1e-6
  )
  # alpha = 0: the deepest step of each leaf gets its plain GRPO advantage.
  z = credit.tree_fork_advantages(r, (2, 2), alpha=0.0, eps=0.0)
  np.testing.assert_allclose(
      z[:, 1], [s3, -1 / s3, -1 / s3, -1 / s3], rtol=1e-5
  )
  # Turns: turn 0 -> depth 1, turns >= 1 -> depth 2.
  t = credit.tree_turn_advantages(m, 3)
  np.testing.assert_allclose(t[0], [0.25, 0.5, 0.5], atol=1e-6)
  with pytest.raises(ValueError, match="branching"):
    credit.tree_fork_advantages(r, (3, 2), alpha=0.5)
  with pytest.raises(ValueError, match="alpha"):
    credit.tree_fork_advantages(r, (2, 2), alpha=1.5)


def test_observation_state_keys_any_turn_as_in_the_paper():
  # Ep 0 sees observation 50 after turn 0; ep 1 sees it after turn 1.
  from agentic_rl import types

  P, Q, T = types.PROMPT, types.POLICY, types.TOOL
  tokens = jnp.array(
      [[1, 2, 3, 50, 6, 51, 7], [1, 2, 3, 52, 6, 50, 7]], jnp.int32
  )
  role = jnp.array([[P, P, Q, T, Q, T, Q]] * 2, jnp.int8)
  turn = jnp.array([[-1, -1, 0, 0, 1, 1, 2]] * 2)
  same_turn = np.asarray(credit.observation_state_keys(tokens, role, turn, 3))
  any_turn = np.asarray(
      credit.observation_state_keys(tokens, role, turn, 3, match_turn=False)
  )
  assert same_turn[0, 1] != same_turn[1, 2]
  assert any_turn[0, 1] == any_turn[1, 2]
  assert any_turn[0, 2] != any_turn[1, 1]  # 51 vs 52
  assert any_turn[0, 0] == any_turn[1, 0] == same_turn[0, 0]  # the prompt
  # GiGPO on the any-turn keys: the shared state's two steps (returns 1, 0)
  # get +-1 (z-score); every other step is alone in its step group.
  returns = jnp.array([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
  a = credit.gigpo_step_advantages(
      returns,
      jnp.asarray(any_turn),
      jnp.ones((2, 3), bool),
      jnp.zeros(2, jnp.int32),
      eps=0.0,
  )
  np.testing.assert_allclose(a, [[1.0, 1.0, 0.0], [-1.0, 0.0, -1.0]], atol=1e-6)


def test_portool_step_bonus_enters_the_node_value():
  # Same 2x2 tree, outcomes [1, 0, 0, 0], mean-only, alpha = 1. Depth-1 bonus
  # 0.5 on A1's step: v(A1) = .5 + .5, v(A2) = 0 -> A_fork = +-.5. Depth-2
  # bonus 1 on leaf 1's step: under A1 values 1 + 0 = 0 + 1 -> 0.
  r = jnp.array([1.0, 0.0, 0.0, 0.0])
  bonus = jnp.array([[0.5, 0.0], [0.5, 1.0], [0.0, 0.0], [0.0, 0.0]])
  m = credit.tree_fork_advantages(
      r, (2, 2), alpha=1.0, scale_by_std=False, step_bonus_gd=bonus
  )
  np.testing.assert_allclose(
      m, [[0.5, 0], [0.5, 0], [-0.5, 0], [-0.5, 0]], atol=1e-6
  )


# ---------------------------------------------------------------------------
# SPA: learned progress estimator as a PBRS potential.
# ---------------------------------------------------------------------------


def test_spa_potential_hand_values_and_pbrs_on_it():
  # c = [[0.2, 0.3, 0.9], [0.5, -0.1, 0.4]], row 0 has 2 valid turns.
  # Phi row 0 = [0, 0.2, 0.5, 0.5]; row 1 = [0, 0.5, 0.4, 0.8].
  c = jnp.array([[0.2, 0.3, 0.9], [0.5, -0.1, 0.4]])
  mask = jnp.array([[True, True, False], [True, True, True]])
  phi = credit.spa_potential(c, mask)
  np.testing.assert_allclose(
      phi, [[0, 0.2, 0.5, 0.5], [0, 0.5, 0.4, 0.8]], atol=1e-6
  )
  # PBRS (discount 1, terminated): non-final turns get F_k = c_k, the last
  # turn -Phi(s_{n-1}); row 0: [0.2, -0.2, 0], row 1: [0.5, -0.1, -0.4].
  f = credit.shape_turn_rewards(
      jnp.zeros((2, 3)), phi, mask, 1.0, jnp.array([True, True])
  )
  np.testing.assert_allclose(
      f, [[0.2, -0.2, 0.0], [0.5, -0.1, -0.4]], atol=1e-6
  )
  # Truncated: Phi(s_n) kept, F_k = c_k on every valid turn.
  f_tr = credit.shape_turn_rewards(
      jnp.zeros((2, 3)), phi, mask, 1.0, jnp.array([False, False])
  )
  np.testing.assert_allclose(f_tr, jnp.where(mask, c, 0.0), atol=1e-6)


def test_spa_head_training_reduces_sum_to_outcome_error():
  # Toy batch: 3 turns, features in R^4; the outcome is 1 iff a "productive"
  # feature (dim 0) fired on some turn, so a linear head can fit it exactly.
  rng = np.random.default_rng(0)
  b, k, d = 32, 3, 4
  feat = rng.normal(size=(b, k, d)).astype(np.float32) * 0.3
  hit = rng.random((b, k)) < 0.3
  feat[..., 0] = hit.astype(np.float32)
  mask = np.arange(k)[None, :] < rng.integers(1, k + 1, size=b)[:, None]
  outcome = np.sum(hit & mask, axis=1).astype(np.float32)
  spa = credit.spa_init(d, 0.05)
  update = jax.jit(
      functools.partial(credit.spa_update, learning_rate=0.05, num_steps=50)
  )
  loss0 = float(
      credit.spa_progress_loss(
          credit.spa_contributions(spa.params, feat), mask, outcome
      )
  )
  np.testing.assert_allclose(loss0, np.mean(outcome**2), rtol=1e-6)
  losses = []
  for _ in range(4):
    spa, first = update(spa, feat, mask, outcome)
    losses.append(float(first))
  loss_end = float(
      credit.spa_progress_loss(
          credit.spa_contributions(spa.params, feat), mask, outcome
      )
  )
  # The reported loss is the one before each call's first step.
  np.testing.assert_allclose(losses[0], loss0, rtol=1e-6)
  assert losses == sorted(losses, reverse=True)
  assert loss_end < 0.05 * loss0, (loss0, loss_end)
  # The head found the productive feature: weight ~1 on dim 0.
  assert abs(float(spa.params["weight"][0]) - 1.0) < 0.2


@pytest.fixture(scope="module")
def _policy():
  """fakes.tiny_policy(3) with one block (the two tests reading it compare
  two computations on the same model: any depth), initialised by one
  compiled program (op by op the initialisation was ~100 small compiles)."""
  import dataclasses

  from flax import nnx

  from agentic_rl.models import transformer
  from tests import fakes

  cfg = dataclasses.replace(fakes.TINY, num_layers=1)
  init = lambda: transformer.Transformer(cfg, nnx.Rngs(params=3))
  graphdef = nnx.graphdef(nnx.eval_shape(init))
  params = jax.jit(lambda: nnx.state(init()))()
  return graphdef, params


def test_spa_features_one_batched_pass_match_per_prefix_forward(_policy):
  # Independent reference: the feature of turn k is the last hidden state of
  # a separate forward pass over the prefix s_{k+1} alone.
  from flax import nnx

  graphdef, params = _policy
  tokens, role, turn, _, _ = _gold_traj()
  k = 2
  fn = jax.jit(
      functools.partial(credit.spa_policy_features, graphdef), static_argnums=4
  )
  feat = fn(params, tokens, role, turn, k)
  assert feat.shape == (2, k, 32) and feat.dtype == jnp.float32
  last_hidden = jax.jit(
      lambda p, t: nnx.merge(graphdef, p).hidden_states(t)[0][0, -1]
  )
  # Context lengths: ep 0 s_1 = 5 tokens, s_2 = 7; ep 1 s_1 = s_2 = 4.
  for b, ends in ((0, (5, 7)), (1, (4, 4))):
    for j, e in enumerate(ends):
      np.testing.assert_allclose(
          feat[b, j], last_hidden(params, tokens[b : b + 1, :e]), atol=2e-5
      )
  # Potentials: one jitted pass of head + cumsum, equal to hand composition.
  head = {"weight": jnp.linspace(-1.0, 1.0, 32), "bias": jnp.float32(0.1)}
  mask = jnp.array([[True, True], [True, False]])
  phi = jax.jit(
      lambda p, f, m: credit.spa_potential(credit.spa_contributions(p, f), m)
  )(head, feat, mask)
  c = np.einsum("bkd,d->bk", np.asarray(feat), np.asarray(head["weight"])) + 0.1
  np.testing.assert_allclose(
      phi,
      [[0, c[0, 0], c[0, 0] + c[0, 1]], [0, c[1, 0], c[1, 0]]],
      rtol=1e-5,
      atol=1e-6,
  )


def test_pbrs_properties_hold_with_the_spa_potential():
  # Random heads on random features: telescoping, trajectory-GRPO invariance
  # and the per-turn state baseline, exactly as for any other potential.
  rng = np.random.default_rng(7)
  b, k, d = 8, 4, 5
  group = jnp.asarray(np.repeat(np.arange(2), 4), jnp.int32)
  outcome = jnp.array([1, 0, 1, 0, 0, 1, 1, 1], jnp.float32)
  mask = jnp.asarray(
      np.arange(k)[None, :] < rng.integers(1, k + 1, size=b)[:, None]
  )
  term = jnp.ones(b, bool)
  base = advantages.grpo_advantages(outcome, group)

  # Every quantity below from one compiled program, run for both seeds (op by op
  # they were ~150 small compiles); the checks read its outputs.
  @jax.jit
  def properties(feat, head):
    phi = credit.spa_potential(credit.spa_contributions(head, feat), mask)
    totals = []
    for disc in (1.0, 0.9):
      f = credit.shape_turn_rewards(jnp.zeros((b, k)), phi, mask, disc, term)
      totals.append(
          credit.episode_returns_with_shaping(jnp.zeros(b), f, mask, disc)
      )
    closed = credit.telescoped_episode_returns(outcome, phi, mask, 1.0, term)
    # Per-turn: reward-to-go of the shaped outcome.
    n = jnp.sum(mask, 1)
    r_bk = jnp.where(
        jnp.arange(k)[None, :] == (n - 1)[:, None], outcome[:, None], 0.0
    )
    shaped = credit.shape_turn_rewards(r_bk, phi, mask, 1.0, term)
    g = advantages.turn_reward_to_go(shaped, mask, 1.0)
    return phi, totals, advantages.grpo_advantages(closed, group), g

  for seed in range(2):
    r = np.random.default_rng(seed)
    feat = jnp.asarray(r.normal(size=(b, k, d)), jnp.float32)
    head = {
        "weight": jnp.asarray(r.normal(size=d), jnp.float32),
        "bias": jnp.float32(r.normal()),
    }
    phi, totals, adv_closed, g = properties(feat, head)
    np.testing.assert_array_equal(phi[:, 0], 0.0)  # shared Phi(s_0)
    for total in totals:  # discounts 1.0 and 0.9
      # Telescoping: sum_k d^k F_k = d^n * 0 - Phi(s_0) = 0.
      np.testing.assert_allclose(total, 0.0, atol=1e-5)
    np.testing.assert_allclose(adv_closed, base, atol=1e-6)
    # Per-turn: reward-to-go of the shaped outcome = R - Phi(s_k).
    np.testing.assert_allclose(
        g, jnp.where(mask, outcome[:, None] - phi[:, :k], 0.0), atol=1e-5
    )


def test_gigpo_tree_and_spa_under_jit_and_vmap():
  rng = np.random.default_rng(3)
  b, k = 6, 3
  returns = jnp.asarray(rng.integers(0, 2, size=(2, b, k)), jnp.float32)
  keys = jnp.asarray(rng.integers(0, 3, size=(2, b, k)), jnp.uint32)
  mask = jnp.asarray(
      np.arange(k)[None, None, :]
      < rng.integers(1, k + 1, size=(2, b))[..., None]
  )
  group = jnp.asarray(np.repeat(np.arange(2), 3), jnp.int32)
  gig = lambda r, s, m: credit.gigpo_step_advantages(r, s, m, group)
  batched = jax.jit(jax.vmap(gig))(returns, keys, mask)
  for i in range(2):
    np.testing.assert_allclose(
        batched[i], gig(returns[i], keys[i], mask[i]), atol=1e-6
    )
  leaves = jnp.asarray(rng.integers(0, 2, size=(3, 4)), jnp.float32)
  tree = functools.partial(
      credit.tree_fork_advantages, branching=(2, 2), alpha=0.5
  )
  batched = jax.jit(jax.vmap(tree))(leaves)
  for i in range(3):
    np.testing.assert_allclose(batched[i], tree(leaves[i]), atol=1e-6)
  feat = jnp.asarray(rng.normal(size=(2, b, k, 4)), jnp.float32)
  head = {"weight": jnp.arange(4.0), "bias": jnp.float32(0.5)}
  spa = lambda f, m: credit.spa_potential(credit.spa_contributions(head, f), m)
  batched = jax.jit(jax.vmap(spa))(feat, mask)
  for i in range(2):
    np.testing.assert_allclose(batched[i], spa(feat[i], mask[i]), atol=1e-5)
