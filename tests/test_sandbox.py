"""Tests of environments/host/sandbox.py.

Part 1: each limit stops its attack, normal code returns its stdout, the
isolation selection refuses weak isolation unless it is accepted.

Part 2: an attack suite. Every attack is a program a hostile model could write;
each one collects its own evidence of containment on the host side (a canary
file outside the sandbox that must stay intact or absent, a listener that must
see no connection, processes counted in the host's /proc, a secret that must not
appear in the output, elapsed time, the test process's memory peak). Under
'bwrap' every attack must be contained; under 'hooks' (audit hook + rlimits,
accepted with allow_weak_isolation) the attacks in HOOKS_BREACHES are asserted to
get through, so that the weak mode's count is recorded, not hidden.

Counts (attacks contained, of len(ATTACKS)) for any sandbox module and mode:
  python tests/test_sandbox.py [--module path/to/sandbox.py] [--isolation MODE]
"""

import argparse
import collections
import concurrent.futures
import dataclasses
import importlib.util
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import string
import subprocess
import sys
import tempfile
import time
import tracemalloc

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from environments.host import sandbox  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ----------------------------------------------------------------- part 1


@pytest.fixture(scope="module")
def sb():
  # Generous wall time: the CI machine's 2 cores are shared, so 1 s of CPU time
  # can take several seconds of wall time.
  box = sandbox.Sandbox(
      sandbox.SandboxConfig(
          cpu_seconds=1,
          wall_seconds=30,
          memory_bytes=512 << 20,
          max_output_chars=100,
          max_workers=4,
          allow_weak_isolation=True,
      )
  )
  yield box
  box.close()


def test_normal_code_returns_stdout(sb):
  r = sb.run("import math\nprint(math.comb(10, 3))\nprint(sum(range(5)))")
  assert r.ok and r.error is None and r.returncode == 0
  assert r.stdout == "120\n10\n"
  assert r.observation() == "120\n10\n"


def test_writes_inside_own_directory_are_allowed(sb):
  r = sb.run(
      "open('a.txt', 'w').write('hi')\nimport os\nprint(open('a.txt').read(), "
      "os.listdir('.'))"
  )
  assert r.ok and r.stdout == "hi ['a.txt']\n", r


def test_exception_is_an_error_observation(sb):
  r = sb.run("print('before')\n1/0")
  assert not r.ok and r.error == "exception"
  assert (
      r.observation()
      == "before\n\nError (exception): ZeroDivisionError: division by zero"
  )


def test_infinite_loop_is_stopped_by_cpu_limit(sb):
  t0 = time.time()
  r = sb.run("while True:\n  pass")
  assert not r.ok and r.error == "cpu_limit", r
  assert time.time() - t0 < 30


def test_sleep_is_stopped_by_wall_limit():
  box = sandbox.Sandbox(
      sandbox.SandboxConfig(wall_seconds=3, allow_weak_isolation=True)
  )
  t0 = time.time()
  r = box.run("import time\nprint('start', flush=True)\ntime.sleep(60)")
  assert not r.ok and r.error == "timeout" and r.stdout == "start\n", r
  assert time.time() - t0 < 10
  box.close()


def test_memory_bomb_is_stopped(sb):
  r = sb.run("x = bytearray(4 << 30)\nprint('allocated')")
  assert not r.ok and r.error == "memory_limit" and "allocated" not in r.stdout


def test_fork_is_refused_by_the_hook_too(sb):
  r = sb.run("import os\nwhile True:\n  os.fork()")
  assert not r.ok and r.error == "refused" and "os.fork" in r.stderr
  r = sb.run("import subprocess\nsubprocess.run(['sh', '-c', 'echo hi'])")
  assert not r.ok and r.error == "refused"
  r = sb.run("import ctypes\nctypes.CDLL(None).fork()")
  assert not r.ok and r.error == "refused"


def test_network_is_refused_by_the_hook_too(sb):
  r = sb.run("import socket\ns = socket.socket()\ns.connect(('127.0.0.1', 22))")
  assert not r.ok and r.error == "refused" and "network" in r.stderr


def test_output_is_truncated(sb):
  r = sb.run("print('a' * 100000)")
  assert r.ok and r.truncated and r.stdout == "a" * 100
  r = sb.run("while True:\n  print('b' * 1000)")  # the parent's byte cap
  assert (
      not r.ok
      and r.error == "output_limit"
      and r.truncated
      and r.stdout == "b" * 100
  )


def test_bad_input_never_raises(sb):
  assert sb.run(None).error == "sandbox_failure"
  r = sb.run("def f(:\n")
  assert not r.ok and r.error == "exception" and "SyntaxError" in r.stderr
  # A lone surrogate reaches the child, whose compile() rejects it.
  r = sb.run("print(len('\udcff'))")
  assert (
      not r.ok
      and r.error == "exception"
      and "surrogates not allowed" in r.stderr
  ), r


