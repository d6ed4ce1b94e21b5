"""Entry point: python main.py [--config=configs/X.py[:arg]] [--workdir=DIR] [--config.a.b=v].

Only parses flags and calls the library: `config.mode` 'rl' (the default, also when
the config has no `mode` field) runs agentic_rl.train.train_and_evaluate; 'rm' runs
agentic_rl.rm_train.train_and_evaluate_rm (reward models, configs/rm_*.py).

Mistakes a user can fix (a misspelled or new --config.* field, a config file that
does not exist, a bad value, a workdir that is a file, read-only, full or in use
by another run, a full disk while saving, an rl.shared_prefix_len that a
group's episodes turn out not to share) end with one line on stderr,
`error: ...` saying what to do, and exit code 2; no traceback.
"""

from __future__ import annotations

if __name__ == "__main__":
  import os as _os
  import sys as _sys

  # JAX reads JAX_NUM_CPU_DEVICES when it is imported (by the config file, at
  # flag parsing) and fails there with an unrelated message on a bad value.
  _count = _os.environ.get("JAX_NUM_CPU_DEVICES")
  if _count is not None and not (_count.strip().isdigit() and int(_count) > 0):
    print(
        f"error: JAX_NUM_CPU_DEVICES={_count!r}: must be an integer >= 1 (or "
        "unset: main.py picks the count)",
        file=_sys.stderr,
    )
    _sys.exit(2)
  # On jemalloc where it is installed: the process starts itself again with
  # it preloaded, before any other import (agentic_rl/host_memory.py).
  from agentic_rl import host_memory as _host_memory

  _host_memory.reexec_with_jemalloc(("main.py",))

import contextlib
import difflib
import errno
import glob
import os
import re
import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_dict
from ml_collections.config_flags import config_flags

_DEFAULT_CONFIG = "configs/default.py"
_USAGE_EXIT = 2


def _die(message: str) -> None:
  """Prints `error: message` (one line) to stderr and exits with code 2."""
  print("error: " + " ".join(str(message).split()), file=sys.stderr)
  sys.exit(_USAGE_EXIT)


def _closest(name: str, known, cutoff: float = 0.6) -> str | None:
  """The entry of `known` closest to `name` (difflib ratio >= cutoff), or None."""
  close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=cutoff)
  return close[0] if close else None


def _config_spec(argv) -> str:
  """The value of --config in argv ('path[:arg]'), or the default."""
  spec = _DEFAULT_CONFIG
  for i, arg in enumerate(argv):
    m = re.match(r"^--?config(=(.*))?$", arg)
    if m:
      spec = (
          m.group(2)
          if m.group(1)
          else (argv[i + 1] if i + 1 < len(argv) else "")
      )
  return spec


def _overrides(argv) -> list[tuple[str, str]]:
  """(dotted field path, the flag as typed) of each --config.a.b[=v] in argv."""
  out = []
  for arg in argv:
    m = re.match(r"^--?(no)?config\.([^=]+)", arg)
    if m:
      out.append((m.group(2), arg.split("=", 1)[0]))
  return out


def _missing_config_file(spec: str) -> str | None:
  """One-line message if the config file of `spec` does not exist, else None."""
  path = spec.split(":", 1)[0]
  if os.path.isfile(path):
    return None
  candidates = sorted(
      glob.glob("configs/*.py") + glob.glob("experiments/*/config.py")
  )
  near = _closest(path, candidates, cutoff=0.85)
  hint = (
      f"did you mean --config={near}?"
      if near
      else (
          "pass one of configs/*.py, e.g. --config=configs/default.py, and run "
          "from the repository root (config paths are relative to it)"
      )
  )
  return f"config file {path!r} does not exist (--config={spec}): {hint}"


