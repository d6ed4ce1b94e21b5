"""python -m experiments.smollm2_calc [--seeds=0,...,9] [--smoke]

The pretrained decision run: does GRPO raise SmolLM2-135M-Instruct's held-out
greedy accuracy on the calculator task above its own SFT start? Seeds run one
after the other (`seeds_per_call=1`: one seed's SFT start, room check, GRPO
run and evaluations are on disk before the next begins), so an interrupted run
resumes from the seeds already recorded. Workdirs: runs/smollm2_calc/.
"""

from experiments import harness
from experiments import stats
from experiments.smollm2_calc import config

# Declared before the run (2026-12-05), as calculator_grpo's claim on the
# tiny model: GRPO with a correctness reward raises held-out greedy accuracy
# over its own SFT start (paired by seed). Room, per seed: the start's greedy
# accuracy on 128 training tasks is at most 0.8 (headroom >= 0.2): a start at
# the ceiling cannot show a gain (a 4-step SFT start called the tool on every
# item and scored 0.99 greedy, 2026-12-05 timing run).
#
# Version 2 (declared 2026-12-05, before its run): the SFT expert under-calls
# only (configs/smollm2_calc.py). Version 1's run (symmetric expert) stopped
# at seed 1, whose start called the tool on every item (headroom 0.000):
# untestable at that setup; results.json's ledger keeps it.
#
# Version 3 (declared 2026-12-05, before its run): the expert under-calls on
# 90% of hard items, not 65%. Version 2's run stopped at seed 1, whose start
# called the tool on 83% of hard items (greedy 0.915, headroom 0.117 < 0.2):
# untestable at that setup (ledger). Spec, room rule and threshold unchanged;
# the setup change shows as a new version through the arms' config hashes.
SPEC = stats.ClaimSpec(
    primary_metric="accuracy",
    higher_is_better=True,
    room_metric="1 - start greedy accuracy (128 training tasks)",
    room_threshold=0.2,
    treatment="GRPO",
    control="SFT (start)",
    prediction="better",
    metric_range=(0.0, 1.0),
    room_fn=harness.room_greedy_headroom,
    claim="GRPO with a correctness reward raises a pretrained model's "
    "(SmolLM2-135M-Instruct, LoRA) held-out greedy accuracy above its SFT "
    "start on a calculator task",
    paper="GRPO, arXiv:2402.03300",
    departures=(
        "SmolLM2-135M-Instruct with LoRA rank 8, not a full fine-tune",
        "synthetic arithmetic with a calculator tool, 2 assistant turns",
        "SFT on an imperfect scripted expert (answers 90% of hard items "
        "without the tool, never calls on easy items)",
        "sampler log-probs as behaviour log-probs (one optimizer step per "
        "iteration)",
    ),
    positive_control="none needed: the claim is a gain over the start",
)

if __name__ == "__main__":
  harness.claim_main(
      __file__,
      title="GRPO teaches SmolLM2-135M-Instruct (LoRA) to use a calculator",
      arms_fn=config.arms,
      default_seeds="0,1,2,3,4,5,6,7,8,9",
      metrics=(
          ("accuracy", "greedy acc"),
          ("accuracy_hard", "greedy acc (hard)"),
          ("accuracy_easy", "greedy acc (easy)"),
          ("pass@1", "pass@1 (T=1)"),
          ("pass@2", "pass@2 (T=1)"),
          ("tool_calls_hard", "tool calls/ep (hard)"),
          ("tool_calls_easy", "tool calls/ep (easy)"),
          ("format_error_rate", "format errors"),
          ("kl_last5", "KL (last 5 steps)"),
      ),
      curve_keys=("rl/accuracy", "rl/tool_calls", "rl/kl"),
      # Mean KL to the reference over the last 5 RL steps (numpy slice -5:).
      curve_means=(("kl_last5", "rl/kl", -5, None),),
      spec=SPEC,
      seeds_per_call=1,
  )
