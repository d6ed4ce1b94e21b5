"""Summarise a SmolLM2 run directory: zero-shot vs after-RL held-out scores,
per-step RL metrics and a reward-curve plot.

  python -m experiments.smollm2.report /path/to/workdir [--log=run.log]

Reads eval_sft.json (the imported model before RL: train.py evaluates the
reference parameters, i.e. the checkpoint, since sft.steps = 0),
eval_report.json (after RL, when the run finished) and metrics.jsonl; writes
reward_curve.png into the workdir and prints a markdown summary. With --log,
peak RSS and wall-clock are read from `/usr/bin/time -v` output.
"""

from __future__ import annotations

import json
import os
import re
import sys

KEYS = ("accuracy", "accuracy_easy", "accuracy_hard", "tool_calls",
        "format_error_rate", "response_tokens")


def _load(path):
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def summarise(workdir: str, log: str | None = None) -> str:
  lines = [f"## {workdir}", ""]
  before = _load(os.path.join(workdir, "eval_sft.json"))
  report = _load(os.path.join(workdir, "eval_report.json"))
  after = report["reports"]["rl"] if report else None
  lines.append("| held-out metric | before RL (zero-shot) | after RL |")
  lines.append("|---|---|---|")
  for k in KEYS:
    b = before.get(k) if before else None
    a = after.get(k) if after else None
    fmt = lambda x: "n/a" if x is None else f"{x:.3f}"
    lines.append(f"| {k} | {fmt(b)} | {fmt(a)} |")
  rows = []
  mpath = os.path.join(workdir, "metrics.jsonl")
  if os.path.exists(mpath):
    with open(mpath) as f:
      rows = [json.loads(line) for line in f if line.strip()]
  rl = [r for r in rows if "rl/reward" in r]
  if rl:
    lines += ["", "| step | reward | accuracy | tool calls | format errors | "
              "policy tokens | steps/s |", "|---|---|---|---|---|---|---|"]
    for r in rl:
      lines.append(
          f"| {r['step']} | {r['rl/reward']:.3f} | {r['rl/accuracy']:.3f} | "
          f"{r['rl/tool_calls']:.2f} | {r.get('rl/format_error_rate', 0):.2f} | "
          f"{r.get('rl/policy_tokens', 0):.1f} | {r.get('rl/steps_per_sec', 0):.4f} |")
    try:
      import matplotlib  # pylint: disable=g-import-not-at-top
      matplotlib.use("Agg")
      import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
      fig, ax = plt.subplots(figsize=(5, 3))
      steps = [r["step"] for r in rl]
      ax.plot(steps, [r["rl/reward"] for r in rl], "o-", label="reward")
      ax.plot(steps, [r["rl/accuracy"] for r in rl], "s--", label="train accuracy")
      ax.set_xlabel("RL step")
      ax.set_title(os.path.basename(os.path.normpath(workdir)))
      ax.legend()
      fig.tight_layout()
      fig.savefig(os.path.join(workdir, "reward_curve.png"), dpi=100)
      lines += ["", f"reward curve: {os.path.join(workdir, 'reward_curve.png')}"]
    except ImportError:
      pass
  if log and os.path.exists(log):
    text = open(log, errors="replace").read()
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    w = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", text)
    if m:
      lines.append(f"peak RSS: {int(m.group(1)) / 2**20:.2f} GB")
    if w:
      lines.append(f"wall-clock: {w.group(1)}")
  return "\n".join(lines)


if __name__ == "__main__":
  log = None
  args = [a for a in sys.argv[1:] if not a.startswith("--log=")]
  for a in sys.argv[1:]:
    if a.startswith("--log="):
      log = a[len("--log="):]
  print(summarise(args[0], log))
