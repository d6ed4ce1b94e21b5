"""Real multi-process runs: several processes on 127.0.0.1 joined by
jax.distributed (gloo CPU collectives), started by agentic_rl/launch.py.

No mocks: every test starts real processes. The default tier checks that two
processes join and reduce across each other (seconds) and the launcher's
failure handling on plain Python processes; the slow tier
(python -m pytest -q -m slow tests/test_multiprocess.py) runs the smoke RL
config shortened, on 2 processes x 2 devices:
  - it ends with the parameters and metrics of 1 process x 4 devices (to
    float32 rounding, after GRPO updates with real gradients);
  - only process 0 writes the run's files and prints the report;
  - a process killed mid-run stops the launcher with one line naming it, and
    the same command then resumes to the uninterrupted run's result;
  - processes started with different configs are refused before any work;
and, on a host-tool environment (configs/gsm_tool.py:smoke through
tests/multiprocess_host_program.py, which records every environment reset,
step and loader read per process), 2 processes x 1 device against 1 x 2:
  - each process steps only its own rows, and the runs end alike;
  - with tasks from a config.data JSONL set, each process reads only its own
    rows' records, and the saved data positions agree.
"""

import io
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from agentic_rl import checkpoint as checkpoint_lib
from agentic_rl import launch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROBE = os.path.join(REPO, "tests", "multiprocess_probe.py")
HOST_PROGRAM = os.path.join(REPO, "tests", "multiprocess_host_program.py")


def _launch(args, timeout, **kwargs):
  return subprocess.run(
      [sys.executable, "-m", "agentic_rl.launch", *args],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=timeout,
      **kwargs,
  )


# ------------------------------------------------------------- default tier


def test_two_processes_join_and_reduce_across_each_other():
  start = time.monotonic()
  r = _launch(
      ["--num_processes=2", "--devices_per_process=2", f"--program={PROBE}"],
      timeout=120,
  )
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  for i in (0, 1):
    # 4 devices in all, 2 local; the allgather sees both processes and the
    # sum over a global array adds the rows of both (1 + 2 + 3 + 4).
    assert (
        f"[{i}] probe process={i} of 2: devices=4 local=2 gathered=[0, 1] "
        "sum=10 from_primary=7 bytes=[b'p0', b'p1p1']" in r.stdout
    ), r.stdout[-3000:]
  assert time.monotonic() - start < 120


_STUB = textwrap.dedent("""
    import re, signal, sys, time
    pid = int(re.search(r"process_id=(\\d+)", " ".join(sys.argv)).group(1))
    with open(sys.argv[1] + f"/pid{pid}", "w") as f:
      f.write(str(__import__("os").getpid()))
    if pid == 1 and "--all_wait" not in sys.argv:
      time.sleep(1.0)
      print("process 1 fails", flush=True)
      sys.exit(3)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # like a blocked collective
    print(f"process {pid} waits\\rredrawn", flush=True)
    time.sleep(600)
    """)


def test_launcher_stops_the_others_and_names_the_failed_process(tmp_path):
  stub = tmp_path / "stub.py"
  stub.write_text(_STUB)
  start = time.monotonic()
  r = _launch(
      [
          "--num_processes=3",
          "--devices_per_process=0",
          "--grace_s=1",
          f"--program={stub}",
          "--",
          str(tmp_path),
      ],
      timeout=60,
  )
  elapsed = time.monotonic() - start
  assert r.returncode == 3, r.stdout + r.stderr
  assert elapsed < 30  # 1 s of work, 1 s grace, Python start-ups
  lines = r.stderr.strip().splitlines()
  assert lines[-1].startswith(
      "launch: process 1 of 3 exited with status 3; stopped the other 2 "
      "processes (SIGTERM, then SIGKILL after 1 s)"
  ), r.stderr
  assert "[1] process 1 fails" in r.stdout
  # Output lines are prefixed; a carriage return ends a line too.
  assert "[0] process 0 waits\n[0] redrawn" in r.stdout, r.stdout
  for i in (0, 2):  # SIGTERM was ignored: SIGKILL ended them
    pid = int((tmp_path / f"pid{i}").read_text())
    with pytest.raises(ProcessLookupError):
      os.kill(pid, 0)


