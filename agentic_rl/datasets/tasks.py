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

Tasks are read lazily: `sample_tasks` and `eval_tasks` return sequences whose
records are read (by index, from the grain MapDataset) when an element is
first accessed. Of a multi-process run every process advances the same
stream position (n records per call, the same on every process), but the host
driver (agentic_rl/host_rollout.py) touches only the tasks of its own rows, so
each process reads only its share of the records; the position, the number of
records consumed ({'next_index': k}, the format of grain's own iterator
state), is the same on every process and is the one saved in the checkpoint.

Use: `config.data = dict(source="tfds", name="bfcl_single_turn/simple",
data_dir="~/tensorflow_datasets")` next to `config.env = dict(name="bfcl", ...)`.
"""

from __future__ import annotations

import collections.abc
from typing import Any, Callable, Sequence

import numpy as np

from agentic_rl import data as data_lib


def bfcl_task(record: dict):
  """A `bfcl_single_turn` record -> environments.host.bfcl.data.BFCLTask."""
  from environments.host.bfcl import data as bfcl_data

  return bfcl_data.BFCLTask(
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


class LazyTasks(collections.abc.Sequence):
  """Tasks `to_task(dataset[i])` for i in `indices`, each read and converted
  on first access (and kept). Slicing gives a list of the selected tasks."""

  def __init__(self, dataset, indices: Sequence[int], to_task):
    self._dataset = dataset
    self._indices = indices
    self._to_task = to_task
    self._cache: dict[int, Any] = {}

  def __len__(self) -> int:
    return len(self._indices)

  def __getitem__(self, i):
    if isinstance(i, slice):
      return [self[j] for j in range(*i.indices(len(self)))]
    if not -len(self) <= i < len(self):
      raise IndexError(i)
    i %= len(self)
    if i not in self._cache:
      self._cache[i] = self._to_task(self._dataset[int(self._indices[i])])
    return self._cache[i]

  @property
  def num_read(self) -> int:
    """How many of the tasks have been read so far."""
    return len(self._cache)


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
    # The training stream (shuffled, repeated) as a random-access dataset:
    # record k is the k-th record grain's iterator over it would yield.
    self._train = data_lib.make_loader_dataset(cfg)
    self._next = 0  # records consumed: the stream's position
    self._eval = None

  def __getattr__(self, name):
    if name.startswith("_"):  # private names are the wrapper's own
      raise AttributeError(name)
    return getattr(self._env, name)

  @property
  def env(self):
    """The wrapped environment."""
    return self._env

  def sample_tasks(self, rng: np.random.Generator, n: int) -> LazyTasks:
    """The next n tasks of the training stream (rng unused: the loader's order),
    read when accessed (LazyTasks); the position moves on by n.

    Raises:
      StopIteration: the stream ended (num_epochs > 0 and all epochs read).
    """
    del rng
    start = self._next
    if self._cfg["num_epochs"] and start + n > len(self._train):
      raise StopIteration(
          f"config.data: the training stream of {len(self._train)} records "
          f"({self._cfg['num_epochs']} epochs) ended"
      )
    self._next = start + n
    return LazyTasks(self._train, range(start, start + n), self._to_task)

  def eval_tasks(self, n: int, seed: int) -> LazyTasks:
    """min(n, size) tasks of the eval split, in a permutation fixed by `seed`
    (read when accessed)."""
    if self._eval is None:
      self._eval = data_lib.make_loader_dataset(
          {
              **self._cfg,
              "split": self._cfg["eval_split"],
              "shuffle_seed": -1,
              "num_epochs": 1,
          }
      )
    order = np.random.default_rng(seed).permutation(len(self._eval))
    return LazyTasks(self._eval, order[:n], self._to_task)

  def get_position(self) -> dict:
    """Position of the training stream: {'next_index': records consumed}
    (the state of grain's iterator over the same dataset)."""
    return {"next_index": self._next}

  def set_position(self, position: dict) -> None:
    """Moves the training stream to a position from `get_position` (or from
    `data.get_position` of an iterator over the same pipeline)."""
    self._next = int(position["next_index"])


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
