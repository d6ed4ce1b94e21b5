"""The RL step's post-update metrics (agentic_rl/learner/step_metrics.py):
each metric function on a hand-made batch, and the list a config selects.
Dual-path hand values: tests/test_dual_path.py."""

import math

import jax
import jax.numpy as jnp
import numpy as np

from agentic_rl import types
from agentic_rl.learner import step_metrics
from agentic_rl.learner.batch import LearnerBatch, Rollout
from configs import default
from tests import fakes

A, F, T = types.ANSWERED, types.FORMAT_ERROR, types.TRUNCATED


def _traj(**facts):
  """4 episodes (2 groups of 2), 3 tokens each."""
  base = {
      "correct": jnp.array([1.0, 0.0, 1.0, 1.0]),
      "num_tool_calls": jnp.array([1, 0, 2, 0]),
      "num_tool_errors": jnp.array([0, 0, 1, 0]),
  }
  return fakes.trajectory(
      {**base, **facts},
      width=3,
      length=jnp.array([3, 2, 3, 1]),
      num_turns=jnp.array([1, 1, 2, 1]),
      finish=jnp.array([A, F, T, A]),
      group=jnp.array([0, 0, 1, 1]),
  )


_MASK = jnp.array(
    [
        [True, True, False],
        [True, False, False],
        [True, True, True],
        [False, False, False],
    ]
)


def _rollout_and_batch(traj, parts=None):
  r = Rollout(
      traj=traj,
      reward=jnp.array([1.0, 0.0, 1.0, 1.0]),
      parts=(
          {
              "correct": jnp.array([1.0, 0.0, 1.0, 1.0]),
              "format": jnp.array([0.1, 0.0, 0.1, 0.1]),
          }
          if parts is None
          else parts
      ),
      info={},
      adv_b=jnp.array([0.5, -0.5, 0.0, 0.0]),
  )
  z = jnp.zeros((4, 3))
  batch = LearnerBatch(
      tokens=jnp.zeros((4, 3), jnp.int32),
      mask=_MASK,
      behaviour_logp=z,
      ref_logp=z,
      advantage=z,
  )
  return r, batch


def _assert_values(got, want):
  assert set(got) == set(want)
  for k, v in want.items():
    np.testing.assert_allclose(float(got[k]), v, rtol=1e-6, err_msg=k)


def test_batch_metrics_hand_values():
  r, batch = _rollout_and_batch(_traj())
  fn = lambda r, m: step_metrics.batch_metrics(
      r.reward, r.parts, r.traj, m, r.adv_b, group_size=2
  )
  for f in (fn, jax.jit(fn)):
    _assert_values(
        f(r, batch.mask),
        {
            "reward": 0.75,
            "shaped_reward": 0.75,
            "reward_correct": 0.75,
            "reward_format": 0.075,  # (0.1 + 0 + 0.1 + 0.1) / 4
            "accuracy": 0.75,
            "tool_calls": 0.75,  # (1 + 0 + 2 + 0) / 4
            "tool_errors": 0.25,
            "format_error_rate": 0.25,
            "truncated_rate": 0.25,
            "policy_tokens": 1.5,  # (2 + 1 + 3 + 0) / 4
            "trained_token_share": 0.5,  # 6 / 12
            "real_token_share": 0.75,  # (3 + 2 + 3 + 1) / 12
            "adv_abs_mean": 0.25,  # (0.5 + 0.5) / 4
            # Group 0's rewards (1, 0) vary, group 1's (1, 1) do not.
            "zero_variance_groups": 0.5,
        },
    )


def test_host_tool_failures_sums_the_present_facts():
  facts = {
      "num_tool_exceptions": jnp.array([1, 0, 2, 0], jnp.int32),
      "num_tool_timeouts": jnp.array([0, 1, 0, 0], jnp.int32),
  }
  _assert_values(
      step_metrics.host_tool_failures(facts),
      {"tool_exceptions": 3.0, "tool_timeouts": 1.0},
  )
  only = {"num_tool_timeouts": facts["num_tool_timeouts"]}
  _assert_values(step_metrics.host_tool_failures(only), {"tool_timeouts": 1.0})
  assert step_metrics.host_tool_failures({"correct": jnp.ones(4)}) == {}


