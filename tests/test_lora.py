"""LoRA adapters (agentic_rl/models/lora.py): forward, frozen base, reference,
merged export, training wiring and exact resume."""

import dataclasses

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from flax import nnx

from agentic_rl import learner
from agentic_rl import sampling
from agentic_rl import validation
from agentic_rl.models import lora
from agentic_rl.models import transformer

# GQA (4 query / 2 kv heads), qkv bias, untied: every projection shape differs.
BASE = transformer.TransformerConfig(
    vocab_size=61,
    d_model=16,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    ffn_dim=24,
    qkv_bias=True,
)
LORA = lora.LoRAConfig(rank=3, alpha=6.0)
TOKENS = jnp.asarray(
    np.random.default_rng(0).integers(0, 61, (2, 9)), jnp.int32
)


def _models(cfg=BASE, lcfg=LORA, seed=0):
  base = transformer.Transformer(cfg, nnx.Rngs(params=seed))
  adapted = transformer.Transformer(
      dataclasses.replace(cfg, lora=lcfg), nnx.Rngs(params=seed)
  )
  return base, adapted


def _randomize_adapters(params, seed=1):
  """Nonzero A and B (B starts at zero), as after training."""
  rng = np.random.default_rng(seed)
  return jax.tree_util.tree_map_with_path(
      lambda p, x: (
          jnp.asarray(rng.normal(0, 0.3, x.shape), x.dtype)
          if lora.is_trainable_path(p)
          else x
      ),
      params,
  )


def _forward(model, tokens):
  """Teacher-forced logits (the training path, T > 1), jitted."""
  g, p = nnx.split(model)
  return jax.jit(lambda p, t: nnx.merge(g, p)(t)[0])(p, tokens)


def _decode_logits(model, tokens):
  """Logits of each position computed one token at a time with a KV cache
  (the sampler's T = 1 path), jitted."""
  g, p = nnx.split(model)
  b, t = tokens.shape

  @jax.jit
  def run(p, tokens):
    def body(cache, i):
      pos = jnp.full((b, 1), i, jnp.int32)
      tok = jax.lax.dynamic_slice_in_dim(tokens, i, 1, axis=1)
      logits, cache = nnx.merge(g, p)(tok, pos, cache)
      return cache, logits[:, 0]

    _, out = jax.lax.scan(
        body, transformer.init_cache(model.cfg, b, t), jnp.arange(t)
    )
    return out.transpose(1, 0, 2)

  return run(p, tokens)


# ------------------------------------------------------------------ config --


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("rank", -1, "model.lora.rank=-1"),
        ("rank", 2.5, "model.lora.rank=2.5"),
        ("alpha", 0.0, "model.lora.alpha=0.0"),
        ("targets", ("q", "x"), "model.lora.targets=.*unknown \\['x'\\]"),
        ("targets", (), r"model.lora.targets=\(\): must be a non-empty"),
        ("targets", "q", "model.lora.targets='q'"),
        ("dropout", 1.0, "model.lora.dropout=1.0"),
        ("dropout", -0.1, "model.lora.dropout=-0.1"),
    ],
)
def test_bad_fields_raise_naming_field_and_value(field, value, match):
  block = dict(rank=4, alpha=8.0, targets=("q", "v"), dropout=0.0)
  block[field] = value
  with pytest.raises(ValueError, match=match):
    lora.from_config(block)


def test_rank_zero_or_absent_is_off():
  assert lora.from_config(None) is None
  assert lora.from_config(dict(rank=0, alpha=-1.0)) is None
  got = lora.from_config(
      dict(rank=4, alpha=8.0, targets=["q", "v"], dropout=0.1)
  )
  assert got == lora.LoRAConfig(4, 8.0, ("q", "v"), 0.1) and got.scale == 2.0


def test_config_validation_gives_one_line_config_errors():
  from configs import default  # noqa: PLC0415

  config = default.get_config("smoke")
  config.model.lora.rank = 4
  validation.validate_config(config)  # valid
  config.model.lora.alpha = -2.0
  with pytest.raises(
      validation.ConfigError,
      match=r"^config\.model\.lora\.alpha=-2\.0: must be",
  ):
    validation.validate_config(config)
  config.model.lora.alpha = 8.0
  config.model.lora.dropout = 0.1  # applied by the SFT and RL losses
  validation.validate_config(config)
  config.model.lora.dropout = 1.0
  with pytest.raises(
      validation.ConfigError, match=r"^config\.model\.lora\.dropout=1\.0"
  ):
    validation.validate_config(config)


