"""Claim reproductions and benchmarks (experiments/README.md).

Started as `python -m experiments.<folder>[.<module>]` (a claim runner: a
package of this folder), the process first starts itself again on jemalloc
where the library is installed (agentic_rl/host_memory.py
`reexec_with_jemalloc`; `AGENTIC_RL_JEMALLOC=0` turns it off). The benchmark
scripts (`experiments/bench_*.py`, run by path or with -m) choose their
allocators themselves, and imported any other way (tests) nothing happens.
"""

import os as _os
import sys as _sys

from agentic_rl import host_memory as _host_memory


def _claim_runner_module() -> str | None:
  """The module this interpreter was started with (`-m`) when it is a claim
  runner, i.e. a module of a package under experiments/; else None."""
  started = _host_memory._started_module(  # pylint: disable=protected-access
      list(getattr(_sys, "orig_argv", [])[1:])
  )
  if started is None or started[0] != "-m":
    return None
  parts = started[1].split(".")
  here = _os.path.dirname(_os.path.abspath(__file__))
  if len(parts) >= 2 and parts[0] == "experiments":
    if _os.path.isdir(_os.path.join(here, parts[1])):
      return started[1]
  return None


_RUNNER = _claim_runner_module()
if _RUNNER is not None:
  _host_memory.reexec_with_jemalloc(("-m", _RUNNER))
