"""python -m experiments.portool_tree [--seeds=0,1,2] [--smoke]"""

from experiments import harness
from experiments import stats
from experiments.portool_tree import config

# Declared before the run: fork-relative tree advantages (alpha = 0.5) learn
# faster than trajectory-only GRPO, measured as mean training accuracy over RL
# iterations 0-19. With less than 0.3 of headroom at the start every arm hits
# the ceiling and speed cannot differ.
SPEC = stats.ClaimSpec(
    primary_metric="early_accuracy",
    higher_is_better=True,
    room_metric="headroom 1 - start sampled accuracy",
    room_threshold=0.3,
    treatment="tree_a0.5",
    control="grpo",
    prediction="better",
    metric_range=(0.0, 1.0),
    room_fn=harness.room_headroom,
    claim="tree rollouts with fork-relative advantages beat trajectory-only "
    "GRPO on accuracy and tool calls",
    paper="PORTool",
    departures=(
        "tiny transformer from scratch",
        "key-value chains d = 3-5",
        "fixed 2-2-2 forks at turns 0-2, not at every tool call",
        "learning speed (it. 0-19) as primary metric: final accuracy is "
        "at the ceiling",
    ),
    positive_control="",
)

if __name__ == "__main__":
  harness.claim_main(
      __file__,
      title="PORTool fork-relative tree advantages vs trajectory-only GRPO",
      arms_fn=config.arms,
      metrics=(
          ("accuracy", "accuracy"),
          ("pass@1", "pass@1"),
          ("tool_calls", "calls/ep"),
          ("early_accuracy", "RL acc. it. 0-19"),
      ),
      curve_keys=("rl/accuracy", "rl/tool_calls"),
      curve_means=(("early_accuracy", "rl/accuracy", 0, 20),),
      spec=SPEC,
  )
