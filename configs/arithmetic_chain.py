"""GRPO on arithmetic chains that need k calculator calls, with a noisy tool.

Environment: environments/arithmetic.py with num_ops=3: `Compute ((483*27)+15)-8.`
needs three calls, each evaluating one binary operation on the previous result;
the tool returns a wrong result with probability tool_noise_prob.

Launch:   python main.py --config=configs/arithmetic_chain.py --workdir=runs/arith_chain
          python main.py --config=configs/arithmetic_chain.py:smoke --workdir=/tmp/ac_smoke
Runtime:  a few minutes on a 2-core CPU (smoke: about a minute).
Expected: not measured yet.
"""

from __future__ import annotations

import ml_collections

from configs import default


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  config = default.get_config(arg)
  config.name = "arithmetic_chain" if arg is None else f"arithmetic_chain_{arg}"
  config.env = ml_collections.ConfigDict(
      dict(
          name="arithmetic",
          hard_fraction=0.5,
          expert_imperfect_prob=0.65,
          # Operations per task (k calls on hard items); max_turns >= num_ops + 1.
          num_ops=3,
          max_turns=5,
          # Prompt: BOS "Compute " "((" 3+1+2 ")" 1+2 ")" 1+2 ".\n".
          max_prompt_len=32,
          # Probability that a call returns a wrong result.
          tool_noise_prob=0.05,
          # Probability that an expert call has an off-by-one operand.
          expert_wrong_arg_prob=0.05,
      )
  )
  # Prompt <= 32 + three calls of <= 15 with results of <= 12 + an answer.
  config.max_len = 112
  return config
