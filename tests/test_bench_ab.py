"""experiments/bench_ab.py and its helpers (bench_args.py): value parsing, config paths, the paired summary
(by hand) and one tiny end-to-end run."""

import os
import subprocess
import sys

from absl import app
import ml_collections
import pytest

from experiments import bench_args

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_parse_values():
  assert bench_args.parse_values("1|4") == [1, 4]
  assert bench_args.parse_values("False | True") == [False, True]
  assert bench_args.parse_values("'a'|(1, 2)") == ["a", (1, 2)]
  with pytest.raises(app.UsageError, match="not a Python literal"):
    bench_args.parse_values("1|x y")


def test_set_config_path():
  c = ml_collections.ConfigDict({"rl": {"num_microbatches": 1}})
  bench_args.set_config_path(c, "rl.num_microbatches", 4)
  assert c.rl.num_microbatches == 4
  with pytest.raises(app.UsageError, match="no field 'nope'"):
    bench_args.set_config_path(c, "rl.nope", 1)
  with pytest.raises(app.UsageError, match="no field 'x'"):
    bench_args.set_config_path(c, "x.y", 1)
  with pytest.raises(app.UsageError, match="a group of fields"):
    bench_args.set_config_path(c, "rl", 1)
  with pytest.raises(app.UsageError, match="cannot be casted"):
    bench_args.set_config_path(c, "rl.num_microbatches", "a")
  assert c.rl.num_microbatches == 4  # unchanged by the refused values


def test_paired_summary_by_hand():
  # differences 0.1, -0.1, 0.3: median 0.1, mean 0.1, sd 0.2
  s = bench_args.paired_summary([1.0, 1.0, 1.0], [1.1, 0.9, 1.3])
  assert s["median"] == pytest.approx(0.1)
  assert s["mean"] == pytest.approx(0.1)
  assert s["sd"] == pytest.approx(0.2)
  assert s["ratio"] == pytest.approx(1.1)


def _run(*args):
  return subprocess.run(
      [
          sys.executable,
          os.path.join(REPO, "experiments", "bench_ab.py"),
          *args,
      ],
      capture_output=True,
      text=True,
      check=False,
  )


def test_bad_target_refused_before_work():
  p = _run("--tiny", "--target=config:rl.nope", "--values=1")
  assert p.returncode == 2
  # One line, not absl's usage text (the module docstring) above it.
  assert p.stderr.strip().splitlines()[-1] == (
      "bench_ab.py: error: --target=config:rl.nope: no field 'nope'"
  )
  assert "In-process A/B" not in p.stderr
  p = _run("--tiny", "--target=agentic_rl.learner.update.NOPE", "--values=1")
  assert p.returncode != 0 and "has no NOPE" in p.stderr
  p = _run("--tiny", "--target=no_such_module.X", "--values=1")
  assert p.returncode != 0 and "No module named 'no_such_module'" in p.stderr
  assert "Traceback" not in p.stderr


def test_value_the_program_rejects_is_refused_before_compiling():
  """3 micro-batches of the tiny workload's 8 episodes: refused when the
  variants are traced (jax.eval_shape), before any variant is compiled."""
  p = _run("--tiny", "--target=config:rl.num_microbatches", "--values=1|3")
  assert p.returncode != 0
  assert "value 3: split_rows: n=3 must be >= 1 and divide" in p.stderr
  assert "Traceback" not in p.stderr and "median" not in p.stdout


@pytest.mark.slow
def test_tiny_ab_run():
  """Two variants of the tiny workload end to end (about half a minute)."""
  p = _run(
      "--tiny",
      "--target=config:rl.num_microbatches",
      "--values=1|2",
      "--iters=2",
      "--warmup=1",
  )
  assert p.returncode == 0, p.stderr[-2000:]
  assert "1: median" in p.stdout and "2: median" in p.stdout
  assert "paired (second - first)" in p.stdout
