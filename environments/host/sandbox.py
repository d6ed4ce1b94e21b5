"""A sandboxed Python code-interpreter tool (tool-integrated math reasoning).

Every call runs `code` in a fresh `python -I -B` child process and returns its
stdout (and the tail of stderr on failure) as the observation. A call that breaks
a limit returns an `ExecResult` with `ok=False` and an `error` naming the limit;
nothing is raised in the caller, so the episode goes on. Calls of one batch run
concurrently in a bounded thread pool (`run_batch`).

Isolation modes (`SandboxConfig.isolation`, the mode in force is
`Sandbox.isolation`):

  * 'bwrap': kernel isolation with bubblewrap (`bwrap`, Debian package
    `bubblewrap`). 'auto' (the default) means 'bwrap' if a probe sandbox starts
    here, else refuse.
  * 'hooks': audit hook and rlimits only; weak (see below).

If kernel isolation is not available, constructing a `Sandbox` raises one line
naming what is missing and how to install it, unless the config sets
`allow_weak_isolation=True`; then it runs in 'hooks' mode and logs one warning.
Choosing 'hooks' explicitly also needs `allow_weak_isolation=True`.

What is enforced, and by what (honest list), in 'bwrap' mode:

  * Filesystem: a new mount namespace whose root is an empty tmpfs remounted
    read-only; only /usr (with the /bin, /lib, /lib64, /sbin links), five
    entries of /etc (the dynamic loader's cache and config, localtime,
    nsswitch.conf) and the Python installation (sys.prefix / base_prefix, at
    the same paths) are bound in, all read-only. /root, /home, the trainer's working directory and
    the host's /tmp, /run, /var, /sys do not exist in the sandbox. The only
    writable place is a private tmpfs at /tmp (the cwd and HOME) of at most
    `scratch_bytes` (kernel; ENOSPC past it), gone when the call ends.
    RLIMIT_FSIZE caps each file at `max_file_bytes`.
  * User: when the trainer runs as root, bwrap keeps only CAP_SETUID/SETGID/
    SETPCAP and `setpriv` (util-linux) switches to gid `gid` (65534, nogroup)
    and a uid of its own among `uid`, `uid - 1`, ..., `uid - max_workers + 1`
    (65534 is nobody; one per concurrent call), clears supplementary groups,
    the inheritable and bounding capability sets, with no_new_privs (bwrap
    sets it), before Python starts.
    The child is then an unprivileged host uid: DAC checks apply and rlimits
    cannot be raised. For a non-root trainer bwrap runs unprivileged in a new
    user namespace (`--unshare-user --disable-userns`); the child keeps the
    trainer's uid but has no capabilities and sees only the mounts above.
  * Processes: a new PID namespace with a fresh /proc, so no other process
    (the trainer included) is visible, signalable or readable
    (/proc/<pid>/environ). `--die-with-parent` and the namespace's init reaper
    kill every process of the call when the call ends or bwrap dies; the parent
    SIGKILLs bwrap at the wall-time limit. `--new-session` (setsid) blocks
    terminal injection. RLIMIT_NPROC (`max_processes`) bounds forks: the kernel
    enforces it for a non-root uid and counts per uid, which is why concurrent
    calls get distinct uids (a non-root trainer's calls share its uid, and
    its own threads count too).
  * Network: a new, empty network namespace (only a down loopback device): no
    TCP/UDP anywhere, and abstract Unix sockets are per network namespace;
    path Unix sockets of the host are unreachable because no host socket
    directory is mounted. Also new IPC, UTS and (where possible) cgroup
    namespaces.
  * CPU time: RLIMIT_CPU (SIGXCPU, then SIGKILL one second later).
  * Memory: RLIMIT_AS per process (`memory_bytes`); with forking allowed the
    total is bounded by `max_processes * memory_bytes` (no cgroup here).
  * Wall time: the parent bounds the whole call (start, run, reading output)
    by `wall_seconds`, then SIGKILLs the process group of bwrap.
  * Output: stdout and stderr are pipes whose read ends only the parent holds
    (the code arrives on stdin from a sealed memfd; nothing is re-opened by
    path). The parent keeps at most `4 * max_output_chars` bytes of stdout's
    head and of stderr's tail while reading, and kills the call once both
    streams together pass `max_file_bytes` ('output_limit'); after the main
    process exits it reads for at most 0.5 s more, so a descendant holding the
    pipes open cannot stall it.
  * Defense in depth: the audit hook of 'hooks' mode below is installed too.

'hooks' mode (weak): the child runs directly (same uid as the trainer, the
host's filesystem, network and processes), cwd a fresh temporary directory.
Enforced by the kernel: RLIMIT_CPU, RLIMIT_AS, RLIMIT_FSIZE, RLIMIT_NPROC (not
for root), and the parent's wall-time kill of the process group and output
caps as above. Everything else is an audit hook (PEP 578) installed before the
user code runs: it refuses os.fork/exec/spawn/system, subprocess.Popen (and
`_posixsubprocess.fork_exec` is replaced), sockets, `ctypes` symbol lookup,
signals to other processes, and writes/removes/renames on paths that do not
resolve inside the cwd. CPython's documentation says audit hooks are not a
sandbox: `dir_fd=` arguments, a line of Python that rewrites the hook's code,
or a C extension bypass it, after which the child can do anything the trainer
can. tests/test_sandbox.py runs the same attack list in both modes and
asserts which attacks 'hooks' mode does not contain.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import fcntl
import functools
import json
import logging
import os
import queue
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Sequence

# The child's bootstrap: read the code from stdin, set limits, install the audit
# hook, run the user code. argv[1] is a JSON dict of limits.
_BOOTSTRAP = r"""
import json, os, resource, signal, sys
_code = sys.stdin.buffer.read().decode("utf-8", "surrogatepass")
_null = os.open(os.devnull, os.O_RDONLY)
os.dup2(_null, 0)
os.close(_null)
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
_me = os.getpid()
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
  elif event in ("os.kill", "os.killpg") and args and args[0] not in (_me, 0):
    raise PermissionError(f"sandbox: signals to other processes are refused ({event})")