def test_adapter_fields_with_lora_off_are_refused():
  # rank 0 = LoRA off: a changed adapter field would be read by nothing.
  from configs import default  # noqa: PLC0415

  for name, value, shown in (
      ("dropout", 0.1, "0.1"),
      ("alpha", 8.0, "8.0"),
      ("targets", ("q",), r"\('q',\)"),
  ):
    config = default.get_config("smoke")
    validation.validate_config(config)  # the defaults are valid with rank 0
    config.model.lora[name] = value
    with pytest.raises(
        validation.ConfigError,
        match=rf"^config\.model\.lora\.{name}={shown}: LoRA is off",
    ):
      validation.validate_config(config)


def test_adapter_names_follow_the_axis_suffix_convention():
  assert lora.adapter_names("q") == ("q_lora_a_dr", "q_lora_b_rhk")
  assert lora.adapter_names("k") == ("k_lora_a_dr", "k_lora_b_rgk")
  assert lora.adapter_names("o") == ("o_lora_a_hkr", "o_lora_b_rd")
  assert lora.adapter_names("down") == ("down_lora_a_fr", "down_lora_b_rd")
  from agentic_rl import sharding  # noqa: PLC0415
  from jax.sharding import PartitionSpec as P  # noqa: PLC0415

  mesh = {"data": 1, "fsdp": 2, "tensor": 2}
  assert sharding.param_spec("q_lora_a_dr", (16, 4), mesh) == P("fsdp", None)
  assert sharding.param_spec("q_lora_b_rhk", (4, 4, 8), mesh) == P(
      None, "tensor", None
  )


# ----------------------------------------------------------------- forward --


def test_zero_b_gives_the_base_logits_exactly():
  base, adapted = _models()
  want = np.asarray(_forward(base, TOKENS))
  np.testing.assert_array_equal(np.asarray(_forward(adapted, TOKENS)), want)
  np.testing.assert_array_equal(
      np.asarray(_decode_logits(adapted, TOKENS)),
      np.asarray(_decode_logits(base, TOKENS)),
  )
  # The base weights do not depend on whether adapters are drawn.
  _, bp = nnx.split(base)
  _, ap = nnx.split(adapted)
  for path, x in jax.tree_util.tree_flatten_with_path(ap)[0]:
    if not lora.is_trainable_path(path):
      np.testing.assert_array_equal(
          x,
          dict(
              (jax.tree_util.keystr(p), y)
              for p, y in jax.tree_util.tree_flatten_with_path(bp)[0]
          )[jax.tree_util.keystr(path)],
      )


def _numpy_merged(adapted_params, base_params, lcfg, targets):
  """W + (alpha / r) A B for every adapted projection, in numpy, reshaping the
  named axes by hand (independent of lora.py's einsums)."""
  flat = {
      jax.tree_util.keystr(p): np.asarray(x, np.float64)
      for p, x in jax.tree_util.tree_flatten_with_path(adapted_params)[0]
  }
  s = lcfg.alpha / lcfg.rank
  weights = {
      "q": ("attn", "q_dhk", "q_lora_a_dr", "q_lora_b_rhk", 1),
      "k": ("attn", "k_dgk", "k_lora_a_dr", "k_lora_b_rgk", 1),
      "v": ("attn", "v_dgk", "v_lora_a_dr", "v_lora_b_rgk", 1),
      "o": ("attn", "o_hkd", "o_lora_a_hkr", "o_lora_b_rd", 2),
      "gate": ("ffn", "gate_df", "gate_lora_a_dr", "gate_lora_b_rf", 1),
      "up": ("ffn", "up_df", "up_lora_a_dr", "up_lora_b_rf", 1),
      "down": ("ffn", "down_fd", "down_lora_a_fr", "down_lora_b_rd", 1),
  }

  def key(i, sub, name):
    return f"['blocks'][{i}]['{sub}']['{name}'].value"

  def merged(path, x):
    k = jax.tree_util.keystr(path)
    for i in range(BASE.num_layers):
      for t in targets:
        sub, w, a, b, n_in = weights[t]
        if k == key(i, sub, w):
          wv = flat[k]
          a_mat = flat[key(i, sub, a)].reshape(-1, lcfg.rank)
          b_mat = flat[key(i, sub, b)].reshape(lcfg.rank, -1)
          assert a_mat.shape[0] == np.prod(wv.shape[:n_in])
          return jnp.asarray(
              (wv + s * (a_mat @ b_mat).reshape(wv.shape)), x.dtype
          )
    return x

  return jax.tree_util.tree_map_with_path(merged, base_params)


