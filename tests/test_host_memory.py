"""glibc malloc handling of agentic_rl/host_memory.py, measured on this
process's resident memory."""

import ctypes.util
import os
import subprocess
import sys

import numpy as np
import pytest

from agentic_rl import host_memory

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

glibc = pytest.mark.skipif(
    host_memory._libc() is None,  # pylint: disable=protected-access
    reason="not glibc",
)


@glibc
def test_release_returns_freed_heap_pages():
  # 3000 blocks of 64 KiB (below the mmap threshold: they come from the heap)
  # = 188 MiB, touched, each followed by a small block that stays alive;
  # freeing the large ones leaves holes glibc does not give back on its own
  # (only the heap's top is trimmed automatically) until release().
  assert ctypes.util.find_library("c")
  blocks, pins = [], []
  for _ in range(3000):
    blocks.append(np.ones(64 * 1024 // 8))
    pins.append(bytearray(512))
  held = host_memory.rss_gb()
  del blocks
  before = host_memory.rss_gb()
  host_memory.release()
  after = host_memory.rss_gb()
  assert held > 0.15 and len(pins) == 3000
  assert before - after > 0.1, (held, before, after)


_FREED_SHARE = """
import sys
import numpy as np
from agentic_rl import host_memory
host_memory.configure(int(sys.argv[1]))
arrays, pins = [], []
for _ in range(50):
  arrays.append(np.ones(4 * 2**20 // 8))  # 4 MiB
  pins.append(np.ones(1024))  # 8 KiB from malloc (bytearrays use pymalloc)
held = host_memory.rss_gb()
del arrays
print(held - host_memory.rss_gb())
"""


def _freed_share(threshold_bytes: int) -> float:
  """GiB of resident memory given back at once when 50 arrays of 4 MiB, each
  followed by a small live block, are freed, in a fresh interpreter whose
  mmap threshold is fixed at `threshold_bytes` (a fresh heap: in a process
  with free heap chunks glibc serves even large blocks from them)."""
  out = subprocess.run(
      [sys.executable, "-c", _FREED_SHARE, str(threshold_bytes)],
      capture_output=True,
      text=True,
      check=True,
      cwd=REPO,
      env=dict(os.environ, PYTHONPATH=REPO),
  )
  return float(out.stdout.split()[-1])


@glibc
def test_fixed_threshold_returns_freed_arrays_at_once():
  # 50 arrays of 4 MiB (200 MiB) between live small blocks. Under a 64 MiB
  # threshold (as glibc's dynamic threshold reaches after freeing a large
  # block) they come from the heap and their pages stay resident when freed;
  # under configure()'s fixed 128 KiB they are mapped one by one and go back
  # to the system when freed.
  assert _freed_share(64 * 2**20) < 0.05
  assert _freed_share(host_memory.MMAP_THRESHOLD_BYTES) > 0.15


_THREAD_BLOCKS = """
import ctypes, ctypes.util, resource, threading
import agentic_rl
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
size = 96 * 2**20
out = {}
def work():
  libc.free(libc.malloc(64))  # this thread's arena exists before the count
  before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  for _ in range(8):
    p = libc.malloc(size)
    ctypes.memset(p, 1, size)  # every page written
    libc.free(p)
  out["faults"] = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
t = threading.Thread(target=work)
t.start()
t.join()
print(agentic_rl.HOST_MEMORY, out["faults"])
"""


def _thread_block_faults(mode: str) -> tuple[str, int]:
  """(policy applied, minor page faults) of a worker thread that allocates,
  fills and frees a 96 MiB array 8 times, in a fresh interpreter with
  AGENTIC_RL_HOST_MEMORY=`mode`."""
  env = dict(os.environ, PYTHONPATH=REPO, AGENTIC_RL_HOST_MEMORY=mode)
  env.pop("LD_PRELOAD", None)
  out = subprocess.run(
      [sys.executable, "-c", _THREAD_BLOCKS],
      capture_output=True,
      text=True,
      check=True,
      cwd=REPO,
      env=env,
  )
  applied, faults = out.stdout.split()[-2:]
  return applied, int(faults)


@glibc
def test_keep_reuses_a_worker_threads_large_block():
  # XLA's worker threads allocate each execution's temporary block (166 MiB
  # in the default job's RL iteration). As glibc comes, a thread arena maps
  # any block over 64 MiB and unmaps it when freed: 8 rounds of a 96 MiB
  # block (malloc, written, freed; numpy is avoided, it asks for huge pages)
  # fault in 8 x 24576 pages. 'keep' serves the later rounds from the
  # first one's pages: about one round's faults.
  pages = 96 * 2**20 // 4096
  applied, faults_system = _thread_block_faults("system")
  assert applied == "system" and faults_system > 6 * pages, faults_system
  applied, faults_keep = _thread_block_faults("keep")
  assert applied == "keep" and faults_keep < 2 * pages, faults_keep


def test_mode_from_environment(monkeypatch):
  monkeypatch.delenv(host_memory.ENV, raising=False)
  assert host_memory.mode_from_environment() == "keep"
  monkeypatch.setenv(host_memory.ENV, "return")
  assert host_memory.mode_from_environment() == "return"
  monkeypatch.setenv(host_memory.ENV, "fast")
  with pytest.raises(ValueError, match="AGENTIC_RL_HOST_MEMORY='fast'"):
    host_memory.mode_from_environment()
  with pytest.raises(ValueError, match="host memory mode 'fast'"):
    host_memory.apply("fast")


def test_a_preloaded_allocator_is_left_alone(monkeypatch):
  monkeypatch.setenv("LD_PRELOAD", "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2")
  assert host_memory.preloaded_allocator() == "jemalloc"
  assert host_memory.apply("keep") == "preloaded:jemalloc"
  monkeypatch.setenv("LD_PRELOAD", "")
  assert host_memory.preloaded_allocator() is None


def test_not_glibc_sets_nothing_and_says_so_once(monkeypatch, capsys):
  monkeypatch.delenv("LD_PRELOAD", raising=False)
  monkeypatch.delenv(host_memory.ENV, raising=False)
  monkeypatch.setattr(host_memory, "_libc", lambda: None)
  assert host_memory.apply_from_environment() == "unavailable"
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "not glibc" in err[0]
  monkeypatch.setenv(host_memory.ENV, "system")
  assert host_memory.apply_from_environment() == "unavailable"
  assert capsys.readouterr().err == ""


def test_compile_then_release_compiles_once_per_signature(monkeypatch):
  import jax  # noqa: PLC0415
  import jax.numpy as jnp  # noqa: PLC0415

  released = []
  monkeypatch.setattr(host_memory, "release", lambda: released.append(1))
  traced = []

  def f(x, y):
    traced.append(x.shape)
    return {"s": jnp.sum(x * y), "x": x + 1}

  wrapped = host_memory.CompileThenRelease(jax.jit(f))
  x4 = jnp.arange(4.0)
  out = wrapped(x4, 2.0)
  assert float(out["s"]) == 12.0 and out["x"].tolist() == [1, 2, 3, 4]
  wrapped(x4 + 1, 3.0)  # same signature: no new compile
  assert traced == [(4,)] and released == [1]
  out = wrapped(jnp.ones(3), 1.0)  # a new length: compiled and released
  assert float(out["s"]) == 3.0
  assert traced == [(4,), (3,)] and released == [1, 1]
  assert "add" in wrapped.lower(x4, 2.0).as_text()


_ENTRY = """
import os, subprocess, sys
sys.path.insert(0, {repo!r})
from agentic_rl import host_memory
got = host_memory.reexec_with_jemalloc(("entry.py",))


def dirty_decay_ms():
  # jemalloc's setting as it took effect at start (MALLOC_CONF is read then).
  import ctypes
  try:
    mallctl = ctypes.CDLL(None).mallctl
  except AttributeError:
    return "-"
  v, size = ctypes.c_ssize_t(0), ctypes.c_size_t(8)
  mallctl(b"opt.dirty_decay_ms", ctypes.byref(v), ctypes.byref(size), None, 0)
  return v.value


child = subprocess.run(
    [sys.executable, "-c", "import os; print(os.environ.get('LD_PRELOAD'))"],
    capture_output=True, text=True, check=True).stdout.strip()
print(got, host_memory.jemalloc_loaded(), host_memory.release(),
      os.environ.get("MALLOC_CONF", "-"), child, dirty_decay_ms(),
      "|".join(sys.argv[1:]) or "-")
"""

linux = pytest.mark.skipif(
    not sys.platform.startswith("linux") or host_memory._libc() is None,  # pylint: disable=protected-access
    reason="Linux with glibc only",
)
with_jemalloc = pytest.mark.skipif(
    host_memory.jemalloc_library() is None,
    reason="libjemalloc.so.2 not installed (Debian package libjemalloc2)",
)


def _run_entry(tmp_path, extra_env, *args):
  """Runs a script named entry.py that calls reexec_with_jemalloc(('entry.py',))
  in a fresh interpreter; returns (stdout fields, stderr)."""
  script = tmp_path / "entry.py"
  script.write_text(_ENTRY.format(repo=REPO))
  drop = (
      "LD_PRELOAD",
      "MALLOC_CONF",
      host_memory.ENV,
      host_memory.JEMALLOC_ENV,
      host_memory._REEXEC_GUARD,  # pylint: disable=protected-access
  )
  env = {k: v for k, v in os.environ.items() if k not in drop}
  env.update(extra_env)
  proc = subprocess.run(
      [sys.executable, "-X", "utf8", str(script), *args],
      capture_output=True,
      text=True,
      timeout=120,
      env=env,
  )
  assert proc.returncode == 0, proc.stderr
  return proc.stdout.split(), proc.stderr


@linux
@with_jemalloc
def test_entry_point_reexecutes_itself_on_jemalloc(tmp_path):
  # Started as the entry point (after an interpreter option with a value,
  # -X utf8): the process runs again with jemalloc mapped, its arguments
  # kept, the keep setting in effect (dirty_decay_ms -1: never decays);
  # release() purges jemalloc's arenas; LD_PRELOAD and MALLOC_CONF are the
  # user's again (unset), so a child is not preloaded.
  fields, err = _run_entry(tmp_path, {}, "--a=1", "b=c")
  assert fields == ["jemalloc", "True", "True", "-", "None", "-1", "--a=1|b=c"]
  assert err == ""
  # A user's MALLOC_CONF wins (jemalloc's default decay, 10 s, stays).
  fields, err = _run_entry(tmp_path, {"MALLOC_CONF": "narenas:2"})
  assert fields[0] == "jemalloc" and fields[3] == "narenas:2", err
  assert fields[5] == "10000", fields
  # Already preloaded by the user: no re-exec, a child inherits it.
  lib = host_memory.jemalloc_library()
  fields, err = _run_entry(tmp_path, {"LD_PRELOAD": lib})
  assert fields[:2] == ["jemalloc", "True"] and fields[4] == lib, err
  # A guard inherited from a parent's re-exec (another PID) is ignored.
  guard = '{"pid": 1, "LD_PRELOAD": null, "MALLOC_CONF": null}'
  fields, err = _run_entry(
      tmp_path,
      {host_memory._REEXEC_GUARD: guard},  # pylint: disable=protected-access
  )
  assert fields[:2] == ["jemalloc", "True"] and err == "", err
  # Opted out, or another policy: glibc, no re-exec, no message.
  for env, why in (
      ({host_memory.JEMALLOC_ENV: "0"}, "AGENTIC_RL_JEMALLOC=0"),
      ({host_memory.ENV: "system"}, "AGENTIC_RL_HOST_MEMORY=system"),
  ):
    fields, err = _run_entry(tmp_path, env)
    assert fields[:3] == ["off:", why, "False"] and err == "", err


@linux
def test_missing_jemalloc_is_one_line_and_glibc_keep(tmp_path):
  fields, err = _run_entry(
      tmp_path, {host_memory.JEMALLOC_ENV: str(tmp_path / "no_such.so")}
  )
  assert fields[:2] == ["unavailable", "False"]
  lines = err.strip().splitlines()
  assert len(lines) == 1 and "libjemalloc.so.2 not found" in lines[0], err


def test_only_the_named_entry_point_is_reexecuted(monkeypatch):
  started = host_memory._started_as  # pylint: disable=protected-access
  assert started(["main.py", "--workdir=x"], ("main.py",))
  assert started(["-X", "utf8", "/r/main.py"], ("main.py",))
  assert started(["-Xutf8", "-W", "error", "main.py"], ("main.py",))
  assert started(["-u", "-m", "experiments.x", "-s"], ("-m", "experiments.x"))
  assert started(["-um", "experiments.x"], ("-m", "experiments.x"))
  assert started(["-mexperiments.x"], ("-m", "experiments.x"))
  assert started(["--check-hash-based-pycs", "never", "main.py"], ("main.py",))
  assert not started(["-m", "pytest", "tests"], ("-m", "experiments.x"))
  assert not started(["-m", "experiments.xy"], ("-m", "experiments.x"))
  assert not started(["-c", "import main"], ("main.py",))
  assert not started(["-uc", "import main"], ("main.py",))
  assert not started(["tests/test_x.py"], ("main.py",))
  assert not started(["-"], ("main.py",))
  assert not started([], ("main.py",))
  # In this process (pytest): never re-executed.
  for k in ("LD_PRELOAD", host_memory.JEMALLOC_ENV, host_memory.ENV):
    monkeypatch.delenv(k, raising=False)
  if sys.platform.startswith("linux") and not host_memory.jemalloc_loaded():
    got = host_memory.reexec_with_jemalloc(("main.py",))
    assert got == "off: not started as main.py"


def test_claim_runners_not_benchmarks_are_reexecuted(monkeypatch):
  # experiments/__init__.py: a package under experiments/ started with -m is
  # a claim runner; a benchmark script (a module file) is not.
  import experiments  # pylint: disable=g-import-not-at-top

  for argv, want in (
      (["python", "-m", "experiments.dark_room"], "experiments.dark_room"),
      (
          ["python", "-m", "experiments.trace_credit.faithful"],
          "experiments.trace_credit.faithful",
      ),
      (["python", "-m", "experiments.bench_lora", "--child"], None),
      (["python", "experiments/bench_peers.py"], None),
      (["python", "-m", "pytest"], None),
  ):
    monkeypatch.setattr(sys, "orig_argv", argv)
    got = experiments._claim_runner_module()  # pylint: disable=protected-access
    assert got == want, argv
