"""A learned reward model inside RL: the `rm` reward component, the RM as a PBRS
potential, the over-optimisation monitor, loading/validation of an rm workdir, and
the rm mode's no-op re-run (not taken past a damaged final checkpoint)."""

import json
import logging
import math
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from agentic_rl import checkpoint as checkpoint_lib
from agentic_rl import learner
from agentic_rl import metrics as metrics_lib
from agentic_rl.reward_models import frozen as rm_frozen
from agentic_rl.reward_models import model as rm_model
from agentic_rl.reward_models import training as rm_training
from agentic_rl.rewards import components
from agentic_rl.rewards import factory
from agentic_rl import reward_model_loader
from agentic_rl import rm_train
from agentic_rl import train
from agentic_rl import types
from agentic_rl import validation
from configs import default
from configs import rm_arithmetic
from configs import rm_grpo
from tests import fakes

TINY = dict(
    vocab_size=265,
    d_model=16,
    num_layers=1,
    num_heads=2,
    head_dim=8,
    ffn_dim=32,
)


def _rm_config():
  config = fakes.shrink(
      rm_arithmetic.get_config("smoke"), sft_steps=0, model=TINY
  )
  config.rm.steps = 2
  return config


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory):
  """A finished rm-mode workdir, laid out as rm_train writes it (config.json and
  the whole state at the final step), with both RMs trained 2 steps on toy pairs.
  """
  workdir = str(tmp_path_factory.mktemp("rm"))
  config = _rm_config()
  with open(os.path.join(workdir, "config.json"), "w") as f:
    f.write(config.to_json_best_effort(indent=2))
  model_cfg = reward_model_loader.model_config(config)
  _, rgraph, state = reward_model_loader.init_rm_state(config, model_cfg)
  tx = learner.make_optimizer(config.rm)
  batch = fakes.toy_pairs(k=3)
  for name, kind in (("orm", "outcome"), ("prm", "process")):
    step = rm_training.make_train_step(rgraph, tx, kind=kind)
    for _ in range(config.rm.steps):
      params, opt, _ = step(state[name], state[f"{name}_opt"], batch)
      state = dict(state, **{name: params, f"{name}_opt": opt})
  total = config.sft.steps + 2 * config.rm.steps
  state["step"] = jnp.int32(total)
  with checkpoint_lib.Checkpointer(os.path.join(workdir, "checkpoints")) as ck:
    ck.save(total, state, force=True)
  return workdir, rgraph, state


def _traj():
  """Two hand-made episodes: 2 turns (call + obs, answer) and 1 turn."""
  tokens = jnp.array(
      [
          [257, 72, 105, 33, 258, 40, 41, 259, 60, 0],
          [257, 50, 51, 52, 53, 0, 0, 0, 0, 0],
      ],
      jnp.int32,
  )
  role = jnp.array(
      [[1, 1, 2, 2, 2, 3, 3, 2, 2, 0], [1, 1, 2, 2, 2, 0, 0, 0, 0, 0]], jnp.int8
  )
  turn = jnp.array(
      [
          [-1, -1, 0, 0, 0, 0, 0, 1, 1, -1],
          [-1, -1, 0, 0, 0, -1, -1, -1, -1, -1],
      ],
      jnp.int32,
  )
  return fakes.trajectory(
      {"correct": jnp.array([True, False])},
      tokens=tokens,
      role=role,
      turn=turn,
      length=[9, 5],
      num_turns=[2, 1],
  )


