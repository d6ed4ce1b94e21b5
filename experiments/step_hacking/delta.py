"""python -m experiments.step_hacking.delta [--seeds=...] [--smoke]

Second declared claim of this folder, on the same workdirs (shared SFT start
and success_only arm under runs/step_hacking, bounds.py): Delta credit (the per-turn
difference of step scores, the last call keeping c p_k) is as good as
success-only, i.e. it removes the sum-form hack. Writes results_delta.*.
"""

from experiments.step_hacking import bounds

# Declared before the run: held-out greedy accuracy of delta within +-0.05 of
# success-only (paired by seed); same room check as the sum-form claim.
# Version 3 (2026-12-06): the positive-control check (the sum arm collapses
# in the same decision run, bounds.py) is declared and the sum arm run with
# this claim; v2's run had the control in words only, so its 'contradicted'
# part was reported as 'inconclusive: the setup cannot show the effect'.
SPEC = bounds.bound_spec(
    "delta",
    claim="with Delta credit, the last call keeping its step reward (our "
    "form), held-out accuracy stays within 0.05 of success-only",
    paper="Clipping/Delta arXiv:2410.15115",
    departures=(
        "the delta arm keeps the last call's step reward (the last call "
        "keeps c p_k); the paper's Delta drops the last step (r_1 - r_T); "
        "the dropped form is its own claim (delta_paper.py)",
        "v3's positive-control check was declared after v2's run had shown "
        "the part contradicted and the sum arm's collapse (2026-12-02): "
        "v3's verdict on seeds 0-7 was known in advance",
    ),
)

if __name__ == "__main__":
  bounds.main(
      __file__,
      SPEC,
      title="Delta-form step reward vs success-only (key-value chains)",
      stem="results_delta",
  )
