"""Summary of the dark-room arms' RL training curves read from their workdirs.

    python -m experiments.dark_room.curves_summary --root=/tmp/claims/dark_room

Reads `<root>/<arm>/curves.npz` (written with every checkpoint by
experiments/seeds.py; metrics of the training batches, sampled at T = 1) and
writes `curves_summary.md` / `.png` into this folder: per arm the mean +-
standard error over seeds (and every seed) of the first and last 5 RL
iterations available in all arms. Used when the full runner
(`python -m experiments.dark_room`) could not finish its held-out evaluation.
"""

import argparse
import os

import numpy as np

from experiments import harness
from experiments.dark_room import config

KEYS = (("rl/accuracy", "accuracy"), ("rl/horizon_rate", "horizon share"),
        ("rl/turns", "turns/ep"), ("rl/obs_pred_acc", "obs. pred. acc."),
        ("rl/obs_pred_prob", "obs. pred. prob."))


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--root", required=True)
  args = p.parse_args()
  here = os.path.dirname(os.path.abspath(__file__))
  curves = {}
  for arm in config.ARMS:
    path = os.path.join(args.root, arm, "curves.npz")
    if os.path.exists(path):
      with np.load(path) as f:
        c = {k: f[k] for k in f.files if k.startswith("rl/")}
      if "rl/num_turns" in c:  # the same metric, under its name before 2026-12
        c.setdefault("rl/turns", c.pop("rl/num_turns"))
      if c:  # arms still before their first RL checkpoint are left out
        curves[arm] = c
  n = min(len(c["rl/accuracy"]) for c in curves.values())
  lines = [f"# Dark room: RL training batches, iterations 1-{n} (T = 1)", "",
           "| arm | " + " | ".join(f"{lbl} it. 1-5 | {lbl} it. {n - 4}-{n}"
                                     for _, lbl in KEYS) + " |",
           "|---" * (2 * len(KEYS) + 1) + "|"]
  per_seed = []
  for arm, c in curves.items():
    cells, seeds_txt = [], []
    for k, lbl in KEYS:
      for a, b in ((0, 5), (n - 5, n)):
        v = c[k][a:b].mean(0)
        m, se = harness.mean_se(v)
        cells.append(f"{m:.3f} +- {se:.3f}")
      seeds_txt.append(f"{lbl} (last 5) " + "/".join(
          f"{x:.3f}" for x in c[k][n - 5:n].mean(0)))
    lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    per_seed.append(f"- {arm}: " + "; ".join(seeds_txt))
  lines += ["", "Mean +- standard error over seeds 0, 1, 2 (each seed's value is "
            "its mean over the 5 iterations). Every seed:", "", *per_seed, ""]
  with open(os.path.join(here, "curves_summary.md"), "w") as f:
    f.write("\n".join(lines))
  print("\n".join(lines))

  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, axes = plt.subplots(1, len(KEYS), figsize=(3.6 * len(KEYS), 3.3))
  for ax, (k, lbl) in zip(axes, KEYS):
    for arm, c in curves.items():
      v = np.asarray(c[k][:n], np.float64)
      x = np.arange(1, n + 1)
      m, se = v.mean(1), v.std(1, ddof=1) / np.sqrt(v.shape[1])
      ax.plot(x, m, label=arm)
      ax.fill_between(x, m - se, m + se, alpha=0.2)
    ax.set_title(lbl, fontsize=9)
    ax.set_xlabel("RL iteration", fontsize=8)
    ax.legend(fontsize=6)
  fig.suptitle("Dark room (kv chains d = 5-6): RL training batches, 3 seeds",
               fontsize=10)
  fig.tight_layout()
  fig.savefig(os.path.join(here, "curves_summary.png"), dpi=110)


if __name__ == "__main__":
  main()