def test_processes_die_with_the_launcher(tmp_path):
  stub = tmp_path / "stub.py"
  stub.write_text(_STUB)
  proc = subprocess.Popen(
      [
          sys.executable,
          "-m",
          "agentic_rl.launch",
          "--num_processes=2",
          "--devices_per_process=0",
          f"--program={stub}",
          "--",
          str(tmp_path),
          "--all_wait",
      ],
      cwd=REPO,
      stdout=subprocess.DEVNULL,
      stderr=subprocess.DEVNULL,
  )
  try:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not all(
        (tmp_path / f"pid{i}").exists() for i in (0, 1)
    ):
      time.sleep(0.05)
    time.sleep(0.2)  # the pid files are written before the children wait
    pids = [int((tmp_path / f"pid{i}").read_text()) for i in (0, 1)]
    proc.kill()  # SIGKILL: the launcher cannot stop them itself
    proc.wait()
    deadline = time.monotonic() + 10
    alive = pids
    while alive and time.monotonic() < deadline:
      alive = [p for p in pids if _alive(p)]
      time.sleep(0.05)
    assert not alive, "children outlived a SIGKILLed launcher"
  finally:
    if proc.poll() is None:
      proc.kill()


def _alive(pid):
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  # A zombie (exited, not yet reaped by init) counts as gone.
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().split(")")[-1].split()[0] != "Z"
  except FileNotFoundError:  # reaped meanwhile
    return False


def test_launcher_sets_the_mesh_flags_itself():
  r = _launch(["--", "--config.mesh.process_id=1"], timeout=60)
  assert r.returncode == 2
  assert "--config.mesh.process_id=1: the launcher sets this flag itself" in (
      r.stderr
  )


def test_child_environment():
  env = launch.child_env(
      3,
      base={"XLA_FLAGS": "--xla_force_host_platform_device_count=8 --xla_x=1"},
  )
  assert env["XLA_FLAGS"].split() == [
      "--xla_x=1",
      "--xla_force_host_platform_device_count=3",
  ]
  assert env["JAX_PLATFORMS"] == "cpu"
  assert env["JAX_CPU_COLLECTIVES_IMPLEMENTATION"] == "gloo"
  assert env["PYTHONPATH"].split(os.pathsep)[0] == REPO
  assert "JAX_PLATFORMS" not in launch.child_env(0, base={})
  cmd = launch.main_py_command(["--workdir=w"], 1, 2, "127.0.0.1:5")
  assert cmd[1:] == [
      os.path.join(REPO, "main.py"),
      "--workdir=w",
      "--config.mesh.distributed=True",
      "--config.mesh.coordinator_address=127.0.0.1:5",
      "--config.mesh.num_processes=2",
      "--config.mesh.process_id=1",
  ]


# ---------------------------------------------------------------- slow tier

# 20 SFT steps (the smoke config's own) teach some episodes the answer
# format, so the first GRPO groups have mixed format rewards and the RL
# gradient is real; after only 6 every reward was 0 and the gradient rounding
# noise.
_SFT, _RL = 20, 3


def _args(workdir, cache):
  """The smoke config, shortened: 20 SFT steps, 3 GRPO iterations, a
  checkpoint every 5 steps (forced at 20 and 23), 8 held-out tasks; with the
  full config's fitted SFT bucket (every process draws the same
  demonstrations and compiles the same lengths, (40, 64))."""
  return [
      "--config=configs/default.py:smoke",
      "--config.sft.fit_bucket=True",
      f"--config.sft.steps={_SFT}",
      f"--config.rl.steps={_RL}",
      "--config.checkpoint.every_steps=5",
      "--config.eval.num_tasks=8",
      f"--workdir={workdir}",
      f"--compilation_cache={cache}",
  ]


def _launch_run(workdir, cache, timeout=900):
  start = time.monotonic()
  r = _launch(
      ["--num_processes=2", "--devices_per_process=2", "--grace_s=5", "--"]
      + _args(workdir, cache),
      timeout=timeout,
  )
  return r, time.monotonic() - start


