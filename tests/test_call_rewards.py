"""Hand-computed tests for agentic_rl/call_rewards.py (ToolRL and TIER components)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentic_rl import call_rewards as cr
from agentic_rl.rewards import components
from agentic_rl.rewards import factory
from tests import fakes

# Three episodes, K = 3 turns:
#  0: two perfect calls, answered, correct;
#  1: call 1 wrong name (names right, values right), call 2 unparsable; answered, wrong;
#  2: no calls, answered, correct.
T = np.array([[1, 1, 0], [1, 1, 0], [0, 0, 0]], bool)
TRAJ = fakes.trajectory(
    dict(
        tool_call_turn=T,
        call_format_ok=np.array([[1, 1, 0], [1, 0, 0], [0, 0, 0]], bool),
        call_schema_ok=np.array([[1, 1, 0], [1, 0, 0], [0, 0, 0]], bool),
        call_name_ok=np.array([[1, 1, 0], [0, 0, 0], [0, 0, 0]], bool),
        call_param_names_frac=np.array(
            [[1, 1, 0], [1, 0, 0], [0, 0, 0]], np.float32
        ),
        call_param_values_frac=np.array(
            [[1, 1, 0], [0.5, 0, 0], [0, 0, 0]], np.float32
        ),
        call_exec_ok=np.array([[1, 1, 0], [1, 0, 0], [0, 0, 0]], bool),
        answered=np.array([1, 1, 1], bool),
        correct=np.array([1, 0, 1], bool),
    )
)


def test_partial_credit_components():
  np.testing.assert_allclose(cr.call_name_reward(TRAJ), [1.0, 0.0, 0.0])
  np.testing.assert_allclose(cr.call_param_names_reward(TRAJ), [1.0, 0.5, 0.0])
  np.testing.assert_allclose(
      cr.call_param_values_reward(TRAJ), [1.0, 0.25, 0.0]
  )
  np.testing.assert_allclose(cr.format_validity(TRAJ), [1.0, 0.0, 1.0])


def test_toolrl_hand_values():
  # Per call: 6 (name + names + 2 values) / 4 - 3.
  # ep 0: both calls 6*4/4-3 = 3 -> 3; ep 1: call 1: 6*(0+1+1)/4-3 = 0,
  # call 2: 6*0/4-3 = -3 -> mean -1.5; ep 2: no calls -> -3.
  np.testing.assert_allclose(cr.toolrl_correct(TRAJ), [3.0, -1.5, -3.0])
  np.testing.assert_allclose(cr.toolrl_reward(TRAJ), [4.0, -1.5, -2.0])
  np.testing.assert_allclose(
      cr.toolrl_reward(TRAJ, format_weight=0.5, correct_scale=2.0),
      [6.5, -3.0, -5.5],
  )


def test_tier_hand_values():
  # F + S + E + A: ep0 1+1+1+1; ep1 0 + 0.5 + 0.5 + 0; ep2 1 + 0 + 0 + 1.
  np.testing.assert_allclose(cr.tier_reward(TRAJ), [4.0, 1.0, 2.0])
  np.testing.assert_allclose(
      cr.tier_reward(
          TRAJ, w_format=0.0, w_schema=2.0, w_exec=0.0, w_answer=0.0
      ),
      [2.0, 1.0, 0.0],
  )


def test_registered_and_jittable_through_make_reward_fn():
  assert {
      "toolrl",
      "tier",
      "call_name",
      "call_param_names",
      "call_param_values",
  } <= set(components.REWARD_COMPONENTS)
  assert components.REWARD_PARAM_DEFAULTS["tier"] == dict(
      w_format=1.0, w_schema=1.0, w_exec=1.0, w_answer=1.0
  )
  fn = factory.make_reward_fn({"toolrl": 1.0, "tier": 0.5})
  total, comps = jax.jit(lambda t: fn(t))(TRAJ)[:2]
  np.testing.assert_allclose(
      total,
      np.array([4.0, -1.5, -2.0]) + 0.5 * np.array([4.0, 1.0, 2.0]),
      rtol=1e-6,
  )


@pytest.fixture(scope="module")
def schema_paths():
  """Facts of real schema_calls episodes: two different valid paths and one with a
  wrong value, on the task (3+4)*5."""
  from environments import schema_calls as sc

  task = sc.SchemaTask(
      depth=jnp.int32(2),
      branch=jnp.bool_(False),
      op=jnp.array([sc.OP_ADD, sc.OP_MUL, 0], jnp.int32),
      leaf=jnp.array([3, 4, 5, 0], jnp.int32),
      left_ref=jnp.array([-1, 0, -1], jnp.int32),
      right_ref=jnp.array([-1, -1, -1], jnp.int32),
      left_const=jnp.array([3, 0, 0], jnp.int32),
      right_const=jnp.array([4, 5, 0], jnp.int32),
      value=jnp.array([7, 35, 0], jnp.int32),
      answer=jnp.int32(35),
      forbidden=jnp.int32(-1),
  )
  drive = fakes.env_driver(sc.SchemaCallsEnv())

  def episode(texts, ans):
    return drive.run(task, [*map(drive.call, texts), drive.answer(ans)]).facts

  eps = [
      episode(["add(a=3,b=4)", "mul(a=7,b=5)"], "35"),
      episode(["sum(y=3,x=4)", "mul(b=7,a=5)"], "35"),
      episode(["add(a=3,b=4)", "mul(a=7,b=6)"], "42"),
  ]
  facts = jax.tree.map(lambda *x: jnp.stack(x), *eps)
  return fakes.trajectory(facts)


def test_alternative_valid_path_gets_full_credit(schema_paths):
  t = schema_paths
  np.testing.assert_allclose(
      cr.toolrl_reward(t), [4.0, 4.0, 4.0 - 0.75], rtol=1e-6
  )
  np.testing.assert_allclose(cr.tier_reward(t), [4.0, 4.0, 3.0], rtol=1e-6)
  np.testing.assert_allclose(cr.call_param_values_reward(t), [1.0, 1.0, 0.75])
