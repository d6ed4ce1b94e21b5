"""Regenerates the README's headline table: the default run's held-out numbers.

  python -m experiments.headline --workdir=runs/headline [--config=configs/default.py]

Runs (or resumes; a finished run is only re-evaluated) the config with
agentic_rl.train.train_and_evaluate, then prints the held-out table after SFT and
after GRPO in the README's format, and writes it to WORKDIR/headline.md with the
date, the git commit and the wall time. Paste that file's table into README.md
when the code changes the numbers; the numbers in README.md come from here.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import subprocess
import sys
import time
from typing import Any, Mapping

HEADLINE_FILE = "headline.md"


def _num(x: Any, digits: int = 4) -> str:
  if not isinstance(x, (int, float)) or not math.isfinite(x):
    return "n/a"
  return f"{x:.{digits}f}"


def headline_table(
    reports: Mapping[str, Mapping[str, Any]],
    seed: int,
    num_samples: int,
    temperature: float,
) -> str:
  """The README's Markdown table from `eval_report.json`'s 'reports' block.

  Args:
    reports: checkpoint name ('sft', 'rl'; others ignored) -> held-out metrics
      of agentic_rl.train.evaluate (accuracy, accuracy_hard, accuracy_easy,
      pass@1, tool_calls_hard, tool_calls_easy, format_error_rate).
    seed: config.seed, shown in the header.
    num_samples, temperature: config.eval.num_samples and .temperature (the
      pass@1 row's sampling).

  Returns:
    Markdown lines without a trailing newline. Missing or non-finite values
    show as 'n/a'.

  Raises:
    KeyError: 'sft' or 'rl' missing from `reports`.
  """
  cols = (reports["sft"], reports["rl"])

  def row(label, fmt):
    return f"| {label} | " + " | ".join(fmt(c) for c in cols) + " |"

  temp = f"{temperature:g}"
  return "\n".join(
      [
          f"| held-out metric (seed {seed}) | after SFT | after GRPO |",
          "|---|---|---|",
          row("greedy accuracy", lambda c: _num(c.get("accuracy"))),
          row(
              "greedy accuracy, hard items",
              lambda c: _num(c.get("accuracy_hard")),
          ),
          row(
              "greedy accuracy, easy items",
              lambda c: _num(c.get("accuracy_easy")),
          ),
          row(
              f"pass@1 ({num_samples} samples per task at temperature {temp})",
              lambda c: _num(c.get("pass@1")),
          ),
          row(
              "tool calls per episode, hard / easy",
              lambda c: f"{_num(c.get('tool_calls_hard'), 2)} / "
              f"{_num(c.get('tool_calls_easy'), 2)}",
          ),
          row("format-error rate", lambda c: _num(c.get("format_error_rate"))),
      ]
  )


def _commit() -> str:
  try:
    out = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=True,
        timeout=10,
        cwd=os.path.dirname(os.path.abspath(__file__)),
    )
    return out.stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return "unknown"


def main(argv) -> None:
  from absl import flags  # pylint: disable=g-import-not-at-top
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top

  del argv
  config = flags.FLAGS.config
  workdir = flags.FLAGS.workdir
  from agentic_rl import train  # pylint: disable=g-import-not-at-top
  from agentic_rl import validation  # pylint: disable=g-import-not-at-top

  t0 = time.time()
  try:
    train.train_and_evaluate(config, workdir)
  except validation.ConfigError as e:
    print("error: " + " ".join(str(e).split()), file=sys.stderr)
    sys.exit(2)
  wall = time.time() - t0
  with open(os.path.join(workdir, "eval_report.json")) as f:
    reports = json.load(f)["reports"]
  table = headline_table(
      reports, config.seed, config.eval.num_samples, config.eval.temperature
  )
  note = (
      f"Measured with `python -m experiments.headline --workdir={workdir}` on "
      f"{datetime.date.today().isoformat()} at commit {_commit()} "
      f"({config_flags.get_config_filename(flags.FLAGS['config'])}): "
      f"{wall / 60:.1f} minutes wall, this call."
  )
  text = table + "\n\n" + note + "\n"
  with open(os.path.join(workdir, HEADLINE_FILE), "w") as f:
    f.write(text)
  print(text, end="")


if __name__ == "__main__":
  from absl import app  # pylint: disable=g-import-not-at-top
  from absl import flags  # pylint: disable=g-import-not-at-top
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top

  config_flags.DEFINE_config_file(
      "config",
      "configs/default.py",
      "Experiment config file (configs/*.py[:arg]).",
  )
  flags.DEFINE_string("workdir", None, "Output folder (re-running resumes).")
  flags.mark_flag_as_required("workdir")
  app.run(main)