def _saved_state(workdir, step):
  """The TrainState of checkpoint `step`, as numpy arrays (read on this one
  device, whatever mesh wrote it)."""
  path = os.path.join(workdir, "checkpoints", str(step), "default")
  ckptr = ocp.PyTreeCheckpointer()
  tree = ckptr.metadata(path).item_metadata.tree
  args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
  return ckptr.restore(path, restore_args=args)


def _metrics(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def _report(workdir):
  with open(os.path.join(workdir, "eval_report.json")) as f:
    return json.load(f)["reports"]


def _assert_close_trees(a, b, rtol, atol):
  la = jax.tree_util.tree_flatten_with_path(a)[0]
  lb = jax.tree.leaves(b)
  assert len(la) == len(lb) > 0
  for (path, x), y in zip(la, lb):
    np.testing.assert_allclose(
        x, y, rtol=rtol, atol=atol, err_msg=jax.tree_util.keystr(path)
    )


def _assert_close_metrics(a, b, rtol, atol, keys=None):
  """Every logged value (or only `keys`) of metrics.jsonl close, same steps."""
  ma, mb = _metrics(a), _metrics(b)
  assert [r["step"] for r in ma] == [r["step"] for r in mb]
  for ra, rb in zip(ma, mb):
    for k, v in ra.items():
      if k in ("phase", "step") or k.endswith("steps_per_sec"):
        continue
      if keys is not None and k not in keys:
        continue
      if v is None:
        assert rb[k] is None, (k, ra, rb)
      else:
        np.testing.assert_allclose(
            v, rb[k], rtol=rtol, atol=atol, err_msg=f"{k} step {ra['step']}"
        )


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
  return str(tmp_path_factory.mktemp("xla_cache"))


@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory, cache):
  workdir = str(tmp_path_factory.mktemp("mp") / "run")
  r, wall = _launch_run(workdir, cache)
  assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-3000:]
  print(f"2 processes x 2 devices: {wall:.0f} s")
  return workdir, r


@pytest.mark.slow
def test_only_process_0_writes_files_and_prints(two_process_run):
  workdir, r = two_process_run
  names = sorted(os.listdir(workdir))
  assert names == sorted(
      [
          ".lock",
          ".lock.1",
          "checkpoints",
          "config.json",
          "eval_report.json",
          "eval_report.md",
          "eval_sft.json",
          "learning_curves.png",
          "metrics.jsonl",
          "tensorboard",
      ]
  ), names
  with open(os.path.join(workdir, "config.json")) as f:
    mesh = json.load(f)["mesh"]
  assert mesh["process_id"] == 0 and mesh["num_processes"] == 2
  # Every checkpoint (written by both) carries process 0's manifest.
  steps = sorted(
      int(n) for n in os.listdir(os.path.join(workdir, "checkpoints"))
  )
  assert steps[-1] == _SFT + _RL
  for s in steps:
    assert os.path.isfile(
        os.path.join(workdir, "checkpoints", str(s), "_CHECKSUMS.json")
    )
  out = r.stdout
  assert re.search(r"^\[0\] accuracy ", out, re.M)  # the report, once
  assert len(re.findall(r"^\[\d\] accuracy ", out, re.M)) == 1
  assert not re.search(r"^\[1\] default_smoke:", out, re.M)  # the bar
  assert re.search(r"^\[0\] default_smoke:", out, re.M)
  assert "changed fields" not in out


