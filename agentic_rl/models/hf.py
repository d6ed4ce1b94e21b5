"""Hugging Face interop: LlamaForCausalLM / Qwen2ForCausalLM checkpoints <-> ours.

Local files only (nothing is downloaded). A checkpoint folder holds
`config.json` and either one `model.safetensors` or shards listed in
`model.safetensors.index.json` (its "weight_map": tensor name -> file). Tensors
are read and written with the `safetensors` numpy API (no torch at run time).

Name and layout mapping (HF Linear weights are [out, in]; ours are [in, out]
with the head axes split out, see the naming contract in transformer.py):

  model.embed_tokens.weight [V, D]               -> embed_vd
  lm_head.weight [V, D] (absent when tied)       -> lm_head_dv = W^T
  model.norm.weight [D]                          -> final_norm.scale
  model.layers.i.input_layernorm.weight          -> blocks[i].attn_norm.scale
  model.layers.i.post_attention_layernorm.weight -> blocks[i].ffn_norm.scale
  model.layers.i.self_attn.q_proj.weight [H*Dh, D] -> q_dhk = W^T.reshape(D, H, Dh)
  model.layers.i.self_attn.{k,v}_proj.weight [G*Dh, D] -> {k,v}_dgk
  model.layers.i.self_attn.o_proj.weight [D, H*Dh] -> o_hkd = W^T.reshape(H, Dh, D)
  model.layers.i.self_attn.{q,k,v}_proj.bias (Qwen2) -> q_bias_hk, {k,v}_bias_gk
  model.layers.i.mlp.{gate,up}_proj.weight [F, D] -> {gate,up}_df = W^T
  model.layers.i.mlp.down_proj.weight [D, F]     -> down_fd = W^T

HF Llama/Qwen2 apply RoPE in the rotate-half layout, which is ours, so q/k need
no permutation.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors import numpy as st_numpy

from agentic_rl.models import transformer

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
}
_INDEX = "model.safetensors.index.json"
# TransformerConfig fields that are not part of a checkpoint's shape: an
# experiment config may set them on top of an imported config.json.
RUNTIME_FIELDS = (
    "param_dtype",
    "dtype",
    "remat",
    "value_head",
    "reward_head",
    "logprob_chunk_size",
    "attention_impl",
    "attention_block",
    "decode_bucket",
)
# Scalar heads a CausalLM checkpoint does not have; initialised to zero on import.
_HEADS = (("value_head_d",), ("reward_head_d",))
_SINGLE = "model.safetensors"


def _fail(field: str, value: Any, why: str):
  raise ValueError(f"Hugging Face config {field}={value!r}: {why}")


def config_from_hf(
    hf: dict[str, Any], **overrides: Any
) -> transformer.TransformerConfig:
  """TransformerConfig from a LlamaForCausalLM / Qwen2ForCausalLM config.json dict.

  Reads both the transformers 4 format (top-level `rope_theta`, `rope_scaling`)
  and the transformers 5 format (`rope_parameters`).

  Args:
    hf: the parsed config.json.
    **overrides: TransformerConfig fields to set on top (e.g. param_dtype,
      dtype, remat, logprob_chunk_size).

  Returns:
    The config (qkv_bias True for Qwen2, False for Llama).

  Raises:
    ValueError: unsupported architecture or a field this decoder does not
      implement (naming the field and value): a non-SiLU activation, Llama
      attention/MLP biases, sliding-window attention, partial rotary
      embeddings, a RoPE type other than default/llama3.
  """
  archs = hf.get("architectures") or []
  model_type = hf.get("model_type")
  arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
  if arch is None:
    if archs or model_type not in SUPPORTED_ARCHITECTURES.values():
      _fail(
          "architectures",
          archs or model_type,
          f"unsupported; supported: {sorted(SUPPORTED_ARCHITECTURES)}",
      )
    family = model_type
  else:
    family = SUPPORTED_ARCHITECTURES[arch]
  if hf.get("hidden_act", "silu") != "silu":
    _fail("hidden_act", hf["hidden_act"], "only 'silu' (SwiGLU) is supported")
  if family == "llama":
    for f in ("attention_bias", "mlp_bias"):
      if hf.get(f, False):
        _fail(f, hf[f], "Llama projection biases are not supported")
  if hf.get("use_sliding_window", False):
    _fail(
        "use_sliding_window",
        hf["use_sliding_window"],
        "sliding-window attention is not supported",
    )
  for i, kind in enumerate(hf.get("layer_types") or []):
    if kind != "full_attention":
      _fail(f"layer_types[{i}]", kind, "only 'full_attention' is supported")
  rope = dict(hf.get("rope_parameters") or {})
  if hf.get("rope_scaling"):
    rope = {**dict(hf["rope_scaling"]), **rope}
  theta = rope.get("rope_theta", hf.get("rope_theta", 10_000.0))
  if (
      rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
      != 1.0
  ):
    _fail(
        "partial_rotary_factor",
        rope.get("partial_rotary_factor", hf.get("partial_rotary_factor")),
        "partial rotary embeddings are not supported",
    )
  rope_type = rope.get("rope_type", rope.get("type", "default")) or "default"
  d, heads = hf["hidden_size"], hf["num_attention_heads"]
  fields = dict(
      vocab_size=hf["vocab_size"],
      d_model=d,
      num_layers=hf["num_hidden_layers"],
      num_heads=heads,
      num_kv_heads=hf.get("num_key_value_heads") or heads,
      head_dim=hf.get("head_dim") or d // heads,
      ffn_dim=hf["intermediate_size"],
      rope_theta=float(theta),
      norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
      qkv_bias=family == "qwen2",
      tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
      max_positions=int(hf.get("max_position_embeddings", 4096)),
  )
  if rope_type == "llama3":
    fields.update(
        rope_scaling="llama3",
        rope_factor=float(rope["factor"]),
        rope_low_freq_factor=float(rope["low_freq_factor"]),
        rope_high_freq_factor=float(rope["high_freq_factor"]),
        rope_original_max_positions=int(
            rope["original_max_position_embeddings"]
        ),
    )
  elif rope_type != "default":
    _fail(
        "rope_parameters.rope_type",
        rope_type,
        "only 'default' and 'llama3' RoPE are supported",
    )
  fields.update(overrides)
  return transformer.TransformerConfig(**fields)


def config_to_hf(cfg: transformer.TransformerConfig) -> dict[str, Any]:
  """config.json dict for `cfg`: Qwen2ForCausalLM if qkv_bias, else Llama.

  Writes the RoPE settings in both the transformers 5 (`rope_parameters`) and
  4 (`rope_theta`, `rope_scaling`) spellings.

  Raises:
    ValueError: the config has value/reward heads (no CausalLM counterpart).
  """
  if cfg.value_head or cfg.reward_head:
    raise ValueError(
        f"value_head={cfg.value_head}, reward_head={cfg.reward_head}: scalar heads "
        "have no LlamaForCausalLM / Qwen2ForCausalLM counterpart; export the LM only"
    )
  family = "qwen2" if cfg.qkv_bias else "llama"
  arch = "Qwen2ForCausalLM" if cfg.qkv_bias else "LlamaForCausalLM"
  rope: dict[str, Any] = {"rope_type": "default", "rope_theta": cfg.rope_theta}
  if cfg.rope_scaling == "llama3":
    rope.update(
        rope_type="llama3",
        factor=cfg.rope_factor,
        low_freq_factor=cfg.rope_low_freq_factor,
        high_freq_factor=cfg.rope_high_freq_factor,
        original_max_position_embeddings=cfg.rope_original_max_positions,
    )
  hf = dict(
      architectures=[arch],
      model_type=family,
      vocab_size=cfg.vocab_size,
      hidden_size=cfg.d_model,
      intermediate_size=cfg.ffn_dim,
      num_hidden_layers=cfg.num_layers,
      num_attention_heads=cfg.num_heads,
      num_key_value_heads=cfg.kv_heads,
      head_dim=cfg.head_dim,
      hidden_act="silu",
      rms_norm_eps=cfg.norm_eps,
      max_position_embeddings=cfg.max_positions,
      tie_word_embeddings=cfg.tie_embeddings,
      rope_parameters=rope,
      rope_theta=cfg.rope_theta,
      rope_scaling=None
      if cfg.rope_scaling == "none"
      else {k: v for k, v in rope.items() if k != "rope_theta"},
      torch_dtype=cfg.param_dtype,
  )
  if family == "llama":
    hf.update(attention_bias=False, mlp_bias=False)
  else:
    hf.update(use_sliding_window=False)
  return hf


def _mapping(
    cfg: transformer.TransformerConfig,
) -> dict[tuple, tuple[str, Callable, Callable]]:
  """Our flat param path -> (HF tensor name, to_ours, to_hf)."""
  d, h, g, k = cfg.d_model, cfg.num_heads, cfg.kv_heads, cfg.head_dim
  t = lambda w: np.ascontiguousarray(w.T)
  ident = lambda w: w
  m: dict[tuple, tuple[str, Callable, Callable]] = {
      ("embed_vd",): ("model.embed_tokens.weight", ident, ident),
      ("final_norm", "scale"): ("model.norm.weight", ident, ident),
  }
  if not cfg.tie_embeddings:
    m[("lm_head_dv",)] = ("lm_head.weight", t, t)
  for i in range(cfg.num_layers):
    p = f"model.layers.{i}."
    a = f"{p}self_attn."
    m[("blocks", i, "attn_norm", "scale")] = (
        f"{p}input_layernorm.weight",
        ident,
        ident,
    )
    m[("blocks", i, "ffn_norm", "scale")] = (
        f"{p}post_attention_layernorm.weight",
        ident,
        ident,
    )
    for ours, name, heads in (
        ("q_dhk", "q", h),
        ("k_dgk", "k", g),
        ("v_dgk", "v", g),
    ):
      m[("blocks", i, "attn", ours)] = (
          f"{a}{name}_proj.weight",
          lambda w, n=heads: t(w).reshape(d, n, k),
          lambda w, n=heads: t(w.reshape(d, n * k)),
      )
      if cfg.qkv_bias:
        bias = ours[0] + "_bias_" + ours[-2:]
        m[("blocks", i, "attn", bias)] = (
            f"{a}{name}_proj.bias",
            lambda w, n=heads: w.reshape(n, k),
            lambda w, n=heads: w.reshape(n * k),
        )
    m[("blocks", i, "attn", "o_hkd")] = (
        f"{a}o_proj.weight",
        lambda w: t(w).reshape(h, k, d),
        lambda w: t(w.reshape(h * k, d)),
    )
    for ours, name in (
        ("gate_df", "gate"),
        ("up_df", "up"),
        ("down_fd", "down"),
    ):
      m[("blocks", i, "ffn", ours)] = (f"{p}mlp.{name}_proj.weight", t, t)
  return m


def params_from_hf_tensors(
    cfg: transformer.TransformerConfig, tensors: dict[str, np.ndarray]
) -> tuple[nnx.GraphDef, nnx.State]:
  """(graphdef, params) of a Transformer(cfg) holding the given HF tensors.

  The model is built abstractly (nnx.eval_shape), so no random initialisation
  is materialised. Parameters are cast to cfg.param_dtype. Scalar value /
  reward heads (if the config enables them) start at zero, as in a fresh model.

  Raises:
    ValueError: a missing tensor, a tensor of the wrong shape, or tensors the
      config does not use (named).
  """
  graphdef, abstract = nnx.split(
      nnx.eval_shape(lambda: transformer.Transformer(cfg, nnx.Rngs(0)))
  )
  mapping = _mapping(cfg)
  used = set()
  flat = []
  for path, var in nnx.to_flat_state(abstract):
    if path in _HEADS:
      flat.append(
          (
              path,
              var.replace(jnp.zeros(var.get_value().shape, cfg.params_dtype)),
          )
      )
      continue
    if path not in mapping:
      raise ValueError(f"parameter {path} has no Hugging Face counterpart")
    name, to_ours, to_hf = mapping[path]
    where = ".".join(map(str, path))
    if name not in tensors:
      raise ValueError(f"checkpoint lacks tensor {name!r} (for {where})")
    want = tuple(var.get_value().shape)
    want_hf = to_hf(np.zeros(want, np.int8)).shape
    if tuple(tensors[name].shape) != want_hf:
      raise ValueError(
          f"tensor {name!r} has shape {tuple(tensors[name].shape)}; "
          f"the config implies {want_hf} (ours: {where} {want})"
      )
    value = to_ours(np.asarray(tensors[name]))
    used.add(name)
    flat.append((path, var.replace(jnp.asarray(value, cfg.params_dtype))))
  unused = sorted(set(tensors) - used)
  if cfg.tie_embeddings and "lm_head.weight" in unused:
    unused.remove("lm_head.weight")  # some exporters write the tied copy
  if unused:
    raise ValueError(
        f"checkpoint tensors not used by the config: {unused[:5]}"
        f"{' ...' if len(unused) > 5 else ''}"
    )
  return graphdef, nnx.from_flat_state(flat)


def params_to_hf_tensors(
    cfg: transformer.TransformerConfig, params: nnx.State
) -> dict[str, np.ndarray]:
  """HF tensor name -> numpy array (in the parameters' dtype) for `params`."""
  mapping = _mapping(cfg)
  out = {}
  for path, var in nnx.to_flat_state(params):
    name, _, to_hf = mapping[path]
    out[name] = to_hf(np.asarray(jax.device_get(var.get_value())))
  return out


def read_safetensors(path: str) -> dict[str, np.ndarray]:
  """All tensors of a checkpoint folder (single file or sharded index).

  Raises:
    FileNotFoundError: neither model.safetensors nor its index is present.
    ValueError: a shard lists a tensor twice.
  """
  index = os.path.join(path, _INDEX)
  if os.path.exists(index):
    with open(index) as f:
      weight_map = json.load(f)["weight_map"]
    files = sorted(set(weight_map.values()))
  elif os.path.exists(os.path.join(path, _SINGLE)):
    files = [_SINGLE]
  else:
    raise FileNotFoundError(f"{path}: no {_SINGLE} or {_INDEX}")
  tensors: dict[str, np.ndarray] = {}
  for name in files:
    for k, v in st_numpy.load_file(os.path.join(path, name)).items():
      if k in tensors:
        raise ValueError(f"tensor {k!r} appears in more than one shard")
      tensors[k] = v
  return tensors


def read_config(path: str) -> dict[str, Any]:
  """The parsed `config.json` of a checkpoint folder."""
  with open(os.path.join(path, "config.json")) as f:
    return json.load(f)


def load_pretrained(
    path: str, **overrides: Any
) -> tuple[transformer.TransformerConfig, nnx.GraphDef, nnx.State]:
  """Imports a LlamaForCausalLM / Qwen2ForCausalLM checkpoint folder.

  Args:
    path: local folder with config.json and *.safetensors.
    **overrides: TransformerConfig fields to set on top of config.json (e.g.
      param_dtype='bfloat16', remat=True).

  Returns:
    (config, graphdef, params), with `nnx.merge(graphdef, params)` the model.

  Raises:
    FileNotFoundError: missing config.json or weights.
    ValueError: unsupported architecture/fields, or tensors not matching.
  """
  cfg = config_from_hf(read_config(path), **overrides)
  graphdef, params = params_from_hf_tensors(cfg, read_safetensors(path))
  return cfg, graphdef, params


def save_pretrained(
    path: str, cfg: transformer.TransformerConfig, params: nnx.State
) -> None:
  """Writes config.json + model.safetensors that `transformers` loads.

  A model with LoRA adapters (cfg.lora) is written with the adapters folded
  into its weights, W + (alpha / r) A B (lora.merge).

  Raises:
    ValueError: the config has scalar heads (see config_to_hf).
  """
  if cfg.lora is not None:
    from agentic_rl.models import lora  # noqa: PLC0415

    graphdef = nnx.graphdef(
        nnx.eval_shape(lambda: transformer.Transformer(cfg, nnx.Rngs(0)))
    )
    cfg, _, params = lora.merge(cfg, graphdef, params)
  hf = config_to_hf(cfg)
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(hf, f, indent=2)
  st_numpy.save_file(
      params_to_hf_tensors(cfg, params),
      os.path.join(path, _SINGLE),
      metadata={"format": "pt"},
  )
