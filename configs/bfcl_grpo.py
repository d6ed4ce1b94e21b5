"""GRPO on BFCL single-turn function calling (simple + multiple), host environment.

Task: a BFCL question with its function signatures in the prompt
(environments/host/bfcl/single_turn.py); the policy answers in one turn with the call(s), in
any format the parser accepts (`<call>f(a=1)</call>` with the byte tokenizer,
`<tool_call>{json}</tool_call>` with an HF chat tokenizer). Reward: BFCL's verdict
(`correct`, our checker, 100% agreement with BFCL's AST checker on the shipped
data) plus fine-grained partial credit per call field (`call_score`) and a small
format term. The rollout runs through the host driver (agentic_rl/host_rollout.py).
Held-out evaluation: every 5th task of each category (fixed split).

Launch:   python main.py --config=configs/bfcl_grpo.py --workdir=runs/bfcl
          python main.py --config=configs/bfcl_grpo.py:smoke --workdir=/tmp/bfcl_smoke
Runtime:  smoke: ~1-3 minutes on a 2-core CPU (compilation dominates). Full config
          with the tiny byte-level model: ~1 h on a CPU; it is a plumbing check,
          not a result: a 0.5M-parameter byte model does not learn BFCL.
Expected: smoke: finishes with finite losses and writes eval_report.{json,md}.
          Meaningful accuracies need an imported checkpoint (agentic_rl/models/hf.py
          and the HF tokenizer wrapper, being built separately): set the model and
          tokenizer from the checkpoint, drop SFT (sft.steps=0) and shorten
          max_prompt_len (HF tokens are ~4 bytes).
"""

from __future__ import annotations

import ml_collections

from configs import common
from configs import default


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  # Start from the main experiment's RL/eval blocks (every documented switch).
  config = default.get_config()
  config.name = "bfcl_grpo"
  # Buffer: prompt (<= max_prompt_len) + one call turn (<= max_action_len).
  config.max_len = 704
  config.model = common.model("tiny")
  # 'byte': the byte tokenizer with tool specials; 'hf': the tokenizer, stop ids
  # and chat template of the checkpoint at config.model.hf_path (host envs only),
  # e.g. --config.model.hf_path=DIR --config.tokenizer=hf --config.sft.steps=0.
  config.tokenizer = "byte"

  # Environment: environments/host/bfcl/ (host: rollout via host_rollout.py).
  config.env = ml_collections.ConfigDict(
      dict(
          name="bfcl",
          # BFCL single-turn categories: 'simple', 'multiple', 'parallel',
          # 'parallel_multiple'.
          categories=("simple", "multiple"),
          # Held-out split: task index % eval_every == 0.
          eval_every=5,
          # Byte-level lengths (99% of simple+multiple prompts fit in 512 bytes; 99%
          # of gold answers in 152 bytes).
          max_prompt_len=512,
          max_action_len=176,
          max_obs_len=8,
          max_turns=1,
          # Include the function descriptions in the prompt (longer prompts).
          descriptions=False,
      )
  )

  # SFT warm start on the gold calls (the environment's expert), byte model only.
  config.sft = common.optimizer(learning_rate=3e-3, warmup_steps=20)
  config.sft.steps = 200
  config.sft.batch_size = 16

  config.rl.learning_rate = 3e-4
  config.rl.steps = 100
  config.rl.batch_size = 32
  config.rl.group_size = 8
  config.rl.num_minibatches = 1
  # BFCL verdict + partial credit per field + format (agentic_rl/rewards/components.py).
  config.rl.rewards = ml_collections.ConfigDict(
      dict(correct=1.0, call_score=0.5, format=0.1)
  )

  config.eval = ml_collections.ConfigDict(
      dict(
          num_tasks=120,
          seed=12345,
          num_samples=0,
          temperature=1.0,
          pass_k=(),
      )
  )

  # Slow steps (host rollouts, long buffers): save every 25 steps, not
  # configs/default.py's 100.
  config.checkpoint.every_steps = 25

  if arg == "smoke":
    config.name = "bfcl_grpo_smoke"
    # A smaller model and buffer: compilation dominates a 3-step run.
    config.model.update(
        dict(d_model=32, num_layers=1, num_heads=2, head_dim=16, ffn_dim=64)
    )
    config.max_len = 112
    config.env.max_prompt_len = 96
    config.env.max_action_len = 16
    config.sft.steps = 1
    config.sft.batch_size = 4
    config.rl.steps = 2
    config.rl.batch_size = 4
    config.rl.group_size = 2
    config.eval.num_tasks = 4
    config.checkpoint.every_steps = 1
    config.log_every_steps = 1
  elif arg is not None:
    raise ValueError(
        f"configs/bfcl_grpo.py: unknown arg {arg!r}; known: 'smoke'"
    )
  return config