sys.addaudithook(_hook)
import _posixsubprocess
def _no_fork_exec(*args, **kwargs):
  raise PermissionError("sandbox: process creation is refused (fork_exec)")
_posixsubprocess.fork_exec = _no_fork_exec
del json, resource
sys.argv = ["main.py"]
_g = {"__name__": "__main__", "__builtins__": __builtins__}
exec(compile(_code, "main.py", "exec"), _g)
"""

_LOG = logging.getLogger(__name__)
_ISOLATIONS = ("auto", "bwrap", "hooks")
_INSTALL_HINT = "install it with `apt-get install bubblewrap`"
# Seconds the parent keeps reading after the main process exited (descendants
# that still hold the pipes open are then cut off).
_EXIT_GRACE = 0.5
# Where the sandbox's private tmpfs is mounted (cwd, HOME, TMPDIR).
_SCRATCH = "/tmp"
# Host files of /etc the dynamic loader and time functions read.
_ETC_FILES = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/nsswitch.conf",
)


@dataclasses.dataclass(frozen=True)
class SandboxConfig:
  """Limits of one call and the isolation mode (see the module doc).

  Attributes:
    cpu_seconds: RLIMIT_CPU of the child, seconds of CPU time.
    wall_seconds: wall-clock limit of the whole call (start, run, reading its
      output), seconds; includes interpreter start (~0.1-0.5 s).
    memory_bytes: RLIMIT_AS (virtual address space) of each child process, bytes.
    max_output_chars: stdout (head) and stderr (tail) are truncated to this many
      characters.
    max_file_bytes: RLIMIT_FSIZE (largest file the child may write), and the
      most bytes of stdout + stderr together before the call is killed, bytes.
    max_processes: RLIMIT_NPROC of the child (per uid; not enforced for root,
      so only effective in 'bwrap' mode or for a non-root trainer).
    max_workers: concurrent calls in `run_batch`.
    isolation: 'auto' ('bwrap' if it works here, else refuse or, with
      allow_weak_isolation, 'hooks'), 'bwrap' (refuse if unavailable) or
      'hooks' (audit hook and rlimits only; needs allow_weak_isolation).
    allow_weak_isolation: accept 'hooks' mode (one warning is logged).
    scratch_bytes: size of the sandbox's private writable tmpfs ('bwrap'),
      bytes.
    uid: highest host uid the child runs as when the trainer is root
      ('bwrap'); concurrent calls use uid, uid - 1, ..., uid - max_workers + 1.
    gid: host gid, likewise.
  """

  cpu_seconds: int = 5
  wall_seconds: float = 10.0
  memory_bytes: int = 1 << 30
  max_output_chars: int = 2000
  max_file_bytes: int = 1 << 20
  max_processes: int = 32
  max_workers: int = 4
  isolation: str = "auto"
  allow_weak_isolation: bool = False
  scratch_bytes: int = 64 << 20
  uid: int = 65534
  gid: int = 65534

  def __post_init__(self):
    for name in (
        "cpu_seconds",
        "memory_bytes",
        "max_output_chars",
        "max_file_bytes",
        "max_processes",
        "max_workers",
        "scratch_bytes",
        "uid",
        "gid",
    ):
      v = getattr(self, name)
      if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ValueError(
            f"SandboxConfig.{name}={v!r}: must be a positive integer"
        )
    if isinstance(self.wall_seconds, bool) or not (
        isinstance(self.wall_seconds, (int, float)) and self.wall_seconds > 0
    ):
      raise ValueError(
          f"SandboxConfig.wall_seconds={self.wall_seconds!r}: must be > 0"
      )
    if self.isolation not in _ISOLATIONS:
      raise ValueError(
          f"SandboxConfig.isolation={self.isolation!r}: "
          "must be 'auto', 'bwrap' or 'hooks'"
      )
    if self.uid < self.max_workers:
      raise ValueError(
          f"SandboxConfig.uid={self.uid!r}: must be >= max_workers "
          f"({self.max_workers}); calls use uid down to uid - max_workers + 1"
      )
    if not isinstance(self.allow_weak_isolation, bool):
      raise ValueError(
          f"SandboxConfig.allow_weak_isolation="
          f"{self.allow_weak_isolation!r}: must be True or False"
      )


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
      last = (
          self.stderr.strip().splitlines()[-1:] if self.stderr.strip() else []
      )
      text = f"Error ({self.error})" + (f": {last[0]}" if last else "")
      if self.stdout:
        text = self.stdout + "\n" + text
    return text if max_chars is None else text[:max_chars]


def _python_roots() -> list[str]:
  """Directories of the running Python installation to bind read-only."""
  roots = set()
  for p in (
      sys.prefix,
      sys.base_prefix,
      sys.exec_prefix,
      sys.base_exec_prefix,
      os.path.dirname(os.path.dirname(os.path.realpath(sys.executable))),
  ):
    p = os.path.realpath(p)
    if p != "/" and not (p == "/usr" or p.startswith("/usr/")):
      roots.add(p)
  # Drop roots nested in another root.
  return sorted(
      r
      for r in roots
      if not any(r != o and r.startswith(o + os.sep) for o in roots)
  )


def _bwrap_argv(
    config: SandboxConfig, bwrap: str, setpriv: str | None, uid: int
) -> list[str]:
  """The bwrap command line (everything before the Python argv); `uid` is
  the child's host uid when `setpriv` is given (the trainer is root)."""
  argv = [
      bwrap,
      "--die-with-parent",
      "--new-session",
      "--unshare-ipc",
      "--unshare-pid",
      "--unshare-net",
      "--unshare-uts",
      "--unshare-cgroup-try",
  ]
  if setpriv is not None:  # root: no user namespace; setpriv drops to `uid`
    argv += [
        "--cap-drop",
        "ALL",
        "--cap-add",
        "CAP_SETUID",
        "--cap-add",
        "CAP_SETGID",
        "--cap-add",
        "CAP_SETPCAP",
    ]
  else:
    argv += ["--unshare-user", "--disable-userns"]
  argv += ["--ro-bind", "/usr", "/usr"]
  for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
    if os.path.islink(top):
      argv += ["--symlink", os.readlink(top), top]
    elif os.path.isdir(top):
      argv += ["--ro-bind", top, top]
  for path in _ETC_FILES:
    argv += ["--ro-bind-try", path, path]
  for root in _python_roots():
    # Parents are created world-traversable (bwrap would copy the host's modes,
    # e.g. /root's 0700, which the unprivileged child could not traverse).
    parts = root.strip("/").split("/")
    for i in range(1, len(parts)):
      argv += ["--perms", "0755", "--dir", "/" + "/".join(parts[:i])]
    argv += ["--ro-bind", root, root]
  argv += [
      "--proc",
      "/proc",
      "--dev",
      "/dev",
      "--perms",
      "1777",
      "--size",
      str(config.scratch_bytes),
      "--tmpfs",
      _SCRATCH,
      "--remount-ro",
      "/",
      "--chdir",
      _SCRATCH,
      "--clearenv",
  ]
  for k, v in _child_env(_SCRATCH).items():
    argv += ["--setenv", k, v]
  argv.append("--")
  if setpriv is not None:
    argv += [
        setpriv,
        f"--reuid={uid}",
        f"--regid={config.gid}",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--",
    ]
  return argv


