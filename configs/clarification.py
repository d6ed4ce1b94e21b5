"""GRPO on clarification: ask the simulated user for a withheld argument.

Environment: environments/clarification.py (`Compute 483*b.`: the policy asks
`<call>?b</call>`, the user replies `<obs>b=27</obs>`, then it calls the
calculator and answers). The SFT expert under-calls (guesses without asking) and
over-asks.

Launch:   python main.py --config=configs/clarification.py --workdir=runs/clarification
          python main.py --config=configs/clarification.py:smoke --workdir=/tmp/cl_smoke
Runtime:  a few minutes on a 2-core CPU (smoke: about a minute).
Expected: not measured yet.
"""

from __future__ import annotations

import ml_collections

from configs import default


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  config = default.get_config(arg)
  config.name = "clarification" if arg is None else f"clarification_{arg}"
  config.env = ml_collections.ConfigDict(
      dict(
          name="clarification",
          # Probability that a task is hard (needs the calculator).
          hard_fraction=0.5,
          # Probability that one operand is withheld.
          missing_prob=0.5,
          # Turns: ask, calc, answer, one spare.
          max_turns=4,
          # Expert imperfections (per episode).
          expert_undercall_prob=0.3,
          expert_overcall_prob=0.2,
          expert_wrong_arg_prob=0.0,
      )
  )
  # Prompt 18 + ask 4 + reply <= 12 + call 9 + result <= 12 + answer <= 10.
  config.max_len = 80
  return config
