"""Mixed precision: float32 logits and attention scores under bfloat16 compute,
and float32 master weights for bfloat16 parameters.

Reference values come from float64 numpy on the same (bfloat16-representable)
inputs, or from the float32 model / optimizer run on the same weights.
"""

import dataclasses

import jax
import jax.extend
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from flax import nnx

from agentic_rl import checkpoint
from agentic_rl import learner
from agentic_rl import mixed_precision
from agentic_rl import sampling
from agentic_rl import types
from agentic_rl.models import transformer
from tests import fakes

BF16_EPS = 2.0**-8  # bfloat16 unit roundoff (8 significant bits)


def _bf16(x):
  """Rounds to the nearest bfloat16 value, returned as float32."""
  return jnp.asarray(x, jnp.float32).astype(jnp.bfloat16).astype(jnp.float32)


def _log_softmax64(z):
  z = np.asarray(z, np.float64)
  m = z.max(-1, keepdims=True)
  return z - m - np.log(np.exp(z - m).sum(-1, keepdims=True))


# ---------------------------------------------------------------------------
# LM head: log-probs at |logit| ~ 40.


def _exact_hidden_model(dtype: str, seed: int = 0):
  """(graphdef, params, cfg): blocks that add exactly 0 to the residual
  (o and down projections zero), embeddings of +-1 and an RMSNorm epsilon
  too small to change 1 + eps in float32, so the final hidden state is the
  token's +-1 embedding exactly in float32 AND bfloat16 compute. The LM head
  holds bfloat16-representable N(0, 2.5^2) weights: logits sum 64 terms,
  std 20, max |logit| ~ 50 over the 64-entry vocabulary. Any log-prob
  difference between the two compute dtypes then comes from the head alone."""
  cfg = transformer.TransformerConfig(
      vocab_size=64,
      d_model=64,
      num_layers=1,
      num_heads=2,
      head_dim=16,
      ffn_dim=32,
      norm_eps=1e-30,
      dtype=dtype,
  )
  graphdef, params = nnx.split(transformer.Transformer(cfg, nnx.Rngs(params=0)))
  k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
  state = nnx.to_pure_dict(params)
  state["embed_vd"] = jnp.where(
      jax.random.bernoulli(k1, 0.5, (64, 64)), 1.0, -1.0
  )
  state["lm_head_dv"] = _bf16(2.5 * jax.random.normal(k2, (64, 64)))
  state["blocks"][0]["attn"]["o_hkd"] = jnp.zeros_like(
      state["blocks"][0]["attn"]["o_hkd"]
  )
  state["blocks"][0]["ffn"]["down_fd"] = jnp.zeros_like(
      state["blocks"][0]["ffn"]["down_fd"]
  )
  nnx.replace_by_pure_dict(params, state)
  return graphdef, params, cfg


def _tokens():
  return jax.random.randint(jax.random.PRNGKey(3), (4, 12), 0, 64)


def _reference_logp(params, tokens):
  """float64 log p(tokens[:, t] | tokens[:, :t]) of the constructed model:
  hidden = embedding of tokens[:, t - 1], logits = hidden @ W."""
  e = np.asarray(params["embed_vd"][...], np.float64)
  w = np.asarray(params["lm_head_dv"][...], np.float64)
  tok = np.asarray(tokens)
  logits = e[tok[:, :-1]] @ w
  lp = _log_softmax64(logits)
  return (
      np.take_along_axis(lp, tok[:, 1:, None], -1)[..., 0],
      np.abs(logits).max(),
  )