def _explain(argv, exc: BaseException) -> str:
  """One line for an error raised while loading the config and its overrides."""
  spec = _config_spec(argv)
  missing = _missing_config_file(spec)
  if missing:
    return missing
  try:
    config = config_flags.ConfigFileFlagParser(
        name="config", lock_config=False
    ).parse(spec)
  except Exception as e:  # pylint: disable=broad-except
    # ml_collections appends the traceback; its last line is the error.
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return f"--config={spec}: {lines[-1] if lines else type(e).__name__}"
  for path, typed in _overrides(argv):
    node, done = config, []
    for part in path.split("."):
      block = "config" + "".join("." + p for p in done)
      if not isinstance(node, (config_dict.ConfigDict, dict)):
        return (
            f"{typed}: {block} is a value ({node!r}), not a block with fields; "
            f"set it with --{block}=..."
        )
      if part not in node:
        near = _closest(part, list(node.keys()))
        if near:
          return f"{typed}: {block} has no field {part!r}; did you mean --{block}.{near}?"
        return (
            f"{typed}: {block} has no field {part!r}, and the command line can only "
            f"change fields the config file sets: to add one, fork a config file "
            f"(cp {spec.split(':', 1)[0]} configs/my_experiment.py, set "
            f"config.{path} = ... there) and pass --config=configs/my_experiment.py"
        )
      node = node[part]
      done.append(part)
  first = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
  return (
      f"{first[-1] if first else type(exc).__name__} "
      "(python main.py --helpfull lists the flags)"
  )


try:
  _CONFIG = config_flags.DEFINE_config_file(
      "config", _DEFAULT_CONFIG, "Experiment config file (configs/*.py[:arg])."
  )
except Exception as _e:  # pylint: disable=broad-except
  # No --config given: the default file and its overrides are parsed here.
  _die(_explain(sys.argv, _e))
_WORKDIR = flags.DEFINE_string(
    "workdir",
    None,
    "Output folder; defaults to runs/<config name>. Re-running resumes.",
)
_COMPILATION_CACHE = flags.DEFINE_string(
    "compilation_cache",
    os.path.join(os.path.expanduser("~"), ".cache", "agentic_rl", "xla"),
    "Persistent XLA compilation cache folder ('' disables). Re-runs and resumes skip "
    "most compile time.",
)


def _parse_flags(argv):
  """absl's flag parsing, with config and flag errors as one line (exit 2)."""
  missing = _missing_config_file(_config_spec(argv))
  if missing:
    _die(missing)
  try:
    return flags.FLAGS(argv)
  except SystemExit:
    # absl's help flags print the help and exit with status 1; asking for
    # help is not an error.
    if any(
        re.match(r"^--?(help|helpshort|helpfull|helpxml|\?)$", a)
        for a in argv[1:]
    ):
      sys.exit(0)
    raise
  except Exception as e:  # pylint: disable=broad-except
    _die(_explain(argv, e))


class _DropLibraryChatter:
  """absl log filter: hides orbax's per-save INFO lines (warnings still show)."""

  def filter(self, record):
    return record.levelno >= logging.converter.ABSL_TO_STANDARD[
        logging.WARNING
    ] or ("orbax" not in record.pathname)


def _cores() -> int:
  """CPU cores this process may run on (all of them where the platform has
  no affinity call, e.g. macOS)."""
  affinity = getattr(os, "sched_getaffinity", None)
  return len(affinity(0)) if affinity else os.cpu_count() or 1


def _set_cpu_devices(config) -> str:
  """Splits the process into the XLA CPU devices `sharding.cpu_device_count`
  picks (jax_num_cpu_devices); returns why, for the run's mesh log line.

  Raises:
    validation.ConfigError: what `sharding.cpu_device_count` refuses (a bad
      mesh.cpu_devices, or a bad count in XLA_FLAGS / JAX_NUM_CPU_DEVICES).
  """
  import jax  # pylint: disable=g-import-not-at-top
  from agentic_rl import sharding  # pylint: disable=g-import-not-at-top
  from agentic_rl import validation  # pylint: disable=g-import-not-at-top

  try:
    count, why = sharding.cpu_device_count(config, _cores(), os.environ)
  except ValueError as e:
    raise validation.ConfigError(str(e)) from e
  if count is not None:
    jax.config.update("jax_num_cpu_devices", count)
  if why.startswith("automatic"):
    why += "; --config.mesh.cpu_devices=N sets the count"
  return why