@pytest.mark.parametrize(
    "targets", [lora.ALL_TARGETS, ("q", "v"), ("o", "down")]
)
def test_adapted_forward_equals_merged_weights(targets):
  lcfg = lora.LoRAConfig(rank=3, alpha=6.0, targets=targets)
  base, adapted = _models(lcfg=lcfg)
  g, ap = nnx.split(adapted)
  ap = _randomize_adapters(ap)
  bg, bp = nnx.split(base)
  want_model = nnx.merge(bg, _numpy_merged(ap, bp, lcfg, targets))
  model = nnx.merge(g, ap)
  want = np.asarray(_forward(want_model, TOKENS))
  got = np.asarray(_forward(model, TOKENS))
  assert (
      np.abs(want - np.asarray(_forward(base, TOKENS))).max() > 0.1
  )  # adapters matter
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(
      np.asarray(_decode_logits(model, TOKENS)), want, rtol=1e-5, atol=1e-5
  )
  # lora.merge folds the same update into a plain Transformer.
  mcfg, mg, mp = lora.merge(dataclasses.replace(BASE, lora=lcfg), g, ap)
  assert mcfg.lora is None and not lora.has_adapters(mp)
  np.testing.assert_allclose(
      np.asarray(_forward(nnx.merge(mg, mp), TOKENS)),
      want,
      rtol=1e-5,
      atol=1e-5,
  )


# ------------------------------------------------- frozen base, reference --


def _loss(graphdef, params):
  logp, _ = sampling.token_logprobs(graphdef, params, TOKENS, 1.0)
  return -jnp.mean(logp[:, :-1])


def _opt_cfg():
  return ml_collections.ConfigDict(
      dict(
          learning_rate=1e-2,
          warmup_steps=0,
          weight_decay=0.1,
          max_grad_norm=1.0,
      )
  )


def test_update_trains_adapters_only_and_optimizer_holds_adapter_shapes():
  _, adapted = _models()
  g, params = nnx.split(adapted)
  params = _randomize_adapters(
      params
  )  # nonzero B: every adapter gets a gradient
  tx = learner.make_optimizer(_opt_cfg())  # wraps lora.optimizer
  opt_state = tx.init(params)
  adapter_shapes = sorted(
      tuple(x.shape)
      for p, x in jax.tree_util.tree_flatten_with_path(params)[0]
      if lora.is_trainable_path(p)
  )
  state_shapes = sorted(
      tuple(x.shape) for x in jax.tree.leaves(opt_state) if np.ndim(x) > 0
  )
  # Adam's mu and nu, one of each per adapter; nothing shaped like a base weight.
  assert state_shapes == sorted(adapter_shapes * 2)
  n_train, n_total = lora.count(params)
  assert n_train == sum(int(np.prod(s)) for s in adapter_shapes)
  assert 0 < n_train < n_total / 3

  loss, grads = jax.jit(lora.value_and_grad(lambda p: _loss(g, p)))(params)
  full_loss, full_grads = jax.jit(jax.value_and_grad(lambda p: _loss(g, p)))(
      params
  )
  assert loss == full_loss
  for (path, x), y in zip(
      jax.tree_util.tree_flatten_with_path(grads)[0],
      jax.tree.leaves(full_grads),
  ):
    if lora.is_trainable_path(path):  # same gradient as autodiff of everything
      np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7)
    else:  # never computed: zeros
      assert not np.any(np.asarray(x)) and np.any(np.asarray(y))
  new = jax.jit(
      lambda g_, s_, p_: optax.apply_updates(p_, tx.update(g_, s_, p_)[0])
  )(grads, opt_state, params)
  for (path, x), y in zip(
      jax.tree_util.tree_flatten_with_path(params)[0], jax.tree.leaves(new)
  ):
    if lora.is_trainable_path(path):
      assert not np.array_equal(x, y), jax.tree_util.keystr(path)
    else:
      np.testing.assert_array_equal(x, y)  # the base is bitwise unchanged


