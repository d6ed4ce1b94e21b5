"""GRPO with a sandboxed Python tool on reasoning-gym's gsm_symbolic (host env).

Task: a grade-school word problem from reasoning-gym's `gsm_symbolic` generator
(environments/host/reasoning_gym_env.py); the policy may run Python
(`<call>print(3 * 35 + 93)</call>` -> `<obs>198</obs>`, in the sandbox of
environments/host/sandbox.py) and answers `<answer>288</answer>`, scored by the
generator's own `score_answer`. Any reasoning-gym generator works:
`--config.env.dataset=basic_arithmetic`.

Launch:   python main.py --config=configs/gsm_tool.py --workdir=runs/gsm_tool
          python main.py --config=configs/gsm_tool.py:smoke --workdir=/tmp/gsm_smoke
Runtime:  smoke: ~1-3 minutes on a 2-core CPU. Full: hours on a CPU with the tiny
          byte model, which is a plumbing check only (it cannot solve GSM); the
          config is meant for an imported checkpoint (see configs/bfcl_grpo.py).
Expected: smoke: finite losses and an eval report. With the tiny model, SFT on
          the expert (answer, or print(answer) then answer) teaches the format,
          not the arithmetic.
"""

from __future__ import annotations

import ml_collections

from configs import common
from configs import default


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  config = default.get_config()
  config.name = "gsm_tool"
  config.max_len = 1024
  config.model = common.model("tiny")
  # 'byte': the byte tokenizer with tool specials; 'hf': the tokenizer, stop ids
  # and chat template of the checkpoint at config.model.hf_path (host envs only),
  # e.g. --config.model.hf_path=DIR --config.tokenizer=hf --config.sft.steps=0.
  config.tokenizer = "byte"

  # Environment: environments/host/reasoning_gym_env.py.
  config.env = ml_collections.ConfigDict(
      dict(
          name="reasoning_gym",
          # Any reasoning-gym generator name.
          dataset="gsm_symbolic",
          # Generator config keyword arguments (e.g. dict(min_terms=2) for
          # basic_arithmetic).
          dataset_config=ml_collections.ConfigDict(),
          train_seed=0,
          eval_seed=1_000_003,
          # score_answer >= this counts as correct.
          correct_threshold=1.0,
          max_prompt_len=640,
          max_action_len=128,
          max_obs_len=64,
          # Assistant turns (tool calls + the answer).
          max_turns=4,
          # Sandbox limits per call.
          cpu_seconds=5,
          wall_seconds=10.0,
          memory_bytes=1 << 30,
          max_workers=4,
          expert_tool_prob=0.5,
      )
  )

  config.sft = common.optimizer(learning_rate=3e-3, warmup_steps=20)
  config.sft.steps = 200
  config.sft.batch_size = 16
  config.rl.learning_rate = 3e-4
  config.rl.steps = 100
  config.rl.batch_size = 32
  config.rl.group_size = 8
  config.rl.num_minibatches = 1
  config.rl.rewards = ml_collections.ConfigDict(dict(correct=1.0, format=0.1))
  config.eval = ml_collections.ConfigDict(
      dict(
          num_tasks=64,
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
    config.name = "gsm_tool_smoke"
    config.env.dataset = "basic_arithmetic"
    config.env.dataset_config = ml_collections.ConfigDict(
        dict(min_terms=2, max_terms=2, min_digits=1, max_digits=2)
    )
    config.model.update(
        dict(d_model=32, num_layers=1, num_heads=2, head_dim=16, ffn_dim=64)
    )
    config.max_len = 192
    config.env.max_prompt_len = 160
    config.env.max_action_len = 12
    config.env.max_obs_len = 8
    config.env.max_turns = 2
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
        f"configs/gsm_tool.py: unknown arg {arg!r}; known: 'smoke'"
    )
  return config
