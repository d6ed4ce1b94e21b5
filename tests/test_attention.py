"""Chunked (online-softmax) attention: same values and gradients as the dense
attention, no [B, H, T, T] buffer in the compiled program, segment masking.

References: `attention.dense_attention` (the formulation the model used before
the chunked one, forming the full score array) in float32 on the same inputs;
for segments, separate forwards of the unpacked sequences. Both forms have
custom gradients that share the row term rowsum(dO * O); the dense one is
checked against float64 numpy in tests/test_backward_layouts.py.
"""

import re
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from agentic_rl.models import attention
from agentic_rl.models import transformer
from tests import fakes

BF16_EPS = 2.0**-8  # bfloat16 unit roundoff (8 significant bits)
# float32: both forms sum the same T products per output, in a different
# order and (chunked) rescaled by exp(m_old - m_new) once per key block, so
# they differ by a few float32 ulps (eps = 1.2e-7) per term of the O(1) sums;
# 1e-5 relative to the largest value is ~80 ulps, far above that and far below
# any masking or indexing error (which moves values by O(1)).
F32_TOL = 1e-5


def _inputs(b, h, g, t, dh, seed=0, scale=1.0):
  k = jax.random.split(jax.random.PRNGKey(seed), 4)
  q = scale * jax.random.normal(k[0], (b, h, t, dh))
  kk = scale * jax.random.normal(k[1], (b, g, t, dh))
  v = jax.random.normal(k[2], (b, g, t, dh))
  w = jax.random.normal(k[3], (b, h, t, dh))
  return q, kk, v, w


def _packed_mask(b, t):
  """Row 0: one sequence, all valid. Row 1: two packed segments (positions
  restart at 9) and right padding from 29 on. Row 2 (if any): left padding
  of 5 with positions counting real tokens only (Transformer.reward)."""
  idx = np.arange(t)
  pos = np.tile(idx, (b, 1))
  valid = np.ones((b, t), bool)
  seg = np.zeros((b, t), np.int32)
  seg[1, 9:] = 1
  pos[1, 9:] = idx[9:] - 9
  valid[1, 29:] = False
  if b > 2:
    valid[2, :5] = False
    pos[2] = np.maximum(np.cumsum(valid[2]) - 1, 0)
  return (
      attention.SelfMask(
          jnp.asarray(pos, jnp.int32), jnp.asarray(valid), jnp.asarray(seg)
      ),
      valid,
  )


def _max_rel(a, b, rows):
  """max |a - b| over query rows `rows` ([B, T] bool), over max |b| there."""
  m = np.asarray(rows)[:, None, :, None]
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return np.abs((a - b) * m).max() / np.abs(b * m).max()


@pytest.mark.parametrize("block", [8, 13, 64])
def test_chunked_equals_dense_values_and_gradients_float32(block):
  # GQA (6 query heads on 2 kv heads), T = 40 not a multiple of most block
  # sizes, packed segments, right and left padding; block 64 > T is one block.
  b, h, g, t, dh = 3, 6, 2, 40, 16
  q, k, v, w = _inputs(b, h, g, t, dh)
  mask, valid = _packed_mask(b, t)
  dense = lambda q, k, v: attention.dense_attention(
      q, k, v, mask.dense(), jnp.float32
  )
  chunk = lambda q, k, v: attention.chunked_attention(
      q, k, v, mask, block=block, dtype=jnp.float32
  )
  # Padding queries (no visible key, or outputs nobody reads) are excluded
  # from the comparison and get no cotangent (module doc).
  wv = w * valid[:, None, :, None]
  loss = lambda f: lambda q, k, v: jnp.sum(f(q, k, v) * wv)
  o_dense = jax.jit(dense)(q, k, v)
  assert _max_rel(jax.jit(chunk)(q, k, v), o_dense, valid) < F32_TOL
  g_dense = jax.jit(jax.grad(loss(dense), (0, 1, 2)))(q, k, v)
  g_chunk = jax.jit(jax.grad(loss(chunk), (0, 1, 2)))(q, k, v)
  every = np.ones((b, t), bool)
  for name, gc, gd in zip("qkv", g_chunk, g_dense):
    assert _max_rel(gc, gd, every) < F32_TOL, name
  # Masking really matters here: a key past the boundary changes the values.
  # (Compiled as one program rather than run op by op.)
  no_seg = mask._replace(segment_bt=None)
  other = jax.jit(
      lambda q, k, v: attention.chunked_attention(
          q, k, v, no_seg, block=block, dtype=jnp.float32
      )
  )(q, k, v)
  assert _max_rel(other, o_dense, valid) > 0.01


