"""Scaled dot-product attention for the transformer: dense and chunked.

Two formulations of the same causal grouped-query attention (Ainslie et al.
2023, arXiv:2305.13245; query head h reads key/value head h // (H / G)):

* `dense_attention` forms the [B, H, T, S] score array and takes one softmax.
  The KV-cache decode and prefill use it, and so does a full-sequence forward
  with `attention_impl='dense'`.
* `chunked_attention` never forms it: queries and keys are cut into blocks of
  `block` positions, each query block visits the key blocks at or before it
  and keeps a running row maximum, row sum and weighted-value sum in float32
  (the online softmax of Milakov & Gimelshein 2018, arXiv:1805.02867, as
  organised by FlashAttention, Dao et al. 2022, arXiv:2205.14135, and
  FlashAttention-2, Dao 2023, arXiv:2307.08691). Its gradient is a custom VJP
  that recomputes each score block from the saved per-row log-sum-exp
  (FlashAttention-2's backward pass), so neither direction keeps more than one
  [B, G, H/G, block, block] block of scores alive: the memory is O(B H T Dh)
  instead of O(B H T^2).

`cache_prefix_attention` is `dense_attention` over a KV cache whose first
entries groups of rows share (a GRPO group's prompt): it reads them once per
group (`transformer.CachePrefix`).

Both compute the scores q k^T / sqrt(Dh) with float32 accumulation
(`preferred_element_type`) and the softmax in float32; the value matmul takes
the probabilities in the compute dtype. The chunked form accumulates the value
sums in float32 as well.

Masks. A full-sequence (cache-free) forward describes its mask by per-token
vectors, `SelfMask`: query t may read key s iff

    pos[s] <= pos[t]  and  valid[s]  and  segment[s] == segment[t]

(`valid`, `segment` optional). `dense_attention` takes that mask expanded to
[B, T, S] (`SelfMask.dense`); `chunked_attention` evaluates it block by block
and, to skip the key blocks after each query block, also requires s <= t. That
extra condition changes nothing for the rows that matter when positions grow
with the index along each row among valid tokens of one segment (arange
positions, positions that count real tokens only, or packed episodes whose
positions restart at each segment): a valid query's visible keys then all lie
at or before it. Only a query with no visible key at all (a padding query)
gets a different (meaningless) output: the mean of the values of its skipped
or masked block keys instead of the mean over all keys.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

# Score given to masked (query, key) pairs: exp(NEG - max) is exactly 0 next to
# any real score, and finite (no inf - inf = nan) when a whole row is masked.
NEG = -1e30
IMPLS = ("auto", "dense", "chunked")


class SelfMask(NamedTuple):
  """Per-token description of a cache-free attention mask (see module doc).

  Attributes:
    positions_bt: [B, T] int32 absolute positions (RoPE positions).
    valid_bt: [B, T] bool, False on padding keys; None = all valid.
    segment_bt: [B, T] int32 segment ids (packed sequences); None = one
      segment per row.
  """

  positions_bt: jax.Array
  valid_bt: jax.Array | None = None
  segment_bt: jax.Array | None = None

  def dense(self) -> jax.Array:
    """[B, T, T] bool, True where query t may attend to key s."""
    pos = self.positions_bt
    mask = pos[:, None, :] <= pos[:, :, None]
    if self.valid_bt is not None:
      mask = mask & self.valid_bt.astype(bool)[:, None, :]
    if self.segment_bt is not None:
      seg = self.segment_bt
      mask = mask & (seg[:, None, :] == seg[:, :, None])
    return mask


def dense_attention(
    q_bhtk: jax.Array,
    k_bgsk: jax.Array,
    v_bgsk: jax.Array,
    mask_bts: jax.Array,
    dtype: Any,
    keys_transposed: bool = False,
) -> jax.Array:
  """softmax(q k^T / sqrt(Dh) masked) v with the [B, H, T, S] scores formed.

  The gradient is a custom VJP (`_dense_bwd`): autodiff's gradient up to
  float32 rounding (the softmax's row term is taken as rowsum(dO * O); with
  bfloat16 operands dO V^T stays in float32 and P and dS are rounded to
  bfloat16 before their products, as in the chunked path), with the key
  and value gradients multiplied in a layout XLA:CPU runs on its fast path:
  7-8% of the default job's SFT and RL steps in A/Bs run without jemalloc
  (experiments/bench_ab.md).

  Args:
    q_bhtk: [B, H, T, Dh] queries (compute dtype).
    k_bgsk, v_bgsk: [B, G, S, Dh] keys and values, G divides H; with
      keys_transposed the keys are [B, G, Dh, S] (the KV cache's layout,
      `transformer.init_cache`).
    mask_bts: [B, T, S] bool, True where query t may attend to key s.
    dtype: compute dtype of the value matmul.
    keys_transposed: whether k_bgsk is laid out [B, G, Dh, S].

  Returns:
    [B, H, T, Dh] in `dtype`. A row with no visible key gets the mean of all
    S values (uniform softmax over equal masked scores).
  """
  b, h, t, dh = q_bhtk.shape
  g = k_bgsk.shape[1]
  # Query head h reads kv head h // r (Hugging Face's repeat_kv).
  q_bgrtk = q_bhtk.reshape(b, g, h // g, t, dh)
  out_bgrtk = _dense(
      q_bgrtk,
      k_bgsk,
      v_bgsk,
      mask_bts,
      jnp.dtype(dtype).name,
      keys_transposed,
  )
  return out_bgrtk.reshape(b, h, t, dh)


def _dense_forward(q, k, v, mask_bts, dtype_name: str, keys_transposed: bool):
  """(out [B, G, r, T, Dh] in the compute dtype, probs [B, G, r, T, S] f32)."""
  scale = q.shape[-1] ** -0.5
  ks = "bgks" if keys_transposed else "bgsk"
  # Scores feed the softmax: accumulated and returned in float32.
  scores = (
      jnp.einsum(f"bgrtk,{ks}->bgrts", q, k, preferred_element_type=jnp.float32)
      * scale
  )
  scores = jnp.where(mask_bts[:, None, None], scores, NEG)
  probs = jax.nn.softmax(scores, axis=-1)
  out = jnp.einsum("bgrts,bgsk->bgrtk", probs.astype(jnp.dtype(dtype_name)), v)
  return out, probs


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _dense(q, k, v, mask_bts, dtype_name: str, keys_transposed: bool):
  """`dense_attention` on q [B, G, r, T, Dh]: [B, G, r, T, Dh]."""
  return _dense_forward(q, k, v, mask_bts, dtype_name, keys_transposed)[0]


def _dense_fwd(q, k, v, mask_bts, dtype_name, keys_transposed):
  out, probs = _dense_forward(q, k, v, mask_bts, dtype_name, keys_transposed)
  return out, (q, k, v, mask_bts, out, probs)


def _dense_bwd(dtype_name, keys_transposed, res, g_out):
  """With P the probabilities: dV = P^T dO, dP = dO V^T, dS = P * (dP -
  rowsum(dO * O)) elementwise on visible pairs (0 on masked ones, whose scores are
  constants), dQ = dS K / sqrt(Dh), dK = dS^T Q / sqrt(Dh) (the softmax
  gradient as FlashAttention-2 writes it, arXiv:2307.08691, without the
  recomputation).

  dV and dK contract the query rows (r, t) of both operands. Differentiated
  as written, XLA:CPU multiplies the [.., T, S] block along its non-minor
  axis with its generic dot emitter (~10 GFLOP/s at the default job's
  shapes); here P and dS are first copied into [B, G, S, r * T] (an
  optimization barrier keeps XLA from folding the transpose back into the
  product), so both are plain row-major products on its fast path.
  """
  dt = jnp.dtype(dtype_name)
  q, k, v, mask_bts, out, probs = res
  b, g, r, t, dh = q.shape
  s = v.shape[2]
  scale = dh**-0.5
  do = g_out.astype(dt)
  f32 = jnp.float32
  delta = jnp.sum(do.astype(f32) * out.astype(f32), axis=-1, keepdims=True)
  dp = jnp.einsum("bgrtk,bgsk->bgrts", do, v, preferred_element_type=f32)
  ds = (
      jnp.where(mask_bts[:, None, None], probs * (dp - delta), 0.0) * scale
  ).astype(dt)
  ks = "bgks" if keys_transposed else "bgsk"
  dq = jnp.einsum(f"bgrts,{ks}->bgrtk", ds, k, preferred_element_type=f32)

  def keys_major(x_bgrts):  # [B, G, r, T, S] -> materialised [B, G, S, r T]
    x = jnp.transpose(x_bgrts, (0, 1, 4, 2, 3)).reshape(b, g, s, r * t)
    return jax.lax.optimization_barrier(x)

  rows = lambda x: x.reshape(b, g, r * t, dh)
  dk = jnp.einsum(
      "bgsn,bgnk->bgsk", keys_major(ds), rows(q), preferred_element_type=f32
  )
  dv = jnp.einsum(
      "bgsn,bgnk->bgsk",
      keys_major(probs.astype(dt)),
      rows(do),
      preferred_element_type=f32,
  )
  if keys_transposed:
    dk = jnp.swapaxes(dk, -1, -2)
  return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None


_dense.defvjp(_dense_fwd, _dense_bwd)


def cache_prefix_pays(prefix_len: int, group: int, n: int) -> bool:
  """Whether `cache_prefix_attention` is used for a cache read of n entries.

  Reading the shared entries once per group saves prefix_len (1 - 1/group)
  entries per row; the row part [prefix_len, n) is a slice of each row's
  cache that XLA:CPU copies before its products. The shared read is taken
  when the saving is at least the row part:

      prefix_len (1 - 1 / group) >= n - prefix_len.

  Measured (`python experiments/bench_prefix_decode.py --force`:
  bench_peers' 4-layer model, 64 rows, 64 sampled tokens, a whole rollout
  jitted, 8 interleaved pairs; the slower 2-core machine), grouped minus
  per-row read at (prefix, group): (32, 4) +73 ms of 0.54 s; (64, 4) +63 of
  0.62; (64, 8) +58 of 0.66; (96, 4) -56 of 0.85; (128, 4) -74 of 0.88; with
  the rule, (256, 8) -234 of 1.04 and (512, 8) -373 of 1.51 (paired sd
  36-105 ms over 8 pairs: the losses and the 256 and 512 gains are clear,
  the 96 and 128 gains within ~2 standard errors, so the boundary is
  approximate). See docs/models.md, "A group's prompt read once by the
  decode".

  Args:
    prefix_len: shared entries (static).
    group: rows per group (static).
    n: entries the read covers (a length bucket, static).

  Returns:
    True when 0 < prefix_len < n, group > 1 and the rule above holds.
  """
  if group <= 1 or not 0 < prefix_len < n:
    return False
  return prefix_len * (group - 1) >= (n - prefix_len) * group


def cache_prefix_attention(
    q_bhtk: jax.Array,
    k_bgks: jax.Array,
    v_bgsk: jax.Array,
    mask_bts: jax.Array,
    dtype: Any,
    prefix_len: int,
    group: int,
) -> jax.Array:
  """`dense_attention` over a KV cache whose first entries groups of rows share.

  Rows come in groups of `group` consecutive rows (row i in group i //
  group) whose cache entries [0, prefix_len) are equal: a GRPO group's
  prompt, prefilled once and copied to its rows (`rollout.init_state` with a
  `SharedPrefix`). Those entries are read from each group's first row only,
  by all of the group's queries at once ([n, G, group r T, Dh] products;
  the shared-prompt decomposition of Hydragen, Juravsky et al. 2024,
  arXiv:2402.05099), and the entries [prefix_len, S) from each row's own
  cache; one softmax spans both, and the two value products accumulate in
  float32 and are rounded to the compute dtype once.
  A decode step then reads the prompt's keys and values once per group
  instead of once per row.

  The result is `dense_attention(..., keys_transposed=True)`'s up to float
  rounding when the groups' rows agree on entries [0, prefix_len) (not
  checked: rows that differ attend to their group's first row's entries).

  Args:
    q_bhtk: [B, H, T, Dh] queries (compute dtype).
    k_bgks: [B, G, Dh, S] keys (the cache's transposed layout).
    v_bgsk: [B, G, S, Dh] values.
    mask_bts: [B, T, S] bool, True where query t may attend to key s.
    dtype: compute dtype of the value products.
    prefix_len: static int in (0, S): the shared entries.
    group: static int >= 1 dividing B.

  Returns:
    [B, H, T, Dh] in `dtype`.

  Raises:
    ValueError: `group` does not divide B, or prefix_len is not in (0, S).
  """
  b, h, t, dh = q_bhtk.shape
  g_kv, s = k_bgks.shape[1], k_bgks.shape[3]
  r = h // g_kv
  if group < 1 or b % group:
    raise ValueError(f"group {group} must divide the batch ({b} rows)")
  if not 0 < prefix_len < s:
    raise ValueError(f"prefix_len {prefix_len} must be in (0, {s})")
  n, p = b // group, prefix_len
  scale = dh**-0.5
  f32 = jnp.float32
  # Each group's first row holds the shared entries (a reshape, then index 0
  # of the group axis: rows split over a mesh's batch axes stay in place).
  kp = k_bgks.reshape(n, group, g_kv, dh, s)[:, 0, :, :, :p]  # [n, G, Dh, P]
  vp = v_bgsk.reshape(n, group, g_kv, s, dh)[:, 0, :, :p]  # [n, G, P, Dh]

  def to_groups(x):  # [B, G, r, T, X] -> [n, G, group r T, X]
    return (
        x.reshape(n, group, g_kv, r, t, -1)
        .transpose(0, 2, 1, 3, 4, 5)
        .reshape(n, g_kv, group * r * t, -1)
    )

  def to_rows(x):  # the inverse: [n, G, group r T, X] -> [B, G, r, T, X]
    return (
        x.reshape(n, g_kv, group, r, t, -1)
        .transpose(0, 2, 1, 3, 4, 5)
        .reshape(b, g_kv, r, t, -1)
    )

  q_bgrtk = q_bhtk.reshape(b, g_kv, r, t, dh)
  # The group's queries as one [group r T] block per (group, kv head).
  sp = to_rows(
      jnp.einsum(
          "ngik,ngks->ngis", to_groups(q_bgrtk), kp, preferred_element_type=f32
      )
  )
  sr = jnp.einsum(
      "bgrtk,bgks->bgrts",
      q_bgrtk,
      k_bgks[..., p:],
      preferred_element_type=f32,
  )
  scores = jnp.concatenate([sp, sr], axis=-1) * scale
  scores = jnp.where(mask_bts[:, None, None], scores, NEG)
  probs = jax.nn.softmax(scores, axis=-1).astype(jnp.dtype(dtype))
  op = to_rows(
      jnp.einsum(
          "ngis,ngsk->ngik",
          to_groups(probs[..., :p]),
          vp,
          preferred_element_type=f32,
      )
  )
  orow = jnp.einsum(
      "bgrts,bgsk->bgrtk",
      probs[..., p:],
      v_bgsk[:, :, p:],
      preferred_element_type=f32,
  )
  return (op + orow).astype(jnp.dtype(dtype)).reshape(b, h, t, dh)


def uses_chunked(impl: str, length: int, block: int) -> bool:
  """Whether a cache-free forward of `length` positions takes the chunked path.

  'dense' never, 'chunked' always, 'auto' when the sequence is longer than
  one block (at or below one block both forms hold a [B, H, T, T] block).

  Raises:
    ValueError: unknown impl.
  """
  if impl not in IMPLS:
    raise ValueError(f"attention_impl={impl!r}: unknown; known: {IMPLS}")
  return impl == "chunked" or (impl == "auto" and length > block)


def self_attention(
    q_bhtk: jax.Array,
    k_bgtk: jax.Array,
    v_bgtk: jax.Array,
    mask: SelfMask,
    *,
    impl: str,
    block: int,
    dtype: Any,
) -> jax.Array:
  """Cache-free attention of a whole sequence, dense or chunked (`uses_chunked`).

  Args:
    q_bhtk: [B, H, T, Dh]; k_bgtk, v_bgtk: [B, G, T, Dh].
    mask: SelfMask of the T positions.
    impl: 'auto', 'dense' or 'chunked'.
    block: positions per query/key block of the chunked path.
    dtype: compute dtype.

  Returns:
    [B, H, T, Dh] in `dtype`.
  """
  if uses_chunked(impl, q_bhtk.shape[2], block):
    return chunked_attention(
        q_bhtk, k_bgtk, v_bgtk, mask, block=block, dtype=dtype
    )
  return dense_attention(q_bhtk, k_bgtk, v_bgtk, mask.dense(), dtype)


def chunked_attention(
    q_bhtk: jax.Array,
    k_bgtk: jax.Array,
    v_bgtk: jax.Array,
    mask: SelfMask,
    *,
    block: int,
    dtype: Any,
) -> jax.Array:
  """Causal self-attention in blocks, without a [B, H, T, T] array (module doc).

  T is split into n = ceil(T / block) blocks of equal size b = ceil(T / n)
  (the sequence is padded with masked keys up to n * b); query block i reads
  key blocks 0..i, and the backward pass (custom VJP) recomputes the scores of
  the same block pairs. Peak extra memory per call: a few [B, H, b, b] float32
  blocks plus O(B H T Dh).

  Args:
    q_bhtk: [B, H, T, Dh] queries; k_bgtk, v_bgtk: [B, G, T, Dh] keys and
      values (G divides H), all in the compute dtype.
    mask: SelfMask of the T positions (positions must grow with the index
      among the valid tokens of a segment; see the module doc).
    block: target block size in positions (> 0).
    dtype: compute dtype of the value matmuls and of the output.

  Returns:
    [B, H, T, Dh] in `dtype`; equal to `dense_attention` with `mask.dense()`
    on every query that sees at least one key, up to float32 rounding.

  Raises:
    ValueError: block <= 0.
  """
  if isinstance(block, bool) or not isinstance(block, int) or block <= 0:
    raise ValueError(f"attention_block={block!r}: must be a positive integer")
  b, h, t, dh = q_bhtk.shape
  g = k_bgtk.shape[1]
  r = h // g
  nb = -(-t // block)
  bs = -(-t // nb)
  tp = nb * bs
  pad = tp - t
  pos = mask.positions_bt.astype(jnp.int32)
  valid = (
      jnp.ones((b, t), bool)
      if mask.valid_bt is None
      else mask.valid_bt.astype(bool)
  )
  seg = (
      jnp.zeros((b, t), jnp.int32)
      if mask.segment_bt is None
      else mask.segment_bt.astype(jnp.int32)
  )
  q = q_bhtk.reshape(b, g, r, t, dh)
  k, v = k_bgtk, v_bgtk
  if pad:
    q = jnp.pad(q, ((0, 0),) * 3 + ((0, pad), (0, 0)))
    k = jnp.pad(k, ((0, 0), (0, 0), (0, pad), (0, 0)))
    v = jnp.pad(v, ((0, 0), (0, 0), (0, pad), (0, 0)))
    pos = jnp.pad(pos, ((0, 0), (0, pad)))
    valid = jnp.pad(valid, ((0, 0), (0, pad)))  # padded keys are invalid
    seg = jnp.pad(seg, ((0, 0), (0, pad)))
  out = _flash(
      q.astype(dtype),
      k.astype(dtype),
      v.astype(dtype),
      (pos, valid, seg),
      bs,
      jnp.dtype(dtype).name,
  )
  return out[:, :, :, :t].reshape(b, h, t, dh)


def _slice(x: jax.Array, start, size: int, axis: int) -> jax.Array:
  return jax.lax.dynamic_slice_in_dim(x, start, size, axis)


def _block_mask(masks, i, j, bs: int) -> jax.Array:
  """[B, 1, 1, bs, bs] bool mask of query block i against key block j."""
  pos, valid, seg = masks
  qp, kp = _slice(pos, i * bs, bs, 1), _slice(pos, j * bs, bs, 1)
  qs, ks = _slice(seg, i * bs, bs, 1), _slice(seg, j * bs, bs, 1)
  kv = _slice(valid, j * bs, bs, 1)
  qi = i * bs + jnp.arange(bs)
  kj = j * bs + jnp.arange(bs)
  m = (
      (kp[:, None, :] <= qp[:, :, None])
      & kv[:, None, :]
      & (ks[:, None, :] == qs[:, :, None])
      & (kj[None, :] <= qi[:, None])[None]
  )
  return m[:, None, None]


def _scores(q_i, k_j, mask_ij, scale):
  """Masked float32 scores [B, G, r, bs, bs] of one block pair."""
  s = (
      jnp.einsum(
          "bgrqd,bgkd->bgrqk", q_i, k_j, preferred_element_type=jnp.float32
      )
      * scale
  )
  return jnp.where(mask_ij, s, NEG)


def _forward(q, k, v, masks, bs: int, dtype_name: str):
  """(out [B, G, r, Tp, Dh] in the compute dtype, lse [B, G, r, Tp] f32)."""
  dt = jnp.dtype(dtype_name)
  b, g, r, tp, dh = q.shape
  nb = tp // bs
  scale = dh**-0.5

  def q_block(i):
    q_i = _slice(q, i * bs, bs, 3)

    def body(j, carry):
      m, l, acc = carry
      k_j, v_j = _slice(k, j * bs, bs, 2), _slice(v, j * bs, bs, 2)
      s = _scores(q_i, k_j, _block_mask(masks, i, j, bs), scale)
      m_new = jnp.maximum(m, jnp.max(s, axis=-1))
      p = jnp.exp(s - m_new[..., None])
      corr = jnp.exp(m - m_new)
      l = l * corr + jnp.sum(p, axis=-1)
      acc = acc * corr[..., None] + jnp.einsum(
          "bgrqk,bgkd->bgrqd",
          p.astype(dt),
          v_j,
          preferred_element_type=jnp.float32,
      )
      return m_new, l, acc

    init = (
        jnp.full((b, g, r, bs), -jnp.inf, jnp.float32),
        jnp.zeros((b, g, r, bs), jnp.float32),
        jnp.zeros((b, g, r, bs, dh), jnp.float32),
    )
    # Key blocks 0..i: the row maximum's own term is exp(0) = 1, so l >= 1.
    m, l, acc = jax.lax.fori_loop(0, i + 1, body, init)
    return (acc / l[..., None]).astype(dt), m + jnp.log(l)

  out, lse = jax.lax.map(q_block, jnp.arange(nb))  # [nb, B, G, r, bs, ...]
  out = jnp.moveaxis(out, 0, 3).reshape(b, g, r, tp, dh)
  lse = jnp.moveaxis(lse, 0, 3).reshape(b, g, r, tp)
  return out, lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _flash(q, k, v, masks, bs: int, dtype_name: str):
  """Chunked attention on padded inputs: q [B, G, r, Tp, Dh], k, v
  [B, G, Tp, Dh], masks (pos, valid, seg) each [B, Tp]; Tp = n * bs."""
  return _forward(q, k, v, masks, bs, dtype_name)[0]


def _flash_fwd(q, k, v, masks, bs, dtype_name):
  out, lse = _forward(q, k, v, masks, bs, dtype_name)
  return out, (q, k, v, masks, out, lse)


def _flash_bwd(bs, dtype_name, res, g_out):
  """FlashAttention-2 backward (arXiv:2307.08691, Algorithm 2): with
  P = exp(S - lse), dV = P^T dO, dP = dO V^T, dS = P (dP - rowsum(dO * O)),
  dQ = dS K / sqrt(Dh), dK = dS^T Q / sqrt(Dh); key block j visits query
  blocks j..n-1 and accumulates dK_j, dV_j in float32; dQ is accumulated in a
  float32 [B, G, r, Tp, Dh] carry."""
  dt = jnp.dtype(dtype_name)
  q, k, v, masks, out, lse = res
  b, g, r, tp, dh = q.shape
  nb = tp // bs
  scale = dh**-0.5
  do = g_out.astype(dt)
  delta = jnp.sum(do.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)

  def k_block(dq, j):
    k_j, v_j = _slice(k, j * bs, bs, 2), _slice(v, j * bs, bs, 2)

    def body(i, carry):
      dk_t, dv_t, dq = carry
      q_i, do_i = _slice(q, i * bs, bs, 3), _slice(do, i * bs, bs, 3)
      lse_i, delta_i = _slice(lse, i * bs, bs, 3), _slice(delta, i * bs, bs, 3)
      mask_ij = _block_mask(masks, i, j, bs)
      p = jnp.exp(_scores(q_i, k_j, mask_ij, scale) - lse_i[..., None])
      # dV_j^T = dO^T P and dK_j^T = Q^T dS, accumulated as [.., Dh, bs]:
      # the product contracts the query rows of both operands, and XLA:CPU
      # copies one operand into a transposed layout first; written this way
      # it transposes the [.., rq, Dh] operand, not the [.., rq, bs] block
      # (bs / Dh = 4x less copying at bs 256, Dh 64; same numbers).
      dv_t = dv_t + jnp.einsum(
          "bgrqd,bgrqk->bgdk",
          do_i,
          p.astype(dt),
          preferred_element_type=jnp.float32,
      )
      dp = jnp.einsum(
          "bgrqd,bgkd->bgrqk", do_i, v_j, preferred_element_type=jnp.float32
      )
      # Masked scores are constants: no gradient flows into them.
      ds = (
          jnp.where(mask_ij, p * (dp - delta_i[..., None]), 0.0) * scale
      ).astype(dt)
      dq_i = _slice(dq, i * bs, bs, 3) + jnp.einsum(
          "bgrqk,bgkd->bgrqd", ds, k_j, preferred_element_type=jnp.float32
      )
      dq = jax.lax.dynamic_update_slice_in_dim(dq, dq_i, i * bs, 3)
      dk_t = dk_t + jnp.einsum(
          "bgrqd,bgrqk->bgdk", q_i, ds, preferred_element_type=jnp.float32
      )
      return dk_t, dv_t, dq

    zeros = jnp.zeros((b, g, dh, bs), jnp.float32)
    dk_t, dv_t, dq = jax.lax.fori_loop(j, nb, body, (zeros, zeros, dq))
    return dq, (dk_t, dv_t)

  dq, (dk_t, dv_t) = jax.lax.scan(
      k_block, jnp.zeros(q.shape, jnp.float32), jnp.arange(nb)
  )
  # [nb, B, G, Dh, bs] -> [B, G, nb * bs, Dh]
  dk = jnp.moveaxis(jnp.swapaxes(dk_t, -1, -2), 0, 2).reshape(b, g, tp, dh)
  dv = jnp.moveaxis(jnp.swapaxes(dv_t, -1, -2), 0, 2).reshape(b, g, tp, dh)
  return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None


_flash.defvjp(_flash_fwd, _flash_bwd)
