"""A sandboxed Python code-interpreter tool (tool-integrated math reasoning).

Every call runs `code` in a fresh `python -I` child process, in its own empty
temporary directory (its cwd, deleted afterwards), and returns its stdout (and the
tail of stderr on failure) as the observation. A call that breaks a limit returns an
`ExecResult` with `ok=False` and an `error` naming the limit; nothing is raised in
the caller, so the episode goes on. Calls of one batch run concurrently in a
bounded thread pool (`run_batch`).

What is enforced, and by what (honest list):

  * Wall time: the parent waits `wall_seconds`, then SIGKILLs the child's whole
    process group. In namespace mode (below) the child is PID 1 of its own PID
    namespace, so every process it spawned dies with it (the kernel kills a PID
    namespace when its init exits) even if one left the process group.
  * CPU time: RLIMIT_CPU (kernel; SIGXCPU then SIGKILL).
  * Memory: RLIMIT_AS (kernel; allocations fail, Python raises MemoryError).
  * Output size: stdout/stderr go to files; RLIMIT_FSIZE caps every file the child
    writes (kernel) and the observation is truncated to `max_output_chars`.
  * Process creation: an audit hook (PEP 578) installed before the user code runs
    refuses os.fork/forkpty/exec*/spawn*/posix_spawn/system and subprocess.Popen,
    and `_posixsubprocess.fork_exec` is replaced by a refusal; RLIMIT_NPROC is also set, but Linux does not enforce
    it for root, which is what this machine runs as. So a fork bomb in Python is
    refused by the hook; one in native code (bypassing the hook) is bounded only
    by the wall-time kill and the PID-namespace teardown.
  * Network: in namespace mode the child runs in a new, empty network namespace
    (`unshare --net`: only a down loopback device; kernel-enforced). In every mode
    the audit hook also refuses socket creation.
  * File writes: the cwd is a fresh temporary directory; the audit hook refuses
    `open` for writing (and remove/rename/mkdir/rmdir/chmod/chown/link/symlink/
    truncate/utime) on any path that does not resolve inside it.
  * ctypes: the hook refuses `ctypes.dlsym` (looking up a C function) and
    `ctypes.dlopen` of a named library, so libc cannot be called to bypass it.

What is NOT guaranteed: audit hooks are a guard against accidental or
model-written code, not a security boundary against an adversary with native
code; a C extension module already installed could bypass them. Reads are not
restricted (the child can read any file the training process can). The child
runs with the same uid as the trainer. Namespace mode needs `unshare` and the
right to create namespaces (root, or unprivileged user namespaces); when it is
unavailable (`isolation='hooks'`, or 'auto' after a failed probe) the network and
process guarantees are the audit hook's only. `Sandbox.isolation` says which mode
is in force.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from typing import Sequence

# The child's bootstrap: set limits, install the audit hook, run the user code.
# argv[1] is a JSON dict of limits; the user code is in ./_main.py.
_BOOTSTRAP = r'''
import json, os, resource, signal, sys
def _on_xcpu(signum, frame):
  os.write(2, b"\nsandbox: CPU time limit exceeded\n")
  os._exit(152)
signal.signal(signal.SIGXCPU, _on_xcpu)
_cfg = json.loads(sys.argv[1])
for _name, _value in (("RLIMIT_CPU", _cfg["cpu"]), ("RLIMIT_AS", _cfg["mem"]),
                      ("RLIMIT_FSIZE", _cfg["fsize"]), ("RLIMIT_CORE", 0),
                      ("RLIMIT_NPROC", _cfg["nproc"]), ("RLIMIT_NOFILE", 256)):
  try:
    _hard = _value + 1 if _name == "RLIMIT_CPU" else _value  # SIGXCPU first
    resource.setrlimit(getattr(resource, _name), (_value, _hard))
  except (ValueError, OSError):
    pass
_root = os.path.realpath(os.getcwd())
_code = open("_main.py").read()
def _inside(path):
  try:
    if isinstance(path, int):
      return True  # an already-open descriptor
    p = os.path.realpath(os.fsdecode(path))
  except Exception:
    return False
  return p == _root or p.startswith(_root + os.sep)
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_PROC = {"os.fork", "os.forkpty", "os.exec", "os.spawn", "os.posix_spawn",
         "os.system", "subprocess.Popen", "pty.spawn"}
_FS_ONE = {"os.remove", "os.rmdir", "os.mkdir", "os.chmod", "os.chown",
           "os.truncate", "os.utime", "os.chflags", "os.lchflags",
           "shutil.rmtree", "os.mkfifo", "os.mknod"}
_FS_TWO = {"os.rename", "os.link", "os.symlink", "shutil.copyfile", "shutil.move"}
def _hook(event, args):
  if event == "open":
    path, mode, flags = (tuple(args) + (None, None, 0))[:3]
    writing = bool(mode) and any(c in str(mode) for c in "wax+")
    writing = writing or bool((flags or 0) & _WRITE_FLAGS)
    if writing and not _inside(path):
      raise PermissionError(f"sandbox: writing outside the working directory is refused: {path!r}")
  elif event in _PROC:
    raise PermissionError(f"sandbox: process creation is refused ({event})")
  elif event.startswith("socket.") and event != "socket.gethostname":
    raise PermissionError(f"sandbox: network access is refused ({event})")
  elif event == "ctypes.dlsym" or (event == "ctypes.dlopen" and args and args[0] is not None):
    raise PermissionError(f"sandbox: native calls are refused ({event})")
  elif event in _FS_ONE and args and not _inside(args[0]):
    raise PermissionError(f"sandbox: {event} outside the working directory is refused")
  elif event in _FS_TWO and len(args) > 1 and not (_inside(args[0]) and _inside(args[1])):
    raise PermissionError(f"sandbox: {event} outside the working directory is refused")
sys.addaudithook(_hook)
import _posixsubprocess
def _no_fork_exec(*args, **kwargs):
  raise PermissionError("sandbox: process creation is refused (fork_exec)")
_posixsubprocess.fork_exec = _no_fork_exec
del json, resource
sys.argv = ["main.py"]
_g = {"__name__": "__main__", "__builtins__": __builtins__}
exec(compile(_code, "main.py", "exec"), _g)
'''

_NAMESPACE_PREFIX = ("unshare", "--net", "--pid", "--fork", "--kill-child")


@dataclasses.dataclass(frozen=True)
class SandboxConfig:
  """Limits of one call.

  Attributes:
    cpu_seconds: RLIMIT_CPU of the child, seconds of CPU time.
    wall_seconds: wall-clock limit, seconds (includes interpreter start, ~0.1 s).
    memory_bytes: RLIMIT_AS (virtual address space) of the child, bytes.
    max_output_chars: stdout (and stderr) is truncated to this many characters.
    max_file_bytes: RLIMIT_FSIZE: largest file the child may write (incl. its
      stdout), bytes.
    max_processes: RLIMIT_NPROC (not enforced by Linux for root; see module doc).
    max_workers: concurrent calls in `run_batch`.
    isolation: 'auto' (namespaces if they work here, else hooks), 'namespace'
      (fail if unavailable) or 'hooks' (audit hook and rlimits only).
  """

  cpu_seconds: int = 5
  wall_seconds: float = 10.0
  memory_bytes: int = 1 << 30
  max_output_chars: int = 2000
  max_file_bytes: int = 1 << 20
  max_processes: int = 32
  max_workers: int = 4
  isolation: str = "auto"

  def __post_init__(self):
    for name in ("cpu_seconds", "memory_bytes", "max_output_chars",
                 "max_file_bytes", "max_processes", "max_workers"):
      v = getattr(self, name)
      if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ValueError(f"SandboxConfig.{name}={v!r}: must be a positive integer")
    if not self.wall_seconds > 0:
      raise ValueError(f"SandboxConfig.wall_seconds={self.wall_seconds!r}: must be > 0")
    if self.isolation not in ("auto", "namespace", "hooks"):
      raise ValueError(f"SandboxConfig.isolation={self.isolation!r}: "
                       "must be 'auto', 'namespace' or 'hooks'")


@dataclasses.dataclass(frozen=True)
class ExecResult:
  """Outcome of one call.

  Attributes:
    stdout: the child's stdout, truncated to max_output_chars.
    stderr: the tail of its stderr, truncated to max_output_chars.
    ok: exit status 0 within every limit.
    error: None, or one of 'timeout', 'cpu_limit', 'memory_limit',
      'output_limit', 'refused' (an audit-hook refusal), 'exception' (the code
      raised), 'killed' (another signal), 'sandbox_failure' (could not start).
    truncated: stdout or stderr was cut.
    returncode: the child's exit status (negative: killed by that signal).
  """

  stdout: str
  stderr: str
  ok: bool
  error: str | None
  truncated: bool
  returncode: int

  def observation(self, max_chars: int | None = None) -> str:
    """The text shown to the policy: stdout, or an error line plus stderr's tail."""
    if self.ok:
      text = self.stdout + ("\n[output truncated]" if self.truncated else "")
    else:
      last = self.stderr.strip().splitlines()[-1:] if self.stderr.strip() else []
      text = f"Error ({self.error})" + (f": {last[0]}" if last else "")
      if self.stdout:
        text = self.stdout + "\n" + text
    return text if max_chars is None else text[:max_chars]