def test_chunked_bfloat16_is_as_close_to_float32_as_dense_bfloat16():
  # bf16 inputs (exact in both dtypes), compared with the float32 dense
  # attention on the same values. Allowed error: the probabilities are
  # rounded to bf16 for the value matmul and the output to bf16, each half an
  # ulp (BF16_EPS / 2 relative); the backward pass rounds dS and P for its
  # matmuls once more: 2 * BF16_EPS relative to the largest value for both.
  b, h, g, t, dh = 2, 6, 2, 70, 32
  q, k, v, w = _inputs(b, h, g, t, dh, seed=1, scale=2.0)
  q, k, v = (x.astype(jnp.bfloat16) for x in (q, k, v))
  mask, valid = _packed_mask(b, t)
  f32 = lambda x: x.astype(jnp.float32)
  wv = w * valid[:, None, :, None]
  ref = lambda q, k, v: attention.dense_attention(
      q, k, v, mask.dense(), jnp.float32
  )
  impls = {
      "dense": lambda q, k, v: attention.dense_attention(
          q, k, v, mask.dense(), jnp.bfloat16
      ),
      "chunked": lambda q, k, v: attention.chunked_attention(
          q, k, v, mask, block=16, dtype=jnp.bfloat16
      ),
  }
  loss = lambda f: lambda q, k, v: jnp.sum(f32(f(q, k, v)) * wv)
  o_ref = jax.jit(ref)(f32(q), f32(k), f32(v))
  g_ref = jax.jit(jax.grad(loss(ref), (0, 1, 2)))(f32(q), f32(k), f32(v))
  every = np.ones((b, t), bool)
  for name, f in impls.items():
    out = jax.jit(f)(q, k, v)
    assert out.dtype == jnp.bfloat16
    assert _max_rel(f32(out), o_ref, valid) < 2 * BF16_EPS, name
    grads = jax.jit(jax.grad(loss(f), (0, 1, 2)))(q, k, v)
    for gname, gc, gr in zip("qkv", grads, g_ref):
      assert gc.dtype == jnp.bfloat16
      assert _max_rel(f32(gc), gr, every) < 2 * BF16_EPS, (name, gname)


def test_chunked_matmuls_take_bf16_and_accumulate_float32():
  # Structural check on the lowered bf16 program: every dot (scores q k^T and
  # the probability-value product) has bfloat16 operands and a float32
  # result, so no score or partial value sum is rounded to bfloat16.
  q, k, v, _ = _inputs(1, 2, 1, 32, 16)
  q, k, v = (x.astype(jnp.bfloat16) for x in (q, k, v))
  mask = attention.SelfMask(jnp.broadcast_to(jnp.arange(32), (1, 32)))
  f = lambda q, k, v: attention.chunked_attention(
      q, k, v, mask, block=8, dtype=jnp.bfloat16
  )
  dots = [
      line
      for line in jax.jit(f).lower(q, k, v).as_text().splitlines()
      if "stablehlo.dot_general" in line
  ]
  sigs = [
      re.search(r": \((.*)\) -> (tensor<\S+>)", line).groups() for line in dots
  ]
  # Scores [1, G=1, r=2, 8, 8] from [.., 8, Dh=16] blocks; values [.., 8, 16].
  assert (
      "tensor<1x1x2x8x16xbf16>, tensor<1x1x8x16xbf16>",
      "tensor<1x1x2x8x8xf32>",
  ) in sigs
  assert (
      "tensor<1x1x2x8x8xbf16>, tensor<1x1x8x16xbf16>",
      "tensor<1x1x2x8x16xf32>",
  ) in sigs
  assert all("f32" not in ops and out.endswith("xf32>") for ops, out in sigs)