def test_start_failure_is_an_error_and_leaks_no_descriptors(sb):
  box = sandbox.Sandbox(sb.config)
  box._prefix = ["/nonexistent/bwrap"]  # as if bwrap vanished after the probe
  box._uid_pool = None
  box.isolation = "bwrap"
  before = len(os.listdir("/proc/self/fd"))
  results = [box.run("print(1)") for _ in range(5)]
  assert len(os.listdir("/proc/self/fd")) == before
  assert all(
      r.error == "sandbox_failure" and "FileNotFoundError" in r.stderr
      for r in results
  ), results[0]
  box.close()


def test_batch_runs_concurrently_in_order(sb):
  codes = [f"import time\ntime.sleep(2.0)\nprint({i})" for i in range(4)]
  t0 = time.time()
  results = sb.run_batch(codes)
  elapsed = time.time() - t0
  assert [r.stdout for r in results] == ["0\n", "1\n", "2\n", "3\n"]
  assert elapsed < 7.5, elapsed  # 4 calls of >= 2 s each, run 4 at a time


def test_config_errors_name_the_field():
  with pytest.raises(ValueError, match="cpu_seconds"):
    sandbox.SandboxConfig(cpu_seconds=0)
  with pytest.raises(ValueError, match=r"isolation='namespace'"):
    sandbox.SandboxConfig(isolation="namespace")
  with pytest.raises(ValueError, match="allow_weak_isolation"):
    sandbox.SandboxConfig(allow_weak_isolation="yes")


@pytest.fixture
def no_bwrap(monkeypatch):
  real_which = shutil.which
  monkeypatch.setattr(
      sandbox.shutil,
      "which",
      lambda name, *a, **k: None
      if name == "bwrap"
      else real_which(name, *a, **k),
  )
  sandbox.bwrap_status.cache_clear()
  yield
  sandbox.bwrap_status.cache_clear()


def test_missing_bwrap_refuses_in_one_line(no_bwrap):
  with pytest.raises(RuntimeError) as e:
    sandbox.Sandbox(sandbox.SandboxConfig())
  msg = str(e.value)
  assert "\n" not in msg and "apt-get install bubblewrap" in msg
  assert "allow_weak_isolation=True" in msg
  # An explicit 'bwrap' is never downgraded.
  with pytest.raises(RuntimeError, match="bwrap"):
    sandbox.Sandbox(
        sandbox.SandboxConfig(isolation="bwrap", allow_weak_isolation=True)
    )


def test_weak_isolation_needs_consent_and_warns_once(no_bwrap, caplog):
  with pytest.raises(RuntimeError, match="isolation='hooks'"):
    sandbox.Sandbox(sandbox.SandboxConfig(isolation="hooks"))
  with caplog.at_level(logging.WARNING, logger=sandbox.__name__):
    box = sandbox.Sandbox(sandbox.SandboxConfig(allow_weak_isolation=True))
  assert box.isolation == "hooks"
  warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
  assert len(warnings) == 1 and "WEAK isolation" in warnings[0].getMessage()
  assert "apt-get install bubblewrap" in warnings[0].getMessage()
  assert "\n" not in warnings[0].getMessage()
  assert box.run("print(6 * 7)").stdout == "42\n"
  box.close()


def _bwrap_ok():
  return sandbox.bwrap_status()[0]


needs_bwrap = pytest.mark.skipif(
    not _bwrap_ok(),
    reason=f"no kernel isolation here: {sandbox.bwrap_status()[1]}",
)


@needs_bwrap
def test_auto_selects_bwrap_and_the_child_is_confined():
  box = sandbox.Sandbox()
  assert box.isolation == "bwrap"
  r = box.run(
      "import json, os\nprint(json.dumps([sorted(os.listdir('/')), os.getcwd(), "
      "sorted(l.split(':')[0].strip() for l in "
      "open('/proc/net/dev').read().splitlines()[2:]), os.getpid()]))"
  )
  assert r.ok, r
  listing, cwd, interfaces, pid = json.loads(r.stdout)
  # Only what the module doc lists exists; the network namespace has only lo;
  # the child is a low PID of its own PID namespace.
  allowed = {
      "bin",
      "dev",
      "etc",
      "lib",
      "lib32",
      "lib64",
      "libx32",
      "proc",
      "root",
      "sbin",
      "tmp",
      "usr",
      "opt",
      "home",
  }
  assert set(listing) <= allowed and "work" not in listing, listing
  assert cwd == "/tmp" and interfaces == ["lo"] and pid < 10, r.stdout
  if os.geteuid() == 0:
    uid, gid = map(
        int,
        box.run("import os\nprint(os.getuid(), os.getgid())").stdout.split(),
    )
    assert 65534 - box.config.max_workers < uid <= 65534 and gid == 65534
  box.close()


