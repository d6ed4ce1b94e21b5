"""One run per workdir: the lock refuses a second process and is re-entrant."""

import os
import re
import subprocess
import sys

import pytest

from agentic_rl import validation
from agentic_rl import workdir_lock


def test_workdir_lock_refuses_a_second_process_and_is_reentrant(tmp_path):
  workdir = str(tmp_path / "run")
  with workdir_lock.workdir_lock(workdir) as path:
    assert open(path).read() == f"{os.getpid()}\n"
    with workdir_lock.workdir_lock(workdir):  # same process: re-entrant
      pass
    # Another process cannot take it while this one holds it.
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR);"
            " fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)",
            path,
        ],
        capture_output=True,
        text=True,
    )
    assert probe.returncode != 0 and "BlockingIOError" in probe.stderr
  # A process holding the lock: refused with its pid; after it dies, free.
  holder = subprocess.Popen(
      [
          sys.executable,
          "-c",
          "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT);"
          " fcntl.flock(fd, fcntl.LOCK_EX); os.ftruncate(fd, 0); os.write(fd, b'4242');"
          " print('locked', flush=True); time.sleep(60)",
          path,
      ],
      stdout=subprocess.PIPE,
      text=True,
  )
  try:
    assert holder.stdout.readline().strip() == "locked"
    with pytest.raises(
        validation.ConfigError,
        match=rf"workdir {re.escape(workdir)} is in use by another run "
        r"\(pid 4242, lock .*\.lock\): wait for it to finish",
    ):
      with workdir_lock.workdir_lock(workdir):
        pass
  finally:
    holder.kill()
    holder.wait()
  with workdir_lock.workdir_lock(workdir):  # the stale file does not block
    pass
