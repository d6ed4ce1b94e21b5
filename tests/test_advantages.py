"""GRPO advantages against hand-computed values (arXiv:2402.03300)."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentic_rl import advantages
from agentic_rl import estimators
from agentic_rl import types


def test_all_equal_group_gives_exact_zero_and_finite():
  r = jnp.array([0.1, 0.1, 0.1, 0.7, 0.7, 0.7], jnp.float32)
  g = jnp.array([0, 0, 0, 1, 1, 1])
  for eps in (1e-6, 1e-30):
    a = advantages.grpo_advantages(r, g, eps=eps)
    assert np.all(np.asarray(a) == 0.0)
    assert np.all(np.isfinite(np.asarray(a)))


def test_hand_computed_z_scores_and_interleaved_groups():
  # Group 0 = rows 0, 2, 4, 6 with rewards 1, 0, 0, 0: mean 0.25,
  # population std sqrt(0.1875) = 0.4330127.
  r = jnp.array([1.0, 5.0, 0.0, 3.0, 0.0, 5.0, 0.0, 3.0])
  g = jnp.array([0, 1, 0, 1, 0, 1, 0, 1])
  a = advantages.grpo_advantages(r, g, eps=0.0)
  s0 = math.sqrt(0.1875)
  expected0 = [0.75 / s0, -0.25 / s0, -0.25 / s0, -0.25 / s0]
  # Group 1: rewards 5, 3, 5, 3: mean 4, std 1.
  expected1 = [1.0, -1.0, 1.0, -1.0]
  np.testing.assert_allclose(a[::2], expected0, rtol=1e-6)
  np.testing.assert_allclose(a[1::2], expected1, rtol=1e-6)


def test_mean_only_switch():
  r = jnp.array([1.0, 0.0, 0.0, 0.0])
  a = advantages.grpo_advantages(r, jnp.zeros(4, jnp.int32), scale_by_std=False)
  np.testing.assert_allclose(a, [0.75, -0.25, -0.25, -0.25], rtol=1e-6)


def test_jit_and_broadcast_to_policy_tokens():
  r = jnp.array([1.0, 0.0])
  a = jax.jit(advantages.grpo_advantages)(r, jnp.array([0, 0]))
  np.testing.assert_allclose(a, [1.0, -1.0], rtol=1e-5)
  role = jnp.array(
      [
          [types.PROMPT, types.POLICY, types.TOOL, types.POLICY],
          [types.PROMPT, types.POLICY, types.PAD, types.PAD],
      ],
      jnp.int8,
  )
  tok = advantages.broadcast_to_tokens(a, role)
  np.testing.assert_allclose(tok, [[0, a[0], 0, a[0]], [0, a[1], 0, 0]])


# ---------------------------------------------------------------------------
# Robustness of the all-equal-group guarantee.
# ---------------------------------------------------------------------------


def test_all_ones_group_exact_zero():
  a = advantages.grpo_advantages(jnp.ones(4), jnp.zeros(4, jnp.int32))
  assert np.all(np.asarray(a) == 0.0)


def test_unrepresentable_equal_values_give_zero_eager_and_jit():
  # -11.000002 is not exactly representable in float32; interleaved groups of
  # sizes 3, 4 and 5 make the rounded group mean differ from the value itself.
  r = jnp.full((12,), -11.000002, jnp.float32)
  g = jnp.array([0, 1, 2, 0, 1, 2, 0, 1, 2, 1, 2, 2])
  for fn in (
      advantages.grpo_advantages,
      jax.jit(advantages.grpo_advantages),
      jax.jit(
          functools.partial(advantages.grpo_advantages, std_ddof=1, eps=1e-30)
      ),
      jax.jit(functools.partial(advantages.rloo_advantages, scale_by_std=True)),
      jax.jit(lambda r, g: advantages.reinforce_pp_advantages(r)),
      jax.jit(advantages.reinforce_pp_baseline_advantages),
      jax.jit(advantages.drgrpo_advantages),
  ):
    a = np.asarray(fn(r, g))
    assert np.all(np.isfinite(a))
    np.testing.assert_allclose(a, np.zeros(12), atol=1e-6)


def test_gradients_finite_for_constant_groups():
  r = jnp.array([-11.000002] * 4 + [1.0, 0.0, 1.0, 0.0], jnp.float32)
  g = jnp.array([0, 0, 0, 0, 1, 1, 1, 1])
  logits = jnp.array([0.3, -0.2, 1.5, 0.0, 0.1, 0.2, 0.3, 0.4])

  def loss(logits, r):
    adv = advantages.grpo_advantages(r, g)
    return jnp.sum(adv * logits)

  d_logits, d_r = jax.grad(loss, argnums=(0, 1))(logits, r)
  assert np.all(np.isfinite(np.asarray(d_logits)))
  assert np.all(np.isfinite(np.asarray(d_r)))
  # d/dlogits of sum(adv * logits) is adv itself: 0 on the constant group.
  np.testing.assert_allclose(d_logits[:4], 0.0, atol=1e-6)
  np.testing.assert_allclose(d_logits[4:], [1, -1, 1, -1], rtol=1e-5)


# ---------------------------------------------------------------------------
# Group keys, Dr.GRPO, ddof.
# ---------------------------------------------------------------------------


def test_group_ids_from_keys_dense_first_appearance():
  ids = advantages.group_ids_from_keys(["ds:2", "ds:1", "ds:2", ("a", 1)])
  assert ids.dtype == np.int32
  np.testing.assert_array_equal(ids, [0, 1, 0, 2])
  assert advantages.group_ids_from_keys([]).shape == (0,)


def test_drgrpo_interleaved_string_keyed_groups():
  keys = ["ds:1", "ds:2"] * 4
  r = jnp.array([1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0])
  g = jnp.asarray(advantages.group_ids_from_keys(keys))
  a = advantages.drgrpo_advantages(r, g)
  # ds:1: [1, 0, 1, 0], mean 0.5.  ds:2: [1, 1, 1, 0], mean 0.75.
  np.testing.assert_allclose(a[0::2], [0.5, -0.5, 0.5, -0.5], rtol=1e-6)
  np.testing.assert_allclose(a[1::2], [0.25, 0.25, 0.25, -0.75], rtol=1e-6)


def test_grpo_sample_std_ddof1():
  # [1, 0, 0, 0]: mean 0.25, sum of squares 0.75, sample var 0.75 / 3 = 0.25,
  # sample std 0.5.
  r = jnp.array([1.0, 0.0, 0.0, 0.0])
  a = advantages.grpo_advantages(
      r, jnp.zeros(4, jnp.int32), eps=0.0, std_ddof=1
  )
  np.testing.assert_allclose(a, [1.5, -0.5, -0.5, -0.5], rtol=1e-6)


def test_size_one_group_ddof1_is_zero_not_nan():
  r = jnp.array([3.0, 1.0, 0.0])
  g = jnp.array([0, 1, 1])
  for ddof in (0, 1):
    a = np.asarray(advantages.grpo_advantages(r, g, std_ddof=ddof, eps=0.0))
    assert np.all(np.isfinite(a))
    assert a[0] == 0.0
  # Group 1 = [1, 0], ddof 1: mean 0.5, var 0.5 / 1, std sqrt(0.5).
  a = advantages.grpo_advantages(r, g, std_ddof=1, eps=0.0)
  np.testing.assert_allclose(
      a[1:], [0.5 / math.sqrt(0.5), -0.5 / math.sqrt(0.5)], rtol=1e-6
  )


def test_negative_ddof_raises():
  with pytest.raises(ValueError, match="std_ddof"):
    advantages.grpo_advantages(
        jnp.ones(2), jnp.zeros(2, jnp.int32), std_ddof=-1
    )


def test_grpo_valid_mask_excludes_rows():
  # Row 3 invalid: group 0 is [1, 0, 0] -> mean 1/3.
  r = jnp.array([1.0, 0.0, 0.0, 100.0])
  v = jnp.array([True, True, True, False])
  a = advantages.grpo_advantages(
      r, jnp.zeros(4, jnp.int32), scale_by_std=False, valid_b=v
  )
  np.testing.assert_allclose(a, [2 / 3, -1 / 3, -1 / 3, 0.0], rtol=1e-6)


# ---------------------------------------------------------------------------
# RLOO.
# ---------------------------------------------------------------------------


def test_rloo_hand_values_and_size_one_group():
  r = jnp.array([1.0, 7.0, 0.0, 0.0, 0.0, 2.0, 4.0])
  g = jnp.array([0, 1, 0, 0, 0, 2, 2])
  a = advantages.rloo_advantages(r, g)
  # Group 0 [1, 0, 0, 0]: 1 - 0 = 1; 0 - 1/3 = -1/3.  Group 1 size 1 -> 0.
  # Group 2 [2, 4]: 2 - 4 = -2, 4 - 2 = 2.
  np.testing.assert_allclose(
      a, [1.0, 0.0, -1 / 3, -1 / 3, -1 / 3, -2.0, 2.0], rtol=1e-6
  )
  assert a[1] == 0.0


def test_rloo_scale_by_std_and_constant_group():
  r = jnp.array([2.0, 4.0, 5.0, 5.0])
  g = jnp.array([0, 0, 1, 1])
  a = advantages.rloo_advantages(r, g, scale_by_std=True, eps=0.0)
  # Group 0: LOO [-2, 2], population std 1.  Group 1 constant -> exactly 0.
  np.testing.assert_allclose(a[:2], [-2.0, 2.0], rtol=1e-6)
  assert np.all(np.asarray(a[2:]) == 0.0)


# ---------------------------------------------------------------------------
# REINFORCE++.
# ---------------------------------------------------------------------------


def test_reinforce_pp_hand_values_and_mask():
  # [1, 0, 0, 0]: mean 0.25, std sqrt(0.1875).
  s = math.sqrt(0.1875)
  a = advantages.reinforce_pp_advantages(
      jnp.array([1.0, 0.0, 0.0, 0.0]), eps=0.0
  )
  np.testing.assert_allclose(
      a, [0.75 / s, -0.25 / s, -0.25 / s, -0.25 / s], rtol=1e-6
  )
  # Valid rows [3, 1] (mean 2, std 1); masked rows ignored and set to 0.
  r = jnp.array([3.0, 50.0, 1.0, -7.0])
  v = jnp.array([True, False, True, False])
  a = advantages.reinforce_pp_advantages(r, v, eps=0.0)
  np.testing.assert_allclose(a, [1.0, 0.0, -1.0, 0.0], rtol=1e-6)
  # All-equal batch -> exactly 0.
  a = advantages.reinforce_pp_advantages(jnp.full((5,), 0.3), eps=1e-30)
  assert np.all(np.asarray(a) == 0.0)


def test_reinforce_pp_baseline_hand_values_and_mask():
  # Groups [1, 0] and [4, 4, 2, 2] (interleaved).
  r = jnp.array([1.0, 4.0, 0.0, 4.0, 2.0, 2.0])
  g = jnp.array([0, 1, 0, 1, 1, 1])
  # Centred: [0.5, 1, -0.5, 1, -1, -1]; batch mean 0, batch variance
  # (0.25 + 1 + 0.25 + 1 + 1 + 1) / 6 = 0.75.
  s = math.sqrt(0.75)
  a = advantages.reinforce_pp_baseline_advantages(r, g, eps=0.0)
  np.testing.assert_allclose(
      a, [0.5 / s, 1 / s, -0.5 / s, 1 / s, -1 / s, -1 / s], rtol=1e-6
  )
  # Masking rows 4 and 5: group 1 = [4, 4] is constant -> centred 0;
  # centred [0.5, 0, -0.5, 0], batch mean 0, var 0.125.
  v = jnp.array([True, True, True, True, False, False])
  a = advantages.reinforce_pp_baseline_advantages(r, g, v, eps=0.0)
  s = math.sqrt(0.125)
  np.testing.assert_allclose(a, [0.5 / s, 0, -0.5 / s, 0, 0, 0], rtol=1e-6)
  # Every group constant (different constants) -> exactly 0.
  a = advantages.reinforce_pp_baseline_advantages(
      jnp.array([1.0, 3.0, 1.0, 3.0]), jnp.array([0, 1, 0, 1]), eps=1e-30
  )
  assert np.all(np.asarray(a) == 0.0)


# ---------------------------------------------------------------------------
# GAE.
# ---------------------------------------------------------------------------


def _numpy_gae(r, v, bootstrap, d, lam):
  t_len = len(r)
  adv = np.zeros(t_len)
  next_adv, next_v = 0.0, bootstrap
  for t in reversed(range(t_len)):
    delta = r[t] + d[t] * next_v - v[t]
    next_adv = delta + d[t] * lam * next_adv
    adv[t] = next_adv
    next_v = v[t]
  return adv


def test_gae_three_step_hand_example():
  r = jnp.array([1.0, 0.0, 2.0])
  v = jnp.array([0.5, 1.0, 1.5])
  d = jnp.array([0.9, 0.9, 0.9])
  # delta_2 = 2 + 0.9 * 3 - 1.5 = 3.2
  # delta_1 = 0 + 0.9 * 1.5 - 1 = 0.35
  # delta_0 = 1 + 0.9 * 1 - 0.5 = 1.4
  # A_2 = 3.2; A_1 = 0.35 + 0.45 * 3.2 = 1.79; A_0 = 1.4 + 0.45 * 1.79 = 2.2055
  adv, ret = advantages.gae_advantages(r, v, jnp.float32(3.0), d, 0.5)
  np.testing.assert_allclose(adv, [2.2055, 1.79, 3.2], rtol=1e-5)
  np.testing.assert_allclose(ret, [2.7055, 2.79, 4.7], rtol=1e-5)


def test_gae_terminal_mid_sequence_stops_bootstrapping():
  r = jnp.array([1.0, 2.0, 3.0, 4.0])
  v = jnp.array([10.0, 20.0, 30.0, 40.0])
  d = jnp.array([1.0, 0.0, 1.0, 1.0])
  adv, _ = advantages.gae_advantages(r, v, jnp.float32(100.0), d, 1.0)
  # Step 1 terminal: A_1 = 2 - 20 = -18 with nothing from t >= 2;
  # A_0 = (1 + 20 - 10) + A_1 = -7.
  # A_3 = 4 + 100 - 40 = 64; A_2 = (3 + 40 - 30) + 64 = 77.
  np.testing.assert_allclose(adv, [-7.0, -18.0, 77.0, 64.0], rtol=1e-6)


def test_gae_matches_numpy_loop_and_vmaps():
  rng = np.random.default_rng(0)
  b, t_len = 3, 7
  r = rng.normal(size=(b, t_len)).astype(np.float32)
  v = rng.normal(size=(b, t_len)).astype(np.float32)
  boot = rng.normal(size=(b,)).astype(np.float32)
  d = np.where(rng.random((b, t_len)) < 0.2, 0.0, 0.97).astype(np.float32)
  lam = 0.95
  adv, ret = jax.jit(
      jax.vmap(advantages.gae_advantages, in_axes=(0, 0, 0, 0, None))
  )(r, v, boot, d, lam)
  assert adv.shape == ret.shape == (b, t_len)
  for i in range(b):
    expected = _numpy_gae(r[i], v[i], boot[i], d[i], lam)
    np.testing.assert_allclose(adv[i], expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret[i], expected + v[i], rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------
# Per-turn credit.
# ---------------------------------------------------------------------------


def test_turn_reward_to_go_hand_example():
  r = jnp.array([[1.0, 0.0, 2.0, 5.0], [0.0, 1.0, 0.0, 0.0]])
  m = jnp.array([[True, True, True, False], [True, True, True, True]])
  g = advantages.turn_reward_to_go(r, m, 0.9)
  # Row 0 (turn 3 masked, its reward 5 ignored):
  # G_2 = 2; G_1 = 0 + 0.9 * 2 = 1.8; G_0 = 1 + 0.9 * 1.8 = 2.62; G_3 = 0.
  # Row 1: G_3 = 0, G_2 = 0, G_1 = 1, G_0 = 0.9.
  np.testing.assert_allclose(
      g, [[2.62, 1.8, 2.0, 0.0], [0.9, 1.0, 0.0, 0.0]], rtol=1e-6
  )


def test_per_turn_grpo_hand_example():
  # Group 0 = rows 0, 2 ; group 1 = rows 1, 3 (interleaved).
  ret = jnp.array(
      [[3.0, 1.0, 9.0], [2.0, 2.0, 0.0], [1.0, 5.0, 0.0], [2.0, 4.0, 7.0]]
  )
  m = jnp.array([[1, 1, 1], [1, 1, 0], [1, 1, 0], [1, 1, 1]], bool)
  g = jnp.array([0, 1, 0, 1])
  a = advantages.per_turn_grpo_advantages(ret, m, g, eps=0.0)
  # Turn 0: group 0 [3, 1] -> mean 2, std 1 -> [1, -1]; group 1 [2, 2] -> 0.
  # Turn 1: group 0 [1, 5] -> mean 3, std 2 -> [-1, 1];
  #         group 1 [2, 4] -> mean 3, std 1 -> [-1, 1].
  # Turn 2: only row 0 valid in group 0, only row 3 in group 1 -> 0.
  np.testing.assert_allclose(
      a,
      [[1.0, -1.0, 0.0], [0.0, -1.0, 0.0], [-1.0, 1.0, 0.0], [0.0, 1.0, 0.0]],
      rtol=1e-6,
  )
  a = advantages.per_turn_grpo_advantages(ret, m, g, scale_by_std=False)
  np.testing.assert_allclose(a[:, 1], [-2.0, -1.0, 2.0, 1.0], rtol=1e-6)
  assert np.all(
      np.isfinite(
          np.asarray(jax.jit(advantages.per_turn_grpo_advantages)(ret, m, g))
      )
  )


def test_broadcast_turn_to_tokens_token_by_token():
  adv = jnp.array([[1.0, 2.0], [3.0, 4.0]])
  P, O, T, D = types.PROMPT, types.POLICY, types.TOOL, types.PAD
  role = jnp.array([[P, O, O, T, O, D], [P, O, T, O, O, O]], jnp.int8)
  turn = jnp.array([[-1, 0, 0, 0, 1, -1], [-1, 0, 0, 1, 2, -1]], jnp.int32)
  tok = advantages.broadcast_turn_to_tokens(adv, turn, role)
  assert tok.dtype == jnp.float32
  # Row 1: token 4 has turn 2 >= K -> 0; token 5 has turn -1 -> 0.
  np.testing.assert_array_equal(tok, [[0, 1, 1, 0, 2, 0], [0, 3, 0, 4, 0, 0]])


# ---------------------------------------------------------------------------
# The episode-level entries of the estimator table (estimators.ESTIMATORS).
# ---------------------------------------------------------------------------


def _group_relative():
  """{name: entry} of the table's entries on (reward_b[, group_b]) alone."""
  return {
      name: e
      for name, e in estimators.ESTIMATORS.items()
      if e.level == "episode" and set(e.inputs) <= {"reward_b", "group_b"}
  }