@pytest.mark.parametrize("chunk", [0, 5])
def test_bf16_compute_logprobs_match_float32_at_logit_40(chunk):
  tokens = _tokens()
  gd16, p16, _ = _exact_hidden_model("bfloat16")
  gd32, p32, _ = _exact_hidden_model("float32")
  ref, max_logit = _reference_logp(p32, tokens)
  assert 35.0 < max_logit < 80.0  # the regime of the claim: |logit| ~ 40
  # Jitted, as the trainer runs it (op by op, every bf16 and f32 op was
  # compiled on its own).
  logprobs = jax.jit(
      sampling.token_logprobs,
      static_argnums=0,
      static_argnames="chunk_size",
  )
  lp16, _ = logprobs(gd16, p16, tokens, 1.0, chunk_size=chunk)
  lp32, _ = logprobs(gd32, p32, tokens, 1.0, chunk_size=chunk)
  err16 = np.max(np.abs(np.asarray(lp16)[:, 1:] - ref))
  np.testing.assert_allclose(np.asarray(lp32)[:, 1:], ref, atol=1e-4)
  assert err16 < 1e-3, err16
  np.testing.assert_allclose(lp16, lp32, atol=1e-3)
  # Sanity of the construction: rounding these logits to bfloat16 (what
  # `(hidden @ W).astype(float32)` did) moves log-probs by far more.
  e = p16["embed_vd"][...].astype(jnp.bfloat16)
  w = p16["lm_head_dv"][...].astype(jnp.bfloat16)
  rounded = (e[tokens[:, :-1]] @ w).astype(jnp.float32)
  lp_rounded = np.take_along_axis(
      _log_softmax64(rounded), np.asarray(tokens)[:, 1:, None], -1
  )[..., 0]
  assert np.max(np.abs(lp_rounded - ref)) > 0.03


def test_sampler_next_token_logits_are_float32_accurate():
  # The sampler's path (KV-cache prefill, last position projected): logits of
  # the bf16-compute model equal the exact float64 logits to float32 rounding.
  gd, params, cfg = _exact_hidden_model("bfloat16")
  tokens = _tokens()
  cache = transformer.init_cache(cfg, 4, 16)
  # Jitted, as the sampler runs it (not op by op).
  logits, _ = jax.jit(sampling.extend, static_argnums=0)(
      gd,
      params,
      cache,
      tokens,
      jnp.zeros(4, jnp.int32),
      jnp.full((4,), 12, jnp.int32),
  )
  assert logits.dtype == jnp.float32
  e = np.asarray(params["embed_vd"][...], np.float64)
  w = np.asarray(params["lm_head_dv"][...], np.float64)
  exact = e[np.asarray(tokens)[:, -1]] @ w
  np.testing.assert_allclose(logits, exact, atol=1e-4)


# ---------------------------------------------------------------------------
# Attention scores: float32 before the softmax.


def test_bf16_attention_scores_are_not_rounded_before_softmax():
  # One head, head_dim 16 (scale 1/4, exact). Token t's input holds (a_t, b_t)
  # in dims 0-1 and a one-hot in dim 2 + t; q = k = dims 0-1, v = dims 2-4,
  # o = identity, all positions 0 (RoPE is the identity). So score(t, s) =
  # (a_t a_s + b_t b_s) / 4, e.g. 40.125 and 39.625, exact in float32 but
  # not in bfloat16 (9 significant bits), and the output's dims 2-4 are the
  # attention probabilities themselves.
  cfg = transformer.TransformerConfig(
      vocab_size=8,
      d_model=16,
      num_layers=1,
      num_heads=1,
      head_dim=16,
      ffn_dim=8,
      dtype="bfloat16",
  )
  attn = transformer.Attention(cfg, nnx.Rngs(params=0))
  qk = np.zeros((16, 1, 16), np.float32)
  qk[0, 0, 0] = qk[1, 0, 1] = 1.0
  v = np.zeros((16, 1, 16), np.float32)
  for i in (2, 3, 4):
    v[i, 0, i] = 1.0
  attn.q_dhk[...] = jnp.asarray(qk)
  attn.k_dgk[...] = jnp.asarray(qk)
  attn.v_dgk[...] = jnp.asarray(v)
  attn.o_hkd[...] = jnp.eye(16, dtype=jnp.float32)[None]
  a = np.array([12.5, 12.75, 12.25])
  b = np.array([1.5, 0.75, 1.25])
  x = np.zeros((1, 3, 16), np.float32)
  x[0, :, 0], x[0, :, 1] = a, b
  x[0, np.arange(3), 2 + np.arange(3)] = 1.0
  pos = jnp.zeros((1, 3), jnp.int32)
  # Jitted, as in the model's compiled forward (not op by op).
  out, _ = nnx.jit(
      lambda attn, x, pos: attn(
          x,
          pos,
          None,
          jnp.ones((1, 3, 3), bool),
          transformer.rope_tables(pos, transformer.rope_inv_freq(cfg)),
      )
  )(attn, jnp.asarray(x, jnp.bfloat16), pos)
  scores = (np.outer(a, a) + np.outer(b, b)) / 4.0
  assert scores[0, 1] == 40.125 and scores[0, 0] == 39.625
  p = np.exp(_log_softmax64(scores))
  got = np.asarray(out[0, :, 2:5], np.float64)
  # Allowed: the probabilities rounded to bf16 for the value matmul and the
  # output rounded to bf16, each at most half a unit (BF16_EPS / 2 relative).
  np.testing.assert_allclose(got, p, rtol=BF16_EPS, atol=1e-6)


