"""Decoder-only transformer of the Llama / Qwen2 family.

One module covers both families (and our own tiny presets): grouped-query
attention (Ainslie et al. 2023, arXiv:2305.13245), rotary position embeddings
(Su et al. 2021, arXiv:2104.09864) with optional Llama-3 frequency scaling,
RMSNorm (Zhang & Sennrich 2019, arXiv:1910.07467), SwiGLU feed-forward (Shazeer
2020, arXiv:2002.05202), optional query/key/value biases (Qwen2), tied or untied
embeddings, a dtype policy and optional rematerialisation per block.

The same forward serves teacher-forced training (no cache) and KV-cache
decoding/prefill (cache given): both compute identical math for each position,
which is what makes sampler and trainer log-probs agree (tests/test_sampling.py).

KV cache layout: per layer a dict with values 'v' of shape [B, G, S, Dh]
(batch, kv heads, cache length, head dim) and keys 'k' transposed, [B, G, Dh, S],
in the compute dtype; [B, G, S, Dh] measured 2.6-2.9x faster to sample on CPU
than [B, S, G, Dh], and the transposed keys halve the decode's score product
(`init_cache`).

Parameter naming contract (sharding rules and the Hugging Face mapping rely on
it): every parameter name ends with `_<axes>`, one letter per array axis, in
order:

  d = d_model (residual width)      h = query heads     g = key/value heads
  k = head_dim                      f = ffn hidden      v = vocabulary

  embed_vd [V, D]        token embedding (also the output layer when tied)
  lm_head_dv [D, V]      output layer (absent when tie_embeddings)
  blocks[i].attn.q_dhk [D, H, Dh], .k_dgk [D, G, Dh], .v_dgk [D, G, Dh],
                 .o_hkd [H, Dh, D]
  blocks[i].attn.q_bias_hk [H, Dh], .k_bias_gk [G, Dh], .v_bias_gk [G, Dh]
                 (only with qkv_bias)
  blocks[i].ffn.gate_df [D, F], .up_df [D, F], .down_fd [F, D]
  value_head_d [D], reward_head_d [D]   scalar heads (only when enabled)

The one exception is RMSNorm's `scale` [D] (blocks[i].attn_norm, .ffn_norm,
final_norm), a vector over d_model.

Dtype policy: parameters are stored in `param_dtype`; every matmul runs in the
compute `dtype` (parameters are cast at use); RMSNorm statistics, attention
softmax, logits and log-softmax are float32, and the two matmuls that feed a
softmax (attention scores, LM-head logits) accumulate and return float32
(`preferred_element_type`), so no log-prob is computed from bf16-rounded
logits. Training with `param_dtype='bfloat16'` keeps a float32 master copy
of the parameters in the optimizer state (agentic_rl/mixed_precision.py).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from agentic_rl import sharding
from agentic_rl.models import attention as attention_lib
from agentic_rl.models import lora as lora_lib

KVCache = list[dict[str, jax.Array]]

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
ROPE_SCALINGS = ("none", "llama3")


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
  """Shape and numerics of the decoder.

  Attributes:
    vocab_size: number of token ids V.
    d_model: residual width D.
    num_layers: number of blocks.
    num_heads: query heads H.
    head_dim: per-head width Dh (even, for RoPE).
    ffn_dim: SwiGLU hidden width F.
    rope_theta: RoPE base frequency (Su et al. 2021, arXiv:2104.09864).
    norm_eps: RMSNorm epsilon (Zhang & Sennrich 2019, arXiv:1910.07467).
    num_kv_heads: key/value heads G of grouped-query attention
      (arXiv:2305.13245); must divide H. 0 means G = H (multi-head attention).
    qkv_bias: add learned biases to the query, key and value projections
      (Qwen2).
    tie_embeddings: use embed_vd^T as the output layer (no lm_head_dv).
    rope_scaling: 'none' or 'llama3' (Llama 3.1 frequency-dependent scaling of
      the RoPE inverse frequencies, as in Hugging Face transformers'
      `_compute_llama3_parameters`).
    rope_factor: llama3 scaling factor (8 for Llama 3.1, 32 for Llama 3.2).
    rope_low_freq_factor: llama3 low-frequency factor.
    rope_high_freq_factor: llama3 high-frequency factor (> low).
    rope_original_max_positions: llama3 original context length.
    max_positions: longest sequence the checkpoint was trained for
      (informational; exported as max_position_embeddings).
    param_dtype: 'float32' or 'bfloat16'; storage dtype of the parameters.
    dtype: 'float32' or 'bfloat16'; compute dtype of the matmuls and of the
      KV cache. Logits and log-softmax are always float32.
    remat: rematerialise each block in the backward pass (nnx.remat).
    value_head: add a scalar value head `value_head_d`.
    reward_head: add a scalar reward head `reward_head_d`.
    logprob_chunk_size: sequence positions per chunk when computing log-probs
      and entropies (agentic_rl.sampling.token_logprobs), so that a
      [B, L, V] array is never materialised; 0 = the whole sequence at once.
    decode_bucket: smallest length bucket of KV-cache attention
      (`decode_buckets`): a cached step reads only the first 128, 256, 512 ...
      entries of the cache, the smallest power-of-two multiple of this that
      covers the filled part, so decoding cost follows the context length, not
      the buffer length. 0 = always read the whole cache.
    lora: low-rank adapters on the projections (agentic_rl/models/lora.py),
      or None for none.
    attention_impl: attention of a cache-free (training, scoring) forward:
      'chunked' (blocks of `attention_block` positions with an online
      softmax; no [B, H, T, T] array in the forward or backward pass,
      agentic_rl/models/attention.py), 'dense' (the [B, H, T, T] scores at
      once), or 'auto' (dense up to one block, chunked above). The KV-cache
      decode is always dense.
    attention_block: query/key block size in positions of the chunked path.
  """

  vocab_size: int = 265
  d_model: int = 128
  num_layers: int = 4
  num_heads: int = 4
  head_dim: int = 32
  ffn_dim: int = 384
  rope_theta: float = 10_000.0
  norm_eps: float = 1e-6
  num_kv_heads: int = 0
  qkv_bias: bool = False
  tie_embeddings: bool = False
  rope_scaling: str = "none"
  rope_factor: float = 8.0
  rope_low_freq_factor: float = 1.0
  rope_high_freq_factor: float = 4.0
  rope_original_max_positions: int = 8192
  max_positions: int = 4096
  param_dtype: str = "float32"
  dtype: str = "float32"
  remat: bool = False
  value_head: bool = False
  reward_head: bool = False
  logprob_chunk_size: int = 0
  decode_bucket: int = 128
  lora: lora_lib.LoRAConfig | None = None
  attention_impl: str = "auto"
  attention_block: int = 256

  def __post_init__(self):
    def fail(field, why):
      raise ValueError(f"{field}={getattr(self, field)!r}: {why}")

    for f in (
        "vocab_size",
        "d_model",
        "num_layers",
        "num_heads",
        "head_dim",
        "ffn_dim",
        "max_positions",
        "rope_original_max_positions",
        "attention_block",
    ):
      v = getattr(self, f)
      if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        fail(f, "must be a positive integer")
    for f in ("num_kv_heads", "logprob_chunk_size", "decode_bucket"):
      v = getattr(self, f)
      if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        fail(f, "must be an integer >= 0")
    if self.head_dim % 2:
      fail("head_dim", "must be even (RoPE rotates pairs)")
    if self.num_heads % self.kv_heads:
      fail("num_kv_heads", f"must divide num_heads={self.num_heads}")
    if not self.rope_theta > 0:
      fail("rope_theta", "must be > 0")
    if not self.norm_eps > 0:
      fail("norm_eps", "must be > 0")
    for f in ("param_dtype", "dtype"):
      if getattr(self, f) not in DTYPES:
        fail(f, f"unknown; known: {sorted(DTYPES)}")
    if self.rope_scaling not in ROPE_SCALINGS:
      fail("rope_scaling", f"unknown; known: {ROPE_SCALINGS}")
    if self.attention_impl not in attention_lib.IMPLS:
      fail("attention_impl", f"unknown; known: {attention_lib.IMPLS}")
    if self.lora is not None and not isinstance(self.lora, lora_lib.LoRAConfig):
      fail("lora", "must be a lora.LoRAConfig or None")
    if self.rope_scaling == "llama3":
      if not self.rope_factor >= 1:
        fail("rope_factor", "must be >= 1")
      if not 0 < self.rope_low_freq_factor < self.rope_high_freq_factor:
        fail(
            "rope_high_freq_factor",
            f"must exceed rope_low_freq_factor={self.rope_low_freq_factor} > 0",
        )

  @property
  def kv_heads(self) -> int:
    """Key/value heads G (num_kv_heads, or num_heads when that is 0)."""
    return self.num_kv_heads or self.num_heads

  @property
  def compute_dtype(self) -> Any:
    return DTYPES[self.dtype]

  @property
  def params_dtype(self) -> Any:
    return DTYPES[self.param_dtype]


@dataclasses.dataclass(frozen=True)
class SharedPrefix:
  """Rows that come in groups sharing their first tokens (static).

  Rows i*group .. i*group + group - 1 form group i and have equal tokens at
  positions [0, length): the GRPO layout, one prompt repeated for the group's
  samples. `Transformer.hidden_states(..., shared_prefix=...)` then computes
  those positions once per group (arXiv:2506.05433).

  Attributes:
    length: shared positions S >= 0 (0: nothing shared).
    group: rows per group, >= 1.
  """

  length: int
  group: int

  def __post_init__(self):
    if self.length < 0 or self.group < 1:
      raise ValueError(
          f"SharedPrefix(length={self.length}, group={self.group}): length "
          "must be >= 0 and group >= 1"
      )


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["shared"],
    meta_fields=["length", "group"],
)
@dataclasses.dataclass(frozen=True)
class CachePrefix:
  """KV-cache entries that groups of rows share (decode attention).

  Rows i*group .. i*group + group - 1 hold equal cache entries [0, length)
  when `shared` is True: their group's prompt, prefilled once and copied to
  its rows (`rollout.init_state` with a `SharedPrefix`). KV-cache attention
  then reads those entries from each group's first row only
  (`attention.cache_prefix_attention`); when `shared` is False (some row's
  prompt is shorter than `length`, so its own tokens sit below it) every row
  reads its own cache, as without a CachePrefix.

  A pytree whose only leaf is `shared`: passed into a jitted function,
  `length` and `group` stay static.

  Attributes:
    length: static int, the shared entries.
    group: static int >= 1, rows per group.
    shared: bool scalar array (traced).
  """

  length: int
  group: int
  shared: jax.Array


def rope_inv_freq(cfg: TransformerConfig) -> jax.Array:
  """RoPE inverse frequencies theta^(-2i/Dh), i < Dh/2, optionally llama3-scaled.

  Llama 3.1 scaling (as in transformers' `_compute_llama3_parameters`): with
  wavelength w_i = 2 pi / f_i, L = rope_original_max_positions, frequencies with
  w_i > L / low_freq_factor are divided by `factor`, those with
  w_i < L / high_freq_factor are kept, and the ones in between are interpolated
  with s = (L / w_i - low) / (high - low): f_i' = (1 - s) f_i / factor + s f_i.

  Returns:
    [Dh / 2] float32.
  """
  half = cfg.head_dim // 2
  freq_h = cfg.rope_theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
  if cfg.rope_scaling == "llama3":
    factor = cfg.rope_factor
    low, high = cfg.rope_low_freq_factor, cfg.rope_high_freq_factor
    old_len = cfg.rope_original_max_positions
    wavelen = 2 * math.pi / freq_h
    scaled = jnp.where(wavelen > old_len / low, freq_h / factor, freq_h)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    freq_h = jnp.where(medium, smoothed, scaled)
  return freq_h


def rope(
    x_bthd: jax.Array, positions_bt: jax.Array, inv_freq: jax.Array
) -> jax.Array:
  """Rotary position embedding (rotate-half form), arXiv:2104.09864.

  out[..., :Dh/2] = x1 cos - x2 sin, out[..., Dh/2:] = x2 cos + x1 sin with
  angle = position * inv_freq (the layout Hugging Face Llama/Qwen2 use).

  Args:
    x_bthd: [B, T, H, Dh] queries or keys; Dh even.
    positions_bt: [B, T] int32 absolute positions.
    inv_freq: [Dh / 2] float32 (rope_inv_freq).

  Returns:
    [B, T, H, Dh] rotated array, same dtype as x.
  """
  half = x_bthd.shape[-1] // 2
  angle_bth = positions_bt.astype(jnp.float32)[..., None] * inv_freq
  sin = jnp.sin(angle_bth)[:, :, None, :]
  cos = jnp.cos(angle_bth)[:, :, None, :]
  x1, x2 = x_bthd[..., :half], x_bthd[..., half:]
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x_bthd.dtype)


def rope_tables(
    positions_bt: jax.Array, inv_freq: jax.Array
) -> tuple[jax.Array, jax.Array]:
  """sin and cos of the RoPE angles, computed once per forward pass.

  Every layer rotates by the same angles (position * inv_freq), so the model
  computes them once and passes them to each block (`apply_rope`); the
  values are stored, not recomputed inside each layer's rotation.

  Args:
    positions_bt: [B, T] int32 absolute positions.
    inv_freq: [Dh / 2] float32 (rope_inv_freq).

  Returns:
    (sin, cos), each [B, 1, T, Dh / 2] float32 (broadcast over heads).
  """
  angle_bth = positions_bt.astype(jnp.float32)[..., None] * inv_freq
  sin, cos = jnp.sin(angle_bth), jnp.cos(angle_bth)
  # Materialised through a product with the identity (exact: x * 1 plus
  # zeros; HIGHEST keeps TF32 / bf16 passes out of it on GPU / TPU). Left as
  # elementwise values, XLA:CPU fuses the sines and cosines into every
  # layer's query and key rotation, forward and backward, and evaluates them
  # again for each head (an optimization barrier does not stop it: it is
  # expanded before fusion): ~6 ms of a ~65 ms SFT step of the default
  # config (docs/models.md).
  eye = jnp.eye(angle_bth.shape[-1], dtype=jnp.float32)
  sin, cos = (
      jnp.einsum("bth,hk->btk", x, eye, precision=jax.lax.Precision.HIGHEST)
      for x in (sin, cos)
  )
  return sin[:, None], cos[:, None]


def apply_rope(x_bhtk: jax.Array, sin: jax.Array, cos: jax.Array) -> jax.Array:
  """`rope` in the [B, H, T, Dh] layout with precomputed tables (rope_tables).

  Same arithmetic as `rope` (rotate-half, arXiv:2104.09864), element by
  element, so the results are identical.

  Args:
    x_bhtk: [B, H, T, Dh] queries or keys.
    sin, cos: [B, 1, T, Dh / 2] float32 from `rope_tables`.

  Returns:
    [B, H, T, Dh], same dtype as x.
  """
  half = x_bhtk.shape[-1] // 2
  x1, x2 = x_bhtk[..., :half], x_bhtk[..., half:]
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x_bhtk.dtype)


def matmul(
    x: jax.Array, w: jax.Array, spec: str = "...d,df->...f"
) -> jax.Array:
  """Projection `jnp.einsum(spec, x, w)` accumulated in float32, returned in x's dtype.

  The same numbers as a plain product (which accumulates in float32 inside
  the kernel too) for float32 and bfloat16 inputs; asking for the float32
  result explicitly is what lets XLA:CPU run bfloat16 products on its fast
  (AMX / AVX-512-BF16) kernels: measured 4.5x the float32 rate per
  CPU-second at [1024]^3, where a bfloat16-output product ran below the
  float32 rate (experiments/bench_real.md).

  Args:
    x: activations (float32 or bfloat16); w: weights in the same dtype.
    spec: einsum equation (default: contract x's last axis with w's first).

  Low-precision operands also get a backward pass of the same form
  (`_low_precision_matmul`: bf16 cotangent products with float32 results),
  so training reaches the fast kernels too, not only the forward.

  Returns:
    The product in x.dtype.
  """
  if x.dtype == jnp.float32 and w.dtype == jnp.float32:
    return jnp.einsum(spec, x, w, preferred_element_type=jnp.float32)
  return _low_precision_matmul(x, w, spec)


def _matmul_grad_specs(spec: str) -> tuple[str, str]:
  """(dx spec, dw spec) of `einsum(spec, x, w)`: 'out,w->x' and 'x,out->w'."""
  ins, out = spec.split("->")
  lhs, rhs = ins.split(",")
  return f"{out},{rhs}->{lhs}", f"{lhs},{out}->{rhs}"


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _low_precision_matmul(x: jax.Array, w: jax.Array, spec: str) -> jax.Array:
  """`matmul` for bfloat16 operands, with a backward pass in the same form.

  Forward: einsum with a float32 result, cast to x.dtype. Backward: the
  cotangent g (in x.dtype) times w and x, again as low-precision products
  with float32 results (dx = g w^T, dw = x^T g), cast to the operands'
  dtypes. Autodiff of the forward alone would give float32-cotangent
  products, which XLA:CPU runs without its bfloat16 (AMX) kernels; the
  numbers are those of the usual mixed-precision backward (bf16 operands,
  float32 accumulation; Micikevicius et al., arXiv:1710.03740).
  """
  return jnp.einsum(spec, x, w, preferred_element_type=jnp.float32).astype(
      x.dtype
  )


def _low_precision_matmul_fwd(x, w, spec):
  return _low_precision_matmul(x, w, spec), (x, w)


def _low_precision_matmul_bwd(spec, res, g):
  x, w = res
  dx_spec, dw_spec = _matmul_grad_specs(spec)
  g = g.astype(x.dtype)
  dx = jnp.einsum(dx_spec, g, w, preferred_element_type=jnp.float32)
  dw = jnp.einsum(dw_spec, x, g, preferred_element_type=jnp.float32)
  return dx.astype(x.dtype), dw.astype(w.dtype)


_low_precision_matmul.defvjp(
    _low_precision_matmul_fwd, _low_precision_matmul_bwd
)


@jax.custom_vjp
def gate_up_product(
    x_btd: jax.Array, w_dcf: jax.Array
) -> tuple[jax.Array, jax.Array]:
  """(gate, up), each [B, T, F] in x's dtype: x w[:, 0] and x w[:, 1] from
  one [B, T, D] x [D, 2, F] product (`matmul`, float32 accumulation); x is
  3-D, w's middle axis has size 2, both in the compute dtype.

  Its gradient stacks the two cotangents into one [B, T, 2, F] array dH and
  takes dx = dH W^T and dW = x^T dH as row-major products with the small
  operands W^T and x^T materialised (an optimization barrier keeps XLA from
  folding the transposes back into the products), float32 accumulation.
  Differentiating the slices instead zero-pads each cotangent to [B, T, 2,
  F], sums them, and copies the sum into a transposed layout for the weight
  gradient: more passes over the layer's largest activation, 3% of
  bench_peers' iteration and ~4% of the default job's SFT step
  (experiments/bench_ab.md).
  """
  h_btcf = matmul(x_btd, w_dcf, "btd,dcf->btcf")
  return h_btcf[..., 0, :], h_btcf[..., 1, :]


def _gate_up_fwd(x_btd, w_dcf):
  return gate_up_product(x_btd, w_dcf), (x_btd, w_dcf)


def _gate_up_bwd(res, g):
  x_btd, w_dcf = res
  d, _, f = w_dcf.shape
  dt = x_btd.dtype
  # [B, T, 2, F]: the (2, F) axes stay apart (merging them would make XLA
  # gather an F split over 'tensor'); contracting both is still one
  # row-major product.
  dh = jnp.stack([g[0].astype(dt), g[1].astype(dt)], axis=-2)
  # Separate barriers: with frozen base weights (LoRA) dW and its x^T copy
  # are dead code and go.
  w_cfd = jax.lax.optimization_barrier(jnp.transpose(w_dcf, (1, 2, 0)))
  x_dn = jax.lax.optimization_barrier(x_btd.reshape(-1, d).T)
  f32 = jnp.float32
  dx = jnp.einsum("btcf,cfd->btd", dh, w_cfd, preferred_element_type=f32)
  dw = jnp.einsum(
      "dn,ncf->dcf", x_dn, dh.reshape(-1, 2, f), preferred_element_type=f32
  )
  return dx.astype(dt), dw.astype(w_dcf.dtype)


gate_up_product.defvjp(_gate_up_fwd, _gate_up_bwd)


def _normal(
    std: float, key: jax.Array, shape: tuple[int, ...], dtype: Any
) -> jax.Array:
  """N(0, std^2) drawn in float32, then cast: a bf16 model's initial parameters
  are the float32 model's rounded."""
  return nnx.initializers.normal(std)(key, shape, jnp.float32).astype(dtype)


class RMSNorm(nnx.Module):
  """y = x / sqrt(mean(x^2) + eps) * scale (arXiv:1910.07467), stats in f32."""

  def __init__(self, dim: int, eps: float, param_dtype: Any = jnp.float32):
    self.scale = nnx.Param(jnp.ones((dim,), param_dtype))
    self.eps = eps

  def __call__(self, x: jax.Array) -> jax.Array:
    dtype = x.dtype
    x = x.astype(jnp.float32)
    var = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
    y = x * jax.lax.rsqrt(var + self.eps) * self.scale[...].astype(jnp.float32)
    return y.astype(dtype)


class Attention(nnx.Module):
  """Causal grouped-query attention with RoPE and an optional KV cache.

  Query head h reads key/value head h // (H / G), as in Hugging Face's
  `repeat_kv`.
  """

  def __init__(self, cfg: TransformerConfig, rngs: nnx.Rngs):
    d, h, g, dh = cfg.d_model, cfg.num_heads, cfg.kv_heads, cfg.head_dim
    pdt = cfg.params_dtype
    self.q_dhk = nnx.Param(_normal(d**-0.5, rngs.params(), (d, h, dh), pdt))
    self.k_dgk = nnx.Param(_normal(d**-0.5, rngs.params(), (d, g, dh), pdt))
    self.v_dgk = nnx.Param(_normal(d**-0.5, rngs.params(), (d, g, dh), pdt))
    self.o_hkd = nnx.Param(
        _normal(
            (h * dh) ** -0.5 / (2 * cfg.num_layers) ** 0.5,
            rngs.params(),
            (h, dh, d),
            pdt,
        )
    )
    if cfg.qkv_bias:
      self.q_bias_hk = nnx.Param(jnp.zeros((h, dh), pdt))
      self.k_bias_gk = nnx.Param(jnp.zeros((g, dh), pdt))
      self.v_bias_gk = nnx.Param(jnp.zeros((g, dh), pdt))
    self.cfg = cfg

  def _fused_qkv(
      self, x_btd: jax.Array
  ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Queries [B, H, T, Dh] and keys, values [B, G, T, Dh] of a chunk of
    tokens (cache-free forwards and multi-token cache writes), before
    adapters and RoPE, from one fused product."""
    cfg = self.cfg
    dt = cfg.compute_dtype
    b, t, d = x_btd.shape
    h, g, r = cfg.num_heads, cfg.kv_heads, cfg.num_heads // cfg.kv_heads
    dh = cfg.head_dim
    # One fused projection for queries, keys and values, laid out per kv
    # group: q [D, H, Dh] is viewed as [D, G, r, Dh] (query head h = g*r + i
    # reads kv head g, as in repeat_kv) and k, v as [D, G, 1, Dh]; they are
    # concatenated along the new within-group axis into [D, G, r + 2, Dh].
    # Tensor parallelism shards G, never the concatenated axis, so the
    # concatenation is local to each device (column-parallel, Megatron-style:
    # Shoeybi et al. 2019, arXiv:1909.08053): with tensor parallelism alone
    # the layer's only collectives are all-reduces (after the row-parallel
    # output projection; of the input gradient in the backward pass). With
    # 'fsdp' too, the fused weight is gathered over 'fsdp' before use.
    # (Concatenating along the sharded head axis instead made XLA reshuffle
    # the weights and activations with collective-permutes.)
    w_dgck = jnp.concatenate(
        [
            self.q_dhk[...].reshape(d, g, r, dh),
            self.k_dgk[...][:, :, None],
            self.v_dgk[...][:, :, None],
        ],
        axis=2,
    ).astype(dt)
    w_dgck = sharding.constrain_gathered(w_dgck, "dgck")
    qkv_bgctk = matmul(x_btd, w_dgck, "btd,dgck->bgctk")
    if cfg.qkv_bias:
      bias_gck = jnp.concatenate(
          [
              self.q_bias_hk[...].reshape(g, r, dh),
              self.k_bias_gk[...][:, None],
              self.v_bias_gk[...][:, None],
          ],
          axis=1,
      ).astype(dt)
      qkv_bgctk = qkv_bgctk + bias_gck[None, :, :, None, :]
    q_bhtk = qkv_bgctk[:, :, :r].reshape(b, h, t, dh)
    k_bgtk = qkv_bgctk[:, :, r]
    v_bgtk = qkv_bgctk[:, :, r + 1]
    return q_bhtk, k_bgtk, v_bgtk

  def __call__(
      self,
      x_btd: jax.Array,
      positions_bt: jax.Array,
      cache: dict[str, jax.Array] | None,
      mask_bts: jax.Array,
      rope_sc: tuple[jax.Array, jax.Array],
      kv_len: jax.Array | None = None,
      cache_prefix: CachePrefix | None = None,
  ) -> tuple[jax.Array, dict[str, jax.Array] | None]:
    """One attention layer.

    Args:
      x_btd: [B, T, D] normalised input in the compute dtype.
      positions_bt: [B, T] int32 absolute positions (cache write positions).
      cache: this layer's {'k' [B, G, Dh, S], 'v' [B, G, S, Dh]} or None.
      mask_bts: [B, T, S] bool, True where query t may attend to key s
        (S = T without a cache), or, without a cache, an
        `attention.SelfMask` (per-token positions, padding and segments;
        attention then follows cfg.attention_impl); built once per forward
        (Transformer).
      rope_sc: (sin, cos) [B, 1, T, Dh / 2] from `rope_tables`.
      kv_len: with a cache, an optional int32 scalar: every query of this call
        that matters reads only cache entries [0, kv_len) (see
        `decode_buckets`); None reads the whole cache.
      cache_prefix: with a cache, optional `CachePrefix`: cache entries that
        groups of rows share are read once per group while it says so.

    Returns:
      ([B, T, D] output, updated cache or None).
    """
    cfg = self.cfg
    dt = cfg.compute_dtype
    b, t, d = x_btd.shape
    dh = cfg.head_dim
    if t == 1:
      # Decoding one token: three separate projections. A fused weight would
      # be re-concatenated on every step of the decode while_loop (XLA does
      # not hoist it out): ~9 MB of copies per layer per token at SmolLM2 size.
      # Each is a plain [B, D] @ [D, N * Dh] product on the weight's own
      # row-major layout (a free reshape): written as the einsum
      # 'btd,dnk->bntk', XLA:CPU computed the transposed product and copied a
      # transposed weight on every step (one copy per projection per layer).
      x_bd = x_btd[:, 0]
      q_bhtk, k_bgtk, v_bgtk = (
          matmul(x_bd, w[...].astype(dt).reshape(d, -1)).reshape(
              b, w.shape[1], 1, dh
          )
          for w in (self.q_dhk, self.k_dgk, self.v_dgk)
      )
      if cfg.qkv_bias:
        bias = lambda b_nk: b_nk[...].astype(dt)[None, :, None, :]
        q_bhtk = q_bhtk + bias(self.q_bias_hk)
        k_bgtk = k_bgtk + bias(self.k_bias_gk)
        v_bgtk = v_bgtk + bias(self.v_bias_gk)
    else:
      q_bhtk, k_bgtk, v_bgtk = self._fused_qkv(x_btd)
    q_bhtk, k_bgtk, v_bgtk = self._adapt_and_rotate(
        x_btd, q_bhtk, k_bgtk, v_bgtk, rope_sc
    )
    if cache is None:
      keys, values_bgsk = k_bgtk, v_bgtk  # keys [B, G, S, Dh]
      new_cache = None
    else:
      # Write this chunk's keys/values at each row's own positions (an in-place
      # scatter inside the decode loop); positions past the cache end are
      # dropped (the rollout marks such rows TRUNCATED). The key cache is
      # stored transposed, [B, G, Dh, S]: the decode's score product then
      # reads its right operand in its natural [Dh, S] layout (see
      # `init_cache`).
      # Each row's write is its own scatter (vmapped: the scatter's batch
      # dimension is the row), so on a mesh that splits rows each device
      # writes its own rows; an index array naming the rows instead made
      # XLA's partitioner all-gather every row's indices and new keys/values
      # onto every device at each decode step (tests/test_decode_mesh.py).
      keys = jax.vmap(  # [B, G, Dh, S]
          lambda c_gks, k_gtk, p_t: c_gks.at[:, :, p_t].set(
              k_gtk.transpose(0, 2, 1), mode="drop"
          )
      )(cache["k"], k_bgtk, positions_bt)
      values_bgsk = jax.vmap(
          lambda c_gsk, v_gtk, p_t: c_gsk.at[:, p_t].set(v_gtk, mode="drop")
      )(cache["v"], v_bgtk, positions_bt)
      new_cache = {"k": keys, "v": values_bgsk}
    # Scores feed the softmax: accumulated in float32 on both paths.
    if isinstance(mask_bts, attention_lib.SelfMask):
      if cache is not None:  # its keys would be [B, G, Dh, S]
        raise ValueError("a SelfMask is for cache-free forwards only")
      out_bhtk = attention_lib.self_attention(
          q_bhtk,
          keys,
          values_bgsk,
          mask_bts,
          impl=cfg.attention_impl,
          block=cfg.attention_block,
          dtype=dt,
      )
    else:

      def attend(keys, values_bgsk, mask_bts):
        return attention_lib.dense_attention(
            q_bhtk,
            keys,
            values_bgsk,
            mask_bts,
            dt,
            keys_transposed=cache is not None,
        )

      if cache is None:
        out_bhtk = attend(keys, values_bgsk, mask_bts)
      else:
        s = values_bgsk.shape[2]
        buckets = decode_buckets(cfg, s)
        if kv_len is not None and len(buckets) > 1:
          # Length buckets: read only the first `bucket` cache entries, the
          # smallest bucket >= kv_len (static slices, one branch per
          # bucket), so a step costs what the filled part of the cache
          # needs, not the buffer. Keys past a query's position are masked
          # out (probability exactly 0) in every bucket, so the output is
          # the full-cache output.
          sizes = buckets
          idx = jnp.sum(jnp.asarray(buckets[:-1], jnp.int32) < kv_len)
        else:
          sizes, idx = (s,), jnp.int32(0)

        read = lambda n: (
            keys[..., :n],
            values_bgsk[:, :, :n],
            mask_bts[:, :, :n],
        )
        branches = [lambda n=n: attend(*read(n)) for n in sizes]
        shared_sizes = []
        if cache_prefix is not None and b % cache_prefix.group == 0:
          length, group = cache_prefix.length, cache_prefix.group
          shared_sizes = [
              n
              for n in sizes
              if attention_lib.cache_prefix_pays(length, group, n)
          ]
        if shared_sizes:
          # Entries [0, length) once per group of rows (a GRPO group's
          # prompt), in the buckets where that saves more than the copy of
          # the rows' own part costs (`cache_prefix_pays`); the switch's
          # index moves to those branches while `shared` is set.
          branches += [
              lambda n=n: attention_lib.cache_prefix_attention(
                  q_bhtk, *read(n), dt, length, group
              )
              for n in shared_sizes
          ]
          shared_idx = jnp.asarray(
              [
                  len(sizes) + shared_sizes.index(n) if n in shared_sizes else i
                  for i, n in enumerate(sizes)
              ],
              jnp.int32,
          )
          idx = jnp.where(cache_prefix.shared, shared_idx[idx], idx)
        if len(branches) > 1:
          out_bhtk = jax.lax.switch(idx, branches)
        else:
          out_bhtk = branches[0]()
    return self._output(out_bhtk), new_cache

  def _adapt_and_rotate(self, x_btd, q_bhtk, k_bgtk, v_bgtk, rope_sc):
    """Projected queries, keys, values -> with low-rank adapters (if any,
    models/lora.py) and RoPE on queries and keys; same shapes."""
    if self.cfg.lora is not None:
      q_bhtk, k_bgtk, v_bgtk = (
          lora_lib.apply(self, n, x_btd, y)
          for n, y in (("q", q_bhtk), ("k", k_bgtk), ("v", v_bgtk))
      )
    sin, cos = rope_sc
    return apply_rope(q_bhtk, sin, cos), apply_rope(k_bgtk, sin, cos), v_bgtk

  def _output(self, out_bhtk: jax.Array) -> jax.Array:
    """Output projection (and its adapter): [B, H, T, Dh] -> [B, T, D]."""
    w_o = self.o_hkd[...].astype(self.cfg.compute_dtype)
    out = matmul(out_bhtk, w_o, "bhtk,hkd->btd")
    return lora_lib.apply(self, "o", out_bhtk, out)

  def shared_prefix_call(
      self,
      xp_nsd: jax.Array,
      xs_btd: jax.Array,
      rope_p: tuple[jax.Array, jax.Array],
      rope_s: tuple[jax.Array, jax.Array],
      group: int,
  ) -> tuple[jax.Array, jax.Array]:
    """One attention layer over rows that share their first S tokens by group.

    The shared-prefix forward of a GRPO group (one prompt, several samples;
    Prefix Grouper, Liu et al. 2025, arXiv:2506.05433): the prefix is
    computed once per group, and every row's suffix queries attend to its
    group's prefix keys and values followed by its own (causal). The math of
    each position is that of the unshared forward; only the prefix's
    duplicate rows are not computed.

    Args:
      xp_nsd: [n, S, D] normalised prefix input, one row per group.
      xs_btd: [n * group, T, D] normalised suffix input (positions S..S+T-1),
        rows group-major (row i belongs to group i // group).
      rope_p, rope_s: RoPE tables (`rope_tables`) of the prefix and suffix
        positions.
      group: rows per group.

    Returns:
      ([n, S, D] prefix output, [n * group, T, D] suffix output).
    """
    cfg = self.cfg
    dt = cfg.compute_dtype

    def project(x_btd, rope_sc):
      return self._adapt_and_rotate(x_btd, *self._fused_qkv(x_btd), rope_sc)

    qp, kp, vp = project(xp_nsd, rope_p)
    qs, ks, vs = project(xs_btd, rope_s)
    n, s = xp_nsd.shape[:2]
    b, t = xs_btd.shape[:2]
    out_p = attention_lib.self_attention(
        qp,
        kp,
        vp,
        attention_lib.SelfMask(
            jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (n, s))
        ),
        impl=cfg.attention_impl,
        block=cfg.attention_block,
        dtype=dt,
    )
    rep = lambda x: jnp.repeat(x, group, axis=0)
    keys_bgsk = jnp.concatenate([rep(kp), ks], axis=2)
    values_bgsk = jnp.concatenate([rep(vp), vs], axis=2)
    # Suffix query t sees the whole prefix and suffix keys 0..t.
    causal_tt = jnp.arange(t)[None, :] <= jnp.arange(t)[:, None]
    mask_ts = jnp.concatenate([jnp.ones((t, s), bool), causal_tt], axis=1)
    out_s = attention_lib.dense_attention(
        qs, keys_bgsk, values_bgsk, jnp.broadcast_to(mask_ts, (b, t, s + t)), dt
    )
    return self._output(out_p), self._output(out_s)


class SwiGLU(nnx.Module):
  """FFN(x) = W_down(silu(W_gate x) * W_up x) (Shazeer 2020, arXiv:2002.05202)."""

  def __init__(self, cfg: TransformerConfig, rngs: nnx.Rngs):
    d, f = cfg.d_model, cfg.ffn_dim
    pdt = cfg.params_dtype
    self.gate_df = nnx.Param(_normal(d**-0.5, rngs.params(), (d, f), pdt))
    self.up_df = nnx.Param(_normal(d**-0.5, rngs.params(), (d, f), pdt))
    self.down_fd = nnx.Param(
        _normal(
            f**-0.5 / (2 * cfg.num_layers) ** 0.5, rngs.params(), (f, d), pdt
        )
    )
    self.dtype = cfg.compute_dtype

  def __call__(self, x_btd: jax.Array) -> jax.Array:
    dt = self.dtype
    if x_btd.shape[1] == 1:
      # Decoding one token: two matmuls (a fused weight would be
      # re-concatenated on every step of the decode while_loop).
      gate = matmul(x_btd, self.gate_df[...].astype(dt))
      up = matmul(x_btd, self.up_df[...].astype(dt))
    else:
      # One fused matmul for gate and up: the two [D, F] weights are stacked
      # on a new axis into [D, 2, F]. Tensor parallelism shards F, not the
      # stacked axis, so the stack is local to each device (column-parallel;
      # down_fd is row-parallel, followed by one all-reduce).
      w_dcf = sharding.constrain_gathered(
          jnp.stack([self.gate_df[...], self.up_df[...]], axis=1).astype(dt),
          "dcf",
      )
      gate, up = gate_up_product(x_btd, w_dcf)
    # Low-rank adapters, if any (models/lora.py); identity otherwise.
    gate = jax.nn.silu(lora_lib.apply(self, "gate", x_btd, gate))
    hidden = gate * lora_lib.apply(self, "up", x_btd, up)
    return lora_lib.apply(
        self, "down", hidden, matmul(hidden, self.down_fd[...].astype(dt))
    )


class Block(nnx.Module):
  """Pre-norm residual block: x + Attn(norm(x)), then x + FFN(norm(x))."""

  def __init__(self, cfg: TransformerConfig, rngs: nnx.Rngs):
    self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps, cfg.params_dtype)
    self.attn = Attention(cfg, rngs)
    self.ffn_norm = RMSNorm(cfg.d_model, cfg.norm_eps, cfg.params_dtype)
    self.ffn = SwiGLU(cfg, rngs)

  def __call__(
      self,
      x,
      positions_bt,
      cache,
      mask_bts,
      rope_sc,
      kv_len=None,
      cache_prefix=None,
  ):
    h, cache = self.attn(
        self.attn_norm(x),
        positions_bt,
        cache,
        mask_bts,
        rope_sc,
        kv_len,
        cache_prefix,
    )
    x = x + h
    return x + self.ffn(self.ffn_norm(x)), cache

  def shared_prefix_call(self, xp, xs, rope_p, rope_s, group):
    """The block on a shared prefix [n, S, D] and the rows' suffixes
    [n * group, T, D] (`Attention.shared_prefix_call`); returns both."""
    hp, hs = self.attn.shared_prefix_call(
        self.attn_norm(xp), self.attn_norm(xs), rope_p, rope_s, group
    )
    xp, xs = xp + hp, xs + hs
    return xp + self.ffn(self.ffn_norm(xp)), xs + self.ffn(self.ffn_norm(xs))


def _block_apply(
    block: Block,
    x,
    positions_bt,
    cache,
    mask_bts,
    rope_sc,
    kv_len=None,
    cache_prefix=None,
):
  return block(x, positions_bt, cache, mask_bts, rope_sc, kv_len, cache_prefix)


def remat_after_cotangent(fn):
  """`fn` rematerialised in the backward pass, recomputed only once its output
  cotangent exists.

  Forward: fn(*args), saving only args. Backward: jax.vjp(fn, *args') with
  args' = args + 0 * c on every floating leaf, c one element of the output
  cotangent, so the recomputation data-depends on the cotangent and cannot
  start before the later layers' backward has produced it (XLA does not fold
  a float product with 0, which is NaN for c = inf). With plain
  `jax.checkpoint` (or an optimization barrier, which XLA:CPU expands away)
  the recomputation depends on the saved inputs only, and XLA:CPU's
  scheduler hoists the recomputed forwards of all layers ahead of the
  backward pass: every layer's activations are live at once and remat saves
  nothing (SmolLM2-135M LoRA SFT step at 4 x 256: 3.03 GB of XLA temp
  memory, the peak holding the rematerialised attention and MLP values of
  all 30 blocks; memory-usage report of the compiled program). Same values
  and gradients as `fn` while the cotangent is finite (a non-finite c makes
  every gradient NaN); cotangents of integer/bool args are float0 zeros.

  Args:
    fn: a function of array pytrees returning an array pytree.

  Returns:
    A function with fn's signature; not forward-mode differentiable
    (jax.custom_vjp).
  """

  @jax.custom_vjp
  def run(*args):
    return fn(*args)

  def fwd(*args):
    return fn(*args), args

  def bwd(args, ct):
    zero = jnp.ravel(jax.tree.leaves(ct)[0])[0].astype(jnp.float32) * 0.0
    tie = lambda a: (
        a + zero.astype(a.dtype) if jnp.issubdtype(a.dtype, jnp.floating) else a
    )
    return jax.vjp(fn, *jax.tree.map(tie, args))[1](ct)

  run.defvjp(fwd, bwd)
  return run


def _after_input(state, x):
  """A block's weights + 0 * one element of its input `x`.

  Inside a rematerialised block, the run-time fusion of its q/k/v and gate/up
  weights then waits for the block's input instead of being hoisted by XLA
  for all layers at once (SmolLM2: 276 MB live).
  """
  zero = jnp.ravel(x)[0].astype(jnp.float32) * 0.0
  return jax.tree.map(
      lambda w: w + zero.astype(w.dtype)
      if jnp.issubdtype(w.dtype, jnp.floating)
      else w,
      state,
  )


def _remat_block_apply(
    block: Block, x, positions_bt, cache, mask_bts, rope_sc, kv_len=None
):
  """`_block_apply` rematerialised in the backward pass (cache-free forwards only).

  `remat_after_cotangent` over a pure function of the block's split state
  rather than `nnx.remat`: nnx.remat updates the block's Variables from its
  own trace level, which raises `TraceContextError` when the model was merged
  inside another transform (e.g. the learner's `lax.map` over
  behaviour-forward blocks).
  """
  del cache, kv_len  # remat is only used without a KV cache
  graphdef, state = nnx.split(block)

  def forward(state, x, positions_bt, mask_bts, rope_sc):
    state = _after_input(state, x)
    y, _ = nnx.merge(graphdef, state)(x, positions_bt, None, mask_bts, rope_sc)
    return y

  return (
      remat_after_cotangent(forward)(state, x, positions_bt, mask_bts, rope_sc),
      None,
  )


def _shared_block_apply(block: Block, xp, xs, rope_p, rope_s, group, remat):
  """`Block.shared_prefix_call`, rematerialised in the backward pass when
  `remat` (as `_remat_block_apply`)."""
  if not remat:
    return block.shared_prefix_call(xp, xs, rope_p, rope_s, group)
  graphdef, state = nnx.split(block)

  def forward(state, xp, xs, rope_p, rope_s):
    state = _after_input(_after_input(state, xp), xs)
    return nnx.merge(graphdef, state).shared_prefix_call(
        xp, xs, rope_p, rope_s, group
    )

  return remat_after_cotangent(forward)(state, xp, xs, rope_p, rope_s)


class Transformer(nnx.Module):
  """Decoder-only language model with optional scalar value / reward heads.

  Parameters are drawn in a fixed order (embedding; per block q, k, v, o, gate,
  up, down; then the LM head unless tied); biases and scalar heads start at zero
  and draw nothing, so enabling them leaves the other parameters unchanged.
  """

  def __init__(self, cfg: TransformerConfig, rngs: nnx.Rngs):
    self.cfg = cfg
    pdt = cfg.params_dtype
    d, v = cfg.d_model, cfg.vocab_size
    # Tied: initialised N(0, 1/D) so that initial logits have unit scale.
    embed_std = d**-0.5 if cfg.tie_embeddings else 1.0
    self.embed_vd = nnx.Param(_normal(embed_std, rngs.params(), (v, d), pdt))
    self.blocks = nnx.List([Block(cfg, rngs) for _ in range(cfg.num_layers)])
    self.final_norm = RMSNorm(d, cfg.norm_eps, pdt)
    if not cfg.tie_embeddings:
      self.lm_head_dv = nnx.Param(_normal(d**-0.5, rngs.params(), (d, v), pdt))
    if cfg.value_head:
      self.value_head_d = nnx.Param(jnp.zeros((d,), pdt))
    if cfg.reward_head:
      self.reward_head_d = nnx.Param(jnp.zeros((d,), pdt))
    if cfg.lora is not None:
      # Drawn last, from the next key, so the base weights do not depend on it.
      lora_lib.attach(self, cfg.lora, rngs.params())

  def hidden_states(
      self,
      tokens_bt: jax.Array,
      positions_bt: jax.Array | None = None,
      cache: KVCache | None = None,
      mask_bt: jax.Array | None = None,
      segment_ids_bt: jax.Array | None = None,
      kv_len: jax.Array | None = None,
      shared_prefix: SharedPrefix | None = None,
      cache_prefix: CachePrefix | None = None,
  ) -> tuple[jax.Array, KVCache | None]:
    """Final (normalised) hidden states, the input of every head.

    Args:
      tokens_bt: [B, T] int32 token ids.
      positions_bt: [B, T] int32 absolute positions; defaults to arange(T).
        With a cache, each row's chunk is written at these positions.
      cache: optional KV cache (see `init_cache`); if None, plain causal
        attention over this chunk.
      mask_bt: optional [B, T] bool/int, True on real tokens; padding keys are
        hidden from every query (no cache only).
      segment_ids_bt: optional [B, T] int32 ids of packed sequences: a query
        reads only keys of its own segment (no cache only). Positions should
        restart at each segment (agentic_rl/padding.py packs rows so).
      kv_len: with a cache, an optional int32 scalar >= every position whose
        output matters + 1 (e.g. max over rows of start + real length): the
        attention then reads only the smallest `decode_buckets` prefix of the
        cache that holds [0, kv_len). Outputs at positions >= kv_len are
        meaningless. None reads the whole cache.
      shared_prefix: optional `SharedPrefix` (cache-free forwards with
        default positions, no mask_bt or segment_ids_bt): positions [0,
        length) are computed for the first row of each group only and
        broadcast to the group's rows; every other position reads them as
        keys. The result equals the unshared forward's up to float
        summation order when the rows of each group agree on those tokens
        (not checked here: rows that differ get their group's first row's
        prefix).
      cache_prefix: with a cache, optional `CachePrefix` (the cache's first
        entries shared by groups of rows; read once per group while its
        `shared` flag is set). The result equals the unshared read's up to
        float summation order.

    Without a cache, positions must grow with the index among a row's valid
    tokens of one segment whenever the chunked attention is used (see
    agentic_rl/models/attention.py); every caller's positions do.

    Returns:
      (hidden [B, T, D] in the compute dtype, updated cache or None).

    Raises:
      ValueError: mask_bt or segment_ids_bt given together with a cache;
        shared_prefix given with a cache, positions, mask_bt or
        segment_ids_bt, with a batch its group does not divide, or where
        the attention would be chunked (`attention_lib.uses_chunked` at
        this length).
    """
    if shared_prefix is not None and shared_prefix.length > 0:
      if any(
          a is not None for a in (positions_bt, cache, mask_bt, segment_ids_bt)
      ):
        raise ValueError(
            "shared_prefix: only for cache-free forwards with default "
            "positions and no mask_bt or segment_ids_bt"
        )
      return self._shared_prefix_hidden(tokens_bt, shared_prefix), None
    b, t = tokens_bt.shape
    if positions_bt is None:
      positions_bt = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    # On a mesh, multi-token activations [B, T, D] stay split over the batch
    # axes only (D whole on every device: the weights are gathered over
    # 'fsdp', ZeRO-3); otherwise XLA may carry the embedding table's 'fsdp'
    # split of D into the blocks and reshuffle activations with all-to-alls.
    # One-token decode steps are left to XLA: there moving the few activations
    # is cheaper than gathering the weights (measured in
    # experiments/bench_mesh.py). No-op without a mesh.
    pin = sharding.constrain_batch if t > 1 else (lambda x: x)
    x = pin(self._embed(tokens_bt))
    # Shared by every layer, so computed once: RoPE angles and the mask.
    rope_sc = rope_tables(positions_bt, rope_inv_freq(self.cfg))
    if cache is None:
      # Causal by absolute position, padding keys (mask_bt) and segments
      # hidden; kept as [B, T] vectors so the chunked attention never forms
      # a [B, T, T] mask (attention.SelfMask).
      mask_bts = attention_lib.SelfMask(
          positions_bt,
          None if mask_bt is None else mask_bt.astype(bool),
          segment_ids_bt,
      )
    else:
      if mask_bt is not None or segment_ids_bt is not None:
        raise ValueError(
            "mask_bt and segment_ids_bt are only supported without a KV cache"
        )
      s = cache[0]["v"].shape[2]
      key_pos_bs = jnp.broadcast_to(
          jnp.arange(s, dtype=jnp.int32)[None, :], (b, s)
      )
      # Causal mask by absolute position; this also hides stale cache entries
      # beyond each row's current position.
      mask_bts = key_pos_bs[:, None, :] <= positions_bt[:, :, None]
    # Remat only pays off in a backward pass; decoding with a KV cache (inside
    # the sampler's lax.while_loop, where nnx.remat cannot trace) never needs it.
    apply = (
        _remat_block_apply if self.cfg.remat and cache is None else _block_apply
    )
    new_cache = [] if cache is not None else None
    if cache is not None and cache_prefix is not None:
      apply = functools.partial(_block_apply, cache_prefix=cache_prefix)
    for i, block in enumerate(self.blocks):
      x, layer_cache = apply(
          block,
          x,
          positions_bt,
          None if cache is None else cache[i],
          mask_bts,
          rope_sc,
          kv_len,
      )
      x = pin(x)
      if new_cache is not None:
        new_cache.append(layer_cache)
    return self.final_norm(x), new_cache

  def _embed(self, tokens: jax.Array) -> jax.Array:
    """Token embeddings [..., D] in the compute dtype."""
    return jnp.take(self.embed_vd[...], tokens, axis=0).astype(
        self.cfg.compute_dtype
    )

  def _shared_prefix_hidden(
      self, tokens_bt: jax.Array, shared_prefix: SharedPrefix
  ) -> jax.Array:
    """`hidden_states(tokens_bt, shared_prefix=...)`: [B, T, D]."""
    hp, hs = self.shared_prefix_streams(tokens_bt, shared_prefix)
    g = shared_prefix.group
    return jnp.concatenate([jnp.repeat(hp, g, axis=0), hs], axis=1)

  def shared_prefix_streams(
      self, tokens_bt: jax.Array, shared_prefix: SharedPrefix
  ) -> tuple[jax.Array, jax.Array]:
    """The final hidden states of `hidden_states(tokens_bt,
    shared_prefix=...)` as its two streams, the prefix not repeated.

    Args:
      tokens_bt: [B, T] int32, rows in consecutive groups of
        `shared_prefix.group` whose first `shared_prefix.length` tokens agree.
      shared_prefix: the `SharedPrefix`.

    Returns:
      (prefix [B / G, S', D] once per group, rest [B, T - S', D] per row),
      S' = min(length, T), in the compute dtype; row b's hidden states are
      prefix[b // G] followed by rest[b].

    Raises:
      ValueError: G does not divide B, or T positions would take the chunked
        attention.
    """
    b, t = tokens_bt.shape
    g = shared_prefix.group
    s = min(shared_prefix.length, t)
    if b % g:
      raise ValueError(
          f"shared_prefix: group {g} must divide the batch ({b} rows)"
      )
    cfg = self.cfg
    if attention_lib.uses_chunked(cfg.attention_impl, t, cfg.attention_block):
      raise ValueError(
          f"shared_prefix: {t} positions would use the chunked attention "
          f"(attention_impl={cfg.attention_impl!r}, attention_block="
          f"{cfg.attention_block}); the shared-prefix forward is dense only"
      )
    if s == t:  # every position shared: one row per group
      hidden, _ = self.hidden_states(tokens_bt[::g])
      return hidden, hidden[:, :0].repeat(g, axis=0)
    pin = sharding.constrain_batch
    inv_freq = rope_inv_freq(cfg)
    n = b // g
    pos = jnp.arange(t, dtype=jnp.int32)
    rope_p = rope_tables(jnp.broadcast_to(pos[:s], (n, s)), inv_freq)
    rope_s = rope_tables(jnp.broadcast_to(pos[s:], (b, t - s)), inv_freq)
    # Both streams split over the batch axes on a mesh (replicated where the
    # rows do not divide, `sharding.batch_spec`); no-op without one.
    xp = pin(self._embed(tokens_bt[::g, :s]))
    xs = pin(self._embed(tokens_bt[:, s:]))
    for block in self.blocks:
      xp, xs = _shared_block_apply(block, xp, xs, rope_p, rope_s, g, cfg.remat)
      xp, xs = pin(xp), pin(xs)
    # RMSNorm is per position: each stream normalised on its own.
    return pin(self.final_norm(xp)), pin(self.final_norm(xs))

  def output_weights_dv(self) -> jax.Array:
    """[D, V] output layer in the compute dtype (embed_vd^T when tied)."""
    w = (
        self.embed_vd[...].T
        if self.cfg.tie_embeddings
        else self.lm_head_dv[...]
    )
    return w.astype(self.cfg.compute_dtype)

  def logits(self, hidden_btd: jax.Array) -> jax.Array:
    """LM head: [..., D] hidden -> [..., V] float32 logits (`vocab_logits`).

    On CPU, a [B, D] input with tied embeddings (the rows of a sampling
    step) goes through `tied_row_logits`: the same products up to float32
    summation order, computed faster there.
    """
    if (
        hidden_btd.ndim == 2
        and self.cfg.tie_embeddings
        and jax.default_backend() == "cpu"
    ):
      return tied_row_logits(
          hidden_btd, self.embed_vd[...].astype(self.cfg.compute_dtype)
      )
    return vocab_logits(hidden_btd, self.output_weights_dv())

  def __call__(
      self,
      tokens_bt: jax.Array,
      positions_bt: jax.Array | None = None,
      cache: KVCache | None = None,
  ) -> tuple[jax.Array, KVCache | None]:
    """Next-token logits (see `hidden_states` for the arguments).

    Returns:
      (logits [B, T, V] float32, updated cache or None).
    """
    hidden, new_cache = self.hidden_states(tokens_bt, positions_bt, cache)
    return self.logits(hidden), new_cache

  def value(self, hidden_btd: jax.Array) -> jax.Array:
    """Scalar value head: [B, T, D] hidden -> [B, T] float32 values.

    Raises:
      ValueError: the config has no value head.
    """
    if not self.cfg.value_head:
      raise ValueError("TransformerConfig.value_head=False: no value head")
    return hidden_btd.astype(jnp.float32) @ self.value_head_d[...].astype(
        jnp.float32
    )

  def reward(self, tokens_bl: jax.Array, mask_bl: jax.Array) -> jax.Array:
    """Scalar reward of each sequence, read at its last real token.

    Works whatever the padding side: positions count real tokens only
    (cumsum(mask) - 1) and padding keys are masked, so a left-padded and a
    right-padded copy of the same sequence get the same reward.

    Args:
      tokens_bl: [B, L] int32.
      mask_bl: [B, L] bool or int, True/1 on real tokens (at least one per row).

    Returns:
      [B] float32 rewards.

    Raises:
      ValueError: the config has no reward head.
    """
    if not self.cfg.reward_head:
      raise ValueError("TransformerConfig.reward_head=False: no reward head")
    mask_bl = mask_bl.astype(bool)
    positions_bl = jnp.maximum(jnp.cumsum(mask_bl, axis=1) - 1, 0).astype(
        jnp.int32
    )
    hidden_bld, _ = self.hidden_states(tokens_bl, positions_bl, mask_bt=mask_bl)
    last_b = last_token_index(mask_bl)
    h_bd = jnp.take_along_axis(hidden_bld, last_b[:, None, None], axis=1)[:, 0]
    return h_bd.astype(jnp.float32) @ self.reward_head_d[...].astype(
        jnp.float32
    )


def vocab_logits(hidden_btd: jax.Array, w_dv: jax.Array) -> jax.Array:
  """LM-head projection [..., D] x [D, V] -> [..., V] float32 logits.

  The products are accumulated and returned in float32 whatever the input
  dtype (`preferred_element_type`): with bfloat16 compute, rounding the
  logits to bfloat16 first (8 significant bits) would cost up to half a unit
  in the last place, 0.125 at |logit| in [32, 64), in every log-prob.

  Args:
    hidden_btd: [..., D] hidden states (any float dtype).
    w_dv: [D, V] output layer (same dtype as hidden).

  Returns:
    [..., V] float32.
  """
  return jnp.einsum(
      "...d,dv->...v", hidden_btd, w_dv, preferred_element_type=jnp.float32
  )


def tied_row_logits(hidden_bd: jax.Array, embed_vd: jax.Array) -> jax.Array:
  """Tied LM head for a few rows: [B, D] x [V, D]^T -> [B, V] float32 logits.

  The products of `vocab_logits(hidden_bd, embed_vd.T)` (equal up to float32
  summation order, ~1e-6 relative), computed as embed_vd @ hidden_bd^T
  ([V, B]: the embedding is the left operand, read in its own row-major
  layout) and then transposed. XLA:CPU computes the
  [B, D] x [D, V] form more slowly when B is small; at SmolLM2-135M shapes
  (V = 49,152, D = 576, one thread) the product and a log-softmax took 14 vs
  23 CPU-ms at B = 8 and 31 vs 38 at B = 32, and whole decode steps were
  3-10% faster (experiments/bench_real.md). `Transformer.logits` uses it on
  the CPU backend only (measured there only). The optimization barrier keeps
  XLA from folding the transpose back into the product (its simplifier
  rewrites transpose(dot(a, b)) as dot(b, a)).

  Args:
    hidden_bd: [B, D] hidden states (any float dtype).
    embed_vd: [V, D] token embedding, same dtype as hidden.

  Returns:
    [B, V] float32 (accumulated in float32, as `vocab_logits`).
  """
  logits_vb = jnp.einsum(
      "vd,bd->vb", embed_vd, hidden_bd, preferred_element_type=jnp.float32
  )
  return jax.lax.optimization_barrier(logits_vb).T


def last_token_index(mask_bl: jax.Array) -> jax.Array:
  """Index of the last True entry of each row ([B, L] bool -> [B] int32).

  Rows without any True entry give 0.
  """
  l = mask_bl.shape[1]
  idx = jnp.where(mask_bl.astype(bool), jnp.arange(l, dtype=jnp.int32), -1)
  return jnp.maximum(jnp.max(idx, axis=1), 0)


def decode_buckets(cfg: TransformerConfig, cache_len: int) -> tuple[int, ...]:
  """Cache prefix lengths that KV-cache attention may read (static).

  decode_bucket * 2^i below `cache_len`, then `cache_len` itself; just
  (cache_len,) when `cfg.decode_bucket` is 0 or >= cache_len.

  Example: decode_bucket 128, cache_len 600 -> (128, 256, 512, 600).
  """
  n, out = cfg.decode_bucket, []
  while 0 < n < cache_len:
    out.append(n)
    n *= 2
  return tuple(out) + (cache_len,)


def init_cache(cfg: TransformerConfig, batch: int, length: int) -> KVCache:
  """Zero KV cache: per layer keys 'k' [batch, G, Dh, length] (transposed)
  and values 'v' [batch, G, length, Dh].

  The keys are stored with the cache length last so that a decode step's
  score product q k^T contracts the keys' leading head dimension (a
  right operand in its natural layout): on XLA:CPU the score product took
  about half the time of the [batch, G, length, Dh] layout at bench_peers'
  decode shapes (experiments/bench_ab.md). The dtype is the compute dtype
  (float32 by default).
  """
  kshape = (batch, cfg.kv_heads, cfg.head_dim, length)
  vshape = (batch, cfg.kv_heads, length, cfg.head_dim)
  dt = cfg.compute_dtype
  return [
      {"k": jnp.zeros(kshape, dt), "v": jnp.zeros(vshape, dt)}
      for _ in range(cfg.num_layers)
  ]


def count_params(params: Any) -> int:
  """Number of scalar parameters in a pytree."""
  return int(sum(x.size for x in jax.tree.leaves(params)))
