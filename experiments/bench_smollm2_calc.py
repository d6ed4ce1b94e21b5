"""One GRPO iteration of configs/smollm2_calc.py on both rollout paths.

For each path (`native`: environments/chat_arithmetic.py, the whole iteration
one jitted XLA program; `host`: environments/host/chat_arithmetic.py, the
Python tool driven turn by turn) it builds the state main.py builds (SmolLM2
with LoRA adapters, start_rl, no SFT), runs `learner.make_rl_step` twice and
prints the seconds of each call (the first includes compilation), then one
rollout at T = 1 with the same weights, counting the [B, L] buffer's tokens by
kind: prompt (positions before the prompt's end), sampled (POLICY), observation
(other tokens after the prompt: tool messages and chat scaffolding) and padding
(after each row's end).

Usage:
  python experiments/bench_smollm2_calc.py [--paths=native,host] [--batch=16]
      [--set=model.remat=True --set=rl.behaviour_logprobs=trainer]

`--set KEY=VALUE` overrides a config field (repeatable), to measure one
change at a time against the config's settings.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from agentic_rl import host_rollout  # noqa: E402
from agentic_rl import learner  # noqa: E402
from agentic_rl import rollout  # noqa: E402
from agentic_rl import train  # noqa: E402
from agentic_rl import types  # noqa: E402
from configs import schema  # noqa: E402
from configs import smollm2_calc  # noqa: E402
from environments.host import base as host_base  # noqa: E402


def token_kinds(traj, prompt_len: np.ndarray) -> dict[str, int]:
  """Counts of the [B, L] buffer's tokens by kind (see module docstring)."""
  role = np.asarray(traj.role)
  length = np.asarray(traj.length)
  b, l = role.shape
  pos = np.arange(l)[None, :]
  inside = pos < length[:, None]
  prompt = pos < prompt_len[:, None]
  policy = role == types.POLICY
  return {
      "prompt": int(prompt.sum()),
      "sampled": int((policy & inside).sum()),
      "observation": int((inside & ~prompt & ~policy).sum()),
      "padding": int((~inside).sum()),
      "buffer": int(b * l),
  }


def bench(
    path: str, batch: int, group: int, overrides: Sequence[str] = ()
) -> dict:
  config = smollm2_calc.get_config("host" if path == "host" else None)
  config.rl.batch_size, config.rl.group_size = batch, group
  config.sft.steps = 0
  for item in overrides:  # 'model.remat=False', 'rl.behaviour_logprobs=sampler'
    key, _, value = item.partition("=")
    *parents, leaf = key.split(".")
    node = config
    for name in parents:
      node = node[name]
    node[leaf] = type(node[leaf])(
        value not in ("False", "false", "0")
        if isinstance(node[leaf], bool)
        else value
    )
  config = schema.with_defaults(config)
  env = train.make_env(config)
  model_cfg = train.make_model_config(config)
  graphdef, state = train.init_state(config, model_cfg)
  state = train.start_rl(config, state)
  rl_step = learner.make_rl_step(
      config, env, graphdef, learner.make_optimizer(config.rl), model_cfg
  )
  out = {
      "path": path,
      "batch": batch,
      "group": group,
      "L": config.max_len,
      "overrides": list(overrides),
  }
  for i in range(2):
    t0 = time.time()
    state, m = rl_step(state)
    jax.block_until_ready(m)
    out[f"iteration_{i}_s"] = round(time.time() - t0, 1)
  out["reward"] = float(m["reward"])
  params = state.params
  key = jax.random.PRNGKey(1)
  if host_base.is_host(env):
    tasks = env.sample_tasks(np.random.default_rng(0), batch)
    plen = np.array([len(env.reset(t)[1][0]) for t in tasks], np.int64)
    traj = host_rollout.rollout(
        env,
        tasks,
        key,
        max_len=config.max_len,
        graphdef=graphdef,
        params=params,
        model_config=model_cfg,
        temperature=1.0,
    )
  else:
    tasks = env.sample_tasks(jax.random.PRNGKey(0), batch)
    plen = np.asarray(jax.vmap(env.reset)(tasks)[2])
    traj = rollout.rollout_jit(
        env,
        tasks,
        key,
        max_len=config.max_len,
        graphdef=graphdef,
        params=params,
        model_config=model_cfg,
        temperature=jnp.float32(1.0),
    )
  out["tokens"] = token_kinds(traj, plen)
  return out


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--paths", default="native,host")
  parser.add_argument("--batch", type=int, default=16)
  parser.add_argument("--group", type=int, default=4)
  parser.add_argument(
      "--set",
      action="append",
      default=[],
      help="config override KEY=VALUE (repeatable), e.g. model.remat=False",
  )
  args = parser.parse_args()
  for path in args.paths.split(","):
    print(json.dumps(bench(path, args.batch, args.group, args.set)), flush=True)


if __name__ == "__main__":
  main()
