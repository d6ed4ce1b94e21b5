"""agentic_rl/loop.py: the one training loop, on fake phases (no model).

The fake run has an 'sft' phase of 3 steps and an 'rl' phase of 3 steps
whose transition adds two leaves to the state (as `train.start_rl` adds the
RL optimizer and features), on a dict of small numpy arrays; the steps are
deterministic functions of the state, so a replayed step gives the same
values. The loop runs with the real Checkpointer (every 2 steps, forced at
the phase ends) and the real metrics.jsonl writer (`loop.MetricsLog`).
"""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentic_rl import checkpoint as checkpoint_lib
from agentic_rl import loop
from agentic_rl import metrics as metrics_lib
from agentic_rl import rm_train
from agentic_rl import seeds as seeds_lib
from agentic_rl import train
from agentic_rl import types
from configs import default
from configs import rm_arithmetic
from configs import schema

SFT, RL = 3, 3
TOTAL = SFT + RL


def _fresh():
  return {"step": np.array(0, np.int32), "x": np.array([1.0, 2.0], np.float32)}


def _phases(calls, sft_steps=SFT, rl_steps=RL, restructures=True):
  """Fake SFT -> RL phases; `calls` records (what, step) of every call."""

  def sft_step(state):
    s = int(state["step"])
    calls.append(("sft", s))
    x = state["x"] * np.float32(0.5) + np.float32(s + 1)
    m = {"loss": x.sum(), "mean": x.mean()}
    return dict(state, x=x, step=np.array(s + 1, np.int32)), m

  def enter_rl(state):
    calls.append(("enter", int(state["step"])))
    # `entered` counts the transitions this state went through.
    entered = np.array(int(state.get("entered", 0)) + 1, np.int32)
    return dict(state, ref=state["x"].copy(), entered=entered)

  def rl_step(state):
    s = int(state["step"])
    calls.append(("rl", s))
    x = state["x"] + np.float32(0.25) * state["ref"] - np.float32(s)
    new = dict(state, x=x, step=np.array(s + 1, np.int32))
    return new, {"loss": np.abs(x).sum()}

  return (
      loop.Phase("sft", sft_steps, sft_step, log_every=2),
      loop.Phase(
          "rl",
          rl_steps,
          rl_step,
          log_every=2,
          enter=enter_rl,
          restructures=restructures,
      ),
  )


def _run(workdir, *, halt_after=-1, every=2, calls=None, saved=None):
  """A mode as the wrappers build it: resume, MetricsLog, run."""
  calls = [] if calls is None else calls
  phases = _phases(calls)
  ckpt = checkpoint_lib.Checkpointer(
      os.path.join(workdir, "checkpoints"),
      max_to_keep=10,
      save_interval_steps=every,
  )
  checkpoints = loop.Checkpoints(
      ckpt,
      lambda like, step: ckpt.restore(like, step=step),
      on_save=saved.append if saved is not None else (lambda step: None),
  )
  state, restored = loop.resume(_fresh(), phases, checkpoints)
  start = int(state["step"])
  writer = metrics_lib.MetricsWriter(workdir, resume_step=start)
  bar = metrics_lib.ProgressBar(
      total=TOTAL, initial=start, desc="fake", keys=("loss",), disable=True
  )
  try:
    state, halted = loop.run(
        state,
        phases,
        start=start,
        log=loop.MetricsLog(writer, bar, phases),
        checkpoints=checkpoints,
        halt_after=halt_after,
    )
  finally:
    bar.close()
    writer.close()
    ckpt.close()
  return state, halted, restored, calls


@pytest.fixture(scope="module")
def full(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("full"))
  saved = []
  state, halted, restored, calls = _run(workdir, saved=saved)
  return workdir, state, halted, restored, calls, saved


def test_phase_boundaries():
  phases = _phases([])
  assert loop.phase_starts(phases) == [0, SFT]
  assert loop.phase_ends(phases) == [SFT, TOTAL]
  assert loop.phase_ends(_phases([], sft_steps=0)) == [0, RL]


