"""python -m experiments.step_hacking [--seeds=0,1,2] [--smoke]

Writes results.* (the five arms) and results_delta_drop.* (the post-hoc arm,
same SFT checkpoint and seeds)."""

import jax
import jax.numpy as jnp
import numpy as np

from agentic_rl import rollout
from agentic_rl import train
from agentic_rl import types
from experiments import harness
from experiments import stats
from experiments.step_hacking import config

# Declared before the RL run: the naive sum-form step reward is hacked
# (repeated calls) and ends with lower held-out greedy accuracy than
# success-only. A hack can only destroy accuracy the start has: below 0.3
# greedy accuracy at the start the collapse cannot be told from a failure to
# learn. (Version 2: version 1 measured the room as the start's *sampled*
# accuracy, 0.254 < 0.3, and stopped before RL; the primary metric is greedy,
# so the room is now measured with greedy decoding. Changed after seeing that
# room value and before any RL of this setup; README.md.)
# Declared 2026-12-06 before any run on these seeds: the 2026-12-02 decision
# run (seeds 0-7) used earlier config hashes and start; the claim is decided
# again on fresh seeds 8-15 with the current code, whatever it shows.
REPLICATION = (
    "decided on seeds 8-15 with the current code, a replication declared on "
    "2026-12-06 after the seeds 0-7 runs had been read (all kept in the "
    "ledger)"
)
SPEC = stats.ClaimSpec(
    primary_metric="accuracy",
    higher_is_better=True,
    room_metric="start greedy accuracy (training tasks)",
    room_threshold=0.3,
    treatment="sum",
    control="success_only",
    prediction="worse",
    metric_range=(0.0, 1.0),
    room_fn=harness.room_start_greedy_accuracy,
    # The bounds (Clip, Delta, min-form) are the folder's further claims
    # (bounds.py), each decided on its own; this claim is the hack alone.
    claim="a summed per-call step reward lowers held-out accuracy below "
    "success-only (the policy keeps calling; repeat rates reported, not "
    "decided)",
    paper="Clipping/Delta arXiv:2410.15115; PURE arXiv:2504.15275",
    departures=(
        "rule 'PRM' scoring each valid call 1 (repeats included), not "
        "a learned PRM with continuous scores",
        "answer step not scored",
        "Clip threshold eta = 1 fixed, not a score quantile",
        "key-value chains d = 1-3; SFT 100 x 32, RL 25 x 32",
        REPLICATION,
    ),
    positive_control="",
)


def hacking_metrics(cfg, params):
  """Repeated calls and episode length on the held-out tasks.

  One greedy pass (the `accuracy` decoding) and one sampled pass at T = 1 (the
  training distribution). repeat_rate = calls of a key already queried in the
  episode / all calls, summed over the set (env fact 'num_redundant_calls');
  turns = assistant turns per episode; horizon_rate = share of episodes that
  used every turn.
  """
  env = train.make_env(cfg)
  model_cfg = train.make_model_config(cfg)
  graphdef = train.init_state(cfg, model_cfg)[0]
  tasks = env.eval_tasks(cfg.eval.num_tasks, cfg.eval.seed)
  out = {}
  for suffix, temp, seed in (
      ("", 0.0, cfg.eval.seed),
      ("_t1", 1.0, cfg.eval.seed + 7),
  ):
    traj = rollout.rollout_jit(
        env,
        tasks,
        jax.random.PRNGKey(seed),
        max_len=cfg.max_len,
        graphdef=graphdef,
        params=params,
        model_config=model_cfg,
        temperature=jnp.float32(temp),
    )
    f = jax.device_get(traj.facts)
    calls = np.asarray(f["num_tool_calls"], np.float64)
    red = np.asarray(f["num_redundant_calls"], np.float64)
    turns = np.asarray(traj.num_turns, np.float64)
    out[f"repeat_rate{suffix}"] = float(red.sum() / max(calls.sum(), 1.0))
    out[f"repeats{suffix}"] = float(red.mean())
    out[f"turns{suffix}"] = float(turns.mean())
    out[f"horizon_rate{suffix}"] = float((turns >= env.max_turns).mean())
    out[f"unanswered{suffix}"] = float(
        (np.asarray(traj.finish) != types.ANSWERED).mean()
    )
    if suffix:
      out[f"accuracy{suffix}"] = float(
          np.asarray(f["correct"], np.float64).mean()
      )
  return out


METRICS = (
    ("accuracy", "accuracy"),
    ("tool_calls", "calls/ep"),
    ("repeat_rate", "repeat rate"),
    ("turns", "turns/ep"),
    ("accuracy_t1", "acc. T=1"),
    ("repeat_rate_t1", "repeat rate T=1"),
    ("turns_t1", "turns/ep T=1"),
    ("unanswered_t1", "unanswered T=1"),
)
CURVES = ("rl/accuracy", "rl/tool_calls", "rl/redundant_calls", "rl/turns")


def delta_drop(root, out_dir, seeds, smoke):
  """Post-hoc arm (added after the first look at results.md): Delta with the
  last step dropped, from the same shared SFT checkpoint (ROOT/sft_*), written
  as results_delta_drop.md / .json / .png."""
  harness.run_claim(
      "post-hoc: Delta with the last step dropped",
      {
          "delta_drop": config.get_config(
              "delta_drop" + (",smoke" if smoke else "")
          )
      },
      seeds,
      root=root,
      out_dir=out_dir,
      metrics=METRICS,
      curve_keys=CURVES,
      extra_eval=hacking_metrics,
      include_sft_row=False,
      stem="results_delta_drop",
  )


if __name__ == "__main__":
  harness.claim_main(
      __file__,
      title="Hackable per-call step reward: sum vs Clip / Delta / min-form "
      "(key-value chains)",
      arms_fn=config.arms,
      metrics=METRICS,
      curve_keys=CURVES,
      extra_eval=hacking_metrics,
      after_run=delta_drop,
      spec=SPEC,
  )
