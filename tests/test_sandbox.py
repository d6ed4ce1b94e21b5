"""Tests of environments/host/sandbox.py: each limit stops its attack, the test
process survives, normal code returns its stdout."""

import os
import time

import pytest

from environments.host import sandbox


@pytest.fixture(scope="module")
def sb():
  # Generous wall time: the CI machine's 2 cores are shared, so 1 s of CPU time
  # can take several seconds of wall time.
  box = sandbox.Sandbox(sandbox.SandboxConfig(
      cpu_seconds=1, wall_seconds=30, memory_bytes=512 << 20,
      max_output_chars=100, max_workers=4))
  yield box
  box.close()


def test_normal_code_returns_stdout(sb):
  r = sb.run("import math\nprint(math.comb(10, 3))\nprint(sum(range(5)))")
  assert r.ok and r.error is None and r.returncode == 0
  assert r.stdout == "120\n10\n"
  assert r.observation() == "120\n10\n"


def test_writes_inside_own_directory_are_allowed(sb):
  r = sb.run("open('a.txt', 'w').write('hi')\nimport os\nprint(open('a.txt').read(), "
             "os.listdir('.'))")
  assert r.ok and r.stdout.startswith("hi ")


def test_exception_is_an_error_observation(sb):
  r = sb.run("print('before')\n1/0")
  assert not r.ok and r.error == "exception"
  assert r.observation() == "before\n\nError (exception): ZeroDivisionError: division by zero"


def test_infinite_loop_is_stopped_by_cpu_limit(sb):
  t0 = time.time()
  r = sb.run("while True:\n  pass")
  assert not r.ok and r.error == "cpu_limit", r
  assert time.time() - t0 < 30


def test_sleep_is_stopped_by_wall_limit():
  box = sandbox.Sandbox(sandbox.SandboxConfig(wall_seconds=1.5))
  t0 = time.time()
  r = box.run("import time\nprint('start', flush=True)\ntime.sleep(60)")
  assert not r.ok and r.error == "timeout" and r.stdout == "start\n"
  assert time.time() - t0 < 10
  box.close()


def test_memory_bomb_is_stopped(sb):
  r = sb.run("x = bytearray(4 << 30)\nprint('allocated')")
  assert not r.ok and r.error == "memory_limit" and "allocated" not in r.stdout


def test_fork_bomb_is_refused(sb):
  r = sb.run("import os\nwhile True:\n  os.fork()")
  assert not r.ok and r.error == "refused" and "os.fork" in r.stderr
  r = sb.run("import subprocess\nsubprocess.run(['sh', '-c', 'echo hi'])")
  assert not r.ok and r.error == "refused"
  r = sb.run("import ctypes\nctypes.CDLL(None).fork()")
  assert not r.ok and r.error == "refused"


def test_network_is_refused(sb):
  r = sb.run("import socket\ns = socket.socket()\ns.connect(('127.0.0.1', 22))")
  assert not r.ok and r.error == "refused" and "network" in r.stderr
  r = sb.run("import socket\nsocket.create_connection(('example.com', 80), timeout=1)")
  assert not r.ok and r.error == "refused"


def test_network_namespace_has_only_loopback():
  if not sandbox.namespaces_available():
    pytest.skip("no namespaces here: only the audit hook guards the network")
  box = sandbox.Sandbox(sandbox.SandboxConfig(isolation="namespace"))
  r = box.run("print(sorted(l.split(':')[0].strip() for l in "
              "open('/proc/net/dev').read().splitlines()[2:]))")
  assert r.ok and r.stdout == "['lo']\n", r
  box.close()


def test_write_outside_directory_is_refused(sb, tmp_path):
  target = tmp_path / "escape.txt"
  r = sb.run(f"open({str(target)!r}, 'w').write('x')")
  assert not r.ok and r.error == "refused"
  r = sb.run(f"import os\nfd = os.open({str(target)!r}, os.O_WRONLY | os.O_CREAT)")
  assert not r.ok and r.error == "refused"
  r = sb.run("open('../escape.txt', 'w').write('x')")
  assert not r.ok and r.error == "refused"
  assert not target.exists()


def test_output_is_truncated(sb):
  r = sb.run("print('a' * 100000)")
  assert r.ok and r.truncated and r.stdout == "a" * 100
  r = sb.run("while True:\n  print('b' * 1000)")  # stopped by RLIMIT_FSIZE
  assert not r.ok and r.truncated and r.stdout == "b" * 100


def test_bad_input_never_raises(sb):
  assert sb.run(None).error == "sandbox_failure"
  r = sb.run("def f(:\n")
  assert not r.ok and r.error == "exception" and "SyntaxError" in r.stderr


def test_batch_runs_concurrently_in_order(sb):
  codes = [f"import time\ntime.sleep(1.0)\nprint({i})" for i in range(4)]
  t0 = time.time()
  results = sb.run_batch(codes)
  elapsed = time.time() - t0
  assert [r.stdout for r in results] == ["0\n", "1\n", "2\n", "3\n"]
  assert elapsed < 3.5, elapsed  # 4 calls of >= 1 s each, run 4 at a time


def test_the_test_process_survived():
  assert os.getpid() > 0
  with pytest.raises(ValueError, match="cpu_seconds"):
    sandbox.SandboxConfig(cpu_seconds=0)
