"""Checkpointing of training-state pytrees with Orbax.

`Checkpointer` wraps `orbax.checkpoint.CheckpointManager` for one pytree (nested
dicts of jax / numpy arrays and python scalars, e.g. params, optimizer state, a
uint32 PRNG key-data array and an int step). Each checkpoint is a directory
`{directory}/{step}`; Orbax writes it to a temporary directory and renames it
when complete, so a process killed mid-save leaves the previous checkpoint
intact and `latest_step` never reports a partial one.

Typed PRNG keys (`jax.random.key`) are not supported; store
`jax.random.key_data(key)` (uint32) instead.

A checkpoint may also hold the position of the run's data iterator (a grain
iterator state, agentic_rl/data.py), saved in the same step directory as the
item `data` (JSON) next to the state item `default`, committed atomically with
it: `save(step, state, data_position=...)`, `restore_data_position(step)`. The
state item keeps the single-item layout, so checkpoints written before this
existed restore unchanged (their data position is None).
"""

from __future__ import annotations

import json
import os
from typing import Any

import orbax.checkpoint as ocp

# Item names inside a step directory: the state pytree (the name Orbax gives a
# single unnamed item, so older checkpoints read the same) and the data position.
_STATE = "default"
_DATA = "data"


class Checkpointer:
  """Saves and restores a training-state pytree in `directory`."""

  def __init__(
      self, directory: str, max_to_keep: int = 2, save_interval_steps: int = 1
  ):
    """Opens (creating if needed) the checkpoint directory.

    Args:
      directory: checkpoint root; made absolute (Orbax requires it).
      max_to_keep: number of most recent checkpoints kept; older ones are
        deleted after each save. Must be >= 1.
      save_interval_steps: `save` only writes when step % interval == 0 (unless
        `force`). Must be >= 1.

    Raises:
      ValueError: if max_to_keep or save_interval_steps < 1.
    """
    if max_to_keep < 1:
      raise ValueError(f"max_to_keep must be >= 1, got {max_to_keep}.")
    if save_interval_steps < 1:
      raise ValueError(
          f"save_interval_steps must be >= 1, got {save_interval_steps}.")
    self.directory = os.path.abspath(directory)
    self._save_interval_steps = int(save_interval_steps)
    self._manager = ocp.CheckpointManager(
        self.directory,
        item_names=(_STATE, _DATA),
        options=ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep,
            save_interval_steps=save_interval_steps,
            create=True,
        ),
    )

  def save(self, step: int, state: Any, force: bool = False,
           data_position: dict | None = None) -> bool:
    """Saves `state` as checkpoint `step` (asynchronously; see `wait`).

    Args:
      step: training step (int >= 0).
      state: pytree of jax/numpy arrays and python scalars.
      force: save even if `step` is not a multiple of save_interval_steps.
      data_position: JSON-serialisable position of the run's data iterator
        (`agentic_rl.data.get_position(it)`), taken now (a copy is made before
        the asynchronous write); None stores none.

    Returns:
      True if a save was started; False if skipped: `step` is not a multiple of
      save_interval_steps (and not `force`; unlike Orbax's default policy, the
      first save of a run is not special), `step` is not newer than the latest
      checkpoint (and not `force`), or a checkpoint for `step` already exists
      (e.g. a resumed run re-saving its restore step).
    """
    step = int(step)
    if not force and step % self._save_interval_steps != 0:
      return False
    items = {_STATE: ocp.args.StandardSave(state)}
    if data_position is not None:
      items[_DATA] = ocp.args.JsonSave(json.loads(json.dumps(data_position)))
    try:
      return bool(
          self._manager.save(step, args=ocp.args.Composite(**items), force=force))
    except ocp.checkpoint_manager.StepAlreadyExistsError:
      return False

  def latest_step(self) -> int | None:
    """Step of the newest complete checkpoint, or None if there is none."""
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    """Steps of all kept checkpoints, ascending."""
    return sorted(self._manager.all_steps())

  def restore(self, state_like: Any, step: int | None = None) -> Any:
    """Restores a checkpoint into the structure of `state_like`.

    Args:
      state_like: pytree with the target structure, shapes and dtypes; leaves
        are concrete arrays, `jax.ShapeDtypeStruct`s (with or without sharding)
        or python scalars. Nothing is read from concrete leaves but their
        metadata.
      step: step to restore; the latest if None.

    Returns:
      The restored pytree, structured like `state_like`; array leaves have its
      shapes and dtypes (jax.Array for jax/ShapeDtypeStruct targets, np.ndarray
      for numpy targets), bit-identical to what was saved.

    Raises:
      FileNotFoundError: if there is no checkpoint (for `step`).
      ValueError: (from Orbax) if the structure does not match the checkpoint.
    """
    step = self._existing_step(step)
    return self._manager.restore(
        int(step), args=ocp.args.Composite(
            **{_STATE: ocp.args.StandardRestore(state_like)}))[_STATE]

  def _existing_step(self, step: int | None) -> int:
    """`step`, or the latest step if None, after pending saves finish.

    Raises:
      FileNotFoundError: if there is no checkpoint (for `step`).
    """
    self._manager.wait_until_finished()
    if step is None:
      step = self._manager.latest_step()
      if step is None:
        raise FileNotFoundError(f"No checkpoint in {self.directory}.")
    elif int(step) not in self._manager.all_steps():
      raise FileNotFoundError(
          f"No checkpoint for step {step} in {self.directory}; "
          f"available: {self.all_steps()}.")
    return int(step)

  def restore_data_position(self, step: int | None = None) -> dict | None:
    """The data-iterator position saved with checkpoint `step` (latest if None).

    Returns:
      The dict given as `save(..., data_position=...)`, or None if that
      checkpoint has none (saved without one, or before this existed).

    Raises:
      FileNotFoundError: if there is no checkpoint (for `step`).
    """
    step = self._existing_step(step)
    if not os.path.isdir(os.path.join(self.directory, str(int(step)), _DATA)):
      return None
    return self._manager.restore(
        int(step), args=ocp.args.Composite(**{_DATA: ocp.args.JsonRestore()}))[_DATA]

  def wait(self) -> None:
    """Blocks until in-flight asynchronous saves are committed."""
    self._manager.wait_until_finished()

  def close(self) -> None:
    """Waits for pending saves and releases resources."""
    self._manager.wait_until_finished()
    self._manager.close()

  def __enter__(self) -> "Checkpointer":
    return self

  def __exit__(self, *exc) -> None:
    self.close()
