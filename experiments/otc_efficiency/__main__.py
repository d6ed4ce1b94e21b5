"""python -m experiments.otc_efficiency [--seeds=0,1,2] [--smoke]"""

from experiments import harness
from experiments import stats
from experiments.otc_efficiency import config

# Declared before the run: the OTC reward cuts tool calls per episode below the
# correctness-only arm. OTC pays more for fewer calls only where a group holds a
# correct episode with fewer calls than the others; the room metric counts groups
# with a correct zero-call episode (the easy items' direct answers). Below a
# quarter of the start policy's groups the reward has little to act on.
SPEC = stats.ClaimSpec(
    primary_metric="tool_calls",
    higher_is_better=False,
    room_metric="share of groups holding a correct zero-call episode",
    room_threshold=0.25,
    treatment="otc",
    control="correct",
    prediction="better",
    room_fn=harness.room_correct_zero_call_groups,
    claim="the OTC tool-integrated reward cuts tool calls per episode at about "
    "equal accuracy",
    paper="OTC-PO, arXiv:2504.14870",
    departures=(
        "tiny transformer from scratch",
        "synthetic arithmetic",
        "over-calling start made by the SFT expert (calls on 50% of "
        "easy items)",
    ),
    positive_control="none run (a perfect direct answerer on easy items would be one)",
)

if __name__ == "__main__":
  harness.claim_main(
      __file__,
      title="OTC-PO tool-efficiency reward vs correctness-only GRPO",
      arms_fn=config.arms,
      metrics=(
          ("accuracy", "accuracy"),
          ("accuracy_hard", "acc. hard"),
          ("accuracy_easy", "acc. easy"),
          ("tool_calls", "calls/ep"),
          ("tool_calls_easy", "calls/ep easy"),
          ("tool_calls_hard", "calls/ep hard"),
          ("tool_productivity", "tool productivity"),
      ),
      curve_keys=("rl/accuracy", "rl/tool_calls"),
      spec=SPEC,
  )
