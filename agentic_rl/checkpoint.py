"""Checkpointing of training-state pytrees with Orbax, with checksums.

`Checkpointer` wraps `orbax.checkpoint.CheckpointManager` for one pytree (nested
dicts of jax / numpy arrays and python scalars, e.g. params, optimizer state, a
uint32 PRNG key-data array and an int step). Each checkpoint is a directory
`{directory}/{step}`; Orbax writes it to a temporary directory
(`{step}.orbax-checkpoint-tmp*`) and renames it when complete, so a process
killed mid-save leaves the previous checkpoint intact and `latest_step` never
reports a partial one. Temporary directories left by a killed process are
removed when a `Checkpointer` opens the directory (one run writes a
checkpoint directory at a time; train.py holds a lock on the workdir).

Several processes (`jax.distributed`): every process saves and restores
together, as Orbax requires (each writes its own shards of the arrays; the
directory must be shared by all). Process 0 alone removes partial saves,
writes the checksum manifests (after Orbax's commit, which waits for every
process) and moves damaged checkpoints; `latest_intact_step` hands its choice
to the others.

Checksums. `save` waits until Orbax has committed the step, then writes
`{step}/_CHECKSUMS.json` (size and SHA-256 of every file of the step directory;
written to a temporary file and renamed, so it is complete or absent).
`latest_intact_step` and `restore` verify a step against it before reading it.
A damaged step (a file missing, truncated, zeroed or with flipped bytes, a
manifest that does not parse, an empty directory) is never read: resuming falls
back to the newest intact step with one warning line naming the damaged ones
and why, and moves the damaged ones (newer than the step restored) to
`{directory}-damaged/` (nothing is deleted; left in place, they would stop the
resumed run from saving those step numbers again). If steps exist but none is
intact, `CheckpointError` says so and moves nothing: starting over is the
user's call. A step without a manifest (written before checksums existed, or a
crash between Orbax's commit and the manifest) is restored with a warning if
Orbax's own metadata files are present, unverified.

Full disk. A failed save (e.g. no space left on device) raises `CheckpointError`
with one line naming the directory and its free space (`shutil.disk_usage`),
after removing the partial step directory; earlier checkpoints are untouched.
Orbax's own error logs of that save (tracebacks from its background threads) are
dropped, as the error carries their cause.

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

import concurrent.futures
import contextlib
import errno
import hashlib
import json
import logging as py_logging
import os
import shutil
from typing import Any

from absl import logging
import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from agentic_rl import sharding

# Item names inside a step directory: the state pytree (the name Orbax gives a
# single unnamed item, so older checkpoints read the same) and the data position.
_STATE = "default"
_DATA = "data"
# Checksum manifest inside each step directory, and its format version.
MANIFEST = "_CHECKSUMS.json"
_MANIFEST_FORMAT = 1
# Orbax's marker of an uncommitted (temporary) directory.
_ORBAX_TMP = ".orbax-checkpoint-tmp"
# Files Orbax writes into every committed step; a step without a manifest is
# accepted only if they are present.
_REQUIRED_WITHOUT_MANIFEST = (
    "_CHECKPOINT_METADATA",
    os.path.join(_STATE, "_METADATA"),
)
_CHUNK = 1 << 20


class CheckpointError(RuntimeError):
  """A checkpoint could not be written or no intact one could be read.

  The message is one line naming the directory, the step and what to do;
  main.py prints it without a traceback.
  """


def _sha256(path: str) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    while chunk := f.read(_CHUNK):
      h.update(chunk)
  return h.hexdigest()


def _files(step_dir: str) -> list[str]:
  """Paths (relative, '/'-separated, sorted) of the files under step_dir,
  without the manifest and its temporary file."""
  out = []
  for root, _, names in os.walk(step_dir):
    for name in names:
      rel = os.path.relpath(os.path.join(root, name), step_dir).replace(
          os.sep, "/"
      )
      if rel not in (MANIFEST, MANIFEST + ".tmp"):
        out.append(rel)
  return sorted(out)


def _hash_all(step_dir: str, rels: list[str]) -> dict[str, str]:
  """SHA-256 of each file (hashlib releases the GIL: files hash in parallel)."""
  with concurrent.futures.ThreadPoolExecutor(
      min(8, os.cpu_count() or 1)
  ) as pool:
    digests = pool.map(lambda r: _sha256(os.path.join(step_dir, r)), rels)
    return dict(zip(rels, digests))


def write_manifest(step_dir: str) -> None:
  """Writes `step_dir/_CHECKSUMS.json`: size and SHA-256 of every file.

  Written to `_CHECKSUMS.json.tmp`, flushed to disk, then renamed, so a reader
  sees a whole manifest or none.

  Raises:
    OSError: writing failed (the temporary file is removed).
  """
  rels = _files(step_dir)
  digests = _hash_all(step_dir, rels)
  manifest = {
      "format": _MANIFEST_FORMAT,
      "files": {
          r: {
              "size": os.path.getsize(os.path.join(step_dir, r)),
              "sha256": digests[r],
          }
          for r in rels
      },
  }
  path = os.path.join(step_dir, MANIFEST)
  tmp = path + ".tmp"
  try:
    with open(tmp, "w") as f:
      json.dump(manifest, f, indent=1, sort_keys=True)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    with contextlib.suppress(OSError):
      os.remove(tmp)
    raise


def verify_step_dir(step_dir: str) -> tuple[str, str]:
  """Checks a step directory against its manifest.

  Returns:
    (status, reason): status 'ok' (every listed file present with its size and
    SHA-256), 'unverified' (no manifest, but Orbax's metadata files present) or
    'damaged'; reason says why for the last two ('' when ok), naming the first
    bad file.
  """
  if not os.path.isdir(step_dir):
    return "damaged", "not a directory"
  path = os.path.join(step_dir, MANIFEST)
  if not os.path.exists(path):
    present = _files(step_dir)
    if not present:
      return "damaged", "empty directory"
    for rel in _REQUIRED_WITHOUT_MANIFEST:
      if not os.path.isfile(os.path.join(step_dir, rel)):
        return "damaged", f"no checksum manifest and {rel} is missing"
    return "unverified", f"no checksum manifest ({MANIFEST})"
  try:
    with open(path) as f:
      manifest = json.load(f)
    files = manifest["files"]
    if manifest.get("format") != _MANIFEST_FORMAT or not isinstance(
        files, dict
    ):
      raise ValueError(f"format {manifest.get('format')!r}")
    expected = {
        str(r): (int(v["size"]), str(v["sha256"])) for r, v in files.items()
    }
  except (ValueError, KeyError, TypeError, AttributeError) as e:
    return (
        "damaged",
        f"unreadable checksum manifest {MANIFEST} ({type(e).__name__})",
    )
  if not expected:
    return "damaged", f"checksum manifest {MANIFEST} lists no file"
  for rel, (size, _) in sorted(expected.items()):
    full = os.path.join(step_dir, rel)
    if not os.path.isfile(full):
      return "damaged", f"{rel} is missing"
    actual = os.path.getsize(full)
    if actual != size:
      return "damaged", f"{rel} has {actual} bytes, {size} were written"
  digests = _hash_all(step_dir, sorted(expected))
  for rel, (_, sha) in sorted(expected.items()):
    if digests[rel] != sha:
      return "damaged", f"{rel} fails its SHA-256 checksum"
  return "ok", ""


def _is_disk_full(exc: BaseException) -> bool:
  """Whether exc (or an exception in its chain) reports a full disk or quota."""
  seen = set()
  while exc is not None and id(exc) not in seen:
    seen.add(id(exc))
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
      return True
    text = str(exc)
    if (
        "No space left on device" in text
        or "os_error_code='28'" in text
        or "Disk quota exceeded" in text
    ):
      return True
    exc = exc.__cause__ or exc.__context__
  return False


def _human(n: float) -> str:
  for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
    if n < 1024 or unit == "TiB":
      return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
    n /= 1024
  return f"{n} B"


def _nbytes(tree: Any) -> int:
  """Bytes of the array leaves of a pytree (the size of a checkpoint before
  compression)."""
  return int(sum(getattr(x, "nbytes", 0) for x in jax.tree.leaves(tree)))


def disk_space(path: str) -> str:
  """'X free of Y' for the file system holding `path` (or its nearest existing
  parent), e.g. '12.0 KiB free of 1.0 MiB'; 'unknown free space' if unreadable.
  """
  path = os.path.abspath(path)
  while not os.path.exists(path) and os.path.dirname(path) != path:
    path = os.path.dirname(path)
  try:
    usage = shutil.disk_usage(path)
  except OSError:
    return "unknown free space"
  return f"{_human(usage.free)} free of {_human(usage.total)}"


def _is_primary() -> bool:
  """Process 0 of a multi-process run (or the only process) writes manifests,
  removes partial saves and moves damaged checkpoints."""
  return jax.process_index() == 0


class _DropOrbaxErrors(py_logging.Filter):
  """Drops Orbax's error records (tracebacks of a failed save, which
  `CheckpointError` reports in one line) and its warnings about a step's
  missing metadata file (the damaged-checkpoint warning names it)."""

  def filter(self, record):
    if "orbax" not in record.pathname:
      return True
    if record.levelno >= py_logging.ERROR:
      return False
    return not str(record.msg).startswith("Metadata file does not exist")


@contextlib.contextmanager
def _quiet_orbax_errors():
  flt = _DropOrbaxErrors()
  logger = py_logging.getLogger("absl")
  logger.addFilter(flt)
  try:
    yield
  finally:
    logger.removeFilter(flt)


class Checkpointer:
  """Saves and restores a training-state pytree in `directory`."""

  def __init__(
      self, directory: str, max_to_keep: int = 2, save_interval_steps: int = 1
  ):
    """Opens (creating if needed) the checkpoint directory.

    Removes temporary directories of saves that never completed (a killed
    process); committed checkpoints are left alone.

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
          f"save_interval_steps must be >= 1, got {save_interval_steps}."
      )
    self.directory = os.path.abspath(directory)
    self._save_interval_steps = int(save_interval_steps)
    self._status: dict[int, tuple[str, str]] = {}  # verify_step_dir, cached
    self._broken = False  # a save failed: pending Orbax work is abandoned
    self._warned: set[int] = set()  # unverified steps already warned about
    removed = self.remove_partial() if _is_primary() else []
    if removed:
      logging.info(
          "removed %d partial checkpoint(s) of an interrupted save: %s",
          len(removed),
          ", ".join(removed),
      )
    with _quiet_orbax_errors():
      self._manager = ocp.CheckpointManager(
          self.directory,
          item_names=(_STATE, _DATA),
          options=ocp.CheckpointManagerOptions(
              max_to_keep=max_to_keep,
              save_interval_steps=save_interval_steps,
              create=True,
          ),
      )

  def remove_partial(self) -> list[str]:
    """Removes uncommitted Orbax temporary directories (`*.orbax-checkpoint-tmp*`)
    and temporary manifests from `directory`.

    Returns:
      The names removed (relative to `directory`).
    """
    removed = []
    if not os.path.isdir(self.directory):
      return removed
    for name in sorted(os.listdir(self.directory)):
      path = os.path.join(self.directory, name)
      if _ORBAX_TMP in name:
        if os.path.isdir(path):
          shutil.rmtree(path, ignore_errors=True)
        else:
          with contextlib.suppress(OSError):
            os.remove(path)
        removed.append(name)
      elif os.path.isfile(os.path.join(path, MANIFEST + ".tmp")):
        os.remove(os.path.join(path, MANIFEST + ".tmp"))
        removed.append(f"{name}/{MANIFEST}.tmp")
    return removed

  def _step_dir(self, step: int) -> str:
    return os.path.join(self.directory, str(int(step)))

  def _save_error(
      self, step: int, exc: BaseException, state: Any
  ) -> CheckpointError:
    """The one-line error of a failed save; call before removing the partial
    files (the free space reported is the space left when the write failed)."""
    if _is_disk_full(exc):
      return CheckpointError(
          f"checkpoint step {step}: no space left on device in {self.directory} "
          f"({disk_space(self.directory)} when the write failed; the checkpoint "
          f"needs about {_human(_nbytes(state))}); the partial checkpoint was "
          "removed and earlier ones are intact: free some space (or use a "
          "--workdir on another disk) and re-run to resume"
      )
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return CheckpointError(
        f"checkpoint step {step}: saving to {self.directory} failed "
        f"({type(exc).__name__}: {first[:300]}); the partial checkpoint was removed"
    )

  def save(
      self,
      step: int,
      state: Any,
      force: bool = False,
      data_position: dict | None = None,
  ) -> bool:
    """Saves `state` as checkpoint `step` and its checksum manifest.

    Returns once the step is committed (Orbax's asynchronous write is waited
    for, so a failure surfaces at the step that caused it) and its manifest is
    written.

    Args:
      step: training step (int >= 0).
      state: pytree of jax/numpy arrays and python scalars.
      force: save even if `step` is not a multiple of save_interval_steps.
      data_position: JSON-serialisable position of the run's data iterator
        (`agentic_rl.data.get_position(it)`), taken now; None stores none.

    Returns:
      True if the step was saved; False if skipped: `step` is not a multiple of
      save_interval_steps (and not `force`; unlike Orbax's default policy, the
      first save of a run is not special), `step` is not newer than the latest
      checkpoint (and not `force`), or a checkpoint for `step` already exists
      (e.g. a resumed run re-saving its restore step).

    Raises:
      CheckpointError: the write failed (e.g. a full disk: the message names
        the directory and its free space); the partial step directory is
        removed, earlier checkpoints are untouched.
    """
    step = int(step)
    if self._broken:
      raise CheckpointError(
          f"checkpoint step {step}: not saved, an earlier save to "
          f"{self.directory} failed"
      )
    if not force and step % self._save_interval_steps != 0:
      return False
    items = {_STATE: ocp.args.StandardSave(state)}
    if data_position is not None:
      items[_DATA] = ocp.args.JsonSave(json.loads(json.dumps(data_position)))
    with _quiet_orbax_errors():
      try:
        started = bool(
            self._manager.save(
                step, args=ocp.args.Composite(**items), force=force
            )
        )
        if started:
          self._manager.wait_until_finished()
      except ocp.checkpoint_manager.StepAlreadyExistsError:
        return False
      except Exception as e:  # pylint: disable=broad-except
        self._broken = True
        error = self._save_error(step, e, state)
        self._discard(step)
        raise error from e
    if not started:
      return False
    try:
      if (
          _is_primary()
      ):  # one writer; Orbax's wait is a barrier across processes
        write_manifest(self._step_dir(step))
    except OSError as e:
      self._broken = True
      error = self._save_error(step, e, state)
      self._discard(step)
      raise error from e
    self._status[step] = ("ok", "")
    return True

  def _discard(self, step: int) -> None:
    """Removes what a failed save of `step` left behind."""
    self.remove_partial()
    path = self._step_dir(step)
    if os.path.isdir(path) and not os.path.isfile(os.path.join(path, MANIFEST)):
      shutil.rmtree(path, ignore_errors=True)
    with contextlib.suppress(Exception):
      self._manager.reload()

  def latest_step(self) -> int | None:
    """Step of the newest committed checkpoint (not verified), or None."""
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    """Steps of all kept checkpoints, ascending (not verified)."""
    return sorted(self._manager.all_steps())

  def verify(self, step: int) -> tuple[str, str]:
    """`verify_step_dir` of checkpoint `step` (cached per Checkpointer)."""
    step = int(step)
    if step not in self._status:
      self._status[step] = verify_step_dir(self._step_dir(step))
    return self._status[step]

  def latest_intact_step(self) -> int | None:
    """The newest checkpoint that passes its checksums, after pending saves.

    Damaged checkpoints newer than it are moved to `{directory}-damaged/` (kept,
    not deleted), with one warning line naming them and why. A checkpoint
    without a manifest counts as intact (with a warning) when Orbax's metadata
    files are present.

    In a multi-process run process 0 verifies and moves, and every process
    takes its answer (a collective: all processes call this together), so
    all restore the same step, also while process 0 moves damaged ones.

    Returns:
      The step, or None if the directory holds no checkpoint at all.

    Raises:
      CheckpointError: checkpoints exist but none is intact (none is moved).
    """
    if jax.process_count() == 1:
      return self._latest_intact_step()
    step, status, error = -1, 0, ""
    if _is_primary():
      try:
        found = self._latest_intact_step()
      except CheckpointError as e:
        step, error = -2, str(e)
      else:
        if found is not None:
          step = found
          status = 0 if self.verify(found)[0] == "ok" else 1
    step, status = (
        int(x) for x in sharding.from_primary(np.array([step, status]))
    )
    if error:
      raise CheckpointError(error)
    if step == -2:
      raise CheckpointError(
          f"no intact checkpoint in {self.directory} (process 0 names them): "
          "nothing was changed"
      )
    if not _is_primary():
      with _quiet_orbax_errors():
        self._manager.reload()  # process 0 may have moved damaged steps
      if step >= 0:  # process 0 verified it: its files are not hashed again
        self._status[step] = (
            ("ok", "")
            if status == 0
            else ("unverified", "no checksum manifest (process 0 warned)")
        )
    return None if step == -1 else step

  def _latest_intact_step(self) -> int | None:
    self.wait()
    steps = sorted(self._manager.all_steps(), reverse=True)
    damaged = []
    for step in steps:
      status, why = self.verify(step)
      if status == "damaged":
        damaged.append((step, why))
        continue
      if damaged:
        moved = (
            [self._quarantine(s) for s, _ in damaged]
            if _is_primary()
            else ["(by process 0)"]
        )
        logging.warning(
            "damaged checkpoint%s in %s: %s; resuming from step %d (moved to %s)",
            "s" if len(damaged) > 1 else "",
            self.directory,
            "; ".join(f"step {s}: {w}" for s, w in damaged),
            step,
            ", ".join(moved),
        )
      if status == "unverified" and step not in self._warned:
        self._warned.add(step)
        logging.warning(
            "checkpoint step %d in %s: %s; restoring it unverified",
            step,
            self.directory,
            why,
        )
      return step
    if not damaged:
      return None
    raise CheckpointError(
        f"no intact checkpoint in {self.directory}: "
        + "; ".join(f"step {s}: {w}" for s, w in damaged)
        + ". Nothing was changed; to start this run over, move that directory "
        "aside (or use a new --workdir)"
    )

  def _quarantine(self, step: int) -> str:
    """Moves step's directory to `{directory}-damaged/{step}[.n]`; returns it."""
    dest_root = self.directory + "-damaged"
    os.makedirs(dest_root, exist_ok=True)
    dest, n = os.path.join(dest_root, str(step)), 0
    while os.path.exists(dest):
      n += 1
      dest = os.path.join(dest_root, f"{step}.{n}")
    os.replace(self._step_dir(step), dest)
    self._status.pop(step, None)
    with _quiet_orbax_errors():
      self._manager.reload()
    return dest

  def restore(self, state_like: Any, step: int | None = None) -> Any:
    """Restores a verified checkpoint into the structure of `state_like`.

    Args:
      state_like: pytree with the target structure, shapes and dtypes; leaves
        are concrete arrays, `jax.ShapeDtypeStruct`s (with or without sharding)
        or python scalars. Nothing is read from concrete leaves but their
        metadata.
      step: step to restore; None: `latest_intact_step()` (falls back past
        damaged checkpoints).

    Returns:
      The restored pytree, structured like `state_like`; array leaves have its
      shapes and dtypes (jax.Array for jax/ShapeDtypeStruct targets, np.ndarray
      for numpy targets), bit-identical to what was saved.

    Raises:
      FileNotFoundError: if there is no checkpoint (for `step`).
      CheckpointError: the checkpoint `step` fails its checksums, no checkpoint
        is intact, or one without a manifest cannot be read.
      ValueError: (from Orbax) if the structure does not match the checkpoint.
    """
    step = self._existing_step(step)
    return self._read(step, {_STATE: ocp.args.StandardRestore(state_like)})[
        _STATE
    ]

  def saved_tree(self, step: int) -> Any:
    """The structure of the state saved as checkpoint `step`, read from its
    metadata (no array is read): nested dicts (and lists) keyed as the saved
    pytree's paths (a dataclass field or dict key by its name), with Orbax's
    value metadata as leaves. Lets a caller pick the target layout of
    `restore` (e.g. `learner.restore_train_state` for older layouts).

    Raises:
      FileNotFoundError: there is no checkpoint `step`.
    """
    path = os.path.join(self._step_dir(step), _STATE)
    if not os.path.isdir(path):
      raise FileNotFoundError(f"No checkpoint for step {step} in {path}.")
    with _quiet_orbax_errors():
      meta = ocp.StandardCheckpointHandler().metadata(epath.Path(path))
    return getattr(meta, "tree", meta)

  def _read(self, step: int, items: dict) -> Any:
    status, why = self.verify(step)
    if status == "ok":
      return self._manager.restore(step, args=ocp.args.Composite(**items))
    try:  # written without checksums: Orbax's own errors, in one line
      return self._manager.restore(step, args=ocp.args.Composite(**items))
    except Exception as e:  # pylint: disable=broad-except
      first = str(e).strip().splitlines()[0] if str(e).strip() else ""
      raise CheckpointError(
          f"checkpoint step {step} in {self.directory} ({why}) cannot be read: "
          f"{type(e).__name__}: {first[:300]}; move {self._step_dir(step)} aside "
          "to resume from an earlier checkpoint"
      ) from e

  def _existing_step(self, step: int | None) -> int:
    """`step` (verified), or the latest intact step if None.

    Raises:
      FileNotFoundError: if there is no checkpoint (for `step`).
      CheckpointError: `step` is damaged, or no checkpoint is intact.
    """
    if step is None:
      step = self.latest_intact_step()
      if step is None:
        raise FileNotFoundError(f"No checkpoint in {self.directory}.")
      return int(step)
    self.wait()
    if int(step) not in self._manager.all_steps():
      raise FileNotFoundError(
          f"No checkpoint for step {step} in {self.directory}; "
          f"available: {self.all_steps()}."
      )
    status, why = self.verify(step)
    if status == "damaged":
      raise CheckpointError(
          f"checkpoint step {step} in {self.directory} is damaged: {why}"
      )
    return int(step)

  def restore_data_position(self, step: int | None = None) -> dict | None:
    """The data-iterator position saved with checkpoint `step` (latest intact
    if None).

    Returns:
      The dict given as `save(..., data_position=...)`, or None if that
      checkpoint has none (saved without one, or before this existed).

    Raises:
      FileNotFoundError: if there is no checkpoint (for `step`).
      CheckpointError: as `restore`.
    """
    step = self._existing_step(step)
    if not os.path.isdir(os.path.join(self._step_dir(step), _DATA)):
      return None
    return self._read(step, {_DATA: ocp.args.JsonRestore()})[_DATA]

  def wait(self) -> None:
    """Blocks until in-flight Orbax work is done (saves already return
    committed; after a failed save this does nothing)."""
    if not self._broken:
      self._manager.wait_until_finished()

  def close(self) -> None:
    """Waits for pending work and releases resources."""
    if self._broken:
      with contextlib.suppress(Exception), _quiet_orbax_errors():
        self._manager.close()
      return
    self._manager.wait_until_finished()
    self._manager.close()

  def __enter__(self) -> "Checkpointer":
    return self

  def __exit__(self, *exc) -> None:
    self.close()