def _call(entry, r, g, **settings):
  """entry.fn on its declared arrays and the settings it declares."""
  arrays = {"reward_b": r, "group_b": g}
  return entry.fn(
      *[arrays[k] for k in entry.inputs],
      **{k: v for k, v in settings.items() if k in entry.settings},
  )


def test_table_names_of_the_group_relative_estimators():
  assert set(_group_relative()) == {
      "grpo",
      "drgrpo",
      "rloo",
      "reinforce_pp",
      "reinforce_pp_baseline",
  }


def test_table_hand_values_and_jit_equals_eager():
  r = jnp.array([1.0, 0.0, 0.0, 0.0])
  g = jnp.zeros(4, jnp.int32)
  s = math.sqrt(0.1875)
  expected = {
      "grpo": [0.75 / s, -0.25 / s, -0.25 / s, -0.25 / s],
      "drgrpo": [0.75, -0.25, -0.25, -0.25],
      "rloo": [1.0, -1 / 3, -1 / 3, -1 / 3],
      "reinforce_pp": [0.75 / s, -0.25 / s, -0.25 / s, -0.25 / s],
      "reinforce_pp_baseline": [0.75 / s, -0.25 / s, -0.25 / s, -0.25 / s],
  }
  assert set(expected) == set(_group_relative())
  r2 = jnp.array([0.2, 1.0, 0.7, 0.7, -3.0, 0.5])
  g2 = jnp.array([1, 0, 1, 0, 2, 2])
  for name, entry in _group_relative().items():
    want = expected[name]
    scale = name == "grpo"
    fn = functools.partial(_call, entry, scale_by_std=scale, eps=0.0)
    np.testing.assert_allclose(fn(r, g), want, rtol=1e-6)
    np.testing.assert_allclose(jax.jit(fn)(r, g), want, rtol=1e-6)
    fn2 = functools.partial(
        _call, entry, scale_by_std=True, eps=1e-6, std_ddof=1
    )
    np.testing.assert_allclose(
        jax.jit(fn2)(r2, g2), fn2(r2, g2), rtol=1e-5, atol=1e-6
    )