@needs_bwrap
@pytest.mark.skipif(
    os.geteuid() != 0, reason="distinct uids per call need a root trainer"
)
def test_a_fork_bomb_does_not_starve_a_concurrent_call():
  # Call 0 holds max_processes (8) processes for 4 s; call 1 forks 4 children
  # meanwhile. RLIMIT_NPROC counts per uid, so this needs a uid per call.
  box = sandbox.Sandbox(
      sandbox.SandboxConfig(
          max_processes=8, max_workers=2, wall_seconds=30, isolation="bwrap"
      )
  )
  forks = (
      "import gc, os, time\n"
      "for f in gc.get_objects():\n"
      "  if type(f).__name__ == 'function' and f.__code__.co_argcount == 2 and "
      "'PermissionError' in f.__code__.co_names:\n"
      "    f.__code__ = (lambda e, a: None).__code__\n"
      "time.sleep($delay)\nn = 0\nfor i in range($count):\n"
      "  try:\n    pid = os.fork()\n  except OSError:\n    break\n"
      "  if pid == 0:\n    time.sleep($hold)\n    os._exit(0)\n  n += 1\n"
      "print(n, os.getuid())\nfor i in range(n):\n  os.wait()\n"
  )
  bomb = string.Template(forks).substitute(delay=0, count=64, hold=4)
  small = string.Template(forks).substitute(delay=1.5, count=4, hold=0)
  r_bomb, r_small = box.run_batch([bomb, small])
  n_bomb, uid_bomb = map(int, r_bomb.stdout.split())
  n_small, uid_small = map(int, r_small.stdout.split())
  assert n_bomb < 8 and n_small == 4 and uid_bomb != uid_small, (
      r_bomb,
      r_small,
  )
  assert {uid_bomb, uid_small} == {65534, 65533}
  box.close()


# ----------------------------------------------------------------- part 2

WALL = 5.0  # wall limit of the attack sandbox, seconds
SLACK = 8.0  # allowed lateness of a call past WALL (2 shared cores)
ATTACK_LIMITS = dict(
    cpu_seconds=1,
    wall_seconds=WALL,
    memory_bytes=512 << 20,
    max_output_chars=200,
    max_file_bytes=1 << 20,
    max_processes=16,
    scratch_bytes=16 << 20,
    max_workers=1,
)

# Replaces the code of every Python-level audit hook (a 2-argument function that
# raises PermissionError) by a no-op, and restores _posixsubprocess.fork_exec.
UNHOOK = """
import gc as _gc, sys as _sys
for _f in _gc.get_objects():
  if (type(_f).__name__ == "function" and _f.__code__.co_argcount == 2
      and "PermissionError" in _f.__code__.co_names):
    _f.__code__ = (lambda event, args: None).__code__
_sys.modules.pop("_posixsubprocess", None)
import _posixsubprocess as _ps, subprocess as _sp
_sp._posixsubprocess = _ps
"""

ATTACKS = collections.OrderedDict()


def attack(name):
  def register(fn):
    ATTACKS[name] = fn
    return fn

  return register


def _code(template, **kw):
  return string.Template(template).substitute(
      {k: repr(v) for k, v in kw.items()}
  )


def _outside_dir():
  return tempfile.mkdtemp(prefix="agrl_canary_", dir="/tmp")


def _output(r):
  return r.stdout + r.stderr


def _host_procs(marker):
  """PIDs of host processes whose command line contains `marker`."""
  found = []
  for pid in os.listdir("/proc"):
    if pid.isdigit():
      try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
          if marker.encode() in f.read():
            found.append(int(pid))
      except OSError:
        pass
  return found


def _kill_marked(marker):
  for pid in _host_procs(marker):
    try:
      os.kill(pid, signal.SIGKILL)
    except OSError:
      pass


# --- writes and deletes outside the scratch directory


def _absent_after(run, template):
  d = _outside_dir()
  target = os.path.join(d, "escape.txt")
  try:
    run(_code(template, target=target, dir=d, name="escape.txt"))
    return (
        not os.path.exists(target),
        f"{target} exists: {os.path.exists(target)}",
    )
  finally:
    shutil.rmtree(d, ignore_errors=True)


def _intact_after(run, template):
  d = _outside_dir()
  victim = os.path.join(d, "victim.txt")
  with open(victim, "w") as f:
    f.write("intact")
  try:
    run(_code(template, victim=victim, dir=d, name="victim.txt"))
    content = open(victim).read() if os.path.exists(victim) else None
    return content == "intact", f"victim content: {content!r}"
  finally:
    shutil.rmtree(d, ignore_errors=True)


