"""One run per workdir: an exclusive lock on the run's output folder.

main.py takes it before the heavy imports when the workdir exists already;
train.train_and_evaluate takes it (again: it is re-entrant) for every run.
"""

from __future__ import annotations

import contextlib
import fcntl
import os

import jax

from agentic_rl import validation


def _lock_name() -> str:
  """'.lock' for a one-process run and for process 0 of a multi-process run
  (so that the two refuse each other on one workdir), '.lock.<process index>'
  for the other processes of a multi-process run (every process of one run
  writes the same workdir)."""
  index = jax.process_index()
  return ".lock" if index == 0 else f".lock.{index}"


_HELD_LOCKS: dict[str, int] = {}  # lock path -> nesting depth in this process


@contextlib.contextmanager
def workdir_lock(workdir: str, name: str | None = None):
  """Holds an exclusive lock on `workdir/.lock` (fcntl.flock) while the block runs.

  Checks the workdir first (`validation.check_workdir`). The lock file holds
  the owner's pid; the kernel releases the lock when the process exits, however
  it ends, so a stale file never blocks a later run. Re-entrant within a
  process (main.py takes it before train.train_and_evaluate takes it again).

  Args:
    workdir: the run's output folder (created if missing).
    name: the lock file's name; None: '.lock' (one process, or process 0),
      '.lock.<process index>' for the other processes of a multi-process run
      (asks jax, which starts its backend).

  Yields:
    The lock file's path.

  Raises:
    validation.ConfigError: another process holds the lock (one line, naming
      its pid), or as `validation.check_workdir`.
  """
  path = os.path.join(validation.check_workdir(workdir), name or _lock_name())
  if path in _HELD_LOCKS:
    _HELD_LOCKS[path] += 1
    try:
      yield path
    finally:
      _HELD_LOCKS[path] -= 1
    return
  fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError:
    holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
    os.close(fd)
    raise validation.ConfigError(
        f"workdir {os.path.dirname(path)} is in use by another run (pid {holder}, "
        f"lock {path}): wait for it to finish, or pass a different --workdir"
    ) from None
  _HELD_LOCKS[path] = 1
  try:
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    yield path
  finally:
    del _HELD_LOCKS[path]
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
