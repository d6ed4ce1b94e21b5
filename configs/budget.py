"""GRPO under a tool-call budget (key-value chains with "Budget: 2 calls.").

Environment: environments/budget.py wrapping environments/kv_chain.py; a call past
the budget ends the episode unanswered. With d up to 3 hops and a budget of 2,
3-hop tasks cannot be solved within the budget: the policy should stop calling
and answer after two calls (and be wrong) rather than be cut.

Launch:   python main.py --config=configs/budget.py --workdir=runs/budget
          python main.py --config=configs/budget.py:smoke --workdir=/tmp/budget_smoke
Runtime:  a few minutes on a 2-core CPU (smoke: about a minute).
Expected: not measured yet.
"""

from __future__ import annotations

import ml_collections

from configs import default


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  config = default.get_config(arg)
  config.name = "budget" if arg is None else f"budget_{arg}"
  config.env = ml_collections.ConfigDict(
      dict(
          name="budget",
          # Base environment (environments.REGISTRY) and its fields.
          base="kv_chain",
          base_kwargs=dict(
              min_hops=1,
              max_hops=3,
              max_turns=5,
              expert_undercall_prob=0.2,
              expert_overcall_prob=0.1,
          ),
          # Tool calls allowed; one more ends the episode.
          budget=2,
      )
  )
  config.max_len = 80
  return config
