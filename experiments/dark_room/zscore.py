"""python -m experiments.dark_room.zscore [--seeds=...] [--smoke]

The folder's second declared claim, on the same workdirs (runs/dark_room):
the collapse comes from the standard-deviation scaling of the group advantage.
With the same next-observation-prediction bonus, z-scored advantages
(pred_zscore) end with lower held-out greedy accuracy than mean-only ones
(pred_meanonly), paired by seed. Writes results_zscore.*.

Declared 2026-12-06, after the seeds 0-7 run of 2026-12-02 had shown it
(pred_zscore 0.000 on every seed, pred_meanonly 0.258-0.969): a confirmatory
test, decided on fresh seeds 8-15, whatever it shows.
"""

from experiments import harness
from experiments import stats
from experiments.dark_room import __main__ as dark_main
from experiments.dark_room import config

SPEC = stats.ClaimSpec(
    primary_metric="accuracy",
    higher_is_better=True,
    room_metric=dark_main.SPEC.room_metric,
    room_threshold=dark_main.SPEC.room_threshold,
    treatment="pred_zscore",
    control="pred_meanonly",
    prediction="worse",
    metric_range=(0.0, 1.0),
    room_fn=harness.room_all_fail_groups,
    claim="the dark-room collapse needs the std scaling: with the same "
    "prediction bonus, z-scored GRPO ends with lower held-out success than "
    "mean-only GRPO",
    paper=dark_main.SPEC.paper,
    departures=tuple(
        d for d in dark_main.SPEC.departures if d != dark_main.REPLICATION
    )
    + (
        "declared after the seeds 0-7 run had shown the difference; decided "
        "on fresh seeds 8-15 (a confirmatory test)",
    ),
    positive_control="",
)


def arms(smoke: bool):
  suffix = ",smoke" if smoke else ""
  return {
      a: config.get_config(a + suffix) for a in ("pred_zscore", "pred_meanonly")
  }


if __name__ == "__main__":
  harness.claim_main(
      __file__,
      title="Dark room: z-scored vs mean-only GRPO with the same prediction "
      "bonus (kv chains d = 5-6)",
      arms_fn=arms,
      metrics=(
          ("accuracy", "accuracy"),
          ("pass@1", "pass@1"),
          ("horizon_greedy", "horizon share"),
          ("horizon_sampled", "horizon share (T=1)"),
      ),
      curve_keys=("rl/accuracy", "rl/horizon_rate"),
      extra_eval=dark_main.dark_room_eval,
      spec=SPEC,
      stem="results_zscore",
  )
