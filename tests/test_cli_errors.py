"""The mistakes a new user makes end in one line on stderr, exit code 2.

Every error here is raised before any training step is compiled; the cost of a
case is Python's imports. Two tests start `python main.py ...` as a user would
(`--help`, and a second run on a locked workdir, which imports what main()
imports). The other cases run `main.py` in one driver process (`_RUN_CASES`):
it imports what `python main.py` imports before those errors (absl,
ml_collections, the default config's modules, then main()'s), and runs each
case in a fork of itself, `main.py` executed as `__main__` with the case's
argv, stdout and stderr on files and the exit status as the process's, so each
case starts from the same fresh state as its own `python main.py` (no flag
defined, no config loaded) and the assertions read the same three things. The
driver's own stderr must stay empty: nothing those imports print is hidden.
"""

import json
import os
import subprocess
import sys

import pytest

from agentic_rl import workdir_lock

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _env():
  # AGENTIC_RL_JEMALLOC=0: one process per run, no allocator notice on a
  # machine without jemalloc (the re-exec is tested in test_host_memory).
  return {
      **os.environ,
      "JAX_PLATFORMS": "cpu",
      "PYTHONWARNINGS": "ignore",
      "AGENTIC_RL_JEMALLOC": "0",
  }


def _main(*args, timeout=300):
  return subprocess.run(
      [sys.executable, "main.py", *args, "--compilation_cache="],
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=timeout,
      env=_env(),
  )


# argv: the JSON list of cases (each an argv list), the JSON file to write the
# results to. Falls back to one `python main.py` per case where the imports
# started an XLA backend (its threads make fork unsafe).
_RUN_CASES = r"""
import importlib, json, os, runpy, signal, subprocess, sys

cases = json.load(open(sys.argv[1]))
for name in (
    # main.py's imports, then the default config's (configs/common.py) ...
    "absl.app", "absl.flags", "absl.logging", "ml_collections.config_dict",
    "ml_collections.config_flags", "configs.default",
    # ... then main()'s, in its order.
    "jax", "agentic_rl.checkpoint", "agentic_rl.validation",
    "agentic_rl.workdir_lock", "configs.schema",
):
  importlib.import_module(name)
from jax._src import xla_bridge
fork = not xla_bridge.backends_are_initialized()


def child(argv, out, err):
  code = 70
  try:
    signal.alarm(300)  # a hung case ends (SIGALRM) instead of the driver
    os.dup2(os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 1)
    os.dup2(os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
    sys.argv = ["main.py", *argv]
    try:
      runpy.run_path("main.py", run_name="__main__")
      code = 0
    except SystemExit as e:  # as the interpreter treats an uncaught one
      if e.code is None:
        code = 0
      elif isinstance(e.code, int):
        code = e.code
      else:
        print(e.code, file=sys.stderr)
        code = 1
    except BaseException:  # pylint: disable=broad-except
      sys.excepthook(*sys.exc_info())
      code = 1
    sys.stdout.flush()
    sys.stderr.flush()
  finally:
    os._exit(code)


results = []
for i, argv in enumerate(cases):
  argv = [*argv, "--compilation_cache="]
  if fork:
    out, err = f"{sys.argv[2]}.{i}.out", f"{sys.argv[2]}.{i}.err"
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
      child(argv, out, err)
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    with open(out) as f_out, open(err) as f_err:
      results.append(dict(returncode=code, stdout=f_out.read(),
                          stderr=f_err.read()))
  else:
    r = subprocess.run([sys.executable, "main.py", *argv],
                       capture_output=True, text=True, timeout=300)
    results.append(dict(returncode=r.returncode, stdout=r.stdout,
                        stderr=r.stderr))
with open(sys.argv[2], "w") as f:
  json.dump(results, f)
"""


class _Result:
  """What the assertions read of a finished `main.py` (subprocess.run's)."""

  def __init__(self, returncode, stdout, stderr):
    self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def _run_cases(cases, folder):
  """Runs `main.py` once per argv of `cases` (_RUN_CASES): a _Result each."""
  cases_path = os.path.join(folder, "cases.json")
  results_path = os.path.join(folder, "results.json")
  with open(cases_path, "w") as f:
    json.dump([list(map(str, argv)) for argv in cases], f)
  driver = subprocess.run(
      [sys.executable, "-c", _RUN_CASES, cases_path, results_path],
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=900,
      env=_env(),
  )
  assert driver.returncode == 0, driver.stderr[-3000:]
  assert driver.stderr == "", driver.stderr[-3000:]
  with open(results_path) as f:
    return [_Result(**r) for r in json.load(f)]


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

INVALID_VALUES = [
    (
        "--config.rl.warmup_steps=-5",
        "config.rl.warmup_steps=-5: must be >= 0",
    ),
    (
        "--config.model.vocab_size=200",
        "config.model.vocab_size=200: smaller than the byte tokenizer's 265 ids",
    ),
    (
        "--config.mesh.cpu_devices=-1",
        "config.mesh.cpu_devices=-1: must be an integer >= 0 (0 = automatic)",
    ),
    (
        "--config.mesh.cpu_devices=3",
        "config.mesh.cpu_devices=3: must divide rl.batch_size=16 (each batch "
        "is split over the devices)",
    ),
]

