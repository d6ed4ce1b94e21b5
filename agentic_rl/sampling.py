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

from agentic_rl import sharding
from agentic_rl.models import lora
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
    cache_prefix: transformer.CachePrefix | None = None,
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
    cache_prefix: optional `transformer.CachePrefix`: the cache's first
      entries are a group's shared prompt (`rollout.init_state` with a
      `SharedPrefix`), read once per group while its flag says so.

  The attention reads only the cache prefix that holds every row's real
  tokens (length buckets, `transformer.decode_buckets`): rows with length 0
  do not count, so a decode step costs what the longest active row needs.

  Returns:
    (logits [B, V] float32 predicting the token after each row's last real chunk
     token (for rows with length 0 the value is meaningless and must be ignored by
     the caller), updated cache). Under an ambient mesh (`jax.set_mesh`) the
     cache is pinned to `sharding.cache_spec`: rows over ('data', 'fsdp'), kv
     heads over 'tensor' (each when divisible).
  """
  t = tokens_bt.shape[1]
  positions_bt = start_b[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]
  model = nnx.merge(graphdef, params)
  # On a mesh, the cache's [B, G, ...] stays on (('data', 'fsdp'), 'tensor')
  # (sharding.cache_spec) through every decode step; no-op without a mesh.
  cache = sharding.constrain_cache(cache)
  # Cache entries any real token may read: [0, max over rows of start + length).
  kv_len = jnp.maximum(
      jnp.max(jnp.where(length_b > 0, start_b + length_b, 0)), 1
  )
  hidden_btd, cache = model.hidden_states(
      tokens_bt,
      positions_bt,
      cache,
      kv_len=kv_len,
      cache_prefix=cache_prefix,
  )
  cache = sharding.constrain_cache(cache)
  last_b = jnp.clip(length_b - 1, 0, t - 1)
  # Only the last real position is projected to the vocabulary (no [B, T, V]).
  hidden_bd = jnp.take_along_axis(hidden_btd, last_b[:, None, None], axis=1)[
      :, 0
  ]
  return model.logits(hidden_bd), cache


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
  # lax.cond runs one branch: greedy decoding draws nothing; sampling draws
  # one uniform per row (inverse CDF), not Gumbel noise over all V entries,
  # whose threefry bits cost ~15x the arg-max on CPU (49k-entry vocab).
  tokens = jax.lax.cond(
      greedy,
      lambda: first_argmax(logp_bv),
      lambda: inverse_cdf_sample(key, jnp.exp(logp_bv)),
  )
  logprob = jnp.take_along_axis(logp_bv, tokens[:, None], axis=-1)[:, 0]
  return tokens, logprob


def first_argmax(x_bv: jax.Array) -> jax.Array:
  """jnp.argmax over the last axis (first index of the maximum), [B, V] -> [B]
  int32, as two plain reductions (max, then min index attaining it): XLA:CPU
  runs them vectorised, unlike argmax's (value, index) reduction (measured
  ~2-3x slower at V = 49,152)."""
  v = x_bv.shape[-1]
  m_b = jnp.max(x_bv, axis=-1, keepdims=True)
  idx = jnp.where(x_bv == m_b, jnp.arange(v, dtype=jnp.int32), v)
  # (A row of NaNs has no maximum: index V - 1 rather than out of range.)
  return jnp.minimum(jnp.min(idx, axis=-1), v - 1).astype(jnp.int32)


def _first_positive_above(
    cdf_bn: jax.Array, p_bn: jax.Array, target_b: jax.Array
) -> jax.Array:
  """Per row, the first n with cdf[n] > target and p[n] > 0 ([B] int32).

  Requiring p > 0 keeps zero-probability entries (masked tokens) unreachable
  even where a float prefix sum is not monotone. If no entry qualifies (only
  possible through rounding when target is at the very top), the last entry
  with p > 0.
  """
  n = p_bn.shape[-1]
  pos = p_bn > 0
  hit = (cdf_bn > target_b[:, None]) & pos
  first = jnp.argmax(hit, axis=-1)
  last_pos = n - 1 - jnp.argmax(pos[:, ::-1], axis=-1)
  return jnp.where(jnp.any(hit, axis=-1), first, last_pos).astype(jnp.int32)


def inverse_cdf_sample(
    key: jax.Array, probs_bv: jax.Array, block: int = 256
) -> jax.Array:
  """One categorical draw per row from one uniform per row (inverse CDF).

  Draw u ~ U[0, 1) per row and return the first token whose cumulative
  probability exceeds u * sum(p) (the inverse-transform method, e.g. Devroye
  1986, "Non-Uniform Random Variate Generation", ch. II.2): P(token = v) =
  p_v / sum(p), the categorical distribution itself, with one random number
  per row instead of V Gumbel variates. Two levels keep the prefix sums
  short: the vocabulary is cut into blocks of `block` entries, a block is
  chosen by the cumulative block masses, then a token inside it by the
  cumulative masses within the block (the remainder of the same uniform).
  Tokens with probability exactly 0 (masked logits) are never returned.

  Args:
    key: PRNG key.
    probs_bv: [B, V] float32 non-negative weights (need not sum to 1), at
      least one positive per row.
    block: entries per block (static, > 0).

  Returns:
    [B] int32 token ids.
  """
  b, v = probs_bv.shape
  p_bv = probs_bv.astype(jnp.float32)
  nb = -(-v // block)
  p_bnc = jnp.pad(p_bv, ((0, 0), (0, nb * block - v))).reshape(b, nb, block)
  mass_bn = jnp.sum(p_bnc, axis=-1)
  cdf_bn = jnp.cumsum(mass_bn, axis=-1)
  total_b = cdf_bn[:, -1]
  u_b = jax.random.uniform(key, (b,), jnp.float32)
  target_b = u_b * total_b
  blk_b = _first_positive_above(cdf_bn, mass_bn, target_b)
  # The remainder of the uniform inside the chosen block, in [0, its mass).
  take = lambda x_bn: jnp.take_along_axis(x_bn, blk_b[:, None], axis=1)[:, 0]
  rest_b = target_b - (take(cdf_bn) - take(mass_bn))
  p_bc = jnp.take_along_axis(p_bnc, blk_b[:, None, None], axis=1)[:, 0]
  within_b = _first_positive_above(jnp.cumsum(p_bc, axis=-1), p_bc, rest_b)
  return blk_b * block + within_b


def logprob_and_entropy(
    logits_btv: jax.Array, targets_bt: jax.Array, temperature: float | jax.Array
) -> tuple[jax.Array, jax.Array]:
  """Log-prob of each target token and entropy of its predictive distribution.

  logp_t = log_softmax(z_t / T)[y_t],  H_t = -sum_v p_t(v) log p_t(v), with
  p_t = softmax(z_t / T); computed in float32 whatever the logits dtype.

  Args:
    logits_btv: [B, T, V] logits (any float dtype).
    targets_bt: [B, T] int32 token ids in [0, V).
    temperature: scalar > 0.

  Returns:
    (logprob [B, T] float32, entropy [B, T] float32 in nats).
  """
  logp_b1t, entropy_bt = _grouped_logprob_and_entropy(
      logits_btv, targets_bt[:, None], temperature
  )
  return logp_b1t[:, 0], entropy_bt


def _grouped_logprob_and_entropy(
    logits_ntv: jax.Array, targets_ngt: jax.Array, temperature
) -> tuple[jax.Array, jax.Array]:
  """`logprob_and_entropy` of logits shared by groups of rows: logits [N, T,
  V] once per group, targets [N, G, T] per row; returns (logprob [N, G, T],
  entropy [N, T]), the log-softmax computed once per group."""
  logp_ntv = jax.nn.log_softmax(
      logits_ntv.astype(jnp.float32) / temperature, -1
  )
  logp_ngt = jnp.take_along_axis(
      logp_ntv[:, None], targets_ngt[..., None], axis=-1
  )[..., 0]
  entropy_nt = -jnp.sum(jnp.exp(logp_ntv) * logp_ntv, axis=-1)
  return logp_ngt, entropy_nt


def chunked_logprob_and_entropy(
    hidden_btd: jax.Array,
    w_dv: jax.Array,
    targets_bt: jax.Array,
    temperature: float | jax.Array,
    chunk_size: int,
    group: int = 1,
) -> tuple[jax.Array, jax.Array]:
  """`logprob_and_entropy` of logits = hidden @ w_dv, chunk by chunk over time.

  The sequence is cut into chunks of `chunk_size` positions (the last one
  zero-padded); `lax.map` projects one chunk at a time to the vocabulary under
  `jax.checkpoint`, so neither the forward nor the backward pass holds more
  than a [B, chunk_size, V] logits array (never [B, T, V]).

  Args:
    hidden_btd: [B, T, D] final hidden states (model.hidden_states); with
      `group` > 1, [B / group, T, D]: one row per group of `group`
      consecutive target rows (a shared prefix,
      `Transformer.shared_prefix_streams`).
    w_dv: [D, V] output layer (model.output_weights_dv()).
    targets_bt: [B, T] int32 token ids.
    temperature: scalar > 0.
    chunk_size: positions per chunk; <= 0 or >= T computes all at once.
    group: target rows per hidden row. The vocabulary projection and the
      log-softmax run once per hidden row; each target row gathers its own
      token's log-prob (row b reads hidden row b // group) and the entropy is
      repeated over the group.

  Returns:
    (logprob [B, T] float32, entropy [B, T] float32), equal to the unchunked
    computation up to float rounding.

  Raises:
    ValueError: the target rows are not `group` times the hidden rows.
  """
  hidden_ntd, g = hidden_btd, group  # n = B / group hidden rows
  n, t, d = hidden_ntd.shape
  b = targets_bt.shape[0]
  if b != n * g:
    raise ValueError(
        f"group {g}: {b} target rows for {n} hidden rows (need {n * g})"
    )
  y_ngt = targets_bt.reshape(n, g, t)
  if chunk_size <= 0 or chunk_size >= t:
    logp_ngt, entropy_nt = _grouped_logprob_and_entropy(
        transformer.vocab_logits(hidden_ntd, w_dv), y_ngt, temperature
    )
    return logp_ngt.reshape(b, t), jnp.repeat(entropy_nt, g, axis=0)
  c = chunk_size
  k = -(-t // c)
  pad = k * c - t
  h_kncd = (
      jnp.pad(hidden_ntd, ((0, 0), (0, pad), (0, 0)))
      .reshape(n, k, c, d)
      .swapaxes(0, 1)
  )
  y_kngc = jnp.moveaxis(
      jnp.pad(y_ngt, ((0, 0), (0, 0), (0, pad))).reshape(n, g, k, c), 2, 0
  )

  @jax.checkpoint
  def one_chunk(h_ncd, y_ngc, w):
    return _grouped_logprob_and_entropy(
        transformer.vocab_logits(h_ncd, w), y_ngc, temperature
    )

  logp_kngc, entropy_knc = jax.lax.map(
      lambda a: one_chunk(a[0], a[1], w_dv), (h_kncd, y_kngc)
  )
  logp_bt = jnp.moveaxis(logp_kngc, 0, 2).reshape(b, k * c)[:, :t]
  entropy_nt = entropy_knc.swapaxes(0, 1).reshape(n, k * c)[:, :t]
  return logp_bt, jnp.repeat(entropy_nt, g, axis=0)


def shared_prefix_logprob_and_entropy(
    model: transformer.Transformer,
    context_bt: jax.Array,
    targets_bt: jax.Array,
    temperature: float | jax.Array,
    chunk_size: int,
    shared_prefix: transformer.SharedPrefix | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Teacher-forced log-probs, with a shared prefix its vocabulary projection
  once per group: the one forward `token_logprobs` and the learner's
  `policy_forward` both run.

  `model.shared_prefix_streams(context_bt, shared_prefix)` gives the prefix
  positions once per group and the rest per row; the prefix positions are
  projected to the vocabulary (and log-softmaxed) once per group too, each
  row gathering its own target there, so no [B, S, V] logits are formed
  (Prefix Grouper's shared-prefix computation, arXiv:2506.05433, carried to
  the output layer). Same values as `chunked_logprob_and_entropy` of
  `model.hidden_states(context_bt, shared_prefix=...)` up to float rounding.

  Args:
    model: the Transformer (nnx.merge'd).
    context_bt: [B, T] int32 tokens read (rows in groups sharing their
      first `shared_prefix.length` tokens).
    targets_bt: [B, T] int32 tokens scored: logprob[:, t] = log p(targets[:,
      t] | context[:, :t + 1]).
    temperature: scalar > 0.
    chunk_size: positions per vocabulary chunk (`chunked_logprob_and_entropy`),
      in each stream.
    shared_prefix: the `transformer.SharedPrefix`; None or length 0 shares
      nothing (the plain forward, any batch size).

  Returns:
    (logprob [B, T] float32, entropy [B, T] float32, hidden [B, T, D] final
     hidden states, the prefix repeated over each group; unused outputs cost
     nothing under jit).
  """
  if shared_prefix is None or not shared_prefix.length:  # the plain forward
    hidden_btd, _ = model.hidden_states(context_bt)
    logp_bt, entropy_bt = chunked_logprob_and_entropy(
        hidden_btd,
        model.output_weights_dv(),
        targets_bt,
        temperature,
        chunk_size,
    )
    return logp_bt, entropy_bt, hidden_btd
  hp_nsd, hs_btd = model.shared_prefix_streams(context_bt, shared_prefix)
  g = shared_prefix.group
  s = hp_nsd.shape[1]
  w_dv = model.output_weights_dv()
  parts = [
      chunked_logprob_and_entropy(
          hp_nsd, w_dv, targets_bt[:, :s], temperature, chunk_size, group=g
      )
  ]
  if hs_btd.shape[1]:
    parts.append(
        chunked_logprob_and_entropy(
            hs_btd, w_dv, targets_bt[:, s:], temperature, chunk_size
        )
    )
  logp_bt, entropy_bt = (
      jnp.concatenate([part[i] for part in parts], axis=1) for i in (0, 1)
  )
  hidden_btd = jnp.concatenate([jnp.repeat(hp_nsd, g, axis=0), hs_btd], axis=1)
  return logp_bt, entropy_bt, hidden_btd


