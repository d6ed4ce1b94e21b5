"""Host (CPU) memory of the training process: glibc malloc settings.

On a CPU backend every array and every compiler structure lives in the
process heap, and glibc's malloc keeps memory that has been freed: (1) its
mmap threshold rises to the size of each large block freed, so later large
arrays come from the heap, whose freed pages are not returned; (2) the
compiler's many small allocations stay in the heap after a compile. Both
show up as resident memory the process no longer uses (measured on a LoRA
GRPO iteration of SmolLM2-135M: experiments/bench_lora.md).

`configure()` fixes the mmap threshold (large arrays are mapped and unmapped
one by one, so a freed array's pages go back to the system at once) and
`release()` returns the heap's free pages (`malloc_trim(0)`), e.g. after
compiling a large program and before running it. Both are no-ops where the C
library is not glibc. Neither changes any computed value.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

# mallopt parameter number of M_MMAP_THRESHOLD (glibc malloc.h).
_M_MMAP_THRESHOLD = -3
# Blocks at least this large are mmapped (glibc's initial default, 128 KiB).
MMAP_THRESHOLD_BYTES = 128 * 1024


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


def configure(threshold_bytes: int = MMAP_THRESHOLD_BYTES) -> bool:
  """Fixes glibc's mmap threshold at `threshold_bytes` (which also turns off
  its dynamic raising). Returns whether it was set (False: not glibc)."""
  libc = _libc()
  if libc is None:
    return False
  return bool(libc.mallopt(_M_MMAP_THRESHOLD, int(threshold_bytes)))


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
