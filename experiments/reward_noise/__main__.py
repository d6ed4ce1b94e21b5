"""python -m experiments.reward_noise [--seeds=0,1,2] [--smoke]"""

import os
import sys

from experiments import harness
from experiments.reward_noise import config

if __name__ == "__main__":
  harness.cli(
      sys.argv[1:], here=os.path.dirname(os.path.abspath(__file__)),
      title="Reward noise (flips) and reward dithering",
      arms_fn=config.arms,
      metrics=(("accuracy", "accuracy"), ("accuracy_hard", "acc. hard"),
               ("pass@1", "pass@1"), ("early_acc", "train acc. it. 1-15")),
      curve_keys=("rl/accuracy", "rl/zero_variance_groups"),
      curve_means=(("early_acc", "rl/accuracy", 0, 15),),
  )
