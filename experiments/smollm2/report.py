"""Summarise a SmolLM2 run directory: held-out scores of the imported model,
after the SFT warm start (when there is one) and after RL, per-step SFT and RL
metrics and a reward-curve plot.

  python -m experiments.smollm2.report /path/to/workdir [--log=run.log]

Reads eval_initial.json (the imported weights, written with eval.initial=True
when sft.steps > 0), eval_sft.json (the SFT checkpoint; without SFT this *is*
the imported model), eval_report.json (all columns, when the run finished) and
metrics.jsonl; writes reward_curve.png into the workdir and prints a markdown
summary. With --log, peak RSS and wall-clock are read from `/usr/bin/time -v`
output.
"""

from __future__ import annotations

import json
import os
import re
import sys

KEYS = (
    "accuracy",
    "accuracy_easy",
    "accuracy_hard",
    "tool_calls",
    "tool_productivity",
    "format_error_rate",
    "response_tokens",
)


def _load(path):
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def _columns(workdir: str) -> list[tuple[str, dict | None]]:
  """(label, metrics) per evaluated checkpoint, imported model first."""
  initial = _load(os.path.join(workdir, "eval_initial.json"))
  sft = _load(os.path.join(workdir, "eval_sft.json"))
  report = _load(os.path.join(workdir, "eval_report.json"))
  rl = report["reports"].get("rl") if report else None
  if initial is not None:
    return [
        ("imported (zero-shot)", initial),
        ("after SFT", sft),
        ("after RL", rl),
    ]
  return [("imported (zero-shot)", sft), ("after RL", rl)]


def summarise(workdir: str, log: str | None = None) -> str:
  lines = [f"## {workdir}", ""]
  columns = _columns(workdir)
  lines.append(
      "| held-out metric | " + " | ".join(c for c, _ in columns) + " |"
  )
  lines.append("|---" * (len(columns) + 1) + "|")
  # A metric with no items (accuracy_hard on BFCL) is NaN in eval_*.json and
  # None in eval_report.json; both print as n/a.
  fmt = lambda x: "n/a" if x is None or x != x else f"{x:.3f}"
  for k in KEYS:
    lines.append(
        f"| {k} | "
        + " | ".join(fmt(m.get(k) if m else None) for _, m in columns)
        + " |"
    )
  rows = []
  mpath = os.path.join(workdir, "metrics.jsonl")
  if os.path.exists(mpath):
    with open(mpath) as f:
      rows = [json.loads(line) for line in f if line.strip()]
  sft = [r for r in rows if "sft/loss" in r]
  if sft:
    lines += [
        "",
        "| SFT step | loss (token-mean NLL) | grad norm |",
        "|---|---|---|",
    ]
    lines += [
        f"| {r['step']} | {r['sft/loss']:.3f} | {r.get('sft/grad_norm', 0):.2f} |"
        for r in sft
    ]
  rl = [r for r in rows if "rl/reward" in r]
  if rl:
    lines += [
        "",
        "| step | reward | accuracy | tool calls | format errors | "
        "policy tokens | steps/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rl:
      lines.append(
          f"| {r['step']} | {r['rl/reward']:.3f} | {r['rl/accuracy']:.3f} | "
          f"{r['rl/tool_calls']:.2f} | {r.get('rl/format_error_rate', 0):.2f} | "
          f"{r.get('rl/policy_tokens', 0):.1f} | {r.get('rl/steps_per_sec', 0):.4f} |"
      )
    try:
      import matplotlib  # pylint: disable=g-import-not-at-top

      matplotlib.use("Agg")
      import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

      fig, ax = plt.subplots(figsize=(5, 3))
      steps = [r["step"] for r in rl]
      ax.plot(steps, [r["rl/reward"] for r in rl], "o-", label="reward")
      ax.plot(
          steps, [r["rl/accuracy"] for r in rl], "s--", label="train accuracy"
      )
      ax.set_xlabel("RL step")
      ax.set_title(os.path.basename(os.path.normpath(workdir)))
      ax.legend()
      fig.tight_layout()
      fig.savefig(os.path.join(workdir, "reward_curve.png"), dpi=100)
      lines += [
          "",
          f"reward curve: {os.path.join(workdir, 'reward_curve.png')}",
      ]
    except ImportError:
      pass
  if log and os.path.exists(log):
    text = open(log, errors="replace").read()
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    w = re.search(
        r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", text
    )
    if m:
      lines.append(f"peak RSS: {int(m.group(1)) / 2**20:.2f} GB")
    if w:
      lines.append(f"wall-clock: {w.group(1)}")
  return "\n".join(lines)


USAGE = "usage: python -m experiments.smollm2.report WORKDIR [--log=FILE]"


def main(argv) -> int:
  """Command line: prints the summary of one workdir; returns the exit status.

  A missing, extra or unknown argument, or a WORKDIR that is not a folder,
  prints one line (the usage and what is wrong) to stderr and returns 2.
  """
  log, args = None, []
  for a in argv[1:]:
    if a.startswith("--log="):
      log = a[len("--log=") :]
    elif a.startswith("-"):
      print(f"{USAGE}: unknown flag {a!r}", file=sys.stderr)
      return 2
    else:
      args.append(a)
  if len(args) != 1:
    print(
        f"{USAGE}: expected one WORKDIR, got {len(args)} arguments",
        file=sys.stderr,
    )
    return 2
  if not os.path.isdir(args[0]):
    print(f"{USAGE}: WORKDIR {args[0]!r} is not a folder", file=sys.stderr)
    return 2
  print(summarise(args[0], log))
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
