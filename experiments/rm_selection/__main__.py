"""Outcome vs process reward models at best-of-8 selection, on two tasks.

  python -m experiments.rm_selection [--tasks=arithmetic,kv_chain] [--smoke]
      [--root=DIR]

Per task, one rm-mode run (agentic_rl/rm_train.py: SFT policy, preference
pairs, outcome and process RM, held-out pairwise accuracy and best-of-N rank@1)
in ROOT/<task> (default ROOT runs/rm_selection[_smoke]; a re-run resumes, and a
workdir holding a different config is refused as in main.py). The run's report
becomes this folder's results{,_kv}.md / .json / .png (under ROOT with
--smoke): the Markdown table and the plot are rm_train's own, results.json is
its report plus the commit, the config hash, the seed and the wall time. Nothing
is copied by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

from agentic_rl import rm_train
from agentic_rl import train
from configs import rm_arithmetic
from configs import rm_kv_chain
from experiments import harness
from experiments import seeds as seeds_lib
from experiments import stats

HERE = os.path.dirname(os.path.abspath(__file__))
# Declared claim (summary table). Selection can only matter where a task's 8
# samples mix correct and incorrect ones: the room metric is oracle - random
# best-of-8 accuracy (in the report). The runner trains one seed per task and
# keeps no per-task selections, so no paired interval or verdict is formed.
SPEC = stats.ClaimSpec(
    primary_metric="best_of_n.prm.rank1_accuracy",
    higher_is_better=True,
    room_metric="best-of-8 oracle - random accuracy",
    room_threshold=0.2,
    treatment="process RM",
    control="outcome RM",
    prediction="better",
    claim="a process reward model selects correct episodes at best-of-8 more "
    "often than an outcome reward model",
    paper="ToolComp",
    departures=(
        "tiny transformer reward models trained from scratch",
        "synthetic arithmetic and key-value tasks",
        "one seed, 64 tasks",
    ),
    positive_control="oracle selection (reported as oracle_accuracy)",
)
# task -> (config module, suffix of the output files in this folder).
TASKS = {"arithmetic": (rm_arithmetic, ""), "kv_chain": (rm_kv_chain, "_kv")}


def run_task(task: str, smoke: bool, root: str, out_dir: str) -> dict:
  """Runs (or resumes) one task's rm-mode run and writes its results files.

  Returns:
    results.json's dict (the rm report plus commit, config_hash, seeds, wall_s).

  Raises:
    validation.ConfigError: the workdir holds a run of a different config.
  """
  module, suffix = TASKS[task]
  config = module.get_config("smoke" if smoke else None)
  workdir = os.path.abspath(os.path.join(root, task))
  train._check_resume_compatible(config, workdir)  # pylint: disable=protected-access
  t0 = time.time()
  report = rm_train.train_and_evaluate_rm(config, workdir)
  wall = time.time() - t0
  os.makedirs(out_dir, exist_ok=True)
  out = dict(
      report,
      commit=harness.git_commit(),
      config=config.name,
      config_hash=seeds_lib.config_hash(config),
      seeds=[int(config.seed)],
      wall_s=wall,
  )
  with open(os.path.join(out_dir, f"results{suffix}.json"), "w") as f:
    json.dump(out, f, indent=2)
  with open(os.path.join(workdir, "rm_report.md")) as f:
    md = f.read()
  md += (
      f"\nSeed {config.seed}; wall time of this call {wall:.0f} s (0 work when "
      f"resumed on a finished workdir); commit {out['commit']}; config hash "
      f"{out['config_hash']}.\n"
  )
  with open(os.path.join(out_dir, f"results{suffix}.md"), "w") as f:
    f.write(md)
  png = os.path.join(workdir, "rm_report.png")
  if os.path.exists(png):
    shutil.copyfile(png, os.path.join(out_dir, f"results{suffix}.png"))
  return out


def main(argv) -> None:
  p = argparse.ArgumentParser(
      prog="python -m experiments.rm_selection",
      description=__doc__.splitlines()[0],
  )
  p.add_argument(
      "--tasks",
      default=",".join(TASKS),
      help=f"comma-separated subset of {list(TASKS)}",
  )
  p.add_argument("--smoke", action="store_true", help="shrunk version (CI)")
  p.add_argument(
      "--root", default=None, help="default runs/rm_selection[_smoke]"
  )
  args = p.parse_args(argv)
  tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
  for t in tasks:
    if t not in TASKS:
      p.error(f"--tasks: unknown task {t!r}; known: {list(TASKS)}")
  root = args.root or os.path.join(
      harness.REPO, "runs", "rm_selection" + ("_smoke" if args.smoke else "")
  )
  out_dir = root if args.smoke else HERE
  for t in tasks:
    run_task(t, args.smoke, root, out_dir)


if __name__ == "__main__":
  main(sys.argv[1:])