def main(argv):
  if len(argv) > 1:
    _die(
        f"unexpected arguments {argv[1:]}: pass flags as --name=value "
        "(python main.py --help lists them)"
    )
  # Imported here, after the flags parse: flag mistakes are reported sooner.
  import jax  # pylint: disable=g-import-not-at-top
  from agentic_rl import checkpoint  # pylint: disable=g-import-not-at-top
  from agentic_rl import loop  # pylint: disable=g-import-not-at-top
  from agentic_rl import validation  # pylint: disable=g-import-not-at-top
  from agentic_rl import workdir_lock  # pylint: disable=g-import-not-at-top
  from configs import schema  # pylint: disable=g-import-not-at-top

  logging.get_absl_handler().addFilter(_DropLibraryChatter())
  config = _CONFIG.value
  workdir = _WORKDIR.value or os.path.join("runs", config.name)
  try:
    validation.check_known_fields(config)  # unknown fields, wrong types, mode
    # Every field the config file leaves out gets the schema's default
    # (configs/schema.py).
    config = schema.with_defaults(config)
    mode = config.mode
    # Before anything starts the backend.
    devices_note = _set_cpu_devices(config) if mode == "rl" else ""
    if mode == "rm" and config.mesh.cpu_devices != 0:
      raise validation.ConfigError(
          f"config.mesh.cpu_devices={config.mesh.cpu_devices!r}: reward-model "
          "training (mode 'rm') runs on the devices as the environment sets "
          "them; leave it 0"
      )
    if _COMPILATION_CACHE.value:
      jax.config.update("jax_compilation_cache_dir", _COMPILATION_CACHE.value)
      # Every program, the op-by-op kernels of eager code included (the
      # state's initialisers compile ~30 of them, ~2 s): a warm smoke run
      # took 10.0-10.6 s against 13.4-15.1 s with a 0.5 s threshold.
      jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    validation.check_workdir(workdir, create=False)  # creates nothing
    # One run per workdir. A workdir in use exists already: lock it now, before
    # the heavy imports (train.train_and_evaluate re-enters the lock; it takes
    # it itself, after validation, for a new workdir or a multi-process run).
    early = (
        os.path.isdir(workdir) or mode == "rm"
    ) and not config.mesh.distributed
    with (
        workdir_lock.workdir_lock(workdir, name=".lock")
        if early
        else contextlib.nullcontext()
    ):
      if mode == "rl":
        from agentic_rl import train  # pylint: disable=g-import-not-at-top

        train.train_and_evaluate(config, workdir, devices_note=devices_note)
      else:
        from agentic_rl import rm_train  # pylint: disable=g-import-not-at-top

        rm_train.train_and_evaluate_rm(config, workdir)
  except (
      validation.ConfigError,
      checkpoint.CheckpointError,
      loop.SharedPrefixMismatch,
  ) as e:
    # Bad config, workdir or checkpoint, or an rl.shared_prefix_len longer
    # than a prompt: one line, no traceback.
    _die(str(e))
  except OSError as e:
    if e.errno not in (errno.ENOSPC, errno.EDQUOT):
      raise
    where = e.filename or workdir
    _die(
        f"no space left on device writing {where} ({checkpoint.disk_space(where)}): "
        "free some space (or pass a --workdir on another disk) and re-run to resume"
    )
  except KeyboardInterrupt:
    # One line, not a traceback; the last checkpoint is intact (saves block
    # until committed), so the same command resumes from it.
    print(
        f"interrupted: re-run the same command to resume from the last "
        f"checkpoint in {workdir}",
        file=sys.stderr,
    )
    sys.exit(130)


if __name__ == "__main__":
  app.run(main, flags_parser=_parse_flags)
