"""python -m experiments.length_bias [--seeds=0,1,2] [--smoke]"""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

from agentic_rl import rollout
from agentic_rl import train
from agentic_rl import types
from experiments import harness
from experiments.length_bias import config


def response_lengths(cfg, params):
  """POLICY tokens per episode of incorrect / correct sampled held-out episodes."""
  env = train.make_env(cfg)
  model_cfg = train.make_model_config(cfg)
  graphdef = train.init_state(cfg, model_cfg)[0]
  tasks = env.eval_tasks(cfg.eval.num_tasks, cfg.eval.seed)
  traj = rollout.rollout_jit(
      env, tasks, jax.random.PRNGKey(cfg.eval.seed + 7), max_len=cfg.max_len,
      graphdef=graphdef, params=params, model_config=model_cfg,
      temperature=jnp.float32(1.0))
  n = np.sum(np.asarray(traj.role) == types.POLICY, axis=1).astype(np.float64)
  ok = np.asarray(traj.facts["correct"], bool)
  return {"len_incorrect": float(n[~ok].mean()) if (~ok).any() else float("nan"),
          "len_correct": float(n[ok].mean()) if ok.any() else float("nan"),
          "sampled_accuracy": float(ok.mean())}


if __name__ == "__main__":
  harness.cli(
      sys.argv[1:], here=os.path.dirname(os.path.abspath(__file__)),
      title="Loss aggregation and the length of incorrect responses (Dr.GRPO)",
      arms_fn=config.arms,
      metrics=(("accuracy", "accuracy"), ("sampled_accuracy", "acc. (T=1)"),
               ("len_incorrect", "tokens/ep incorrect"),
               ("len_correct", "tokens/ep correct")),
      curve_keys=("rl/accuracy", "rl/policy_tokens"),
      extra_eval=response_lengths,
  )