def test_reference_is_the_base_with_adapters_off():
  base, adapted = _models()
  g, initial = nnx.split(adapted)
  ref = lora.reference_state(initial)
  # Only the adapters are copied; the base is shared.
  assert not lora.has_frozen(ref) and lora.has_adapters(ref)
  trained = _randomize_adapters(initial)
  full = lora.reference_params(trained, ref)
  bg, bp = nnx.split(base)
  logprobs = jax.jit(
      lambda g_, p_: sampling.token_logprobs(g_, p_, TOKENS, 1.0)[0],
      static_argnums=0,
  )
  want, got = logprobs(bg, bp), logprobs(g, full)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  policy = logprobs(g, trained)
  assert np.abs(np.asarray(policy) - np.asarray(want)).max() > 0.05
  # The base leaves of the reference are the policy's own arrays.
  for (path, x), y in zip(
      jax.tree_util.tree_flatten_with_path(full)[0], jax.tree.leaves(trained)
  ):
    if not lora.is_trainable_path(path):
      assert x is y
  # adapters_off zeroes B of trained adapters: the base again.
  off = lora.with_trainable(trained, lora.adapters_off(lora.trainable(trained)))
  np.testing.assert_array_equal(np.asarray(logprobs(g, off)), np.asarray(want))
  # Without adapters the reference is the full copy it always was.
  assert lora.reference_params(bp, bp) is bp


# ------------------------------------------------------------- HF export --


def test_export_writes_merged_weights_transformers_loads_with_equal_logits(
    tmp_path,
):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  from agentic_rl.models import hf  # noqa: PLC0415

  cfg = dataclasses.replace(BASE, qkv_bias=False, vocab_size=97)
  lcfg = lora.LoRAConfig(
      rank=2, alpha=5.0, targets=("q", "k", "v", "o", "gate", "up", "down")
  )
  model = transformer.Transformer(
      dataclasses.replace(cfg, lora=lcfg), nnx.Rngs(params=3)
  )
  g, p = nnx.split(model)
  p = _randomize_adapters(p, seed=4)
  tokens = np.asarray(TOKENS) % 97
  want = np.asarray(_forward(nnx.merge(g, p), jnp.asarray(tokens)))
  hf.save_pretrained(str(tmp_path), dataclasses.replace(cfg, lora=lcfg), p)
  assert not any("lora" in k for k in hf.read_safetensors(str(tmp_path)))
  hf_model = transformers.LlamaForCausalLM.from_pretrained(str(tmp_path)).eval()
  with torch.no_grad():
    got = hf_model(torch.as_tensor(tokens, dtype=torch.long)).logits.numpy()
  base_logits = np.asarray(
      _forward(
          transformer.Transformer(cfg, nnx.Rngs(params=3)), jnp.asarray(tokens)
      )
  )
  assert np.abs(want - base_logits).max() > 0.1
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


# ------------------------------------------------- training, checkpoints --


def _smoke_config(**lora_fields):
  from configs import default  # noqa: PLC0415

  config = default.get_config("smoke")
  config.sft.batch_size = 4
  config.model.lora.rank = 4
  config.model.lora.update(lora_fields)
  return config


def _leaves(tree):
  return {
      jax.tree_util.keystr(p): np.asarray(jax.device_get(x))
      for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]
  }


def test_init_state_trains_only_adapters():
  from agentic_rl import train  # noqa: PLC0415

  config = _smoke_config(targets=("q", "v"))
  model_cfg = train.make_model_config(config)
  assert model_cfg.lora == lora.LoRAConfig(4, 16.0, ("q", "v"), 0.0)
  _, state = train.init_state(config, model_cfg)
  m = model_cfg
  # q: A [D, 4] + B [4, H, Dh]; v: A [D, 4] + B [4, G, Dh]; per layer.
  want = m.num_layers * (
      2 * m.d_model * 4
      + 4 * m.num_heads * m.head_dim
      + 4 * m.kv_heads * m.head_dim
  )
  n_train, n_total = lora.count(state.params)
  assert n_train == want and n_total > 10 * want
  adapter_shapes = sorted(
      x.shape
      for p, x in jax.tree_util.tree_flatten_with_path(state.params)[0]
      if lora.is_trainable_path(p)
  )
  state_shapes = sorted(
      x.shape for x in jax.tree.leaves(state.opt_state) if np.ndim(x)
  )
  assert state_shapes == sorted(adapter_shapes * 2)
  # The reference holds the adapters only (B = 0 now: the base).
  assert not lora.has_frozen(state.ref_params)
  assert sum(x.size for x in jax.tree.leaves(state.ref_params)) == want
  # The RL transition keeps that layout.
  rl_state = train.start_rl(config, state)
  assert not lora.has_frozen(rl_state.ref_params)
  assert (
      sorted(x.shape for x in jax.tree.leaves(rl_state.opt_state) if np.ndim(x))
      == state_shapes
  )


