"""Hugging Face interop: tiny random LlamaForCausalLM / Qwen2ForCausalLM built
with `transformers` (torch CPU) in temporary folders, imported, compared logit
for logit, exported and reloaded by `transformers`."""

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from agentic_rl.models import hf
from agentic_rl.models import transformer

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

VOCAB = 300
TOKENS = np.array(
    [
        [1, 17, 255, 4, 99, 299, 0, 42, 7, 150, 3, 64],
        [5, 5, 6, 200, 18, 77, 123, 9, 250, 31, 2, 11],
    ],
    np.int64,
)

CASES = {
    # GQA 4 query / 2 kv heads, untied, default RoPE.
    "llama_gqa_untied": (
        "llama",
        dict(num_key_value_heads=2, tie_word_embeddings=False),
    ),
    # Tied embeddings and Llama 3.1 RoPE scaling over a short original context
    # (so that all three frequency bands occur with head_dim 16).
    "llama_tied_rope3": (
        "llama",
        dict(
            num_key_value_heads=1,
            tie_word_embeddings=True,
            rope_theta=500_000.0,
            rope_scaling=dict(
                rope_type="llama3",
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=64,
            ),
            max_position_embeddings=512,
        ),
    ),
    # Qwen2: QKV bias, GQA, untied.
    "qwen2_gqa_bias": (
        "qwen2",
        dict(
            num_key_value_heads=2,
            tie_word_embeddings=False,
            rope_theta=1_000_000.0,
        ),
    ),
    # Qwen2 tied (Qwen2.5-0.5B's layout).
    "qwen2_tied": (
        "qwen2",
        dict(num_key_value_heads=4, tie_word_embeddings=True),
    ),
}


def _build_hf(family, extra, seed):
  common = dict(
      vocab_size=VOCAB,
      hidden_size=32,
      intermediate_size=48,
      num_hidden_layers=2,
      num_attention_heads=4,
      head_dim=16,
      rms_norm_eps=1e-5,
      attn_implementation="eager",
  )
  if family == "llama":
    config = transformers.LlamaConfig(**common, **extra)
    cls = transformers.LlamaForCausalLM
  else:
    config = transformers.Qwen2Config(**common, **extra)
    cls = transformers.Qwen2ForCausalLM
  torch.manual_seed(seed)
  model = cls(config).eval()
  # Larger random weights than HF's std 0.02 init (and non-trivial norms and
  # biases) so that logits are O(1) and every tensor matters.
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name:
        p.copy_(1.0 + 0.2 * torch.randn_like(p))
      else:
        p.normal_(0.0, 0.25 if "embed" in name or "bias" in name else 0.15)
  return model


def _hf_logits(model, tokens=TOKENS):
  with torch.no_grad():
    return model(torch.as_tensor(tokens)).logits.numpy()


_CACHE = {}


def _case(name, tmp_path_factory):
  """Builds, saves and imports one CASES entry once per test session."""
  if name not in _CACHE:
    family, extra = CASES[name]
    model = _build_hf(family, extra, seed=len(name))
    path = str(tmp_path_factory.mktemp(name))
    model.save_pretrained(path)
    cfg, graphdef, params = hf.load_pretrained(path)
    forward = jax.jit(lambda p, t: nnx.merge(graphdef, p)(t)[0])
    logits = np.asarray(forward(params, jnp.asarray(TOKENS, jnp.int32)))
    _CACHE[name] = (
        dict(name=name, model=model, path=path, logits=_hf_logits(model)),
        (cfg, graphdef, params, logits),
    )
  return _CACHE[name]