_UNKNOWN_FIELD_FORK = (
    "from configs import default\n\n\ndef get_config(arg=None):\n"
    "  config = default.get_config('smoke')\n"
    "  config.rl.top_p = 0.9\n  config.rl.grup_size = 4\n"
    "  return config\n"
)

_WRONG_TYPE_FORK = (
    "import ml_collections\nfrom configs import default\n\n\n"
    "def get_config(arg=None):\n"
    "  config = default.get_config('smoke')\n"
    "  config.rl = ml_collections.ConfigDict(\n"
    "      dict(config.rl.to_dict(), value_clip='0.2'))\n"
    "  return config\n"
)


def _read_only_dir(ro):
  """Makes the folder `ro` read-only: 'mounted' (a read-only tmpfs, as root),
  'chmod' (mode 555, not root) or 'skip' (root, and the mount failed)."""
  ro.mkdir()
  mounted = (
      os.geteuid() == 0
      and subprocess.run(
          ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)],
          capture_output=True,
      ).returncode
      == 0
  )
  if mounted:
    return "mounted"
  if os.geteuid() == 0:
    return "skip"
  ro.chmod(0o555)
  return "chmod"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """{case name: (its folder, its _Result)} of every case but --help and the
  locked workdir, run by one _run_cases."""
  base = tmp_path_factory.mktemp("cli")
  folders, cases = {}, {}

  def case(name, *argv):
    # The folder exists (as tmp_path does), its files are the case's own.
    folders[name] = base / name
    cases[name] = argv

  smoke = "--config=configs/default.py:smoke"
  for name in (
      *(f"flag{i}" for i in range(len(CASES))),
      "file",
      "under",
      *(f"invalid{i}" for i in range(len(INVALID_VALUES))),
      "unknown_field",
      "wrong_type",
  ):
    (base / name).mkdir()
  for i, (argv, _) in enumerate(CASES):
    case(f"flag{i}", *argv, f"--workdir={base / f'flag{i}' / 'run'}")
  for name in ("file", "under"):
    (base / name / "notes.txt").write_text("x")
  case("file", smoke, f"--workdir={base / 'file' / 'notes.txt'}")
  case("under", smoke, f"--workdir={base / 'under' / 'notes.txt'}/run")
  ro = base / "ro"
  ro_mode = _read_only_dir(ro)
  if ro_mode != "skip":
    case("ro", smoke, f"--workdir={ro}/run")
  for i, (flag, _) in enumerate(INVALID_VALUES):
    case(
        f"invalid{i}", smoke, flag, f"--workdir={base / f'invalid{i}' / 'run'}"
    )
  for name, text in (
      ("unknown_field", _UNKNOWN_FIELD_FORK),
      ("wrong_type", _WRONG_TYPE_FORK),
  ):
    (base / name / "my_fork.py").write_text(text)
    case(
        name,
        f"--config={base / name / 'my_fork.py'}",
        f"--workdir={base / name / 'run'}",
    )
  try:
    results = _run_cases(list(cases.values()), str(base))
  finally:
    if ro_mode == "mounted":
      subprocess.run(["umount", str(ro)], check=False)
  out = {
      name: (folders[name], result)
      for name, result in zip(cases, results, strict=True)
  }
  out["ro_mode"] = ro_mode
  return out


@pytest.mark.parametrize(
    "i,texts",
    [(i, texts) for i, (_, texts) in enumerate(CASES)],
    ids=[" ".join(c[0]) for c in CASES],
)
def test_flag_mistakes_are_one_line(runs, i, texts):
  folder, result = runs[f"flag{i}"]
  line = _one_line(result)
  for text in texts:
    assert text in line, line
  assert not (folder / "run").exists()


def test_workdir_that_is_a_file(runs):
  folder, result = runs["file"]
  line = _one_line(result)
  assert f"workdir {folder / 'notes.txt'} is a file, not a folder" in line


def test_workdir_under_a_file(runs):
  _, result = runs["under"]
  line = _one_line(result)
  assert "is not writable (a parent of it is a file)" in line


def test_read_only_workdir(runs):
  if runs["ro_mode"] == "skip":
    pytest.skip("root ignores permissions and mount failed")
  ro, result = runs["ro"]
  line = _one_line(result)
  assert f"workdir {ro}/run is not writable" in line
  assert not os.path.exists(ro / "run")
  assert "pass a --workdir you can write to" in line


@pytest.mark.parametrize(
    "i,text", [(i, text) for i, (_, text) in enumerate(INVALID_VALUES)]
)
def test_invalid_values_are_one_line(runs, i, text):
  folder, result = runs[f"invalid{i}"]
  line = _one_line(result)
  assert text in line
  assert not (folder / "run").exists()  # refused before any work


def test_unknown_field_in_a_forked_config_file(runs):
  folder, result = runs["unknown_field"]
  line = _one_line(result)
  assert line == (
      "error: config.rl.grup_size=4: unknown field (nothing reads it); "
      "did you mean config.rl.group_size? (also unknown: config.rl.top_p)"
  )
  assert not (folder / "run").exists()


def test_wrong_type_in_a_forked_config_file(runs):
  folder, result = runs["wrong_type"]
  line = _one_line(result)
  assert line == (
      "error: config.rl.value_clip='0.2': must be a float, not str "
      "(default 0.2, configs/default.py)"
  )
  assert not (folder / "run").exists()


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
