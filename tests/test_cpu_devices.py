"""`python main.py` splits a CPU process into two XLA devices by itself.

`sharding.cpu_device_count` (unit cases in test_sharding.py) picks the count;
main.py applies it before the backend starts. Here two real smoke runs of
`main.py`, the automatic setting and `--config.mesh.cpu_devices=1`: the first
logs a (data 2) mesh over two CPU devices and why, the second one device, and
their SFT losses agree step by step (the same batches; only the order of the
sums across devices differs: about 1e-7 relative here). The RL steps are
compared only for having run: the sampler draws from logits that differ in
the last bits, so a token (and a reward, by 1/16) may differ.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _main(workdir, *extra, config="configs/default.py:smoke", env=None):
  """`python main.py --config=CONFIG --workdir=WORKDIR EXTRA...` on the CPU,
  with `env` over os.environ; the finished process.

  The tests' own XLA_FLAGS carry no device count, but a caller's might: it
  would be left as set (the case the unit tests cover), so it is dropped.
  """
  flags = os.environ.get("XLA_FLAGS", "").split()
  base = dict(
      os.environ,
      JAX_PLATFORMS="cpu",
      XLA_FLAGS=" ".join(
          f for f in flags if "xla_force_host_platform_device_count" not in f
      ),
  )
  return subprocess.run(
      [
          sys.executable,
          os.path.join(REPO, "main.py"),
          "--config=" + os.path.join(REPO, config),
          f"--workdir={workdir}",
          *extra,
      ],
      cwd=REPO,
      capture_output=True,
      text=True,
      env={**base, **(env or {})},
      timeout=900,
  )


def _run(workdir, *extra):
  result = _main(workdir, *extra)
  assert result.returncode == 0, result.stderr[-3000:]
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  return result.stderr, rows


@pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPU cores"
)
def test_main_runs_on_two_cpu_devices_and_matches_one(tmp_path):
  log2, rows2 = _run(tmp_path / "auto")
  log1, rows1 = _run(tmp_path / "one", "--config.mesh.cpu_devices=1")
  assert (
      "mesh: data 2, fsdp 1, tensor 1 over 2 cpu devices (automatic: one per "
      "core for the decode; --config.mesh.cpu_devices=N sets the count)"
  ) in log2
  assert (
      "mesh: data 1, fsdp 1, tensor 1 over 1 cpu device (set by "
      "mesh.cpu_devices)\n"
  ) in log1
  assert [r["step"] for r in rows2] == [r["step"] for r in rows1]
  sft2 = [r["sft/loss"] for r in rows2 if r["phase"] == "sft"]
  sft1 = [r["sft/loss"] for r in rows1 if r["phase"] == "sft"]
  assert len(sft2) == 10
  np.testing.assert_allclose(sft2, sft1, rtol=1e-5)
  rl2 = [r["rl/loss"] for r in rows2 if r["phase"] == "rl"]
  assert len(rl2) == 4 and np.isfinite(rl2).all()


def test_reward_model_mode_refuses_a_device_count(tmp_path):
  # Reward-model training keeps the devices as set: a count is one line.
  result = _main(
      tmp_path / "rm",
      "--config.mesh.cpu_devices=2",
      config="configs/rm_arithmetic.py:smoke",
  )
  assert result.returncode == 2, result.stderr[-2000:]
  assert result.stderr.strip().splitlines() == [
      "error: config.mesh.cpu_devices=2: reward-model training (mode 'rm') "
      "runs on the devices as the environment sets them; leave it 0"
  ]
  assert not (tmp_path / "rm").exists()


@pytest.mark.parametrize(
    "env,line",
    [
        (
            {"JAX_NUM_CPU_DEVICES": "abc"},
            "error: JAX_NUM_CPU_DEVICES='abc': must be an integer >= 1 (or "
            "unset: main.py picks the count)",
        ),
        (
            {"XLA_FLAGS": "--xla_force_host_platform_device_count=0"},
            "error: XLA_FLAGS: --xla_force_host_platform_device_count=0 must "
            "be an integer >= 1",
        ),
    ],
)
def test_a_bad_count_in_the_environment_is_one_line(tmp_path, env, line):
  result = _main(tmp_path / "run", env=env)
  assert result.returncode == 2, result.stderr[-2000:]
  assert result.stderr.strip().splitlines() == [line]
  assert not (tmp_path / "run").exists()
