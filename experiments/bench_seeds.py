"""How much a vmapped S-seed sweep saves over S separate runs.

    python -m experiments.bench_seeds [--config=default] [--seeds=5] [--sft_steps=60]
        [--rl_steps=20] [--out=experiments/bench_seeds.md]

Times, on the same shrunk schedule of one experiment config:
  vmapped    `agentic_rl.seeds.train_seeds(config, range(S))`: all S seeds in one
             jitted program (what the claim runners do);
  sequential S calls of `train_seeds(config, [s])` in this process, so only the
             first pays the compilation (a lower bound on S `main.py` runs, each of
             which compiles again);
and prints both wall times (training + per-seed held-out evaluation, compilation
included) and their ratio. Wall-clock numbers, so run it on an otherwise idle
machine; the README of the repo quotes the result.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time

from agentic_rl import seeds as seeds_lib


def _config(name: str, sft_steps: int, rl_steps: int):
  config = importlib.import_module(f"configs.{name}").get_config()
  config.sft.steps = sft_steps
  config.rl.steps = rl_steps
  config.checkpoint.every_steps = 10**6
  return config


def main(argv) -> None:
  p = argparse.ArgumentParser(
      prog="python -m experiments.bench_seeds",
      description=__doc__.splitlines()[0],
  )
  p.add_argument("--config", default="default", help="module under configs/")
  p.add_argument("--seeds", type=int, default=5, help="S, number of seeds")
  p.add_argument("--sft_steps", type=int, default=60)
  p.add_argument("--rl_steps", type=int, default=20)
  p.add_argument("--out", default=None, help="also write the table here")
  args = p.parse_args(argv)
  if args.seeds < 1:
    raise ValueError(f"--seeds must be >= 1, got {args.seeds}")
  config = _config(args.config, args.sft_steps, args.rl_steps)
  seeds = list(range(args.seeds))

  t0 = time.time()
  vmapped_train = seeds_lib.train_seeds(config, seeds)["wall_s"]
  vmapped = time.time() - t0

  per_seed, per_seed_train = [], []
  for s in seeds:
    t0 = time.time()
    per_seed_train.append(seeds_lib.train_seeds(config, [s])["wall_s"])
    per_seed.append(time.time() - t0)
  sequential, sequential_train = sum(per_seed), sum(per_seed_train)

  lines = [
      f"# vmapped seeds vs sequential runs (configs/{args.config}.py, "
      f"{args.sft_steps} SFT + {args.rl_steps} GRPO steps, batch "
      f"{config.rl.batch_size}, S = {args.seeds})",
      "",
      "| mode | wall, all (s) | wall, training loop only (s) |",
      "|---|---|---|",
      f"| vmapped, {args.seeds} seeds in one program | {vmapped:.1f} | "
      f"{vmapped_train:.1f} |",
      f"| sequential, {args.seeds} single-seed runs in one process | "
      f"{sequential:.1f} | {sequential_train:.1f} |",
      f"| first single-seed run (incl. compilation) | {per_seed[0]:.1f} | "
      f"{per_seed_train[0]:.1f} |",
      "",
      f"Sequential / vmapped: {sequential / vmapped:.2f}x overall, "
      f"{sequential_train / vmapped_train:.2f}x for the training loop "
      f"(os.cpu_count() = {os.cpu_count()}). 'All' includes building the "
      "states and the per-seed held-out evaluation, which runs seed by seed in "
      "both modes; the training loop includes its compilation.",
  ]
  text = "\n".join(lines)
  print(text)
  if args.out:
    with open(args.out, "w") as f:
      f.write(text + "\n")


if __name__ == "__main__":
  main(sys.argv[1:])