def test_logits_and_scores_dot_products_return_float32():
  # Structural check on the traced bf16 forward: the LM head and attention
  # score dot_generals output float32 from bfloat16 operands.
  cfg = transformer.TransformerConfig(
      vocab_size=50,
      d_model=16,
      num_layers=1,
      num_heads=2,
      head_dim=8,
      ffn_dim=8,
      dtype="bfloat16",
  )
  model = transformer.Transformer(cfg, nnx.Rngs(params=0))
  jaxpr = jax.make_jaxpr(lambda t: model(t)[0])(jnp.zeros((2, 5), jnp.int32))

  def eqns(jx):  # every equation, inside custom-gradient calls too
    for e in jx.eqns:
      yield e
      for v in e.params.values():
        inner = getattr(v, "jaxpr", v)
        if isinstance(inner, jax.extend.core.Jaxpr):
          yield from eqns(inner)

  dots = [e for e in eqns(jaxpr.jaxpr) if e.primitive.name == "dot_general"]
  by_shape = {
      tuple(e.outvars[0].aval.shape): e.outvars[0].aval.dtype for e in dots
  }
  # scores [B, G, H / G, T, S] (dense_attention's grouped form)
  assert by_shape[(2, 2, 1, 5, 5)] == jnp.float32
  assert by_shape[(2, 5, 50)] == jnp.float32  # logits [B, T, V]
  # The RoPE tables [B, T, Dh / 2] are float32 in every dtype policy and
  # are stored through an exact float32 product with the identity
  # (`transformer.rope_tables`): those two products, and no other, take
  # float32 operands.
  rope = [e for e in dots if e.outvars[0].aval.shape == (2, 5, 4)]
  assert len(rope) == 2
  assert all(e.invars[0].aval.dtype == jnp.float32 for e in rope)
  rope_ids = {id(e) for e in rope}
  rest = [e for e in dots if id(e) not in rope_ids]
  assert rest and all(e.invars[0].aval.dtype == jnp.bfloat16 for e in rest)


# ---------------------------------------------------------------------------
# Float32 master weights.


def _opt_cfg(lr):
  return ml_collections.ConfigDict(
      dict(
          learning_rate=lr, warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0
      )
  )


def test_master_weights_are_float32_adam_on_the_same_gradients():
  # Fed the same gradients, the wrapped optimizer's float32 master follows
  # the float32 optimizer exactly, and the bf16 params are the master
  # rounded to nearest (the only rounding in the scheme).
  tx = learner.make_optimizer(_opt_cfg(1e-3))
  k = jax.random.split(jax.random.PRNGKey(0), 7)
  p32 = {"w": _bf16(jax.random.normal(k[0], (64,)) * 0.05)}
  p16 = {"w": p32["w"].astype(jnp.bfloat16)}
  s32, s16 = tx.init(p32), tx.init(p16)
  assert not isinstance(s32, mixed_precision.MasterWeightsState)
  assert isinstance(s16, mixed_precision.MasterWeightsState)
  assert s16.master["w"].dtype == jnp.float32
  assert all(x.dtype != jnp.bfloat16 for x in jax.tree.leaves(s16.inner))
  for i in range(5):
    g = {"w": jax.random.normal(k[i + 1], (64,))}
    u32, s32 = tx.update(g, s32, p32)
    p32 = optax.apply_updates(p32, u32)
    u16, s16 = tx.update(g, s16, p16)
    p16 = optax.apply_updates(p16, u16)
    assert p16["w"].dtype == jnp.bfloat16
  np.testing.assert_array_equal(s16.master["w"], p32["w"])
  np.testing.assert_array_equal(p16["w"], p32["w"].astype(jnp.bfloat16))
  with pytest.raises(ValueError, match="needs params"):
    tx.update(g, s16)


