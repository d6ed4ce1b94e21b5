"""A real `main.py` process killed with SIGKILL mid-run resumes to the same result.

Slow tier (two smoke runs in subprocesses): python -m pytest -q -m slow
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cmd(workdir):
  return [
      sys.executable,
      os.path.join(REPO, "main.py"),
      "--config=" + os.path.join(REPO, "configs/default.py") + ":smoke",
      f"--workdir={workdir}",
  ]


def _steps(workdir):
  d = os.path.join(workdir, "checkpoints")
  if not os.path.isdir(d):
    return []
  return sorted(int(n) for n in os.listdir(d) if n.isdigit())


@pytest.mark.slow
def test_sigkill_then_rerun_matches_uninterrupted(tmp_path):
  ref = str(tmp_path / "ref")
  subprocess.run(_cmd(ref), check=True, cwd=REPO, capture_output=True)
  killed = str(tmp_path / "killed")
  proc = subprocess.Popen(
      _cmd(killed),
      cwd=REPO,
      stdout=subprocess.DEVNULL,
      stderr=subprocess.DEVNULL,
  )
  deadline = time.time() + 300
  while time.time() < deadline and not any(s >= 10 for s in _steps(killed)):
    time.sleep(0.2)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  assert _steps(killed), "no checkpoint was written before the kill"
  assert not os.path.exists(os.path.join(killed, "eval_report.json"))
  subprocess.run(_cmd(killed), check=True, cwd=REPO, capture_output=True)
  with open(os.path.join(ref, "eval_report.json")) as f:
    want = json.load(f)["reports"]
  with open(os.path.join(killed, "eval_report.json")) as f:
    got = json.load(f)["reports"]
  assert got == want
