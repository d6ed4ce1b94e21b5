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

`--time_update=N` also times the jitted RL update (`make_update_fn`, the
config's minibatches and epochs, Adam) on that batch as the learner would
train it (loss mask = POLICY tokens, Gaussian advantages, behaviour and
reference log-probs = the policy's own), on the whole buffer and with
`rl.update_length_buckets` = 4 (`padding.bucketed_update`), interleaved,
N calls each after one compile call; it prints the median seconds per call.

`--time_step=N` times the whole one-jit RL iteration (`learner.make_rl_step`:
rollout, reference and behaviour forwards, advantages, update) of each config
with `rl.update_length_buckets` = 1 and = 4, interleaved, N calls each after
one compile call, from the config's own start (random init; the rollout of an
untrained policy runs to the turn budget, so this is a long-episode case).
With 4 buckets the reference and trainer-side behaviour forwards also run on
the update's bucket (`padding.bucketed_forward`).
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
_TIME = flags.DEFINE_integer(
    "time_update", 0, "Calls of the RL update to time per layout (0 = none)."
)

_TIME_STEP = flags.DEFINE_integer(
    "time_step",
    0,
    "Calls of the one-jit RL step to time with 1 and 4 buckets (0 = none).",
)


def time_step(config, calls: int) -> tuple:
  """(seconds 1 bucket, seconds 4 buckets, median bucket length): medians of
  the one-jit RL iteration, interleaved, each arm from the same start."""
  import time  # pylint: disable=g-import-not-at-top

  from agentic_rl import learner  # pylint: disable=g-import-not-at-top
  from configs import schema  # pylint: disable=g-import-not-at-top

  arms = {}
  for k in (1, 4):
    c = schema.with_defaults(config)
    c.rl.update_length_buckets = k
    if not c.trim_bucket:
      c.trim_bucket = 16
    env = train.make_env(c)
    model_cfg = train.make_model_config(c)
    graphdef, state = train.init_state(c, model_cfg)
    state = train.start_rl(c, state)
    step = learner.make_rl_step(
        c, env, graphdef, learner.make_optimizer(c.rl), model_cfg
    )
    arms[k] = [step, state]
  times = {k: [] for k in arms}
  used = []
  for i in range(calls + 1):
    for k, arm in arms.items():
      t0 = time.perf_counter()
      arm[1], m = arm[0](arm[1])
      jax.block_until_ready(m)
      if i:
        times[k].append(time.perf_counter() - t0)
        if k == 4:
          used.append(float(m["update_length"]))
  return (
      float(np.median(times[1])),
      float(np.median(times[4])),
      float(np.median(used)),
  )


def time_update(config, traj: types.Trajectory, calls: int) -> tuple:
  """(seconds whole buffer, seconds bucketed, bucket length): medians."""
  import time  # pylint: disable=g-import-not-at-top

  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  from agentic_rl import learner  # pylint: disable=g-import-not-at-top
  from agentic_rl import sampling  # pylint: disable=g-import-not-at-top
  from configs import schema  # pylint: disable=g-import-not-at-top

  config = schema.with_defaults(config)
  graphdef, state = train.init_state(config, train.make_model_config(config))
  tx = learner.make_optimizer(config.rl)
  b, l = traj.tokens.shape
  own, _ = sampling.token_logprobs(graphdef, state.params, traj.tokens, 1.0)
  batch = learner.LearnerBatch(
      tokens=traj.tokens,
      mask=traj.role == types.POLICY,
      behaviour_logp=own,
      ref_logp=own,
      advantage=jax.random.normal(jax.random.PRNGKey(0), (b, l)),
  )
  update = learner.make_update_fn(config, graphdef, tx)
  lengths = padding.update_lengths(l, 4, config.trim_bucket or 16)
  fns = {
      "buffer": jax.jit(update),
      "bucketed": jax.jit(padding.bucketed_update(update, lengths)),
  }
  opt = tx.init(state.params)
  times = {k: [] for k in fns}
  used = None
  for i in range(calls + 1):
    for k, fn in fns.items():
      t0 = time.perf_counter()
      out = fn(state.params, opt, batch, jnp.float32(0.0))
      jax.block_until_ready(out)
      if i:
        times[k].append(time.perf_counter() - t0)
      if k == "bucketed":
        used = int(out[2]["update_length"])
  return (
      float(np.median(times["buffer"])),
      float(np.median(times["bucketed"])),
      used,
  )


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
  timings, step_timings = [], []
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
    if _TIME.value:
      whole, bucketed, used = time_update(config, traj, _TIME.value)
      timings.append((name, l, used, whole, bucketed))
    if _TIME_STEP.value:
      one, four, used = time_step(config, _TIME_STEP.value)
      step_timings.append((name, l, used, one, four))
  if timings:
    print()
    print(
        "| config | L | bucket used | update s (buffer) | update s (4 buckets) "
        "| speed-up |"
    )
    print("|---|---|---|---|---|---|")
    for name, l, used, whole, bucketed in timings:
      print(
          f"| {name} | {l} | {used} | {whole:.3f} | {bucketed:.3f} | "
          f"{whole / bucketed:.2f}x |"
      )

  if step_timings:
    print()
    print(
        "| config | L | bucket used (median) | RL step s (1 bucket) | "
        "RL step s (4 buckets) | speed-up |"
    )
    print("|---|---|---|---|---|---|")
    for name, l, used, one, four in step_timings:
      print(
          f"| {name} | {l} | {used:.0f} | {one:.3f} | {four:.3f} | "
          f"{one / four:.2f}x |"
      )


if __name__ == "__main__":
  app.run(main)