@pytest.mark.slow  # ~60 s on a loaded 2-core CPU (compiling the SFT step)
def test_resume_from_an_adapter_checkpoint_is_bit_exact(tmp_path):
  """2 SFT steps, save, restore onto a fresh base, 1 step == 3 straight steps."""
  from agentic_rl import checkpoint as checkpoint_lib  # noqa: PLC0415
  from agentic_rl import train  # noqa: PLC0415

  config = _smoke_config()
  model_cfg = train.make_model_config(config)
  env = train.make_env(config)
  graphdef, state = train.init_state(config, model_cfg)
  base0 = {k: v for k, v in _leaves(state.params).items() if "_lora_" not in k}
  step = learner.make_sft_step(
      config, env, graphdef, learner.make_optimizer(config.sft)
  )
  states = []
  for _ in range(3):
    state, _ = step(state)
    states.append((_leaves(state.params), _leaves(state.opt_state)))
  ckpt = checkpoint_lib.Checkpointer(str(tmp_path / "ckpt"))
  # Replay to step 2 and save it (the step donates its input state).
  _, s = train.init_state(config, model_cfg)
  s, _ = step(s)
  s, _ = step(s)
  ckpt.save(2, train._to_save(s), force=True)
  ckpt.wait()
  raw = ckpt.restore(train._to_save(s), step=2)
  assert not lora.has_frozen(raw.params)  # the checkpoint holds no base weights
  _, fresh = train.init_state(config, model_cfg)
  resumed = train._restore(ckpt, fresh, 2, model_cfg)
  ckpt.close()
  resumed, _ = step(resumed)
  params, opt = _leaves(resumed.params), _leaves(resumed.opt_state)
  want_params, want_opt = states[2]
  assert params.keys() == want_params.keys() and opt.keys() == want_opt.keys()
  for k in want_params:
    np.testing.assert_array_equal(params[k], want_params[k], err_msg=k)
  for k in want_opt:
    np.testing.assert_array_equal(opt[k], want_opt[k], err_msg=k)
  # Training moved the adapters and left the base bitwise unchanged.
  assert any("_lora_b_" in k and np.any(v) for k, v in params.items())
  for k, v in base0.items():
    np.testing.assert_array_equal(params[k], v, err_msg=k)


def test_resume_on_a_different_base_is_refused(tmp_path):
  from agentic_rl import train  # noqa: PLC0415

  config = _smoke_config()
  model_cfg = train.make_model_config(config)
  _, state = train.init_state(config, model_cfg)
  train._check_lora_base(config, str(tmp_path), state.params)
  train._check_lora_base(config, str(tmp_path), state.params)  # same base: fine
  config.seed = 1
  _, other = train.init_state(config, model_cfg)
  with pytest.raises(
      validation.ConfigError, match="lora_base.json: the checkpoints"
  ):
    train._check_lora_base(config, str(tmp_path), other.params)


def test_delta_with_a_dropout_mask_matches_numpy():
  rng = np.random.default_rng(5)
  x = rng.normal(size=(2, 4, 3, 8)).astype(np.float32)  # [B, H, T, Dh] into o
  a = rng.normal(size=(4, 8, 2)).astype(np.float32)  # [H, Dh, r]
  b = rng.normal(size=(2, 16)).astype(np.float32)  # [r, D]
  keep = (rng.random(x.shape) > 0.25).astype(np.float32) / 0.75
  got = lora.delta(
      "o",
      jnp.asarray(x),
      jnp.asarray(a),
      jnp.asarray(b),
      1.5,
      jnp.asarray(keep),
  )
  xm = (x * keep).transpose(0, 2, 1, 3).reshape(2, 3, 32)  # [B, T, H*Dh]
  want = 1.5 * (xm @ a.reshape(32, 2)) @ b
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


