"""Tests of agentic_rl/host_rollout.py: the host driver reproduces the JAX-native
engine token for token on an environment that both can express, keeps sampled ids
(never re-tokenised), and handles host-side finish reasons."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentic_rl import host_rollout
from agentic_rl import rollout
from agentic_text import tokenizers
from agentic_rl import types
from tests import fakes


@dataclasses.dataclass(frozen=True, eq=False)
class HostEcho:
  """Python twin of fakes.EchoEnv: prompt BOS + 'A' * (task - 1); every turn gets
  the observation chr(48 + turn) * (1 + turn % 3); done after max_turns turns.
  """

  max_prompt_len: int = 6
  max_action_len: int = 5
  max_obs_len: int = 3
  max_turns: int = 3
  tokenizer: object = tokenizers.ByteTokenizer()
  is_host = True
  seen: list = dataclasses.field(default_factory=list)

  def reset(self, task):
    return {"turn": 0, "calls": 0}, np.array(
        [tokenizers.BOS] + [65] * (task - 1), np.int32
    )

  def step(self, state, text):
    self.seen.append(text)
    t = state["turn"]
    obs = np.full((1 + t % 3,), 48 + t, np.int32)
    new = {"turn": t + 1, "calls": state["calls"] + 1}
    return new, obs, new["turn"] >= self.max_turns

  def facts(self, state):
    return {
        "correct": np.bool_(False),
        "answered": np.bool_(False),
        "format_error": np.bool_(False),
        "num_tool_calls": np.int32(state["calls"]),
        "num_tool_errors": np.int32(0),
    }

  def expert_action(self, state, rng):
    return np.array([66, tokenizers.CALL_END], np.int32)


@pytest.fixture(scope="module")
def policy():
  return fakes.tiny_policy(seed=3)


@pytest.mark.parametrize("max_len", [16])
def test_host_driver_matches_jax_native_rollout(policy, max_len):
  graphdef, params, cfg = policy
  tasks = [1, 3, 6, 2]
  key = jax.random.PRNGKey(11)
  ref = rollout.rollout_jit(
      fakes.EchoEnv(),
      jnp.array(tasks, jnp.int32),
      key,
      max_len=max_len,
      graphdef=graphdef,
      params=params,
      model_config=cfg,
      temperature=jnp.float32(1.0),
  )
  env = HostEcho()
  got = host_rollout.rollout(
      env,
      tasks,
      key,
      max_len=max_len,
      graphdef=graphdef,
      params=params,
      model_config=cfg,
      temperature=1.0,
  )
  for name in (
      "tokens",
      "role",
      "turn",
      "length",
      "num_turns",
      "finish",
      "group",
  ):
    np.testing.assert_array_equal(
        np.asarray(getattr(got, name)),
        np.asarray(getattr(ref, name)),
        err_msg=name,
    )
  np.testing.assert_allclose(
      np.asarray(got.logprob), np.asarray(ref.logprob), rtol=1e-6, atol=1e-6
  )
  np.testing.assert_array_equal(
      got.facts["num_tool_calls"], np.asarray(ref.facts["num_tool_calls"])
  )
  assert isinstance(got.facts["num_tool_calls"], np.ndarray)
  if max_len == 16:  # the 6-token prompt row runs out of room
    assert (np.asarray(got.finish) == types.TRUNCATED).any()


def test_sampled_ids_are_kept_and_env_sees_their_decoding(policy):
  graphdef, params, cfg = policy
  env = HostEcho(max_turns=1)
  traj = host_rollout.rollout(
      env,
      [2, 2],
      jax.random.PRNGKey(0),
      max_len=16,
      graphdef=graphdef,
      params=params,
      model_config=cfg,
  )
  tokens, role = np.asarray(traj.tokens), np.asarray(traj.role)
  for i in range(2):
    ids = tokens[i][role[i] == types.POLICY]
    assert env.seen[i] == tokenizers.ByteTokenizer().decode(ids)
  assert (np.asarray(traj.logprob)[role != types.POLICY] == 0).all()
  assert (np.asarray(traj.logprob)[role == types.POLICY] < 0).all()


def test_expert_rollout_matches_jax_native_expert():
  tasks = [4, 1, 5]
  ref = rollout.rollout(
      fakes.EchoEnv(),
      jnp.array(tasks, jnp.int32),
      jax.random.PRNGKey(0),
      max_len=16,
  )
  got = host_rollout.rollout(
      HostEcho(), tasks, jax.random.PRNGKey(0), max_len=16
  )
  for name in ("tokens", "role", "turn", "length", "num_turns", "finish"):
    np.testing.assert_array_equal(
        np.asarray(getattr(got, name)),
        np.asarray(getattr(ref, name)),
        err_msg=name,
    )


def test_no_recompilation_on_second_call(policy):
  graphdef, params, cfg = policy
  env = HostEcho()
  host_rollout.rollout(
      env,
      [2, 3],
      jax.random.PRNGKey(1),
      max_len=16,
      graphdef=graphdef,
      params=params,
      model_config=cfg,
  )
  sizes = (
      host_rollout.generate_turn_jit._cache_size(),
      host_rollout.end_turn_jit._cache_size(),
  )
  host_rollout.rollout(
      env,
      [5, 1],
      jax.random.PRNGKey(2),
      max_len=16,
      graphdef=graphdef,
      params=params,
      model_config=cfg,
      temperature=0.0,
  )
  assert (
      host_rollout.generate_turn_jit._cache_size(),
      host_rollout.end_turn_jit._cache_size(),
  ) == sizes


def test_numpy_rng_is_a_function_of_the_key():
  a = host_rollout.numpy_rng(jax.random.PRNGKey(5)).integers(0, 10**9, 4)
  b = host_rollout.numpy_rng(jax.random.PRNGKey(5)).integers(0, 10**9, 4)
  c = host_rollout.numpy_rng(jax.random.PRNGKey(6)).integers(0, 10**9, 4)
  np.testing.assert_array_equal(a, b)
  assert (a != c).any()
  with pytest.raises(ValueError, match="keys differ"):
    host_rollout.stack_facts([{"a": 1}, {"b": 2}])
