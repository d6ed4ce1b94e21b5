"""main.py with every host-environment step recorded, for
tests/test_multiprocess.py.

Started like main.py (by `python -m agentic_rl.launch
--program=tests/multiprocess_host_program.py -- ARGS`, or directly). Before
running main.py it wraps `ReasoningGymEnv.reset` and `.step_batch`, and the
`config.data` loader's record conversion: each appends one line per episode
(or record) to $HOST_STEP_LOG/steps.<process index>,

  read SEED INDEX         the loader read the record of task (seed, index)
  reset SEED INDEX        an episode of task (seed, index) began here
  step SEED INDEX TURN    its turn TURN (0-based) was stepped here

so a test can tell which process ran which episodes' tools.
"""

import os
import runpy
import sys

import jax

from agentic_rl.datasets import tasks as data_tasks
from environments.host import reasoning_gym_env as rg

_MAIN = os.path.join(os.path.dirname(os.path.dirname(__file__)), "main.py")


def _record(lines):
  path = os.path.join(
      os.environ["HOST_STEP_LOG"], f"steps.{jax.process_index()}"
  )
  with open(path, "a") as f:
    f.writelines(line + "\n" for line in lines)


def _wrap():
  reset, step_batch = rg.ReasoningGymEnv.reset, rg.ReasoningGymEnv.step_batch

  def logged_reset(self, task):
    _record([f"reset {task.seed} {task.index}"])
    return reset(self, task)

  def logged_step_batch(self, states, texts):
    _record([f"step {s.task.seed} {s.task.index} {s.turns}" for s in states])
    return step_batch(self, states, texts)

  to_task = data_tasks.RECORD_TO_TASK["reasoning_gym"]

  def logged_to_task(record):
    task = to_task(record)
    _record([f"read {task.seed} {task.index}"])
    return task

  rg.ReasoningGymEnv.reset = logged_reset
  rg.ReasoningGymEnv.step_batch = logged_step_batch
  data_tasks.RECORD_TO_TASK["reasoning_gym"] = logged_to_task


if __name__ == "__main__":
  _wrap()
  sys.argv[0] = _MAIN
  runpy.run_path(_MAIN, run_name="__main__")
