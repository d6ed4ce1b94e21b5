"""python -m experiments.reward_noise [--seeds=0,1,2] [--smoke]"""

from experiments import harness
from experiments import stats
from experiments.reward_noise import config

# Declared before the run: dithering (ReDit) should raise early training
# accuracy over the clean reward. It changes the update only in groups whose
# rewards tie (binary correctness reward here); with fewer than 30% of the start
# policy's groups tied there is too little for it to act on. An effect inside
# +-0.02 of accuracy counts as no effect.
SPEC = stats.ClaimSpec(
    primary_metric="early_acc",
    higher_is_better=True,
    room_metric="share of tied groups",
    room_threshold=0.3,
    equivalence_margin=0.02,
    treatment="dither_0.05",
    control="clean",
    prediction="better",
    room_fn=harness.room_tied_groups,
    claim="reward dithering (Gaussian noise, sigma 0.05) speeds early learning "
    "over the clean reward; flipped rewards degrade accuracy gracefully",
    paper="ReDit (reward dithering)",
    departures=(
        "tiny transformer from scratch",
        "synthetic arithmetic",
        "binary correctness reward, Gaussian dither sigma 0.05",
    ),
    positive_control="flip_0.4 arm (heavy noise must lower accuracy)",
    positive_control_arm="flip_0.4",
    metric_range=(0.0, 1.0),
    # Declared 2026-12-04 from the words above: held-out accuracy
    # flip_0.4 - clean lower, in the same decision run.
    positive_control_check=stats.Part(
        "accuracy",
        "worse",
        treatment="flip_0.4",
        control="clean",
        metric_range=(0.0, 1.0),
    ),
)

if __name__ == "__main__":
  harness.claim_main(
      __file__,
      title="Reward noise (flips) and reward dithering",
      arms_fn=config.arms,
      metrics=(
          ("accuracy", "accuracy"),
          ("accuracy_hard", "acc. hard"),
          ("pass@1", "pass@1"),
          ("early_acc", "train acc. it. 1-15"),
      ),
      curve_keys=("rl/accuracy", "rl/zero_variance_groups"),
      curve_means=(("early_acc", "rl/accuracy", 0, 15),),
      spec=SPEC,
  )
