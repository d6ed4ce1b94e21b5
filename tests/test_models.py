"""Transformer: pinned numerics of the default preset, GQA, RoPE scaling, dtype
policy, remat, the parameter naming contract, presets and heads."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from agentic_rl import sampling
from agentic_rl.models import transformer
from configs import common
from tests import fakes


def _preset(name, **overrides):
  fields = {
      k: v
      for k, v in dict(common.model(name)).items()
      if k not in ("hf_path", "lora")
  }
  fields.update(overrides)
  return transformer.TransformerConfig(**fields)


def _model(cfg, seed=0):
  return transformer.Transformer(cfg, nnx.Rngs(params=seed))


def test_tiny_preset_logits_are_pinned():
  """Init (RNG draw order) and forward of the `tiny` preset equal the values
  computed with the code before GQA/bias/tying/dtype support was added (commit
  b26c727), with the initialisation train.init_state uses for seed 0."""
  cfg = _preset("tiny")
  model = _model(cfg, jax.random.fold_in(jax.random.PRNGKey(0), 0))
  tokens = jnp.array(
      [
          [199, 62, 205, 97, 17, 141, 64, 144, 138, 66],
          [78, 82, 41, 148, 73, 198, 0, 196, 81, 183],
      ],
      jnp.int32,
  )
  logits, _ = nnx.jit(lambda m, x: m(x))(model, tokens)
  np.testing.assert_allclose(
      logits[0, :3, :4],
      np.reshape(
          [
              0.264521062374115,
              0.416716605424881,
              1.0867589712142944,
              0.29931628704071045,
              0.4878143072128296,
              -0.5695616006851196,
              -1.4471954107284546,
              -0.2526037096977234,
              -0.6979950666427612,
              -0.4081343114376068,
              -1.573508858680725,
              0.4036827087402344,
          ],
          (3, 4),
      ),
      rtol=0,
      atol=1e-6,
  )
  np.testing.assert_allclose(
      logits[1, -1, :4],
      [
          -0.8123158812522888,
          -0.5721791386604309,
          -0.2911379933357239,
          0.4426925480365753,
      ],
      rtol=0,
      atol=1e-6,
  )
  graphdef, params = nnx.split(model)
  logp, _ = jax.jit(sampling.token_logprobs, static_argnums=0)(
      graphdef, params, tokens, 0.7
  )
  np.testing.assert_allclose(
      logp[0],
      [
          0.0,
          -6.2970781326293945,
          -5.513406753540039,
          -7.121758460998535,
          -8.270448684692383,
          -6.7152099609375,
          -6.760368347167969,
          -5.598033428192139,
          -4.526167392730713,
          -5.839931488037109,
      ],
      rtol=0,
      atol=1e-5,
  )


_AXES = dict(
    d="d_model",
    h="num_heads",
    g="kv_heads",
    k="head_dim",
    f="ffn_dim",
    v="vocab_size",
)


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        dict(
            num_kv_heads=2,
            qkv_bias=True,
            tie_embeddings=True,
            value_head=True,
            reward_head=True,
        ),
    ],
)
def test_parameter_names_follow_the_axis_contract(overrides):
  cfg = _preset("tiny", **overrides)
  if overrides:
    cfg = dataclasses.replace(cfg, num_heads=4, num_kv_heads=2)
  state = nnx.state(nnx.eval_shape(lambda: _model(cfg)))
  names = set()
  for path, leaf in nnx.to_flat_state(state):
    name = path[-1]
    names.add(name)
    if name == "scale":
      assert leaf.shape == (cfg.d_model,)
      continue
    axes = name.rsplit("_", 1)[1]
    assert len(axes) == leaf.ndim, name
    want = tuple(getattr(cfg, _AXES[a]) for a in axes)
    assert leaf.shape == want, (name, leaf.shape, want)
  if overrides:
    assert {
        "k_dgk",
        "v_dgk",
        "q_bias_hk",
        "k_bias_gk",
        "v_bias_gk",
        "value_head_d",
        "reward_head_d",
    } <= names
    assert "lm_head_dv" not in names
  else:
    assert names == {
        "embed_vd",
        "lm_head_dv",
        "q_dhk",
        "k_dgk",
        "v_dgk",
        "o_hkd",
        "gate_df",
        "up_df",
        "down_fd",
        "scale",
    }


def _expected_param_count(c):
  g = c["num_kv_heads"]
  attn = c["d_model"] * c["head_dim"] * (2 * c["num_heads"] + 2 * g) + (
      c["head_dim"] * (c["num_heads"] + 2 * g) if c.get("qkv_bias") else 0
  )
  per_layer = attn + 3 * c["d_model"] * c["ffn_dim"] + 2 * c["d_model"]
  return (
      c["vocab_size"] * c["d_model"] * (1 if c["tie_embeddings"] else 2)
      + c["num_layers"] * per_layer
      + c["d_model"]
  )


@pytest.mark.parametrize(
    "name,published", [("qwen2.5-0.5b", 0.49e9), ("llama-3.2-1b", 1.24e9)]
)
def test_real_presets_have_the_published_sizes(name, published):
  """Shape-only (eval_shape): the parameter count equals the count from the
  architecture's formula and rounds to the model card's size."""
  cfg = _preset(name)
  state = nnx.state(nnx.eval_shape(lambda: _model(cfg)))
  n = transformer.count_params(state)
  assert n == _expected_param_count(common.MODEL_PRESETS[name])
  assert n == pytest.approx(published, rel=0.01)


def test_gqa_equals_mha_with_repeated_kv_heads():
  """Query head h reads kv head h // (H/G): an MHA model whose k/v weights repeat
  each GQA kv head H/G times computes the same logits (arXiv:2305.13245)."""
  gqa_cfg = dataclasses.replace(
      fakes.TINY, num_heads=4, num_kv_heads=2, head_dim=8, qkv_bias=True
  )
  mha_cfg = dataclasses.replace(gqa_cfg, num_kv_heads=0)
  gqa = _model(gqa_cfg, 1)
  # Random (non-zero) biases so the bias path is exercised.
  for blk in gqa.blocks:
    for name in ("q_bias_hk", "k_bias_gk", "v_bias_gk"):
      p = getattr(blk.attn, name)
      p[...] = jax.random.normal(jax.random.PRNGKey(len(name)), p.shape)
  mha = _model(mha_cfg, 2)
  mha.embed_vd[...] = gqa.embed_vd[...]
  mha.lm_head_dv[...] = gqa.lm_head_dv[...]
  for bm, bg in zip(mha.blocks, gqa.blocks):
    nnx.update(bm.ffn, nnx.state(bg.ffn))
    for name in ("q_dhk", "o_hkd", "q_bias_hk"):
      getattr(bm.attn, name)[...] = getattr(bg.attn, name)[...]
    bm.attn.k_dgk[...] = jnp.repeat(bg.attn.k_dgk[...], 2, axis=1)
    bm.attn.v_dgk[...] = jnp.repeat(bg.attn.v_dgk[...], 2, axis=1)
    bm.attn.k_bias_gk[...] = jnp.repeat(bg.attn.k_bias_gk[...], 2, axis=0)
    bm.attn.v_bias_gk[...] = jnp.repeat(bg.attn.v_bias_gk[...], 2, axis=0)
  tokens = jax.random.randint(
      jax.random.PRNGKey(3), (2, 7), 0, gqa_cfg.vocab_size
  )
  forward = nnx.jit(lambda m, x: m(x)[0])
  np.testing.assert_allclose(
      forward(gqa, tokens), forward(mha, tokens), atol=1e-5, rtol=1e-5
  )


def test_gqa_kv_cache_decoding_equals_full_forward():
  cfg = dataclasses.replace(
      fakes.TINY,
      num_heads=4,
      num_kv_heads=1,
      head_dim=8,
      qkv_bias=True,
      tie_embeddings=True,
      rope_scaling="llama3",
      rope_factor=4.0,
      rope_original_max_positions=4,
  )
  graphdef, params = nnx.split(_model(cfg, 4))
  b, l = 2, 9
  tokens = jax.random.randint(jax.random.PRNGKey(5), (b, l), 0, cfg.vocab_size)
  full, _ = jax.jit(sampling.apply_model, static_argnums=0)(
      graphdef, params, tokens
  )
  extend = jax.jit(sampling.extend, static_argnums=0)
  cache = transformer.init_cache(cfg, b, l)
  assert cache[0]["k"].shape == (b, 1, 8, l)  # keys stored [B, G, Dh, S]
  assert cache[0]["v"].shape == (b, 1, l, 8)
  logits, cache = extend(
      graphdef,
      params,
      cache,
      tokens[:, :3],
      jnp.zeros(b, jnp.int32),
      jnp.full(b, 3, jnp.int32),
  )
  np.testing.assert_allclose(logits, full[:, 2], atol=1e-5, rtol=1e-5)
  for t in range(3, l):
    logits, cache = extend(
        graphdef,
        params,
        cache,
        tokens[:, t : t + 1],
        jnp.full(b, t, jnp.int32),
        jnp.ones(b, jnp.int32),
    )
    np.testing.assert_allclose(logits, full[:, t], atol=1e-5, rtol=1e-5)


def test_tied_row_logits_equal_the_vocab_product_and_keep_the_vd_layout():
  """Tied LM head of a sampling step ([B, D] rows): the same logits as
  hidden @ embed^T, computed as embed @ hidden^T in the compiled program
  (an f32[V, B] product, not f32[B, V]) in float32 and bfloat16 compute."""
  h = jax.random.normal(jax.random.PRNGKey(0), (3, 16))
  e = jax.random.normal(jax.random.PRNGKey(1), (40, 16))
  want = np.asarray(h, np.float64) @ np.asarray(e, np.float64).T
  got = transformer.tied_row_logits(h, e)
  assert got.shape == (3, 40) and got.dtype == jnp.float32
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(
      got, transformer.vocab_logits(h, e.T), rtol=1e-6, atol=1e-6
  )
  hb, eb = h.astype(jnp.bfloat16), e.astype(jnp.bfloat16)
  got_b = transformer.tied_row_logits(hb, eb)
  assert got_b.dtype == jnp.float32
  # Same bf16 operands, float32 accumulation on both paths.
  np.testing.assert_allclose(
      got_b, transformer.vocab_logits(hb, eb.T), rtol=1e-6, atol=1e-5
  )
  if jax.default_backend() == "cpu":  # XLA:CPU keeps plain dot instructions
    text = jax.jit(transformer.tied_row_logits).lower(h, e).compile().as_text()
    dots = [l for l in text.splitlines() if " dot(" in l]
    assert dots and all("f32[40,3]" in l.split("=")[1] for l in dots), dots
  # Under vmap (vmapped seeds: one embedding per seed) each seed's logits.
  e2 = jnp.stack([e, 2.0 * e])
  np.testing.assert_allclose(
      jax.vmap(transformer.tied_row_logits, in_axes=(None, 0))(h, e2)[1],
      2.0 * got,
      rtol=1e-6,
      atol=1e-6,
  )
  # The model takes this path for 2-D input only when the embeddings are tied.
  cfg = dataclasses.replace(fakes.TINY, tie_embeddings=True)
  model = _model(cfg, 0)
  hid = jax.random.normal(jax.random.PRNGKey(2), (2, cfg.d_model))
  np.testing.assert_allclose(
      model.logits(hid),
      model.logits(hid[:, None])[:, 0],
      rtol=1e-5,
      atol=1e-5,
  )


def test_llama3_rope_scaling_by_wavelength_band():
  """Llama 3.1 scaling: short wavelengths (< L/high) unchanged, long ones
  (> L/low) divided by the factor, the band between interpolated linearly in
  L / wavelength."""
  cfg = transformer.TransformerConfig(
      head_dim=16,
      rope_theta=10_000.0,
      rope_scaling="llama3",
      rope_factor=8.0,
      rope_low_freq_factor=1.0,
      rope_high_freq_factor=4.0,
      rope_original_max_positions=64,
  )
  base = np.array([10_000.0 ** (-i / 8) for i in range(8)])
  got = np.asarray(transformer.rope_inv_freq(cfg))
  wavelen = 2 * math.pi / base
  # Hand-computed: wavelengths 6.28, 20.0, 62.8, 199, 628, 1987, 6283, 19869;
  # 64 / 4 = 16 and 64 / 1 = 64 bound the band: index 0 kept, 1 and 2 smoothed,
  # 3.. divided by 8.
  np.testing.assert_allclose(
      wavelen[:4], [6.2832, 19.869, 62.832, 198.69], rtol=1e-4
  )
  np.testing.assert_allclose(got[0], base[0], rtol=1e-6)
  np.testing.assert_allclose(got[3:], base[3:] / 8, rtol=1e-6)
  for i in (1, 2):
    s = (64 / wavelen[i] - 1) / 3
    np.testing.assert_allclose(
        got[i], (1 - s) * base[i] / 8 + s * base[i], rtol=1e-6
    )
  plain = transformer.rope_inv_freq(
      dataclasses.replace(cfg, rope_scaling="none")
  )
  np.testing.assert_allclose(plain, base, rtol=1e-6)


def test_rope_scores_depend_only_on_relative_position():
  """<rope(q, m), rope(k, n)> is a function of m - n (arXiv:2104.09864)."""
  cfg = transformer.TransformerConfig(head_dim=8)
  inv = transformer.rope_inv_freq(cfg)
  q = jax.random.normal(jax.random.PRNGKey(0), (1, 1, 1, 8))
  k = jax.random.normal(jax.random.PRNGKey(1), (1, 1, 1, 8))
  dot = lambda m, n: float(
      jnp.sum(
          transformer.rope(q, jnp.array([[m]]), inv)
          * transformer.rope(k, jnp.array([[n]]), inv)
      )
  )
  assert dot(5, 2) == pytest.approx(dot(13, 10), abs=1e-5)
  assert dot(5, 2) != pytest.approx(dot(5, 3), abs=1e-3)


def test_remat_gives_the_same_loss_and_gradients():
  cfg = dataclasses.replace(fakes.TINY, num_heads=2, num_kv_heads=1)
  graphdef, params = nnx.split(_model(cfg, 6))
  graphdef_r, _ = nnx.split(_model(dataclasses.replace(cfg, remat=True), 6))
  tokens = jax.random.randint(jax.random.PRNGKey(7), (2, 8), 0, cfg.vocab_size)
  loss = lambda gd: jax.jit(
      jax.value_and_grad(
          lambda p: -jnp.sum(sampling.token_logprobs(gd, p, tokens)[0])
      )
  )
  l0, g0 = loss(graphdef)(params)
  l1, g1 = loss(graphdef_r)(params)
  np.testing.assert_allclose(l0, l1, rtol=1e-6)
  # atol 2e-7: the remat path's programs fuse differently (one gradient entry
  # of ~1e-3 differed by 1.2e-7, float32 rounding).
  jax.tree.map(
      lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=2e-7),
      g0,
      g1,
  )


def test_bfloat16_policy():
  """bf16 params and compute: params stored in bf16, KV cache in bf16, logits
  and log-probs float32 and close to the float32 model's."""
  cfg32 = dataclasses.replace(fakes.TINY, num_heads=2, num_kv_heads=1)
  cfg16 = dataclasses.replace(cfg32, param_dtype="bfloat16", dtype="bfloat16")
  m32, m16 = _model(cfg32, 8), _model(cfg16, 8)
  assert {x.dtype for x in jax.tree.leaves(nnx.state(m16))} == {
      jnp.dtype(jnp.bfloat16)
  }
  # Same draws: the bf16 parameters are the f32 ones rounded.
  np.testing.assert_allclose(
      np.asarray(m16.embed_vd[...], np.float32), m32.embed_vd[...], rtol=1e-2
  )
  assert transformer.init_cache(cfg16, 1, 4)[0]["k"].dtype == jnp.bfloat16
  tokens = jax.random.randint(
      jax.random.PRNGKey(9), (2, 6), 0, cfg32.vocab_size
  )
  # bf16 weights in f32 compute: the forward runs in f32.
  m_mixed = _model(dataclasses.replace(cfg16, dtype="float32"), 8)

  # Every forward below in one jitted program (op by op, each bf16 and f32
  # op compiled on its own, was most of this test's time).
  @nnx.jit
  def forwards(m16, m32, m_mixed, tokens):
    l16, l32 = m16(tokens)[0], m32(tokens)[0]
    gd, p = nnx.split(m16)
    logp, ent = sampling.token_logprobs(gd, p, tokens)
    # Log-softmax in f32 from the f32 logits (a bf16 log-softmax would be off
    # by ~1e-2).
    want = jnp.take_along_axis(
        jax.nn.log_softmax(l16[:, :-1]), tokens[:, 1:, None], -1
    )[..., 0]
    h, _ = m_mixed.hidden_states(tokens)
    return l16, l32, logp, ent, want, h

  l16, l32, logp, ent, want, h = forwards(m16, m32, m_mixed, tokens)
  assert l16.dtype == jnp.float32
  np.testing.assert_allclose(l16, l32, atol=0.15)
  assert logp.dtype == ent.dtype == jnp.float32
  np.testing.assert_allclose(logp[:, 1:], want, atol=1e-5)
  assert h.dtype == jnp.float32


