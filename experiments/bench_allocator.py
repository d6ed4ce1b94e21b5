"""Host-memory policy and the one-jit RL iteration: seconds, page faults, RSS.

    python experiments/bench_allocator.py                         # 3 rounds x 20 iterations
    python experiments/bench_allocator.py --modes=keep --iters=1000 --rounds=1 --rss_every=100

Each (round, mode) runs in a fresh process (a malloc setting holds for a whole
process), the modes interleaved and their order rotated between rounds. A
process builds `configs/default.py`'s RL iteration (`learner.make_rl_step`:
rollout, reference forward, advantages, update, one jitted program) from the
config's own start, runs it once to compile, then `--iters` times, and
reports per iteration: wall seconds (median), minor page faults, system and
user CPU seconds (`getrusage`), and its resident memory (every `--rss_every`
iterations with `--rss_every`).

Modes (agentic_rl/host_memory.py):
  keep      the default: glibc keeps freed memory for reuse
  return    large freed arrays unmapped at once (the earlier default)
  system    glibc as it comes
  jemalloc  LD_PRELOAD=libjemalloc.so.2, MALLOC_CONF=retain:true,
            dirty_decay_ms:-1,muzzy_decay_ms:-1 (skipped with a line when the
            library is absent; Debian package libjemalloc2)
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time

from absl import app
from absl import flags
import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JEMALLOC = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
MODES = ("keep", "return", "system", "jemalloc")

_MODES = flags.DEFINE_list("modes", list(MODES), f"Subset of {MODES}.")
_ITERS = flags.DEFINE_integer("iters", 20, "Timed iterations per process.", 1)
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Processes per mode.", 1)
_RSS_EVERY = flags.DEFINE_integer(
    "rss_every", 0, "Record RSS every N iterations (0: only at the end).", 0
)
_CONFIG = flags.DEFINE_string("config", "default", "Config module in configs/.")
_WORKER = flags.DEFINE_string("worker", "", "Internal: run one process's mode.")


def _rss_gb() -> float:
  with open("/proc/self/statm") as f:
    return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30


def worker(mode: str, iters: int, rss_every: int, config_name: str) -> dict:
  """Runs in the child process: the RL iteration `iters` times after one
  compile call; returns the per-iteration numbers."""
  import importlib  # noqa: PLC0415

  sys.path.insert(0, REPO)
  import agentic_rl  # noqa: PLC0415
  import jax  # noqa: PLC0415

  from agentic_rl import learner  # noqa: PLC0415
  from agentic_rl import train  # noqa: PLC0415
  from configs import schema  # noqa: PLC0415

  config = schema.with_defaults(
      importlib.import_module(f"configs.{config_name}").get_config()
  )
  env = train.make_env(config)
  model_cfg = train.make_model_config(config)
  graphdef, state = train.init_state(config, model_cfg)
  state = train.start_rl(config, state)
  step = learner.make_rl_step(
      config, env, graphdef, learner.make_optimizer(config.rl), model_cfg
  )
  state, m = step(state)  # compile
  jax.block_until_ready(m)
  times, rss = [], []
  r0 = resource.getrusage(resource.RUSAGE_SELF)
  for i in range(iters):
    t0 = time.perf_counter()
    state, m = step(state)
    jax.block_until_ready(m)
    times.append(time.perf_counter() - t0)
    if rss_every and (i + 1) % rss_every == 0:
      rss.append([i + 1, round(_rss_gb(), 3)])
  r1 = resource.getrusage(resource.RUSAGE_SELF)
  return dict(
      mode=mode,
      host_memory=agentic_rl.HOST_MEMORY,
      iters=iters,
      s_per_iter=float(np.median(times)),
      faults_per_iter=(r1.ru_minflt - r0.ru_minflt) / iters,
      sys_s_per_iter=(r1.ru_stime - r0.ru_stime) / iters,
      user_s_per_iter=(r1.ru_utime - r0.ru_utime) / iters,
      rss_gb=round(_rss_gb(), 3),
      peak_rss_gb=round(r1.ru_maxrss / 2**20, 3),
      rss_curve=rss,
  )


def _env(mode: str) -> dict | None:
  env = dict(os.environ)
  env.pop("LD_PRELOAD", None)
  if mode == "jemalloc":
    if not os.path.exists(JEMALLOC):
      return None
    env["LD_PRELOAD"] = JEMALLOC
    env["MALLOC_CONF"] = "retain:true,dirty_decay_ms:-1,muzzy_decay_ms:-1"
    env["AGENTIC_RL_HOST_MEMORY"] = "system"
  else:
    env["AGENTIC_RL_HOST_MEMORY"] = mode
  return env


def main(argv) -> None:
  del argv
  if _WORKER.value:
    out = worker(_WORKER.value, _ITERS.value, _RSS_EVERY.value, _CONFIG.value)
    print("RESULT " + json.dumps(out))
    return
  modes = [m for m in _MODES.value if m]
  bad = [m for m in modes if m not in MODES]
  if bad:
    raise app.UsageError(f"--modes: unknown {bad}; choose from {MODES}")
  runnable = []
  for m in modes:
    if _env(m) is None:
      print(f"{m}: skipped ({JEMALLOC} not found; Debian package libjemalloc2)")
    else:
      runnable.append(m)
  print(
      f"config={_CONFIG.value} iters={_ITERS.value} rounds={_ROUNDS.value} "
      f"cpus={os.cpu_count()} load={os.getloadavg()[0]:.2f}"
  )
  results = {m: [] for m in runnable}
  for r in range(_ROUNDS.value):
    order = runnable[r % len(runnable) :] + runnable[: r % len(runnable)]
    for m in order:
      cmd = [
          sys.executable,
          os.path.abspath(__file__),
          f"--worker={m}",
          f"--iters={_ITERS.value}",
          f"--rss_every={_RSS_EVERY.value}",
          f"--config={_CONFIG.value}",
      ]
      p = subprocess.run(
          cmd,
          env=_env(m),
          cwd=REPO,
          capture_output=True,
          text=True,
          check=False,
      )
      lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
      if p.returncode or not lines:
        print(
            f"{m} round {r}: failed (exit {p.returncode})\n{p.stderr[-2000:]}"
        )
        continue
      out = json.loads(lines[-1][len("RESULT ") :])
      results[m].append(out)
      print(
          f"round {r} {m:9s} {out['s_per_iter']:.3f} s/iter "
          f"{out['faults_per_iter']:9.0f} faults/iter "
          f"sys {out['sys_s_per_iter']:.3f} user {out['user_s_per_iter']:.3f} "
          f"rss {out['rss_gb']:.2f} GB peak {out['peak_rss_gb']:.2f} GB "
          f"[{out['host_memory']}]",
          flush=True,
      )
      if out["rss_curve"]:
        print("  rss (iteration, GB): " + json.dumps(out["rss_curve"]))
  print(
      "\n| mode | s per iteration, median [min, max] over rounds | faults per "
      "iteration | system s | user s | peak RSS GB |"
  )
  print("|---|---|---|---|---|---|")
  for m, outs in results.items():
    if not outs:
      continue
    s = [o["s_per_iter"] for o in outs]
    f = np.median([o["faults_per_iter"] for o in outs])
    sy = np.median([o["sys_s_per_iter"] for o in outs])
    us = np.median([o["user_s_per_iter"] for o in outs])
    pk = max(o["peak_rss_gb"] for o in outs)
    print(
        f"| {m} | {np.median(s):.3f} [{min(s):.3f}, {max(s):.3f}] | {f:.0f} | "
        f"{sy:.3f} | {us:.3f} | {pk:.2f} |"
    )


if __name__ == "__main__":
  app.run(main)
