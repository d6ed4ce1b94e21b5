"""Sampler vs trainer: KV-cache decoding equals a full forward pass, and sampled
behaviour log-probs equal teacher-forced log-probs at the same temperature."""

import dataclasses

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


@pytest.mark.parametrize("temperature,chunk", [(1.0, 0), (0.7, 5)])
def test_rollout_logprobs_equal_teacher_forced(temperature, chunk):
  """Also with the trainer's log-probs computed in sequence chunks of 5."""
  env = fakes.EchoEnv()
  graphdef, params, cfg = fakes.tiny_policy(
      5, dataclasses.replace(fakes.TINY, logprob_chunk_size=chunk))
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


def test_one_compiled_sampler_greedy_and_sampled_streams():
  # A traced temperature: one program; T = 0 takes the arg-max without drawing
  # noise, T > 0 draws exactly jax.random.categorical's token for the key.
  logits = jax.random.normal(jax.random.PRNGKey(3), (6, 50)) * 3
  f = jax.jit(sampling.sample_token)
  for i in range(4):
    key = jax.random.PRNGKey(10 + i)
    tok, _ = f(key, logits, jnp.float32(0.0))
    np.testing.assert_array_equal(tok, jnp.argmax(logits, axis=-1))
    tok, logp = f(key, logits, jnp.float32(0.7))
    expected = jax.random.categorical(key, jax.nn.log_softmax(logits / 0.7), axis=-1)
    np.testing.assert_array_equal(tok, expected)
    np.testing.assert_allclose(
        logp, jax.nn.log_softmax(logits / 0.7)[jnp.arange(6), expected], atol=1e-6)


def test_sample_token_frequencies_follow_temperature():
  logits = jnp.log(jnp.array([[0.2, 0.8]]))
  keys = jax.random.split(jax.random.PRNGKey(0), 4000)
  tok, logp = jax.vmap(lambda k: sampling.sample_token(k, logits, 0.5))(keys)
  # At T = 0.5 the probabilities become 0.2^2 : 0.8^2 = 1/17 : 16/17.
  assert abs(float(jnp.mean(tok == 1)) - 16 / 17) < 0.015
  np.testing.assert_allclose(
      logp[tok == 1], np.log(16 / 17), atol=1e-5)


@pytest.fixture(scope="module")
def chunk_setup():
  graphdef, params, cfg = fakes.tiny_policy(11)
  tokens = jax.random.randint(jax.random.PRNGKey(4), (3, 14), 0, cfg.vocab_size)

  def loss(p, chunk):
    logp, ent = sampling.token_logprobs(graphdef, p, tokens, 0.8, chunk)
    return jnp.sum(logp) + 0.5 * jnp.sum(ent), (logp, ent)

  fn = jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=1)
  return graphdef, params, tokens, loss, fn


@pytest.mark.parametrize("chunk", [1, 4, 6])
def test_chunked_logprobs_equal_unchunked_under_jit(chunk_setup, chunk):
  """Chunks of 1, 4 (13 targets: last chunk padded) and 6 positions give the
  unchunked log-probs, entropies and gradients within 1e-5."""
  _, params, _, _, fn = chunk_setup
  (v0, (lp0, e0)), g0 = fn(params, 0)
  (v1, (lp1, e1)), g1 = fn(params, chunk)
  np.testing.assert_allclose(lp1, lp0, atol=1e-5, rtol=0)
  np.testing.assert_allclose(e1, e0, atol=1e-5, rtol=0)
  np.testing.assert_allclose(v1, v0, rtol=1e-6)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5),
               g1, g0)
  # Entropy of a V-way distribution lies in [0, log V].
  assert (np.asarray(e1) >= 0).all() and (np.asarray(e1) <= np.log(265) + 1e-5).all()


def _avals(jaxpr):
  for eqn in jaxpr.eqns:
    for v in eqn.outvars:
      yield v.aval
    for p in eqn.params.values():
      for sub in (p if isinstance(p, (list, tuple)) else [p]):
        inner = getattr(sub, "jaxpr", sub)
        if hasattr(inner, "eqns"):
          yield from _avals(inner)


def test_chunked_logprobs_never_materialise_batch_length_vocab(chunk_setup):
  """No array in the forward or backward program holds more than one chunk of
  logits: every array with a vocabulary axis is at most [B, chunk, V]."""
  _, params, _, loss, _ = chunk_setup
  v = 265
  def biggest_vocab_array(chunk):
    jaxpr = jax.make_jaxpr(jax.grad(lambda p: loss(p, chunk)[0]))(params).jaxpr
    return max(a.size for a in _avals(jaxpr)
               if hasattr(a, "shape") and v in a.shape and len(a.shape) >= 2
               and a.shape != (32, v) and a.shape != (v, 32))
  assert biggest_vocab_array(0) == 3 * 13 * v
  assert biggest_vocab_array(4) == 3 * 4 * v


def test_logprob_and_entropy_by_hand():
  logits = jnp.log(jnp.array([[[0.5, 0.25, 0.25], [0.1, 0.1, 0.8]]]))
  logp, ent = sampling.logprob_and_entropy(logits, jnp.array([[0, 2]]), 1.0)
  np.testing.assert_allclose(logp, np.log([[0.5, 0.8]]), rtol=1e-6)
  np.testing.assert_allclose(
      ent, [[1.5 * np.log(2), -(0.2 * np.log(0.1) + 0.8 * np.log(0.8))]], rtol=1e-6)
  # T = 0.5 squares the probabilities before renormalising: [0.25, .0625, .0625]/.375.
  logp, _ = sampling.logprob_and_entropy(logits, jnp.array([[0, 2]]), 0.5)
  np.testing.assert_allclose(logp[0, 0], np.log(0.25 / 0.375), rtol=1e-6)
