"""The bounded step-reward claims of this folder, one per bound.

The folder's first claim (`__main__.py`) decides only that the sum-form step
reward is hacked. Each bound the papers propose is its own declared claim,
run and decided on its own (`python -m experiments.step_hacking.<module>`):

  module       arm         bound                                   results stem
  clip         clip        Clipping, eta = 1 (arXiv:2410.15115)    results_clip
  min_form     min         PURE min-form credit (arXiv:2504.15275) results_min
  delta_paper  delta_drop  Delta, last step dropped (the paper's)  results_delta_paper
  delta        delta       Delta, last call keeps c p_k (ours)     results_delta
  gated        gated       G-RA: step rewards only when the        results_gated
                           outcome reward >= 1

Every claim predicts the bounded arm's held-out greedy accuracy within +-0.05
of success-only (paired by seed), and carries the same positive-control check:
in the same decision run the unbounded sum arm must end with lower accuracy
than success-only (the collapse the bound is to prevent must happen in this
setup). Without it none of these claims can be 'contradicted'. Only accuracy
is decided: whether the bounded arm also keeps the repeat rate down is
reported (`repeat_rate`), not a part.

REPLICATION: the claims' first decision runs (seeds 0-7, 2026-12-06) were
read before these texts were final; the decision of each row is the run on
the fresh seeds 8-15, declared here before any run on them, whatever it shows
(the seeds 0-7 runs stay in each ledger).
"""

from __future__ import annotations

from experiments import harness
from experiments import stats
from experiments.step_hacking import __main__ as step_main
from experiments.step_hacking import config

MARGIN = 0.05
REPLICATION = (
    "decided on seeds 8-15, a replication declared after the seeds 0-7 "
    "decision runs of every bound claim had been read (all kept in the "
    "ledger)"
)
POSITIVE_CONTROL = (
    "sum arm (the same step reward without a bound) ends with lower held-out "
    "greedy accuracy than success-only in the same decision run"
)


def bound_spec(
    arm: str, claim: str, paper: str, departures: tuple = ()
) -> stats.ClaimSpec:
  """The declared spec of one bound's claim.

  Args:
    arm: the bounded arm of config.py ('clip', 'min', 'delta', 'delta_drop',
      'gated').
    claim: the claim in one sentence (summary table).
    paper: the source paper with its arXiv id.
    departures: this bound's departures beyond the folder's shared ones.

  Returns:
    A ClaimSpec: `accuracy` of `arm` - success_only predicted equivalent
    (margin MARGIN); room = the start's greedy accuracy on training tasks
    >= 0.3 at every seed (as the sum-form claim); positive-control check:
    `accuracy` of sum - success_only predicted worse.

  Raises:
    ValueError: `arm` is not a bounded arm of config.py.
  """
  if arm not in ("clip", "min", "delta", "delta_drop", "gated"):
    raise ValueError(f"bound_spec(arm={arm!r}): not a bounded arm")
  shared = tuple(
      d
      for d in step_main.SPEC.departures
      if d != step_main.REPLICATION
      and (arm == "clip" or not d.startswith("Clip threshold"))
  )
  return stats.ClaimSpec(
      primary_metric="accuracy",
      higher_is_better=True,
      room_metric=step_main.SPEC.room_metric,
      room_threshold=step_main.SPEC.room_threshold,
      equivalence_margin=MARGIN,
      treatment=arm,
      control="success_only",
      prediction="equivalent",
      room_fn=harness.room_start_greedy_accuracy,
      claim=claim,
      paper=paper,
      departures=shared + tuple(departures) + (REPLICATION,),
      positive_control=POSITIVE_CONTROL,
      positive_control_arm="sum",
      metric_range=(0.0, 1.0),
      positive_control_check=stats.Part(
          "accuracy",
          "worse",
          treatment="sum",
          control="success_only",
          metric_range=(0.0, 1.0),
      ),
  )


def arms_fn(arm: str):
  """fn(smoke) -> {label: config} of success_only, `arm` and sum."""

  def arms(smoke: bool):
    suffix = ",smoke" if smoke else ""
    return {
        a: config.get_config(a + suffix) for a in ("success_only", arm, "sum")
    }

  return arms


def main(main_file: str, spec: stats.ClaimSpec, title: str, stem: str):
  """The runner of one bound's claim (its module's `__main__` body)."""
  harness.claim_main(
      main_file,
      title=title,
      arms_fn=arms_fn(spec.treatment),
      metrics=step_main.METRICS,
      curve_keys=step_main.CURVES,
      extra_eval=step_main.hacking_metrics,
      spec=spec,
      stem=stem,
  )