@pytest.fixture(scope="module", params=list(CASES))
def case_and_import(request, tmp_path_factory):
  return _case(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def case(case_and_import):
  return case_and_import[0]


@pytest.fixture(scope="module")
def imported(case_and_import):
  return case_and_import[1]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
  """(case, imported) of the untied GQA Llama."""
  return _case("llama_gqa_untied", tmp_path_factory)


def test_import_matches_transformers_logits(case, imported):
  cfg, _, _, logits = imported
  ours_family = "qwen2" if cfg.qkv_bias else "llama"
  assert case["name"].startswith(ours_family)
  assert cfg.tie_embeddings == case["name"].endswith(("_tied", "_tied_rope3"))
  assert cfg.kv_heads == CASES[case["name"]][1]["num_key_value_heads"]
  assert np.abs(case["logits"]).max() > 0.5  # non-trivial logits
  np.testing.assert_allclose(logits, case["logits"], atol=1e-4, rtol=0)
  assert np.abs(logits - case["logits"]).max() <= 1e-4


def test_llama3_rope_frequencies_equal_transformers(case, imported):
  cfg = imported[0]
  rotary = case["model"].model.rotary_emb
  np.testing.assert_allclose(
      transformer.rope_inv_freq(cfg), rotary.inv_freq.numpy(), rtol=1e-6
  )
  if "rope3" in case["name"]:
    assert cfg.rope_scaling == "llama3" and cfg.rope_factor == 8.0


def test_export_reloads_in_transformers_with_the_same_logits(
    case, imported, tmp_path
):
  cfg, _, params, _ = imported
  hf.save_pretrained(str(tmp_path), cfg, params)
  cls = type(case["model"])
  reloaded = cls.from_pretrained(
      str(tmp_path), attn_implementation="eager"
  ).eval()
  src = case["model"].state_dict()
  dst = reloaded.state_dict()
  assert set(src) == set(dst)
  for k in src:
    np.testing.assert_array_equal(dst[k].numpy(), src[k].numpy(), err_msg=k)
  np.testing.assert_allclose(
      _hf_logits(reloaded), case["logits"], atol=1e-5, rtol=0
  )
  # And our own re-import of the export is exact.
  cfg2, _, params2 = hf.load_pretrained(str(tmp_path))
  assert cfg2 == cfg
  jax.tree.map(np.testing.assert_array_equal, params2, params)


def test_sharded_index_import(llama, tmp_path):
  case, imported = llama
  case["model"].save_pretrained(str(tmp_path), max_shard_size="20KB")
  with open(tmp_path / "model.safetensors.index.json") as f:
    shards = set(json.load(f)["weight_map"].values())
  assert len(shards) > 1
  assert not os.path.exists(tmp_path / "model.safetensors")
  _, _, params = hf.load_pretrained(str(tmp_path))
  jax.tree.map(np.testing.assert_array_equal, params, imported[2])


def test_import_casts_to_the_requested_param_dtype(tmp_path_factory):
  case = _case("qwen2_tied", tmp_path_factory)[0]
  cfg, _, params = hf.load_pretrained(case["path"], param_dtype="bfloat16")
  assert cfg.param_dtype == "bfloat16"
  assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype(jnp.bfloat16)}


_BASE = dict(
    architectures=["LlamaForCausalLM"],
    model_type="llama",
    vocab_size=10,
    hidden_size=8,
    intermediate_size=16,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    rms_norm_eps=1e-5,
    hidden_act="silu",
    max_position_embeddings=128,
)


def test_transformers4_and_5_rope_spellings_agree():
  v4 = dict(
      _BASE,
      rope_theta=500000.0,
      rope_scaling=dict(
          rope_type="llama3",
          factor=32.0,
          low_freq_factor=1.0,
          high_freq_factor=4.0,
          original_max_position_embeddings=8192,
      ),
  )
  v5 = dict(
      _BASE,
      rope_parameters=dict(
          rope_type="llama3",
          rope_theta=500000.0,
          factor=32.0,
          low_freq_factor=1.0,
          high_freq_factor=4.0,
          original_max_position_embeddings=8192,
      ),
  )
  c4, c5 = hf.config_from_hf(v4), hf.config_from_hf(v5)
  assert c4 == c5
  assert (
      c4.rope_scaling,
      c4.rope_factor,
      c4.rope_theta,
      c4.head_dim,
      c4.kv_heads,
  ) == ("llama3", 32.0, 500000.0, 4, 1)
  # Round trip through our exporter.
  assert hf.config_from_hf(hf.config_to_hf(c4)) == c4


@pytest.mark.parametrize(
    "change,match",
    [
        (
            dict(architectures=["MistralForCausalLM"], model_type="mistral"),
            "architectures=.*MistralForCausalLM.*unsupported",
        ),
        (dict(hidden_act="gelu"), "hidden_act='gelu'"),
        (dict(attention_bias=True), "attention_bias=True"),
        (
            dict(rope_parameters=dict(rope_type="yarn", factor=4.0)),
            "rope_type='yarn'",
        ),
        (dict(use_sliding_window=True), "use_sliding_window=True"),
        (
            dict(layer_types=["sliding_attention"]),
            r"layer_types\[0\]='sliding_attention'",
        ),
        (dict(num_key_value_heads=3), "num_kv_heads=3"),
    ],
)
def test_unsupported_configs_raise(change, match):
  with pytest.raises(ValueError, match=match):
    hf.config_from_hf(dict(_BASE, **change))


