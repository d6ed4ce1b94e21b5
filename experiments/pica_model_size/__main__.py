"""python -m experiments.pica_model_size [--seeds=0,1,2] [--smoke]"""

from agentic_rl.models import transformer
from experiments import harness
from experiments import stats
from experiments.pica_model_size import config

# Declared before the run: at the smallest size the PBRS arm learns faster
# (mean training accuracy over RL iterations 0-19) than outcome-only. Learning
# speed can differ only while the start is below the ceiling: with less than
# 0.3 of headroom (1 - the start's sampled accuracy) the claim is untestable.
SPEC = stats.ClaimSpec(
    primary_metric="early_accuracy",
    higher_is_better=True,
    room_metric="headroom 1 - start sampled accuracy",
    room_threshold=0.3,
    treatment="xs_pbrs",
    control="xs_outcome",
    prediction="better",
    metric_range=(0.0, 1.0),
    room_fn=harness.room_headroom,
    claim="potential-based shaping helps a small model learn faster, and the "
    "gain shrinks as the model grows",
    paper="PiCA",
    departures=(
        "0.14-0.92M-param transformers, not 3B / 7B LMs",
        "oracle hop-progress potential, not a learned success " "probability",
        "Phi = 0 at the turn budget (policy invariant)",
        "verdict on the smallest size's gain only",
    ),
    positive_control="",
)


def num_params(cfg, params):
  del cfg
  return {"params_M": transformer.count_params(params) / 1e6}


if __name__ == "__main__":
  harness.claim_main(
      __file__,
      title="Shaping gain (PBRS on hop progress) vs model size (PiCA)",
      arms_fn=config.arms,
      metrics=(
          ("params_M", "params (M)"),
          ("accuracy", "accuracy"),
          ("pass@1", "pass@1"),
          ("early_accuracy", "RL acc. it. 0-20"),
          ("tool_calls", "calls/ep"),
      ),
      curve_keys=("rl/accuracy",),
      curve_means=(("early_accuracy", "rl/accuracy", 0, 20),),
      extra_eval=num_params,
      spec=SPEC,
  )
