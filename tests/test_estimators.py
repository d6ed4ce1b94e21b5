"""The estimator table (agentic_rl/estimators.py): each entry's declared
inputs and settings fit its function, the needs derived from them, and every
episode- and turn-level entry through the config adapter
(learner.token_advantages), under jit as eagerly. Hand values of each
estimator: tests/test_advantages.py, tests/test_credit.py,
tests/test_learner.py; validation of the needs: tests/test_configs.py."""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentic_rl import estimators
from agentic_rl import learner
from agentic_rl import types
from configs import default
from tests import fakes


@pytest.mark.parametrize("name", list(estimators.ESTIMATORS))
def test_entry_function_takes_its_declared_inputs_and_settings(name):
  entry = estimators.ESTIMATORS[name]
  sig = inspect.signature(entry.fn)
  sig.bind(*entry.inputs, **{s: None for s in entry.settings})
  kw_only = [
      p.name
      for p in sig.parameters.values()
      if p.kind == inspect.Parameter.KEYWORD_ONLY
  ]
  # Settings are keyword-only; the function may have more (e.g. valid_b).
  assert set(entry.settings) <= set(kw_only)


def test_every_setting_is_a_field_of_the_rl_config():
  rl = default.get_config().rl
  for key, field in estimators.SETTINGS.items():
    assert field.startswith("rl.") and field[3:] in rl, key


def test_declared_and_derived_needs_hand_values():
  needs = {
      name: (
          e.level,
          e.needs_value_head,
          e.needs_turns,
          e.takes_turn_rewards,
          e.reads_facts,
          e.takes_potential,
          e.needs_sampled_rows,
      )
      for name, e in estimators.ESTIMATORS.items()
  }
  group = ("episode", False, False, False, (), True, False)
  assert needs == {
      "grpo": group,
      "drgrpo": group,
      "rloo": group,
      "reinforce_pp": group,
      "reinforce_pp_baseline": group,
      "hdpo": (
          "episode",
          False,
          False,
          False,
          ("correct", "num_tool_calls"),
          True,
          False,
      ),
      "gigpo": ("turn", False, True, False, (), False, False),
      "gae": ("token", True, False, False, (), False, False),
      "per_turn": ("turn", False, True, True, (), True, False),
      "tree": ("turn", False, True, False, (), False, True),
  }


def test_a_bad_entry_is_refused():
  fn = lambda r: r
  with pytest.raises(ValueError, match="level"):
    estimators.Estimator(fn, "sequence", ("reward_b",))
  with pytest.raises(ValueError, match="unknown inputs"):
    estimators.Estimator(fn, "episode", ("rewards",))
  with pytest.raises(ValueError, match="selected_by"):
    estimators.Estimator(fn, "episode", ("reward_b",), selected_by="rl.x")
  with pytest.raises(ValueError, match="one entry"):
    estimators.entry_for("rl.advantage_estimator")


def _traj():
  """Group of 2 (K = 2): ep 0 calls the tool (turn 0) then answers; ep 1
  answers at once."""
  P, Q, T, D = types.PROMPT, types.POLICY, types.TOOL, types.PAD
  role = jnp.array([[P, P, Q, Q, T, Q, Q], [P, P, Q, Q, D, D, D]], jnp.int8)
  turn = jnp.array([[-1, -1, 0, 0, 0, 1, 1], [-1, -1, 0, 0, -1, -1, -1]])
  return fakes.trajectory(
      role=role,
      turn=turn,
      length=[7, 4],
      num_turns=[2, 1],
      facts={
          "correct": jnp.array([True, False]),
          "num_tool_calls": jnp.array([1, 0]),
      },
  )


@pytest.mark.parametrize(
    "name",
    [n for n, e in estimators.ESTIMATORS.items() if e.level != "token"],
)
def test_every_entry_runs_through_the_adapter_and_jits(name):
  entry = estimators.ESTIMATORS[name]
  rl = default.get_config().rl
  if entry.selected_by == "rl.advantage_estimator":
    rl.advantage_estimator = name
  else:
    rl.advantage_estimator = entry.base_estimators[0]
    if entry.selected_by == "rl.credit":
      rl.credit = "per_turn"
    else:
      rl.tree_branching = (2,)
  assert learner.estimator_name(rl) == name
  traj = _traj()
  fn = lambda r: learner.token_advantages(rl, r, traj, 2)
  reward = jnp.array([1.0, 0.0])
  eager = fn(reward)
  jitted = jax.jit(fn)(reward)
  _, adv_b, adv_bl = eager
  assert adv_b.shape == (2,) and adv_bl.shape == (2, 7)
  assert adv_bl.dtype == jnp.float32
  assert np.all(np.asarray(adv_bl)[np.asarray(traj.role) != types.POLICY] == 0)
  assert np.any(np.asarray(adv_bl) != 0), name
  for a, b in zip(eager, jitted):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