def test_phases_run_in_order_and_the_transition_once(full):
  _, state, halted, restored, calls, _ = full
  assert not halted and restored is None
  assert calls == [
      ("sft", 0),
      ("sft", 1),
      ("sft", 2),
      ("enter", 3),
      ("rl", 3),
      ("rl", 4),
      ("rl", 5),
  ]
  # x by hand: sft x <- x/2 + s + 1; the transition keeps ref = x after
  # SFT; rl x <- x + ref/4 - s.
  x = np.array([1.0, 2.0])
  for s in range(SFT):
    x = x / 2 + s + 1
  ref = x.copy()
  for s in range(SFT, TOTAL):
    x = x + ref / 4 - s
  np.testing.assert_allclose(state["x"], x, rtol=1e-6)
  np.testing.assert_array_equal(state["ref"], ref.astype(np.float32))
  assert int(state["step"]) == TOTAL and int(state["entered"]) == 1


def test_log_and_checkpoint_cadence(full):
  workdir, _, _, _, _, saved = full
  rows = metrics_lib.read_metrics(workdir)
  # Every 2 steps and at each phase end (3, 6), prefixed by the phase that
  # ran the step.
  assert [(r["step"], r["phase"]) for r in rows] == [
      (2, "sft"),
      (3, "sft"),
      (4, "rl"),
      (6, "rl"),
  ]
  assert set(rows[0]) == {"step", "phase", "sft/loss", "sft/mean"}
  # Checkpoints every 2 steps and forced at the phase ends; on_save after
  # each written one.
  ckpt = checkpoint_lib.Checkpointer(os.path.join(workdir, "checkpoints"))
  assert ckpt.all_steps() == [2, 3, 4, 6]
  assert saved == [2, 3, 4, 6]
  # The checkpoint at the transition holds the entered state (ref), the
  # one before it the SFT structure.
  assert set(ckpt.saved_tree(3)) == {"step", "x", "ref", "entered"}
  assert set(ckpt.saved_tree(2)) == {"step", "x"}
  ckpt.close()


# The checkpoint a run halted after step k resumes from (every 2 steps, the
# phase ends forced): none after step 1.
_RESTORED = {1: None, 2: 2, 3: 3, 4: 4, 5: 4, 6: 6}


@pytest.mark.parametrize("k", range(1, TOTAL + 1))
def test_resume_at_every_step_boundary_gives_the_same_run(full, tmp_path, k):
  full_dir, full_state, _, _, _, _ = full
  workdir = str(tmp_path)
  _, halted, _, _ = _run(workdir, halt_after=k)
  assert halted
  state, halted, restored, calls = _run(workdir)
  assert not halted and restored == _RESTORED[k]
  # The resumed leg runs the steps after its checkpoint; the transition is
  # run once in all: in the loop when the checkpoint is before it, else only
  # for the structure before restoring (on the fresh state, step 0).
  first = restored or 0
  steps = [s for what, s in calls if what != "enter"]
  assert steps == list(range(first, TOTAL))
  enters = [s for what, s in calls if what == "enter"]
  assert enters == ([0] if first >= SFT else [SFT])
  assert int(state["entered"]) == 1
  for key in full_state:
    np.testing.assert_array_equal(state[key], full_state[key], err_msg=key)
  # The same metrics.jsonl, line for line (replayed steps not duplicated).
  with open(os.path.join(full_dir, "metrics.jsonl")) as f:
    want = f.read()
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    assert f.read() == want
  ckpt = checkpoint_lib.Checkpointer(os.path.join(workdir, "checkpoints"))
  assert ckpt.all_steps() == [2, 3, 4, 6]
  last = ckpt.restore(state, step=TOTAL)
  ckpt.close()
  for key in full_state:
    np.testing.assert_array_equal(last[key], full_state[key], err_msg=key)


def test_a_phase_at_step_0_is_entered_before_the_first_step(tmp_path):
  calls = []
  phases = _phases(calls, sft_steps=0)
  state, restored = loop.resume(_fresh(), phases, None)
  assert restored is None and calls == [("enter", 0)]
  state, halted = loop.run(
      state, phases, start=0, log=lambda *a: None, halt_after=2
  )
  assert halted and calls == [("enter", 0), ("rl", 0), ("rl", 1)]
  assert int(state["step"]) == 2