@pytest.mark.parametrize(
    "overrides,match",
    [
        (dict(num_kv_heads=3), "num_kv_heads=3: must divide num_heads=4"),
        (dict(head_dim=7), "head_dim=7"),
        (dict(dtype="float16"), "dtype='float16'"),
        (dict(rope_scaling="yarn"), "rope_scaling='yarn'"),
        (
            dict(
                rope_scaling="llama3",
                rope_low_freq_factor=4.0,
                rope_high_freq_factor=1.0,
            ),
            "rope_high_freq_factor=1.0",
        ),
        (dict(logprob_chunk_size=-1), "logprob_chunk_size=-1"),
    ],
)
def test_invalid_model_configs_raise(overrides, match):
  with pytest.raises(ValueError, match=match):
    transformer.TransformerConfig(num_heads=4, **overrides)


@pytest.fixture(scope="module")
def head_model():
  cfg = dataclasses.replace(
      fakes.TINY, num_heads=2, num_kv_heads=1, value_head=True, reward_head=True
  )
  model = _model(cfg, 12)
  model.value_head_d[...] = jax.random.normal(
      jax.random.PRNGKey(1), (cfg.d_model,)
  )
  model.reward_head_d[...] = jax.random.normal(
      jax.random.PRNGKey(2), (cfg.d_model,)
  )
  return model


