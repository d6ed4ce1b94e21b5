"""python -m experiments.step_hacking.min_form [--seeds=...] [--smoke]

PURE's min-form credit: one of the bound claims of bounds.py (form, control,
replication there); writes results_min.*.
"""

from experiments.step_hacking import bounds

SPEC = bounds.bound_spec(
    "min",
    claim="with min-form credit on the step reward (PURE), held-out "
    "accuracy stays within 0.05 of success-only (no sum-form collapse)",
    paper="PURE arXiv:2504.15275",
    departures=(
        "hard min over the future step scores, not PURE's soft-min "
        "reweighting; the outcome reward is added at the last turn",
        "declared after this arm's 3-seed run of 2026-11-30 (another SFT "
        "start) had been read",
    ),
)

if __name__ == "__main__":
  bounds.main(
      __file__,
      SPEC,
      title="Min-form step credit vs success-only (key-value chains)",
      stem="results_min",
  )