def _child_env(home: str) -> dict[str, str]:
  return {
      "PATH": "/usr/bin:/bin",
      "HOME": home,
      "TMPDIR": home,
      "LANG": "C.UTF-8",
      "PYTHONIOENCODING": "utf-8",
      "OMP_NUM_THREADS": "1",
      "OPENBLAS_NUM_THREADS": "1",
      "MKL_NUM_THREADS": "1",
  }


@functools.lru_cache(maxsize=None)
def bwrap_status(uid: int = 65534, gid: int = 65534) -> tuple[bool, str]:
  """Whether a probe sandbox starts here ('bwrap' mode), and if not, why.

  Args:
    uid, gid: as in `SandboxConfig` (used when this process is root).

  Returns:
    (True, 'bwrap <version>') or (False, one line naming what is missing).
  """
  bwrap = shutil.which("bwrap")
  if bwrap is None:
    return False, f"bubblewrap (`bwrap`) is not on PATH; {_INSTALL_HINT}"
  setpriv = None
  if os.geteuid() == 0:
    setpriv = shutil.which("setpriv", path="/usr/bin:/bin")
    if setpriv is None:
      return False, "`setpriv` (util-linux) is not in /usr/bin or /bin"
  config = SandboxConfig(uid=uid, gid=gid, isolation="bwrap", wall_seconds=30)
  r = _execute(
      config,
      "import os\nprint('ok', os.getuid())",
      _bwrap_argv(config, bwrap, setpriv, uid),
      cwd=None,
  )
  want = f"ok {uid}\n" if setpriv is not None else f"ok {os.getuid()}\n"
  if r.stdout != want:
    why = (r.stderr.strip().splitlines() or [r.error or "no output"])[0]
    return False, f"`bwrap` is installed but a probe sandbox failed: {why}"
  version = subprocess.run(
      [bwrap, "--version"], capture_output=True, text=True, timeout=10
  ).stdout.strip()
  return True, version or "bwrap"