@pytest.mark.parametrize("kind", ["outcome", "process"])
def test_trajectory_rm_outputs_match_independent_scoring(rm_dir, kind):
  """One pass gives the episode score and the potentials; each equals scoring the
  prefix s_k on its own (outcome) or the PRM formula on boundary logits."""
  _, rgraph, state = rm_dir
  params = state["orm" if kind == "outcome" else "prm"]
  traj = _traj()
  spec = rm_frozen.FrozenRewardModel(rgraph, kind, "log_prod")
  out = jax.jit(
      lambda p: rm_frozen.trajectory_rm_outputs(
          spec, p, traj.tokens, traj.role, traj.turn, 3
      )
  )(params)
  assert out["score"].shape == (2,) and out["potential"].shape == (2, 4)
  mask = traj.role != types.PAD
  # End of s_k (prompt + turns < k): row 0 -> 2, 7, 9, 9 tokens; row 1 -> 2, 5, 5, 5.
  ends = [[2, 7, 9, 9], [2, 5, 5, 5]]
  if kind == "outcome":
    # The full episodes, then each prefix s_k scored on its own (everything after
    # it masked out as padding), all in one batch.
    rows = np.concatenate([np.arange(2), np.repeat(np.arange(2), 4)])
    lens = np.concatenate([[9, 5], np.asarray(ends).reshape(-1)])
    got = jax.jit(lambda p, t, m: rm_model.outcome_scores(rgraph, p, t, m))(
        params, traj.tokens[rows], jnp.arange(10)[None, :] < lens[:, None]
    )
    np.testing.assert_allclose(out["score"], got[:2], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        out["potential"],
        jax.nn.sigmoid(got[2:]).reshape(2, 4),
        rtol=1e-5,
        atol=1e-6,
    )
  else:
    boundary, tmask = jax.jit(rm_model.turn_boundaries, static_argnums=1)(
        traj.turn, 3
    )
    s = np.asarray(
        jax.jit(
            lambda p, t, m, b: rm_model.boundary_logits(rgraph, p, t, m, b)
        )(params, traj.tokens, mask, boundary)
    )
    sig = 1 / (1 + np.exp(-s.astype(np.float64)))
    p0 = sig[0, 0] * sig[0, 1]  # two turns
    p1 = sig[1, 0]  # one turn
    np.testing.assert_allclose(
        out["score"],
        [math.log(p0 / (1 - p0)), math.log(p1 / (1 - p1))],
        rtol=1e-4,
        atol=2e-6,
    )
    np.testing.assert_allclose(
        out["potential"][0], [1.0, sig[0, 0], p0, p0], rtol=1e-5
    )
    np.testing.assert_allclose(
        out["potential"][1], [1.0, p1, p1, p1], rtol=1e-5
    )
    # Per-turn step scores (rl.step_reward='prm'): sigmoid(s_k) on the turns
    # that happened, 0 after.
    np.testing.assert_allclose(
        out["step_score"],
        [[sig[0, 0], sig[0, 1], 0.0], [sig[1, 0], 0.0, 0.0]],
        rtol=1e-5,
        atol=1e-7,
    )
    spec_min = rm_frozen.FrozenRewardModel(rgraph, kind, "min")
    out_min = jax.jit(
        lambda p: rm_frozen.trajectory_rm_outputs(
            spec_min, p, traj.tokens, traj.role, traj.turn, 3
        )
    )(params)
    m0 = min(sig[0, 0], sig[0, 1])
    np.testing.assert_allclose(
        out_min["score"][0], math.log(m0 / (1 - m0)), rtol=1e-4, atol=2e-6
    )
    np.testing.assert_allclose(
        out_min["potential"][0], [1.0, sig[0, 0], m0, m0], rtol=1e-5
    )
    assert (
        abs(s[0, 0] - s[0, 1]) > 1e-4
    )  # distinct logits: the test can tell them apart


def test_rm_reward_component_transforms_hand_values():
  traj = _traj().replace(
      facts={
          "correct": jnp.array([True, False]),
          "rm_score": jnp.array([2.0, -1.0]),
      }
  )
  np.testing.assert_allclose(
      components.rm_reward(traj),
      [1 / (1 + math.exp(-2)), 1 / (1 + math.e)],
      rtol=1e-6,
  )
  np.testing.assert_allclose(
      components.rm_reward(traj, transform="sigmoid", ref=1.0, temperature=2.0),
      [1 / (1 + math.exp(-0.5)), 1 / (1 + math.e)],
      rtol=1e-6,
  )
  np.testing.assert_allclose(
      components.rm_reward(traj, transform="tanh"),
      [math.tanh(2.0), math.tanh(-1.0)],
      rtol=1e-6,
  )
  # clip: min(s - eta, 0) with eta = 0.5 -> [0, -1.5].
  np.testing.assert_allclose(
      components.rm_reward(traj, transform="clip", eta=0.5), [0.0, -1.5]
  )
  np.testing.assert_allclose(
      components.rm_reward(traj, transform="none"), [2.0, -1.0]
  )
  fn = factory.make_reward_fn(
      {"rm": 1.0, "correct": 0.5},
      params={"rm": {"transform": "clip", "eta": 0.5}},
  )
  total, parts = fn(traj)
  np.testing.assert_allclose(total, [0.5, -1.5])
  np.testing.assert_allclose(parts["rm"], [0.0, -1.5])
  with pytest.raises(ValueError, match="transform"):
    factory.make_reward_fn({"rm": 1.0}, params={"rm": {"transform": "exp"}})
  with pytest.raises(ValueError, match="temperature"):
    factory.make_reward_fn({"rm": 1.0}, params={"rm": {"temperature": 0.0}})