@attack("write_open_absolute")
def _(run):
  return _absent_after(run, "open($target, 'w').write('x')")


@attack("write_os_open_dir_fd")
def _(run):
  return _absent_after(
      run,
      "import os\nfd = os.open($dir, os.O_RDONLY)\n"
      "os.write(os.open($name, os.O_WRONLY | os.O_CREAT, dir_fd=fd), b'x')",
  )


@attack("write_through_symlink")
def _(run):
  return _absent_after(
      run,
      "import os\nos.symlink($target, 'link')\n" "open('link', 'w').write('x')",
  )


@attack("write_rename_out")
def _(run):
  return _absent_after(
      run, "import os\nopen('a', 'w').write('x')\nos.rename('a', $target)"
  )


@attack("write_unhooked")
def _(run):
  return _absent_after(run, UNHOOK + "open($target, 'w').write('x')")


@attack("write_into_bound_python_prefix_unhooked")
def _(run):
  target = os.path.join(
      os.path.realpath(sys.prefix), f"agrl_canary_{secrets.token_hex(4)}"
  )
  try:
    run(_code(UNHOOK + "open($target, 'w').write('x')", target=target))
    return (
        not os.path.exists(target),
        f"{target} exists: {os.path.exists(target)}",
    )
  finally:
    if os.path.exists(target):
      os.remove(target)


@attack("truncate_existing_dir_fd")
def _(run):
  return _intact_after(
      run,
      "import os\nfd = os.open($dir, os.O_RDONLY)\n"
      "w = os.open($name, os.O_WRONLY | os.O_TRUNC, dir_fd=fd)\n"
      "os.write(w, b'pwned')",
  )


@attack("delete_dir_fd")
def _(run):
  return _intact_after(
      run,
      "import os\nfd = os.open($dir, os.O_RDONLY)\n"
      "os.unlink($name, dir_fd=fd)",
  )


@attack("delete_absolute")
def _(run):
  return _intact_after(run, "import os\nos.remove($victim)")


@attack("delete_unhooked")
def _(run):
  return _intact_after(run, UNHOOK + "import os\nos.remove($victim)")


@attack("rename_existing_unhooked")
def _(run):
  return _intact_after(
      run, UNHOOK + "import os\nos.rename($victim, $victim + '.moved')"
  )


# --- reading host secrets and other processes


def _secret_file(directory, run, template):
  token = secrets.token_hex(16)
  name = f".agrl_sandbox_secret_{token[:8]}"
  path = os.path.join(directory, name)
  with open(path, "w") as f:
    f.write(token)
  try:
    r = run(_code(template, path=path, name=name, pid=os.getpid()))
    return token not in _output(r), f"output: {_output(r)[:120]!r}"
  finally:
    os.remove(path)


@attack("read_secret_in_repo")
def _(run):
  return _secret_file(REPO, run, "print(open($path).read())")


@attack("read_secret_in_home")
def _(run):
  return _secret_file(os.path.expanduser("~"), run, "print(open($path).read())")


@attack("read_secret_via_proc_pid_cwd")
def _(run):
  return _secret_file(
      os.getcwd(), run, "print(open(f'/proc/{$pid}/cwd/' + $name).read())"
  )


@attack("read_other_process_environ")
def _(run):
  token = secrets.token_hex(16)
  victim = subprocess.Popen(["sleep", "60"], env={"AGRL_SANDBOX_SECRET": token})
  try:
    r = run(
        _code(
            "import os\nfor p in os.listdir('/proc'):\n"
            "  try:\n    env = open(f'/proc/{p}/environ', 'rb').read()\n"
            "  except Exception:\n    continue\n"
            "  if b'AGRL_SANDBOX_SECRET' in env:\n    print(p, env)\n"
            "print(open(f'/proc/{$pid}/environ', 'rb').read()[:60])",
            pid=victim.pid,
        )
    )
    return token not in _output(r), f"output: {_output(r)[:120]!r}"
  finally:
    victim.kill()
    victim.wait()


@attack("list_other_processes")
def _(run):
  marker = f"agrl_victim_{secrets.token_hex(6)}"
  victim = subprocess.Popen(
      [sys.executable, "-c", "import time; time.sleep(60)", marker]
  )
  try:
    r = run(
        _code(
            "import os\nfor p in os.listdir('/proc'):\n"
            "  try:\n    c = open(f'/proc/{p}/cmdline', 'rb').read()\n"
            "  except Exception:\n    continue\n"
            "  if b'agrl_victim_' in c:\n    print(c)\n"
        )
    )
    return marker not in _output(r), f"output: {_output(r)[:120]!r}"
  finally:
    victim.kill()
    victim.wait()


# --- network, Unix sockets included


