"""Runs the default experiment for several seeds and prints the per-seed table.

  python experiments/calculator_grpo/run_seeds.py --seeds=0,1,2 --root=runs/seeds

Each seed is a normal `main.py` run in ROOT/seed_S (so it resumes if re-run); the
table (Markdown) is printed and written to ROOT/seeds.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from absl import app
from absl import flags

_SEEDS = flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds to run.")
_ROOT = flags.DEFINE_string(
    "root", "runs/seeds", "Parent folder of the workdirs."
)
_CONFIG = flags.DEFINE_string("config", "configs/default.py", "Config file.")

ROWS = (
    ("accuracy", "greedy acc"),
    ("accuracy_hard", "greedy acc (hard)"),
    ("accuracy_easy", "greedy acc (easy)"),
    ("pass@1", "pass@1 (T=1)"),
    ("tool_calls", "tool calls/ep"),
    ("tool_calls_hard", "tool calls/ep (hard)"),
    ("tool_calls_easy", "tool calls/ep (easy)"),
    ("format_error_rate", "format errors"),
)


def main(argv):
  del argv
  repo = os.path.dirname(
      os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  )
  lines = [
      "| seed | wall (s) | "
      + " | ".join(f"{label} SFT -> RL" for _, label in ROWS)
      + " |",
      "|---" * (len(ROWS) + 2) + "|",
  ]
  for seed in _SEEDS.value:
    workdir = os.path.join(_ROOT.value, f"seed_{seed}")
    t0 = time.time()
    subprocess.run(
        [
            sys.executable,
            os.path.join(repo, "main.py"),
            f"--config={_CONFIG.value}",
            f"--config.seed={seed}",
            f"--workdir={workdir}",
            # The recorded seeds ran on one XLA CPU device (main.py's
            # automatic count came later); a resumed seed stays on it.
            "--config.mesh.cpu_devices=1",
        ],
        check=True,
        cwd=repo,
    )
    wall = time.time() - t0
    with open(os.path.join(repo, workdir, "eval_report.json")) as f:
      rep = json.load(f)["reports"]
    cells = [f"{rep['sft'][k]:.3f} -> {rep['rl'][k]:.3f}" for k, _ in ROWS]
    lines.append(f"| {seed} | {wall:.0f} | " + " | ".join(cells) + " |")
  table = "\n".join(lines)
  print(table)
  with open(os.path.join(repo, _ROOT.value, "seeds.md"), "w") as f:
    f.write(table + "\n")


if __name__ == "__main__":
  app.run(main)
