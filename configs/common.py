"""Shared config blocks: model presets, optimizers, evaluation, checkpointing."""

from __future__ import annotations

import ml_collections

MODEL_PRESETS = {
    # ~0.5M parameters: trains at several thousand tokens/s on a 2-core CPU.
    "tiny": dict(d_model=96, num_layers=3, num_heads=4, head_dim=24, ffn_dim=256),
    # ~1M parameters.
    "small": dict(d_model=128, num_layers=4, num_heads=4, head_dim=32, ffn_dim=384),
}


def model(preset: str = "tiny") -> ml_collections.ConfigDict:
  """Transformer shape (agentic_rl.models.transformer.TransformerConfig fields)."""
  cfg = ml_collections.ConfigDict(dict(MODEL_PRESETS[preset]))
  # Byte-level vocabulary with tool/answer specials (agentic_rl/tokenizers.py).
  cfg.vocab_size = 265
  cfg.rope_theta = 10_000.0
  cfg.norm_eps = 1e-6
  return cfg


def optimizer(learning_rate: float, warmup_steps: int) -> ml_collections.ConfigDict:
  """AdamW + global-norm clipping (agentic_rl.learner.make_optimizer)."""
  return ml_collections.ConfigDict(dict(
      learning_rate=learning_rate,
      warmup_steps=warmup_steps,
      weight_decay=0.0,
      max_grad_norm=1.0,
  ))


def mesh() -> ml_collections.ConfigDict:
  """Device mesh (agentic_rl/sharding.py): axes data, fsdp, tensor.

  data * fsdp * tensor must equal the number of devices; one axis may be -1
  (filled with the remaining devices). The default puts every device on
  'data' (plain data parallelism; one CPU here). Batches are split over
  data * fsdp, parameters over fsdp (d_model) and tensor (heads, FFN, vocab).
  """
  return ml_collections.ConfigDict(dict(
      # Data-parallel replicas (-1: all devices not used by fsdp and tensor).
      data=-1,
      # Fully sharded data parallelism: parameters split on d_model.
      fsdp=1,
      # Tensor parallelism: heads, FFN hidden and vocabulary split.
      tensor=1,
      # Multi-host: call jax.distributed.initialize before anything else.
      distributed=False,
      # host:port of process 0; '' = auto-detect (SLURM, TPU pods, ...).
      coordinator_address="",
      # Number of processes and this process's index; -1 = auto-detect.
      num_processes=-1,
      process_id=-1,
  ))


def base() -> ml_collections.ConfigDict:
  """Fields every experiment has; experiment files override what they change."""
  config = ml_collections.ConfigDict()
  config.name = "experiment"
  config.seed = 0
  # Token buffer length L of a whole episode (prompt + all turns + observations).
  config.max_len = 64
  config.model = model("tiny")
  config.log_every_steps = 5
  config.checkpoint = ml_collections.ConfigDict(dict(every_steps=25, max_to_keep=2))
  # Stop after this global step as if killed (tests of exact resume); -1 = never.
  config.halt_after_step = -1
  return config
