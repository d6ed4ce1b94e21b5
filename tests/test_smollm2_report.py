"""experiments/smollm2/report.py: the held-out table has one column per
evaluated checkpoint (imported, [after SFT,] after RL) with the files' values.
"""

import json

from experiments.smollm2 import report


def _write(path, obj):
  with open(path, "w") as f:
    json.dump(obj, f)


def test_summary_columns_follow_the_eval_files(tmp_path):
  init = {"accuracy": 0.0, "format_error_rate": 1.0}
  sft = {"accuracy": 0.25, "format_error_rate": 0.125}
  rl = {"accuracy": 0.375, "format_error_rate": 0.0625}
  _write(tmp_path / "eval_sft.json", init)
  # Pure RL, unfinished: the SFT file is the imported model; no RL column yet.
  text = report.summarise(str(tmp_path))
  assert "| held-out metric | imported (zero-shot) | after RL |" in text
  assert "| accuracy | 0.000 | n/a |" in text
  # Warm start, finished: three columns.
  _write(tmp_path / "eval_initial.json", init)
  _write(tmp_path / "eval_sft.json", sft)
  _write(
      tmp_path / "eval_report.json",
      {"reports": {"initial": init, "sft": sft, "rl": rl}},
  )
  with open(tmp_path / "metrics.jsonl", "w") as f:
    f.write(
        json.dumps({"step": 1, "sft/loss": 2.5, "sft/grad_norm": 3.0}) + "\n"
    )
    f.write(
        json.dumps(
            {
                "step": 2,
                "rl/reward": 0.5,
                "rl/accuracy": 0.25,
                "rl/tool_calls": 1.0,
            }
        )
        + "\n"
    )
  text = report.summarise(str(tmp_path))
  assert (
      "| held-out metric | imported (zero-shot) | after SFT | after RL |"
      in text
  )
  assert "| accuracy | 0.000 | 0.250 | 0.375 |" in text
  assert "| format_error_rate | 1.000 | 0.125 | 0.062 |" in text
  assert "| 1 | 2.500 | 3.00 |" in text
  assert "| 2 | 0.500 | 0.250 | 1.00 |" in text


def test_command_line_errors_are_one_usage_line(tmp_path, capsys):
  for argv, why in (
      ([], "expected one WORKDIR, got 0 arguments"),
      ([str(tmp_path), "x"], "expected one WORKDIR, got 2 arguments"),
      (["--bogus"], "unknown flag '--bogus'"),
      (
          [str(tmp_path / "nope")],
          f"WORKDIR {str(tmp_path / 'nope')!r} is not a folder",
      ),
  ):
    assert report.main(["report"] + argv) == 2
    err = capsys.readouterr().err
    assert err == f"{report.USAGE}: {why}\n"