def _no_connection(run, family, kind, address, template, unhook):
  listener = socket.socket(family, kind)
  d = None
  try:
    if family == socket.AF_UNIX and not address.startswith("\0"):
      d = _outside_dir()
      address = os.path.join(d, "s")
    listener.bind(address)
    if kind == socket.SOCK_STREAM:
      listener.listen(8)
    listener.setblocking(False)
    addr = listener.getsockname()
    if family == socket.AF_UNIX and isinstance(addr, bytes):
      addr = addr.decode("latin-1")
    run(_code((UNHOOK if unhook else "") + template, addr=addr))
    time.sleep(0.2)
    try:
      if kind == socket.SOCK_STREAM:
        listener.accept()[0].close()
      else:
        listener.recvfrom(64)
      return False, "the listener received a connection/datagram"
    except BlockingIOError:
      return True, "nothing arrived"
  finally:
    listener.close()
    if d:
      shutil.rmtree(d, ignore_errors=True)


_CONNECT = (
    "import socket\ns = socket.socket($family, socket.SOCK_STREAM)\n"
    "s.settimeout(3)\ns.connect($addr)\ns.sendall(b'x')\n"
)


def _connect(family):
  return _CONNECT.replace("$family", str(int(family)))


@attack("tcp_loopback")
def _(run):
  return _no_connection(
      run,
      socket.AF_INET,
      socket.SOCK_STREAM,
      ("127.0.0.1", 0),
      _connect(socket.AF_INET),
      unhook=False,
  )


@attack("tcp_loopback_unhooked")
def _(run):
  return _no_connection(
      run,
      socket.AF_INET,
      socket.SOCK_STREAM,
      ("127.0.0.1", 0),
      _connect(socket.AF_INET),
      unhook=True,
  )


@attack("udp_loopback_unhooked")
def _(run):
  return _no_connection(
      run,
      socket.AF_INET,
      socket.SOCK_DGRAM,
      ("127.0.0.1", 0),
      "import socket\nsocket.socket(socket.AF_INET, socket.SOCK_DGRAM)"
      ".sendto(b'x', $addr)\n",
      unhook=True,
  )


@attack("unix_path_socket")
def _(run):
  return _no_connection(
      run,
      socket.AF_UNIX,
      socket.SOCK_STREAM,
      "path",
      _connect(socket.AF_UNIX),
      unhook=False,
  )


@attack("unix_path_socket_unhooked")
def _(run):
  return _no_connection(
      run,
      socket.AF_UNIX,
      socket.SOCK_STREAM,
      "path",
      _connect(socket.AF_UNIX),
      unhook=True,
  )


@attack("unix_abstract_socket_unhooked")
def _(run):
  return _no_connection(
      run,
      socket.AF_UNIX,
      socket.SOCK_STREAM,
      f"\0agrl_sandbox_{secrets.token_hex(6)}",
      _connect(socket.AF_UNIX),
      unhook=True,
  )


# --- processes: fork bombs, escaping daemons


def _fork_bomb(run, prefix, fork_expr):
  """Forks up to 64 `sh` children (each carrying a marker), then sleeps 1.5 s;
  the test samples the host's process table during the call and after it."""
  marker = f"agrl_bomb_{secrets.token_hex(6)}"
  code = _code(
      prefix
      + (
          "import os, time\nn = 0\nfor i in range(64):\n"
          "  try:\n    pid = " + fork_expr + "\n  except OSError:\n    break\n"
          "  if pid == 0:\n"
          "    try:\n      os.execv('/bin/sh', ['sh', '-c', 'sleep 30; true ' + $marker])\n"
          "    finally:\n      os._exit(0)\n"
          "  n += 1\nprint('forked', n, flush=True)\ntime.sleep(1.5)\n"
      ),
      marker=marker,
  )
  peak = 0
  try:
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
      fut = pool.submit(run, code)
      while not fut.done():
        peak = max(peak, len(_host_procs(marker)))
        time.sleep(0.05)
      fut.result()
    # Every child exec'd its marked `sh` before the 1.5 s sleep, so after the
    # call the count only falls: sampled until it is 0, for up to 1 s (as the
    # one sample 1 s after the call was), then once more 0.1 s later.
    deadline = time.monotonic() + 1.0
    left = len(_host_procs(marker))
    while left and time.monotonic() < deadline:
      time.sleep(0.05)
      left = len(_host_procs(marker))
    time.sleep(0.1)
    left = max(left, len(_host_procs(marker)))
    bound = ATTACK_LIMITS["max_processes"]
    return (
        peak <= bound and left == 0,
        f"peak {peak} (bound {bound}), left over {left}",
    )
  finally:
    _kill_marked(marker)


@attack("fork_bomb")
def _(run):
  return _fork_bomb(run, "", "os.fork()")


