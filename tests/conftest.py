"""Test-session setup: a persistent XLA compilation cache shared by the tests that
compile the same programs several times (the smoke and resume runs), and, in
the default tier only, XLA:CPU's backend (LLVM) optimisation level 0.

The default tier's time is mostly XLA:CPU compiling many small programs that
then run for milliseconds; LLVM's optimisation passes are most of each compile
(a 4-bucket RL update: 8.7 -> 3.8 CPU s at level 0; tests/test_learner.py
140 -> 91 CPU s). The HLO programs, and so what every test asserts about them,
are the same; only the machine code is less optimised. The slow, learning and
experiments tiers (an explicit -m) keep XLA's default, as do runs whose
XLA_FLAGS already set the level, and AGENTIC_RL_TEST_XLA_OPT=default turns it
off. The decision is `xla_opt_level.default_tier_xla_flags`: the default tier
is the run whose -m expression is pytest.ini's addopts one (whitespace
aside), read from the ini file pytest loaded.
"""

import os
import tempfile

import jax

from tests import xla_opt_level

_CACHE = os.environ.get(
    "AGENTIC_RL_TEST_XLA_CACHE",
    os.path.join(tempfile.gettempdir(), "agentic_rl_test_xla_cache"),
)
jax.config.update("jax_compilation_cache_dir", _CACHE)
# Programs that took at least 0.1 s to compile are written (at level 0 many
# programs of the resume and re-evaluation runs compile in 0.1-0.5 s and were
# compiled again by every run); the op-by-op kernels of eager code take less
# and are not written. A loaded entry is the compiled program of the same
# module: results do not change.
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.1)


def pytest_configure(config):
  # Before any test runs a computation: XLA reads XLA_FLAGS when the CPU
  # backend starts (on first use; collection and this hook precede it).
  # Subprocesses the tests start (main.py runs) inherit it.
  flags = xla_opt_level.default_tier_xla_flags(
      config.getoption("markexpr", ""),
      xla_opt_level.markexpr_from_args(config.getini("addopts")),
      os.environ,
  )
  if flags is not None:
    os.environ["XLA_FLAGS"] = flags


# The default tier's heaviest modules, most summed seconds first (a cold-cache
# `-n 2 --dist loadfile` run, 2026-12-06: 66, 42, 39, 37, 37, 26, ... s; the
# other 70-odd modules take 0-15 s each). Under --dist loadfile a worker takes
# the next module in collection order when it frees, so with the alphabetical
# order a long module could start last and run alone; longest first lets the
# short ones fill the end. Only the order of modules changes (a stable sort:
# tests within a module, and the modules not listed, keep their order). A
# stale list costs balance, not correctness.
HEAVY_MODULES_FIRST = (
    "test_learner.py",
    "test_padding.py",
    "test_sampling.py",
    "test_lora.py",
    "test_train.py",
    "test_sandbox.py",
    "test_seeds.py",
    "test_attention.py",
    "test_models.py",
    "test_review_bugs.py",
    "test_rollout.py",
    "test_precision.py",
    "test_remat.py",
    "test_stages.py",
    "test_losses_family.py",
    "test_harness_stats.py",
)


def pytest_collection_modifyitems(config, items):
  del config  # the same order for every run
  rank = {name: i for i, name in enumerate(HEAVY_MODULES_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