@pytest.mark.slow
def test_two_processes_match_one_process_of_four_devices(
    two_process_run, cache, tmp_path
):
  workdir, _ = two_process_run
  one_dir = str(tmp_path / "one")
  env = launch.child_env(4)  # 4 CPU devices in this one process
  start = time.monotonic()
  r = subprocess.run(
      [sys.executable, "main.py", *_args(one_dir, cache)],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=900,
      env=env,
  )
  assert r.returncode == 0, r.stderr[-5000:]
  print(f"1 process x 4 devices: {time.monotonic() - start:.0f} s")
  two = _saved_state(workdir, _SFT + _RL)
  one = _saved_state(one_dir, _SFT + _RL)
  assert int(two["step"]) == int(one["step"]) == _SFT + _RL
  # The SFT phase (data-parallel training over 4 devices, gradients summed
  # by gloo across the 2 processes, or within the one process) agrees to
  # float32 rounding: ref_params is the policy at the end of SFT (measured:
  # at most 2.4e-7 apart), and so do the SFT metrics of every logged step.
  _assert_close_trees(two["ref_params"], one["ref_params"], 1e-5, 1e-6)
  sft_keys = {k for r in _metrics(workdir) for k in r if k.startswith("sft/")}
  _assert_close_metrics(workdir, one_dir, 1e-5, 1e-6, keys=sft_keys)
  # The held-out evaluation of that policy (greedy and sampled, rows split
  # over the 4 devices, gathered across processes) is the same.
  with open(os.path.join(workdir, "eval_sft.json")) as f:
    sft_two = json.load(f)
  with open(os.path.join(one_dir, "eval_sft.json")) as f:
    assert json.load(f) == sft_two
  # The first GRPO iteration samples from that policy: same episodes.
  first = [r for r in _metrics(workdir) if r["step"] == _SFT + 1][0]
  first_one = [r for r in _metrics(one_dir) if r["step"] == _SFT + 1][0]
  for k in ("rl/policy_tokens", "rl/tool_calls", "rl/reward"):
    assert first[k] == first_one[k], k
  np.testing.assert_allclose(first["rl/entropy"], first_one["rl/entropy"], 1e-4)
  # The GRPO updates are real, not rounding noise: in every iteration of
  # both runs some group's rewards differ (the format reward; measured: half
  # the groups of the first iteration, advantages |A| 0.43 on average,
  # gradient norm 0.81), so the comparison below cannot pass vacuously. (With
  # all rewards equal the loss is 0 and AdamW turns the rounding noise of the
  # gradient into lr-sized steps that differ with the summation order.)
  for m in (_metrics(workdir), _metrics(one_dir)):
    rl = [r for r in m if "rl/reward" in r]
    assert [r["step"] for r in rl] == list(range(_SFT + 1, _SFT + _RL + 1))
    for r in rl:
      assert r["rl/zero_variance_groups"] < 1.0, r
      assert r["rl/adv_abs_mean"] > 0.1 and r["rl/grad_norm"] > 0.1, r
  # After the 3 GRPO iterations the parameters still agree to float32
  # rounding (measured: at most 2.4e-7 apart, parameters of size ~1), as do
  # the RL metrics (loss, gradient norm, rewards).
  _assert_close_trees(two["params"], one["params"], 1e-5, 1e-6)
  rl_keys = {k for r in _metrics(workdir) for k in r if k.startswith("rl/")}
  _assert_close_metrics(workdir, one_dir, 1e-4, 1e-6, keys=rl_keys)


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory, cache):
  """A 2-process run whose process 1 is SIGKILLed after the end-of-SFT
  checkpoint: (workdir, launcher return code, its stderr, seconds from the
  kill to the launcher's exit)."""
  workdir = str(tmp_path_factory.mktemp("killed") / "run")
  log = open(os.path.join(os.path.dirname(workdir), "launch.log"), "w+")
  proc = subprocess.Popen(
      [
          sys.executable,
          "-m",
          "agentic_rl.launch",
          "--num_processes=2",
          "--devices_per_process=2",
          "--grace_s=5",
          "--",
      ]
      + _args(workdir, cache),
      cwd=REPO,
      stdout=log,
      stderr=subprocess.PIPE,
      text=True,
  )
  manifest = os.path.join(workdir, "checkpoints", str(_SFT), "_CHECKSUMS.json")
  deadline = time.monotonic() + 600
  try:
    while not os.path.exists(manifest) and time.monotonic() < deadline:
      assert proc.poll() is None, "the run ended before the kill"
      time.sleep(0.1)
    assert os.path.exists(manifest), "no end-of-SFT checkpoint in 600 s"
    with open(os.path.join(workdir, ".lock.1")) as f:
      pid = int(f.read())
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    _, err = proc.communicate(timeout=120)
    stopped = time.monotonic() - killed
  finally:
    if proc.poll() is None:
      proc.kill()
    log.close()
  return workdir, proc.returncode, err, stopped