@attack("fork_bomb_ctypes")
def _(run):
  return _fork_bomb(
      run, "import ctypes\n_fork = ctypes.CDLL(None).fork\n", "_fork()"
  )


@attack("fork_bomb_unhooked")
def _(run):
  return _fork_bomb(run, UNHOOK, "os.fork()")


@attack("daemon_outlives_call_unhooked")
def _(run):
  marker = f"agrl_daemon_{secrets.token_hex(6)}"
  try:
    run(
        _code(
            UNHOOK + "import os\nif os.fork() == 0:\n  os.setsid()\n"
            "  if os.fork() == 0:\n"
            "    os.execv('/bin/sh', ['sh', '-c', 'sleep 30; true ' + $marker])\n"
            "  os._exit(0)\nprint('parent exits')\n",
            marker=marker,
        )
    )
    time.sleep(1.0)
    left = len(_host_procs(marker))
    return left == 0, f"{left} daemon(s) alive after the call"
  finally:
    _kill_marked(marker)


# --- memory, CPU


@attack("memory_bomb")
def _(run):
  r = run("x = bytearray(4 << 30)\nprint('allocated')")
  return "allocated" not in r.stdout, f"stdout {r.stdout!r}"


@attack("memory_raise_rlimit_then_map_8g")
def _(run):
  # mmap does not touch the pages, so a breach costs no real memory.
  r = run(
      "import mmap, resource\ninf = resource.RLIM_INFINITY\n"
      "try:\n  resource.setrlimit(resource.RLIMIT_AS, (inf, inf))\n"
      "except Exception as e:\n  print('no raise', e)\n"
      "m = mmap.mmap(-1, 8 << 30)\nprint('mapped')"
  )
  return "mapped" not in r.stdout, f"stdout {r.stdout!r}"


def _bounded_time(run, code):
  t0 = time.monotonic()
  r = run(code)
  elapsed = time.monotonic() - t0
  return (
      not r.ok and elapsed < WALL + SLACK,
      f"{elapsed:.1f} s (bound {WALL + SLACK}), error {r.error}",
  )


@attack("cpu_loop")
def _(run):
  return _bounded_time(run, "while True:\n  pass")


@attack("cpu_loop_raise_rlimit")
def _(run):
  return _bounded_time(
      run,
      "import resource\ninf = resource.RLIM_INFINITY\n"
      "try:\n  resource.setrlimit(resource.RLIMIT_CPU, (inf, inf))\n"
      "except Exception:\n  pass\nwhile True:\n  pass",
  )


# --- escapes through the shell, subprocess, ctypes


def _escape(run, template):
  return _absent_after(run, template)


@attack("escape_os_system")
def _(run):
  return _escape(run, "import os\nos.system('touch ' + $target)")


@attack("escape_subprocess")
def _(run):
  return _escape(run, "import subprocess\nsubprocess.run(['touch', $target])")


@attack("escape_ctypes_libc_system")
def _(run):
  return _escape(
      run,
      "import ctypes\nctypes.CDLL(None).system(('touch ' + $target).encode())",
  )


@attack("escape_os_system_unhooked")
def _(run):
  return _escape(run, UNHOOK + "import os\nos.system('touch ' + $target)")


@attack("escape_subprocess_unhooked")
def _(run):
  return _escape(
      run, UNHOOK + "import subprocess\nsubprocess.run(['touch', $target])"
  )


@attack("escape_ctypes_libc_system_unhooked")
def _(run):
  return _escape(
      run,
      UNHOOK + "import ctypes\n"
      "ctypes.CDLL(None).system(('touch ' + $target).encode())",
  )


# --- signals to the trainer and other processes


@attack("signal_the_test_process")
def _(run):
  got = []
  old = signal.signal(signal.SIGUSR1, lambda *a: got.append(1))
  try:
    run(
        _code(
            "import os, signal\nos.kill($pid, signal.SIGUSR1)", pid=os.getpid()
        )
    )
    time.sleep(0.3)
    return not got, f"SIGUSR1 received {len(got)} time(s)"
  finally:
    signal.signal(signal.SIGUSR1, old)


@attack("kill_other_process_unhooked")
def _(run):
  victim = subprocess.Popen(["sleep", "60"])
  try:
    run(
        _code(
            UNHOOK + "import os, signal\nos.kill($pid, signal.SIGKILL)",
            pid=victim.pid,
        )
    )
    time.sleep(0.3)
    return victim.poll() is None, f"victim returncode {victim.poll()}"
  finally:
    victim.kill()
    victim.wait()


# --- output and disk


