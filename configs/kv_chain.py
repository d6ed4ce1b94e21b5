"""GRPO on key-value chains: follow a hidden map with a `get(key)` tool.

Environment: environments/kv_chain.py. Prompt `From q hop 3.`; the policy calls
`<call>q</call>`, reads `<obs>w</obs>`, calls `<call>w</call>`, ... and answers the
key reached after d hops (d in 1..3). The SFT expert under-calls (answers too
early) with probability 0.3 per turn with hops left, and makes redundant and
off-path calls, so the SFT policy often stops early; GRPO with a correctness
reward should teach it to finish the chain.

Launch:   python main.py --config=configs/kv_chain.py --workdir=runs/kv_chain
          python main.py --config=configs/kv_chain.py:smoke --workdir=/tmp/kv_smoke
Runtime:  54 minutes measured on a 2-core CPU shared with several other jobs
          (load ~13); expect far less on an idle machine (smoke: a few minutes).
Expected: held-out accuracy after RL above the SFT checkpoint, mostly on d >= 2
          ('hard'). Measured (seed 0): greedy accuracy 0.848 -> 1.000, hard
          0.775 -> 1.000, pass@1 0.239 -> 0.963 (environments/README.md).
"""

from __future__ import annotations

import ml_collections

from configs import default


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  config = default.get_config(arg)
  config.name = "kv_chain" if arg is None else f"kv_chain_{arg}"
  config.env = ml_collections.ConfigDict(
      dict(
          name="kv_chain",
          # Hops d per task, uniform in [min_hops, max_hops] (at most 6).
          min_hops=1,
          max_hops=3,
          # Map keys off the path (each points at a random key of the map).
          num_distractors=4,
          # Assistant turns: d calls + answer + one spare.
          max_turns=5,
          # Expert imperfections for the SFT warm start, per turn.
          expert_undercall_prob=0.3,
          expert_overcall_prob=0.1,
          expert_wrong_arg_prob=0.1,
      )
  )
  # Prompt 16 + 5 turns of <= 3 tokens + 4 observations of <= 7.
  config.max_len = 64
  return config