def test_dropout_acts_only_while_a_key_is_set():
  _, adapted = _models(lcfg=lora.LoRAConfig(rank=3, alpha=6.0, dropout=0.5))
  g, p = nnx.split(adapted)
  model = nnx.merge(g, _randomize_adapters(p))
  # The same model object, called through one jitted forward (the key, or
  # None, is part of its state): two programs, not op by op.
  forward = nnx.jit(lambda m: m(TOKENS)[0])
  clean = np.asarray(forward(model))
  lora.set_dropout_key(model, jax.random.PRNGKey(0))
  noisy = np.asarray(forward(model))
  lora.set_dropout_key(model, None)
  np.testing.assert_array_equal(np.asarray(forward(model)), clean)
  assert np.abs(noisy - clean).max() > 1e-3


def test_token_logprobs_with_a_dropout_key_are_the_masked_models():
  # The chunked training log-probs under a dropout key equal log_softmax of
  # the full forward of the same model with that key set by hand.
  _, adapted = _models(lcfg=lora.LoRAConfig(rank=3, alpha=6.0, dropout=0.5))
  g, p = nnx.split(adapted)
  p = _randomize_adapters(p)
  key = jax.random.PRNGKey(3)
  # Jitted (one program per key kind, not op by op).
  logprobs = jax.jit(
      lambda p, k: sampling.token_logprobs(g, p, TOKENS, 1.0, dropout_key=k)
  )
  got, _ = logprobs(p, key)
  clean, _ = logprobs(p, None)

  @jax.jit
  def masked_logits(p, key):
    model = nnx.merge(g, p)
    lora.set_dropout_key(model, key)
    # The masks are drawn over the input's shape: the training forward reads
    # tokens[:, :-1].
    return model(TOKENS[:, :-1])[0]

  logits = np.asarray(masked_logits(p, key), np.float64)
  ls = logits - logits.max(-1, keepdims=True)
  ls = ls - np.log(np.exp(ls).sum(-1, keepdims=True))
  want = np.take_along_axis(ls, np.asarray(TOKENS)[:, 1:, None], -1)[..., 0]
  np.testing.assert_allclose(np.asarray(got)[:, 1:], want, atol=2e-5)
  assert np.abs(np.asarray(got) - np.asarray(clean)).max() > 1e-3


def _dropout_rl_config(dropout):
  """The smoke config with rank-4 adapters (dropout `dropout`), two minibatches
  of two micro-batches, and a one-layer policy: the test compares compiled
  updates with hand-rolled gradients of the same weights, at any depth, and
  compiles six programs whose forwards and backwards unroll every block."""
  from configs import default  # noqa: PLC0415

  config = default.get_config("smoke")
  config.model.num_layers = 1
  config.model.lora.rank = 4
  config.model.lora.dropout = dropout
  config.rl.num_minibatches = 2
  config.rl.num_microbatches = 2
  return config


