"""Local multi-process runs: N processes of main.py joined by jax.distributed.

    python -m agentic_rl.launch --num_processes=2 --devices_per_process=2 -- \
        --config=configs/default.py:smoke --workdir=/tmp/mp

starts `python main.py ARGS --config.mesh.distributed=True
--config.mesh.coordinator_address=127.0.0.1:PORT --config.mesh.num_processes=N
--config.mesh.process_id=i` for i = 0..N-1 on this machine (PORT: a free one
unless --port is given), each with `--devices_per_process` simulated CPU
devices (XLA_FLAGS=--xla_force_host_platform_device_count, JAX_PLATFORMS=cpu)
and the gloo CPU collectives. The processes are the multi-controller program a
real cluster runs (one per host; docs/running.md, "Several processes"): the
same code, one global mesh of N * D devices, process 0 writing the files.

Each line a process prints (stdout and stderr, merged; a progress bar's
carriage-return redraws count as lines) is printed with the prefix `[i] `. If
a process exits with a non-zero status (or is killed), the others get SIGTERM
and, after --grace_s seconds, SIGKILL (a process blocked in a collective or in
jax.distributed's shutdown barrier does not end on SIGTERM), and the launcher
prints one line `launch: process i ...` on stderr and exits with that
process's status (1 if it was killed by a signal). Each process runs in its own
process group, killed as a whole (tool subprocesses included), and dies with
the launcher (Linux: PR_SET_PDEATHSIG). Ctrl-C or SIGTERM to the launcher
stops all processes the same way.

Nothing here talks to the processes but their exit codes and output; they
find each other through jax.distributed's coordinator (process 0 serves it).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import IO, Sequence

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_MAIN = os.path.join(_ROOT, "main.py")
_DEVICE_FLAG = re.compile(r"--xla_force_host_platform_device_count=\S*")
_LINE_END = re.compile(rb"\r\n|\r|\n")


def free_port() -> int:
  """A TCP port on 127.0.0.1 that was free a moment ago (the OS's choice)."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def child_env(
    devices_per_process: int, base: dict[str, str] | None = None
) -> dict[str, str]:
  """The environment of one process.

  Args:
    devices_per_process: simulated CPU devices per process (sets JAX_PLATFORMS
      to cpu and XLA_FLAGS' --xla_force_host_platform_device_count, replacing
      one already there); 0 leaves the platform and XLA_FLAGS alone.
    base: environment to start from (default: this process's).

  Returns:
    The environment, with unbuffered Python output, the gloo CPU collectives
    (JAX_CPU_COLLECTIVES_IMPLEMENTATION) and this checkout first on
    PYTHONPATH (a --program outside the repository root imports agentic_rl).
  """
  env = dict(os.environ if base is None else base)
  env["PYTHONUNBUFFERED"] = "1"
  env["PYTHONPATH"] = os.pathsep.join(
      p for p in (_ROOT, env.get("PYTHONPATH", "")) if p
  )
  env["JAX_CPU_COLLECTIVES_IMPLEMENTATION"] = "gloo"
  if devices_per_process > 0:
    flags = _DEVICE_FLAG.sub("", env.get("XLA_FLAGS", "")).split()
    flags.append(
        f"--xla_force_host_platform_device_count={devices_per_process}"
    )
    env["XLA_FLAGS"] = " ".join(flags)
    env["JAX_PLATFORMS"] = "cpu"
  return env


def main_py_command(
    args: Sequence[str],
    process_id: int,
    num_processes: int,
    address: str,
    program: str = _MAIN,
) -> list[str]:
  """`python program ARGS` plus the config.mesh flags of process `process_id`."""
  return [
      sys.executable,
      program,
      *args,
      "--config.mesh.distributed=True",
      f"--config.mesh.coordinator_address={address}",
      f"--config.mesh.num_processes={num_processes}",
      f"--config.mesh.process_id={process_id}",
  ]


def _death_signal_setter():
  """A function for Popen's preexec_fn that makes the child get SIGKILL when
  the launcher dies (Linux prctl PR_SET_PDEATHSIG), or None elsewhere. libc is
  loaded here, in the parent: between fork and exec the child only calls it.
  """
  if sys.platform != "linux":
    return None
  try:
    prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl
  except (OSError, AttributeError):
    return None
  return lambda: prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG


def _pump(index: int, stream: IO[bytes], out: IO[str], lock) -> None:
  """Copies a child's output to `out`, each line prefixed with `[index] `."""
  pending = b""
  while chunk := stream.read1(65536):
    parts = _LINE_END.split(pending + chunk)
    pending = parts.pop()
    with lock:
      for part in parts:
        if part.strip():
          out.write(f"[{index}] {part.decode(errors='replace')}\n")
      out.flush()
  if pending.strip():
    with lock:
      out.write(f"[{index}] {pending.decode(errors='replace')}\n")
      out.flush()


def _describe(rc: int) -> str:
  if rc < 0:
    try:
      return f"was killed by {signal.Signals(-rc).name}"
    except ValueError:
      return f"was killed by signal {-rc}"
  return f"exited with status {rc}"


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
  try:
    os.killpg(proc.pid, sig)
  except (ProcessLookupError, PermissionError):
    pass


def _stop(procs: Sequence[subprocess.Popen], grace_s: float) -> None:
  """SIGTERM to every live process group, SIGKILL after `grace_s` seconds."""
  live = [p for p in procs if p.poll() is None]
  for p in live:
    _signal_group(p, signal.SIGTERM)
  deadline = time.monotonic() + grace_s
  while any(p.poll() is None for p in live) and time.monotonic() < deadline:
    time.sleep(0.05)
  for p in procs:
    # Also after a clean exit: tool subprocesses left in the group.
    _signal_group(p, signal.SIGKILL)
  for p in live:
    p.wait()