def test_monitor_metrics_hand_values():
  # r = [.9, .8, .2, .6], v = [1, 0, 0, 0]: means .625 / .25, gap .375;
  # centred sums: cov .275, var_r .2875, var_v .75 -> corr .275 / sqrt(.215625).
  m = rm_frozen.monitor_metrics(
      jnp.array([0.9, 0.8, 0.2, 0.6]), jnp.array([1.0, 0.0, 0.0, 0.0])
  )
  np.testing.assert_allclose(m["rm_reward"], 0.625, rtol=1e-6)
  np.testing.assert_allclose(m["verified_reward"], 0.25)
  np.testing.assert_allclose(m["rm_gap"], 0.375, rtol=1e-6)
  np.testing.assert_allclose(
      m["rm_verified_corr"], 0.275 / math.sqrt(0.215625), rtol=1e-5
  )
  np.testing.assert_allclose(m["rm_false_positive_rate"], 2 / 3, rtol=1e-6)
  # Perfectly anti-correlated -> -1; a constant side -> 0 (not NaN).
  m = rm_frozen.monitor_metrics(jnp.array([0.0, 1.0]), jnp.array([1.0, 0.0]))
  np.testing.assert_allclose(m["rm_verified_corr"], -1.0, rtol=1e-6)
  m = rm_frozen.monitor_metrics(jnp.array([0.3, 0.3]), jnp.array([1.0, 0.0]))
  assert float(m["rm_verified_corr"]) == 0.0


def _rl_config(rm_workdir, kind="outcome", pbrs=False):
  config = rm_grpo.get_config("smoke,pbrs" if pbrs else "smoke")
  fakes.shrink(
      config,
      sft_steps=2,
      rl_steps=2,
      rl_batch=8,
      group_size=4,
      num_minibatches=1,
      eval_tasks=4,
      eval_samples=0,
      pass_k=(),
      model=TINY,
      log_every_steps=1,
  )
  config.rl.reward_model_dir = rm_workdir
  config.rl.reward_model_kind = kind
  return config


def test_rl_reward_model_validation_names_field(rm_dir, tmp_path):
  workdir = rm_dir[0]
  validation.validate_config(_rl_config(workdir))
  validation.validate_config(_rl_config(workdir, "process", pbrs=True))
  config = _rl_config(workdir)
  config.rl.reward_model_dir = ""
  with pytest.raises(
      ValueError, match=r"config.rl.reward_model_dir='': rl.rewards.rm"
  ):
    validation.validate_config(config)
  config = _rl_config(str(tmp_path / "missing"))
  with pytest.raises(
      ValueError, match=r"config.rl.reward_model_dir=.*not a directory"
  ):
    validation.validate_config(config)
  with pytest.raises(
      ValueError, match=r"config.rl.reward_model_dir=.*config.json"
  ):
    validation.validate_config(_rl_config(str(tmp_path)))
  policy_dir = tmp_path / "policy_run"
  policy_dir.mkdir()
  (policy_dir / "config.json").write_text(default.get_config("smoke").to_json())
  with pytest.raises(ValueError, match=r"reward_model_dir=.*'rl'-mode run"):
    validation.validate_config(_rl_config(str(policy_dir)))
  config = _rl_config(workdir)
  config.model.vocab_size = 300
  with pytest.raises(
      ValueError, match=r"reward_model_dir=.*vocab_size=265 differs.* 300"
  ):
    validation.validate_config(config)
  config = _rl_config(workdir)
  config.rl.reward_model_kind = "value"
  with pytest.raises(ValueError, match=r"config.rl.reward_model_kind='value'"):
    validation.validate_config(config)
  config = _rl_config(workdir)
  config.rl.pbrs_potential = "bogus"
  with pytest.raises(ValueError, match=r"config.rl.pbrs_potential='bogus'"):
    validation.validate_config(config)
  # A run whose process RM has not finished (config says 4 more RM steps).
  unfinished = tmp_path / "unfinished"
  unfinished.mkdir()
  rm_cfg = _rm_config()
  rm_cfg.rm.steps = 4
  (unfinished / "config.json").write_text(rm_cfg.to_json_best_effort())
  os.symlink(os.path.join(workdir, "checkpoints"), unfinished / "checkpoints")
  config = _rl_config(str(unfinished), "process")
  with pytest.raises(
      ValueError, match=r"reward_model_dir=.*no trained process RM"
  ):
    validation.validate_config(config)