def _huge_output(run, stream):
  tracemalloc.start()
  try:
    t0 = time.monotonic()
    r = run(
        f"import sys\nb = b'x' * (1 << 20)\nfor i in range(200):\n"
        f"  sys.{stream}.buffer.write(b)\n"
    )
    elapsed = time.monotonic() - t0
    peak = tracemalloc.get_traced_memory()[1]
  finally:
    tracemalloc.stop()
  cap = ATTACK_LIMITS["max_output_chars"]
  text = r.stdout if stream == "stdout" else r.stderr
  ok = len(text) <= cap and peak < (16 << 20) and elapsed < WALL + SLACK
  return (
      ok,
      f"{len(text)} chars kept, parent peak {peak >> 20} MiB, {elapsed:.1f} s",
  )


@attack("huge_stdout")
def _(run):
  return _huge_output(run, "stdout")


@attack("huge_stderr")
def _(run):
  return _huge_output(run, "stderr")


@attack("disk_fill")
def _(run):
  # Writes up to 64 files of 1 MiB (the per-file limit) in each writable place,
  # then reports what the kernel let it keep.
  r = run(
      "import os\nfor d in ('.', '/tmp', '/dev/shm'):\n"
      "  for i in range(64):\n"
      "    try:\n      with open(os.path.join(d, f'fill{i}'), 'wb') as f:\n"
      "        for j in range(16):\n          f.write(bytes(65536))\n"
      "    except OSError:\n      break\n"
      "seen, total = set(), 0\nfor d in ('.', '/tmp', '/dev/shm'):\n"
      "  for n in os.listdir(d):\n"
      "    st = os.stat(os.path.join(d, n))\n"
      "    if (st.st_dev, st.st_ino) not in seen:\n"
      "      seen.add((st.st_dev, st.st_ino))\n      total += st.st_size\n"
      "print('total', total)"
  )
  words = r.stdout.split()
  total = int(words[-1]) if len(words) >= 2 and words[-2] == "total" else None
  bound = ATTACK_LIMITS["scratch_bytes"] + ATTACK_LIMITS["max_file_bytes"]
  return (
      total is not None and total <= bound,
      f"kept {total} bytes (bound {bound})",
  )


# --- hanging the parent


@attack("hang_swap_output_for_fifo")
def _(run):
  return _bounded_time(
      run,
      "import os, time\nfor fd in (1, 2):\n"
      "  p = os.readlink(f'/proc/self/fd/{fd}')\n"
      "  if p.startswith('/'):\n"
      "    d, n = os.path.split(p)\n    dfd = os.open(d, os.O_RDONLY)\n"
      "    os.unlink(n, dir_fd=dfd)\n    os.mkfifo(n, dir_fd=dfd)\n"
      "os._exit(3)",
  )


@attack("hang_grandchild_holds_stdout_unhooked")
def _(run):
  marker = f"agrl_holder_{secrets.token_hex(6)}"
  try:
    return _bounded_time(
        run,
        _code(
            UNHOOK + "import os\nif os.fork() == 0:\n  os.setsid()\n"
            "  os.execv('/bin/sh', ['sh', '-c', 'sleep 60; true ' + $marker])\n"
            "os._exit(3)",
            marker=marker,
        ),
    )
  finally:
    _kill_marked(marker)


@attack("hang_close_stdout_and_sleep")
def _(run):
  return _bounded_time(
      run, "import os, time\nos.close(1)\nos.close(2)\ntime.sleep(600)"
  )


# Attacks 'hooks' mode does not contain (asserted, so a change either way is
# noticed): the audit hook is rewritten by one line of Python, dir_fd= arguments
# are invisible to it, reads are not restricted, the host's network and
# processes are shared, and only each file's size is limited.
HOOKS_BREACHES = frozenset(
    {
        "write_os_open_dir_fd",
        "write_unhooked",
        "truncate_existing_dir_fd",
        "delete_dir_fd",
        "delete_unhooked",
        "rename_existing_unhooked",
        "read_secret_in_repo",
        "read_secret_in_home",
        "read_secret_via_proc_pid_cwd",
        "read_other_process_environ",
        "list_other_processes",
        "tcp_loopback_unhooked",
        "udp_loopback_unhooked",
        "unix_path_socket_unhooked",
        "unix_abstract_socket_unhooked",
        "daemon_outlives_call_unhooked",
        "escape_os_system_unhooked",
        "escape_subprocess_unhooked",
        "escape_ctypes_libc_system_unhooked",
        "kill_other_process_unhooked",
        "disk_fill",
    }
)


def _cap_effective(bit):
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith("CapEff:"):
        return bool(int(line.split()[1], 16) >> bit & 1)
  return False


def _expected_hooks_breaches():
  """HOOKS_BREACHES plus those that depend on who runs the trainer."""
  out = set(HOOKS_BREACHES)
  if os.access(os.path.realpath(sys.prefix), os.W_OK):
    out.add("write_into_bound_python_prefix_unhooked")
  if os.geteuid() == 0:  # Linux does not enforce RLIMIT_NPROC for root
    out.add("fork_bomb_unhooked")
  if _cap_effective(24):  # CAP_SYS_RESOURCE may raise hard rlimits
    out.add("memory_raise_rlimit_then_map_8g")
  return out


