"""python -m experiments.otc_efficiency [--seeds=0,1,2] [--smoke]"""

from experiments import harness
from experiments import stats
from experiments.otc_efficiency import config

# Declared before the run: the OTC reward cuts tool calls per episode below the
# correctness-only arm. The claim is about calls the policy does not need: only
# where the start answers easy items right without the tool is a call
# unnecessary. The room metric is the accuracy of the start's sampled direct
# (zero-call) answers on easy items; the threshold 0.9 asks that they be about
# as accurate as tool answers (0.95-1.00), the claim's "about equal accuracy".
# Until the second setup change of 2026-12-02 the room metric was the share of
# groups holding a correct zero-call episode (threshold 0.25); the README says
# why it was replaced.
#
# Compound form (declared 2026-12-04; re-decided from the recorded
# 8-seed run, nothing re-run): the claim says "at about equal accuracy", so
# accuracy otc - correct is a second part, equivalent within a margin of 0.05
# absolute accuracy. The margin comes from the claim's wording ("about
# equal": a twentieth of the accuracy scale), not from the data; the recorded
# accuracy difference had been published in the README (-0.053) before the
# margin was declared, and the margin was not moved after seeing it.
# Room measured on 8x the groups (v4, declared 2026-12-06 before any run of
# it): the recorded run's room check failed on one seed only, seed 5 at 0.750,
# where the start called the tool on nearly every easy item, so its direct
# accuracy rested on the few zero-call easy episodes among 64 groups x 8.
# 512 groups (4096 episodes) measure the same quantity with ~8x the direct
# episodes; threshold, parts and arms unchanged. If a seed still falls below
# 0.9 the claim stays untestable at this setup.
SPEC = stats.ClaimSpec(
    primary_metric="tool_calls",
    higher_is_better=False,
    room_metric="accuracy of the start's direct (zero-call) answers on easy "
    "items (512 sampled groups)",
    room_threshold=0.9,
    treatment="otc",
    control="correct",
    prediction="better",
    room_fn=harness.room_direct_easy_accuracy_8x,
    claim="the OTC tool-integrated reward cuts tool calls per episode at about "
    "equal accuracy",
    paper="OTC-PO, arXiv:2504.14870",
    departures=(
        "tiny transformer from scratch",
        "synthetic arithmetic",
        "over-calling start made by the SFT expert (calls on 50% of "
        "easy items)",
        "easy items use operands 0..4, not 0..9, so that a 0.9M-param "
        "model can answer them without the tool",
    ),
    positive_control="none run (a perfect direct answerer on easy items would be one)",
    parts=(
        stats.Part(
            "tool_calls",
            "better",
            higher_is_better=False,
            metric_range=(0.0, None),
        ),
        stats.Part(
            "accuracy", "equivalent", margin=0.05, metric_range=(0.0, 1.0)
        ),
    ),
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
