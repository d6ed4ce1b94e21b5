"""Wall time of the default job (`python main.py`), variants alternated.

    python experiments/bench_default_job.py --rounds=3
    python experiments/bench_default_job.py --rounds=3 --variants='|\
--config.sft.length_buckets=4 --config.sft.fit_bucket=False'

What a user measures with `time python main.py` on a warm compile cache,
made repeatable: each variant (a string of extra main.py flags; '' = the
config as it is) first runs once untimed to fill the compile cache (main.py's
default cache folder, or --compilation_cache), then the variants run
alternately, `--rounds` times each, each run in a fresh workdir (nothing to
resume) as its own process. Per run: wall seconds, the child's user and
system CPU seconds and peak RSS (os.wait4), the moments its workdir's files
appear (config.json: setup done; eval_sft.json: SFT trained and evaluated;
eval_report.json: the end), and the report's greedy accuracy after SFT and
after RL (variants that change only float summation order move it a little).
The XLA float32 [1024]^3 matmul rate is measured in this process before every
round, for scale (the machine's speed drifts between runs).

Prints one line per run, then per variant the median [min, max] wall time
and, for two or more variants, the per-round paired differences against the
first. `--out` also writes the lines as Markdown. Run it on an otherwise idle
machine; `--config=configs/default.py:smoke --rounds=1` is a seconds-long
check of the script.
"""

from __future__ import annotations

import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

_CONFIG = flags.DEFINE_string(
    "config", "configs/default.py", "main.py's --config."
)
_VARIANTS = flags.DEFINE_string(
    "variants",
    "",
    "Extra main.py flags per variant, separated by '|' ('' = as configured).",
)
_ROUNDS = flags.DEFINE_integer(
    "rounds", 3, "Timed runs per variant.", lower_bound=1
)
_CACHE = flags.DEFINE_string(
    "compilation_cache",
    None,
    "main.py's --compilation_cache (default: main.py's own default).",
)
_OUT = flags.DEFINE_string("out", None, "Also write the report here.")


def _matmul_rate(n: int = 1024) -> float:
  """FLOP/s of the fastest of 5 XLA float32 [n, n] @ [n, n] products
  (`experiments.peers.common.matmul_rate`, as bench_peers measures it)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  from experiments.peers import common  # pylint: disable=g-import-not-at-top

  a = jnp.asarray(np.random.default_rng(0).standard_normal((n, n)), jnp.float32)
  mm = jax.jit(jnp.matmul)
  return common.matmul_rate(lambda: mm(a, a).block_until_ready(), n)


def run_job(
    config: str, extra: list[str], workdir: str, cache: str | None = None
) -> dict:
  """One `python main.py --config=CONFIG [--compilation_cache=CACHE] EXTRA`
  process in `workdir`, its output in `workdir`.log.

  Returns:
    dict: wall, user, sys (seconds), rss_gb (peak), the seconds after the
    start at which config.json / eval_sft.json / eval_report.json appeared
    (setup, sft, end; None where absent), accuracy_sft and accuracy_rl.

  Raises:
    RuntimeError: main.py exited non-zero (its output's tail in the message).
  """
  cmd = [sys.executable, "main.py", f"--config={config}"]
  cmd += [f"--workdir={workdir}"]
  if cache:
    cmd.append(f"--compilation_cache={cache}")
  cmd += extra
  log_path = workdir + ".log"
  with open(log_path, "w") as log:
    t0 = time.time()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.time() - t0
  code = os.waitstatus_to_exitcode(status)
  if code != 0:
    with open(log_path) as f:
      tail = f.read()[-2000:]
    raise RuntimeError(f"{shlex.join(cmd)} exited {code}:\n{tail}")

  def appeared(name):
    path = os.path.join(workdir, name)
    return os.path.getmtime(path) - t0 if os.path.exists(path) else None

  with open(os.path.join(workdir, "eval_report.json")) as f:
    reports = json.load(f)["reports"]
  return dict(
      wall=wall,
      user=usage.ru_utime,
      sys=usage.ru_stime,
      rss_gb=usage.ru_maxrss / 2**20,  # KiB on Linux
      setup=appeared("config.json"),
      sft=appeared("eval_sft.json"),
      end=appeared("eval_report.json"),
      accuracy_sft=reports["sft"]["accuracy"],
      accuracy_rl=reports["rl"]["accuracy"],
  )


def _fmt(x, spec=".2f"):
  return "n/a" if x is None else format(x, spec)


def main(argv):
  del argv
  variants = [v.strip() for v in _VARIANTS.value.split("|")]
  lines = [
      f"command: `python experiments/bench_default_job.py "
      f"--config={_CONFIG.value} --rounds={_ROUNDS.value} "
      f"--variants={shlex.quote(_VARIANTS.value)}`",
      f"cpus {os.cpu_count()}; load average at start "
      f"{os.getloadavg()[0]:.2f}",
  ]
  print("\n".join(lines), flush=True)
  root = tempfile.mkdtemp(prefix="bench_default_job_")
  job, cache = _CONFIG.value, _CACHE.value
  for i, v in enumerate(variants):  # fill the compile cache, untimed
    run_job(job, shlex.split(v), os.path.join(root, f"warm{i}"), cache)
  walls = {i: [] for i in range(len(variants))}
  for r in range(_ROUNDS.value):
    rate = _matmul_rate()
    order = (
        range(len(variants)) if r % 2 == 0 else reversed(range(len(variants)))
    )
    for i in order:
      m = run_job(
          job, shlex.split(variants[i]), os.path.join(root, f"r{r}v{i}"), cache
      )
      walls[i].append(m["wall"])
      line = (
          f"round {r} variant {i} ({variants[i] or 'as configured'}): wall "
          f"{m['wall']:.2f} s, user {m['user']:.1f} s, sys {m['sys']:.1f} s, "
          f"peak RSS {m['rss_gb']:.2f} GB; setup {_fmt(m['setup'])} s, SFT "
          f"evaluated {_fmt(m['sft'])} s, end {_fmt(m['end'])} s; accuracy "
          f"{m['accuracy_sft']:.4f} -> {m['accuracy_rl']:.4f}; matmul "
          f"{rate / 1e9:.1f} GFLOP/s before the round"
      )
      lines.append(line)
      print(line, flush=True)
  lines.append("")
  lines.append("| variant | wall s, median [min, max] | paired vs variant 0 |")
  lines.append("|---|---|---|")
  for i, v in enumerate(variants):
    w = walls[i]
    diffs = [a - b for a, b in zip(w, walls[0])]
    paired = (
        "-"
        if i == 0
        else ", ".join(f"{d:+.2f}" for d in diffs)
        + f" s (median {statistics.median(diffs):+.2f})"
    )
    lines.append(
        f"| {v or 'as configured'} | {statistics.median(w):.2f} "
        f"[{min(w):.2f}, {max(w):.2f}] | {paired} |"
    )
  lines.append(f"load average at end {os.getloadavg()[0]:.2f}")
  print("\n".join(lines[-len(variants) - 4 :]), flush=True)
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
  app.run(main)