def _compiled(f, *args):
  return jax.jit(f).lower(*args).compile()


def test_chunked_gradient_program_has_no_t_by_t_buffer():
  # SmolLM2-135M attention shape (9 query heads, 3 kv heads, head_dim 64) at
  # T = 1024: the dense gradient program holds [.., 1024, 1024] float32
  # arrays (scores, probabilities: 9 * 1024^2 * 4 B = 36 MiB each); the
  # chunked one only [.., 256, 256] blocks.
  b, h, g, t, dh = 1, 9, 3, 1024, 64
  spec = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
  args = (spec(b, h, t, dh), spec(b, g, t, dh), spec(b, g, t, dh))
  mask = attention.SelfMask(jnp.broadcast_to(jnp.arange(t), (b, t)))

  def loss(impl):
    def f(q, k, v):
      out = attention.self_attention(
          q, k, v, mask, impl=impl, block=256, dtype=jnp.float32
      )
      return jnp.sum(out * out)

    return jax.grad(f, (0, 1, 2))

  dense, chunk = _compiled(loss("dense"), *args), _compiled(
      loss("chunked"), *args
  )
  square = re.compile(r"\[[0-9,]*\b1024,1024\]")
  assert square.search(dense.as_text())  # the check can see such buffers
  assert not square.search(chunk.as_text())
  temp = lambda c: c.memory_analysis().temp_size_in_bytes
  one_scores = h * t * t * 4
  # Measured: dense 113 MiB, chunked 16 MiB (a few [B, H, T, Dh] float32
  # arrays of 2.25 MiB: dQ, dO, the output, the saved blocks' outputs).
  assert temp(dense) >= 2 * one_scores
  assert temp(chunk) < min(one_scores / 2, temp(dense) / 5), (
      temp(chunk),
      temp(dense),
  )


def test_chunked_backward_transposes_the_small_operand():
  # dV_j = P^T dO and dK_j = dS^T Q contract the query rows of a
  # [B, G, r*bs, bs] probability block with a [B, G, r*bs, Dh] operand;
  # XLA:CPU makes one of them row-contiguous with a transposed copy before
  # the product. The backward is written so that the copy is the
  # [B, G, Dh, r*bs] operand, not the [B, G, bs, r*bs] block (4x more bytes
  # at bs 256, Dh 64; measured 15-20% of the attention gradient at the
  # SmolLM2-135M shape, experiments/bench_real.md). Shapes here: B 1 (XLA
  # drops it), G 3, r 3, bs 32, Dh 8: the two products that contract the
  # r*bs = 96 query rows must produce [G, Dh, bs] = f32[3,8,32] (the small
  # operand transposed), not [G, bs, Dh] = f32[3,32,8].
  b, h, g, t, dh, bs = 1, 9, 3, 64, 8, 32
  spec = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
  args = (spec(b, h, t, dh), spec(b, g, t, dh), spec(b, g, t, dh))
  mask = attention.SelfMask(jnp.broadcast_to(jnp.arange(t), (b, t)))

  def f(q, k, v):
    out = attention.self_attention(
        q, k, v, mask, impl="chunked", block=bs, dtype=jnp.float32
    )
    return jnp.sum(out * out)

  text = _compiled(jax.grad(f, (0, 1, 2)), *args).as_text()
  dots = [l for l in text.splitlines() if " dot(" in l]
  assert sum("= f32[3,8,32]" in l for l in dots) == 2, dots
  assert not any("= f32[3,32,8]" in l for l in dots), dots