def test_heads_draw_nothing_and_default_off():
  """Enabling the heads adds only value_head_d / reward_head_d (zero-initialised);
  every other parameter is unchanged for the same seed."""
  cfg = dataclasses.replace(fakes.TINY, num_heads=2, num_kv_heads=1)
  plain = nnx.to_flat_state(nnx.state(_model(cfg, 3)))
  heads = dict(
      nnx.to_flat_state(
          nnx.state(
              _model(
                  dataclasses.replace(cfg, value_head=True, reward_head=True), 3
              )
          )
      )
  )
  assert set(heads) - {p for p, _ in plain} == {
      ("value_head_d",),
      ("reward_head_d",),
  }
  for path, var in plain:
    np.testing.assert_array_equal(var.get_value(), heads[path].get_value())
  assert not np.any(heads[("value_head_d",)].get_value())
  with pytest.raises(ValueError, match="value_head=False"):
    _model(cfg, 3).value(jnp.zeros((1, 1, cfg.d_model)))


def test_value_head_reads_every_position(head_model):
  tokens = jax.random.randint(jax.random.PRNGKey(3), (2, 5), 0, 265)

  @nnx.jit  # one program, not op by op
  def hidden_and_values(m, t):
    hidden, _ = m.hidden_states(t)
    return hidden, m.value(hidden)

  hidden, values = hidden_and_values(head_model, tokens)
  assert values.shape == (2, 5) and values.dtype == jnp.float32
  np.testing.assert_allclose(
      values,
      np.asarray(hidden) @ np.asarray(head_model.value_head_d[...]),
      rtol=1e-5,
      atol=1e-5,
  )


