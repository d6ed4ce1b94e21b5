"""GRPO on typed function calling with several valid call paths.

Environment: environments/schema_calls.py (tools add/sum/mul/sub with typed
schemas in the prompt; queries are expression trees of depth 1..3, sometimes with
two independent sub-expressions; sometimes `sum` is forbidden). Reward: correctness
plus the TIER-style trajectory-invariant call score (agentic_rl/call_rewards.py),
which gives every valid call path full credit.

Launch:   python main.py --config=configs/schema_calls.py --workdir=runs/schema_calls
          python main.py --config=configs/schema_calls.py:smoke --workdir=/tmp/sc_smoke
Runtime:  longer than the default (prompts of ~100 tokens); smoke about 2 minutes.
Expected: not measured yet (the smoke setting is too short to learn).
"""

from __future__ import annotations

import ml_collections

from configs import default


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  config = default.get_config(arg)
  config.name = "schema_calls" if arg is None else f"schema_calls_{arg}"
  config.env = ml_collections.ConfigDict(
      dict(
          name="schema_calls",
          # Tools offered: the first num_tools of add, sum, mul, sub, max, min.
          num_tools=4,
          # Operation nodes per query.
          min_depth=1,
          max_depth=3,
          # Probability of two independent sub-expressions (depth >= 3).
          branch_prob=0.5,
          # Probability that the prompt forbids `sum`.
          forbid_prob=0.25,
          max_turns=5,
          # Expert imperfections for the SFT warm start.
          expert_undercall_prob=0.2,
          expert_overcall_prob=0.1,
          expert_wrong_arg_prob=0.1,
          expert_wrong_name_prob=0.1,
      )
  )
  # Prompt <= 104, three calls of <= 28 with observations of <= 12, an answer.
  config.max_len = 224
  # Correctness plus TIER-style format/schema/execution credit.
  config.rl.rewards = ml_collections.ConfigDict(dict(correct=1.0, tier=0.1))
  return config