def test_rl_update_draws_one_dropout_mask_per_micro_batch():
  # update(..., dropout_key=k) = the hand-rolled accumulation where
  # micro-batch j of optimizer step s uses fold_in(fold_in(k, s), j); with
  # dropout 0 the key changes nothing.
  from agentic_rl import sharding  # noqa: PLC0415
  from agentic_rl import train  # noqa: PLC0415
  from agentic_rl.learner import update as update_lib  # noqa: PLC0415
  from configs import schema  # noqa: PLC0415

  def setup(dropout):
    config = schema.with_defaults(_dropout_rl_config(dropout))
    validation.validate_config(config)
    graphdef, state = train.init_state(config, train.make_model_config(config))
    params = _randomize_adapters(state.params)
    return config, graphdef, params

  config, graphdef, params = setup(0.3)
  rng = np.random.default_rng(0)
  b, length = 8, 24
  v = config.model.vocab_size
  tokens = jnp.asarray(rng.integers(3, v, (b, length)), jnp.int32)
  mask = jnp.asarray(rng.random((b, length)) < 0.6)
  batch = learner.LearnerBatch(
      tokens=tokens,
      mask=mask,
      behaviour_logp=jnp.asarray(-rng.random((b, length)) * 3, jnp.float32),
      ref_logp=jnp.asarray(-rng.random((b, length)) * 3, jnp.float32),
      advantage=jnp.asarray(rng.normal(size=(b, length)), jnp.float32),
  )
  config.rl.ppo_epochs = 1
  config.rl.behaviour_logprobs = "sampler"
  tx = optax.sgd(1.0)  # updates = -grads: the gradient is read off the step
  upd = jax.jit(update_lib.make_update_fn(config, graphdef, tx))
  key = jax.random.PRNGKey(11)
  opt = tx.init(params)
  new, _, _ = upd(params, opt, batch, 0.0, dropout_key=key)
  # By hand: minibatch 0 (step 0) only, its two strided micro-batches.
  mb = sharding.split_rows(batch, 2)
  mb0 = jax.tree.map(lambda x: x[0], mb)
  den = update_lib.losses.aggregation_denominator(
      mb0.mask, config.rl.loss_agg_mode
  )
  micro = sharding.split_rows(mb0, 2)

  @jax.jit  # one program per key kind (a key or None), not op by op
  def micro_grad(mbj, k):
    return lora.value_and_grad(
        lambda p: update_lib._rl_loss(
            graphdef,
            p,
            mbj,
            config.rl,
            kl_coef=0.0,
            denominator=den,
            dropout_key=k,
        )[0]
    )(params)[1]

  def grad(j, k):
    return micro_grad(jax.tree.map(lambda x: x[j], micro), k)

  step_key = jax.random.fold_in(key, 0)
  g = [grad(j, jax.random.fold_in(step_key, j)) for j in range(2)]
  g_plain = [grad(j, None) for j in range(2)]
  leaves = lambda t: [
      np.asarray(x)
      for p, x in jax.tree_util.tree_flatten_with_path(t)[0]
      if lora.is_trainable_path(p)
  ]

  def first_step(params_after):
    return [p0 - p1 for p0, p1 in zip(leaves(params), leaves(params_after))]

  # Only the first of the two optimizer steps is checked by hand: compare a
  # one-minibatch run.
  config.rl.num_minibatches = 1
  config.rl.num_microbatches = 2
  upd1 = jax.jit(update_lib.make_update_fn(config, graphdef, tx))
  mb_batch = jax.tree.map(lambda x: x[0], mb)
  new1, _, _ = upd1(params, opt, mb_batch, 0.0, dropout_key=key)
  want = [a + c for a, c in zip(leaves(g[0]), leaves(g[1]))]
  for got, w in zip(first_step(new1), want):
    np.testing.assert_allclose(got, w, rtol=2e-4, atol=2e-6)
  want_plain = [a + c for a, c in zip(leaves(g_plain[0]), leaves(g_plain[1]))]
  diff = max(np.abs(a - c).max() for a, c in zip(first_step(new1), want_plain))
  assert diff > 1e-5  # the masks do change the gradient
  # dropout 0: the key is ignored (bit-identical updates).
  config0, graphdef0, params0 = setup(0.0)
  config0.rl.ppo_epochs = 1
  config0.rl.behaviour_logprobs = "sampler"
  upd0 = jax.jit(update_lib.make_update_fn(config0, graphdef0, tx))
  opt0 = tx.init(params0)
  a = upd0(params0, opt0, batch, 0.0, dropout_key=key)[0]
  c = upd0(params0, opt0, batch, 0.0)[0]
  for x, y in zip(leaves(a), leaves(c)):
    np.testing.assert_array_equal(x, y)
  # The two-minibatch update differs from the deterministic one: `c`, of the
  # same weights (dropout 0 draws the same ones) without masks.
  for x, y in zip(jax.tree.leaves(params0), jax.tree.leaves(params)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  assert max(np.abs(x - y).max() for x, y in zip(leaves(new), leaves(c))) > 1e-5


def test_sft_grad_with_dropout_uses_one_key_per_block():
  from agentic_rl import types  # noqa: PLC0415

  _, adapted = _models(lcfg=lora.LoRAConfig(rank=3, alpha=6.0, dropout=0.4))
  g, p = nnx.split(adapted)
  p = _randomize_adapters(p)
  rng = np.random.default_rng(1)
  tokens = jnp.asarray(rng.integers(0, 61, (4, 9)), jnp.int32)
  role = jnp.full((4, 9), types.POLICY, jnp.int32)

  class Traj:  # the two fields sft_loss / sft_grad read

    def __init__(self, tokens, role):
      self.tokens, self.role = tokens, role

    def replace(self, **kw):
      return Traj(kw.get("tokens", self.tokens), kw.get("role", self.role))

  key = jax.random.PRNGKey(4)
  # Each gradient is one jitted program (not op by op).
  sft_grad = jax.jit(
      lambda p, k: learner.sft_grad(g, p, Traj(tokens, role), 2, k)
  )
  _, _, got = sft_grad(p, key)
  # By hand: block k holds rows k, k + 2 (strided), key fold_in(key, k), both
  # divided by the batch's POLICY-token count (position 0 has logp 0 but is a
  # POLICY token in this fake, as in sft_loss's mask).
  from agentic_rl.learner.common import policy_mask  # noqa: PLC0415

  den = jnp.maximum(
      jnp.sum(policy_mask(Traj(tokens, role)).astype(jnp.float32)), 1.0
  )

  @jax.jit
  def block_grad(p, tokens, role, k):
    return lora.value_and_grad(
        lambda q: learner.sft_loss(
            g, q, Traj(tokens, role), den, jax.random.fold_in(key, k)
        )[0]
    )(p)[1]

  # The leaves, summed in numpy (float32 adds, as jnp.add): no per-leaf eager
  # compiles.
  want = None
  for k in range(2):
    gk = block_grad(p, tokens[k::2], role[k::2], k)
    gk = [np.asarray(x) for x in jax.tree.leaves(gk)]
    want = gk if want is None else [a + b for a, b in zip(want, gk)]
  for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(got)[0], want):
    if lora.is_trainable_path(path):
      # Summed in another order than sft_grad's block loop: an entry of
      # 1.7e-3 differed by 1.6e-6 on an AVX2 EPYC (entries reach 0.16).
      np.testing.assert_allclose(
          np.asarray(a), np.asarray(b), rtol=2e-4, atol=1e-5
      )
  _, _, clean = sft_grad(p, None)
  assert (
      max(
          float(np.abs(np.asarray(a) - np.asarray(b)).max())
          for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(clean))
      )
      > 1e-5
  )