def test_a_transition_that_keeps_the_structure_is_not_run_on_resume(tmp_path):
  # rm_train's ORM phase: entered by copying weights, same structure.
  calls = []
  phases = _phases(calls, restructures=False)
  ckpt = checkpoint_lib.Checkpointer(str(tmp_path / "ck"))
  state = dict(_fresh(), ref=np.zeros(2, np.float32), entered=np.array(0))
  state["step"] = np.array(4, np.int32)
  ckpt.save(4, state, force=True)
  checkpoints = loop.Checkpoints(ckpt, lambda like, s: ckpt.restore(like, s))
  like = dict(_fresh(), ref=np.ones(2, np.float32), entered=np.array(7))
  restored, step = loop.resume(like, phases, checkpoints)
  ckpt.close()
  assert step == 4 and calls == []
  assert int(restored["step"]) == 4 and int(restored["entered"]) == 0


def test_a_non_finite_loss_names_the_phase_and_step():
  def bad(state):
    return state, {"loss": np.float32(np.nan)}

  phases = (loop.Phase("sft", 1, lambda s: (s, {"loss": 1.0})),)
  phases += (loop.Phase("rl", 2, bad),)
  with pytest.raises(
      FloatingPointError, match=r"^non-finite rl/loss = nan at step 2$"
  ):
    loop.run({}, phases, start=0, log=lambda *a: None)
  # Over seeds: one non-finite seed is enough; the message lists them all.
  stacked = (
      loop.Phase("sft", 1, lambda s: (s, {"loss": np.array([1.0, np.nan])})),
  )
  with pytest.raises(
      FloatingPointError, match=r"^non-finite sft/loss \[ 1. nan\] at step 1$"
  ):
    loop.run({}, stacked, start=0, log=lambda *a: None, seed_axis=True)


def test_seed_axis_keeps_per_seed_metrics():
  got = []

  def step(state):
    return state + 1, {"loss": state * 2.0}

  phases = (loop.Phase("sft", 2, step),)
  state, halted = loop.run(
      jnp.array([1.0, 3.0]),
      phases,
      start=0,
      log=lambda s, p, m: got.append((s, p.name, m["loss"])),
      seed_axis=True,
  )
  assert not halted
  np.testing.assert_array_equal(state, [3.0, 5.0])
  assert [(s, p) for s, p, _ in got] == [(1, "sft"), (2, "sft")]
  assert all(isinstance(m, np.ndarray) and m.shape == (2,) for *_, m in got)
  np.testing.assert_array_equal(got[1][2], [4.0, 8.0])
  # Without the axis the loop hands python floats to the log.
  floats = []
  loop.run(
      jnp.float32(1.0),
      phases,
      start=0,
      log=lambda s, p, m: floats.append(m["loss"]),
  )
  assert floats == [2.0, 4.0] and all(type(v) is float for v in floats)


def test_checkpoints_part_saves_what_to_save_gives_and_the_data_position(
    tmp_path,
):
  ckpt = checkpoint_lib.Checkpointer(str(tmp_path), save_interval_steps=2)
  saved = []
  part = loop.Checkpoints(
      ckpt,
      lambda like, s: ckpt.restore(like, s),
      to_save=lambda st: {"x": st["x"]},
      data_position=lambda: {"epoch": 3},
      on_save=saved.append,
  )
  state = {"x": np.arange(3.0), "big": np.zeros(5)}
  part.save(1, state, force=False)  # not a multiple of 2: skipped
  part.save(2, state, force=False)
  part.save(3, state, force=True)
  assert saved == [2, 3] and ckpt.all_steps() == [2, 3]
  assert set(ckpt.saved_tree(3)) == {"x"}
  assert ckpt.restore_data_position(3) == {"epoch": 3}
  ckpt.close()


# ----------------------------------------------------------- the wrappers


def test_train_phases_are_sft_then_rl_entered_by_start_rl():
  config = default.get_config("smoke")
  config.log_every_steps, config.rl.log_every_steps = 7, 3
  sft, rl = train.make_phases(config, "sft_fn", "rl_fn")
  assert (sft.name, sft.steps, sft.step, sft.log_every) == (
      "sft",
      config.sft.steps,
      "sft_fn",
      7,
  )
  assert sft.enter is None
  assert (rl.name, rl.steps, rl.step, rl.log_every) == (
      "rl",
      config.rl.steps,
      "rl_fn",
      3,
  )
  assert rl.restructures
  assert rl.enter.func is train.start_rl and rl.enter.args[0] is config