# ---------------------------------------------------------------------------
# GAE over POLICY tokens (observation tokens add no discount step).
# ---------------------------------------------------------------------------


def test_token_gae_hand_values_with_observation_tokens():
  P, Q, T, D = types.PROMPT, types.POLICY, types.TOOL, types.PAD
  role = jnp.array([P, Q, Q, T, T, Q, D], jnp.int8)
  mask = role == types.POLICY
  # Junk (9) at non-POLICY positions must be ignored.
  values = jnp.array([9.0, 0.5, 0.2, 9.0, 9.0, 0.8, 9.0])
  rewards = jnp.array([9.0, 0.0, 0.0, 9.0, 9.0, 1.0, 9.0])
  # POLICY steps n = 1, 2, 3 at positions 1, 2, 5; V = .5, .2, .8; V_4 = 0.
  # gamma .9, lambda .5 (gamma * lambda = .45); the TOOL tokens between
  # positions 2 and 5 add no discount step.
  # delta_3 = 1 - .8 = .2                 A_3 = .2
  # delta_2 = .9 * .8 - .2 = .52          A_2 = .52 + .45 * .2 = .61
  # delta_1 = .9 * .2 - .5 = -.32         A_1 = -.32 + .45 * .61 = -.0455
  # returns G = A + V: 1.0, .81, .4545.
  adv, ret = advantages.token_gae(rewards, values, mask, 0.9, 0.5)
  np.testing.assert_allclose(adv, [0, -0.0455, 0.61, 0, 0, 0.2, 0], atol=1e-6)
  np.testing.assert_allclose(ret, [0, 0.4545, 0.81, 0, 0, 1.0, 0], atol=1e-6)
  # Equals plain GAE on the POLICY subsequence with a terminal last step.
  a_ref, r_ref = advantages.gae_advantages(
      rewards[mask],
      values[mask],
      jnp.float32(0.0),
      jnp.array([0.9, 0.9, 0.0]),
      0.5,
  )
  np.testing.assert_allclose(adv[mask], a_ref, rtol=1e-6)
  np.testing.assert_allclose(ret[mask], r_ref, rtol=1e-6)
  # lambda = gamma = 1: A_n = R - V_n (Monte-Carlo), returns = R everywhere.
  adv1, ret1 = jax.jit(advantages.token_gae)(rewards, values, mask, 1.0, 1.0)
  np.testing.assert_allclose(adv1[mask], [0.5, 0.8, 0.2], rtol=1e-6)
  np.testing.assert_allclose(ret1[mask], [1.0, 1.0, 1.0], rtol=1e-6)


def test_token_gae_vmaps_over_a_batch():
  rng = np.random.default_rng(1)
  mask = jnp.asarray(rng.random((3, 9)) < 0.6)
  r = jnp.asarray(rng.normal(size=(3, 9)), jnp.float32)
  v = jnp.asarray(rng.normal(size=(3, 9)), jnp.float32)
  adv, ret = jax.vmap(advantages.token_gae, in_axes=(0, 0, 0, None, None))(
      r, v, mask, 0.95, 0.9
  )
  for i in range(3):
    a_i, r_i = advantages.token_gae(r[i], v[i], mask[i], 0.95, 0.9)
    np.testing.assert_allclose(adv[i], a_i, rtol=1e-6)
    np.testing.assert_allclose(ret[i], r_i, rtol=1e-6)
  assert np.all(np.asarray(adv)[~np.asarray(mask)] == 0.0)