def test_reward_head_reads_last_real_token_whatever_the_padding_side(
    head_model,
):
  """A sequence alone, left-padded and right-padded (padding filled with random
  junk tokens) gets the same reward: hidden state of its last real token (run
  unpadded) dotted with reward_head_d."""
  seq = jnp.array([257, 72, 105, 33, 258], jnp.int32)
  n, pad = seq.shape[0], 3
  junk = jnp.array([7, 99, 200], jnp.int32)
  right = jnp.concatenate([seq, junk])
  left = jnp.concatenate([junk, seq])
  tokens = jnp.stack([right, left])
  mask = jnp.stack([jnp.arange(n + pad) < n, jnp.arange(n + pad) >= pad])
  rewards = nnx.jit(lambda m, t, k: m.reward(t, k))(head_model, tokens, mask)
  hidden, _ = nnx.jit(lambda m, t: m.hidden_states(t))(head_model, seq[None])
  want = float(
      np.asarray(hidden[0, -1]) @ np.asarray(head_model.reward_head_d[...])
  )
  np.testing.assert_allclose(rewards, [want, want], rtol=1e-5, atol=1e-5)
  # The index read: last real token of each row, whichever side is padded.
  np.testing.assert_array_equal(
      transformer.last_token_index(mask), [n - 1, n + pad - 1]
  )


