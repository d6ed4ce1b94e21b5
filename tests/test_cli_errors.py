"""The mistakes a new user makes end in one line on stderr, exit code 2.

Each case runs `python main.py ...` as a user would; every error here is raised
before any training step is compiled (the cost is Python's imports).
"""

import os
import subprocess
import sys

import pytest

from agentic_rl import workdir_lock

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _main(*args, timeout=300):
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONWARNINGS": "ignore"}
  return subprocess.run(
      [sys.executable, "main.py", *args, "--compilation_cache="],
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=timeout,
      env=env,
  )


def _one_line(result):
  lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
  assert result.returncode == 2, (result.returncode, result.stderr[-3000:])
  assert len(lines) == 1, result.stderr[-3000:]
  assert lines[0].startswith("error: ")
  return lines[0]


CASES = [
    # (argv, texts the one line must contain)
    (
        ["--config.rl.grup_size=4"],
        [
            "--config.rl.grup_size",
            "no field 'grup_size'",
            "did you mean --config.rl.group_size?",
        ],
    ),
    (
        ["--config=configs/default.py:smoke", "--config.rl.grup_size=4"],
        ["did you mean --config.rl.group_size?"],
    ),
    (
        ["--config.rl.rewards.otc=1.0"],
        [
            "config.rl.rewards has no field 'otc'",
            "fork a config file",
            "set config.rl.rewards.otc = ... there",
            "--config=configs/my_experiment.py",
        ],
    ),
    (
        ["--config=configs/defualt.py"],
        [
            "config file 'configs/defualt.py' does not exist",
            "did you mean --config=configs/default.py?",
        ],
    ),
    (
        ["--config=configs/no_such_experiment.py"],
        ["does not exist", "pass one of configs/*.py"],
    ),
    (
        ["--config=configs/default.py:smok"],
        ["unknown arg 'smok'; known: 'smoke'"],
    ),
    (["--config.rl.group_size=abc"], ["--config.rl.group_size=abc"]),
    (["--config.rl.steps.x=1"], ["config.rl.steps is a value (60)"]),
    (["stray_argument"], ["unexpected arguments ['stray_argument']"]),
]


@pytest.mark.parametrize(
    "argv,texts", CASES, ids=[" ".join(c[0]) for c in CASES]
)
def test_flag_mistakes_are_one_line(tmp_path, argv, texts):
  line = _one_line(_main(*argv, f"--workdir={tmp_path / 'run'}"))
  for text in texts:
    assert text in line, line
  assert not (tmp_path / "run").exists()


def test_workdir_that_is_a_file(tmp_path):
  path = tmp_path / "notes.txt"
  path.write_text("x")
  line = _one_line(
      _main("--config=configs/default.py:smoke", f"--workdir={path}")
  )
  assert f"workdir {path} is a file, not a folder" in line


def test_workdir_under_a_file(tmp_path):
  path = tmp_path / "notes.txt"
  path.write_text("x")
  line = _one_line(
      _main("--config=configs/default.py:smoke", f"--workdir={path}/run")
  )
  assert "is not writable (a parent of it is a file)" in line


def test_read_only_workdir(tmp_path):
  ro = tmp_path / "ro"
  ro.mkdir()
  mounted = (
      os.geteuid() == 0
      and subprocess.run(
          ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)],
          capture_output=True,
      ).returncode
      == 0
  )
  if not mounted:
    if os.geteuid() == 0:
      pytest.skip("root ignores permissions and mount failed")
    ro.chmod(0o555)
  try:
    line = _one_line(
        _main("--config=configs/default.py:smoke", f"--workdir={ro}/run")
    )
  finally:
    if mounted:
      subprocess.run(["umount", str(ro)], check=False)
  assert f"workdir {ro}/run is not writable" in line
  assert not os.path.exists(ro / "run")
  assert "pass a --workdir you can write to" in line


@pytest.mark.parametrize(
    "flag,text",
    [
        (
            "--config.rl.warmup_steps=-5",
            "config.rl.warmup_steps=-5: must be >= 0",
        ),
        (
            "--config.model.vocab_size=200",
            "config.model.vocab_size=200: smaller than the byte tokenizer's 265 ids",
        ),
    ],
)
def test_invalid_values_are_one_line(tmp_path, flag, text):
  line = _one_line(
      _main(
          "--config=configs/default.py:smoke",
          flag,
          f"--workdir={tmp_path / 'run'}",
      )
  )
  assert text in line
  assert not (tmp_path / "run").exists()  # refused before any work