@pytest.mark.slow
def test_killing_one_process_stops_the_launcher_with_one_line(killed_run):
  workdir, rc, err, stopped = killed_run
  print(f"launcher ended {stopped:.1f} s after the kill")
  assert rc == 1, err
  # Process 0 is blocked in a collective (or exits on the lost peer): SIGTERM,
  # SIGKILL after the 5 s grace at the latest.
  assert stopped < 30, stopped
  assert (
      err.strip()
      .splitlines()[-1]
      .startswith(
          "launch: process 1 of 2 was killed by SIGKILL; stopped the other 1 "
          "process"
      )
  ), err
  assert not os.path.exists(os.path.join(workdir, "eval_report.json"))


@pytest.mark.slow
def test_resume_after_the_kill_matches_the_uninterrupted_run(
    killed_run, two_process_run, cache
):
  workdir = killed_run[0]
  r, _ = _launch_run(workdir, cache)
  assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-3000:]
  m = re.search(r"^\[0\] .*resumed from step (\d+)", r.stdout, re.M)
  assert m and int(m.group(1)) >= _SFT, r.stdout[-5000:]
  # The same program on the same 2 x 2 devices: the same values.
  ref = two_process_run[0]
  a, b = _saved_state(workdir, _SFT + _RL), _saved_state(ref, _SFT + _RL)
  _assert_close_trees(a["params"], b["params"], 1e-6, 1e-7)
  _assert_close_trees(a["opt_state"], b["opt_state"], 1e-6, 1e-7)
  _assert_close_metrics(workdir, ref, 1e-6, 1e-7)
  assert _report(workdir) == _report(ref)


@pytest.mark.slow
# launch.run in this (JAX-importing, threaded) process forks for preexec_fn;
# the child only calls prctl before exec.
@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")
def test_processes_with_different_configs_are_refused(tmp_path, cache):
  workdir = str(tmp_path / "run")
  address = f"127.0.0.1:{launch.free_port()}"
  commands = [
      launch.main_py_command(
          _args(workdir, cache) + [f"--config.rl.steps={_RL + i}"],
          i,
          2,
          address,
      )
      for i in range(2)
  ]
  out, err = io.StringIO(), io.StringIO()
  rc = launch.run(
      commands, [launch.child_env(2)] * 2, grace_s=5, out=out, err=err
  )
  assert rc == 2, out.getvalue()[-3000:] + err.getvalue()
  want = (
      "error: the 2 processes of this run were started with different "
      f"configs: process 1 has config.rl.steps={_RL + 1} (process 0: {_RL})"
  )
  for i in (0, 1):
    assert f"[{i}] {want}" in out.getvalue(), out.getvalue()[-3000:]
  # Refused before any work: not even the workdir was made.
  assert not os.path.exists(workdir)


def _host_args(workdir, cache):
  """configs/gsm_tool.py:smoke (sandboxed Python tool, reasoning-gym tasks),
  pure RL from the initial weights: with SFT the expert's demonstrations are
  drawn per process (host_rollout.rollout), so they would differ from one
  process's. The random policy's rewards are all 0; the entropy bonus makes
  the RL gradient real, so that the parameters compare meaningfully."""
  return [
      "--config=configs/gsm_tool.py:smoke",
      "--config.sft.steps=0",
      "--config.rl.entropy_coef=0.01",
      f"--workdir={workdir}",
      f"--compilation_cache={cache}",
  ]


def _host_steps(path, kind="step"):
  """The `step SEED INDEX TURN` (or `read` / `reset` `SEED INDEX`) lines
  multiprocess_host_program.py wrote, without the kind, sorted."""
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return sorted(
        line.split(maxsplit=1)[1] for line in f if line.startswith(kind + " ")
    )