_MESH_SCRIPT = """
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import PartitionSpec as P
from agentic_rl import learner, sharding, train
from agentic_rl.models import lora
from configs import default
assert jax.device_count() == 8
cfg = default.get_config("smoke")
cfg.model.update(d_model=32, num_layers=1, num_heads=4, head_dim=8, ffn_dim=64)
cfg.model.lora.rank = 4
cfg.sft.batch_size = 8
model_cfg = train.make_model_config(cfg)
env = train.make_env(cfg)

def run(shape):
  d, f, t = shape
  mesh = sharding.make_mesh(dict(data=d, fsdp=f, tensor=t),
                            devices=jax.devices()[:d * f * t])
  with jax.set_mesh(mesh):
    graphdef, state = train.init_state(cfg, model_cfg, mesh)
    base0 = jax.device_get(state.params)
    step = learner.make_sft_step(cfg, env, graphdef, learner.make_optimizer(cfg.sft),
                                 state_sharding=sharding.tree_shardings(state, mesh))
    for _ in range(2):
      state, m = step(state)
    return state, base0

one, base_one = run((1, 1, 1))
multi, _ = run((2, 2, 2))
attn = multi.params["blocks"][0]["attn"]
assert attn["q_lora_a_dr"][...].sharding.spec == P("fsdp", None)
assert attn["q_lora_b_rhk"][...].sharding.spec == P(None, "tensor", None)
flat = jax.tree_util.tree_flatten_with_path(jax.device_get(multi.params))[0]
ref = jax.tree.leaves(jax.device_get(one.params))
base = jax.tree.leaves(base_one)
moved = 0.0
for (path, x), y, b in zip(flat, ref, base):
  np.testing.assert_allclose(x, y, atol=1e-5)
  if lora.is_trainable_path(path):
    moved = max(moved, float(np.max(np.abs(np.asarray(y) - np.asarray(b)))))
  else:
    np.testing.assert_array_equal(y, b)
assert moved > 1e-4, moved
print("OK lora mesh", moved)
"""


@pytest.mark.slow  # 8 simulated devices in a subprocess: ~1-2 min here
def test_adapters_shard_and_train_on_a_2x2x2_mesh_like_one_device():
  from tests import fakes  # noqa: PLC0415

  assert "OK lora mesh" in fakes.run_on_8_devices(_MESH_SCRIPT)


def test_reward_model_mode_refuses_adapters():
  from agentic_rl import rm_train  # noqa: PLC0415
  from configs import rm_arithmetic  # noqa: PLC0415

  config = rm_arithmetic.get_config()
  config.model.lora.rank = 4
  with pytest.raises(
      validation.ConfigError, match=r"^config\.model\.lora\.rank=4: "
  ):
    rm_train.validate_rm_config(config)