def test_remat_model_decodes_with_a_kv_cache_like_the_plain_model():
  """model.remat=True used to raise inside the sampler's lax.while_loop; remat
  applies to cache-free (training) forwards only, so sampling is unchanged."""
  from agentic_rl import rollout  # pylint: disable=g-import-not-at-top
  from environments import arithmetic  # pylint: disable=g-import-not-at-top

  cfg = dataclasses.replace(fakes.TINY, num_heads=2, num_kv_heads=1)
  graphdef, params = nnx.split(_model(cfg, 6))
  graphdef_r, _ = nnx.split(_model(dataclasses.replace(cfg, remat=True), 6))
  env = arithmetic.ArithmeticEnv()
  tasks = env.eval_tasks(4, 0)
  run = lambda gd, mc: rollout.rollout_jit(
      env,
      tasks,
      jax.random.PRNGKey(3),
      max_len=48,
      graphdef=gd,
      params=params,
      model_config=mc,
      temperature=jnp.float32(1.0),
  )
  plain = run(graphdef, cfg)
  remat = run(graphdef_r, dataclasses.replace(cfg, remat=True))
  np.testing.assert_array_equal(remat.tokens, plain.tokens)
  np.testing.assert_allclose(remat.logprob, plain.logprob, atol=1e-6)


