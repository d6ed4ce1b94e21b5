"""Dual-path groups on the calculator task (AKBE arXiv:2605.26952 / EAPO style).

Environment: environments/arithmetic.py, as in configs/default.py (easy items can
be answered without the tool, hard ones need it). Each GRPO group of 8 holds 6
episodes sampled normally and 2 sampled with the `<call>` token masked
(`rl.dual_path_tool_free`), so tool necessity is measured per task as
acc(with tools) - acc(without) (logged as rl/dual_path_*, and against the
environment's `tool_necessary` label), and the `dual_path_efficiency` reward
charges calls in proportion to how often the task is solved without tools
(agentic_rl/rewards/components.py). The claim to check (AKBE / EAPO, docs/papers.md: "tool-free
rollouts in the group: calls fall only on items that don't need tools"): tool
calls on easy items fall below the default run's (which calls the tool on every
item), while hard-item accuracy holds.

Launch:   python main.py --config=configs/dual_path.py --workdir=runs/dual_path
          python main.py --config=configs/dual_path.py:smoke --workdir=/tmp/dp_smoke
Runtime:  about the default experiment's (3-5 minutes on an idle 2-core CPU);
          not measured yet.
Expected: not measured yet (see the claim above).
"""

from __future__ import annotations

import ml_collections

from configs import default


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  config = default.get_config(arg)
  config.name = "dual_path" if arg is None else f"dual_path_{arg}"
  # Tool-free episodes per group (the last ones of each group of group_size).
  config.rl.dual_path_tool_free = config.rl.group_size // 4
  # Correctness, format, and the dual-path efficiency term (call cost weighted
  # by the tool-free accuracy, minimal-call bonus weighted by tool necessity).
  config.rl.rewards = ml_collections.ConfigDict(
      dict(correct=1.0, format=0.1, dual_path_efficiency=1.0)
  )
  config.rl.reward_params = ml_collections.ConfigDict(
      dict(dual_path_efficiency=dict(c=0.2, b=0.5))
  )
  return config
