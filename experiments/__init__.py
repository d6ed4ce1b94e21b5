"""Claim reproductions and benchmarks (experiments/README.md).

Started as `python -m experiments.<name>`, the process first starts itself
again on jemalloc where the library is installed (agentic_rl/host_memory.py
`reexec_with_jemalloc`; `AGENTIC_RL_JEMALLOC=0` turns it off). Imported any
other way (tests, `python experiments/bench_*.py`) nothing happens.
"""

from agentic_rl import host_memory as _host_memory

_host_memory.reexec_with_jemalloc(("-m", "experiments."))