def _sft_run(param_dtype, dtype, init_f32, tokens, tx, steps):
  cfg = dataclasses.replace(fakes.TINY, param_dtype=param_dtype, dtype=dtype)
  graphdef = nnx.graphdef(transformer.Transformer(cfg, nnx.Rngs(params=0)))
  params = jax.tree.map(lambda x: x.astype(cfg.params_dtype), init_f32)

  def loss(p):
    return -jnp.mean(
        sampling.token_logprobs(graphdef, p, tokens, 1.0)[0][:, 1:]
    )

  @jax.jit
  def step(p, o):
    g = jax.grad(loss)(p)
    u, o = tx.update(g, o, p)
    return optax.apply_updates(p, u), o, g

  opt, p, first_grad = tx.init(params), params, None
  for _ in range(steps):
    p, opt, g = step(p, opt)
    first_grad = g if first_grad is None else first_grad
  return params, p, opt, first_grad


def _flat(tree):
  return np.concatenate(
      [np.asarray(x, np.float32).ravel() for x in jax.tree.leaves(tree)]
  )


def test_bf16_training_tracks_float32_with_master_weights():
  """5 AdamW steps at lr 2e-6 on a next-token loss, bf16 params and compute
  vs float32 params and compute from the same (bf16-representable) start.

  Tolerance: Adam's step is scale-free (lr * sign(g) at step 1, then
  lr * m_hat / sqrt(v_hat)), so bf16 gradient noise changes an element's
  update by ~the gradient's relative error eps_g, except where it flips the
  gradient's sign: there the update is reversed (difference ~2 |update|).
  With every |update| ~ steps * lr, the relative L2 error of the updates is
  at most ~2 sqrt(f_flip) + eps_g, both measured here on the first
  gradients (measured: eps_g = 0.0064, f_flip = 0.18%, bound 0.091,
  error 0.078; 89.1% of the weights change in both runs, the rest are
  embedding rows of tokens absent from the batch). Without master weights the
  bf16 run changes almost no weight (relative error ~1).
  """
  steps, lr = 5, 2e-6
  tokens = jax.random.randint(
      jax.random.PRNGKey(1), (8, 24), 0, fakes.TINY.vocab_size
  )
  init = nnx.state(transformer.Transformer(fakes.TINY, nnx.Rngs(params=0)))
  init = jax.tree.map(_bf16, init)
  tx = learner.make_optimizer(_opt_cfg(lr))
  p0, p32, _, g32 = _sft_run("float32", "float32", init, tokens, tx, steps)
  q0, q16, opt16, g16 = _sft_run(
      "bfloat16", "bfloat16", init, tokens, tx, steps
  )
  d32 = _flat(p32) - _flat(p0)
  dm = _flat(opt16.master) - _flat(q0)
  share32, share_master = np.mean(d32 != 0), np.mean(dm != 0)
  assert share32 > 0.8
  assert abs(share_master - share32) < 0.005, (share_master, share32)
  g32, g16 = _flat(g32), _flat(g16)
  nz = g32 != 0
  f_flip = np.mean(np.sign(g16[nz]) != np.sign(g32[nz]))
  eps_g = np.linalg.norm(g16 - g32) / np.linalg.norm(g32)
  rel = np.linalg.norm(dm - d32) / np.linalg.norm(d32)
  assert rel < 2 * np.sqrt(f_flip) + eps_g, (rel, f_flip, eps_g)
  # The bf16 parameters are the master rounded to nearest.
  np.testing.assert_array_equal(
      _flat(q16),
      _flat(jax.tree.map(lambda x: x.astype(jnp.bfloat16), opt16.master)),
  )
  # The same run without a master copy (optax on bf16 params) barely moves.
  plain = optax.chain(
      optax.clip_by_global_norm(1.0),
      optax.adamw(lr, b1=0.9, b2=0.99, weight_decay=0.0),
  )
  r0, r16, _, _ = _sft_run("bfloat16", "bfloat16", init, tokens, plain, steps)
  d_plain = _flat(r16) - _flat(r0)
  assert np.mean(d_plain != 0) < 0.1
  assert np.linalg.norm(d_plain - d32) / np.linalg.norm(d32) > 0.9


