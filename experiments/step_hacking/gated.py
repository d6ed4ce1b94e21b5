"""python -m experiments.step_hacking.gated [--seeds=...] [--smoke]

Declared claim (bounds.py): gated reward accumulation (G-RA: the step rewards
of an episode count only when its outcome reward reaches the gate, here the
composed correct + 0.1 format reward >= 1, i.e. a correct answer) removes the
sum-form hack, held-out greedy accuracy within +-0.05 of success-only,
decided only with the positive-control check that the sum arm collapses in
the same decision run. Same workdirs as the folder's other claims
(runs/step_hacking); writes results_gated.*.

Declared 2026-12-06 after the clip / min / delta / delta_paper decision runs
had been read; the gated arm had never been run (config.py's arm, left out
for the CPU budget), so no gated number was seen before this declaration.
"""

from experiments.step_hacking import bounds

SPEC = bounds.bound_spec(
    "gated",
    claim="with gated accumulation of the step reward (G-RA: step rewards "
    "count only in correct episodes), held-out accuracy stays within 0.05 of "
    "success-only (no sum-form collapse)",
    paper="G-RA (Gated Reward Accumulation)",
    departures=(
        "gate on the composed outcome reward (correct + 0.1 format >= 1), "
        "inferred from the method's description; the step rewards of a "
        "gated-in episode are summed (unbounded), as in the sum arm, so "
        "repeated calls before a correct answer are still paid",
        "declared after the clip / min / delta / delta_paper decision runs "
        "had been read (the gated arm itself had never been run)",
        "no arXiv id on record for G-RA (docs/papers.md)",
    ),
)

if __name__ == "__main__":
  bounds.main(
      __file__,
      SPEC,
      title="Gated (G-RA) step reward vs success-only (key-value chains)",
      stem="results_gated",
  )
