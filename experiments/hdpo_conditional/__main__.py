"""python -m experiments.hdpo_conditional [--seeds=0,1,2] [--smoke]"""

from experiments import harness
from experiments import stats
from experiments.hdpo_conditional import config

# Declared before the run: HDPO's conditional efficiency should cut easy-item
# calls below the no-penalty arm. The claim is about calls the policy does not
# need: only where the start answers easy items right without the tool is a call
# unnecessary. The room metric is the accuracy of the start's sampled direct
# (zero-call) answers on easy items; the threshold 0.9 asks that they be about
# as accurate as tool answers, the claim's "at equal accuracy". Until the
# second setup change of 2026-12-02 the room metric was the share of groups
# holding a correct zero-call episode (threshold 0.25); the README says why it
# was replaced.
#
# Compound form (declared 2026-12-04; re-decided from the recorded
# 8-seed run, nothing re-run), one part per clause of the claim:
#   1. easy-item calls hdpo - correct lower (the primary part);
#   2. accuracy hdpo - correct equivalent within 0.05 absolute ("at equal
#      accuracy": a twentieth of the accuracy scale, from the wording, not
#      the data; the recorded difference, -0.064, had been published in the
#      README before the margin was declared, and the margin was not moved);
#   3. easy-item calls cost_0.02 - correct equivalent within 0.1 calls per
#      episode ("a small additive per-call cost does not" cut them: less than
#      a tenth of the one call per easy episode of the over-calling start);
#   4. hard-item calls cost_1.2 - correct lower ("a large one under-calls on
#      hard items"), also the positive-control check.
# The recorded run trained correct, hdpo and cost_1.2 only: part 3 needs the
# cost_0.02 arm of the next decision run (the runner keeps every part's arm).
# Room measured on 8x the groups (v4, declared 2026-12-06 before any run of
# it): the recorded run's room check failed on one seed only, seed 5 at 0.750,
# where the start called the tool on nearly every easy item, so its direct
# accuracy rested on the few zero-call easy episodes among 64 groups x 8.
# 512 groups (4096 episodes) measure the same quantity with ~8x the direct
# episodes; threshold, parts and arms unchanged. If a seed still falls below
# 0.9 the claim stays untestable at this setup.
SPEC = stats.ClaimSpec(
    primary_metric="tool_calls_easy",
    higher_is_better=False,
    room_metric="accuracy of the start's direct (zero-call) answers on easy "
    "items (512 sampled groups)",
    room_threshold=0.9,
    treatment="hdpo",
    control="correct",
    prediction="better",
    room_fn=harness.room_direct_easy_accuracy_8x,
    claim="conditional efficiency (HDPO) cuts calls on easy items at equal "
    "accuracy; a small additive per-call cost does not, a large one "
    "under-calls on hard items",
    paper="HDPO",
    departures=(
        "tiny transformer from scratch",
        "synthetic arithmetic",
        "easy items use operands 0..4, not 0..9, so that a 0.9M-param "
        "model can answer them without the tool",
        "additive costs 0.02-1.2 per call; the value of a needed call on a "
        "hard item is about 1 reward unit",
    ),
    positive_control="cost_1.2 arm (above the value of a needed call): must "
    "under-call on hard items",
    positive_control_arm="cost_1.2",
    parts=(
        stats.Part(
            "tool_calls_easy",
            "better",
            higher_is_better=False,
            metric_range=(0.0, None),
        ),
        stats.Part(
            "accuracy", "equivalent", margin=0.05, metric_range=(0.0, 1.0)
        ),
        stats.Part(
            "tool_calls_easy",
            "equivalent",
            higher_is_better=False,
            margin=0.1,
            treatment="cost_0.02",
            metric_range=(0.0, None),
        ),
        stats.Part(
            "tool_calls_hard",
            "lower",
            treatment="cost_1.2",
            metric_range=(0.0, None),
        ),
    ),
    positive_control_check=stats.Part(
        "tool_calls_hard",
        "lower",
        treatment="cost_1.2",
        control="correct",
        metric_range=(0.0, None),
    ),
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
