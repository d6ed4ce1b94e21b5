"""Shared config blocks: model presets, optimizers, evaluation, checkpointing."""

from __future__ import annotations

import dataclasses

import ml_collections

from agentic_rl import sharding
from agentic_rl.models import transformer

MODEL_PRESETS = {
    # ~0.5M parameters: trains at several thousand tokens/s on a 2-core CPU.
    "tiny": dict(
        d_model=96, num_layers=3, num_heads=4, head_dim=24, ffn_dim=256
    ),
    # ~1M parameters.
    "small": dict(
        d_model=128, num_layers=4, num_heads=4, head_dim=32, ffn_dim=384
    ),
    # Real checkpoint shapes (for jax.eval_shape, sharding plans and HF import;
    # far too large to train on a CPU). SmolLM2-135M(-Instruct): 134.5M
    # parameters, GQA 9 query / 3 kv heads, tied embeddings.
    "smollm2-135m": dict(
        vocab_size=49_152,
        d_model=576,
        num_layers=30,
        num_heads=9,
        num_kv_heads=3,
        head_dim=64,
        ffn_dim=1536,
        rope_theta=100_000.0,
        norm_eps=1e-5,
        tie_embeddings=True,
        max_positions=8192,
        logprob_chunk_size=256,
    ),
    # Qwen2.5-0.5B: 0.49B parameters, GQA
    # 14 query / 2 kv heads, QKV bias, tied embeddings.
    "qwen2.5-0.5b": dict(
        vocab_size=151_936,
        d_model=896,
        num_layers=24,
        num_heads=14,
        num_kv_heads=2,
        head_dim=64,
        ffn_dim=4864,
        rope_theta=1_000_000.0,
        norm_eps=1e-6,
        qkv_bias=True,
        tie_embeddings=True,
        max_positions=32_768,
        logprob_chunk_size=256,
    ),
    # Llama-3.2-1B: 1.24B parameters, GQA 32 / 8 heads, tied embeddings, Llama 3
    # RoPE scaling (factor 32 over an original 8192-token context).
    "llama-3.2-1b": dict(
        vocab_size=128_256,
        d_model=2048,
        num_layers=16,
        num_heads=32,
        num_kv_heads=8,
        head_dim=64,
        ffn_dim=8192,
        rope_theta=500_000.0,
        norm_eps=1e-5,
        tie_embeddings=True,
        rope_scaling="llama3",
        rope_factor=32.0,
        rope_low_freq_factor=1.0,
        rope_high_freq_factor=4.0,
        rope_original_max_positions=8192,
        max_positions=131_072,
        logprob_chunk_size=256,
    ),
}


def model(preset: str = "tiny") -> ml_collections.ConfigDict:
  """Transformer config: every TransformerConfig field, plus `hf_path` and `lora`.

  Fields not set by the preset keep the TransformerConfig defaults (documented
  in agentic_rl/models/transformer.py); every one can be overridden with
  --config.model.FIELD=VALUE.

  Raises:
    ValueError: unknown preset name.
  """
  if preset not in MODEL_PRESETS:
    raise ValueError(
        f"model preset {preset!r}: unknown; known: {sorted(MODEL_PRESETS)}"
    )
  fields = {
      f.name: f.default
      for f in dataclasses.fields(transformer.TransformerConfig)
  }
  # Byte-level vocabulary with tool/answer specials (agentic_text/tokenizers.py).
  fields["vocab_size"] = 265
  fields["rope_theta"] = 10_000.0
  fields["norm_eps"] = 1e-6
  fields.update(MODEL_PRESETS[preset])
  fields.pop("lora")  # a sub-block of its own, below
  cfg = ml_collections.ConfigDict(fields)
  # Directory of a Hugging Face LlamaForCausalLM / Qwen2ForCausalLM checkpoint
  # (config.json + *.safetensors); when set, the policy is built from it and the
  # shape fields above are ignored. '' = random init from the fields above.
  cfg.hf_path = ""
  # Low-rank adapters (agentic_rl/models/lora.py; Hu et al. 2021,
  # arXiv:2106.09685): rank 0 = off (full fine-tuning). With rank r > 0 only
  # the adapters (and scalar heads) train; the base is frozen and has no
  # optimizer state; the reference model is the shared base plus the
  # reference's own adapters (at RL start a copy of the policy's, so the SFT
  # policy; no second copy of the base); checkpoints hold the adapters only.
  # e.g. --config.model.lora.rank=8
  cfg.lora = ml_collections.ConfigDict(
      dict(
          # Adapter rank r; 0 = off (full fine-tuning).
          rank=0,
          # Update scale alpha / rank.
          alpha=16.0,
          # Any of 'q', 'k', 'v', 'o', 'gate', 'up', 'down'.
          targets=("q", "k", "v", "o", "gate", "up", "down"),
          # Dropout on the adapter branch's input, in the SFT and RL loss
          # forwards only (sampling, reference and behaviour run without; the
          # logged rl/kl and ratios then include the dropout noise).
          dropout=0.0,
      )
  )
  return cfg


