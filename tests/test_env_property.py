"""Property test: random token sequences never break any JAX-native `step`.

For every registered JAX-native environment, hypothesis feeds random turns (bytes
and specials, random lengths including out-of-range ones) to one jitted two-step
function; the observation, done flag and every fact keep their shapes and dtypes,
observation lengths stay in [0, O], and nothing raises.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import environments
from agentic_text import tokenizers as tk

ENV_CONFIGS = {
    "arithmetic": dict(name="arithmetic"),
    "arithmetic_chain_noisy": dict(
        name="arithmetic",
        num_ops=3,
        max_turns=5,
        max_prompt_len=32,
        tool_noise_prob=0.5,
    ),
    "kv_chain": dict(name="kv_chain"),
    "schema_calls": dict(name="schema_calls"),
    "clarification": dict(name="clarification"),
    "budget": dict(name="budget", base="kv_chain", budget=1),
}

_SPECIALS = sorted(tk.SPECIAL_TOKENS)
_token = st.one_of(
    st.integers(0, tk.VOCAB_SIZE - 1),
    st.sampled_from(_SPECIALS),
    st.sampled_from([ord(c) for c in "0123456789+-*=,()?abxy"]),
)


@pytest.fixture(scope="module", params=sorted(ENV_CONFIGS))
def env_case(request):
  env = environments.make(ENV_CONFIGS[request.param])
  task = jax.tree.map(lambda x: x[0], env.eval_tasks(2, 0))

  @jax.jit
  def two_steps(act_2a, len_2):
    state, _, _ = env.reset(task)
    state, obs0, olen0, done0 = env.step(state, act_2a[0], len_2[0])
    state, obs1, olen1, done1 = env.step(state, act_2a[1], len_2[1])
    return (
        jnp.stack([obs0, obs1]),
        jnp.stack([olen0, olen1]),
        jnp.stack([done0, done1]),
        env.facts(state),
    )

  ref = jax.eval_shape(lambda t: env.facts(env.reset(t)[0]), task)
  return env, two_steps, ref


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_random_turns_never_break_step(env_case, data):
  env, two_steps, ref = env_case
  a = env.max_action_len
  acts, lens = [], []
  for _ in range(2):
    ids = data.draw(st.lists(_token, max_size=a))
    acts.append(ids + [tk.PAD] * (a - len(ids)))
    lens.append(data.draw(st.one_of(st.just(len(ids)), st.integers(-3, a + 3))))
  obs, olen, done, facts = jax.device_get(
      two_steps(jnp.asarray(acts, jnp.int32), jnp.asarray(lens, jnp.int32))
  )
  assert obs.shape == (2, env.max_obs_len) and obs.dtype == np.int32
  assert (
      olen.dtype == np.int32 and ((olen >= 0) & (olen <= env.max_obs_len)).all()
  )
  assert done.dtype == bool
  # Observation tokens past obs_len are PAD.
  for i in range(2):
    assert (obs[i, olen[i] :] == tk.PAD).all()
  assert set(facts) == set(ref)
  for k, v in facts.items():
    assert v.shape == ref[k].shape and v.dtype == ref[k].dtype, k
  assert 0 <= int(facts["num_tool_errors"]) <= int(facts["num_tool_calls"]) <= 2
  assert ((facts["progress"] >= 0) & (facts["progress"] <= 1)).all()
  if facts["correct"]:
    assert facts["answered"]