class _Terminated(Exception):
  """The launcher got SIGTERM."""


def run(
    commands: Sequence[Sequence[str]],
    envs: Sequence[dict[str, str]],
    grace_s: float = 10.0,
    out: IO[str] | None = None,
    err: IO[str] | None = None,
) -> int:
  """Runs the processes to the end, or stops them all at the first failure.

  Args:
    commands: one argv per process; process i's output lines get `[i] `.
    envs: the environment of each process.
    grace_s: seconds between SIGTERM and SIGKILL when stopping processes.
    out: where the prefixed output goes (default: sys.stdout).
    err: where the launcher's own line goes (default: sys.stderr).

  Returns:
    0 if every process exited with 0; else the first failing process's status
    (1 if it was killed by a signal), after every process has ended.
  """
  out = sys.stdout if out is None else out
  err = sys.stderr if err is None else err
  lock = threading.Lock()
  procs: list[subprocess.Popen] = []
  pumps = []
  previous = signal.getsignal(signal.SIGTERM)

  def on_term(signum, frame):
    del signum, frame
    raise _Terminated()

  in_main_thread = threading.current_thread() is threading.main_thread()
  if in_main_thread:
    signal.signal(signal.SIGTERM, on_term)
  failed = None
  preexec = _death_signal_setter()
  try:
    for cmd, env in zip(commands, envs):
      procs.append(
          subprocess.Popen(
              list(cmd),
              env=env,
              stdin=subprocess.DEVNULL,
              stdout=subprocess.PIPE,
              stderr=subprocess.STDOUT,
              start_new_session=True,
              preexec_fn=preexec,
          )
      )
    for i, p in enumerate(procs):
      t = threading.Thread(
          target=_pump, args=(i, p.stdout, out, lock), daemon=True
      )
      t.start()
      pumps.append(t)
    while failed is None and any(p.poll() is None for p in procs):
      bad = [(i, p.returncode) for i, p in enumerate(procs) if p.poll()]
      if bad:
        # A process killed by a signal is the likelier cause of the others'
        # errors (their collectives lost a peer).
        failed = min(bad, key=lambda b: (b[1] > 0, b[0]))
        break
      time.sleep(0.05)
    if failed is None:
      bad = [(i, p.returncode) for i, p in enumerate(procs) if p.returncode]
      failed = min(bad, key=lambda b: (b[1] > 0, b[0])) if bad else None
  except (KeyboardInterrupt, _Terminated):
    _stop(procs, grace_s)
    with lock:
      print(
          f"launch: interrupted; stopped {len(procs)} process(es)",
          file=err,
          flush=True,
      )
    return 130
  finally:
    if in_main_thread:
      signal.signal(signal.SIGTERM, previous)
    _stop(procs, grace_s)
    for t in pumps:
      t.join(timeout=5.0)
  if failed is None:
    return 0
  i, rc = failed
  others = len(procs) - 1
  with lock:
    print(
        f"launch: process {i} of {len(procs)} {_describe(rc)}; stopped the "
        f"other {others} process{'es' if others != 1 else ''} (SIGTERM, then "
        f"SIGKILL after {grace_s:g} s); its output above is prefixed [{i}]",
        file=err,
        flush=True,
    )
  return rc if rc > 0 else 1


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
      prog="python -m agentic_rl.launch",
      allow_abbrev=False,  # --num_process is a typo, not --num_processes
      description=(
          "Runs N processes of main.py on this machine as one multi-process "
          "JAX run (coordinator on 127.0.0.1). Arguments after -- go to "
          "every process."
      ),
  )
  parser.add_argument(
      "--num_processes", type=int, default=2, help="processes to start"
  )
  parser.add_argument(
      "--devices_per_process",
      type=int,
      default=1,
      help="simulated CPU devices per process; 0: leave the platform alone",
  )
  parser.add_argument(
      "--port", type=int, default=0, help="coordinator port (0: a free one)"
  )
  parser.add_argument(
      "--grace_s",
      type=float,
      default=10.0,
      help="seconds between SIGTERM and SIGKILL when stopping processes",
  )
  parser.add_argument(
      "--program",
      default=_MAIN,
      help="the Python file each process runs (default: main.py)",
  )
  argv = list(sys.argv[1:] if argv is None else argv)
  if "--" in argv:
    cut = argv.index("--")
    own, rest = argv[:cut], argv[cut + 1 :]
  else:
    own, rest = argv, []
  opts, unknown = parser.parse_known_args(own)
  if unknown:
    parser.error(
        f"unrecognized arguments {unknown}: main.py's flags go after --, "
        "e.g. python -m agentic_rl.launch --num_processes=2 -- "
        "--config=configs/default.py:smoke --workdir=/tmp/mp"
    )
  if opts.num_processes < 1:
    parser.error(f"--num_processes={opts.num_processes}: must be >= 1")
  if opts.devices_per_process < 0:
    parser.error(
        f"--devices_per_process={opts.devices_per_process}: must be >= 0"
    )
  for arg in rest:
    if arg.startswith("--config.mesh.") and arg.split("=")[0].rsplit(".")[
        -1
    ] in ("distributed", "coordinator_address", "num_processes", "process_id"):
      parser.error(f"{arg}: the launcher sets this flag itself")
  address = f"127.0.0.1:{opts.port or free_port()}"
  commands = [
      main_py_command(rest, i, opts.num_processes, address, opts.program)
      for i in range(opts.num_processes)
  ]
  env = child_env(opts.devices_per_process)
  return run(commands, [env] * opts.num_processes, grace_s=opts.grace_s)


if __name__ == "__main__":
  sys.exit(main())
