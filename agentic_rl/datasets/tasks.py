"""Host environments that read their tasks through the data loader.

`LoaderTasks(env, data_config)` wraps a host environment (environments/host):
`sample_tasks` takes the next records of the loader's training stream (shuffled,
repeated; the `rng` argument is ignored: the order is the loader's), and
`eval_tasks(n, seed)` takes n records of the eval split (`eval_split`, default
'test') in a seed-fixed permutation; every other attribute is the wrapped
environment's. Records become the environment's task objects through
RECORD_TO_TASK, keyed by `config.env.name`.

The training stream's position (`get_position` / `set_position`) is what
agentic_rl/train.py saves inside each checkpoint and restores on resume, so a
resumed run trains on exactly the tasks an uninterrupted run would.

Use: `config.data = dict(source="tfds", name="bfcl_single_turn/simple",
data_dir="~/tensorflow_datasets")` next to `config.env = dict(name="bfcl", ...)`.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np

from agentic_rl import data as data_lib


def bfcl_task(record: dict):
  """A `bfcl_single_turn` record -> environments.host.bfcl.BFCLTask."""
  from environments.host import bfcl

  return bfcl.BFCLTask(
      id=record["id"],
      category=record["category"],
      questions=tuple(record["questions"]),
      functions=tuple(record["functions"]),
      ground_truth=record["ground_truth"],
  )


def reasoning_gym_task(record: dict):
  """A `reasoning_gym_tasks` record -> environments.host.reasoning_gym_env.RGTask.

  The wrapped ReasoningGymEnv scores with the generator seeded by `record['seed']`
  (its `dataset` must be the generator the records came from).
  """
  from environments.host import reasoning_gym_env

  return reasoning_gym_env.RGTask(
      entry=record["entry"],
      seed=int(record["seed"]),
      index=int(record["index"]),
  )


RECORD_TO_TASK: dict[str, Callable[[dict], Any]] = {
    "bfcl": bfcl_task,
    "reasoning_gym": reasoning_gym_task,
}


class LoaderTasks:
  """A host environment whose tasks come from `agentic_rl.data.make_loader`."""

  def __init__(self, env, data_config, to_task: Callable[[dict], Any]):
    """Wraps `env`.

    Args:
      env: a host environment (`is_host = True`).
      data_config: a loader config block (data.validate_data_config); its
        `split` is the training stream, `eval_split` the held-out set.
        batch_size must be 0 (tasks are drawn one record at a time).
      to_task: record dict -> the environment's task object.

    Raises:
      ValueError: env is not a host environment, or batch_size != 0 (names
        config.data.batch_size).
    """
    if not getattr(env, "is_host", False):
      raise ValueError(
          "config.data: only host environments (environments/host) "
          f"read tasks through the loader, not {type(env).__name__}"
      )
    cfg = data_lib.validate_data_config(data_config)
    if cfg["batch_size"] != 0:
      raise ValueError(
          f"config.data.batch_size={cfg['batch_size']}: must be 0 when "
          "the loader feeds an environment's tasks"
      )
    self._env = env
    self._cfg = cfg
    self._to_task = to_task
    self._train = data_lib.make_loader(cfg)

  def __getattr__(self, name):
    if name.startswith("_"):  # private names are the wrapper's own
      raise AttributeError(name)
    return getattr(self._env, name)

  @property
  def env(self):
    """The wrapped environment."""
    return self._env

  def sample_tasks(self, rng: np.random.Generator, n: int) -> list:
    """The next n tasks of the training stream (rng unused: the loader's order).

    Raises:
      StopIteration: the stream ended (num_epochs > 0 and all epochs read).
    """
    del rng
    return [self._to_task(next(self._train)) for _ in range(n)]

  @functools.cached_property
  def _eval_records(self) -> list:
    return data_lib.read_all({**self._cfg, "split": self._cfg["eval_split"]})

  def eval_tasks(self, n: int, seed: int) -> list:
    """min(n, size) tasks of the eval split, in a permutation fixed by `seed`."""
    records = self._eval_records
    order = np.random.default_rng(seed).permutation(len(records))
    return [self._to_task(records[i]) for i in order[:n]]

  def get_position(self) -> dict:
    """Position of the training stream (a small JSON-serialisable dict)."""
    return data_lib.get_position(self._train)

  def set_position(self, position: dict) -> None:
    """Moves the training stream to a position from `get_position`."""
    data_lib.set_position(self._train, position)


def with_loader(env, config) -> Any:
  """`env` wrapped by LoaderTasks if `config.data` is set (non-empty), else `env`.

  Raises:
    ValueError: config.env.name has no record adapter in RECORD_TO_TASK, or the
      loader config is invalid.
  """
  if not config.data:
    return env
  name = config.env.name
  if name not in RECORD_TO_TASK:
    raise ValueError(
        f"config.data: config.env.name={name!r} cannot read tasks from "
        f"the loader; supported: {sorted(RECORD_TO_TASK)}"
    )
  return LoaderTasks(env, dict(config.data), RECORD_TO_TASK[name])
