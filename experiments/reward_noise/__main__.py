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
    "over the clean reward",
    paper="ReDit (reward dithering)",
    departures=(
        "tiny transformer from scratch",
        "synthetic arithmetic",
        "binary correctness reward, Gaussian dither sigma 0.05",
        "the paper's second claim (flipped rewards degrade accuracy "
        "gracefully) is not decided here; the flip arms are reported only",
        "version 3 (2026-12-06) replaces v2's control check (flip_0.4 "
        "lowers final accuracy, declared 2026-12-04 after the run had been "
        "read; it does not show that the setup can detect a faster start) "
        "with one on early learning, and is decided on fresh seeds 8-15",
    ),
    positive_control="clean_lr2x arm (the RL learning rate doubled: must "
    "raise early training accuracy over clean)",
    positive_control_arm="clean_lr2x",
    metric_range=(0.0, 1.0),
    # Version 3, declared 2026-12-06 before any run of the clean_lr2x arm
    # or on seeds 8-15: the setup can show a speed-up of early learning only
    # if doubling the RL learning rate raises early_acc over clean in the
    # same decision run. (v2's check, flip_0.4 - clean on final accuracy, was
    # declared after its run had been read and tested another effect.)
    positive_control_check=stats.Part(
        "early_acc",
        "better",
        treatment="clean_lr2x",
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
