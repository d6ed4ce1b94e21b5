"""Outcome vs process reward models at best-of-8 selection, on two tasks.

  python -m experiments.rm_selection [--tasks=arithmetic,kv_chain]
      [--seeds=0,1,...] [--smoke] [--root=DIR] [--reanalyse]

Per task and seed, one rm-mode run (agentic_rl/rm_train.py: SFT policy,
preference pairs, outcome and process RM, held-out pairwise accuracy and
best-of-N rank@1) in ROOT/<task>/seed_<k> (default ROOT runs/rm_selection
[_smoke]; a re-run resumes, and a workdir holding a different config is refused
as in main.py). The seed is the config's `seed` (SFT, pair sampling, RM
initialisation and batches); the best-of-N evaluation tasks are fixed
(`rm_eval.seed`), so the seeds are paired on the same tasks.

The first seed's report becomes this folder's results{,_kv}.md / .png (under
ROOT with --smoke): the Markdown table and the plot are rm_train's own.
results{,_kv}.json is that report plus the commit, the config hash, the seeds,
the wall time, every seed's best-of-N summary (`per_seed`), the room metric
(best-of-8 oracle - random accuracy of the SFT policy's samples, mean over
seeds) and the declared claim's analysis: process - outcome RM rank@1 accuracy
paired over seeds with a 95% t interval (2 or more seeds; one seed gives no
interval and no verdict). Nothing is copied by hand. --reanalyse recomputes
the room metric and the analysis from the stored results{,_kv}.json without
training (for a results file written before they existed).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import time

from agentic_rl import metrics
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
# best-of-8 accuracy (in the report). The verdict pairs the two RMs' rank@1
# accuracy by training seed (--seeds); one seed forms no interval.
SPEC = stats.ClaimSpec(
    primary_metric="best_of_n.prm.rank1_accuracy",
    higher_is_better=True,
    room_metric="best-of-8 oracle - random accuracy",
    room_threshold=0.2,
    treatment="process RM",
    control="outcome RM",
    prediction="better",
    metric_range=(0.0, 1.0),
    claim="a process reward model selects correct episodes at best-of-8 more "
    "often than an outcome reward model",
    paper="ToolComp",
    departures=(
        "tiny transformer reward models trained from scratch",
        "synthetic arithmetic and key-value tasks",
        "64 best-of-8 tasks",
    ),
    positive_control="oracle selection (reported as oracle_accuracy)",
)
# Second declared claim, on key-value chains (results_kv.*; declared
# 2026-12-06 before its first decision run, none of whose per-seed numbers had
# been read). On arithmetic both RMs pick worse than a random sample (README),
# so a difference between them says little about selection; a comparison of
# two selectors means something only where selection works at all. The
# positive-control check asks exactly that, in the same decision run: the
# outcome RM's rank@1 accuracy beats a random pick's, paired over seeds. A
# 'contradicted' verdict (process RM worse) then counts only with a working
# selector; a 'supported' one puts the process RM above a selector that beats
# random. The random pick's accuracy per seed is the report's
# random_accuracy (the expected accuracy of a uniform pick of the 8).
SPEC_KV = dataclasses.replace(
    SPEC,
    claim="on key-value chains, where an outcome reward model picks better "
    "than a random sample, a process reward model selects correct episodes "
    "at best-of-8 more often than the outcome reward model",
    departures=(
        "tiny transformer reward models trained from scratch",
        "synthetic key-value chains (1-3 hops, 4 distractor keys)",
        "64 best-of-8 tasks",
        "declared after a one-seed kv run of 2026-11-30 (seed 0, results "
        "then in results_kv.*) had been read",
        "decided on seeds 8-15, a replication declared on 2026-12-06 after "
        "the seeds 0-7 decision run had been read (kept in the ledger)",
    ),
    positive_control="outcome RM rank@1 beats a random pick (paired over "
    "seeds, same decision run)",
    positive_control_check=stats.Part(
        SPEC.primary_metric,
        "better",
        treatment="outcome RM",
        control="random pick",
        metric_range=(0.0, 1.0),
    ),
)
# task -> (config module, suffix of the output files in this folder, spec).
TASKS = {
    "arithmetic": (rm_arithmetic, "", SPEC),
    "kv_chain": (rm_kv_chain, "_kv", SPEC_KV),
}
# Arm labels -> the key of seed_summary's dict ('random pick' only where a
# spec's control check uses it).
ARMS = {SPEC.treatment: "prm_rank1", SPEC.control: "orm_rank1"}
RANDOM_ARM = "random pick"
NOT_DECIDED = "not decided (one seed: no interval)"
# results.md: the rm report, then this line, then the per-seed analysis.
MD_MARKER = "<!-- per-seed analysis: python -m experiments.rm_selection -->"


def seed_summary(report: dict) -> dict:
  """One seed's best-of-N numbers from an rm report.

  Args:
    report: rm_train.train_and_evaluate_rm's dict (needs 'best_of_n' with
      'orm' and 'prm' entries holding 'rank1_accuracy', 'random_accuracy',
      'oracle_accuracy').

  Returns:
    dict with 'orm_rank1', 'prm_rank1', 'random', 'oracle' (accuracies in
    [0, 1]) and 'room' = oracle - random.
  """
  bon = report["best_of_n"]
  oracle = float(bon["prm"]["oracle_accuracy"])
  random = float(bon["prm"]["random_accuracy"])
  return {
      "orm_rank1": float(bon["orm"]["rank1_accuracy"]),
      "prm_rank1": float(bon["prm"]["rank1_accuracy"]),
      "random": random,
      "oracle": oracle,
      "room": oracle - random,
  }


def rows_of(per_seed: list[dict], spec: stats.ClaimSpec = SPEC) -> dict:
  """spec's arm labels -> per-seed rows {primary_metric: rank@1 accuracy};
  with a control check against RANDOM_ARM, that arm's rows hold the random
  pick's accuracy under the same key."""
  keys = dict(ARMS)
  check = spec.positive_control_check
  if check is not None and RANDOM_ARM in (check.treatment, check.control):
    keys[RANDOM_ARM] = "random"
  return {
      arm: [{spec.primary_metric: s[key]} for s in per_seed]
      for arm, key in keys.items()
  }


