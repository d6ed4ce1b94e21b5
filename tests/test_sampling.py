"""Sampler vs trainer: KV-cache decoding equals a full forward pass, and sampled
behaviour log-probs equal teacher-forced log-probs at the same temperature."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentic_rl import rollout
from agentic_rl import sampling
from agentic_rl import types
from agentic_rl.models import transformer
from tests import fakes


def test_token_by_token_decoding_equals_full_forward():
  graphdef, params, cfg = fakes.tiny_policy(0)
  b, l = 3, 12
  tokens = jax.random.randint(jax.random.PRNGKey(1), (b, l), 0, cfg.vocab_size)
  full, _ = sampling.apply_model(graphdef, params, tokens)
  cache = transformer.init_cache(cfg, b, l)
  prefill = 4
  logits, cache = sampling.extend(
      graphdef, params, cache, tokens[:, :prefill], jnp.zeros(b, jnp.int32),
      jnp.full(b, prefill, jnp.int32))
  np.testing.assert_allclose(logits, full[:, prefill - 1], atol=1e-5, rtol=1e-5)
  for t in range(prefill, l):
    logits, cache = sampling.extend(
        graphdef, params, cache, tokens[:, t:t + 1], jnp.full(b, t, jnp.int32),
        jnp.ones(b, jnp.int32))
    np.testing.assert_allclose(logits, full[:, t], atol=1e-5, rtol=1e-5)


def test_ragged_chunked_prefill_equals_full_forward():
  """Rows at different positions, chunks of different real lengths, and stale
  entries past each row's end (written, then overwritten) must not leak."""
  graphdef, params, cfg = fakes.tiny_policy(3)
  b, l = 2, 16
  tokens = jax.random.randint(jax.random.PRNGKey(2), (b, l), 0, cfg.vocab_size)
  full, _ = sampling.apply_model(graphdef, params, tokens)
  cache = transformer.init_cache(cfg, b, l)
  start = jnp.array([0, 0], jnp.int32)
  # Chunks of width 5 with real lengths: row 0: 5, 2, 4;  row 1: 3, 5, 1.
  lens = [np.array([5, 3]), np.array([2, 5]), np.array([4, 1])]
  for n in lens:
    chunk = jnp.stack([
        jax.lax.dynamic_slice(jnp.pad(tokens[i], (0, 5)), (start[i],), (5,))
        for i in range(b)])
    logits, cache = sampling.extend(graphdef, params, cache, chunk, start,
                                    jnp.asarray(n, jnp.int32))
    start = start + jnp.asarray(n, jnp.int32)
    for i in range(b):
      np.testing.assert_allclose(logits[i], full[i, int(start[i]) - 1],
                                 atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_rollout_logprobs_equal_teacher_forced(temperature):
  env = fakes.EchoEnv()
  graphdef, params, cfg = fakes.tiny_policy(5)
  tasks = env.sample_tasks(jax.random.PRNGKey(0), 6)
  traj = rollout.rollout_jit(
      env, tasks, jax.random.PRNGKey(1), max_len=32, graphdef=graphdef,
      params=params, model_config=cfg, temperature=temperature)
  mask = np.asarray(traj.role) == types.POLICY
  # Several policy turns interleaved with tool observations per episode.
  assert (np.asarray(traj.num_turns) == 3).all()
  assert (np.asarray(traj.role) == types.TOOL).sum(1).min() >= 1
  logp, _ = sampling.token_logprobs(graphdef, params, traj.tokens, temperature)
  np.testing.assert_allclose(np.asarray(logp)[mask], np.asarray(traj.logprob)[mask],
                             atol=1e-5)
  assert (np.asarray(traj.logprob)[~mask] == 0).all()


def test_greedy_temperature_zero_takes_argmax():
  logits = jnp.array([[0.1, 2.0, -1.0], [3.0, 0.0, 1.0]])
  tok, logp = sampling.sample_token(jax.random.PRNGKey(0), logits, 0.0)
  np.testing.assert_array_equal(tok, [1, 0])
  np.testing.assert_allclose(logp, jax.nn.log_softmax(logits)[jnp.arange(2), tok])


def test_sample_token_frequencies_follow_temperature():
  logits = jnp.log(jnp.array([[0.2, 0.8]]))
  keys = jax.random.split(jax.random.PRNGKey(0), 4000)
  tok, logp = jax.vmap(lambda k: sampling.sample_token(k, logits, 0.5))(keys)
  # At T = 0.5 the probabilities become 0.2^2 : 0.8^2 = 1/17 : 16/17.
  assert abs(float(jnp.mean(tok == 1)) - 16 / 17) < 0.015
  np.testing.assert_allclose(
      logp[tok == 1], np.log(16 / 17), atol=1e-5)
