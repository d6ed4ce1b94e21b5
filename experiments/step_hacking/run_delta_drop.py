"""Post-hoc arm (added after the first look at results.md): Delta with the last
step dropped, on the same shared SFT checkpoint (reuses ROOT/sft_*).

  PYTHONPATH=. python experiments/step_hacking/run_delta_drop.py
writes /tmp/claims/posthoc_out/results.{md,json,png} (copied here as
results_delta_drop.*)."""
from experiments import harness
from experiments.step_hacking import config
from experiments.step_hacking.__main__ import hacking_metrics
harness.run_claim(
    "post-hoc: Delta with the last step dropped", {"delta_drop": config.get_config("delta_drop")},
    [0, 1, 2], root="/tmp/claims/step_hacking", out_dir="/tmp/claims/posthoc_out",
    metrics=(("accuracy", "accuracy"), ("tool_calls", "calls/ep"),
             ("repeat_rate", "repeat rate"), ("turns", "turns/ep"),
             ("accuracy_t1", "acc. T=1"), ("repeat_rate_t1", "repeat rate T=1"),
             ("turns_t1", "turns/ep T=1"), ("unanswered_t1", "unanswered T=1")),
    curve_keys=("rl/accuracy", "rl/tool_calls", "rl/redundant_calls", "rl/turns"),
    extra_eval=hacking_metrics, include_sft_row=False)
