"""Rewards never turn non-finite facts into NaN rewards (agentic_rl/rewards/).

Documented values, checked here by hand: a NaN / +-inf float fact reads as 0
(`sanitize_facts`: no credit for call_score, the neutral logit for rm_score);
`compose` counts a non-finite component value as 0 in 'sum' / 'product' and
leaves it out of its group's statistics (z = 0) in 'gdpo'; the learner's
metric counts the replaced entries (`nonfinite_fact_counts`).
"""

import math

import jax
import jax.numpy as jnp
import numpy as np

from agentic_rl.rewards import composition
from agentic_rl.rewards import factory
from agentic_rl.rewards import sanitize
from agentic_rl import types
from tests import fakes

NAN, INF = float("nan"), float("inf")


def _traj(group, **facts):
  """Episodes of 4 empty tokens in `group`; facts default to 0 (correct,
  num_tool_calls, num_tool_errors)."""
  b = len(group)
  base = {
      "correct": jnp.zeros((b,), bool),
      "num_tool_calls": jnp.zeros((b,), jnp.int32),
      "num_tool_errors": jnp.zeros((b,), jnp.int32),
  }
  return fakes.trajectory(
      {**base, **facts}, width=4, turn=-1, length=0, group=group
  )


def test_call_score_nan_and_inf_read_as_zero_sum_composition():
  traj = _traj(
      [0, 0, 1, 1],
      call_score=jnp.array([0.5, NAN, INF, 1.0], jnp.float32),
      correct=jnp.array([True, False, True, False]),
  )
  fn = factory.make_reward_fn({"call_score": 2.0, "correct": 1.0})
  for f in (fn, jax.jit(fn)):
    total, parts = f(traj)
    # 2 * [0.5, 0, 0, 1] + [1, 0, 1, 0]
    np.testing.assert_allclose(np.asarray(total), [2.0, 0.0, 1.0, 2.0])
    np.testing.assert_allclose(
        np.asarray(parts["call_score"]), [0.5, 0.0, 0.0, 1.0]
    )


def test_rm_score_nan_reads_as_the_neutral_logit():
  traj = _traj([0, 0, 0], rm_score=jnp.array([2.0, NAN, -INF], jnp.float32))
  total, _ = factory.make_reward_fn({"rm": 1.0})(traj)  # sigmoid((s - 0) / 1)
  np.testing.assert_allclose(
      np.asarray(total), [1 / (1 + math.exp(-2.0)), 0.5, 0.5], rtol=1e-6
  )


def test_gdpo_group_with_a_nan_row_keeps_its_other_rows_finite():
  part = jnp.array([1.0, 2.0, NAN, 0.0, 1.0, 2.0], jnp.float32)
  group = jnp.array([0, 0, 0, 1, 1, 1], jnp.int32)
  z = composition.compose(
      {"a": part}, {"a": 1.0}, "gdpo", group_b=group, eps=1e-6
  )
  # Group 0 without the NaN row: mean 1.5, population std 0.5 -> z = -+1/(0.5+eps);
  # the NaN row gets 0. Group 1: mean 1, std sqrt(2/3).
  s = math.sqrt(2.0 / 3.0)
  want = [
      -0.5 / (0.5 + 1e-6),
      0.5 / (0.5 + 1e-6),
      0.0,
      -1.0 / (s + 1e-6),
      0.0,
      1.0 / (s + 1e-6),
  ]
  np.testing.assert_allclose(np.asarray(z), want, rtol=1e-5)
  # Through make_reward_fn the NaN fact reads as 0 first: group 0 is [1, 2, 0],
  # mean 1, std sqrt(2/3).
  traj = _traj(group, call_score=part)
  total, _ = factory.make_reward_fn({"call_score": 1.0}, composition="gdpo")(
      traj
  )
  np.testing.assert_allclose(
      np.asarray(total),
      [0.0, 1 / (s + 1e-6), -1 / (s + 1e-6)] + want[3:],
      rtol=1e-5,
  )


def test_compose_sum_and_product_count_non_finite_values_as_zero():
  a = jnp.array([1.0, NAN], jnp.float32)
  b = jnp.array([INF, 1.0], jnp.float32)
  np.testing.assert_allclose(
      np.asarray(
          composition.compose({"a": a, "b": b}, {"a": 1.0, "b": 2.0}, "sum")
      ),
      [1.0, 2.0],
  )
  c = jnp.array([0.5, 1.0], jnp.float32)
  np.testing.assert_allclose(
      np.asarray(
          composition.compose({"a": a, "c": c}, {"a": 1.0, "c": 1.0}, "product")
      ),
      [0.5, 0.0],
  )


def test_nonfinite_fact_counts_and_sanitize_facts():
  facts = {
      "call_score": np.array([NAN, 1.0, INF], np.float32),
      "progress": np.array([[NAN, NAN], [0.0, 1.0], [-INF, 0.0]], np.float32),
      "correct": np.array([True, False, True]),
      "num_tool_calls": np.array([1, 2, 3], np.int32),
  }
  np.testing.assert_array_equal(
      np.asarray(sanitize.nonfinite_fact_counts(facts)), [3, 0, 2]
  )
  clean = sanitize.sanitize_facts(facts)
  np.testing.assert_array_equal(
      np.asarray(clean["call_score"]), [0.0, 1.0, 0.0]
  )
  np.testing.assert_array_equal(
      np.asarray(clean["progress"]), [[0.0, 0.0], [0.0, 1.0], [0.0, 0.0]]
  )
  assert clean["correct"] is facts["correct"]
  assert clean["progress"].dtype == jnp.float32
  np.testing.assert_array_equal(
      np.asarray(sanitize.nonfinite_fact_counts({"correct": facts["correct"]})),
      [0, 0, 0],
  )


def test_pbrs_potential_with_a_nan_reads_as_zero():
  """tests/test_learner.py's per-turn PBRS hand case (group of 2, K = 2,
  pbrs_coef 0.5), with ep 1's Phi(s_0) = 0 written as NaN: it reads as 0, so
  the advantages are the hand values [1, 1] / [-1, -1] on turn 0's tokens."""
  from agentic_rl import learner
  from configs import default

  P, Q, T, D = types.PROMPT, types.POLICY, types.TOOL, types.PAD
  traj = types.Trajectory(
      tokens=jnp.zeros((2, 7), jnp.int32),
      role=jnp.array([[P, P, Q, Q, T, Q, Q], [P, P, Q, Q, D, D, D]], jnp.int8),
      logprob=jnp.zeros((2, 7)),
      turn=jnp.array([[-1, -1, 0, 0, 0, 1, 1], [-1, -1, 0, 0, -1, -1, -1]]),
      length=jnp.array([7, 4]),
      num_turns=jnp.array([2, 1]),
      finish=jnp.array([types.ANSWERED, types.ANSWERED]),
      group=jnp.array([0, 0]),
      facts={
          "progress": jnp.array([[0.0, 1.0, 1.0], [NAN, 0.0, 0.0]]),
          "correct": jnp.array([True, False]),
          "num_tool_calls": jnp.array([1, 0]),
      },
  )
  rl = default.get_config().rl
  rl.credit = "per_turn"
  rl.pbrs_coef = 0.5
  rl.adv_eps = 0.0
  _, _, adv = learner.token_advantages(rl, jnp.array([1.0, 0.0]), traj, 2)
  np.testing.assert_allclose(
      adv, [[0, 0, 1, 1, 0, 0, 0], [0, 0, -1, -1, 0, 0, 0]], atol=1e-6
  )
