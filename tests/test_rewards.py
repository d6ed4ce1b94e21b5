"""Reward components, transforms, noise, composition and schedules against
hand-computed values (agentic_rl/rewards/)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentic_rl.rewards import components
from agentic_rl.rewards import composition
from agentic_rl.rewards import dual_ascent
from agentic_rl.rewards import factory
from agentic_rl.rewards import noise
from agentic_rl.rewards import schedules
from agentic_rl.rewards import transforms
from agentic_rl import types
from tests import fakes

A = types.ANSWERED


def make_traj(correct, calls, group, errors=None, finish=None, k=2):
  """A tiny Trajectory whose facts are written by hand (L = 4 tokens)."""
  b = len(correct)
  errors = [0] * b if errors is None else errors
  finish = [A] * b if finish is None else finish
  facts = {
      "correct": jnp.asarray(correct, bool),
      "answered": jnp.asarray([f == A for f in finish], bool),
      "format_error": jnp.zeros((b,), bool),
      "num_tool_calls": jnp.asarray(calls, jnp.int32),
      "num_tool_errors": jnp.asarray(errors, jnp.int32),
      "hard": jnp.zeros((b,), bool),
      "tool_call_turn": jnp.zeros((b, k), bool),
  }
  return fakes.trajectory(
      facts, width=4, turn=-1, length=0, finish=finish, group=group
  )


def close(x, expected, rtol=1e-6, atol=1e-7):
  np.testing.assert_allclose(np.asarray(x), expected, rtol=rtol, atol=atol)


# ---------------------------------------------------------------------------
# Components.
# ---------------------------------------------------------------------------


def test_otc_paper_form_n_star_0_and_2_interleaved_groups():
  # Group 0 (n* = 0): correct rows with m = 0, 1, 2, 3 and an incorrect m = 0.
  # Group 1 (n* = 2): correct m = 2, 3, 4, 6 and an incorrect m = 1.
  # Group 2: no correct episode -> all 0. Rows interleaved on purpose.
  rows = [  # (group, correct, calls, expected)
      (0, 1, 0, 1.0),
      (1, 1, 2, 1.0),
      (0, 1, 1, math.cos(math.pi / 3)),  # 0.5
      (1, 1, 3, math.sin(0.6 * math.pi)),  # g = 12/5 -> sin(2.4 pi / 4)
      (0, 1, 2, math.cos(2 * math.pi / 5)),  # 0.30901699
      (1, 1, 4, math.sin(2 * math.pi / 3)),  # g = 8/3 -> 0.8660254
      (0, 1, 3, math.cos(3 * math.pi / 7)),  # 0.22252093
      (1, 1, 6, math.sin(3 * math.pi / 4)),  # g = 3 -> 0.70710678
      (0, 0, 0, 0.0),
      (1, 0, 1, 0.0),
      (2, 0, 0, 0.0),
      (2, 0, 3, 0.0),
  ]
  g, c, m, want = zip(*rows)
  traj = make_traj(c, m, g)
  r = components.otc_reward(traj)
  assert r.dtype == jnp.float32 and r.shape == (12,)
  close(r, want)
  close(
      want[:8],
      [
          1.0,
          1.0,
          0.5,
          0.95105652,
          0.30901699,
          0.8660254,
          0.22252093,
          0.70710678,
      ],
      rtol=1e-7,
  )
  # Row order does not matter: reverse the batch, same per-row values.
  rev = jax.tree.map(lambda x: x[::-1], traj)
  close(components.otc_reward(rev), want[::-1])


def test_otc_tool_score_shape_and_inverse_form():
  n2 = jnp.full((7,), 2)
  s = components.otc_tool_score(jnp.arange(7), n2)
  # m = 0..6 with n* = 2: sin(pi g / 4), g = 4m / (m + 2).
  close(
      s,
      [
          0.0,
          math.sin(math.pi / 3),
          1.0,
          math.sin(0.6 * math.pi),
          math.sin(2 * math.pi / 3),
          math.sin(20 / 7 * math.pi / 4),
          math.sin(3 * math.pi / 4),
      ],
      rtol=1e-6,
  )
  assert np.all(np.diff(np.asarray(s)[2:]) < 0)  # decreasing above n*
  assert np.all(np.diff(np.asarray(s)[:3]) > 0)  # increasing below n*
  inv = components.otc_tool_score(
      jnp.array([2, 3, 5, 0, 1]),
      jnp.array([2, 2, 2, 0, 0]),
      form="inverse",
      alpha=1.0,
  )
  close(inv, [1.0, 0.5, 0.25, 1.0, 0.5])
  with pytest.raises(ValueError, match="form"):
    components.otc_tool_score(n2, n2, form="bogus")


def test_tool_cost_and_failed_call_penalty():
  traj = make_traj([1, 0, 1], [0, 1, 3], [0, 0, 1], errors=[0, 2, 1])
  close(components.tool_cost_reward(traj), [0.0, -0.1, -0.3])
  close(components.tool_cost_reward(traj, c=0.5), [0.0, -0.5, -1.5])
  close(components.failed_call_penalty_reward(traj), [0.0, -0.2, -0.1])
  close(components.failed_call_penalty_reward(traj, c=1.0), [0.0, -2.0, -1.0])
  close(components.tool_bonus_reward(traj, b=0.3), [0.0, 0.3, 0.3])
  close(components.tool_bonus_reward(traj), [0.0, 1.0, 1.0])


def test_gated_relative_efficiency_some_correct():
  rows = [  # (group, correct, calls, expected with lam = 1)
      (0, 1, 1, 1.0),  # correct counts {1, 3, 2}: (3 - m) / 2
      (1, 1, 2, 0.0),  # group 1: correct counts all 2 -> 0
      (0, 0, 0, 0.0),  # incorrect (fewest calls, but gated out)
      (0, 1, 3, 0.0),
      (1, 1, 2, 0.0),
      (0, 1, 2, 0.5),
      (1, 0, 0, 0.0),
      (2, 1, 4, 0.0),  # single correct episode -> 0
      (2, 0, 1, 0.0),
      (3, 0, 1, 0.0),  # no correct episode
  ]
  g, c, m, want = zip(*rows)
  traj = make_traj(c, m, g)
  close(components.gated_relative_efficiency_reward(traj), want)
  close(
      components.gated_relative_efficiency_reward(traj, lam=0.5),
      0.5 * np.asarray(want),
  )


# ---------------------------------------------------------------------------
# Transforms.
# ---------------------------------------------------------------------------


def test_clip_transform():
  close(
      transforms.clip_transform(jnp.array([[0.2, 0.7, 0.5]]), 0.5),
      [[-0.3, 0.0, 0.0]],
  )


def test_delta_transform_telescopes():
  r = jnp.array(
      [[1.0, 2.0, 4.0, 9.0], [3.0, 5.0, 0.0, 0.0], [1.0, 7.0, 2.0, 3.0]]
  )
  m = jnp.array([[1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 1, 1]], bool)
  d = transforms.delta_transform(r, m)
  # Row 2 has a hole: turn 1 is skipped, turn 0 pairs with turn 2.
  close(
      d, [[-1.0, -2.0, 4.0, 0.0], [-2.0, 5.0, 0.0, 0.0], [-1.0, 0.0, -1.0, 3.0]]
  )
  close(jnp.sum(d, axis=1), [1.0, 3.0, 1.0])  # = r at the first valid turn
  close(transforms.delta_transform(r[0], m[0]), [-1.0, -2.0, 4.0, 0.0])


def test_min_form_values():
  r = jnp.array([[0.5, 0.2, 0.9, 0.1], [0.3, 0.8, 0.6, 0.7]])
  m = jnp.array([[1, 1, 1, 0], [1, 1, 1, 1]], bool)
  close(
      transforms.min_form_values(r, m),
      [[0.2, 0.2, 0.9, 0.0], [0.3, 0.6, 0.6, 0.7]],
  )


def test_saturating_transform():
  close(
      transforms.saturating_transform(jnp.array([0.0, 1.0, -1.0])),
      [0.5, 0.7310586, 0.2689414],
  )
  close(
      transforms.saturating_transform(jnp.array([2.0]), 1.0, 2.0), [0.62245933]
  )


def test_gated_accumulation_above_and_below_threshold():
  out = transforms.gated_accumulation(
      jnp.array([1.0, 0.0, 0.5]),
      jnp.array([[0.1, 0.2, 0.3], [0.1, 0.1, 0.1], [1.0, 1.0, 1.0]]),
      jnp.array([[1, 1, 0], [1, 1, 1], [1, 0, 0]], bool),
      0.5,
  )
  # Row 0: 1 + 0.1 + 0.2; row 1 below threshold; row 2 at threshold (>=).
  close(out, [1.3, 0.0, 1.5])


# ---------------------------------------------------------------------------
# Noise.
# ---------------------------------------------------------------------------


def test_flip_rewards():
  key = jax.random.PRNGKey(0)
  r = jnp.array([0.0, 1.0, 1.0, 0.0])
  np.testing.assert_array_equal(noise.flip_rewards(key, r, 0.0), r)
  np.testing.assert_array_equal(noise.flip_rewards(key, r, 1.0), 1.0 - r)
  pm = jnp.array([-1.0, 1.0])
  np.testing.assert_array_equal(
      noise.flip_rewards(key, pm, 1.0, low=-1.0, high=1.0), [1.0, -1.0]
  )
  big = jnp.zeros((8000,))
  frac = float(jnp.mean(noise.flip_rewards(key, big, 0.5)))
  assert 0.47 < frac < 0.53


def test_dither_rewards():
  key = jax.random.PRNGKey(1)
  r = jnp.full((20000,), 2.0)
  np.testing.assert_array_equal(noise.dither_rewards(key, r, 0.0), r)
  x = np.asarray(noise.dither_rewards(key, r, 0.5))
  assert abs(x.mean() - 2.0) < 0.02
  assert abs(x.std() - 0.5) < 0.02


# ---------------------------------------------------------------------------
# Composition.
# ---------------------------------------------------------------------------


def test_compose_sum_and_product():
  parts = {
      "a": jnp.array([1.0, 0.0, 1.0, 1.0]),
      "b": jnp.array([0.5, 0.5, 0.0, 1.0]),
  }
  close(
      composition.compose(parts, {"a": 1.0, "b": -2.0}, "sum"),
      [0.0, -1.0, 1.0, -1.0],
  )
  close(
      composition.compose(parts, {"a": 1.0, "b": 1.0}, "product"),
      [0.5, 0.0, 0.0, 1.0],
  )
  close(
      composition.compose(parts, {"a": 3.0, "b": 0.0}, "product"),
      [1.0, 0.0, 1.0, 1.0],
  )  # weight 0 drops b; other weights ignored
  # A traced weight of 0 also drops the component.
  f = jax.jit(
      lambda w: composition.compose(parts, {"a": 1.0, "b": w}, "product")
  )
  close(f(0.0), [1.0, 0.0, 1.0, 1.0])
  close(f(1.0), [0.5, 0.0, 0.0, 1.0])
  with pytest.raises(ValueError, match="composition"):
    composition.compose(parts, {"a": 1.0}, "max")
  with pytest.raises(ValueError, match="group_b"):
    composition.compose(parts, {"a": 1.0}, "gdpo")


def test_compose_gdpo_hand_table_and_constant_component():
  g = jnp.array([0, 1, 0, 1], jnp.int32)  # interleaved groups
  # a: group 0 = (1, 0) -> z = (1, -1); group 1 = (1, 1) -> exactly 0.
  # b: group 0 = (2, 0) -> (1, -1); group 1 = (1, 3) -> (-1, 1).
  # c: constant everywhere -> contributes exactly 0.
  parts = {
      "a": jnp.array([1.0, 1.0, 0.0, 1.0]),
      "b": jnp.array([2.0, 1.0, 0.0, 3.0]),
      "c": jnp.array([3.0, 3.0, 3.0, 3.0]),
  }
  out = composition.compose(parts, {"a": 1.0, "b": 0.5, "c": 7.0}, "gdpo", g)
  close(out, [1.5, -0.5, -1.5, 0.5], rtol=1e-5)
  only_c = composition.compose(parts, {"c": 7.0}, "gdpo", g)
  np.testing.assert_array_equal(only_c, np.zeros(4, np.float32))
  only_a = composition.compose(parts, {"a": 1.0}, "gdpo", g)
  assert float(only_a[1]) == 0.0 and float(only_a[3]) == 0.0


# ---------------------------------------------------------------------------
# Schedules and dual ascent.
# ---------------------------------------------------------------------------


def test_schedules():
  lin = {"kind": "linear", "start": 1.0, "end": 0.0, "steps": 10}
  cos = {"kind": "cosine", "start": 1.0, "end": 0.0, "steps": 10}
  const = {"kind": "constant", "value": 0.3}
  steps = jnp.array([0, 2, 5, 10, 20])
  close(
      jax.vmap(lambda s: schedules.schedule_value(lin, s))(steps),
      [1.0, 0.8, 0.5, 0.0, 0.0],
  )
  close(
      jax.vmap(lambda s: schedules.schedule_value(cos, s))(steps),
      [1.0, 0.5 * (1 + math.cos(0.2 * math.pi)), 0.5, 0.0, 0.0],
      atol=1e-6,
  )
  close(schedules.schedule_value(const, 123), 0.3)
  up = {"kind": "linear", "start": 0.0, "end": 2.0, "steps": 4}
  close(jax.jit(lambda s: schedules.schedule_value(up, s))(jnp.int32(1)), 0.5)
  with pytest.raises(ValueError, match="kind"):
    schedules.schedule_value({"kind": "exp", "start": 1.0}, 0)
  with pytest.raises(ValueError, match="keys"):
    schedules.schedule_value({"kind": "linear", "start": 1.0, "end": 0.0}, 0)


def test_dual_ascent_update():
  # Constraint violated (3 > 2): lam grows; slack (1 < 2): lam shrinks.
  close(dual_ascent.dual_ascent_update(1.0, 3.0, 2.0, 0.5), 1.5)
  close(dual_ascent.dual_ascent_update(1.0, 1.0, 2.0, 0.5), 0.5)
  # Projection onto [lam_min, inf).
  close(dual_ascent.dual_ascent_update(0.2, 0.0, 2.0, 0.5), 0.0)
  close(dual_ascent.dual_ascent_update(0.2, 0.0, 2.0, 0.5, lam_min=0.1), 0.1)


# ---------------------------------------------------------------------------
# make_reward_fn.
# ---------------------------------------------------------------------------


def test_make_reward_fn_backward_compatible():
  traj = make_traj(
      [1, 0, 1, 1],
      [0, 1, 2, 0],
      [0, 0, 1, 1],
      errors=[0, 0, 0, 1],
      finish=[A, A, types.MAX_TURNS, A],
  )
  fn = factory.make_reward_fn({"correct": 1.0, "format": 0.1})
  total, parts = fn(traj)
  close(parts["correct"], [1.0, 0.0, 1.0, 1.0])
  close(parts["format"], [1.0, 1.0, 0.0, 0.0])
  close(total, [1.1, 0.1, 1.0, 1.0])
  # Bitwise the previous implementation: 0 + 1.0 * correct + 0.1 * format.
  old = 0 + 1.0 * parts["correct"] + 0.1 * parts["format"]
  np.testing.assert_array_equal(total, old)
  assert total.dtype == jnp.float32 and set(parts) == {"correct", "format"}


def test_make_reward_fn_errors():
  mk = factory.make_reward_fn
  with pytest.raises(ValueError, match="'nope'"):
    mk({"nope": 1.0})
  with pytest.raises(ValueError, match="at least one"):
    mk({})
  with pytest.raises(ValueError, match="'beta'.*'otc'"):
    mk({"otc": 1.0}, params={"otc": {"beta": 1.0}})
  with pytest.raises(ValueError, match="'bogus'"):
    mk({"otc": 1.0}, params={"otc": {"form": "bogus"}})
  with pytest.raises(ValueError, match="not in rl.rewards"):
    mk({"correct": 1.0}, params={"tool_cost": {"c": 1.0}})
  with pytest.raises(ValueError, match="'max'"):
    mk({"correct": 1.0}, composition="max")
  with pytest.raises(ValueError, match="tool_bonus.*'exp'"):
    mk({"tool_bonus": 1.0}, schedules={"tool_bonus": {"kind": "exp"}})
  with pytest.raises(ValueError, match="not in rl.rewards"):
    mk(
        {"correct": 1.0},
        schedules={"tool_bonus": {"kind": "constant", "value": 1.0}},
    )
  with pytest.raises(ValueError, match="'flip'"):
    mk({"correct": 1.0}, noise={"flip": 0.1})
  with pytest.raises(ValueError, match="flip_p"):
    mk({"correct": 1.0}, noise={"flip_p": 1.5})
  fn = mk({"correct": 1.0}, noise={"flip_p": 0.1})
  with pytest.raises(ValueError, match="key"):
    fn(make_traj([1], [0], [0]))


def test_make_reward_fn_scheduled_jit_and_noise():
  # Group 0: correct m = 1, 2 (n* = 1), incorrect m = 0. Group 1: none correct.
  traj = make_traj([1, 1, 0, 0], [1, 2, 0, 3], [0, 0, 0, 1])
  otc = [1.0, math.sin(4 / 3 * math.pi / 2), 0.0, 0.0]  # g(2, 1) = 4/3
  bonus = [0.5, 0.5, 0.0, 0.5]
  fn = factory.make_reward_fn(
      {"correct": 1.0, "otc": 0.5, "tool_bonus": 123.0},
      params={"tool_bonus": {"b": 0.5}},
      schedules={
          "tool_bonus": {
              "kind": "linear",
              "start": 1.0,
              "end": 0.0,
              "steps": 10,
          }
      },
  )
  jitted = jax.jit(fn)
  for step in (0, 4, 12):
    w = max(0.0, 1.0 - step / 10)
    want = (
        np.array([1.0, 1.0, 0.0, 0.0])
        + 0.5 * np.array(otc)
        + w * np.array(bonus)
    )
    total, parts = fn(traj, step)
    close(total, want, rtol=1e-6)
    close(parts["tool_bonus"], bonus)  # unweighted
    close(parts["otc"], otc, rtol=1e-6)
    jt, _ = jitted(traj, jnp.int32(step))
    close(jt, total, rtol=1e-6)
  # Traced step: one compilation for all steps.
  assert jitted._cache_size() == 1

  # Noise: flip_p = 1 with a binary 'correct' reward flips every row.
  noisy = factory.make_reward_fn({"correct": 1.0}, noise={"flip_p": 1.0})
  out, _ = jax.jit(noisy)(traj, 0, jax.random.PRNGKey(0))
  np.testing.assert_array_equal(out, [0.0, 0.0, 1.0, 1.0])
  # GDPO through the factory: correct in group 0 = (1, 1, 0) -> z-scores.
  gd = factory.make_reward_fn({"correct": 1.0}, composition="gdpo")
  z, _ = gd(traj)
  s = math.sqrt(2.0 / 9.0)
  close(z, [1 / 3 / s, 1 / 3 / s, -2 / 3 / s, 0.0], rtol=1e-5)


# ---------------------------------------------------------------------------
# Dual-path groups: tool necessity and the derived efficiency reward.
# ---------------------------------------------------------------------------

# (group, tool_free, correct, calls, expected reward with c=0.1, b=0.5).
# g0 easy: acc_t 1, acc_n 0.5, nec 0.5, n* 1:
#   m=1: -0.1*0.5*1 + 0.5*0.5*f(1,1) = 0.2
#   m=2: -0.1*0.5*2 + 0.5*0.5*sin(2pi/3) (g = 4/3) = 0.1165064
# g1 hard: acc_t 1, acc_n 0, nec 1, n* 2:
#   m=2: 0.5*1*f(2,2) = 0.5;  m=3: 0.5*sin(0.6 pi) (g = 12/5) = 0.4755283
# g2 neither: all 0.   g3 tools hurt: acc_t 0.5, acc_n 1, nec -0.5 (no bonus):
#   m=2 wrong: -0.1*1*2 = -0.2;  m=1 correct: -0.1
# g4 has no tool-free arm: 0.
_DUAL_ROWS = [
    (0, False, True, 1, 0.2),
    (0, False, True, 2, -0.1 + 0.25 * math.sin(2 * math.pi / 3)),
    (0, True, True, 0, 0.0),
    (0, True, False, 0, 0.0),
    (1, False, True, 2, 0.5),
    (1, False, True, 3, 0.5 * math.sin(0.6 * math.pi)),
    (1, True, False, 0, 0.0),
    (1, True, False, 0, 0.0),
    (2, False, False, 1, 0.0),
    (2, False, False, 0, 0.0),
    (2, True, False, 0, 0.0),
    (2, True, False, 0, 0.0),
    (3, False, False, 2, -0.2),
    (3, False, True, 1, -0.1),
    (3, True, True, 0, 0.0),
    (3, True, True, 0, 0.0),
    (4, False, True, 1, 0.0),
    (4, False, True, 3, 0.0),
]


def _dual_traj(perm):
  rows = [_DUAL_ROWS[i] for i in perm]
  traj = make_traj(
      [r[2] for r in rows], [r[3] for r in rows], [r[0] for r in rows]
  )
  traj = traj.replace(
      facts={**traj.facts, "tool_free": jnp.asarray([r[1] for r in rows])}
  )
  return traj, np.array([r[4] for r in rows])


def test_tool_necessity_stats_hand_values():
  traj, _ = _dual_traj(range(len(_DUAL_ROWS)))
  st = components.tool_necessity_stats(
      traj.facts["correct"],
      traj.facts["num_tool_calls"],
      traj.facts["tool_free"],
      traj.group,
  )
  per_group = {
      0: (1.0, 0.5, 0.5, 1, True),
      1: (1.0, 0.0, 1.0, 2, True),
      2: (0.0, 0.0, 0.0, 0, True),
      3: (0.5, 1.0, -0.5, 1, True),
      4: (1.0, 0.0, 0.0, 1, False),
  }
  want = np.array([per_group[r[0]] for r in _DUAL_ROWS], object)
  close(st["acc_tool"], want[:, 0].astype(float))
  close(st["acc_no_tool"], want[:, 1].astype(float))
  close(st["necessity"], want[:, 2].astype(float))
  np.testing.assert_array_equal(st["n_star"], want[:, 3].astype(int))
  np.testing.assert_array_equal(st["both_arms"], want[:, 4].astype(bool))


def test_dual_path_efficiency_reward_hand_values_any_row_order():
  fn = jax.jit(components.dual_path_efficiency_reward)
  for perm in (
      range(len(_DUAL_ROWS)),
      np.random.default_rng(0).permutation(len(_DUAL_ROWS)),
  ):
    traj, want = _dual_traj(list(perm))
    close(fn(traj), want, rtol=1e-6, atol=1e-7)
  # Other weights: c = 1, b = 0 leaves only the acc_n-weighted call cost.
  traj, _ = _dual_traj(range(len(_DUAL_ROWS)))
  got = components.dual_path_efficiency_reward(traj, c=1.0, b=0.0)
  cost = {0: -0.5, 3: -1.0}
  want = [
      0.0 if r[1] or r[0] not in cost else cost[r[0]] * r[3] for r in _DUAL_ROWS
  ]
  close(got, want)
  # Without the fact (no tool-free episode anywhere) the component is 0.
  plain = make_traj([True, False], [1, 2], [0, 0])
  close(components.dual_path_efficiency_reward(plain), [0.0, 0.0])


def test_dual_path_efficiency_through_make_reward_fn():
  traj, want = _dual_traj(range(len(_DUAL_ROWS)))
  fn = factory.make_reward_fn(
      {"correct": 1.0, "dual_path_efficiency": 2.0},
      params={"dual_path_efficiency": {"c": 0.1, "b": 0.5}},
  )
  total, parts = jax.jit(fn)(traj)
  close(parts["dual_path_efficiency"], want)
  close(
      total,
      np.array([r[2] for r in _DUAL_ROWS], float) + 2.0 * want,
      rtol=1e-6,
      atol=1e-6,
  )
  with pytest.raises(ValueError, match="unknown param 'lam'"):
    factory.make_reward_fn(
        {"dual_path_efficiency": 1.0},
        params={"dual_path_efficiency": {"lam": 1.0}},
    )


def test_components_and_compositions_under_jit_and_vmap():
  # vmap over a leading axis of 2 independent batches equals each batch alone
  # (group ids are per batch), for OTC, gated relative efficiency, dual-path
  # efficiency, gated accumulation, product and GDPO composition.
  traj_a, _ = _dual_traj(range(len(_DUAL_ROWS)))
  traj_b, _ = _dual_traj(
      list(np.random.default_rng(1).permutation(len(_DUAL_ROWS)))
  )
  stacked = jax.tree.map(lambda x, y: jnp.stack([x, y]), traj_a, traj_b)

  def all_parts(traj):
    parts = {
        "otc": components.otc_reward(traj),
        "gre": components.gated_relative_efficiency_reward(traj),
        "dual": components.dual_path_efficiency_reward(traj),
        "correct": components.correct_reward(traj),
    }
    parts["product"] = composition.compose(
        {"a": parts["correct"], "b": parts["otc"]},
        {"a": 1.0, "b": 1.0},
        "product",
    )
    parts["gdpo"] = composition.compose(
        parts, {"otc": 1.0, "gre": 0.5}, "gdpo", group_b=traj.group
    )
    steps = jnp.ones((traj.group.shape[0], 2)) * 0.1
    parts["gra"] = transforms.gated_accumulation(
        parts["correct"], steps, jnp.ones_like(steps, bool), 1.0
    )
    return parts

  batched = jax.jit(jax.vmap(all_parts))(stacked)
  for i, traj in enumerate((traj_a, traj_b)):
    eager = all_parts(traj)
    for name, v in eager.items():
      close(batched[name][i], v, rtol=1e-6, atol=1e-6)
  # Hand check of the product and G-RA columns on batch a: correct * otc and
  # correct + 0.2 on correct rows.
  close(
      batched["gra"][0], [1.2 if r[2] else 0.0 for r in _DUAL_ROWS], rtol=1e-6
  )
  close(batched["product"][0], batched["otc"][0])


def test_call_score_reward_reads_the_fact():
  traj = make_traj([True, False, True], [1, 1, 2], [0, 0, 1])
  traj = traj.replace(
      facts={**traj.facts, "call_score": jnp.array([1.0, 0.25, 0.0])}
  )
  r = components.call_score_reward(traj)
  assert r.dtype == jnp.float32
  close(r, [1.0, 0.25, 0.0])
  total, _ = factory.make_reward_fn({"call_score": 2.0, "correct": 1.0})(traj)
  close(total, [3.0, 0.5, 1.0])
