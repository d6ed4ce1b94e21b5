"""Summary of the dark-room arms' RL training curves read from their workdirs.

Part of `python -m experiments.dark_room` (written after the held-out table);
alone, on existing workdirs:

    python -m experiments.dark_room.curves_summary --root=runs/dark_room [--seeds=0,...,7]

Reads `<root>/<arm>_<seeds tag>/curves.npz` (`harness.run_dir` of --seeds;
without --seeds the untagged `<root>/<arm>` of runs made before the tag; written with every checkpoint by
agentic_rl/seeds.py; metrics of the training batches, sampled at T = 1) and
writes `curves_summary.md` / `.png` (into this folder, or --out_dir): per arm the
mean +- standard error over seeds (and every seed) of the first and last 5 RL
iterations available in all arms.
"""

import argparse
import os

import numpy as np

from experiments import harness
from experiments.dark_room import config

KEYS = (
    ("rl/accuracy", "accuracy"),
    ("rl/horizon_rate", "horizon share"),
    ("rl/turns", "turns/ep"),
    ("rl/obs_pred_acc", "obs. pred. acc."),
    ("rl/obs_pred_prob", "obs. pred. prob."),
)


def write_summary(root: str, out_dir: str, seeds=None) -> None:
  """Writes curves_summary.md / .png into out_dir from the arms' workdirs in root.

  Raises:
    ValueError: no arm in root has RL curves yet.
  """
  curves = {}
  for arm in config.ARMS:
    arm_dir = (
        harness.run_dir(root, arm, seeds) if seeds else os.path.join(root, arm)
    )
    path = os.path.join(arm_dir, "curves.npz")
    if os.path.exists(path):
      with np.load(path) as f:
        c = {k: f[k] for k in f.files if k.startswith("rl/")}
      if "rl/num_turns" in c:  # the same metric, under its name before 2026-12
        c.setdefault("rl/turns", c.pop("rl/num_turns"))
      if c:  # arms still before their first RL checkpoint are left out
        curves[arm] = c
  if not curves:
    raise ValueError(
        f"curves_summary: no <arm>/curves.npz with RL curves under {root}"
    )
  n = min(len(c["rl/accuracy"]) for c in curves.values())
  k5 = min(5, n)  # iterations per window (fewer in a smoke run)
  lines = [
      f"# Dark room: RL training batches, iterations 1-{n} (T = 1)",
      "",
      "| arm | "
      + " | ".join(
          f"{lbl} it. 1-{k5} | {lbl} it. {n - k5 + 1}-{n}" for _, lbl in KEYS
      )
      + " |",
      "|---" * (2 * len(KEYS) + 1) + "|",
  ]
  per_seed = []
  for arm, c in curves.items():
    cells, seeds_txt = [], []
    for k, lbl in KEYS:
      for a, b in ((0, k5), (n - k5, n)):
        v = c[k][a:b].mean(0)
        m, se = harness.mean_se(v)
        cells.append(f"{m:.3f} +- {se:.3f}")
      seeds_txt.append(
          f"{lbl} (last {k5}) "
          + "/".join(f"{x:.3f}" for x in c[k][n - k5 : n].mean(0))
      )
    lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    per_seed.append(f"- {arm}: " + "; ".join(seeds_txt))
  n_seeds = next(iter(curves.values()))["rl/accuracy"].shape[1]
  seed_label = (
      f"seeds {', '.join(str(s) for s in seeds)}"
      if seeds
      else f"{n_seeds} seeds"
  )
  lines += [
      "",
      f"Mean +- standard error over {seed_label} (each seed's value "
      f"is its mean over the {k5} iterations). Every seed:",
      "",
      *per_seed,
      "",
  ]
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, "curves_summary.md"), "w") as f:
    f.write("\n".join(lines))
  print("\n".join(lines))

  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  ncols = 3
  nrows = -(-len(KEYS) // ncols)
  fig, axes = plt.subplots(
      nrows, ncols, figsize=(3.7 * ncols, 3.4 * nrows), squeeze=False
  )
  for ax in list(axes.flat)[len(KEYS) :]:
    ax.set_visible(False)
  for ax, (k, lbl) in zip(axes.flat, KEYS):
    for arm, c in curves.items():
      v = np.asarray(c[k][:n], np.float64)
      x = np.arange(1, n + 1)
      m = v.mean(1)
      h = np.array([harness.ci_halfwidth(row) for row in v])
      ax.plot(x, m, label=arm)
      ax.fill_between(x, m - h, m + h, alpha=0.2)
    ax.set_title(lbl, fontsize=9)
    ax.set_xlabel("RL iteration", fontsize=8)
    ax.legend(fontsize=6)
  fig.suptitle(
      f"Dark room (kv chains d = 5-6): RL training batches, {n_seeds} "
      "seeds (bands: 95% t intervals)",
      fontsize=10,
  )
  fig.tight_layout()
  fig.savefig(os.path.join(out_dir, "curves_summary.png"), dpi=110)
  plt.close(fig)


def main():
  p = argparse.ArgumentParser(
      prog="python -m experiments.dark_room.curves_summary"
  )
  p.add_argument("--root", required=True, help="parent of the arms' workdirs")
  p.add_argument(
      "--out_dir", default=os.path.dirname(os.path.abspath(__file__))
  )
  p.add_argument(
      "--seeds",
      default=None,
      help="the run's seeds, e.g. 0,1,2 (finds <arm>_<seeds tag>; default: "
      "the untagged <arm> directories)",
  )
  args = p.parse_args()
  seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else None
  write_summary(args.root, args.out_dir, seeds)


if __name__ == "__main__":
  main()
