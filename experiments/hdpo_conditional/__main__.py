"""python -m experiments.hdpo_conditional [--seeds=0,1,2] [--smoke]"""

from experiments import harness
from experiments import stats
from experiments.hdpo_conditional import config

# Declared before the run: HDPO's conditional efficiency should cut easy-item
# calls below the no-penalty arm. It can only act on groups that hold a correct
# episode without a call; with fewer than a quarter of the start policy's groups
# holding one, the setup gives the efficiency channel too little to act on.
SPEC = stats.ClaimSpec(
    primary_metric="tool_calls_easy",
    higher_is_better=False,
    room_metric="share of groups holding a correct zero-call episode",
    room_threshold=0.25,
    treatment="hdpo",
    control="correct",
    prediction="better",
    room_fn=harness.room_correct_zero_call_groups,
    claim="conditional efficiency (HDPO) cuts calls on easy items at equal "
    "accuracy; a small additive per-call cost does not, a large one "
    "under-calls on hard items",
    paper="HDPO",
    departures=(
        "tiny transformer from scratch",
        "synthetic arithmetic",
        "additive costs 0.02-1.2 per call; the value of a needed call is "
        "about 0.6 (easy) to 1 (hard) reward units",
    ),
    positive_control="cost_1.2 arm (above the value of a needed call): must "
    "under-call on hard items",
    positive_control_arm="cost_1.2",
)

if __name__ == "__main__":
  harness.claim_main(
      __file__,
      title="Conditional efficiency (HDPO) vs additive per-call penalty",
      arms_fn=config.arms,
      metrics=(
          ("accuracy", "accuracy"),
          ("accuracy_hard", "acc. hard"),
          ("accuracy_easy", "acc. easy"),
          ("tool_calls_easy", "calls/ep easy"),
          ("tool_calls_hard", "calls/ep hard"),
      ),
      curve_keys=("rl/accuracy", "rl/tool_calls"),
      spec=SPEC,
  )