def _tiny(impl, **kw):
  # One block: chunked and dense attention are compared block by block (logits,
  # gradients, packed hidden states), at any depth; every compiled forward and
  # backward unrolls every block.
  cfg = transformer.TransformerConfig(
      vocab_size=50,
      d_model=48,
      num_layers=1,
      num_heads=6,
      num_kv_heads=2,
      head_dim=8,
      ffn_dim=64,
      attention_impl=impl,
      attention_block=8,
      **kw,
  )
  return transformer.Transformer(cfg, nnx.Rngs(params=0))


@pytest.mark.parametrize("remat", [False, True])
def test_model_chunked_equals_dense_logits_and_gradients(remat):
  tokens = jax.random.randint(jax.random.PRNGKey(2), (2, 29), 0, 50)
  grads, logits = {}, {}
  for impl in ("dense", "chunked"):
    graphdef, params = nnx.split(_tiny(impl, remat=remat))

    def loss(params, graphdef=graphdef):
      lg, _ = nnx.merge(graphdef, params)(tokens)
      return jnp.mean(jax.nn.log_softmax(lg)[..., 0]), lg

    (_, logits[impl]), grads[impl] = jax.jit(
        jax.value_and_grad(loss, has_aux=True)
    )(params)
  np.testing.assert_allclose(
      logits["chunked"],
      logits["dense"],
      rtol=0,
      atol=F32_TOL * np.abs(logits["dense"]).max(),
  )
  for gc, gd in zip(
      jax.tree.leaves(grads["chunked"]), jax.tree.leaves(grads["dense"])
  ):
    np.testing.assert_allclose(gc, gd, rtol=0, atol=F32_TOL * np.abs(gd).max())


@pytest.mark.parametrize("impl", ["dense", "chunked"])
def test_packed_segments_equal_separate_forwards(impl):
  # Two sequences of 11 and 14 tokens packed in one row of 28 (3 pad tokens),
  # positions restarting at the second: each segment's hidden states equal
  # those of its own unpacked forward.
  model = _tiny(impl)
  a = jax.random.randint(jax.random.PRNGKey(3), (1, 11), 0, 50)
  c = jax.random.randint(jax.random.PRNGKey(4), (1, 14), 0, 50)
  packed = jnp.concatenate([a, c, jnp.zeros((1, 3), a.dtype)], axis=1)
  seg = jnp.asarray([[0] * 11 + [1] * 14 + [2] * 3], jnp.int32)
  pos = jnp.asarray([list(range(11)) + list(range(14)) + [0, 1, 2]], jnp.int32)
  # The packed and the two separate forwards in one program.
  h_packed, h_a, h_c = nnx.jit(
      lambda m, packed, pos, seg, a, c: (
          m.hidden_states(packed, pos, segment_ids_bt=seg)[0],
          m.hidden_states(a)[0],
          m.hidden_states(c)[0],
      )
  )(model, packed, pos, seg, a, c)
  np.testing.assert_allclose(h_packed[:, :11], h_a, rtol=0, atol=1e-5)
  np.testing.assert_allclose(h_packed[:, 11:25], h_c, rtol=0, atol=1e-5)


def test_attention_config_errors_name_the_field():
  with pytest.raises(ValueError, match=r"attention_impl='flash'"):
    transformer.TransformerConfig(attention_impl="flash")
  with pytest.raises(ValueError, match=r"attention_block=0"):
    transformer.TransformerConfig(attention_block=0)
  with pytest.raises(ValueError, match="only supported without a KV cache"):
    model = _tiny("chunked")
    cache = transformer.init_cache(model.cfg, 1, 8)
    model.hidden_states(
        jnp.zeros((1, 2), jnp.int32),
        cache=cache,
        segment_ids_bt=jnp.zeros((1, 2), jnp.int32),
    )