@pytest.mark.parametrize("arg", [None, "pbrs", "smoke", "smoke,pbrs"])
def test_rm_grpo_config_files_validate(rm_dir, arg):
  config = rm_grpo.get_config(arg)
  config.model.update(TINY)
  config.rl.reward_model_dir = rm_dir[0]
  validation.validate_config(config)
  with pytest.raises(ValueError, match="unknown arg"):
    rm_grpo.get_config("pbrs,bogus")


def test_load_rl_reward_model_restores_the_frozen_params(rm_dir):
  workdir, _, state = rm_dir
  for kind, name in (("outcome", "orm"), ("process", "prm")):
    spec, params = reward_model_loader.load_rl_reward_model(
        _rl_config(workdir, kind)
    )
    assert spec.kind == kind and spec.aggregation == "log_prod"
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(state[name])):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _check_rl_run(config, workdir, rm_as_reward):
  reports = train.train_and_evaluate(config, workdir)
  assert "accuracy" in reports["rl"]
  rows = [
      r for r in metrics_lib.read_metrics(workdir) if r.get("phase") == "rl"
  ]
  assert [r["step"] for r in rows] == [3, 4]
  for r in rows:
    for key in (
        "rm_reward",
        "verified_reward",
        "rm_gap",
        "rm_verified_corr",
        "rm_false_positive_rate",
        "rm_score",
    ):
      assert np.isfinite(r[f"rl/{key}"]), key
    np.testing.assert_allclose(
        r["rl/rm_gap"], r["rl/rm_reward"] - r["rl/verified_reward"], atol=1e-6
    )
    np.testing.assert_allclose(
        r["rl/verified_reward"], r["rl/accuracy"], atol=1e-6
    )
    assert 0.0 < r["rl/rm_reward"] < 1.0
    if (
        rm_as_reward
    ):  # the monitored RM reward is the `rm` component that was used
      np.testing.assert_allclose(
          r["rl/rm_reward"], r["rl/reward_rm"], atol=1e-6
      )
  ck = checkpoint_lib.Checkpointer(os.path.join(workdir, "checkpoints"))
  assert ck.latest_step() == 4
  ck.close()


@pytest.mark.slow  # 20-60 s of training: slow tier keeps the default tier short
def test_rl_with_process_rm_as_reward_and_potential_end_to_end(
    rm_dir, tmp_path
):
  """SFT -> GRPO (per-turn credit) with the process RM both as the `rm` reward
  component and as the PBRS potential; the monitor is logged every iteration."""
  config = _rl_config(rm_dir[0], "process", pbrs=True)
  config.rl.rewards = ml_collections.ConfigDict(dict(rm=1.0, format=0.1))
  _check_rl_run(config, str(tmp_path / "rl"), rm_as_reward=True)


@pytest.mark.slow
def test_rl_with_prm_step_rewards_and_a_quantile_clip_end_to_end(
    rm_dir, tmp_path
):
  """Per-turn GRPO with the process RM's continuous per-turn scores as step
  rewards (`rl.step_reward='prm'`, answer turn scored), Clip with eta = the
  batch median: every logged step reward is <= 0 and finite."""
  config = _rl_config(rm_dir[0], "process")
  config.rl.rewards = ml_collections.ConfigDict(dict(rm=1.0, format=0.1))
  config.rl.credit = "per_turn"
  config.rl.step_reward = "prm"
  config.rl.step_reward_transform = "clip"
  config.rl.step_reward_coef = 0.5
  config.rl.step_reward_clip_quantile = 0.5
  _check_rl_run(config, str(tmp_path / "rl"), rm_as_reward=True)
  rows = [
      r
      for r in metrics_lib.read_metrics(str(tmp_path / "rl"))
      if r.get("phase") == "rl"
  ]
  for r in rows:
    assert np.isfinite(r["rl/step_reward"]) and r["rl/step_reward"] <= 0.0
    # The batch's threshold: a median of sigmoid scores, in (0, 1).
    assert 0.0 < r["rl/step_reward_clip_eta"] < 1.0
  # The median threshold leaves about half the scored turns below eta.
  assert any(r["rl/step_reward"] < 0.0 for r in rows)