def test_bf16_train_state_checkpoint_roundtrip(tmp_path):
  from agentic_rl import train
  from configs import default

  config = default.get_config("smoke")
  config.model.param_dtype = "bfloat16"
  config.model.dtype = "bfloat16"
  model_cfg = train.make_model_config(config)
  _, state = train.init_state(config, model_cfg)
  assert isinstance(state.opt_state, mixed_precision.MasterWeightsState)
  sft_master = jax.tree.map(lambda x: x + 1e-5, state.opt_state.master)
  state = state.replace(opt_state=state.opt_state._replace(master=sft_master))
  state = train.start_rl(config, state)
  assert isinstance(state.opt_state, mixed_precision.MasterWeightsState)
  # The RL phase keeps the SFT phase's float32 master (fresh moments).
  for a, b in zip(
      jax.tree.leaves(sft_master), jax.tree.leaves(state.opt_state.master)
  ):
    np.testing.assert_array_equal(a, b)
  assert jax.tree.leaves(state.params)[0].dtype == jnp.bfloat16
  assert {x.dtype for x in jax.tree.leaves(state.opt_state.master)} == {
      np.dtype(jnp.float32)
  }
  state = state.replace(
      opt_state=state.opt_state._replace(
          master=jax.tree.map(lambda x: x + 1e-4, state.opt_state.master)
      )
  )
  with checkpoint.Checkpointer(str(tmp_path / "ck")) as ck:
    ck.save(3, state, force=True)
    ck.wait()
    like = train.start_rl(config, train.init_state(config, model_cfg)[1])
    got = ck.restore(like, step=3)
  assert isinstance(got.opt_state, mixed_precision.MasterWeightsState)
  for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(got)):
    assert a.dtype == b.dtype
    np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_bf16_run_resumes_bit_exactly(tmp_path):
  """bf16 params and compute, 3 SFT + 3 RL steps, killed after step 4 (last
  checkpoint: step 3, the SFT -> RL transition) and rerun: the final train
  state (bf16 params, float32 master and moments) equals the uninterrupted
  run's bit for bit."""
  from agentic_rl import train
  from configs import default

  def config(halt=-1):
    c = default.get_config("smoke")
    c.model.param_dtype = c.model.dtype = "bfloat16"
    c.sft.steps, c.rl.steps = 3, 3
    c.checkpoint.every_steps = 100
    c.eval.update(num_tasks=4, num_samples=0, pass_k=())
    c.halt_after_step = halt
    return c

  full, resumed = str(tmp_path / "full"), str(tmp_path / "resumed")
  train.train_and_evaluate(config(), full)
  assert train.train_and_evaluate(config(halt=4), resumed) is None
  assert (
      checkpoint.Checkpointer(
          str(tmp_path / "resumed" / "checkpoints")
      ).latest_step()
      == 3
  )
  train.train_and_evaluate(config(), resumed)
  c = config()
  _, like = train.init_state(c, train.make_model_config(c))
  like = train.start_rl(c, like)
  a = checkpoint.Checkpointer(str(tmp_path / "full" / "checkpoints")).restore(
      like
  )
  b = checkpoint.Checkpointer(
      str(tmp_path / "resumed" / "checkpoints")
  ).restore(like)
  assert int(a.step) == 6 and isinstance(
      a.opt_state, mixed_precision.MasterWeightsState
  )
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_bf16_microbatch_gradients_accumulate_in_float32():
  # Hand values: 1 + four micro-batch gradients of 2^-9 (each bf16). A bf16
  # running sum stays 1.0 (2^-9 is below half a unit at 1, 2^-8); the float32
  # accumulator gives 1 + 4 * 2^-9 = 1.0078125.
  grads = [
      {"w": jnp.full((3,), v, jnp.bfloat16)} for v in (1.0,) + (2.0**-9,) * 4
  ]
  acc = mixed_precision.accumulation_zeros(grads[0])
  for g in grads:
    acc = mixed_precision.accumulate(acc, g)
  assert acc["w"].dtype == jnp.float32
  np.testing.assert_array_equal(acc["w"], 1.0078125)
  bf16_sum = grads[0]["w"]
  for g in grads[1:]:
    bf16_sum = bf16_sum + g["w"]
  np.testing.assert_array_equal(bf16_sum.astype(jnp.float32), 1.0)
  # Wired into the learner: sft_grad over 4 micro-batches of a bf16 model
  # returns float32 gradients.
  cfg = dataclasses.replace(
      fakes.TINY, param_dtype="bfloat16", dtype="bfloat16"
  )
  graphdef, params = nnx.split(transformer.Transformer(cfg, nnx.Rngs(params=0)))
  tokens = jax.random.randint(jax.random.PRNGKey(4), (8, 10), 0, 256)
  role = jnp.where(jnp.arange(10) < 3, types.PROMPT, types.POLICY).astype(
      jnp.int8
  )
  traj = fakes.trajectory(
      tokens=tokens, role=role, finish=1, group=jnp.arange(8)
  )
  _, _, g = jax.jit(lambda p: learner.sft_grad(graphdef, p, traj, 4))(params)
  assert {x.dtype for x in jax.tree.leaves(g)} == {np.dtype(jnp.float32)}
  assert np.all(np.isfinite(_flat(g))) and np.any(_flat(g) != 0)


