"""Roles, turns and finish reasons of assembled trajectories, token by token."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentic_rl import learner
from agentic_rl import rollout
from agentic_text import tokenizers
from agentic_rl import types
from environments import arithmetic
from tests import fakes

P, Q, T, D = types.PROMPT, types.POLICY, types.TOOL, types.PAD


def _hard_task():
  return arithmetic.ArithmeticTask(
      a=jnp.array([483]),
      b=jnp.array([27]),
      op=jnp.array([arithmetic.MUL]),
      answer=jnp.array([13041]),
      hard=jnp.array([True]),
  )


@functools.cache
def _expert_rollout(expert_imperfect_prob, max_len):
  """The expert's rollout of `_hard_task()` (key 0): one per (probability,
  buffer length) for the tests of this file, which only read it; compiled
  as one program rather than run op by op."""
  env = arithmetic.ArithmeticEnv(expert_imperfect_prob=expert_imperfect_prob)
  return rollout.rollout_jit(
      env, _hard_task(), jax.random.PRNGKey(0), max_len=max_len
  )


def test_roles_of_prompt_call_observation_answer_token_by_token():
  traj = _expert_rollout(0.0, 48)
  text = tokenizers.ByteTokenizer().decode(traj.tokens[0])
  assert text == (
      "<bos>Compute 483*27.\n<call>483*27</call><obs>13041</obs>"
      "<answer>13041</answer>"
  )
  # 17 prompt tokens, 8 call tokens, 7 observation tokens, 7 answer tokens, padding.
  expected_role = [P] * 17 + [Q] * 8 + [T] * 7 + [Q] * 7 + [D] * 9
  expected_turn = [-1] * 17 + [0] * 8 + [0] * 7 + [1] * 7 + [-1] * 9
  np.testing.assert_array_equal(traj.role[0], expected_role)
  np.testing.assert_array_equal(traj.turn[0], expected_turn)
  mask = np.asarray(learner.policy_mask(traj))[0]
  np.testing.assert_array_equal(mask, np.array(expected_role) == Q)
  assert int(traj.length[0]) == 39
  assert int(traj.num_turns[0]) == 2
  assert int(traj.finish[0]) == types.ANSWERED
  assert bool(traj.facts["correct"][0])
  assert int(traj.facts["num_tool_calls"][0]) == 1
  # Padding is PAD and gets no log-prob.
  assert (np.asarray(traj.tokens[0, 39:]) == tokenizers.PAD).all()


def test_truncated_when_buffer_fills():
  # 17 prompt + 8 call fit in 28, the 7-token observation does not.
  traj = _expert_rollout(0.0, 28)
  assert int(traj.finish[0]) == types.TRUNCATED
  assert int(traj.length[0]) == 25
  assert (np.asarray(traj.role[0]) != types.TOOL).all()


def test_max_turns_finish_and_ragged_observations():
  env = fakes.EchoEnv()
  traj = rollout.rollout_jit(
      env, jnp.array([3, 6]), jax.random.PRNGKey(0), max_len=32
  )
  np.testing.assert_array_equal(traj.finish, [types.MAX_TURNS] * 2)
  np.testing.assert_array_equal(traj.num_turns, [3, 3])
  # Row 0: prompt 3, then (action 2, obs 1), (action 2, obs 2); the last turn's
  # observation is not written because the episode is over.
  expected = [P] * 3 + [Q, Q, T, Q, Q, T, T, Q, Q]
  np.testing.assert_array_equal(traj.role[0, :12], expected)
  assert int(traj.length[0]) == 12
  np.testing.assert_array_equal(
      traj.turn[0, :12], [-1] * 3 + [0, 0, 0, 1, 1, 1, 1, 2, 2]
  )


def test_format_error_finish():
  env = arithmetic.ArithmeticEnv()
  graphdef, params, cfg = fakes.tiny_policy(0)
  tasks = env.sample_tasks(jax.random.PRNGKey(0), 8)
  # Temperature 1 passed as a float32 array (the default's value): the
  # program test_rollout_from_a_given_initial_state_is_bit_identical's
  # 'arithmetic' rollouts then reuse (same env, shapes, policy and
  # signature), rather than one more compile of the same rollout.
  traj = rollout.rollout_jit(
      env,
      tasks,
      jax.random.PRNGKey(1),
      max_len=64,
      graphdef=graphdef,
      params=params,
      model_config=cfg,
      temperature=jnp.float32(1.0),
  )
  # A random policy almost never starts with <call>/<answer>: format errors.
  finish = np.asarray(traj.finish)
  assert (finish != types.RUNNING).all()
  fe = np.asarray(traj.facts["format_error"])
  np.testing.assert_array_equal(
      finish == types.FORMAT_ERROR, fe & ~(finish == types.TRUNCATED)
  )


def test_truncated_episode_never_gets_the_correct_reward():
  from agentic_rl.rewards import factory

  traj = _expert_rollout(0.0, 28)
  assert int(traj.finish[0]) == types.TRUNCATED
  reward, parts = factory.make_reward_fn({"correct": 1.0, "format": 0.1})(traj)
  assert float(reward[0]) == 0.0 and float(parts["correct"][0]) == 0.0


def test_progress_potential_fact_of_a_call_then_answer_episode():
  traj = _expert_rollout(0.0, 48)
  # s_0: nothing; s_1: <obs>13041</obs> holds the answer; s_2: still in context.
  np.testing.assert_array_equal(traj.facts["progress"][0], [0.0, 1.0, 1.0, 0.0])
  # A direct (tool-free) answer never makes progress through the tool.
  traj = _expert_rollout(1.0, 48)
  np.testing.assert_array_equal(traj.facts["progress"][0], [0.0, 0.0, 0.0, 0.0])


def assert_bitwise_equal(got, want) -> None:
  """Same pytree structure, and every leaf has the same dtype, shape and
  bytes (floats bit for bit: no tolerance, -0.0 differs from 0.0)."""
  got_leaves, got_def = jax.tree.flatten(got)
  want_leaves, want_def = jax.tree.flatten(want)
  assert got_def == want_def, (got_def, want_def)
  for i, (a, b) in enumerate(zip(got_leaves, want_leaves)):
    a, b = np.asarray(a), np.asarray(b)
    assert (a.dtype, a.shape) == (b.dtype, b.shape), (i, a.dtype, b.dtype)
    assert a.tobytes() == b.tobytes(), (i, a, b)


def _policy_rollout_case(name):
  graphdef, params, cfg = fakes.tiny_policy(0)
  if name == "arithmetic":
    env = arithmetic.ArithmeticEnv()
    tasks = env.sample_tasks(jax.random.PRNGKey(0), 8)
    max_len = 64
  else:  # three turns with ragged observations (cache appends)
    env, tasks, max_len = fakes.EchoEnv(), jnp.array([3, 6, 1]), 32
  policy = dict(
      max_len=max_len, graphdef=graphdef, params=params, model_config=cfg
  )
  return env, tasks, policy


def test_initial_state_is_the_prefilled_prompt_carry():
  env, tasks, policy = _policy_rollout_case("arithmetic")
  init = rollout.initial_state_jit(env, tasks, **policy)
  # What `rollout` builds before its turn loop: reset, then init_state.
  env_state, prompt, prompt_len = jax.jit(jax.vmap(env.reset))(tasks)
  want = jax.jit(
      lambda p, n, s, params: rollout.init_state(
          p,
          n,
          s,
          max_len=policy["max_len"],
          graphdef=policy["graphdef"],
          params=params,
          model_config=policy["model_config"],
      )
  )(prompt, prompt_len, env_state, policy["params"])
  assert_bitwise_equal(init, want)
  # Prompts written with role PROMPT, nothing else yet.
  # Read on the host (a device slice per row was one more small compile).
  n, prompt = np.asarray(prompt_len), np.asarray(prompt)
  tokens, role = np.asarray(init.tokens), np.asarray(init.role)
  for b in range(8):
    np.testing.assert_array_equal(tokens[b, : n[b]], prompt[b, : n[b]])
    assert (tokens[b, n[b] :] == tokenizers.PAD).all()
    assert (role[b, : n[b]] == P).all() and (role[b, n[b] :] == D).all()
  np.testing.assert_array_equal(init.length, n)
  assert not np.asarray(init.done).any()
  assert (np.asarray(init.finish) == types.RUNNING).all()
  assert (np.asarray(init.num_turns) == 0).all()
  assert (np.asarray(init.logprob) == 0).all()
  assert (np.asarray(init.turn) == -1).all()
  assert init.next_logits.shape == (8, policy["model_config"].vocab_size)


@pytest.mark.parametrize("case", ["arithmetic", "echo"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_rollout_from_a_given_initial_state_is_bit_identical(case, temperature):
  # Evaluation's passes share one prefill (train.evaluate): a rollout from
  # the initial state built once gives the very trajectory (tokens,
  # log-probs, facts) of a rollout that builds it itself, pass after pass.
  env, tasks, policy = _policy_rollout_case(case)
  key = jax.random.PRNGKey(3)
  t = jnp.float32(temperature)
  want = rollout.rollout_jit(env, tasks, key, **policy, temperature=t)
  init = rollout.initial_state_jit(env, tasks, **policy)
  for _ in range(2):  # the carry is not consumed by a pass
    got = rollout.rollout_jit(
        env, tasks, key, **policy, temperature=t, init=init
    )
    assert_bitwise_equal(got, want)
  # Not a vacuous comparison: sampled tokens were written and scored.
  assert (np.asarray(want.role) == Q).any()
  assert (np.asarray(want.logprob) != 0).any() or temperature == 0.0
