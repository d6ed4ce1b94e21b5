"""experiments/smollm2_lora/run.py: the analysis of finished seed workdirs
(paired before/after statistics, pass@k, tables), on hand-made workdirs."""

import json
import os

import numpy as np
import pytest

from experiments.smollm2_lora import run


def _seed(out, seed, before, after, counts_before, counts_after, n, rewards):
  wd = os.path.join(out, f"seed_{seed}")
  os.makedirs(wd)
  for label, greedy, counts in (
      ("sft", before, counts_before),
      ("final", after, counts_after),
  ):
    with open(os.path.join(wd, f"eval_tasks_{label}.json"), "w") as f:
      json.dump(
          {
              "greedy_correct": greedy,
              "sample_correct_counts": counts,
              "num_samples": n,
              "summary": {
                  "accuracy": float(np.mean(greedy)),
                  "format_error_rate": 0.1,
              },
          },
          f,
      )
  with open(os.path.join(wd, "metrics.jsonl"), "w") as f:
    for i, r in enumerate(rewards):
      f.write(
          json.dumps(
              {"step": 17 + i, "phase": "rl", "rl/reward": r, "rl/kl": 0.01 * i}
          )
          + "\n"
      )
  with open(os.path.join(wd, "step_seconds.jsonl"), "w") as f:
    for s in (100.0, 30.0, 50.0):
      f.write(json.dumps({"phase": "rl", "seconds": s}) + "\n")


def test_paired_statistics_and_pass_at_k(tmp_path):
  out = str(tmp_path)
  # Seed 0: 4 tasks, one gained (task 1) -> +0.25; seed 1: two gained, one lost
  # -> +0.25; seed 2: nothing changes -> 0.
  _seed(
      out,
      0,
      [1, 0, 0, 0],
      [1, 1, 0, 0],
      [2, 0, 0, 1],
      [2, 2, 0, 1],
      2,
      [0.1, 0.5],
  )
  _seed(
      out, 1, [1, 0, 0, 1], [0, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0], 2, [0.2]
  )
  _seed(
      out, 2, [0, 0, 1, 1], [0, 0, 1, 1], [0, 0, 2, 2], [0, 0, 2, 2], 2, [0.3]
  )
  res = run.analyse(out, (0, 1, 2), (1, 2))
  s0, s1, s2 = res["per_seed"]
  # Per-task paired differences of seed 0: (0, 1, 0, 0): mean 0.25, sd 0.5,
  # se 0.25, t_3 = 3.182 -> CI 0.25 -+ 0.7955.
  assert s0["per_task_paired"]["mean"] == pytest.approx(0.25)
  assert s0["per_task_paired"]["ci"][1] == pytest.approx(
      0.25 + 3.18245 * 0.25, abs=1e-4
  )
  assert s0["tasks_changed"] == {"gained": 1, "lost": 0}
  assert s1["tasks_changed"] == {"gained": 2, "lost": 1}
  # pass@1 = mean(c / n); pass@2 with n = 2 = share of tasks with c >= 1.
  assert s0["pass_at_k_before"] == {
      "1": pytest.approx(3 / 8),
      "2": pytest.approx(0.5),
  }
  assert s0["pass_at_k_after"] == {
      "1": pytest.approx(5 / 8),
      "2": pytest.approx(0.75),
  }
  assert s0["rl_seconds_per_step_median"] == 50.0
  assert s0["rl_reward_first_last"] == [0.1, 0.5] and s2["rl_steps_done"] == 1
  # Across seeds: differences (0.25, 0.25, 0): mean 1/6, sd 0.1443, se 0.0833,
  # t_2 = 4.303 -> CI [-0.192, 0.525]: inconclusive.
  p = res["across_seeds_paired"]
  assert p["mean"] == pytest.approx(1 / 6)
  assert p["ci"][0] == pytest.approx(1 / 6 - 4.3027 * 0.0833333, abs=1e-3)
  assert res["verdict"] == "inconclusive"
  text = run.markdown(res)
  assert "+0.250 [-0.546, +1.046]" in text and "inconclusive" in text


def test_one_finished_seed_is_not_decided(tmp_path):
  out = str(tmp_path)
  _seed(out, 0, [0, 1], [1, 1], None, None, 0, [0.0])
  res = run.analyse(out, (0, 1), (1,))
  assert res["verdict"].startswith("not decided: 1 finished seed")
  assert res["per_seed"][1]["before"] is None
  assert "pass_at_k_before" not in res["per_seed"][0]
