"""Share of the [B, L] batch buffer that is trained, real, or padding.

    python experiments/bench_padding.py                     # default, kv_chain, schema_calls
    python experiments/bench_padding.py --configs=default --batch=64

For each config, one batch of B expert episodes (the SFT demonstrations, made
by the config's own environment and rollout at its max_len) and three layouts:

  buffer   the [B, max_len] buffer the learner trains on today;
  trimmed  cut after the longest episode, rounded up to config.trim_bucket
           (agentic_rl/padding.py: bucket_length + trim);
  packed   episodes packed with segment ids into rows of max_len, as many rows
           as first-fit-decreasing needs (padding.first_fit_rows): what
           packing could reach.

Columns: trained = POLICY (loss-mask) tokens / buffer tokens, real = non-pad
tokens / buffer tokens. Expert episodes stand for the policy's after SFT
(which imitates them); RL policies that truncate or ramble fill more.
"""

from __future__ import annotations

import importlib
import os
import sys

from absl import app
from absl import flags
import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from agentic_rl import host_rollout  # pylint: disable=g-import-not-at-top
from agentic_rl import padding
from agentic_rl import rollout
from agentic_rl import train
from agentic_rl import types
from environments.host import base as host_base

_CONFIGS = flags.DEFINE_list(
    "configs",
    ["default", "kv_chain", "schema_calls"],
    "Config modules under configs/.",
)
_BATCH = flags.DEFINE_integer("batch", 64, "Episodes per batch.")
_SEED = flags.DEFINE_integer("seed", 0, "Task / expert seed.")


def expert_batch(config, batch: int, seed: int) -> types.Trajectory:
  env = train.make_env(config)
  key = jax.random.PRNGKey(seed)
  task_key, expert_key = jax.random.split(key)
  if host_base.is_host(env):
    tasks = env.sample_tasks(host_rollout.numpy_rng(task_key), batch)
    return host_rollout.rollout(env, tasks, expert_key, max_len=config.max_len)
  tasks = env.sample_tasks(task_key, batch)
  return rollout.rollout_jit(env, tasks, expert_key, max_len=config.max_len)


def main(argv):
  del argv
  print(
      "| config | L | episode length mean / max | layout | buffer [rows, len] "
      "| trained share | real share |"
  )
  print("|---|---|---|---|---|---|---|")
  for name in _CONFIGS.value:
    config = importlib.import_module(f"configs.{name}").get_config(None)
    traj = expert_batch(config, _BATCH.value, _SEED.value)
    length = np.asarray(traj.length)
    trained = int(np.sum(np.asarray(traj.role) == types.POLICY))
    real = int(length.sum())
    b, l = traj.tokens.shape
    cut = padding.bucket_length(length, bucket=config.trim_bucket, max_len=l)
    rows = padding.first_fit_rows(length, l)
    for layout, (nr, nl) in (
        ("buffer", (b, l)),
        ("trimmed", (b, cut)),
        ("packed", (rows, l)),
    ):
      print(
          f"| {name} | {l} | {length.mean():.1f} / {length.max()} | {layout} | "
          f"[{nr}, {nl}] | {trained / (nr * nl):.3f} | {real / (nr * nl):.3f} |",
          flush=True,
      )


if __name__ == "__main__":
  app.run(main)