@pytest.mark.slow
def test_host_env_processes_step_only_their_own_rows(tmp_path, cache):
  """2 processes x 1 device against 1 process x 2 devices on a host-tool
  environment: each process resets and steps only its own rows of every
  batch (RL and held-out), and the run ends as the one-process run."""
  two_dir, one_dir = str(tmp_path / "two"), str(tmp_path / "one")
  two_log, one_log = tmp_path / "log_two", tmp_path / "log_one"
  two_log.mkdir()
  one_log.mkdir()
  start = time.monotonic()
  r = _launch(
      [
          "--num_processes=2",
          "--devices_per_process=1",
          "--grace_s=5",
          f"--program={HOST_PROGRAM}",
          "--",
      ]
      + _host_args(two_dir, cache),
      timeout=900,
      env={**os.environ, "HOST_STEP_LOG": str(two_log)},
  )
  assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-3000:]
  print(f"2 processes x 1 device: {time.monotonic() - start:.0f} s")
  start = time.monotonic()
  r1 = subprocess.run(
      [sys.executable, HOST_PROGRAM, *_host_args(one_dir, cache)],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=900,
      env={**launch.child_env(2), "HOST_STEP_LOG": str(one_log)},
  )
  assert r1.returncode == 0, r1.stderr[-5000:]
  print(f"1 process x 2 devices: {time.monotonic() - start:.0f} s")
  # Every batch of 4 rows (2 RL iterations, 1 + 1 greedy held-out sets):
  # process i stepped rows [2i, 2i + 2) only, by its own account ...
  for i in (0, 1):
    said = re.findall(
        rf"^\[{i}\] .*host rollout: process {i} stepped rows "
        rf"\[{2 * i}, {2 * i + 2}\) of 4",
        r.stdout,
        re.M,
    )
    assert len(said) == 4, r.stdout[-5000:]
  assert "host rollout: process" not in r1.stdout + r1.stderr  # one process
  # ... and by the environment's: the episodes (task seed and index) the two
  # processes stepped are disjoint, and together they are exactly the
  # episodes and turns the one process stepped.
  steps = [_host_steps(two_log / f"steps.{i}") for i in (0, 1)]
  assert steps[0] and steps[1]
  tasks = [{s.rsplit(maxsplit=1)[0] for s in part} for part in steps]
  assert not tasks[0] & tasks[1], tasks
  assert sorted(steps[0] + steps[1]) == _host_steps(one_log / "steps.0")
  assert not (one_log / "steps.1").exists()
  # The same run: parameters to float32 rounding after 2 RL iterations whose
  # gradient is real (the entropy bonus; measured: gradient norm 2.9e-3,
  # against ~1e-9 for rounding noise, and the parameters bit-identical), the
  # same metrics and reports.
  two, one = _saved_state(two_dir, 2), _saved_state(one_dir, 2)
  _assert_close_trees(two["params"], one["params"], 1e-5, 1e-6)
  for row in _metrics(two_dir):
    assert row["rl/grad_norm"] > 1e-3, row
  _assert_close_metrics(two_dir, one_dir, 1e-4, 1e-6)
  assert _report(two_dir) == _report(one_dir)


_DATA_CONFIG = """
import ml_collections
from configs import gsm_tool


def get_config(arg=None):
  config = gsm_tool.get_config("smoke")
  config.sft.steps = 0
  config.rl.entropy_coef = 0.01
  config.data = ml_collections.ConfigDict(
      dict(source="jsonl", name="toy", data_dir={data_dir!r}, shuffle_seed=5)
  )
  return config
"""


