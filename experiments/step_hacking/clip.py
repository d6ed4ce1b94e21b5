"""python -m experiments.step_hacking.clip [--seeds=...] [--smoke]

Clipping (eta = 1): one of the bound claims of bounds.py (form, control,
replication there); writes results_clip.*.
"""

from experiments.step_hacking import bounds

SPEC = bounds.bound_spec(
    "clip",
    claim="with the step reward clipped (eta = 1), held-out accuracy stays "
    "within 0.05 of success-only (no sum-form collapse)",
    paper="Clipping/Delta arXiv:2410.15115",
    departures=(
        "with a 0/1 step score and eta = 1 a valid call earns 0 and a failed "
        "call -c, so the clipped arm is success-only plus a failed-call "
        "penalty",
        "declared after this arm's 3-seed run of 2026-11-30 (another SFT "
        "start) had been read",
    ),
)

if __name__ == "__main__":
  bounds.main(
      __file__,
      SPEC,
      title="Clipped step reward vs success-only (key-value chains)",
      stem="results_clip",
  )
