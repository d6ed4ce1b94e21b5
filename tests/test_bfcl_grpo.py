"""configs/bfcl_grpo.py:smoke runs SFT + 2 RL steps + evaluation end to end on BFCL
through train.train_and_evaluate (host environment, host rollout driver)."""

import json
import os

import numpy as np
import pytest

pytest.importorskip("bfcl_eval")

from agentic_rl import train  # noqa: E402
from agentic_rl import validation  # noqa: E402
from configs import bfcl_grpo  # noqa: E402


def test_configs_validate():
  validation.validate_config(bfcl_grpo.get_config())
  validation.validate_config(bfcl_grpo.get_config("smoke"))
  with pytest.raises(ValueError, match="unknown arg"):
    bfcl_grpo.get_config("big")


@pytest.mark.slow
def test_smoke_runs_two_rl_steps_end_to_end(tmp_path):
  config = bfcl_grpo.get_config("smoke")
  reports = train.train_and_evaluate(config, str(tmp_path))
  assert set(reports) == {"sft", "rl"}
  for r in reports.values():
    assert 0.0 <= r["accuracy"] <= 1.0 and np.isfinite(r["format_error_rate"])
  with open(os.path.join(tmp_path, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  rl_steps = [r for r in rows if "rl/loss" in r]
  assert [r["step"] for r in rl_steps] == [2, 3]
  assert all(np.isfinite(r["rl/loss"]) for r in rl_steps)
  assert any("sft/loss" in r for r in rows)
  assert os.path.exists(os.path.join(tmp_path, "eval_report.json"))
