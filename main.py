"""Entry point: python main.py [--config=configs/X.py[:arg]] [--workdir=DIR] [--config.a.b=v].

Only parses flags and calls the library: `config.mode` 'rl' (the default, also when
the config has no `mode` field) runs agentic_rl.train.train_and_evaluate; 'rm' runs
agentic_rl.rm_train.train_and_evaluate_rm (reward models, configs/rm_*.py).
"""

from __future__ import annotations

import os
import sys

from absl import app
from absl import flags
from absl import logging
import jax
from ml_collections import config_flags

from agentic_rl import rm_train
from agentic_rl import train
from agentic_rl import validation

_CONFIG = config_flags.DEFINE_config_file(
    "config", "configs/default.py", "Experiment config file (configs/*.py[:arg])."
)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Output folder; defaults to runs/<config name>. Re-running resumes."
)
_COMPILATION_CACHE = flags.DEFINE_string(
    "compilation_cache",
    os.path.join(os.path.expanduser("~"), ".cache", "agentic_rl", "xla"),
    "Persistent XLA compilation cache folder ('' disables). Re-runs and resumes skip "
    "most compile time.",
)


class _DropLibraryChatter:
  """absl log filter: hides orbax's per-save INFO lines (warnings still show)."""

  def filter(self, record):
    return record.levelno >= logging.converter.ABSL_TO_STANDARD[logging.WARNING] or (
        "orbax" not in record.pathname
    )


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  logging.get_absl_handler().addFilter(_DropLibraryChatter())
  if _COMPILATION_CACHE.value:
    jax.config.update("jax_compilation_cache_dir", _COMPILATION_CACHE.value)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
  config = _CONFIG.value
  workdir = _WORKDIR.value or os.path.join("runs", config.name)
  mode = config.get("mode", "rl")
  try:
    if mode == "rl":
      train.train_and_evaluate(config, workdir)
    elif mode == "rm":
      rm_train.train_and_evaluate_rm(config, workdir)
    else:
      raise validation.ConfigError(f"config.mode={mode!r}: must be 'rl' or 'rm'")
  except validation.ConfigError as e:  # bad config or workdir: one line, no traceback
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
  app.run(main)
