"""The default tier's XLA:CPU optimisation switch (tests/xla_opt_level.py, which
tests/conftest.py calls) on hand-written cases and on pytest.ini's addopts."""

import os

import pytest

from tests import xla_opt_level

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INI = os.path.join(REPO, "pytest.ini")
DEFAULT = "not slow and not experiments and not learning"
LEVEL0 = "--xla_backend_optimization_level=0"


def _flags(markexpr, env=None, default=DEFAULT):
  return xla_opt_level.default_tier_xla_flags(markexpr, default, env or {})


def test_default_tier_gets_level_0():
  assert _flags(DEFAULT) == LEVEL0
  assert _flags(DEFAULT, {"XLA_FLAGS": "--xla_dump_to=/tmp/d"}) == (
      "--xla_dump_to=/tmp/d " + LEVEL0
  )
  # Whitespace differences (an -m typed by hand, a reformatted ini) still
  # name the default tier.
  assert _flags("  not slow  and not experiments\tand not learning ") == LEVEL0
  spaced = "not  slow and not experiments and not learning\n"
  assert _flags(DEFAULT, default=spaced) == LEVEL0


def test_explicit_tiers_keep_the_default_level():
  assert _flags("slow") is None
  assert _flags("learning or experiments") is None
  assert _flags("not slow") is None
  assert _flags("") is None
  assert _flags(None) is None
  assert _flags(DEFAULT, default=None) is None  # addopts without -m


def test_a_level_already_set_or_the_opt_out_keeps_xla_flags():
  level2 = {"XLA_FLAGS": "--xla_backend_optimization_level=2"}
  assert _flags(DEFAULT, level2) is None
  assert _flags(DEFAULT, {"AGENTIC_RL_TEST_XLA_OPT": "default"}) is None
  # Any other value of the variable does not opt out.
  assert _flags(DEFAULT, {"AGENTIC_RL_TEST_XLA_OPT": "0"}) == LEVEL0


def test_markexpr_from_args():
  assert xla_opt_level.markexpr_from_args(["-m", "slow"]) == "slow"
  assert xla_opt_level.markexpr_from_args(["-mslow"]) == "slow"
  assert xla_opt_level.markexpr_from_args(["-q", "-m", "a", "-m", "b"]) == "b"
  assert xla_opt_level.markexpr_from_args(["-q", "--markers"]) is None
  assert xla_opt_level.markexpr_from_args([]) is None


def test_pytest_ini_default_tier_is_read_from_addopts(tmp_path):
  # The expression the default tier runs under, as pytest.ini's addopts
  # gives it, and the switch applied to it.
  default = xla_opt_level.markexpr_from_args(xla_opt_level.ini_addopts(INI))
  assert default == DEFAULT
  assert xla_opt_level.default_tier_xla_flags(default, default, {}) == LEVEL0
  assert xla_opt_level.default_tier_xla_flags("slow", default, {}) is None
  # Quoting and other options as a shell splits them.
  ini = tmp_path / "pytest.ini"
  ini.write_text(
      "[pytest]\n# a comment\naddopts = -q -m 'a and  not b' -p no:x\n"
      "markers =\n    a: one\n    b: two\n"
  )
  assert xla_opt_level.ini_addopts(str(ini)) == [
      "-q",
      "-m",
      "a and  not b",
      "-p",
      "no:x",
  ]
  ini.write_text("[pytest]\ntestpaths = tests\n")
  assert xla_opt_level.ini_addopts(str(ini)) == []


def test_conftest_reads_the_same_addopts_as_pytest(pytestconfig):
  # tests/conftest.py takes the default tier from pytest's own reading of
  # addopts; it agrees with the ini file's.
  inipath = pytestconfig.inipath
  if pytestconfig.getoption("override_ini") or (
      inipath is None or os.path.realpath(inipath) != os.path.realpath(INI)
  ):
    pytest.skip("run with another ini file or -o")
  assert (
      xla_opt_level.markexpr_from_args(pytestconfig.getini("addopts"))
      == DEFAULT
  )