def optimizer(
    learning_rate: float, warmup_steps: int
) -> ml_collections.ConfigDict:
  """AdamW + global-norm clipping (agentic_rl.learner.make_optimizer)."""
  return ml_collections.ConfigDict(
      dict(
          # Peak learning rate of AdamW (after the linear warmup; constant after).
          learning_rate=learning_rate,
          # Steps of linear warmup from 0 to learning_rate.
          warmup_steps=warmup_steps,
          # Decoupled weight decay of AdamW (0 = none).
          weight_decay=0.0,
          # Clip the gradient to this global norm before the update.
          max_grad_norm=1.0,
      )
  )


def mesh() -> ml_collections.ConfigDict:
  """Device mesh (agentic_rl/sharding.py): axes data, fsdp, tensor.

  data * fsdp * tensor must equal the number of devices; one axis may be -1
  (filled with the remaining devices). The default puts every device on
  'data' (plain data parallelism; one CPU here). Batches are split over
  data * fsdp, parameters over fsdp (d_model) and tensor (heads, FFN, vocab).
  Each field's default and meaning: agentic_rl.sharding.MESH_DEFAULTS.
  """
  return ml_collections.ConfigDict(
      dict(sharding.MESH_DEFAULTS)
  )  # fields documented there


def base() -> ml_collections.ConfigDict:
  """Fields every experiment has; experiment files override what they change.

  With configs/default.py (mode 'rl') and configs/rm_arithmetic.py (mode 'rm')
  these are the config schema (configs/schema.py): each field's default, type
  (that of the default) and meaning (the comment above it).
  """
  config = ml_collections.ConfigDict()
  # main.py dispatch: 'rl' (agentic_rl/train.py) or 'rm' (reward models,
  # agentic_rl/rm_train.py).
  config.mode = "rl"
  # Run name: the default workdir is runs/<name>; the progress bar's label.
  config.name = "experiment"
  # Seed of the model initialisation, task sampling and rollouts.
  config.seed = 0
  # Token buffer length L of a whole episode (prompt + all turns + observations).
  config.max_len = 64
  # Host-rollout batches are cut after their longest episode, rounded up to a
  # multiple of this many positions, before the update (agentic_rl/padding.py;
  # one compiled update per bucket); 0 = train on the whole max_len buffer.
  config.trim_bucket = 16
  # The policy's transformer (see model() above).
  config.model = model("tiny")
  # Write training metrics (metrics.jsonl, TensorBoard) every this many steps
  # (the SFT phase; RL: rl.log_every_steps).
  config.log_every_steps = 5
  # Checkpoints (orbax) under WORKDIR/checkpoints.
  config.checkpoint = ml_collections.ConfigDict(
      dict(
          # Save every this many steps (and at the end of each phase).
          every_steps=25,
          # Keep the newest this many checkpoints.
          max_to_keep=2,
      )
  )
  # Stop after this global step as if killed (tests of exact resume); -1 = never.
  config.halt_after_step = -1
  # Device mesh (agentic_rl/sharding.py); default: all devices data-parallel.
  config.mesh = mesh()
  return config
