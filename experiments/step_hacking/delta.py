"""python -m experiments.step_hacking.delta [--seeds=...] [--smoke]

Second declared claim of this folder, on the same workdirs (shared SFT start
and success_only arm under runs/step_hacking): Delta credit (the per-turn
difference of step scores, the last call keeping c p_k) is as good as
success-only, i.e. it removes the sum-form hack. Writes results_delta.*.
"""

from experiments import harness
from experiments import stats
from experiments.step_hacking import __main__ as step_main
from experiments.step_hacking import config

# Declared before the run: held-out greedy accuracy of delta within +-0.05 of
# success-only (paired by seed); same room check as the sum-form claim.
SPEC = stats.ClaimSpec(
    primary_metric="accuracy",
    higher_is_better=True,
    room_metric="start greedy accuracy (training tasks)",
    room_threshold=0.3,
    equivalence_margin=0.05,
    treatment="delta",
    control="success_only",
    prediction="equivalent",
    room_fn=harness.room_start_greedy_accuracy,
    claim="Delta credit on the step reward removes the hack: accuracy as "
    "success-only",
    paper="Clipping/Delta arXiv:2410.15115",
    departures=step_main.SPEC.departures
    + (
        "the delta arm keeps the last call's step reward (the last call "
        "keeps c p_k); the paper's Delta drops the last step (r_1 - r_T); "
        "the dropped form is the post-hoc delta_drop arm, not this claim",
    ),
    metric_range=(0.0, 1.0),
    positive_control="sum arm (results.md: the same step reward without a "
    "bound collapses)",
)


def arms(smoke: bool):
  suffix = ",smoke" if smoke else ""
  return {a: config.get_config(a + suffix) for a in ("success_only", "delta")}


if __name__ == "__main__":
  harness.claim_main(
      __file__,
      title="Delta-form step reward vs success-only (key-value chains)",
      arms_fn=arms,
      metrics=step_main.METRICS,
      curve_keys=step_main.CURVES,
      extra_eval=step_main.hacking_metrics,
      spec=SPEC,
      stem="results_delta",
  )
