"""Runs the OTC-PO reproduction: seeds x {correct, otc}, shared SFT per seed.

  python -m experiments.otc_efficiency.run [--seeds=0,1,2] [--smoke]

For each seed, SFT runs once (rl.steps=0) into ROOT/seed_S/sft; each arm's workdir
starts as a copy of it and resumes into GRPO, so both arms start from the identical
SFT checkpoint. Writes results.md (mean +- standard error and all seeds) and
results.png into this folder (or ROOT for --smoke).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

from absl import app
from absl import flags
import numpy as np

_SEEDS = flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds.")
_ROOT = flags.DEFINE_string("root", "runs/otc_efficiency", "Parent of the workdirs.")
_SMOKE = flags.DEFINE_bool("smoke", False, "Shrunk version (CI).")

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
ARMS = ("correct", "otc")
METRICS = (
    ("accuracy", "accuracy"),
    ("accuracy_hard", "acc. hard"),
    ("accuracy_easy", "acc. easy"),
    ("tool_calls", "calls/ep"),
    ("tool_calls_easy", "calls/ep easy"),
    ("tool_calls_hard", "calls/ep hard"),
    ("tool_productivity", "tool productivity"),
)


def _main_py(arm: str, seed: str, workdir: str, extra=()):
  size = ",smoke" if _SMOKE.value else ""
  cmd = [sys.executable, os.path.join(REPO, "main.py"),
         f"--config={os.path.join(HERE, 'config.py')}:{arm}{size}",
         f"--config.seed={seed}", f"--workdir={workdir}", *extra]
  subprocess.run(cmd, check=True, cwd=REPO)


def main(argv):
  del argv
  root = os.path.join(REPO, _ROOT.value)
  out_dir = root if _SMOKE.value else HERE
  results = {arm: [] for arm in ("sft",) + ARMS}
  t0 = time.time()
  for seed in _SEEDS.value:
    sft_dir = os.path.join(root, f"seed_{seed}", "sft")
    _main_py("correct", seed, sft_dir, ["--config.rl.steps=0"])
    with open(os.path.join(sft_dir, "eval_sft.json")) as f:
      results["sft"].append(json.load(f))
    for arm in ARMS:
      arm_dir = os.path.join(root, f"seed_{seed}", arm)
      if not os.path.exists(arm_dir):
        shutil.copytree(sft_dir, arm_dir)
        for name in ("eval_report.json", "eval_report.md", "config.json"):
          if os.path.exists(os.path.join(arm_dir, name)):
            os.remove(os.path.join(arm_dir, name))
      _main_py(arm, seed, arm_dir)
      with open(os.path.join(arm_dir, "eval_report.json")) as f:
        results[arm].append(json.load(f)["reports"]["rl"])
  wall = time.time() - t0

  def cell(vals):
    v = np.asarray(vals, np.float64)
    se = v.std(ddof=1) / np.sqrt(len(v)) if len(v) > 1 else 0.0
    return f"{v.mean():.3f} +- {se:.3f}"

  lines = ["| checkpoint | " + " | ".join(lbl for _, lbl in METRICS) + " |",
           "|---" * (len(METRICS) + 1) + "|"]
  for arm in ("sft",) + ARMS:
    name = {"sft": "SFT (start)", "correct": "GRPO, correctness", "otc": "GRPO, OTC"}[arm]
    lines.append(f"| {name} | " + " | ".join(
        cell([r[k] for r in results[arm]]) for k, _ in METRICS) + " |")
  lines.append("")
  lines.append("Per seed (accuracy / calls per episode / tool productivity):")
  lines.append("")
  for i, seed in enumerate(_SEEDS.value):
    parts = [f"{arm}: {results[arm][i]['accuracy']:.3f} / "
             f"{results[arm][i]['tool_calls']:.3f} / "
             f"{results[arm][i]['tool_productivity']:.3f}" for arm in ("sft",) + ARMS]
    lines.append(f"- seed {seed}: " + "; ".join(parts))
  lines.append("")
  lines.append(f"Total wall time: {wall:.0f} s for {len(_SEEDS.value)} seeds.")
  table = "\n".join(lines)
  print(table)
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, "results.md"), "w") as f:
    f.write(table + "\n")

  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  keys = ("accuracy", "tool_calls_easy", "tool_calls_hard", "tool_productivity")
  fig, axes = plt.subplots(1, len(keys), figsize=(4 * len(keys), 3.2))
  for ax, k in zip(axes, keys):
    for j, arm in enumerate(("sft",) + ARMS):
      v = np.asarray([r[k] for r in results[arm]])
      ax.bar(j, v.mean(), yerr=v.std(ddof=1) / np.sqrt(len(v)) if len(v) > 1 else 0,
             color=("0.6", "tab:blue", "tab:orange")[j])
      ax.scatter(np.full(len(v), j), v, color="k", s=8, zorder=3)
    ax.set_xticks(range(3), ["SFT", "GRPO\ncorrect", "GRPO\nOTC"])
    ax.set_title(k)
  fig.tight_layout()
  fig.savefig(os.path.join(out_dir, "results.png"), dpi=110)


if __name__ == "__main__":
  app.run(main)