def analyse(
    per_seed: list[dict], spec: stats.ClaimSpec = SPEC
) -> tuple[dict, dict]:
  """The room record and spec's analysis from per-seed summaries.

  Args:
    per_seed: seed_summary dicts, one per seed (same evaluation tasks).
    spec: the task's declared claim (TASKS).

  Returns:
    (room, analysis): room = {'metric', 'value' (mean over seeds),
    'threshold', 'per_seed'}; analysis = stats.analyse's dict (2 or more
    seeds), or the same keys with effect None and verdict NOT_DECIDED (one
    seed) or 'untestable at this setup' (a seed's room below the threshold).
  """
  room_value = float(sum(s["room"] for s in per_seed) / len(per_seed))
  room_per_seed = [s["room"] for s in per_seed]
  room = {
      "metric": spec.room_metric,
      "value": room_value,
      "threshold": spec.room_threshold,
      "per_seed": room_per_seed,
  }
  # Every seed must leave room (stats.room_record).
  room_ok = stats.room_record(spec, room_per_seed)["ok"]
  if len(per_seed) >= 2:
    return room, stats.analyse(spec, rows_of(per_seed, spec), room_per_seed)
  if not room_ok:  # 'untestable at this setup'
    analysis = stats.analyse(spec, {}, room_per_seed)
    return room, dict(analysis, effect_note="no room")
  analysis = stats.room_only_analysis(spec, room_per_seed)
  return room, dict(analysis, verdict=NOT_DECIDED, effect_note="one seed")