def test_unknown_field_in_a_forked_config_file(tmp_path):
  fork = tmp_path / "my_fork.py"
  fork.write_text(
      "from configs import default\n\n\ndef get_config(arg=None):\n"
      "  config = default.get_config('smoke')\n"
      "  config.rl.top_p = 0.9\n  config.rl.grup_size = 4\n"
      "  return config\n"
  )
  line = _one_line(_main(f"--config={fork}", f"--workdir={tmp_path / 'run'}"))
  assert line == (
      "error: config.rl.grup_size=4: unknown field (nothing reads it); "
      "did you mean config.rl.group_size? (also unknown: config.rl.top_p)"
  )
  assert not (tmp_path / "run").exists()


def test_wrong_type_in_a_forked_config_file(tmp_path):
  fork = tmp_path / "my_fork.py"
  fork.write_text(
      "import ml_collections\nfrom configs import default\n\n\n"
      "def get_config(arg=None):\n"
      "  config = default.get_config('smoke')\n"
      "  config.rl = ml_collections.ConfigDict(\n"
      "      dict(config.rl.to_dict(), value_clip='0.2'))\n"
      "  return config\n"
  )
  line = _one_line(_main(f"--config={fork}", f"--workdir={tmp_path / 'run'}"))
  assert line == (
      "error: config.rl.value_clip='0.2': must be a float, not str "
      "(default 0.2, configs/default.py)"
  )
  assert not (tmp_path / "run").exists()


def test_help_exits_0_without_importing_torch():
  # -X importtime lists every module imported at start-up on stderr.
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONWARNINGS": "ignore"}
  result = subprocess.run(
      [sys.executable, "-X", "importtime", "main.py", "--help"],
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=300,
      env=env,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  assert "--workdir" in result.stdout
  modules = [
      ln.rsplit("|", 1)[-1].strip()
      for ln in result.stderr.splitlines()
      if ln.startswith("import time:")
  ]
  assert "jax" in modules  # the listing is real
  assert [m for m in modules if m == "torch" or m.startswith("torch.")] == []


def test_second_run_on_a_locked_workdir_is_refused(tmp_path):
  workdir = str(tmp_path / "run")
  with workdir_lock.workdir_lock(workdir):  # this process plays the first run
    line = _one_line(
        _main("--config=configs/default.py:smoke", f"--workdir={workdir}")
    )
  assert (
      f"workdir {workdir} is in use by another run (pid {os.getpid()}" in line
  )
  assert "pass a different --workdir" in line
  assert os.listdir(workdir) == [".lock"]  # the refused run wrote nothing


@pytest.mark.slow
def test_full_disk_during_training_is_one_line(tmp_path):
  """A 4 MiB disk (tmpfs, needs root): the smoke run's first checkpoint
  (step 5, ~8 MiB) does not fit; the run stops at that step with one line."""
  disk = tmp_path / "disk"
  disk.mkdir()
  if (
      os.geteuid() != 0
      or subprocess.run(
          ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)],
          capture_output=True,
      ).returncode
      != 0
  ):
    pytest.skip("mounting a tmpfs needs root")
  try:
    workdir = disk / "run"
    result = _main(
        "--config=configs/default.py:smoke", f"--workdir={workdir}", timeout=900
    )
    # stderr also holds the run's progress bar and INFO log lines.
    assert result.returncode == 2 and "Traceback" not in result.stderr
    errors = [ln for ln in result.stderr.splitlines() if "error" in ln.lower()]
    assert len(errors) == 1, result.stderr[-3000:]
    ckpt = workdir / "checkpoints"
    assert errors[0].startswith(
        f"error: checkpoint step 5: no space left on device in {ckpt} ("
    )
    assert "free of 4.0 MiB when the write failed" in errors[0]
    assert not [n for n in os.listdir(ckpt) if "orbax-checkpoint-tmp" in n]
    assert not (ckpt / "5").exists()
  finally:
    subprocess.run(["umount", str(disk)], check=False)
