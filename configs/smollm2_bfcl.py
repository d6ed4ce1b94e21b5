"""GRPO on BFCL function calling with SmolLM2-135M-Instruct (4-bit dequantised).

Task: BFCL single-turn 'simple' + 'multiple' (environments/host/bfcl/), data
from the installed `bfcl-eval` wheel. The prompt is the checkpoint's ChatML
template: a system message with the tools as JSON schemas in <tools> tags and
the call format (SmolLM2-Instruct's function-calling prompt), then the
question. The model answers with `<tool_call>[{"name": ..., "arguments":
{...}}]</tool_call>` (Python-call syntax `[f(a=1)]` is accepted too). Reward:
BFCL's verdict (our checker, 100% agreement with BFCL's AST checker) + 0.5 x
per-field partial credit + 0.1 x format. Held-out: 100 tasks from the fixed
split (every 5th task of each category), greedy.

Training: SFT warm start (16 steps x 8 gold calls of the training split, lr
5e-5), then GRPO. Zero-shot the 135M model answers in prose and never emits a
call (held-out format-error rate 1.00 with our sampler and with transformers'
generate), so pure RL from the checkpoint sees reward 0 everywhere (measured:
12 steps, all rewards 0). The imported weights are scored before SFT
(`eval.initial`, eval_initial.json), the SFT checkpoint before RL
(eval_sft.json); `--config.sft.steps=0` is pure RL.

`:multi_turn`: BFCL multi_turn_base against its executable API simulators
(GorillaFileSystem, TwitterAPI, ...): tool results come back as `tool`
messages, the next user question as a `user` message; correct = BFCL's state
check. Its prompts are ~1.4k tokens (the API docs), so on this CPU it is an
evaluation-scale config, not a training run.

Launch (CPU):
  python main.py --config=configs/smollm2_bfcl.py --workdir=runs/smollm2_bfcl
  python main.py --config=configs/smollm2_bfcl.py:smoke --workdir=/tmp/smol_bfcl
  python main.py --config=configs/smollm2_bfcl.py:multi_turn --workdir=runs/smol_mt
The checkpoint folder is written on first use (configs/smollm2_common.py).

Runtime (2 CPU cores, shared with other jobs; experiments/smollm2/README.md):
evaluation of the imported weights 18.5 min, 16 SFT steps 38 min (97-234 s
each), SFT evaluation 8.5 min (held-out accuracy 0.00 -> 0.39), 12 RL steps
24.4 min (~2 min each; held-out accuracy 0.39 -> 0.39), final evaluation 5.5
min; peak RSS 12.1 GB.
:smoke a few minutes.

At scale (GPU / TPU slice): the same file with bigger batches, e.g. on 8
devices
  --config.mesh.data=4 --config.mesh.fsdp=2 --config.rl.batch_size=256
  --config.rl.group_size=8 --config.rl.steps=300 --config.rl.learning_rate=1e-6
  --config.model.param_dtype=bfloat16 --config.model.dtype=bfloat16
  --config.env.descriptions=True --config.env.max_prompt_len=768
  --config.max_len=896 --config.eval.num_tasks=400
(host environments roll out from Python between jitted turns; the update step
runs on the mesh). Expect hours, not minutes, for a measurable gain at 135M.

Expected: see experiments/smollm2/README.md (zero-shot vs after RL).
"""

from __future__ import annotations

import ml_collections

from configs import smollm2_common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  config = smollm2_common.base("smollm2_bfcl")
  # Environment: environments/host/bfcl/ (chat format with the HF tokenizer).
  config.env = ml_collections.ConfigDict(
      dict(
          name="bfcl",
          # BFCL single-turn categories.
          categories=("simple", "multiple"),
          # Held-out split: task index % eval_every == 0.
          eval_every=5,
          # SmolLM2 tokens: prompts without descriptions p50 225 / p90 345 / p99 422
          # (with descriptions p50 295 / p90 522); longer prompts are cut.
          max_prompt_len=384,
          # Gold answers as Hermes JSON: p99 92 tokens.
          max_action_len=96,
          max_obs_len=8,
          max_turns=1,
          # Function descriptions in the tool schemas (longer prompts).
          descriptions=False,
      )
  )
  config.max_len = 384 + 96
  # BFCL verdict + partial credit per field + format (agentic_rl/rewards/components.py).
  config.rl.rewards = ml_collections.ConfigDict(
      dict(correct=1.0, call_score=0.5, format=0.1)
  )
  # SFT warm start on gold calls of the training split (never the held-out
  # tasks): zero-shot, the 135M model answers in prose and never emits a
  # <tool_call> (held-out format-error rate 1.00, also under transformers'
  # own generate), so pure RL sees reward 0 on every sample and no gradient.
  # 16 steps x 8 demonstrations, accumulated one demonstration at a time.
  config.sft = smollm2_common.sft_warm_start(
      steps=16, batch_size=8, learning_rate=5e-5
  )
  # Also score the imported checkpoint before SFT (eval_initial.json).
  config.eval.initial = True

  if arg == "smoke":
    config.name = "smollm2_bfcl_smoke"
    smollm2_common.shrink_for_smoke(config)
    config.env.max_prompt_len = 256
    config.env.max_action_len = 32
    config.max_len = 288
  elif arg == "multi_turn":
    config.name = "smollm2_bfcl_multi_turn"
    config.env = ml_collections.ConfigDict(
        dict(
            name="bfcl_multi_turn",
            eval_every=5,
            max_prompt_len=2048,
            max_action_len=96,
            max_obs_len=128,
            max_turns=8,
            descriptions=False,
        )
    )
    config.max_len = 3072
    config.rl.rewards = ml_collections.ConfigDict(dict(correct=1.0))
    config.eval.num_tasks = 40  # the held-out split has 40 multi-turn tasks
    # No warm start: SFT on ~2k-token multi-turn demonstrations is not a CPU job.
    config.sft.steps = 0
    config.eval.initial = False
  elif arg is not None:
    raise ValueError(
        f"configs/smollm2_bfcl.py: unknown arg {arg!r}; known: "
        "'smoke', 'multi_turn'"
    )
  return config
