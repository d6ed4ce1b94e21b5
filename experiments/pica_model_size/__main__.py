"""python -m experiments.pica_model_size [--seeds=0,1,2] [--smoke]"""

import os
import sys

from agentic_rl.models import transformer
from experiments import harness
from experiments.pica_model_size import config


def num_params(cfg, params):
  del cfg
  return {"params_M": transformer.count_params(params) / 1e6}


if __name__ == "__main__":
  harness.cli(
      sys.argv[1:], here=os.path.dirname(os.path.abspath(__file__)),
      title="Shaping gain (PBRS on hop progress) vs model size (PiCA)",
      arms_fn=config.arms,
      metrics=(("params_M", "params (M)"), ("accuracy", "accuracy"),
               ("pass@1", "pass@1"), ("early_accuracy", "RL acc. it. 0-20"),
               ("tool_calls", "calls/ep")),
      curve_keys=("rl/accuracy",),
      curve_means=(("early_accuracy", "rl/accuracy", 0, 20),),
      extra_eval=num_params,
  )