@functools.lru_cache(maxsize=None)
def namespaces_available() -> bool:
  """Whether `unshare --net --pid --fork --kill-child` works on this machine."""
  if shutil.which("unshare") is None:
    return False
  try:
    r = subprocess.run(list(_NAMESPACE_PREFIX) + ["true"], capture_output=True,
                       timeout=10)
  except (OSError, subprocess.SubprocessError):
    return False
  return r.returncode == 0


def _read_capped(path: str, max_chars: int) -> tuple[str, bool]:
  with open(path, "rb") as f:
    data = f.read(4 * max_chars + 4)
  text = data.decode("utf-8", errors="replace")
  return text[:max_chars], len(text) > max_chars


def _tail_capped(path: str, max_chars: int) -> str:
  size = os.path.getsize(path)
  with open(path, "rb") as f:
    f.seek(max(0, size - 4 * max_chars))
    return f.read().decode("utf-8", errors="replace")[-max_chars:]


class Sandbox:
  """Runs Python code under the limits of a `SandboxConfig` (see module doc).

  Thread-safe; `run_batch` uses an internal pool of `max_workers` threads (each
  call is its own process).
  """

  def __init__(self, config: SandboxConfig = SandboxConfig()):
    self.config = config
    if config.isolation == "hooks":
      self.isolation = "hooks"
    elif namespaces_available():
      self.isolation = "namespace"
    elif config.isolation == "namespace":
      raise RuntimeError("SandboxConfig.isolation='namespace' but `unshare --net "
                         "--pid` does not work on this machine")
    else:
      self.isolation = "hooks"
    self._pool = concurrent.futures.ThreadPoolExecutor(
        max_workers=config.max_workers, thread_name_prefix="sandbox")

  def close(self):
    self._pool.shutdown(wait=True)

  def run(self, code: str) -> ExecResult:
    """Runs one program; never raises (failures are an ExecResult with ok=False).

    Args:
      code: Python source (any string; non-strings give a 'sandbox_failure').
    """
    try:
      return self._run(code)
    except Exception as e:  # noqa: BLE001 -- the episode must go on
      return ExecResult("", f"{type(e).__name__}: {e}", False, "sandbox_failure",
                        False, -1)

  def run_batch(self, codes: Sequence[str]) -> list[ExecResult]:
    """Runs programs concurrently (at most max_workers at once), in order."""
    return list(self._pool.map(self.run, codes))

  def _run(self, code: str) -> ExecResult:
    if not isinstance(code, str):
      raise TypeError(f"code must be str, got {type(code).__name__}")
    cfg = self.config
    workdir = tempfile.mkdtemp(prefix="agentic_rl_sandbox_")
    outdir = tempfile.mkdtemp(prefix="agentic_rl_sandbox_out_")
    try:
      with open(os.path.join(workdir, "_main.py"), "w", encoding="utf-8",
                errors="surrogatepass") as f:
        f.write(code)
      limits = json.dumps(dict(cpu=cfg.cpu_seconds, mem=cfg.memory_bytes,
                               fsize=cfg.max_file_bytes, nproc=cfg.max_processes))
      argv = [sys.executable, "-I", "-B", "-c", _BOOTSTRAP, limits]
      if self.isolation == "namespace":
        argv = list(_NAMESPACE_PREFIX) + argv
      env = {"PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir,
             "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8",
             "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
             "MKL_NUM_THREADS": "1"}
      out_path = os.path.join(outdir, "stdout")
      err_path = os.path.join(outdir, "stderr")
      with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(argv, cwd=workdir, env=env, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=err, start_new_session=True,
                                close_fds=True)
        timed_out = False
        try:
          proc.wait(timeout=cfg.wall_seconds)
        except subprocess.TimeoutExpired:
          timed_out = True
        finally:
          try:
            os.killpg(proc.pid, signal.SIGKILL)
          except (ProcessLookupError, PermissionError):
            pass
          proc.wait()
      stdout, t1 = _read_capped(out_path, cfg.max_output_chars)
      # Classify on a long tail; show at most max_output_chars of it.
      stderr = _tail_capped(err_path, max(cfg.max_output_chars, 8192))
      # Drop the namespace wrapper's own complaints about its child's death.
      stderr = "\n".join(l for l in stderr.splitlines()
                         if not l.startswith("unshare: "))
      t2 = os.path.getsize(err_path) > 4 * cfg.max_output_chars
      rc = proc.returncode
      # Under `unshare --fork` a child killed by signal s exits with 128 + s.
      sig = -rc if rc < 0 else (rc - 128 if rc > 128 else 0)
      out_full = os.path.getsize(out_path) >= cfg.max_file_bytes
      if timed_out:
        error = "timeout"
      elif "sandbox: CPU time limit exceeded" in stderr or sig == signal.SIGXCPU:
        error = "cpu_limit"
      elif sig == signal.SIGXFSZ or (rc != 0 and out_full):
        error = "output_limit"
      elif rc != 0 and "MemoryError" in stderr:
        error = "memory_limit"
      elif rc != 0 and "sandbox:" in stderr and "PermissionError" in stderr:
        error = "refused"
      elif sig:
        error = "killed"
      elif rc != 0:
        error = "exception"
      else:
        error = None
      t2 = t2 or len(stderr) > cfg.max_output_chars
      stderr = stderr[-cfg.max_output_chars:]
      return ExecResult(stdout, stderr, error is None, error, t1 or t2 or out_full, rc)
    finally:
      shutil.rmtree(workdir, ignore_errors=True)
      shutil.rmtree(outdir, ignore_errors=True)
