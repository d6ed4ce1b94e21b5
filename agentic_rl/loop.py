"""The training loop of every mode: phases of jitted steps, resume, parts.

A run is a sequence of `Phase`s over one global step counter: SFT then RL
(`train.py`; `seeds.py` with the state stacked over seeds), or SFT, the
outcome RM and the process RM (`rm_train.py`). A phase has a step function
`state -> (state, metrics)` and may have a transition `enter`, run once when
the run reaches the phase's first step (`train.start_rl`: the SFT policy
frozen as the reference, a fresh RL optimizer). What a mode does besides
stepping comes in small parts:

  checkpoints  `Checkpoints`: the orbax Checkpointer, what a checkpoint holds
               and how it is restored (train: the LoRA adapters only and the
               task loader's position; seeds: the state stacked over seeds,
               curves.npz and wall.json written with each checkpoint);
  log          called after every step: metrics.jsonl, TensorBoard and the
               progress bar (`MetricsLog`: train, rm_train), or the
               in-memory learning curves (seeds);
  after_save   called after every step's checkpoint: the held-out
               evaluation of the SFT model once RL has begun (train, seeds).

The evaluation at the end and the reports stay with each mode. A mode runs

    state, restored_step = loop.resume(state, phases, checkpoints)
    state, halted = loop.run(state, phases, start=step, log=..., ...)

and one step of `run` (s = the number of steps done after it) is:

  1. state, metrics = phase.step(state); the metrics are fetched to the host
     (python floats; arrays [S] with `seed_axis`); a non-finite 'loss'
     raises FloatingPointError, a positive 'shared_prefix_mismatch_max'
     (`rl.shared_prefix_len`) SharedPrefixMismatch;
  2. log(s, phase, metrics);
  3. every phase that begins at s is entered (`phase.enter(state)`);
  4. checkpoints.save(s, state, force=s ends a phase);
  5. after_save(s, state);
  6. s == halt_after: return (state, True).

The seed axis is the parameter `seed_axis` (the step functions are
`jit(vmap(...))` over stacked states; metrics stay per seed).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Sequence

import jax
import numpy as np
from absl import logging

from agentic_rl import checkpoint as checkpoint_lib
from agentic_rl import metrics as metrics_lib

State = Any  # a TrainState, a TrainState stacked over seeds, the rm-mode dict
Metrics = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Phase:
  """One phase of a run.

  Attributes:
    name: the metrics' prefix ('sft', 'rl', 'orm', 'prm').
    steps: number of steps (>= 0).
    step: `state -> (state, metrics)`, one step (jitted); metrics has a
      scalar 'loss' ([S] with a seed axis).
    log_every: metrics.jsonl cadence (`MetricsLog`; the last step of every
      phase is always written).
    enter: `state -> state`, the transition into this phase, run once when
      the run reaches its first step: after the previous phase's last step
      (before that step's checkpoint, which so holds the entered state), or
      before the first step of a fresh run when the phase begins at step 0.
    restructures: `enter` changes the state's structure (new optimizer
      state, feature states): a checkpoint at or after this phase's first
      step is restored into `enter(state)` (its values are the checkpoint's).
  """

  name: str
  steps: int
  step: Callable[[State], tuple[State, Metrics]]
  log_every: int = 1
  enter: Callable[[State], State] | None = None
  restructures: bool = False


class SharedPrefixMismatch(ValueError):
  """A group's rows differed in their first `rl.shared_prefix_len` tokens;
  main.py prints it as one line (exit code 2)."""


def phase_starts(phases: Sequence[Phase]) -> list[int]:
  """Global step at which each phase begins (steps done before it)."""
  return [sum(p.steps for p in phases[:i]) for i in range(len(phases))]


def phase_ends(phases: Sequence[Phase]) -> list[int]:
  """Global step at which each phase ends (steps done after its last step)."""
  return [b + p.steps for b, p in zip(phase_starts(phases), phases)]


def _identity(state: State) -> State:
  return state


def _no_position() -> None:
  return None


def _nothing(step: int) -> None:
  del step


@dataclasses.dataclass(frozen=True)
class Checkpoints:
  """How a mode checkpoints its state.

  Attributes:
    ckpt: the run's `checkpoint.Checkpointer` (its save interval and
      max_to_keep apply).
    restore: `(like, step) -> state`, checkpoint `step` restored into the
      structure of `like`.
    to_save: what a checkpoint holds of the state (train: with LoRA the
      trainable subtree only); identity by default.
    data_position: `() -> dict | None`, the task loader's position saved
      with each checkpoint (train), None for none.
    on_save: `step -> None`, called after a checkpoint was written (seeds:
      curves.npz and wall.json).
  """

  ckpt: checkpoint_lib.Checkpointer
  restore: Callable[[State, int], State]
  to_save: Callable[[State], Any] = _identity
  data_position: Callable[[], dict | None] = _no_position
  on_save: Callable[[int], None] = _nothing

  def save(self, step: int, state: State, force: bool) -> None:
    """Checkpoint `step` (every `save_interval_steps`, or `force`)."""
    if self.ckpt.save(
        step,
        self.to_save(state),
        force=force,
        data_position=self.data_position(),
    ):
      self.on_save(step)


class MetricsLog:
  """The `log` part of train.py and rm_train.py.

  A step's metrics go to metrics.jsonl and TensorBoard
  (`metrics.MetricsWriter`, names prefixed '<phase>/') every
  `phase.log_every` steps and at the end of every phase; the progress bar
  moves every step.
  """

  def __init__(
      self,
      writer: metrics_lib.MetricsWriter,
      bar: metrics_lib.ProgressBar,
      phases: Sequence[Phase],
  ):
    self.writer, self.bar, self.ends = writer, bar, phase_ends(phases)

  def __call__(self, step: int, phase: Phase, metrics: Metrics) -> None:
    if step % phase.log_every == 0 or step in self.ends:
      self.writer.write(step, metrics, prefix=phase.name)
    self.bar.update(step, metrics)


def resume(
    state: State,
    phases: Sequence[Phase],
    checkpoints: Checkpoints | None,
) -> tuple[State, int | None]:
  """The state a run continues from.

  The newest intact checkpoint (`Checkpointer.latest_intact_step`: damaged
  newer ones are set aside with one warning) is restored into `state`, after
  entering each phase that `restructures` and begins at or before the
  checkpoint's step (only for the structure: the transitions' results are in
  the checkpoint and they are not run again). Without a checkpoint (or
  without `checkpoints`) the phases that begin at step 0 are entered (e.g.
  RL without SFT).

  Args:
    state: the fresh state at step 0.
    phases: the run's phases.
    checkpoints: the mode's checkpointing, or None (nothing to resume).

  Returns:
    (state, the restored checkpoint's step or None).
  """
  step = None if checkpoints is None else checkpoints.ckpt.latest_intact_step()
  starts = phase_starts(phases)
  if step is None:
    for phase, begin in zip(phases, starts):
      if begin == 0 and phase.enter is not None:
        state = phase.enter(state)
    return state, None
  for phase, begin in zip(phases, starts):
    if begin <= step and phase.restructures:
      state = phase.enter(state)
  state = checkpoints.restore(state, step)
  logging.info(
      "resumed from step %d in %s",
      step,
      os.path.dirname(checkpoints.ckpt.directory),
  )
  return state, step


def host_floats(metrics: Metrics) -> dict[str, float]:
  """A step's metrics as python floats (one device-to-host transfer)."""
  return {k: float(v) for k, v in jax.device_get(metrics).items()}


def run(
    state: State,
    phases: Sequence[Phase],
    *,
    start: int,
    log: Callable[[int, Phase, Metrics], None],
    checkpoints: Checkpoints | None = None,
    after_save: Callable[[int, State], None] | None = None,
    halt_after: int | None = None,
    seed_axis: bool = False,
) -> tuple[State, bool]:
  """Runs the phases' steps from global step `start` to the last one.

  Args:
    state: the state after `start` steps (`resume`'s).
    phases: the run's phases; step s (0-based) runs in the phase whose
      [begin, end) holds it.
    start: the number of steps already done.
    log: `(step, phase, metrics)` after every step (step = steps done).
    checkpoints: saved after every step (forced at every phase end), or None.
    after_save: `(step, state)` after every step's checkpoint.
    halt_after: stop right after this step (the resume tests), or None.
    seed_axis: the state is stacked over seeds: the metrics stay numpy
      arrays [S] (python floats otherwise).

  Returns:
    (state, halted): halted is True when the run stopped at `halt_after`.

  Raises:
    FloatingPointError: a non-finite 'loss' (names the phase and step).
    SharedPrefixMismatch: the update found a group whose rows differ in their
      shared prefix (metric 'shared_prefix_mismatch_max',
      `rl.shared_prefix_len`).
  """
  ends = phase_ends(phases)
  starts = phase_starts(phases)
  for step in range(start + 1, ends[-1] + 1 if ends else 0):
    # `step` counts the steps done after this one: it runs in the first
    # phase that ends at or after it.
    phase = next(p for p, end in zip(phases, ends) if step <= end)
    state, metrics = phase.step(state)
    metrics = jax.device_get(metrics) if seed_axis else host_floats(metrics)
    loss = metrics["loss"]
    if not np.all(np.isfinite(loss)):
      # (The seeds' message has never had the '='.)
      sep = " " if seed_axis else " = "
      raise FloatingPointError(
          f"non-finite {phase.name}/loss{sep}{loss} at step {step}"
      )
    mismatch = metrics.get("shared_prefix_mismatch_max")
    if mismatch is not None and np.any(np.asarray(mismatch) > 0):
      # Before logging or saving: this step's update used a wrong forward.
      raise SharedPrefixMismatch(
          f"config.rl.shared_prefix_len: at {phase.name} step {step} the rows "
          "of a group differ in their first rl.shared_prefix_len tokens (the "
          "shared-prefix forward assumes they are equal; nothing of this step "
          "was logged or saved); set it to at most the shortest prompt, or 0, "
          "and re-run the same command to resume"
      )
    log(step, phase, metrics)
    for p, begin in zip(phases, starts):
      if begin == step and p.enter is not None:
        state = p.enter(state)
    if checkpoints is not None:
      checkpoints.save(step, state, force=step in ends)
    if after_save is not None:
      after_save(step, state)
    if step == halt_after:
      return state, True
  return state, False