def _annotate(out: dict, spec: stats.ClaimSpec = SPEC) -> dict:
  """out plus 'spec', 'room', 'analysis' (from out['per_seed'])."""
  room, analysis = analyse(out["per_seed"], spec)
  return dict(out, spec=spec.to_json(), room=room, analysis=analysis)


def seed_workdir(root: str, task: str, seed: int) -> str:
  """ROOT/<task>/seed_<seed>; a workdir ROOT/<task> of the single-seed layout
  (before --seeds) is reused for the seed its config.json holds."""
  legacy = os.path.abspath(os.path.join(root, task))
  path = os.path.join(legacy, "config.json")
  if os.path.exists(path):
    try:
      with open(path) as f:
        saved = json.load(f).get("seed")
    except ValueError:  # unreadable: not reused (the resume check reports it)
      saved = None
    if saved is not None and int(saved) == seed:
      return legacy
  return os.path.join(legacy, f"seed_{seed}")


def run_task(
    task: str, smoke: bool, root: str, out_dir: str, seeds=(0,)
) -> dict:
  """Runs (or resumes) one task's rm-mode runs and writes its results files.

  Args:
    task: a key of TASKS.
    smoke: the config's shrunk 'smoke' variant.
    root: parent of the workdirs ROOT/<task>/seed_<k>.
    out_dir: where results{suffix}.json / .md / .png go.
    seeds: training seeds (config.seed), the first one's report is the table.

  Returns:
    results.json's dict (the first seed's rm report plus commit, config_hash,
    seeds, wall_s, per_seed, spec, room, analysis).

  Raises:
    validation.ConfigError: a workdir holds a run of a different config.
  """
  module, suffix, spec = TASKS[task]
  configs = []
  for seed in seeds:
    config = module.get_config("smoke" if smoke else None)
    config.seed = int(seed)
    workdir = seed_workdir(root, task, int(seed))
    # Refuse every changed workdir before any training.
    train._check_resume_compatible(config, workdir)  # pylint: disable=protected-access
    configs.append((config, workdir))
  t0 = time.time()
  reports = []
  for config, workdir in configs:
    reports.append(rm_train.train_and_evaluate_rm(config, workdir))
  wall = time.time() - t0
  config, workdir = configs[0]
  os.makedirs(out_dir, exist_ok=True)
  out = dict(
      reports[0],
      commit=harness.git_commit(),
      config=config.name,
      config_hash=seeds_lib.config_hash(config),
      seeds=[int(s) for s in seeds],
      wall_s=wall,
      per_seed=[seed_summary(r) for r in reports],
      command="python -m experiments.rm_selection"
      + (f" --tasks={task}" if task != "arithmetic" else "")
      + (f" --seeds={','.join(map(str, seeds))}" if list(seeds) != [0] else "")
      + (" --smoke" if smoke else ""),
  )
  out = _annotate(out, spec)
  out["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t0))
  path = os.path.join(out_dir, f"results{suffix}.json")
  if harness._is_decision(out):  # pylint: disable=protected-access
    out["ledger"] = harness.carry_ledger(path, harness.ledger_entry(out))
  metrics.write_strict_json(path, out)
  with open(os.path.join(workdir, "rm_report.md")) as f:
    md = f.read()
  md += (
      f"\nSeeds {out['seeds']} (the table: seed {config.seed}); wall time of "
      f"this call {wall:.0f} s (0 work when resumed on finished workdirs); "
      f"commit {out['commit']}; config hash {out['config_hash']}.\n\n"
      + _per_seed_md(out, spec)
  )
  with open(os.path.join(out_dir, f"results{suffix}.md"), "w") as f:
    f.write(md)
  png = os.path.join(workdir, "rm_report.png")
  if os.path.exists(png):
    shutil.copyfile(png, os.path.join(out_dir, f"results{suffix}.png"))
  return out


def _per_seed_md(out: dict, spec: stats.ClaimSpec = SPEC) -> str:
  """Markdown: every seed's best-of-N numbers and the claim's analysis."""
  lines = [
      "| seed | outcome RM rank@1 | process RM rank@1 | random pick | "
      "oracle (pass@N) | room (oracle - random) |",
      "|---|---|---|---|---|---|",
  ]
  for seed, s in zip(out["seeds"], out["per_seed"]):
    lines.append(
        f"| {seed} | {s['orm_rank1']:.3f} | {s['prm_rank1']:.3f} | "
        f"{s['random']:.3f} | {s['oracle']:.3f} | {s['room']:.3f} |"
    )
  a = out["analysis"]
  if a["effect"] is None:
    tail = (
        f"Room metric `{spec.room_metric}` = {out['room']['value']:.3f} "
        f"(threshold {spec.room_threshold:g}). "
        + (
            "One training seed forms no interval. Run with --seeds=0,1,... "
            "to decide."
            if a["verdict"] == NOT_DECIDED
            else "Below the threshold: selection cannot matter here."
        )
        + f" **Verdict: {a['verdict']}.**"
    )
  else:
    tail = stats.format_analysis(a)
  return MD_MARKER + "\n\n" + "\n".join(lines) + "\n\n" + tail + "\n"


def reanalyse(out_dir: str, suffix: str) -> dict:
  """Recomputes per_seed (from the stored report when absent), spec, room and
  analysis of out_dir/results{suffix}.json and rewrites it, and the per-seed
  section of results{suffix}.md (after MD_MARKER; the report above it stays).

  Raises:
    FileNotFoundError: no such results file.
  """
  task_entry = [v for v in TASKS.values() if v[1] == suffix][0]
  path = os.path.join(out_dir, f"results{suffix}.json")
  with open(path) as f:
    out = json.load(f)
  if "per_seed" not in out:  # written before per_seed existed: one seed,
    # the config's own (the runner did not change it then)
    module = task_entry[0]
    out.setdefault("seeds", [int(module.get_config().seed)])
    out["per_seed"] = [seed_summary(out)]
  out = _annotate(out, task_entry[2])
  metrics.write_strict_json(path, out)
  md_path = os.path.join(out_dir, f"results{suffix}.md")
  if os.path.exists(md_path):
    with open(md_path) as f:
      md = f.read().split(MD_MARKER)[0].rstrip("\n")
    md += "\n\n" + _per_seed_md(out, task_entry[2])
    with open(md_path, "w") as f:
      f.write(md)
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
  p.add_argument(
      "--seeds",
      default="0",
      help="training seeds (default 0; fewer than 6 write their results "
      "under --root, not over the recorded ones)",
  )
  p.add_argument("--smoke", action="store_true", help="shrunk version (CI)")
  p.add_argument(
      "--root", default=None, help="default runs/rm_selection[_smoke]"
  )
  p.add_argument(
      "--reanalyse",
      action="store_true",
      help="recompute room and analysis of the stored results files only",
  )
  args = p.parse_args(argv)
  tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
  for t in tasks:
    if t not in TASKS:
      p.error(f"--tasks: unknown task {t!r}; known: {list(TASKS)}")
  try:
    seeds = harness.parse_seeds(args.seeds)
  except harness.UsageError as e:
    p.error(str(e))
  root = args.root or os.path.join(
      harness.REPO, "runs", "rm_selection" + ("_smoke" if args.smoke else "")
  )
  if args.reanalyse:  # the stored results files, where they are
    out_dir = root if args.smoke else HERE
  else:
    out_dir, decision = harness.results_dir(args.smoke, seeds, root, HERE)
    if decision:
      try:  # a decision run records the commit that ran
        harness.require_clean_tree()
      except harness.UsageError as e:
        p.error(str(e))
  for t in tasks:
    if args.reanalyse:
      reanalyse(out_dir, TASKS[t][1])
    else:
      run_task(t, args.smoke, root, out_dir, seeds)


if __name__ == "__main__":
  main(sys.argv[1:])
