"""python -m experiments.trace_credit.faithful [--seeds=...] [--smoke]

Second declared claim of this folder, on the same workdirs (shared SFT start
and outcome arm under runs/trace_credit): TRACE's turn rewards in the paper's
own form, V(s_T) kept in every return (`rl.pbrs_cutoff='never'`, arm
`trace_faithful`), learn faster than outcome-only RL. The first claim of the
folder ran the policy-invariant form (Phi = 0 at every ending). Writes
results_faithful.*.
"""

import dataclasses

from experiments import harness
from experiments.trace_credit import __main__ as trace_main
from experiments.trace_credit import config

# Declared before the run: the same primary metric, prediction and room check
# as the first claim (mean training accuracy over RL iterations 0-19, trace
# predicted higher; headroom >= 0.3), on the faithful arm.
SPEC = dataclasses.replace(
    trace_main.SPEC,
    treatment="trace_faithful",
    claim="TRACE's turn rewards with V(s_T) kept (the paper's form) learn "
    "faster than outcome-only RL",
    departures=(
        "tiny transformer from scratch",
        "key-value chains d = 4-6",
        "coefficient 0.2",
        "an episode cut off at the turn budget keeps V(s_T) too (no ending is "
        "terminal); for an answered episode s_T is the state before its "
        "answer turn",
    ),
    positive_control="progress arm (oracle hop-progress potential), shared "
    "with the first claim's workdirs (resumed, or trained when absent, in the "
    "same decision run)",
    positive_control_arm="progress",
)


def arms(smoke: bool):
  suffix = ",smoke" if smoke else ""
  # progress: the positive control (trace_main.SPEC.positive_control_check),
  # the same workdir as the first claim's progress arm.
  return {
      a: config.get_config(a + suffix)
      for a in ("outcome", "trace_faithful", "progress")
  }


if __name__ == "__main__":
  harness.claim_main(
      __file__,
      title="TRACE turn rewards with V(s_T) kept vs outcome-only (deep "
      "key-value chains)",
      arms_fn=arms,
      metrics=trace_main.METRICS,
      curve_keys=("rl/accuracy", "rl/tool_calls"),
      curve_means=(("early_accuracy", "rl/accuracy", 0, 20),),
      extra_eval=trace_main.call_rewards,
      spec=SPEC,
      stem="results_faithful",
  )
