"""Custom gradients written for XLA:CPU's fast products: the dense attention's
(`attention._dense_bwd`) and the fused gate/up product's
(`transformer.gate_up_product`).

Values: the dense attention's gradients against float64 numpy formulas (a
fully masked query row included: its scores are constants, so it passes no
gradient to q or k); the gate/up gradients against autodiff of the plain
product and slices. Cost: in the compiled gradient every product contracts
its left operand's minor (fastest-varying) dimension, the form XLA:CPU hands
to its fast matmul kernels; autodiff's dV = P^T dO contracts the query axis
of the [.., T, S] probabilities instead (a generic, several times slower
product, experiments/bench_ab.md), and autodiff of the gate/up slices
zero-pads each cotangent (`pad` instructions).
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentic_rl.models import attention
from agentic_rl.models import transformer

_DEF = re.compile(
    r"%?([\w.\-]+) = (?:[a-z0-9]+)\[([\d,]*)\]\{([\d,]*)\}"
)  # name = f32[dims]{layout}
_PARAM = re.compile(r"([\w.\-]+): (?:[a-z0-9]+)\[([\d,]*)\]")
_DOT = re.compile(
    r"= (?:[a-z0-9]+)\[[\d,]*\]\{[\d,]*\} dot\(%?([\w.\-]+), %?([\w.\-]+)\)"
    r".*?lhs_contracting_dims=\{([\d,]*)\}"
)


def _dots_lhs(hlo: str) -> list[tuple[str, list[int], list[int], list[int]]]:
  """(name, lhs dims, lhs layout minor-to-major, lhs contracting dims) of
  every dot in a compiled module's text, inside fusions too. A fused
  computation's parameters print without a layout there; they take the
  row-major default (XLA:CPU's layout of every fusion operand)."""
  shapes = {}
  for line in hlo.splitlines():
    for m in _PARAM.finditer(line.split("->")[0] if "(" in line else ""):
      dims = [int(x) for x in m.group(2).split(",") if x]
      shapes.setdefault(m.group(1), (dims, list(range(len(dims)))[::-1]))
    m = _DEF.search(line)
    if m:
      dims = [int(x) for x in m.group(2).split(",") if x]
      layout = [int(x) for x in m.group(3).split(",") if x]
      shapes[m.group(1)] = (dims, layout)
  out = []
  for line in hlo.splitlines():
    m = _DOT.search(line)
    if m:
      dims, layout = shapes[m.group(1)]
      contracting = [int(x) for x in m.group(3).split(",") if x]
      out.append((m.group(1), dims, layout, contracting))
  return out


def _violations(hlo: str) -> list:
  """The dots whose contracted dimensions are not their left operand's
  fastest-varying ones; raises if the module has no dot at all (a parse
  failure must not pass as 'no violation' or as a violation)."""
  dots = _dots_lhs(hlo)
  if not dots:
    raise ValueError("no dot found in the compiled module")
  return [
      (name, dims, layout, contracting)
      for name, dims, layout, contracting in dots
      if sorted(contracting) != sorted(layout[: len(contracting)])
  ]


def _attention_numpy(q, k, v, mask, w):
  """float64 out and (dq, dk, dv) of sum(out * w) for q [B, H, T, Dh], k, v
  [B, G, S, Dh], query head h reading kv head h // (H / G)."""
  q, k, v, w = (np.asarray(x, np.float64) for x in (q, k, v, w))
  r = q.shape[1] // k.shape[1]
  kh, vh = np.repeat(k, r, axis=1), np.repeat(v, r, axis=1)
  dh = q.shape[-1]
  s = np.einsum("bhtk,bhsk->bhts", q, kh) / dh**0.5
  m = np.broadcast_to(mask[:, None], s.shape)
  s = np.where(m, s, -1e30)  # a fully masked row: uniform probabilities
  p = np.exp(s - s.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  out = np.einsum("bhts,bhsk->bhtk", p, vh)
  dp = np.einsum("bhtk,bhsk->bhts", w, vh)
  ds = p * (dp - (dp * p).sum(-1, keepdims=True))
  ds = np.where(m, ds, 0.0) / dh**0.5  # masked scores are constants
  dq = np.einsum("bhts,bhsk->bhtk", ds, kh)
  dkh = np.einsum("bhts,bhtk->bhsk", ds, q)
  dvh = np.einsum("bhts,bhtk->bhsk", p, w)
  fold = lambda x: x.reshape(x.shape[0], k.shape[1], r, *x.shape[2:]).sum(2)
  return out, (dq, fold(dkh), fold(dvh))


@pytest.mark.parametrize(
    "heads,kv_heads,keys_transposed",
    [(4, 2, False), (2, 2, False), (6, 2, True)],
)
def test_dense_attention_gradients_match_float64_numpy(
    heads, kv_heads, keys_transposed
):
  b, t, s, dh = 2, 5, 7, 8
  rng = np.random.default_rng(1)
  q = rng.standard_normal((b, heads, t, dh)).astype(np.float32)
  k = rng.standard_normal((b, kv_heads, s, dh)).astype(np.float32)
  v = rng.standard_normal((b, kv_heads, s, dh)).astype(np.float32)
  w = rng.standard_normal((b, heads, t, dh)).astype(np.float32)
  mask = rng.random((b, t, s)) < 0.6
  mask[:, :, 0] = True
  mask[1, 2] = False  # one query with no visible key
  want_out, want_grads = _attention_numpy(q, k, v, mask, w)

  def f(q, k, v):
    kk = k.transpose(0, 1, 3, 2) if keys_transposed else k
    out = attention.dense_attention(
        q, kk, v, jnp.asarray(mask), jnp.float32, keys_transposed
    )
    return jnp.sum(out * w), out

  (_, out), grads = jax.value_and_grad(f, (0, 1, 2), has_aux=True)(
      jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
  )
  np.testing.assert_allclose(out, want_out, rtol=0, atol=1e-5)
  for got, want in zip(grads, want_grads):
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
  # The fully masked row passes nothing to its queries.
  assert np.all(np.asarray(grads[0])[1, :, 2] == 0.0)


def test_dense_attention_bfloat16_gradients_within_bf16_rounding():
  b, h, g, t, dh = 2, 4, 2, 6, 8
  rng = np.random.default_rng(2)
  # The inputs rounded to bf16 first: the reference sees what the model sees.
  rnd = lambda x: np.asarray(jnp.asarray(x, jnp.bfloat16), np.float64)
  q, w = (rnd(rng.standard_normal((b, h, t, dh))) for _ in range(2))
  k, v = (rnd(rng.standard_normal((b, g, t, dh))) for _ in range(2))
  mask = np.tril(np.ones((t, t), bool))[None].repeat(b, 0)
  _, want = _attention_numpy(q, k, v, mask, w)
  bf = lambda x: jnp.asarray(x, jnp.bfloat16)
  grads = jax.grad(
      lambda q, k, v: jnp.sum(
          attention.dense_attention(
              q, k, v, jnp.asarray(mask), jnp.bfloat16
          ).astype(jnp.float32)
          * w
      ),
      (0, 1, 2),
  )(bf(q), bf(k), bf(v))
  for got, ref in zip(grads, want):
    assert got.dtype == jnp.bfloat16
    # Probabilities, dS and the results rounded to bf16 (8 significant
    # bits): a few units of 2^-8 of the largest entry.
    scale = np.max(np.abs(ref))
    np.testing.assert_allclose(
        np.asarray(got, np.float64), ref, rtol=0, atol=4 * 2.0**-8 * scale
    )


@pytest.mark.parametrize("g", [4, 2])
def test_dense_attention_backward_contracts_minor_dims(g):
  # MHA (r = 1, the default job's model) and GQA (r = 2) at the default
  # job's head size; the products of dK and dV contract the (r, T) rows.
  b, h, t, dh = 2, 4, 16, 24
  spec = jax.ShapeDtypeStruct
  args = (
      spec((b, h, t, dh), jnp.float32),
      spec((b, g, t, dh), jnp.float32),
      spec((b, g, t, dh), jnp.float32),
  )
  mask = jnp.tril(jnp.ones((t, t), bool))[None].repeat(b, 0)

  def loss(q, k, v):
    out = attention.dense_attention(q, k, v, mask, jnp.float32)
    return jnp.sum(out * out)

  def plain(q, k, v):  # the same operations, differentiated by autodiff
    q5 = q.reshape(b, g, h // g, t, dh)
    s = jnp.einsum("bgrtk,bgsk->bgrts", q5, k) * dh**-0.5
    p = jax.nn.softmax(jnp.where(mask[:, None, None], s, -1e30), axis=-1)
    out = jnp.einsum("bgrts,bgsk->bgrtk", p, v)
    return jnp.sum(out * out)

  def compiled(f):
    return jax.jit(jax.grad(f, (0, 1, 2))).lower(*args).compile().as_text()

  assert not _violations(compiled(loss))
  # The check can fail: autodiff's dV = P^T dO contracts P's query axis.
  assert _violations(compiled(plain))


def _gate_up_plain(x, w):
  h = transformer.matmul(x, w, "btd,dcf->btcf")
  return h[..., 0, :], h[..., 1, :]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_gate_up_product_matches_autodiff_of_the_slices(dtype):
  rng = np.random.default_rng(3)
  x = jnp.asarray(rng.standard_normal((3, 5, 8)), dtype)
  w = jnp.asarray(rng.standard_normal((8, 2, 6)), dtype)
  cot = tuple(jnp.asarray(rng.standard_normal((3, 5, 6)), dtype) for _ in "gu")
  want_out, want_vjp = jax.vjp(_gate_up_plain, x, w)
  got_out, got_vjp = jax.vjp(transformer.gate_up_product, x, w)
  got = list(got_out) + list(got_vjp(cot))
  want = list(want_out) + list(want_vjp(cot))
  for a, e in zip(got, want):
    assert a.dtype == e.dtype == dtype and a.shape == e.shape
    # Same products, same float32 accumulation: equal but for summation order.
    e32 = np.asarray(e, np.float32)
    ulps = 4 * float(jnp.finfo(dtype).eps) * np.max(np.abs(e32))
    np.testing.assert_allclose(np.asarray(a, np.float32), e32, atol=ulps)
  # And by hand: dx = g W_gate^T + u W_up^T, dW[:, c] = x^T cot_c.
  x64, w64 = np.asarray(x, np.float64), np.asarray(w, np.float64)
  g64 = [np.asarray(c, np.float64) for c in cot]
  dx = g64[0] @ w64[:, 0].T + g64[1] @ w64[:, 1].T
  dw = np.stack([np.einsum("btd,btf->df", x64, c) for c in g64], axis=1)
  tol = 1e-5 if dtype == jnp.float32 else 2 * 2.0**-8
  for a, e in ((got[2], dx), (got[3], dw)):
    np.testing.assert_allclose(
        np.asarray(a, np.float64), e, rtol=tol, atol=tol * np.max(np.abs(e))
    )


def test_gate_up_backward_has_no_padded_cotangents():
  spec = jax.ShapeDtypeStruct
  args = (spec((4, 16, 32), jnp.float32), spec((32, 2, 64), jnp.float32))

  def loss(product):
    def f(x, w):
      gate, up = product(x, w)
      return jnp.sum(jax.nn.silu(gate) * up)

    return f

  def compiled(product):
    return (
        jax.jit(jax.grad(loss(product), (0, 1)))
        .lower(*args)
        .compile()
        .as_text()
    )

  hlo = compiled(transformer.gate_up_product)
  assert " pad(" not in hlo
  assert not _violations(hlo)
  # The check can fail: autodiff of the slices pads both cotangents.
  assert " pad(" in compiled(_gate_up_plain)