@pytest.mark.slow
def test_rl_with_outcome_rm_reward_end_to_end(rm_dir, tmp_path):
  """configs/rm_grpo.py:smoke (outcome RM as the reward, trajectory credit)."""
  _check_rl_run(
      _rl_config(rm_dir[0], "outcome"), str(tmp_path / "rl"), rm_as_reward=True
  )


def test_rm_mode_rerun_on_a_finished_workdir_is_a_no_op(rm_dir, tmp_path):
  """Re-running the rm mode on a finished workdir returns the saved report and
  leaves metrics.jsonl (its eval line) and the report untouched."""
  src = rm_dir[0]
  workdir = tmp_path / "finished"
  workdir.mkdir()
  os.symlink(os.path.join(src, "checkpoints"), workdir / "checkpoints")
  report = {"num_pairs": {"train": 1, "test": 1}, "marker": 7}
  (workdir / "rm_report.json").write_text(json.dumps(report))
  with metrics_lib.MetricsWriter(str(workdir)) as w:
    w.write(4, {"loss": 0.5}, prefix="prm")
    w.write(4, {"orm_pairwise_accuracy": 0.75}, prefix="eval")
  before = (workdir / "metrics.jsonl").read_text()
  got = rm_train.train_and_evaluate_rm(_rm_config(), str(workdir))
  assert got == report
  assert (workdir / "metrics.jsonl").read_text() == before
  assert not (workdir / "preferences.jsonl").exists()  # no work was done


def test_rm_mode_with_a_damaged_final_checkpoint_is_not_finished(
    rm_dir, tmp_path, monkeypatch, caplog
):
  """A workdir with its report whose final checkpoint (step 4) is damaged is
  not taken for a finished run: the shortcut reads the step the resume
  restores, the newest intact one (3, the damaged 4 moved aside), so the
  run goes on to train (stopped here where it builds its training pairs)."""
  state = rm_dir[2]
  config = _rm_config()
  total = config.sft.steps + 2 * config.rm.steps
  assert total == 4
  workdir = tmp_path / "damaged"
  workdir.mkdir()
  ckdir = str(workdir / "checkpoints")
  with checkpoint_lib.Checkpointer(ckdir, max_to_keep=5) as ck:
    assert ck.save(total - 1, state, force=True)
    assert ck.save(total, state, force=True)
  (workdir / "rm_report.json").write_text(json.dumps({"marker": 7}))
  # Zero the final checkpoint's largest file (same size, wrong checksum).
  final = os.path.join(ckdir, str(total))
  files = [
      os.path.join(root, n)
      for root, _, names in os.walk(final)
      for n in names
      if n != checkpoint_lib.MANIFEST
  ]
  largest = max(files, key=os.path.getsize)
  size = os.path.getsize(largest)
  assert size > 0
  with open(largest, "wb") as f:
    f.write(b"\0" * size)
  with checkpoint_lib.Checkpointer(ckdir, max_to_keep=5) as ck:
    assert ck.latest_step() == total  # what the shortcut used to read

  class Trains(Exception):
    pass

  def pairs(*args):
    del args
    raise Trains

  monkeypatch.setattr(rm_train, "_pairs", pairs)
  caplog.set_level(logging.WARNING)
  with pytest.raises(Trains):
    rm_train.train_and_evaluate_rm(config, str(workdir))
  assert os.path.isdir(os.path.join(ckdir + "-damaged", str(total)))
  assert sorted(n for n in os.listdir(ckdir) if n.isdigit()) == [str(total - 1)]
  warns = [
      r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
  ]
  assert any(
      f"step {total}:" in w and f"resuming from step {total - 1}" in w
      for w in warns
  ), warns
  assert json.loads((workdir / "rm_report.json").read_text()) == {"marker": 7}
