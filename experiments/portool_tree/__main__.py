"""python -m experiments.portool_tree [--seeds=0,1,2] [--smoke]"""

import os
import sys

from experiments import harness
from experiments.portool_tree import config

if __name__ == "__main__":
  harness.cli(
      sys.argv[1:], here=os.path.dirname(os.path.abspath(__file__)),
      title="PORTool fork-relative tree advantages vs trajectory-only GRPO",
      arms_fn=config.arms,
      metrics=(("accuracy", "accuracy"), ("pass@1", "pass@1"), ("tool_calls", "calls/ep")),
      curve_keys=("rl/accuracy", "rl/tool_calls"),
  )
