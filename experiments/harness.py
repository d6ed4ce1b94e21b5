"""Shared runner of the claim reproductions: arms x seeds -> table + plot.

A claim folder defines `ARMS` (arm name -> config, via its `config.py`) and calls
`run_claim`. Per arm, every seed trains in one vmapped program
(`experiments.seeds.train_seeds`). Arms whose SFT phase is identical (same model,
environment, SFT settings, context length) share one SFT run: it is trained once
(rl.steps = 0) and each arm's workdir starts from a copy of its checkpoint, so the
arms differ only in what the claim varies.

Outputs in `out_dir`: `results.md` (per metric mean +- standard error over seeds,
then every seed's value), `results.json` (all numbers), `results.png` (bars per
arm with the seeds as dots, and RL learning curves mean +- standard error).
Workdirs live under `root` and make a re-run resume instead of restarting.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from typing import Callable, Mapping, Sequence

import ml_collections
import numpy as np

from experiments import seeds as seeds_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _sft_key(config: ml_collections.ConfigDict) -> str:
  blob = json.dumps({k: config[k].to_dict() if hasattr(config[k], "to_dict")
                     else config[k] for k in ("model", "env", "sft", "max_len")},
                    sort_keys=True, default=str)
  return hashlib.sha1(blob.encode()).hexdigest()[:10]


def mean_se(values: Sequence[float]) -> tuple[float, float]:
  """Mean and standard error (sample std / sqrt(n); 0 for one value)."""
  v = np.asarray(values, np.float64)
  se = float(v.std(ddof=1) / np.sqrt(len(v))) if len(v) > 1 else 0.0
  return float(v.mean()), se


def run_claim(
    title: str,
    arms: Mapping[str, ml_collections.ConfigDict],
    seeds: Sequence[int],
    *,
    root: str,
    out_dir: str,
    metrics: Sequence[tuple[str, str]],
    curve_keys: Sequence[str] = ("rl/accuracy", "rl/tool_calls"),
    extra_eval: Callable | None = None,
    include_sft_row: bool = True,
    curve_means: Sequence[tuple[str, str, int, int]] = (),
) -> dict:
  """Trains every arm for every seed and writes the claim's table and plot.

  Args:
    title: heading of results.md.
    arms: arm label -> experiment config (its `seed` is ignored).
    seeds: seeds, shared by every arm.
    root: parent of the workdirs (resumable).
    out_dir: where results.md / .json / .png go.
    metrics: (key, column label) of held-out metrics (train.evaluate keys, or
      keys added by `extra_eval`).
    curve_keys: per-step training metrics plotted over RL iterations.
    extra_eval: optional fn(config, params_of_one_seed) -> dict of extra held-out
      metrics, run on the final policy of every seed (and of the SFT start).
    include_sft_row: add the shared SFT start as the first row.
    curve_means: (new metric key, curve key, first, last) adds to each arm's
      per-seed row the mean of a training curve over RL iterations
      [first, last) (e.g. early-learning speed); list the key in `metrics`.

  Returns:
    {'rows': {row label: [per-seed metric dicts]}, 'curves': {arm: {key:
    [steps, S]}}, 'wall_s': {arm: seconds}}.
  """
  os.makedirs(root, exist_ok=True)
  sft_dirs: dict[str, str] = {}
  rows: dict[str, list[dict]] = {}
  curves: dict[str, dict] = {}
  walls: dict[str, float] = {}
  for arm, config in arms.items():
    key = _sft_key(config)
    if key not in sft_dirs:
      sft_dir = os.path.join(root, f"sft_{key}")
      c = ml_collections.ConfigDict(config.to_dict())
      c.rl.steps = 0
      t0 = time.time()
      out = seeds_lib.train_seeds(c, seeds, sft_dir)
      walls[f"sft_{key}"] = time.time() - t0
      sft_dirs[key] = sft_dir
      if include_sft_row and "SFT (start)" not in rows:
        rows["SFT (start)"] = _with_extra(out, "sft", extra_eval, config, seeds)
    arm_dir = os.path.join(root, arm)
    if not os.path.exists(arm_dir):
      shutil.copytree(sft_dirs[key], arm_dir,
                      ignore=shutil.ignore_patterns("seed_*"))
    t0 = time.time()
    out = seeds_lib.train_seeds(config, seeds, arm_dir)
    walls[arm] = time.time() - t0
    rows[arm] = _with_extra(out, "rl", extra_eval, config, seeds)
    for new_key, curve_key, first, last in curve_means:
      c = np.asarray(out["curves"].get(curve_key, np.full((1, len(seeds)), np.nan)))
      per_seed = c[first:last].mean(0)
      rows[arm] = [dict(r, **{new_key: float(v)}) for r, v in zip(rows[arm], per_seed)]
    curves[arm] = out["curves"]
  _write(title, rows, curves, seeds, out_dir, metrics, curve_keys, walls)
  return {"rows": rows, "curves": curves, "wall_s": walls}


def _with_extra(out, which, extra_eval, config, seeds):
  # With rl.steps = 0 (the shared SFT run) the final params are the SFT policy.
  reports = out[which]
  if extra_eval is None:
    return reports
  params = seeds_lib.unstack(out["params"], len(seeds))
  return [dict(r, **extra_eval(config, p)) for r, p in zip(reports, params)]


def _write(title, rows, curves, seeds, out_dir, metrics, curve_keys, walls):
  os.makedirs(out_dir, exist_ok=True)
  lines = [f"# {title}", "",
           "| arm | " + " | ".join(lbl for _, lbl in metrics) + " |",
           "|---" * (len(metrics) + 1) + "|"]
  for label, reps in rows.items():
    cells = []
    for k, _ in metrics:
      m, se = mean_se([r.get(k, np.nan) for r in reps])
      cells.append(f"{m:.3f} +- {se:.3f}")
    lines.append(f"| {label} | " + " | ".join(cells) + " |")
  lines += ["", f"Mean +- standard error over seeds {list(seeds)}. Every seed:", ""]
  for label, reps in rows.items():
    per = "; ".join(
        f"{lbl} " + "/".join(f"{r.get(k, np.nan):.3f}" for r in reps)
        for k, lbl in metrics)
    lines.append(f"- {label}: {per}")
  lines += ["", "Wall time (s, training incl. compilation, all seeds vmapped): " +
            ", ".join(f"{k} {v:.0f}" for k, v in walls.items()), ""]
  with open(os.path.join(out_dir, "results.md"), "w") as f:
    f.write("\n".join(lines))
  with open(os.path.join(out_dir, "results.json"), "w") as f:
    json.dump({"seeds": list(seeds), "rows": rows, "wall_s": walls}, f, indent=2,
              default=float)
  print("\n".join(lines))

  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  n = len(metrics) + len(curve_keys)
  fig, axes = plt.subplots(1, n, figsize=(3.6 * n, 3.3))
  labels = list(rows)
  colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  for ax, (k, lbl) in zip(axes, metrics):
    for j, label in enumerate(labels):
      v = np.asarray([r.get(k, np.nan) for r in rows[label]], np.float64)
      m, se = mean_se(v)
      ax.bar(j, m, yerr=se, color=colors[j % len(colors)], alpha=0.8)
      ax.scatter(np.full(len(v), j), v, color="k", s=8, zorder=3)
    ax.set_xticks(range(len(labels)), labels, rotation=35, ha="right", fontsize=7)
    ax.set_title(lbl, fontsize=9)
  for ax, k in zip(axes[len(metrics):], curve_keys):
    for j, arm in enumerate(curves):
      if k not in curves[arm]:
        continue
      c = np.asarray(curves[arm][k], np.float64)
      x = np.arange(1, len(c) + 1)
      m = c.mean(1)
      se = c.std(1, ddof=1) / np.sqrt(c.shape[1]) if c.shape[1] > 1 else 0 * m
      color = colors[(labels.index(arm) if arm in labels else j) % len(colors)]
      ax.plot(x, m, color=color, label=arm)
      ax.fill_between(x, m - se, m + se, color=color, alpha=0.2)
    ax.set_title(k, fontsize=9)
    ax.set_xlabel("RL iteration", fontsize=8)
    ax.legend(fontsize=6)
  fig.suptitle(title, fontsize=10)
  fig.tight_layout()
  fig.savefig(os.path.join(out_dir, "results.png"), dpi=110)
  plt.close(fig)


def cli(argv: Sequence[str], *, here: str, title: str,
        arms_fn: Callable[[bool], Mapping[str, ml_collections.ConfigDict]],
        default_seeds: str = "0,1,2", **run_kwargs) -> dict:
  """Command line of a claim folder (`python -m experiments.NAME [--smoke]`).

  Flags: --seeds=0,1,2, --smoke (shrunk arms, 2 seeds, outputs under ROOT so the
  committed results stay untouched), --root=DIR (default runs/<folder name>).
  """
  import argparse  # pylint: disable=g-import-not-at-top
  name = os.path.basename(here)
  p = argparse.ArgumentParser(prog=f"python -m experiments.{name}",
                              description=title)
  p.add_argument("--seeds", default=None, help=f"default {default_seeds}")
  p.add_argument("--smoke", action="store_true", help="shrunk version (CI)")
  p.add_argument("--root", default=None, help=f"default runs/{name}[_smoke]")
  args = p.parse_args(list(argv))
  seeds_str = args.seeds or ("0,1" if args.smoke else default_seeds)
  try:
    seeds = [int(s) for s in seeds_str.split(",") if s.strip()]
  except ValueError as e:
    raise ValueError(f"--seeds must be comma-separated integers, got {seeds_str!r}") from e
  root = args.root or os.path.join(REPO, "runs", name + ("_smoke" if args.smoke else ""))
  out_dir = root if args.smoke else here
  return run_claim(title, arms_fn(args.smoke), seeds, root=root, out_dir=out_dir,
                   **run_kwargs)