def _code_fd(code: str) -> int:
  """A read-only view of `code` for the child's stdin (a sealed memfd)."""
  data = code.encode("utf-8", errors="surrogatepass")
  try:
    fd = os.memfd_create("sandbox_code", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
  except (AttributeError, OSError):
    f = tempfile.TemporaryFile()
    f.write(data)
    f.flush()
    fd = os.dup(f.fileno())
    f.close()
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
  view = memoryview(data)
  while view:
    view = view[os.write(fd, view) :]
  fcntl.fcntl(
      fd,
      fcntl.F_ADD_SEALS,
      fcntl.F_SEAL_WRITE
      | fcntl.F_SEAL_GROW
      | fcntl.F_SEAL_SHRINK
      | fcntl.F_SEAL_SEAL,
  )
  os.lseek(fd, 0, os.SEEK_SET)
  return fd


def _kill_group(proc: subprocess.Popen):
  try:
    os.killpg(proc.pid, signal.SIGKILL)
  except (ProcessLookupError, PermissionError):
    pass


def _execute(
    config: SandboxConfig, code: str, prefix: list[str], cwd: str | None
) -> ExecResult:
  """Runs one child (`prefix` + the Python bootstrap), reading its output
  through pipes under the wall-time and size bounds."""
  cfg = config
  deadline = time.monotonic() + cfg.wall_seconds
  limits = json.dumps(
      dict(
          cpu=cfg.cpu_seconds,
          mem=cfg.memory_bytes,
          fsize=cfg.max_file_bytes,
          nproc=cfg.max_processes,
      )
  )
  # Under bwrap the child runs the real interpreter file: a virtualenv's
  # `python` is a link that may sit under /tmp (hidden by the private /tmp) or
  # elsewhere outside the bound roots; `-I` ignores its site-packages anyway.
  exe = os.path.realpath(sys.executable) if prefix else sys.executable
  argv = prefix + [exe, "-I", "-B", "-c", _BOOTSTRAP, limits]
  head_cap = 4 * cfg.max_output_chars + 4
  tail_cap = max(4 * cfg.max_output_chars, 8192)
  code_fd = _code_fd(code)
  out_r, out_w = os.pipe2(os.O_CLOEXEC)
  err_r, err_w = os.pipe2(os.O_CLOEXEC)
  try:
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=_child_env(cwd or _SCRATCH),
        stdin=code_fd,
        stdout=out_w,
        stderr=err_w,
        start_new_session=True,
        close_fds=True,
    )
  except BaseException:
    os.close(out_r)
    os.close(err_r)
    raise
  finally:
    for fd in (code_fd, out_w, err_w):
      os.close(fd)
  out, err = bytearray(), bytearray()
  totals = {out_r: 0, err_r: 0}
  timed_out = over = False
  sel = selectors.DefaultSelector()
  try:
    for fd in (out_r, err_r):
      os.set_blocking(fd, False)
      sel.register(fd, selectors.EVENT_READ)
    exited_at = None
    while True:
      now = time.monotonic()
      if now >= deadline:
        timed_out = proc.poll() is None or bool(sel.get_map())
        break
      if proc.poll() is not None:
        exited_at = now if exited_at is None else exited_at
        if not sel.get_map() or now - exited_at > _EXIT_GRACE:
          break
      if not sel.get_map():  # both streams closed, process still running
        try:
          proc.wait(timeout=min(0.1, deadline - now))
        except subprocess.TimeoutExpired:
          pass
        continue
      for key, _ in sel.select(timeout=min(0.1, deadline - now)):
        try:
          chunk = os.read(key.fd, 1 << 16)
        except BlockingIOError:
          continue
        if not chunk:
          sel.unregister(key.fd)
          continue
        totals[key.fd] += len(chunk)
        if key.fd == out_r:
          if len(out) < head_cap:
            out += chunk[: head_cap - len(out)]
        else:
          err += chunk
          if len(err) > 2 * tail_cap:
            del err[: len(err) - tail_cap]
      if totals[out_r] + totals[err_r] > cfg.max_file_bytes:
        over = True
        break
  finally:
    sel.close()
    _kill_group(proc)
    proc.kill()
    proc.wait()
    os.close(out_r)
    os.close(err_r)
  stdout = out.decode("utf-8", errors="replace")
  t1 = totals[out_r] > len(out) or len(stdout) > cfg.max_output_chars
  stdout = stdout[: cfg.max_output_chars]
  stderr = bytes(err[-tail_cap:]).decode("utf-8", errors="replace")
  rc = proc.returncode
  # bwrap reports a child killed by signal s as exit status 128 + s.
  sig = -rc if rc < 0 else (rc - 128 if rc > 128 else 0)
  first = stderr.lstrip().split(":", 1)[0]
  if timed_out:
    error = "timeout"
  elif over:
    error = "output_limit"
  elif "sandbox: CPU time limit exceeded" in stderr or sig == signal.SIGXCPU:
    error = "cpu_limit"
  elif sig == signal.SIGXFSZ:
    error = "output_limit"
  elif rc != 0 and "MemoryError" in stderr:
    error = "memory_limit"
  elif rc != 0 and "sandbox:" in stderr and "PermissionError" in stderr:
    error = "refused"
  elif rc != 0 and not totals[out_r] and first in ("bwrap", "setpriv"):
    error = "sandbox_failure"
  elif sig:
    error = "killed"
  elif rc != 0:
    error = "exception"
  else:
    error = None
  t2 = totals[err_r] > len(stderr) or len(stderr) > cfg.max_output_chars
  stderr = stderr[-cfg.max_output_chars :]
  return ExecResult(stdout, stderr, error is None, error, t1 or t2 or over, rc)


