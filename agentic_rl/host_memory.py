"""Host (CPU) memory of the training process: glibc malloc settings.

On a CPU backend every array of a jitted program (its arguments, outputs and
the one temporary block XLA allocates per execution) lives in the process
heap and is allocated and freed again at every step. As glibc comes, large
blocks are mapped from the kernel (`mmap`) and unmapped when freed, so the
next step touches fresh pages: one minor page fault per 4 KiB page, with the
kernel zeroing each page. Measured on the default job (`python main.py`, one
RL iteration's temporary block is 166 MiB, allocated by an XLA worker thread
from a per-thread arena, where glibc maps any block over 64 MiB whatever its
mmap threshold): 20.5 million minor faults and 80 s of system time in a
3-minute run; with freed memory kept for reuse, 0.33 million and 4 s, and
the same results (experiments/bench_allocator.py, docs/models.md).

Three policies, chosen by `AGENTIC_RL_HOST_MEMORY` (read once, when the
package is imported; `apply()` switches later):

  keep    (default) freed memory stays in the process for the next step:
          one malloc arena for all threads (`M_ARENA_MAX` = 1, so no
          thread's large block is mapped on its own), no mmapped blocks
          (`M_MMAP_MAX` = 0), and the heap's top trimmed only past 2 GiB
          (`M_TRIM_THRESHOLD`). Resident memory stays near the run's peak
          working set instead of falling between steps.
  return  large freed arrays leave the process at once (a fixed 128 KiB mmap
          threshold): lower resident memory between phases, a page fault per
          page on every reuse. For memory-tight runs (a pretrained model's
          compile next to its run; `release()` and `CompileThenRelease`).
  system  glibc as it comes (nothing set).

Where the C library is not glibc (macOS, musl), nothing is set and one line
says so. Where another allocator is preloaded (`LD_PRELOAD` of jemalloc,
tcmalloc or mimalloc), it is left alone. No policy changes a computed value.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys

# mallopt parameter numbers (glibc malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8
# Blocks at least this large are mmapped (glibc's initial default, 128 KiB).
MMAP_THRESHOLD_BYTES = 128 * 1024
# glibc's default cap on mmapped blocks (restored by 'return').
_DEFAULT_MMAP_MAX = 65536
# Largest value mallopt takes (a C int): the heap's top is trimmed past it.
_KEEP_TRIM_THRESHOLD = 2**31 - 1

ENV = "AGENTIC_RL_HOST_MEMORY"
MODES = ("keep", "return", "system")
_PRELOADED = ("jemalloc", "tcmalloc", "mimalloc")


@functools.lru_cache(maxsize=1)
def _libc():
  """The glibc handle with mallopt and malloc_trim, or None."""
  name = ctypes.util.find_library("c")
  if name is None:
    return None
  try:
    libc = ctypes.CDLL(name)
    libc.mallopt  # noqa: B018  (glibc only)
    libc.malloc_trim  # noqa: B018
  except (OSError, AttributeError):
    return None
  return libc


def preloaded_allocator() -> str | None:
  """Name of an allocator preloaded into this process ('jemalloc',
  'tcmalloc', 'mimalloc') from `LD_PRELOAD`, or None."""
  preload = os.environ.get("LD_PRELOAD", "")
  for name in _PRELOADED:
    if name in preload:
      return name
  return None


def mode_from_environment() -> str:
  """The policy named by `AGENTIC_RL_HOST_MEMORY` ('keep' when unset).

  Raises:
    ValueError: the variable holds another value (names it and the choices).
  """
  mode = os.environ.get(ENV, "keep").strip() or "keep"
  if mode not in MODES:
    raise ValueError(
        f"{ENV}={mode!r}: expected one of {', '.join(MODES)} "
        "(agentic_rl/host_memory.py)"
    )
  return mode


def apply(mode: str) -> str:
  """Sets glibc malloc for `mode` ('keep', 'return' or 'system').

  Args:
    mode: one of `MODES` (see the module docstring).

  Returns:
    What took effect: `mode` itself; 'preloaded:<name>' when another
    allocator is preloaded (nothing set); 'unavailable' when the C library
    is not glibc (nothing set).

  Raises:
    ValueError: an unknown mode, or glibc refused a setting.
  """
  if mode not in MODES:
    raise ValueError(f"host memory mode {mode!r}: expected one of {MODES}")
  other = preloaded_allocator()
  if other is not None:
    return f"preloaded:{other}"
  libc = _libc()
  if libc is None:
    return "unavailable"
  if mode == "keep":
    settings = (
        (_M_ARENA_MAX, 1),
        (_M_MMAP_MAX, 0),
        (_M_TRIM_THRESHOLD, _KEEP_TRIM_THRESHOLD),
    )
  elif mode == "return":
    settings = (
        (_M_MMAP_MAX, _DEFAULT_MMAP_MAX),
        (_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES),
        (_M_TRIM_THRESHOLD, 2 * MMAP_THRESHOLD_BYTES),
    )
  else:
    return mode
  for param, value in settings:
    if not libc.mallopt(param, value):
      raise ValueError(f"glibc mallopt({param}, {value}) refused")
  return mode


def apply_from_environment() -> str:
  """`apply(mode_from_environment())`, with one line on stderr where the
  default 'keep' cannot take effect (not glibc). Called once when the
  agentic_rl package is imported. Returns what `apply` returned."""
  mode = mode_from_environment()
  applied = apply(mode)
  if applied == "unavailable" and mode == "keep":
    print(
        "agentic_rl: the C library is not glibc, so freed arrays go back to "
        "the system and are faulted in again on reuse (slower steps on CPU); "
        "preloading jemalloc with MALLOC_CONF=retain:true keeps them "
        "(docs/models.md, host memory)",
        file=sys.stderr,
    )
  return applied


def configure(threshold_bytes: int = MMAP_THRESHOLD_BYTES) -> bool:
  """Fixes glibc's mmap threshold at `threshold_bytes` (which also turns off
  its dynamic raising) and lets blocks be mapped again. Returns whether it
  was set (False: not glibc). `apply('return')` is this at 128 KiB."""
  libc = _libc()
  if libc is None:
    return False
  return bool(
      libc.mallopt(_M_MMAP_MAX, _DEFAULT_MMAP_MAX)
      and libc.mallopt(_M_MMAP_THRESHOLD, int(threshold_bytes))
  )


def release() -> bool:
  """Returns the heap's free pages to the system (glibc `malloc_trim(0)`).
  Returns whether any memory was released (False also when not glibc)."""
  libc = _libc()
  if libc is None:
    return False
  return bool(libc.malloc_trim(0))


def rss_gb() -> float:
  """Current resident set size of this process in GiB (0.0 where
  /proc/self/status is not available)."""
  try:
    with open("/proc/self/status") as f:
      for line in f:
        if line.startswith("VmRSS:"):
          return int(line.split()[1]) / 2**20
  except OSError:
    pass
  return 0.0


class CompileThenRelease:
  """A jitted function whose every new input signature is compiled ahead of
  its first run (`lower(...).compile()`), with `release()` in between.

  A plain jit call compiles and then runs with the compiler's freed memory
  still resident, so the run's buffers add to it; here they can reuse it.
  Measured on a LoRA GRPO iteration of SmolLM2-135M (experiments/bench_lora.md):
  peak RSS 3.30 GB -> 2.77 GB with `configure()`. The compiled executables
  are kept per signature (the pytree structure and every leaf's shape and
  dtype), so each is compiled once, as jit does.

  Args:
    jitted: a `jax.jit`-wrapped function.
  """

  def __init__(self, jitted):
    self._jitted = jitted
    self._compiled = {}

  def __call__(self, *args):
    import jax  # pylint: disable=g-import-not-at-top

    leaves, treedef = jax.tree.flatten(args)
    key = (
        treedef,
        tuple(
            (jax.numpy.shape(x), str(getattr(x, "dtype", type(x).__name__)))
            for x in leaves
        ),
    )
    fn = self._compiled.get(key)
    if fn is None:
      fn = self._jitted.lower(*args).compile()
      release()
      self._compiled[key] = fn
    return fn(*args)

  def lower(self, *args):
    """The wrapped jit function's `lower` (for inspection)."""
    return self._jitted.lower(*args)