def test_master_copy_and_moments_are_sharded_like_the_params():
  from agentic_rl import sharding

  cfg = dataclasses.replace(fakes.TINY, param_dtype="bfloat16")
  params = jax.eval_shape(
      lambda: nnx.state(transformer.Transformer(cfg, nnx.Rngs(params=0)))
  )
  opt = jax.eval_shape(learner.make_optimizer(_opt_cfg(1e-3)).init, params)
  mesh = {"data": 1, "fsdp": 2, "tensor": 2}
  want = sharding.tree_specs(params, mesh)
  got = sharding.tree_specs(opt, mesh)
  leaves = lambda t: jax.tree.leaves(
      t, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec)
  )
  for tree in (got.master, got.inner[1][0].mu, got.inner[1][0].nu):
    assert leaves(tree) == leaves(want)
  assert jax.sharding.PartitionSpec("fsdp", "tensor", None) in leaves(want)


@pytest.mark.parametrize(
    "spec, xs, ws",
    [
        ("...d,df->...f", (3, 5, 16), (16, 24)),
        ("btd,dgck->bgctk", (2, 5, 16), (16, 2, 3, 8)),
        ("bhtk,hkd->btd", (2, 4, 5, 8), (4, 8, 16)),
    ],
)
def test_bf16_matmul_backward_is_the_mixed_precision_one(spec, xs, ws):
  # transformer.matmul on bf16 operands: the gradient equals the textbook
  # mixed-precision backward computed by hand in float64 from the bf16
  # operands and the bf16-rounded cotangent (dx = g w^T, dw = x^T g, each
  # rounded once to bf16), and every dot of the compiled backward has bf16
  # operands (the fast-kernel form), none float32.
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=xs), jnp.bfloat16)
  w = jnp.asarray(rng.normal(size=ws) * 0.3, jnp.bfloat16)
  y_shape = jax.eval_shape(lambda: transformer.matmul(x, w, spec)).shape
  g = jnp.asarray(rng.normal(size=y_shape), jnp.bfloat16)

  def loss(x, w):
    y = transformer.matmul(x, w, spec)
    return jnp.sum(y.astype(jnp.float32) * g.astype(jnp.float32))

  dx, dw = jax.jit(jax.grad(loss, argnums=(0, 1)))(x, w)
  assert dx.dtype == jnp.bfloat16 and dw.dtype == jnp.bfloat16
  # numpy's einsum sums no ellipsis away: name the two leading axes.
  ins, out = spec.replace("...", "AB").split("->")
  lhs, rhs = ins.split(",")
  f64 = lambda a: np.asarray(a.astype(jnp.float32), np.float64)
  want_dx = np.einsum(f"{out},{rhs}->{lhs}", f64(g), f64(w))
  want_dw = np.einsum(f"{lhs},{out}->{rhs}", f64(x), f64(g))
  # One bf16 rounding of a float32-accumulated sum: relative 2^-8.
  np.testing.assert_allclose(f64(dx), want_dx, rtol=2**-8, atol=1e-6)
  np.testing.assert_allclose(f64(dw), want_dw, rtol=2**-8, atol=1e-6)
  hlo = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(x, w).as_text()
  # StableHLO: `stablehlo.dot_general %a, %b, ... : (tensor<..xbf16>,
  # tensor<..xbf16>) -> tensor<..xf32>`.
  dots = [l for l in hlo.splitlines() if "stablehlo.dot_general" in l]
  # The two backward products (the loss is linear in y, so the forward
  # product is dead code). Plain autodiff of the forward gives float32
  # operands here (tensor<..xf32>, tensor<..xf32>): this check fails on it.
  assert len(dots) == 2, hlo
  for line in dots:
    operands, result = line.rsplit(": (", 1)[1].split(") -> ")
    assert operands.count("xbf16>") == 2 and "f32" not in operands, line
    assert result.strip().endswith("xf32>"), line
