"""GRPO teaches a tiny transformer to use a calculator tool (the main experiment).

Task: `Compute 483*27.`; the policy either answers directly (`<answer>..</answer>`)
or calls the `calc` tool (`<call>483*27</call>`), reads `<obs>13041</obs>` and then
answers. Easy items (single-digit operands) can be answered without the tool; hard
items (3-digit x 2-digit products) need it. The SFT warm start imitates an expert
that is deliberately imperfect on half of the episodes (answers hard items without
the tool, calls the tool on easy ones), so the SFT policy often skips the tool on
hard items; GRPO with a correctness reward then teaches it to call the tool there.

Launch:   python main.py                       (workdir defaults to runs/default)
          python main.py --config=configs/default.py:smoke --workdir=/tmp/smoke
Runtime:  about 6-8 minutes on a 2-core CPU (smoke: under a minute).
Expected: held-out accuracy after RL at least 15 points above the SFT checkpoint,
          driven by hard items; tool calls per hard episode rise towards 1
          (see README.md for measured numbers over 3 seeds).
"""

from __future__ import annotations

import ml_collections

from configs import common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  config = common.base()
  config.name = "default"

  # Environment: environments/arithmetic.py.
  config.env = ml_collections.ConfigDict(dict(
      name="arithmetic",
      # Fraction of tasks that are hard (need the tool).
      hard_fraction=0.5,
      # Fraction of demonstrations that deliberately misuse the tool (answer a hard
      # item without it, or call it on an easy one). Above 0.5, the SFT policy's
      # most likely first move on a hard item is to answer without the tool.
      expert_imperfect_prob=0.65,
      # Assistant turns per episode (call, answer, one spare).
      max_turns=3,
  ))

  # SFT warm start on expert demonstrations (loss on POLICY tokens only).
  config.sft = common.optimizer(learning_rate=3e-3, warmup_steps=20)
  config.sft.steps = 300
  config.sft.batch_size = 64

  # GRPO (Shao et al., arXiv:2402.03300).
  config.rl = common.optimizer(learning_rate=5e-4, warmup_steps=5)
  config.rl.steps = 60
  # Episodes per iteration; batch_size / group_size tasks.
  config.rl.batch_size = 64
  # Completions per task: G in GRPO.
  config.rl.group_size = 8
  config.rl.num_minibatches = 2
  config.rl.ppo_epochs = 1
  config.rl.temperature = 1.0
  # Clipped surrogate (arXiv:1707.06347); clip_high > clip_low is DAPO clip-higher.
  config.rl.clip_low = 0.2
  config.rl.clip_high = 0.2
  # k3 KL penalty to the frozen SFT reference, in the loss.
  config.rl.kl_coef = 0.01
  # Divide group-centred rewards by the group std (False: Dr.GRPO mean-only).
  config.rl.scale_by_std = True
  config.rl.adv_eps = 1e-6
  # Reward components (agentic_rl/rewards.py) and their weights.
  config.rl.rewards = ml_collections.ConfigDict(dict(correct=1.0, format=0.1))

  # Held-out evaluation on a fixed task set (greedy) plus pass@k from samples.
  config.eval = ml_collections.ConfigDict(dict(
      num_tasks=256, seed=12345, num_samples=8, temperature=1.0,
      pass_k=(1, 2, 4, 8),
  ))

  if arg == "smoke":
    config.name = "default_smoke"
    config.sft.steps = 20
    config.sft.batch_size = 16
    config.rl.steps = 4
    config.rl.batch_size = 16
    config.rl.group_size = 4
    config.eval.num_tasks = 16
    config.eval.num_samples = 2
    config.eval.pass_k = (1, 2)
    config.checkpoint.every_steps = 5
    config.log_every_steps = 2
  elif arg is not None:
    raise ValueError(f"configs/default.py: unknown arg {arg!r}; known: 'smoke'")
  return config