def _fake_train_state(params, step):
  return types.TrainState(
      step=step,
      params=params,
      ref_params=jax.tree.map(jnp.zeros_like, params),
      opt_state=None,
      rng=jnp.zeros(step.shape + (2,), jnp.uint32),
      features=types.FeatureStates(kl=jnp.full(step.shape, 0.1, jnp.float32)),
  )


def test_seeds_phases_enter_rl_per_seed():
  config = schema.with_defaults(default.get_config("smoke"))
  sft, rl = seeds_lib.make_phases(config, "sft_fn", "rl_fn")
  assert (sft.name, sft.steps, sft.step, sft.enter) == (
      "sft",
      config.sft.steps,
      "sft_fn",
      None,
  )
  assert (rl.name, rl.steps, rl.step, rl.restructures) == (
      "rl",
      config.rl.steps,
      "rl_fn",
      True,
  )
  # The transition is train.start_rl on every seed of the stacked state:
  # the reference becomes each seed's own params, a fresh RL optimizer.
  w = jnp.array([[1.0, 2.0], [3.0, 4.0]])
  state = _fake_train_state({"w": w}, jnp.array([5, 5], jnp.int32))
  out = rl.enter(state)
  np.testing.assert_array_equal(out.ref_params["w"], w)
  np.testing.assert_array_equal(out.params["w"], w)
  np.testing.assert_array_equal(out.step, [5, 5])
  single = train.start_rl(
      config, _fake_train_state({"w": w[1]}, jnp.array(5, jnp.int32))
  )
  for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(single)):
    assert a.shape == (2,) + b.shape
    np.testing.assert_array_equal(a[1], b)


def test_seeds_checkpoints_save_the_stacked_state_with_the_curves(tmp_path):
  config = default.get_config("smoke")
  config.checkpoint.every_steps = 2
  curves = {"sft/loss": [np.array([1.0, 2.0]), np.array([3.0, 4.0])]}
  wall = seeds_lib._WallLog(str(tmp_path), t_call=0.0)  # pylint: disable=protected-access
  part = seeds_lib._checkpoints(config, str(tmp_path), curves, wall)  # pylint: disable=protected-access
  state = {"step": np.array([2, 2], np.int32), "w": np.ones((2, 3))}
  part.save(2, state, force=False)
  curves["sft/loss"].append(np.array([5.0, 6.0]))
  part.save(3, state, force=False)  # not a checkpoint step: no curves either
  assert part.ckpt.all_steps() == [2]
  restored = part.restore(
      {"step": np.zeros(2, np.int32), "w": np.zeros((2, 3))}, 2
  )
  part.ckpt.close()
  np.testing.assert_array_equal(restored["w"], np.ones((2, 3)))
  with np.load(tmp_path / "curves.npz") as f:
    np.testing.assert_array_equal(f["sft/loss"], [[1.0, 2.0], [3.0, 4.0]])
  with open(tmp_path / "wall.json") as f:
    assert len(json.load(f)["calls"]) == 1


@pytest.mark.parametrize("init_from_sft", [True, False])
def test_rm_phases_have_no_rl_transition(init_from_sft):
  config = schema.with_defaults(rm_arithmetic.get_config("smoke"))
  config.rm.init_from_sft = init_from_sft
  config.log_every_steps = 5
  phases = rm_train.make_phases(config, "sft_fn", "orm_fn", "prm_fn")
  assert [(p.name, p.steps, p.step, p.log_every) for p in phases] == [
      ("sft", config.sft.steps, "sft_fn", 5),
      ("orm", config.rm.steps, "orm_fn", 5),
      ("prm", config.rm.steps, "prm_fn", 5),
  ]
  assert not any(p.restructures for p in phases)
  assert phases[0].enter is None and phases[2].enter is None
  want = rm_train._init_from_policy if init_from_sft else None  # pylint: disable=protected-access
  assert phases[1].enter is want
