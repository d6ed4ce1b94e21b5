"""experiments/bench_default_job.py: one run's measurements, a failing run's
error, and (slow tier) the script end to end on the smoke config."""

import os
import subprocess
import sys

import pytest

from experiments import bench_default_job

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_a_failing_job_raises_with_its_output(tmp_path):
  # main.py refuses the config before any work (exit code 2); the error
  # names the command and carries main.py's one-line message.
  with pytest.raises(RuntimeError, match=r"exited 2:\n.*rl\.batch_size=30"):
    bench_default_job.run_job(
        "configs/default.py:smoke",
        ["--config.rl.batch_size=30"],
        str(tmp_path / "w"),
    )


@pytest.mark.slow
def test_script_times_two_variants_of_the_smoke_job(tmp_path):
  out = tmp_path / "report.md"
  proc = subprocess.run(
      [
          sys.executable,
          "experiments/bench_default_job.py",
          "--config=configs/default.py:smoke",
          "--rounds=1",
          "--variants=|--config.checkpoint.every_steps=10",
          f"--compilation_cache={tmp_path / 'cache'}",
          f"--out={out}",
      ],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=900,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  text = out.read_text()
  runs = [l for l in text.splitlines() if l.startswith("round 0 variant")]
  assert len(runs) == 2, text
  for line in runs:
    # Every phase was seen, in order, within the run's wall time.
    wall = float(line.split("wall ")[1].split(" s")[0])
    setup = float(line.split("setup ")[1].split(" s")[0])
    sft = float(line.split("SFT evaluated ")[1].split(" s")[0])
    end = float(line.split("end ")[1].split(" s")[0])
    assert 0 < setup < sft < end < wall, line
    assert "GFLOP/s" in line and "accuracy" in line
  assert "| --config.checkpoint.every_steps=10 |" in text
  assert "(median " in text
