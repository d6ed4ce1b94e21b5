"""The default tier's XLA:CPU optimisation switch of tests/conftest.py, as pure
functions (tests/test_conftest_opt_level.py checks them on hand values).

The default tier is the run whose -m expression is the one pytest.ini's
addopts gives (`python -m pytest -q` with no -m of its own); its expression
is read from addopts, not repeated here, and compared with whitespace
normalised. Only that run gets `--xla_backend_optimization_level=0`.
"""

from __future__ import annotations

import configparser
import shlex
from typing import Mapping, Sequence

# XLA:CPU's backend (LLVM) optimisation level flag.
OPT_FLAG = "--xla_backend_optimization_level"
# Set to 'default' to keep XLA's default level in the default tier too.
OPT_ENV = "AGENTIC_RL_TEST_XLA_OPT"


def normalise(expr: str) -> str:
  """`expr` with every run of whitespace one space, none at either end."""
  return " ".join(expr.split())


def markexpr_from_args(args: Sequence[str]) -> str | None:
  """The -m expression in pytest arguments ('-m EXPR' or '-mEXPR'; the last
  one wins, as on pytest's command line), or None when there is none."""
  expr = None
  it = iter(args)
  for arg in it:
    if arg == "-m":
      expr = next(it, None)
    elif arg.startswith("-m"):
      expr = arg[2:]
  return expr


def ini_addopts(path: str) -> list[str]:
  """The arguments of the [pytest] section's addopts in the ini file `path`,
  split as a shell would (what pytest reads); [] when there is none."""
  parser = configparser.ConfigParser(interpolation=None)
  if not parser.read(path):
    raise FileNotFoundError(path)
  return shlex.split(parser.get("pytest", "addopts", fallback=""))


def default_tier_xla_flags(
    markexpr: str | None,
    default_markexpr: str | None,
    env: Mapping[str, str],
) -> str | None:
  """The XLA_FLAGS value of a default-tier run, or None to leave XLA_FLAGS.

  Args:
    markexpr: the run's -m expression (pytest's `markexpr` option).
    default_markexpr: the default tier's expression (pytest.ini's addopts,
      `markexpr_from_args`), or None when addopts has no -m.
    env: the environment (os.environ): its XLA_FLAGS and OPT_ENV.

  Returns:
    XLA_FLAGS with `OPT_FLAG=0` appended when `markexpr` is the default
    tier's (whitespace aside), OPT_ENV is not 'default' and XLA_FLAGS does
    not set the level already; None otherwise (an explicit -m such as
    'slow', a level of the caller's own, or the opt-out).
  """
  if markexpr is None or default_markexpr is None:
    return None
  if normalise(markexpr) != normalise(default_markexpr):
    return None
  if env.get(OPT_ENV, "") == "default":
    return None
  flags = env.get("XLA_FLAGS", "")
  if OPT_FLAG in flags:
    return None
  return f"{flags} {OPT_FLAG}=0".strip()
