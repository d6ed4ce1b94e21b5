"""Each claim reproduction's `--smoke` version runs end to end (CI tier
`-m experiments`; minutes each, so not in the default run)."""

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLAIMS = ("hdpo_conditional", "reward_noise", "length_bias", "trace_credit",
          "portool_tree", "pica_model_size", "step_hacking", "dark_room",
          "tool_composition")


@pytest.mark.experiments
@pytest.mark.parametrize("name", CLAIMS)
def test_claim_smoke(name, tmp_path):
  root = str(tmp_path / name)
  proc = subprocess.run(
      [sys.executable, "-m", f"experiments.{name}", "--smoke", f"--root={root}"],
      cwd=REPO, capture_output=True, text=True, timeout=1800,
      env=dict(os.environ, PYTHONPATH=REPO))
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(os.path.join(root, "results.json")) as f:
    results = json.load(f)
  assert results["seeds"] == [0, 1]
  from importlib import import_module
  arms = import_module(f"experiments.{name}.config").ARMS
  assert set(results["rows"]) == {"SFT (start)", *arms}
  for rows in results["rows"].values():
    assert len(rows) == 2 and all(0.0 <= r["accuracy"] <= 1.0 for r in rows)
  assert os.path.getsize(os.path.join(root, "results.png")) > 10_000
