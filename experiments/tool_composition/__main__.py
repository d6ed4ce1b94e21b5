"""python -m experiments.tool_composition [--seeds=0,1,2] [--smoke]"""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

from agentic_rl import rollout
from agentic_rl import train
from experiments import harness
from experiments.tool_composition import config

# Depth bins of the by-depth columns.
DEPTH_BINS = ((1, 2), (3, 4), (5, 6))


def depth_eval(cfg, params):
  """Greedy held-out metrics by depth, constraint violations and invalid calls.

  The same fixed task set as train.evaluate (cfg.eval.num_tasks, cfg.eval.seed),
  greedy decoding. Returns success by depth bin (acc_d1_2, ...), every depth's
  success (acc_d1 .. acc_d6, in results.json), the constraint-violation rate
  (share of constrained episodes that called the forbidden tool), the
  invalid-call rate (calls that did not execute / all calls) and the mean
  reference-match fraction (how canonical the policy's path is).
  """
  env = train.make_env(cfg)
  model_cfg = train.make_model_config(cfg)
  graphdef = train.init_state(cfg, model_cfg)[0]
  tasks = env.eval_tasks(cfg.eval.num_tasks, cfg.eval.seed)
  traj = rollout.rollout_jit(
      env, tasks, jax.random.PRNGKey(cfg.eval.seed), max_len=cfg.max_len,
      graphdef=graphdef, params=params, model_config=model_cfg,
      temperature=jnp.float32(0.0))
  f = jax.device_get(traj.facts)
  correct = np.asarray(f["correct"], bool)
  depth = np.asarray(f["num_nodes"])
  nan = float("nan")
  out = {}
  for d in range(1, config.MAX_DEPTH + 1):
    m = depth == d
    out[f"acc_d{d}"] = float(correct[m].mean()) if m.any() else nan
  for lo, hi in DEPTH_BINS:
    m = (depth >= lo) & (depth <= hi)
    out[f"acc_d{lo}_{hi}"] = float(correct[m].mean()) if m.any() else nan
  constrained = np.asarray(f["has_constraint"], bool)
  violated = np.asarray(f["num_forbidden_calls"]) > 0
  out["violation_rate"] = (float(violated[constrained].mean())
                           if constrained.any() else nan)
  calls = np.asarray(f["num_tool_calls"]).sum()
  out["invalid_call_rate"] = (float(np.asarray(f["num_tool_errors"]).sum() / calls)
                              if calls else nan)
  call_k = np.asarray(f["tool_call_turn"], bool)
  matched = (np.asarray(f["call_ref_match"], bool) & call_k).sum(1)
  out["ref_match"] = float((matched / np.maximum(np.maximum(depth, call_k.sum(1)), 1)
                            ).mean())
  return out


if __name__ == "__main__":
  harness.cli(
      sys.argv[1:], here=os.path.dirname(os.path.abspath(__file__)),
      title=("ToolRLA multiplicative vs additive composition; TIER execution vs "
             "reference-trajectory matching (schema calls, depth 1..6)"),
      arms_fn=config.arms,
      metrics=(("accuracy", "success"), ("acc_d1_2", "success d1-2"),
               ("acc_d3_4", "success d3-4"), ("acc_d5_6", "success d5-6"),
               ("violation_rate", "violation rate"),
               ("invalid_call_rate", "invalid-call rate"),
               ("tool_calls", "calls/ep"), ("ref_match", "ref. match")),
      curve_keys=("rl/accuracy", "rl/tool_calls"),
      extra_eval=depth_eval,
  )
