"""Sampling and training throughput of a SmolLM2 config on this machine.

  python -m experiments.smollm2.bench --config=configs/smollm2_bfcl.py --reps=2

Builds the config's environment, model (the imported checkpoint) and RL step
exactly as train.py does, then times separately, after one warm-up call each:

  * sampling: `host_rollout.rollout` of one RL batch (rl.batch_size episodes,
    rl.temperature) -> POLICY tokens generated per second (prefill and tool
    time included, as in a real rollout);
  * training: the jitted RL update on that trajectory (reference log-probs,
    forward + backward, AdamW) -> buffer tokens (batch x max_len) and POLICY
    tokens per second;

and prints peak RSS (ru_maxrss) as JSON.
"""

from __future__ import annotations

import json
import resource
import sys
import time

import jax
import numpy as np
from absl import app
from absl import flags
from ml_collections import config_flags

from agentic_rl import learner
from agentic_rl import sharding
from agentic_rl import train
from agentic_rl import types

_CONFIG = config_flags.DEFINE_config_file("config", None, "config file")
_REPS = flags.DEFINE_integer("reps", 2, "timed repetitions (after one warm-up)")


def main(_):
  config = _CONFIG.value
  mesh = sharding.make_mesh(config.get("mesh"))
  with jax.set_mesh(mesh):
    env = train.make_env(config)
    model_cfg = train.make_model_config(config)
    graphdef, state = train.init_state(config, model_cfg, mesh)
    state = train.start_rl(config, state)
    rollout_fn = learner.make_host_rollout_fn(config, env, graphdef, model_cfg)
    step = learner.make_rl_step(
        config, env, graphdef, learner.make_optimizer(config.rl), model_cfg
    )
    out = {
        "config": config.name,
        "batch": config.rl.batch_size,
        "max_len": config.max_len,
        "reps": _REPS.value,
    }
    samp, trainv = [], []
    for rep in range(_REPS.value + 1):
      t0 = time.perf_counter()
      traj = rollout_fn(state)
      jax.block_until_ready(traj.tokens)
      t1 = time.perf_counter()
      policy_tokens = int(np.sum(np.asarray(traj.role) == types.POLICY))
      # The RL step re-runs its own rollout; time the update via a step minus
      # a rollout is noisy under contention, so time the whole step and the
      # rollout separately and report both.
      t2 = time.perf_counter()
      state, metrics = step(state)
      jax.block_until_ready(metrics["loss"])
      t3 = time.perf_counter()
      if rep == 0:
        continue  # warm-up (compilation)
      samp.append((policy_tokens, t1 - t0))
      trainv.append(t3 - t2 - (t1 - t0))
    tok = sum(p for p, _ in samp)
    sec = sum(s for _, s in samp)
    out["sampling_policy_tokens_per_s"] = tok / sec
    out["rollout_seconds"] = sec / len(samp)
    out["policy_tokens_per_batch"] = tok / len(samp)
    upd = float(np.mean(trainv))
    out["update_seconds_est"] = upd
    out["training_buffer_tokens_per_s_est"] = (
        config.rl.batch_size * config.max_len / max(upd, 1e-9)
    )
    out["peak_rss_gb"] = (
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    )
    print(json.dumps(out, indent=2))
    sys.stdout.flush()


if __name__ == "__main__":
  app.run(main)