def test_remat_inside_lax_map_matches_the_plain_model():
  """The learner merges the policy inside `lax.map` over batch blocks
  (learner.behaviour_forward); nnx.remat raised TraceContextError there (seen on
  the SmolLM2 config with remat on). Loss and gradients must equal the plain
  model's."""
  cfg = dataclasses.replace(fakes.TINY, num_heads=2, num_kv_heads=1)
  graphdef, params = nnx.split(_model(cfg, 6))
  graphdef_r, _ = nnx.split(_model(dataclasses.replace(cfg, remat=True), 6))
  tokens = jax.random.randint(jax.random.PRNGKey(8), (4, 8), 0, cfg.vocab_size)

  def loss(gd):
    def f(p):
      logp = jax.lax.map(
          lambda t: sampling.token_logprobs(gd, p, t)[0],
          tokens.reshape(2, 2, 8),
      )
      return -jnp.sum(logp)

    return jax.jit(jax.value_and_grad(f))

  l0, g0 = loss(graphdef)(params)
  l1, g1 = loss(graphdef_r)(params)
  np.testing.assert_allclose(l0, l1, rtol=1e-6)
  # atol 2e-7: the remat path's programs fuse differently (one gradient entry
  # of ~1e-3 differed by 1.2e-7, float32 rounding).
  jax.tree.map(
      lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=2e-7),
      g0,
      g1,
  )