@pytest.mark.slow
def test_data_loader_processes_read_only_their_own_records(tmp_path, cache):
  """configs/gsm_tool.py:smoke with its tasks from a config.data JSONL set
  (agentic_rl/datasets/tasks.py), 2 processes x 1 device against 1 process x
  2 devices: each process reads only the records of its own rows, together
  exactly the one process's, and the runs end alike (the same position in
  every checkpoint)."""
  from agentic_rl import train  # noqa: PLC0415
  from agentic_rl import data as data_lib  # noqa: PLC0415
  from configs import gsm_tool  # noqa: PLC0415

  data_dir = tmp_path / "data"
  data_dir.mkdir()
  env = train.make_env(gsm_tool.get_config("smoke"))
  for split, seed in (("train", 0), ("test", 1)):
    items = env._data(seed)  # noqa: SLF001
    data_lib.write_jsonl(
        str(data_dir / f"toy-{split}.jsonl"),
        [{"entry": items[i], "seed": seed, "index": i} for i in range(20)],
    )
  config = tmp_path / "data_config.py"
  config.write_text(_DATA_CONFIG.format(data_dir=str(data_dir)))
  args = lambda w: [
      f"--config={config}",
      f"--workdir={w}",
      f"--compilation_cache={cache}",
  ]
  two_dir, one_dir = str(tmp_path / "two"), str(tmp_path / "one")
  two_log, one_log = tmp_path / "log_two", tmp_path / "log_one"
  two_log.mkdir()
  one_log.mkdir()
  r = _launch(
      [
          "--num_processes=2",
          "--devices_per_process=1",
          "--grace_s=5",
          f"--program={HOST_PROGRAM}",
          "--",
      ]
      + args(two_dir),
      timeout=900,
      env={**os.environ, "HOST_STEP_LOG": str(two_log)},
  )
  assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-3000:]
  r1 = subprocess.run(
      [sys.executable, HOST_PROGRAM, *args(one_dir)],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=900,
      env={**launch.child_env(2), "HOST_STEP_LOG": str(one_log)},
  )
  assert r1.returncode == 0, r1.stderr[-5000:]
  reads = [_host_steps(two_log / f"steps.{i}", "read") for i in (0, 1)]
  one_reads = _host_steps(one_log / "steps.0", "read")
  # 2 RL iterations of 2 groups of 2 rows (a group per process) and 2 greedy
  # held-out sets of 4 tasks (2 per process): 1 + 1 + 2 + 2 records each.
  assert len(reads[0]) == len(reads[1]) == 6, reads
  assert sorted(reads[0] + reads[1]) == one_reads
  assert {s.split()[0] for s in one_reads} == {"0", "1"}  # from the files
  for kind in ("reset", "step"):
    parts = [_host_steps(two_log / f"steps.{i}", kind) for i in (0, 1)]
    assert sorted(parts[0] + parts[1]) == _host_steps(one_log / "steps.0", kind)
  train_reads = [{s for s in part if s.startswith("0 ")} for part in reads]
  assert len(train_reads[0]) == len(train_reads[1]) == 2
  assert not train_reads[0] & train_reads[1]
  with checkpoint_lib.Checkpointer(os.path.join(two_dir, "checkpoints")) as a:
    with checkpoint_lib.Checkpointer(os.path.join(one_dir, "checkpoints")) as b:
      for step in (1, 2):
        assert a.restore_data_position(step) == {"next_index": 2 * step}
        assert b.restore_data_position(step) == {"next_index": 2 * step}
  two, one = _saved_state(two_dir, 2), _saved_state(one_dir, 2)
  _assert_close_trees(two["params"], one["params"], 1e-5, 1e-6)
  _assert_close_metrics(two_dir, one_dir, 1e-4, 1e-6)
  assert _report(two_dir) == _report(one_dir)


def test_process_0_and_a_one_process_run_take_the_same_lock(
    tmp_path, monkeypatch
):
  # A one-process main.py on a workdir that a launcher run is using must be
  # refused: process 0 locks '.lock', as a one-process run does; the other
  # processes lock '.lock.<i>'. Here another process holds '.lock' (as a
  # running one-process main.py would) and process 0's lock is refused.
  import jax  # noqa: PLC0415

  from agentic_rl import validation  # noqa: PLC0415
  from agentic_rl import workdir_lock  # noqa: PLC0415

  holder = subprocess.Popen(
      [
          sys.executable,
          "-c",
          "import fcntl, os, sys, time\n"
          "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)\n"
          "fcntl.flock(fd, fcntl.LOCK_EX)\n"
          "os.write(fd, str(os.getpid()).encode())\n"
          "print('held', flush=True)\n"
          "time.sleep(60)\n",
          str(tmp_path / ".lock"),
      ],
      stdout=subprocess.PIPE,
      text=True,
  )
  try:
    assert holder.stdout.readline().strip() == "held"
    monkeypatch.setattr(jax, "process_index", lambda: 0)
    with pytest.raises(validation.ConfigError, match="in use by another run"):
      with workdir_lock.workdir_lock(str(tmp_path)):
        pass
    monkeypatch.setattr(jax, "process_index", lambda: 1)
    with workdir_lock.workdir_lock(str(tmp_path)) as path:
      assert os.path.basename(path) == ".lock.1"
  finally:
    holder.kill()
    holder.wait()
