"""Decoder-only transformer (Llama-style): RoPE, RMSNorm, SwiGLU, untied LM head.

The same `Transformer.__call__` serves teacher-forced training (no cache) and KV-cache
decoding/prefill (cache given): both compute identical math for each position, which
is what makes sampler and trainer log-probs agree (tests/test_sampling.py).

KV cache layout: per layer a dict with 'k' and 'v' of shape [B, H, S, Dh]
(batch, heads, cache length, head dim); measured 2.6-2.9x faster to sample on CPU than
[B, S, H, Dh].
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

KVCache = list[dict[str, jax.Array]]


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
  """Shape of the decoder.

  Attributes:
    vocab_size: number of token ids V.
    d_model: residual width D.
    num_layers: number of blocks.
    num_heads: attention heads H (query = key/value heads here).
    head_dim: per-head width Dh.
    ffn_dim: SwiGLU hidden width F.
    rope_theta: RoPE base frequency (Su et al. 2021, arXiv:2104.09864).
    norm_eps: RMSNorm epsilon (Zhang & Sennrich 2019, arXiv:1910.07467).
  """

  vocab_size: int = 265
  d_model: int = 128
  num_layers: int = 4
  num_heads: int = 4
  head_dim: int = 32
  ffn_dim: int = 384
  rope_theta: float = 10_000.0
  norm_eps: float = 1e-6


def rope(x_bthd: jax.Array, positions_bt: jax.Array, theta: float) -> jax.Array:
  """Rotary position embedding (rotate-half form), arXiv:2104.09864.

  Args:
    x_bthd: [B, T, H, Dh] float32 queries or keys; Dh even.
    positions_bt: [B, T] int32 absolute positions.
    theta: base frequency.

  Returns:
    [B, T, H, Dh] rotated array, same dtype as x.
  """
  half = x_bthd.shape[-1] // 2
  freq_h = theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
  angle_bth = positions_bt.astype(jnp.float32)[..., None] * freq_h
  sin = jnp.sin(angle_bth)[:, :, None, :]
  cos = jnp.cos(angle_bth)[:, :, None, :]
  x1, x2 = x_bthd[..., :half], x_bthd[..., half:]
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


class RMSNorm(nnx.Module):
  """y = x / sqrt(mean(x^2) + eps) * scale (arXiv:1910.07467)."""

  def __init__(self, dim: int, eps: float):
    self.scale = nnx.Param(jnp.ones((dim,), jnp.float32))
    self.eps = eps

  def __call__(self, x: jax.Array) -> jax.Array:
    var = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
    return x * jax.lax.rsqrt(var + self.eps) * self.scale[...]


class Attention(nnx.Module):
  """Causal multi-head attention with RoPE and an optional KV cache."""

  def __init__(self, cfg: TransformerConfig, rngs: nnx.Rngs):
    d, h, dh = cfg.d_model, cfg.num_heads, cfg.head_dim
    init = nnx.initializers.normal(d**-0.5)
    self.q_dhk = nnx.Param(init(rngs.params(), (d, h, dh)))
    self.k_dhk = nnx.Param(init(rngs.params(), (d, h, dh)))
    self.v_dhk = nnx.Param(init(rngs.params(), (d, h, dh)))
    self.o_hkd = nnx.Param(
        nnx.initializers.normal((h * dh) ** -0.5 / (2 * cfg.num_layers) ** 0.5)(
            rngs.params(), (h, dh, d)
        )
    )
    self.cfg = cfg

  def __call__(
      self,
      x_btd: jax.Array,
      positions_bt: jax.Array,
      cache: dict[str, jax.Array] | None,
  ) -> tuple[jax.Array, dict[str, jax.Array] | None]:
    cfg = self.cfg
    q = jnp.einsum("btd,dhk->bthk", x_btd, self.q_dhk[...])
    k = jnp.einsum("btd,dhk->bthk", x_btd, self.k_dhk[...])
    v = jnp.einsum("btd,dhk->bthk", x_btd, self.v_dhk[...])
    q = rope(q, positions_bt, cfg.rope_theta)
    k = rope(k, positions_bt, cfg.rope_theta)
    if cache is None:
      keys_bhsk = k.transpose(0, 2, 1, 3)
      values_bhsk = v.transpose(0, 2, 1, 3)
      key_pos_bs = positions_bt
      new_cache = None
    else:
      # Write this chunk's keys/values at each row's own positions; positions past
      # the cache end are dropped (the rollout marks such rows TRUNCATED).
      b_idx = jnp.broadcast_to(
          jnp.arange(x_btd.shape[0])[:, None], positions_bt.shape
      )
      keys_bhsk = cache["k"].at[b_idx, :, positions_bt].set(k, mode="drop")
      values_bhsk = cache["v"].at[b_idx, :, positions_bt].set(v, mode="drop")
      s = keys_bhsk.shape[2]
      key_pos_bs = jnp.broadcast_to(jnp.arange(s)[None, :], (x_btd.shape[0], s))
      new_cache = {"k": keys_bhsk, "v": values_bhsk}
    scores_bhts = jnp.einsum(
        "bthk,bhsk->bhts", q, keys_bhsk
    ) * cfg.head_dim ** -0.5
    # Causal mask by absolute position; with a cache this also hides stale entries
    # beyond each row's current position.
    mask_bts = key_pos_bs[:, None, :] <= positions_bt[:, :, None]
    scores_bhts = jnp.where(mask_bts[:, None], scores_bhts, -1e30)
    probs_bhts = jax.nn.softmax(scores_bhts.astype(jnp.float32), axis=-1)
    out_bthk = jnp.einsum("bhts,bhsk->bthk", probs_bhts, values_bhsk)
    return jnp.einsum("bthk,hkd->btd", out_bthk, self.o_hkd[...]), new_cache


class SwiGLU(nnx.Module):
  """FFN(x) = W_down(silu(W_gate x) * W_up x) (Shazeer 2020, arXiv:2002.05202)."""

  def __init__(self, cfg: TransformerConfig, rngs: nnx.Rngs):
    d, f = cfg.d_model, cfg.ffn_dim
    self.gate_df = nnx.Param(nnx.initializers.normal(d**-0.5)(rngs.params(), (d, f)))
    self.up_df = nnx.Param(nnx.initializers.normal(d**-0.5)(rngs.params(), (d, f)))
    self.down_fd = nnx.Param(
        nnx.initializers.normal(f**-0.5 / (2 * cfg.num_layers) ** 0.5)(
            rngs.params(), (f, d)
        )
    )

  def __call__(self, x_btd: jax.Array) -> jax.Array:
    gate = jax.nn.silu(x_btd @ self.gate_df[...])
    return (gate * (x_btd @ self.up_df[...])) @ self.down_fd[...]


class Block(nnx.Module):
  """Pre-norm residual block: x + Attn(norm(x)), then x + FFN(norm(x))."""

  def __init__(self, cfg: TransformerConfig, rngs: nnx.Rngs):
    self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
    self.attn = Attention(cfg, rngs)
    self.ffn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
    self.ffn = SwiGLU(cfg, rngs)

  def __call__(self, x, positions_bt, cache):
    h, cache = self.attn(self.attn_norm(x), positions_bt, cache)
    x = x + h
    return x + self.ffn(self.ffn_norm(x)), cache


class Transformer(nnx.Module):
  """Decoder-only language model returning next-token logits."""

  def __init__(self, cfg: TransformerConfig, rngs: nnx.Rngs):
    self.cfg = cfg
    self.embed_vd = nnx.Param(
        nnx.initializers.normal(1.0)(rngs.params(), (cfg.vocab_size, cfg.d_model))
    )
    self.blocks = nnx.List([Block(cfg, rngs) for _ in range(cfg.num_layers)])
    self.final_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
    self.lm_head_dv = nnx.Param(
        nnx.initializers.normal(cfg.d_model**-0.5)(
            rngs.params(), (cfg.d_model, cfg.vocab_size)
        )
    )

  def __call__(
      self,
      tokens_bt: jax.Array,
      positions_bt: jax.Array | None = None,
      cache: KVCache | None = None,
  ) -> tuple[jax.Array, KVCache | None]:
    """Next-token logits.

    Args:
      tokens_bt: [B, T] int32 token ids.
      positions_bt: [B, T] int32 absolute positions; defaults to arange(T).
        With a cache, each row's chunk is written at these positions.
      cache: optional KV cache (see `init_cache`); if None, plain causal attention
        over this chunk.

    Returns:
      (logits [B, T, V] float32, updated cache or None).
    """
    b, t = tokens_bt.shape
    if positions_bt is None:
      positions_bt = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    x = jnp.take(self.embed_vd[...], tokens_bt, axis=0)
    new_cache = [] if cache is not None else None
    for i, block in enumerate(self.blocks):
      x, layer_cache = block(x, positions_bt, None if cache is None else cache[i])
      if new_cache is not None:
        new_cache.append(layer_cache)
    x = self.final_norm(x)
    logits = (x @ self.lm_head_dv[...]).astype(jnp.float32)
    return logits, new_cache


def init_cache(cfg: TransformerConfig, batch: int, length: int) -> KVCache:
  """Zero KV cache: per layer {'k', 'v'} of shape [batch, H, length, Dh] float32."""
  shape = (batch, cfg.num_heads, length, cfg.head_dim)
  return [
      {"k": jnp.zeros(shape, jnp.float32), "v": jnp.zeros(shape, jnp.float32)}
      for _ in range(cfg.num_layers)
  ]


def count_params(params: Any) -> int:
  """Number of scalar parameters in a pytree."""
  return int(sum(x.size for x in jax.tree.leaves(params)))