def test_missing_and_misshaped_tensors_raise(llama):
  case, imported = llama
  cfg = imported[0]
  tensors = hf.read_safetensors(case["path"])
  missing = dict(tensors)
  del missing["model.layers.1.mlp.up_proj.weight"]
  with pytest.raises(
      ValueError, match="lacks tensor 'model.layers.1.mlp.up_proj.weight'"
  ):
    hf.params_from_hf_tensors(cfg, missing)
  with pytest.raises(ValueError, match="k_proj.weight' has shape"):
    hf.params_from_hf_tensors(dataclasses.replace(cfg, num_kv_heads=4), tensors)
  with pytest.raises(ValueError, match="scalar heads"):
    hf.config_to_hf(dataclasses.replace(cfg, value_head=True))
  with pytest.raises(FileNotFoundError):
    hf.read_safetensors(os.path.dirname(case["path"]))


@pytest.fixture(scope="module")
def byte_vocab_llama(tmp_path_factory):
  """A tiny random Llama whose vocabulary is the byte tokenizer's 265 ids."""
  torch.manual_seed(0)
  config = transformers.LlamaConfig(
      vocab_size=265,
      hidden_size=32,
      intermediate_size=64,
      num_hidden_layers=2,
      num_attention_heads=4,
      num_key_value_heads=2,
      head_dim=8,
  )
  path = str(tmp_path_factory.mktemp("llama265"))
  transformers.LlamaForCausalLM(config).save_pretrained(path)
  return path


def test_init_state_from_hf_path_returns_the_imported_params(byte_vocab_llama):
  from agentic_rl import train
  from agentic_rl import validation
  from configs import default

  config = default.get_config("smoke")
  config.model.hf_path = byte_vocab_llama
  config.model.logprob_chunk_size = 8
  validation.validate_config(config)
  model_cfg = train.make_model_config(config)
  # Shapes from the checkpoint's config.json, runtime fields from config.model.
  assert (model_cfg.d_model, model_cfg.num_kv_heads, model_cfg.head_dim) == (
      32,
      2,
      8,
  )
  assert model_cfg.logprob_chunk_size == 8
  graphdef, state = train.init_state(config, model_cfg)
  _, _, want = hf.load_pretrained(byte_vocab_llama)
  jax.tree.map(np.testing.assert_array_equal, state.params, want)
  jax.tree.map(np.testing.assert_array_equal, state.ref_params, want)
  tensors = hf.read_safetensors(byte_vocab_llama)
  np.testing.assert_array_equal(
      nnx.merge(graphdef, state.params).blocks[1].ffn.down_fd[...],
      tensors["model.layers.1.mlp.down_proj.weight"].T,
  )


def test_bad_hf_path_is_a_config_error(byte_vocab_llama, tmp_path):
  from agentic_rl import validation
  from configs import default

  config = default.get_config("smoke")
  config.model.hf_path = str(tmp_path)
  with pytest.raises(
      validation.ConfigError, match="model.hf_path=.*no config.json"
  ):
    validation.validate_config(config)
  with open(os.path.join(byte_vocab_llama, "config.json")) as f:
    small_vocab = dict(json.load(f), vocab_size=200)
  with open(tmp_path / "config.json", "w") as f:
    json.dump(small_vocab, f)
  with pytest.raises(
      validation.ConfigError, match="vocab_size 200 does not cover"
  ):
    validation.validate_config(config)
  config.model.hf_path = ""
  config.model.num_kv_heads = 3
  with pytest.raises(
      validation.ConfigError,
      match="config.model.num_kv_heads=3: must divide num_heads=4",
  ):
    validation.validate_config(config)


@pytest.mark.slow
def test_smoke_experiment_runs_from_an_imported_checkpoint(
    byte_vocab_llama, tmp_path
):
  """python main.py --config=configs/default.py:smoke --config.model.hf_path=DIR
  runs SFT + RL + evaluation end to end from the imported checkpoint."""
  import subprocess
  import sys

  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  out = subprocess.run(
      [
          sys.executable,
          "main.py",
          "--config=configs/default.py:smoke",
          f"--config.model.hf_path={byte_vocab_llama}",
          f"--workdir={tmp_path}",
      ],
      cwd=root,
      capture_output=True,
      text=True,
      timeout=1800,
  )
  assert out.returncode == 0, out.stderr[-3000:]
  with open(tmp_path / "eval_report.json") as f:
    report = json.load(f)
  assert set(report["reports"]) >= {"sft", "rl"}
  with open(tmp_path / "config.json") as f:
    assert json.load(f)["model"]["hf_path"] == byte_vocab_llama