def _attack_config(module, **overrides):
  """ATTACK_LIMITS (+ overrides) restricted to the fields `module` knows."""
  fields = {f.name for f in dataclasses.fields(module.SandboxConfig)}
  kw = {k: v for k, v in {**ATTACK_LIMITS, **overrides}.items() if k in fields}
  return module.SandboxConfig(**kw)


class _Hung(Exception):
  pass


def run_attack(box, name, timeout=WALL + 60):
  """(contained, evidence) of one attack; a call that does not return within
  `timeout` s counts as a breach (the parent hung). The attack itself runs in
  the calling thread (signal handlers need the main thread)."""
  pool = concurrent.futures.ThreadPoolExecutor(1)

  def run(code):
    fut = pool.submit(box.run, code)
    try:
      return fut.result(timeout=timeout)
    except concurrent.futures.TimeoutError:
      raise _Hung from None

  try:
    return ATTACKS[name](run)
  except _Hung:
    return False, f"the parent hung for over {timeout} s"
  finally:
    pool.shutdown(wait=False)


@pytest.fixture(scope="module")
def bwrap_box():
  if not _bwrap_ok():
    pytest.skip(f"no kernel isolation here: {sandbox.bwrap_status()[1]}")
  box = sandbox.Sandbox(_attack_config(sandbox, isolation="bwrap"))
  assert box.isolation == "bwrap"
  yield box
  box.close()


@pytest.fixture(scope="module")
def hooks_box():
  box = sandbox.Sandbox(
      _attack_config(sandbox, isolation="hooks", allow_weak_isolation=True)
  )
  assert box.isolation == "hooks"
  yield box
  box.close()


def test_attack_suite_size():
  """44 attacks; 'hooks' mode contains 23 of them whoever runs it, 21 here (as
  root without CAP_SYS_RESOURCE, with a writable Python prefix)."""
  assert len(ATTACKS) == 44
  assert _expected_hooks_breaches() <= set(ATTACKS)
  assert len(HOOKS_BREACHES) == 21 and len(ATTACKS) - len(HOOKS_BREACHES) == 23
  if (
      os.geteuid() == 0
      and os.access(sys.prefix, os.W_OK)
      and not _cap_effective(24)
  ):
    assert len(ATTACKS) - len(_expected_hooks_breaches()) == 21


@pytest.mark.parametrize("name", list(ATTACKS))
def test_attack_is_contained_under_bwrap(bwrap_box, name):
  contained, evidence = run_attack(bwrap_box, name)
  assert contained, f"{name}: {evidence}"


@pytest.mark.slow
@pytest.mark.parametrize("name", list(ATTACKS))
def test_attack_outcome_under_hooks_only(hooks_box, name):
  contained, evidence = run_attack(hooks_box, name)
  expected = name not in _expected_hooks_breaches()
  assert contained == expected, (
      f"{name}: contained={contained}, expected "
      f"{expected} in 'hooks' mode: {evidence}"
  )


def _load(path):
  spec = importlib.util.spec_from_file_location("sandbox_under_test", path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module  # dataclasses look their module up
  spec.loader.exec_module(module)
  return module


def main():
  """Prints each attack's outcome and 'N of M attacks contained'."""
  p = argparse.ArgumentParser(description=main.__doc__)
  p.add_argument(
      "--module",
      default=sandbox.__file__,
      help="sandbox.py to attack (e.g. an older version)",
  )
  p.add_argument(
      "--isolation",
      default="auto",
      help="SandboxConfig.isolation (the older module knew 'namespace')",
  )
  p.add_argument("--only", nargs="*", default=None)
  args = p.parse_args()
  module = _load(args.module)
  extra = {"isolation": args.isolation}
  if "allow_weak_isolation" in {
      f.name for f in dataclasses.fields(module.SandboxConfig)
  }:
    extra["allow_weak_isolation"] = args.isolation == "hooks"
  box = module.Sandbox(_attack_config(module, **extra))
  print(f"module {args.module}, isolation {box.isolation}, uid {os.geteuid()}")
  names = args.only or list(ATTACKS)
  contained = 0
  for name in names:
    t0 = time.monotonic()
    ok, evidence = run_attack(box, name)
    contained += ok
    print(
        f"{'contained' if ok else 'BREACH   '} {name:42s} {time.monotonic() - t0:5.1f} s"
        f"  {evidence}",
        flush=True,
    )
  print(f"{contained} of {len(names)} attacks contained", flush=True)
  os._exit(0)  # a hung attack's thread must not keep the process alive


if __name__ == "__main__":
  main()
