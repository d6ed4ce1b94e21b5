"""python -m experiments.hdpo_conditional [--seeds=0,1,2] [--smoke]"""

import os
import sys

from experiments import harness
from experiments.hdpo_conditional import config

if __name__ == "__main__":
  harness.cli(
      sys.argv[1:], here=os.path.dirname(os.path.abspath(__file__)),
      title="Conditional efficiency (HDPO) vs additive per-call penalty",
      arms_fn=config.arms,
      metrics=(("accuracy", "accuracy"), ("accuracy_hard", "acc. hard"),
               ("accuracy_easy", "acc. easy"), ("tool_calls_easy", "calls/ep easy"),
               ("tool_calls_hard", "calls/ep hard")),
      curve_keys=("rl/accuracy", "rl/tool_calls"),
  )