def test_episode_fact_metrics_hand_values():
  traj = _traj(
      score=jnp.array([0.5, math.nan, math.inf, 1.0]),
      num_redundant_calls=jnp.array([0, 0, 1, 0]),
  )
  _assert_values(
      step_metrics.episode_fact_metrics(traj),
      {
          # The NaN and the inf of the float fact 'score'.
          "reward_nonfinite_inputs": 2.0,
          "turns": 1.25,  # (1 + 1 + 2 + 1) / 4
          "redundant_calls": 0.25,
      },
  )
  got = step_metrics.episode_fact_metrics(_traj())
  _assert_values(got, {"reward_nonfinite_inputs": 0.0, "turns": 1.25})


# RM rewards x = (0.9, 0.8, 0.2, 0.6) against verified y = (1, 0, 1, 1):
# means 0.625 and 0.75; dx = (0.275, 0.175, -0.425, -0.025), dy = (0.25,
# -0.75, 0.25, 0.25); sum dx dy = -0.175, sum dx^2 = 0.2875, sum dy^2 = 0.75.
_RM_WANT = {
    "rm_reward": 0.625,
    "verified_reward": 0.75,
    "rm_gap": -0.125,
    "rm_verified_corr": -0.175 / math.sqrt(0.2875 * 0.75),
    # The one unverified episode (row 1) has rm reward 0.8 > 0.5.
    "rm_false_positive_rate": 1.0,
    "rm_score": 0.625,
}


def test_rm_monitor_reads_the_rm_part_or_the_scores():
  x = jnp.array([0.9, 0.8, 0.2, 0.6])
  traj = _traj(rm_score=x)
  # With the 'rm' reward part, the part (not a sigmoid of the scores).
  got = step_metrics.rm_monitor(
      traj, {"rm": x}, rm_params={"transform": "sigmoid"}
  )
  _assert_values(got, _RM_WANT)
  # Without it, the scores through the configured transform ('none').
  got = step_metrics.rm_monitor(traj, {}, rm_params={"transform": "none"})
  _assert_values(got, _RM_WANT)


class _HostEnv:
  is_host = True


class _JaxEnv:
  max_turns = 2


def _names(env=_JaxEnv(), reward_model=None, **rl):
  config = default.get_config("smoke")
  config.rl.update(rl)
  return [
      f.__name__
      for f in step_metrics.build_step_metrics(config, env, reward_model)
  ]


def test_the_list_selected_per_config():
  assert _names() == ["batch", "episode_facts"]
  assert _names(dual_path_tool_free=1) == [
      "dual_path",
      "batch",
      "episode_facts",
  ]
  assert _names(env=_HostEnv()) == ["batch", "host_failures", "episode_facts"]
  assert _names(reward_model=object()) == [
      "batch",
      "episode_facts",
      "rm_monitor",
  ]


def test_the_bound_functions_read_the_rollout_and_batch():
  config = default.get_config("smoke")
  config.rl.update(group_size=2, dual_path_tool_free=1)
  config.rl.reward_params = {"rm": {"transform": "none"}}
  fns = step_metrics.build_step_metrics(config, _HostEnv(), object())
  traj = _traj(
      tool_free=jnp.array([False, True, False, True]),
      num_tool_exceptions=jnp.array([1, 0, 0, 0], jnp.int32),
      rm_score=jnp.array([0.9, 0.8, 0.2, 0.6]),
  )
  r, batch = _rollout_and_batch(traj, parts={})
  out = [f(r, batch) for f in fns]
  assert [f.__name__ for f in fns] == [
      "dual_path",
      "batch",
      "host_failures",
      "episode_facts",
      "rm_monitor",
  ]
  _assert_values(out[0], step_metrics.dual_path_metrics(traj))
  # Group size 2 (from the config): rewards (1, 0) vary, (1, 1) do not.
  np.testing.assert_allclose(float(out[1]["zero_variance_groups"]), 0.5)
  np.testing.assert_allclose(float(out[1]["policy_tokens"]), 1.5)
  _assert_values(out[2], {"tool_exceptions": 1.0})
  assert set(out[3]) == {"reward_nonfinite_inputs", "turns"}
  # rl.reward_params.rm (transform 'none'): the scores themselves.
  _assert_values(out[4], _RM_WANT)