class Sandbox:
  """Runs Python code under the limits of a `SandboxConfig` (see module doc).

  Thread-safe; `run_batch` uses an internal pool of `max_workers` threads (each
  call is its own process).

  Raises (at construction):
    RuntimeError: kernel isolation is unavailable (or isolation='hooks') and
      `allow_weak_isolation` is False; one line naming what is missing.
  """

  def __init__(self, config: SandboxConfig = SandboxConfig()):
    self.config = config
    self._prefix: list[str] = []
    self._uid_pool: queue.Queue | None = None
    why = (
        "isolation='hooks' was chosen; for kernel isolation install "
        "bubblewrap: `apt-get install bubblewrap`"
    )
    if config.isolation in ("auto", "bwrap"):
      ok, why = bwrap_status(config.uid, config.gid)
      if ok:
        setpriv = (
            shutil.which("setpriv", path="/usr/bin:/bin")
            if os.geteuid() == 0
            else None
        )
        bwrap = shutil.which("bwrap")
        self._prefix = _bwrap_argv(config, bwrap, setpriv, config.uid)
        if setpriv is not None:  # one uid per concurrent call
          self._uid_pool = queue.Queue()
          for i in range(config.max_workers):
            self._uid_pool.put(
                _bwrap_argv(config, bwrap, setpriv, config.uid - i)
            )
    if self._prefix:
      self.isolation = "bwrap"
    elif config.isolation == "bwrap" or not config.allow_weak_isolation:
      raise RuntimeError(
          f"Sandbox: no kernel isolation ({why}); refusing to run model-written "
          "code with audit hooks only"
          + (
              ""
              if config.isolation == "bwrap"
              else "; set SandboxConfig.allow_weak_isolation=True to accept that"
          )
      )
    else:
      self.isolation = "hooks"
      _LOG.warning(
          "Sandbox: WEAK isolation, audit hook + rlimits only (%s); "
          "model-written code can escape it",
          why,
      )
    self._pool = concurrent.futures.ThreadPoolExecutor(
        max_workers=config.max_workers, thread_name_prefix="sandbox"
    )

  def close(self):
    self._pool.shutdown(wait=True)

  def run(self, code: str) -> ExecResult:
    """Runs one program; never raises (failures are an ExecResult with ok=False).

    In 'bwrap' mode as root, at most max_workers calls run at once (each holds
    one of the pool's uids); a further concurrent call waits for a free uid.

    Args:
      code: Python source (any string; non-strings give a 'sandbox_failure').
    """
    try:
      return self._run(code)
    except Exception as e:  # noqa: BLE001 -- the episode must go on
      return ExecResult(
          "", f"{type(e).__name__}: {e}", False, "sandbox_failure", False, -1
      )

  def run_batch(self, codes: Sequence[str]) -> list[ExecResult]:
    """Runs programs concurrently (at most max_workers at once), in order."""
    return list(self._pool.map(self.run, codes))

  def _run(self, code: str) -> ExecResult:
    if not isinstance(code, str):
      raise TypeError(f"code must be str, got {type(code).__name__}")
    if self.isolation == "bwrap":
      if self._uid_pool is None:  # non-root trainer: the trainer's uid
        return _execute(self.config, code, self._prefix, cwd=None)
      # As root, each running call holds its own uid (blocks while max_workers
      # calls run).
      prefix = self._uid_pool.get()
      try:
        return _execute(self.config, code, prefix, cwd=None)
      finally:
        self._uid_pool.put(prefix)
    workdir = tempfile.mkdtemp(prefix="agentic_rl_sandbox_")
    try:
      return _execute(self.config, code, [], cwd=workdir)
    finally:
      shutil.rmtree(workdir, ignore_errors=True)
