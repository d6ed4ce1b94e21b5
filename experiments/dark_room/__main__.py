"""python -m experiments.dark_room [--seeds=0,1,2] [--smoke]

Writes results.md / .json / .png (held-out table) and curves_summary.md / .png
(training-curve windows) of the same workdirs."""

import jax
import jax.numpy as jnp
import numpy as np

from agentic_rl import credit
from agentic_rl import rollout
from agentic_rl import train
from agentic_rl import types
from experiments import harness
from experiments import stats
from experiments.dark_room import config
from experiments.dark_room import curves_summary

# Declared before the run: the dense prediction bonus under z-scored GRPO lowers
# held-out accuracy below the outcome-only arm (success -> 0). The bonus drives
# the z-scored advantage alone only in groups where every episode fails; with
# fewer than 10% of the start policy's groups all-fail it has little to act on.
# Declared 2026-12-06 before any run on these seeds: the recorded run
# (2026-12-02, seeds 0-7) used earlier code; the claim is decided again on
# fresh seeds 8-15 with the current code, whatever it shows.
REPLICATION = (
    "decided on seeds 8-15 with the current code, a replication declared on "
    "2026-12-06 after the seeds 0-7 run had been read (kept in the ledger)"
)
SPEC = stats.ClaimSpec(
    primary_metric="accuracy",
    higher_is_better=True,
    room_metric="share of all-fail groups",
    room_threshold=0.1,
    treatment="pred_zscore",
    control="outcome",
    prediction="worse",
    metric_range=(0.0, 1.0),
    room_fn=harness.room_all_fail_groups,
    claim="a next-observation-prediction PBRS bonus under z-scored GRPO "
    "lowers held-out success below outcome-only (horizon shares reported, "
    "not decided)",
    paper="dark room (next-observation prediction reward under GRPO)",
    departures=(
        "tiny transformer from scratch",
        "key-value chains d = 5-6, not a " "visual environment",
        "lambda = 0.1 only (no sweep)",
        "SFT 150 x 32, RL 40 x 32 (CPU budget)",
        REPLICATION,
    ),
    positive_control="pred_meanonly arm (the same bonus without std scaling "
    "should not collapse)",
    positive_control_arm="pred_meanonly",
)


def dark_room_eval(cfg, params):
  """Dark-room diagnostics of a final policy on the held-out tasks.

  Greedy episodes (as for `accuracy`) and sampled ones (T = 1, one per task):
  share of episodes cut off at the horizon (MAX_TURNS / TRUNCATED), mean
  assistant turns, and (greedy episodes) the policy's mean probability and
  arg-max accuracy on the observation tokens it received.
  """
  env = train.make_env(cfg)
  model_cfg = train.make_model_config(cfg)
  graphdef = train.init_state(cfg, model_cfg)[0]
  tasks = env.eval_tasks(cfg.eval.num_tasks, cfg.eval.seed)
  out = {}
  for name, temp in (("greedy", 0.0), ("sampled", 1.0)):
    traj = rollout.rollout_jit(
        env,
        tasks,
        jax.random.PRNGKey(cfg.eval.seed + 7),
        max_len=cfg.max_len,
        graphdef=graphdef,
        params=params,
        model_config=model_cfg,
        temperature=jnp.float32(temp),
    )
    finish = np.asarray(traj.finish)
    horizon = (finish == types.MAX_TURNS) | (finish == types.TRUNCATED)
    out[f"horizon_{name}"] = float(horizon.mean())
    out[f"turns_{name}"] = float(np.asarray(traj.num_turns).mean())
    if name == "greedy":
      prob, hit = jax.jit(
          lambda t: credit.observation_prediction_scores(
              graphdef, params, t, 1.0
          )
      )(traj.tokens)
      obs = np.asarray(traj.role) == types.TOOL
      n = max(int(obs.sum()), 1)
      out["obs_pred_prob"] = float(np.asarray(prob)[obs].sum() / n)
      out["obs_pred_acc"] = float(np.asarray(hit)[obs].sum() / n)
  return out


if __name__ == "__main__":
  harness.claim_main(
      __file__,
      title="Dark room: next-observation-prediction reward, z-scored vs "
      "mean-only GRPO vs auxiliary loss (kv chains d = 5-6)",
      arms_fn=config.arms,
      metrics=(
          ("accuracy", "accuracy"),
          ("pass@1", "pass@1"),
          ("horizon_greedy", "horizon share"),
          ("horizon_sampled", "horizon share (T=1)"),
          ("turns_greedy", "turns/ep"),
          ("obs_pred_acc", "obs. pred. acc."),
          ("obs_pred_prob", "obs. pred. prob."),
          ("late_horizon", "RL horizon, last 10 it."),
      ),
      curve_keys=("rl/accuracy", "rl/horizon_rate", "rl/obs_pred_acc"),
      curve_means=(("late_horizon", "rl/horizon_rate", -10, None),),
      extra_eval=dark_room_eval,
      spec=SPEC,
      after_run=lambda root, out_dir, seeds, smoke: curves_summary.write_summary(
          root, out_dir, seeds
      ),
  )