def token_logprobs(
    graphdef: nnx.GraphDef,
    params: Any,
    tokens_bl: jax.Array,
    temperature: float | jax.Array = 1.0,
    chunk_size: int | None = None,
    dropout_key: jax.Array | None = None,
    shared_prefix: transformer.SharedPrefix | None = None,
) -> tuple[jax.Array, jax.Array]:
  """Teacher-forced log-probs (and entropies) of every token given its prefix.

  This is the trainer's view of the same model function the sampler uses.
  Log-probs are float32 under the sampling temperature:
  logprob[:, t] = log_softmax(logits_{t-1} / T)[tokens[:, t]].

  Args:
    graphdef, params: the policy.
    tokens_bl: [B, L] int32 trajectories (contiguous from position 0).
    temperature: the sampling temperature (> 0) the behaviour log-probs used.
    chunk_size: sequence positions projected to the vocabulary at a time
      (chunked_logprob_and_entropy); None = the model config's
      `logprob_chunk_size` (0 = all at once).
    dropout_key: PRNG key turning LoRA adapter dropout on for this forward
      (`models.lora.set_dropout_key`; only the training loss passes one);
      None = deterministic. Without adapters or with dropout 0 it changes
      nothing.
    shared_prefix: optional `transformer.SharedPrefix`: rows in groups whose
      first `length` tokens are equal, computed once per group, their
      vocabulary projection included (`shared_prefix_logprob_and_entropy`);
      same results up to float summation order.

  Returns:
    (logprob [B, L] float32 with logprob[:, t] = log p(tokens[:, t] | tokens[:, :t])
     and logprob[:, 0] = 0; entropy [B, L] float32 of the predictive distribution
     for position t, 0 at t = 0).
  """
  model = nnx.merge(graphdef, params)
  if dropout_key is not None:
    lora.set_dropout_key(model, dropout_key)
  if chunk_size is None:
    chunk_size = model.cfg.logprob_chunk_size
  logp_bl, entropy_bl, _ = shared_prefix_logprob_and_entropy(
      model,
      tokens_bl[:, :-1],
      tokens_bl[:, 1:],
      temperature,
      chunk_size,
      shared_prefix,
  )
  pad = jnp.zeros((tokens_bl.shape[0], 1), jnp.float32)
  return (
      jnp.concatenate([pad, logp_bl], axis=1),
      jnp.concatenate([pad, entropy_bl], axis=1),
  )


def token_entropy(
    graphdef: nnx.GraphDef,
    params: Any,
    tokens_bl: jax.Array,
    temperature: float | jax.Array = 1.0,
    chunk_size: int | None = None,
) -> jax.Array:
  """Entropy [B, L] float32 (nats) of the policy's predictive distribution at
  each position t given tokens[:, :t] (0 at t = 0); see `token_logprobs`."""
  return token_logprobs(graphdef, params, tokens_bl, temperature, chunk_size)[1]