_MESH = textwrap.dedent("""
    import collections, re
    import jax, jax.numpy as jnp
    from flax import nnx
    from agentic_rl import sampling, sharding
    from agentic_rl.models import transformer as T

    def all_reduces(impl):
      # 2-layer GQA model (H 8, G 4) on a tensor = 4 mesh, T = 32 in 4 blocks.
      cfg = T.TransformerConfig(vocab_size=256, d_model=64, num_layers=2,
                                num_heads=8, num_kv_heads=4, head_dim=16,
                                ffn_dim=128, attention_impl=impl,
                                attention_block=8)
      graphdef, params = nnx.split(T.Transformer(cfg, nnx.Rngs(0)))
      mesh = sharding.make_mesh(dict(data=1, fsdp=1, tensor=4),
                                devices=jax.devices()[:4])
      params = jax.device_put(params, sharding.tree_shardings(params, mesh))
      tokens = sharding.put_batch(jnp.zeros((8, 32), jnp.int32), mesh)
      loss = lambda p, t: sampling.token_logprobs(graphdef, p, t, 1.0)[0].sum()
      with jax.set_mesh(mesh):
        hlo = jax.jit(jax.grad(loss)).lower(params, tokens).compile().as_text()
      ops = re.findall(r"(all-reduce|all-gather|collective-permute|all-to-all|"
                       r"reduce-scatter)(?:-start)?\\(", hlo)
      return collections.Counter(ops)

    dense, chunked = all_reduces("dense"), all_reduces("chunked")
    assert chunked == dense and set(chunked) == {"all-reduce"}, (dense, chunked)
    print("OK", dict(chunked))
""")


@pytest.mark.slow
def test_chunked_attention_adds_no_collectives_under_tensor_parallelism():
  # Query/kv heads are split over 'tensor'; the chunked blocks slice only the
  # sequence axis, so its forward + backward compiles to the same all-reduces
  # as the dense form (Megatron-style, counted in tests/test_mesh_waste.py).
  out = fakes.run_on_8_devices(_MESH)
  assert "OK" in out, out


@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (2, 2)])
def test_dense_attention_with_transposed_keys_matches_numpy(heads, kv_heads):
  """The KV cache's key layout [B, G, Dh, S] (`keys_transposed`): the same
  values as softmax(q k^T / sqrt(Dh) masked) v computed in float64 numpy
  with the keys [B, G, S, Dh], query head h reading kv head h // (H / G)."""
  b, t, s, dh = 3, 2, 7, 8
  rng = np.random.default_rng(0)
  q = rng.standard_normal((b, heads, t, dh)).astype(np.float32)
  k = rng.standard_normal((b, kv_heads, s, dh)).astype(np.float32)
  v = rng.standard_normal((b, kv_heads, s, dh)).astype(np.float32)
  mask = rng.random((b, t, s)) < 0.7
  mask[:, :, 0] = True  # every query sees at least one key
  r = heads // kv_heads
  k_h = np.repeat(k, r, axis=1).astype(np.float64)
  v_h = np.repeat(v, r, axis=1).astype(np.float64)
  scores = np.einsum("bhtk,bhsk->bhts", q.astype(np.float64), k_h) / dh**0.5
  scores = np.where(mask[:, None], scores, -np.inf)
  p = np.exp(scores - scores.max(-1, keepdims=True))
  want = np.einsum("bhts,bhsk->bhtk", p / p.sum(-1, keepdims=True), v_h)
  got = attention.dense_attention(
      jnp.asarray(q),
      jnp.asarray(k).transpose(0, 1, 3, 2),
      jnp.asarray(v),
      jnp.asarray(mask),
      jnp.float32,
      keys_transposed=True,
  )
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
  plain = attention.dense_attention(
      jnp.asarray(q),
      jnp.asarray(k),
      jnp.asarray(v),
      jnp.asarray(mask),
      jnp.float32,
  )
  np.testing.assert_allclose(got, plain, rtol=0, atol=1e-6)
