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

jemalloc at the entry points. Under 'keep', the command-line entry points
(`python main.py`, `python -m experiments.<claim>`) call
`reexec_with_jemalloc` first: where the Debian package libjemalloc2 is
installed, the process starts itself again (same PID, same argv) with
jemalloc preloaded and told to keep its memory (`MALLOC_CONF` = JEMALLOC_CONF:
retain mappings, no decay). It must be preloaded at process start, hence the
re-exec. Measured (docs/models.md): the RL iteration 0.253 -> 0.210 s against
glibc keep, the same faults and system time. `AGENTIC_RL_JEMALLOC=0` turns it
off; `=PATH` names the library; where it is absent one line on stderr says
so and glibc keep stays. Library code, tests and an interpreter started any
other way are never re-executed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import json
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
# jemalloc at the entry points (reexec_with_jemalloc).
JEMALLOC_ENV = "AGENTIC_RL_JEMALLOC"
# Keep freed memory mapped and dirty pages unreturned: the 'keep' policy.
JEMALLOC_CONF = "retain:true,dirty_decay_ms:-1,muzzy_decay_ms:-1"
JEMALLOC_PATHS = (
    "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
    "/usr/lib/aarch64-linux-gnu/libjemalloc.so.2",
    "/usr/lib64/libjemalloc.so.2",
    "/usr/lib/libjemalloc.so.2",
    "/usr/local/lib/libjemalloc.so.2",
)
# Set in the re-executed process: never re-executes twice.
_REEXEC_GUARD = "AGENTIC_RL_JEMALLOC_REEXEC"


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
  'tcmalloc', 'mimalloc') from `LD_PRELOAD`, or 'jemalloc' when it is
  mapped (an entry point re-executed on it), or None."""
  preload = os.environ.get("LD_PRELOAD", "")
  for name in _PRELOADED:
    if name in preload:
      return name
  if jemalloc_loaded():  # re-executed on it (LD_PRELOAD restored since)
    return "jemalloc"
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


def jemalloc_loaded() -> bool:
  """Whether libjemalloc (or the library `AGENTIC_RL_JEMALLOC` names) is
  mapped into this process (/proc/self/maps; False where that file does not
  exist)."""
  names = ["libjemalloc"]
  named = os.environ.get(JEMALLOC_ENV, "").strip()
  if named not in ("", "0", "1"):
    names.append(os.path.basename(named))
  try:
    with open("/proc/self/maps") as f:
      return any(any(n in line for n in names) for line in f)
  except OSError:
    return False


def jemalloc_library() -> str | None:
  """Path of libjemalloc.so.2: `AGENTIC_RL_JEMALLOC` when it holds a path,
  else the first of JEMALLOC_PATHS that exists; None when none does."""
  named = os.environ.get(JEMALLOC_ENV, "").strip()
  if named and named not in ("0", "1"):
    return named if os.path.exists(named) else None
  for path in JEMALLOC_PATHS:
    if os.path.exists(path):
      return path
  return None


def _started_module(args: list[str]) -> tuple[str, str] | None:
  """How interpreter arguments `args` (sys.orig_argv[1:]) start Python:
  ('-m', module), ('script', path) or None (-c, stdin, an interactive
  interpreter). Short options may be clustered (-um mod, -mmod)."""
  i = 0
  while i < len(args):
    a = args[i]
    if a == "-" or not a.startswith("-"):
      return None if a == "-" else ("script", a)
    if a.startswith("--"):
      i += 2 if a == "--check-hash-based-pycs" else 1
      continue
    for k, ch in enumerate(a[1:], start=1):
      if ch in "mcXW":
        rest = a[k + 1 :]
        if ch in "mc":
          value = rest or (args[i + 1] if i + 1 < len(args) else "")
          return ("-m", value) if ch == "m" and value else None
        if not rest:
          i += 1  # the option's value is the next argument
        break
    i += 1
  return None


def _started_as(args: list[str], entry: tuple[str, ...]) -> bool:
  """Whether interpreter arguments `args` start the entry point `entry`:
  ('-m', 'pkg.mod'), or ('script.py',) (by basename)."""
  started = _started_module(args)
  if started is None:
    return False
  kind, name = started
  if kind == "-m":
    return len(entry) == 2 and entry[0] == "-m" and name == entry[1]
  return len(entry) == 1 and os.path.basename(name) == entry[0]


def _restore_environment(saved: dict) -> None:
  """Puts LD_PRELOAD and MALLOC_CONF back to what the user had before the
  re-exec (children start as the user's own processes would) and drops the
  guard."""
  for key in ("LD_PRELOAD", "MALLOC_CONF"):
    if saved.get(key) is None:
      os.environ.pop(key, None)
    else:
      os.environ[key] = saved[key]
  os.environ.pop(_REEXEC_GUARD, None)


def reexec_with_jemalloc(entry: tuple[str, ...]) -> str:
  """Starts this process again with jemalloc preloaded, at an entry point.

  Call first thing in a command-line entry point, before any heavy work.
  Re-executes (os.execve: same PID, same arguments and environment, plus
  LD_PRELOAD = the library and MALLOC_CONF = JEMALLOC_CONF unless set) only
  when all hold: the host memory policy is 'keep', `AGENTIC_RL_JEMALLOC` is
  not '0', no allocator is preloaded yet, the process is on Linux, and it was
  started as `entry` (sys.orig_argv): a test or library caller that reaches
  the same code in another interpreter is never re-executed. In the
  re-executed process LD_PRELOAD and MALLOC_CONF are put back to the user's
  values, so the processes it starts are not preloaded by inheritance (an
  entry point among them decides for itself).

  Args:
    entry: how this entry point is started: ('-m', 'experiments.dark_room')
      or ('main.py',).

  Returns:
    'jemalloc' when this process runs on jemalloc (re-executed or preloaded
    by the user); 'unavailable' when the library is absent or its preload
    did not take (one line on stderr says so; glibc keep stays); otherwise
    'off: <why>'. Does not return when it re-executes.

  Raises:
    ValueError: `AGENTIC_RL_HOST_MEMORY` holds an unknown value.
  """
  saved = None
  guard = os.environ.get(_REEXEC_GUARD)
  if guard:
    try:
      saved = json.loads(guard)
    except ValueError:
      saved = None
    if not isinstance(saved, dict) or saved.get("pid") != os.getpid():
      # Inherited from a parent's re-exec, not this process's own.
      saved = None
      os.environ.pop(_REEXEC_GUARD, None)
  if saved is not None:  # this process was re-executed by us
    loaded = jemalloc_loaded()
    _restore_environment(saved)
    if loaded:
      return "jemalloc"
    print(
        "agentic_rl: jemalloc was preloaded but is not in this process; "
        "running on glibc with freed memory kept (docs/models.md, host "
        "memory)",
        file=sys.stderr,
    )
    return "unavailable"
  if jemalloc_loaded():
    return "jemalloc"
  if os.environ.get(JEMALLOC_ENV, "").strip() == "0":
    return f"off: {JEMALLOC_ENV}=0"
  mode = mode_from_environment()
  if mode != "keep":
    return f"off: {ENV}={mode}"
  other = preloaded_allocator()
  if other is not None:
    return f"off: {other} preloaded"
  if not sys.platform.startswith("linux"):
    return "off: not Linux"
  args = list(getattr(sys, "orig_argv", [])[1:])
  if not _started_as(args, entry):
    return "off: not started as " + " ".join(entry)
  lib = jemalloc_library()
  if lib is None:
    print(
        "agentic_rl: libjemalloc.so.2 not found (Debian package libjemalloc2, "
        f"or {JEMALLOC_ENV}=PATH): running on glibc with freed memory kept, "
        "~17% slower RL iterations on CPU (docs/models.md, host memory)",
        file=sys.stderr,
    )
    return "unavailable"
  env = dict(os.environ)
  env[_REEXEC_GUARD] = json.dumps(
      {
          "pid": os.getpid(),
          "LD_PRELOAD": env.get("LD_PRELOAD"),
          "MALLOC_CONF": env.get("MALLOC_CONF"),
      }
  )
  env["LD_PRELOAD"] = " ".join(p for p in (lib, env.get("LD_PRELOAD")) if p)
  env.setdefault("MALLOC_CONF", JEMALLOC_CONF)
  sys.stdout.flush()
  sys.stderr.flush()
  os.execve(sys.executable, [sys.executable, *args], env)
  return "jemalloc"  # not reached


def _jemalloc_purge() -> bool:
  """Returns jemalloc's unused dirty pages of every arena to the system
  (`mallctl("arena.4096.purge")`, 4096 = MALLCTL_ARENAS_ALL). False where
  the symbol is not in the process or the call fails."""
  try:
    mallctl = ctypes.CDLL(None).mallctl
  except (OSError, AttributeError):
    return False
  mallctl.argtypes = (
      ctypes.c_char_p,
      ctypes.c_void_p,
      ctypes.c_void_p,
      ctypes.c_void_p,
      ctypes.c_size_t,
  )
  return mallctl(b"arena.4096.purge", None, None, None, 0) == 0


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
  """Returns the heap's free pages to the system: glibc `malloc_trim(0)`, or
  under jemalloc its purge of every arena's unused pages (`mallctl`).
  Returns whether any memory was released (glibc) or the purge ran
  (jemalloc); False when neither applies."""
  if jemalloc_loaded():
    return _jemalloc_purge()
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
