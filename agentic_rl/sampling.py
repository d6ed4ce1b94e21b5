"""Jitted KV-cache sampling that returns each sampled token's behaviour log-prob.

The policy is used functionally: `graphdef, params = nnx.split(model, nnx.Param)`;
every function here takes (graphdef, params) and is pure, so it can be jitted,
vmapped over seeds and sharded. Log-probs are always computed in float32 under the
sampling temperature: logp = log_softmax(logits / T)[token]. With T == 0 (greedy) the
argmax is taken and the recorded log-prob is that of the temperature-1 distribution.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from agentic_rl.models import transformer


def apply_model(
    graphdef: nnx.GraphDef,
    params: Any,
    tokens_bt: jax.Array,
    positions_bt: jax.Array | None = None,
    cache: transformer.KVCache | None = None,
) -> tuple[jax.Array, transformer.KVCache | None]:
  """Pure forward pass of the policy: returns (logits [B, T, V] f32, cache)."""
  model = nnx.merge(graphdef, params)
  return model(tokens_bt, positions_bt, cache)


def extend(
    graphdef: nnx.GraphDef,
    params: Any,
    cache: transformer.KVCache,
    tokens_bt: jax.Array,
    start_b: jax.Array,
    length_b: jax.Array,
) -> tuple[jax.Array, transformer.KVCache]:
  """Appends a chunk of tokens to each row's cache (prefill, decode or observation).

  Row b's tokens `tokens_bt[b, :length_b[b]]` are placed at positions
  `start_b[b] .. start_b[b] + length_b[b] - 1`. Entries past a row's length are also
  written (at later positions) but are never attended to: they lie beyond the row's
  current end and are overwritten before that position becomes visible.

  Args:
    graphdef, params: the policy (nnx.split).
    cache: KV cache from `transformer.init_cache`.
    tokens_bt: [B, T] int32 chunk.
    start_b: [B] int32 position of each row's first chunk token.
    length_b: [B] int32 number of real tokens per row, in [0, T].

  Returns:
    (logits [B, V] float32 predicting the token after each row's last real chunk
     token (for rows with length 0 the value is meaningless and must be ignored by
     the caller), updated cache).
  """
  t = tokens_bt.shape[1]
  positions_bt = start_b[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]
  logits_btv, cache = apply_model(graphdef, params, tokens_bt, positions_bt, cache)
  last_b = jnp.clip(length_b - 1, 0, t - 1)
  logits_bv = jnp.take_along_axis(logits_btv, last_b[:, None, None], axis=1)[:, 0]
  return logits_bv, cache


def sample_token(
    key: jax.Array, logits_bv: jax.Array, temperature: float | jax.Array
) -> tuple[jax.Array, jax.Array]:
  """Samples one token per row and returns its log-prob under the temperature.

  Args:
    key: PRNG key.
    logits_bv: [B, V] float32 logits.
    temperature: scalar >= 0 (python float or traced, so one compiled sampler
      serves greedy and sampled decoding); 0 means greedy (argmax).

  Returns:
    (tokens [B] int32, logprob [B] float32 = log_softmax(logits / T)[token];
     for T == 0 the temperature-1 log-prob of the argmax).
  """
  temperature = jnp.asarray(temperature, jnp.float32)
  greedy = temperature <= 0.0
  safe_t = jnp.where(greedy, 1.0, temperature)
  logp_bv = jax.nn.log_softmax(logits_bv.astype(jnp.float32) / safe_t, axis=-1)
  sampled = jax.random.categorical(key, logp_bv, axis=-1)
  tokens = jnp.where(greedy, jnp.argmax(logp_bv, axis=-1), sampled).astype(jnp.int32)
  logprob = jnp.take_along_axis(logp_bv, tokens[:, None], axis=-1)[:, 0]
  return tokens, logprob


def token_logprobs(
    graphdef: nnx.GraphDef,
    params: Any,
    tokens_bl: jax.Array,
    temperature: float = 1.0,
) -> tuple[jax.Array, jax.Array]:
  """Teacher-forced log-probs (and entropies) of every token given its prefix.

  This is the trainer's view of the same model function the sampler uses.

  Args:
    graphdef, params: the policy.
    tokens_bl: [B, L] int32 trajectories (contiguous from position 0).
    temperature: the sampling temperature (> 0) the behaviour log-probs used.

  Returns:
    (logprob [B, L] float32 with logprob[:, t] = log p(tokens[:, t] | tokens[:, :t])
     and logprob[:, 0] = 0; entropy [B, L] float32 of the predictive distribution
     for position t, 0 at t = 0).
  """
  logits_blv, _ = apply_model(graphdef, params, tokens_bl[:, :-1])
  logp_blv = jax.nn.log_softmax(logits_blv.astype(jnp.float32) / temperature, -1)
  logp_bl = jnp.take_along_axis(logp_blv, tokens_bl[:, 1:, None], axis=-1)[..., 0]
  entropy_bl = -jnp.sum(jnp.exp(logp_blv) * logp_blv, axis=-1)
  pad = jnp.zeros((tokens_bl.shape[0], 1), jnp.float32)
  return (
      jnp.concatenate([pad, logp_bl], axis=1),
      jnp.concatenate([pad, entropy_bl], axis=1),
  )
