"""GRPO on reasoning-gym math with a Python tool, SmolLM2-135M-Instruct (Q4_1).

Task: a 50/50 mix of reasoning-gym's `gsm_symbolic` (GSM8K-derived templates)
and `basic_arithmetic` (2-3 terms of 1-2 digits), drawn by its `composite`
generator and scored by each generator's own `score_answer`
(environments/host/reasoning_gym_env.py). Chat format: the checkpoint's ChatML
template; the model may run Python in a ```python block (or a Hermes
<tool_call> to `python`), sandboxed (environments/host/sandbox.py), and sees
the output as a `tool` message; the answer is the text in <answer>..</answer>,
else in \\boxed{}, else the last number of a reply without code. Held-out: the
first 100 items of a separately seeded stream; accuracy_hard = gsm_symbolic,
accuracy_easy = basic_arithmetic.

Launch (CPU):
  python main.py --config=configs/smollm2_gsm_tool.py --workdir=runs/smollm2_gsm
  python main.py --config=configs/smollm2_gsm_tool.py:smoke --workdir=/tmp/smol_gsm
  :gsm (gsm_symbolic only), :arithmetic (basic_arithmetic only).
The checkpoint folder is written on first use (configs/smollm2_common.py).

Runtime (2 CPU cores, shared with other jobs; experiments/smollm2/README.md):
zero-shot evaluation 27.7 min (100 items, greedy, batch 100), 12 RL steps
36.6 min (~3 min each), final evaluation ~10 min; held-out accuracy 0.04 -> 0.04;
RSS 9.3 GB in RL steps, 12.1 GB peak. :smoke a few minutes.

At scale (GPU / TPU slice), e.g. on 8 devices:
  --config.mesh.data=4 --config.mesh.fsdp=2 --config.rl.batch_size=256
  --config.rl.group_size=8 --config.rl.steps=500 --config.rl.learning_rate=1e-6
  --config.model.param_dtype=bfloat16 --config.model.dtype=bfloat16
  --config.env.max_action_len=512 --config.env.max_turns=4 --config.max_len=2560
  --config.eval.num_tasks=500 --config.env.max_workers=32

Expected: see experiments/smollm2/README.md.
"""

from __future__ import annotations

import ml_collections

from configs import smollm2_common

_ARITHMETIC = dict(min_terms=2, max_terms=3, min_digits=1, max_digits=2)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  config = smollm2_common.base("smollm2_gsm_tool")
  config.env = ml_collections.ConfigDict(
      dict(
          name="reasoning_gym",
          # reasoning-gym's mixing generator; each item keeps its source's verifier.
          dataset="composite",
          dataset_config=ml_collections.ConfigDict(
              dict(
                  datasets=(
                      dict(name="gsm_symbolic", weight=1.0, config={}),
                      dict(
                          name="basic_arithmetic",
                          weight=1.0,
                          config=_ARITHMETIC,
                      ),
                  )
              )
          ),
          hard_datasets=("gsm_symbolic",),
          train_seed=0,
          eval_seed=1_000_003,
          # Procedural stream size (items are generated on access).
          train_size=100_000,
          correct_threshold=1.0,
          # SmolLM2 tokens: gsm_symbolic prompts p99 221 with the system prompt.
          max_prompt_len=256,
          max_action_len=160,
          max_obs_len=48,
          # A Python call, then the answer.
          max_turns=2,
          cpu_seconds=5,
          wall_seconds=10.0,
          memory_bytes=1 << 30,
          max_workers=4,
          expert_tool_prob=0.5,
      )
  )
  config.max_len = 256 + 2 * 160 + 48
  config.rl.rewards = ml_collections.ConfigDict(dict(correct=1.0, format=0.1))

  if arg == "smoke":
    config.name = "smollm2_gsm_tool_smoke"
    smollm2_common.shrink_for_smoke(config)
    config.env.max_action_len = 32
    config.max_len = 256 + 2 * 32 + 48
  elif arg in ("gsm", "arithmetic"):
    config.name = f"smollm2_{arg}_tool"
    config.env.dataset = "gsm_symbolic" if arg == "gsm" else "basic_arithmetic"
    config.env.dataset_config = ml_collections.ConfigDict(
        {} if arg == "gsm" else _ARITHMETIC
    )
    config.env.hard_datasets = ("gsm_symbolic",)
  elif arg is not None:
    raise ValueError(
        f"configs/smollm2_gsm_tool.py: unknown arg {arg!r}; known: "
        "'smoke', 'gsm', 'arithmetic'"
    )
  return config
