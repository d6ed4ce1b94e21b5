"""Learning regression check: a short run of the default task must learn.

The smoke runs elsewhere end near 0 accuracy by design and would not notice a
change that breaks learning (a sign flip in the advantage, a detached loss, a
broken sampler). This test trains configs/default.py shortened (SFT 200 steps,
GRPO 12 iterations, seed 0, in-process through agentic_rl/seeds.train_seeds) and
asserts the held-out gain the full run shows in its first iterations: the SFT
start answers easy items and guesses hard ones (accuracy about 0.5, hard items
about 0); GRPO teaches it to call the calculator on hard items.

Measured (seed 0, 2026-12-01, 2-core CPU shared with other jobs at load 10-17):
held-out accuracy SFT 0.500 -> RL 1.000 on 128 tasks, hard items 0.000 -> 1.000,
tool calls per hard episode 0.000 -> 1.000; the same numbers (and the same
training curve) in three runs. 153 s of CPU time for the training, 1152 s wall
on the loaded machine (the whole pytest call: 2 min 45 s user CPU, 21 min wall).
Too long for the default tier, so it has its own: `python -m pytest -q -m
learning`.
"""

import resource
import time

import pytest

from configs import default
from agentic_rl import seeds as seeds_lib


def _short_default():
  c = default.get_config()
  c.sft.steps = 200
  c.rl.steps = 12
  c.eval.num_tasks = 128  # 64 hard + 64 easy items
  c.eval.num_samples = 1
  c.eval.pass_k = (1,)
  return c


@pytest.mark.learning
def test_default_task_learns_to_use_the_tool():
  t0, cpu0 = time.time(), resource.getrusage(resource.RUSAGE_SELF)
  out = seeds_lib.train_seeds(_short_default(), [0])
  cpu1 = resource.getrusage(resource.RUSAGE_SELF)
  sft, rl = out["sft"][0], out["rl"][0]
  print(
      f"learning check: accuracy {sft['accuracy']:.4f} -> {rl['accuracy']:.4f}, "
      f"hard {sft['accuracy_hard']:.4f} -> {rl['accuracy_hard']:.4f}, tool calls "
      f"(hard) {sft['tool_calls_hard']:.3f} -> {rl['tool_calls_hard']:.3f}; wall "
      f"{time.time() - t0:.0f} s, CPU {cpu1.ru_utime - cpu0.ru_utime:.0f} s"
  )
  # The gain the issue asks for: +0.3 held-out accuracy ...
  assert rl["accuracy"] - sft["accuracy"] >= 0.3
  # ... earned on hard items, by calling the tool there.
  assert rl["accuracy_hard"] - sft["accuracy_hard"] >= 0.5
  assert rl["tool_calls_hard"] >= 0.8
  # Easy items are not traded away for it.
  assert rl["accuracy_easy"] >= sft["accuracy_easy"] - 0.1
