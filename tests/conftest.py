"""Test-session setup: a persistent XLA compilation cache shared by the tests that
compile the same programs several times (the smoke and resume runs)."""

import os
import tempfile

import jax

_CACHE = os.environ.get(
    "AGENTIC_RL_TEST_XLA_CACHE",
    os.path.join(tempfile.gettempdir(), "agentic_rl_test_xla_cache"),
)
jax.config.update("jax_compilation_cache_dir", _CACHE)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
