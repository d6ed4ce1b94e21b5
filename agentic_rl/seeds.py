"""Several seeds of one experiment in one vmapped XLA program.

`train_seeds(config, seeds, workdir)` runs the main job's SFT -> RL loop for every
seed at once: the per-seed `TrainState`s are stacked along a leading axis and the
same jitted SFT / GRPO steps that `main.py` uses (`learner.make_sft_step`,
`learner.make_rl_step`) are `jax.vmap`ped over it. The environment is JAX-native,
so sampling tasks, rolling out, scoring and updating are all inside the vmap; seed
s reproduces, up to float reassociation in batched matmuls, the run
`python main.py --config=... --config.seed=s` would make (same initial params, same
task stream, same sampling keys). With length buckets (`sft.length_buckets`,
`sft.bucket_lengths`, `sft.fit_bucket`,
`rl.update_length_buckets`) every seed runs the longest seed's bucket
(`SEED_AXIS`): the same losses up to float summation order, but LoRA
adapter-dropout masks are drawn at that bucket's shape and the RL
sampler/trainer mismatch metrics cover the columns up to it, so those can
differ from the single run.

Why: on this 2-core CPU a tiny model leaves most of each core idle at batch 64; a
vmapped batch of S seeds fills it, so an S-seed sweep costs much less than S runs
(`experiments/bench_seeds.py` measures the ratio).

Resume: with a workdir, the stacked state is checkpointed (orbax, every
`config.checkpoint.every_steps` and at the SFT/RL boundary and the end) and a re-run
resumes from the latest intact checkpoint (the loop of agentic_rl/loop.py, with
main.py's phases over the seed axis). The workdir's `config.json` (the config plus
the list of seeds) is compared with the new one first, as `main.py` does
(`train._check_resume_compatible`): a changed training setting or seed list is
refused with one line naming each field, so a workdir never mixes two
experiments. Held-out evaluation runs per seed with
`train.evaluate` (the same greedy + pass@k report as `main.py`).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from agentic_rl import checkpoint as checkpoint_lib
from agentic_rl import learner
from agentic_rl import loop
from agentic_rl import metrics
from agentic_rl import train
from agentic_rl import types
from agentic_rl import validation
from agentic_rl.models import lora
from configs import schema

# The name of the vmapped seed axis: a length-bucketed step maximises its
# bucket index over it (padding.bucket_index), so one branch runs for all.
SEED_AXIS = "seed"


def _stack(trees: Sequence[Any]) -> Any:
  return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def _index(tree: Any, i: int) -> Any:
  return jax.tree.map(lambda x: x[i], tree)


def init_states(
    config: ml_collections.ConfigDict, seeds: Sequence[int], model_cfg
) -> tuple[Any, types.TrainState]:
  """Every seed's `train.init_state` (config.seed = s), stacked.

  Returns:
    (graphdef, the TrainState at step 0 with every leaf [S, ...], S =
    len(seeds), in `seeds` order).
  """
  graphdef, states = None, []
  for s in seeds:
    c = ml_collections.ConfigDict(config.to_dict())
    c.seed = int(s)
    graphdef, st = train.init_state(c, model_cfg)
    states.append(st)
  return graphdef, _stack(states)


def make_steps(
    config: ml_collections.ConfigDict, env, graphdef, model_cfg
) -> tuple[learner.StepFn, learner.StepFn]:
  """main.py's SFT and RL steps, each `jit(vmap(step), donate_argnums=0)`
  over the seed axis. The one construction of the vmapped steps: also
  experiments/hlo_identity.py's."""
  sft_step = jax.jit(
      jax.vmap(
          learner.make_sft_step(
              config,
              env,
              graphdef,
              learner.make_optimizer(config.sft),
              seed_axis_name=SEED_AXIS,
          ),
          axis_name=SEED_AXIS,
      ),
      donate_argnums=0,
  )
  rl_step = jax.jit(
      jax.vmap(
          learner.make_rl_step(
              config,
              env,
              graphdef,
              learner.make_optimizer(config.rl),
              model_cfg,
              seed_axis_name=SEED_AXIS,
          ),
          axis_name=SEED_AXIS,
      ),
      donate_argnums=0,
  )
  return sft_step, rl_step


def make_phases(
    config: ml_collections.ConfigDict, sft_step, rl_step
) -> tuple[loop.Phase, loop.Phase]:
  """SFT then RL, as `train.make_phases`, over the seed axis: RL is entered
  by `jit(vmap(train.start_rl))`. Every step's metrics go to the curves (no
  log cadence)."""
  start_rl = jax.jit(jax.vmap(lambda st: train.start_rl(config, st)))
  return (
      loop.Phase("sft", config.sft.steps, sft_step),
      loop.Phase(
          "rl", config.rl.steps, rl_step, enter=start_rl, restructures=True
      ),
  )


def _checkpoints(
    config: ml_collections.ConfigDict,
    workdir: str,
    curves: dict[str, list],
    wall_log: _WallLog,
) -> loop.Checkpoints:
  """The stacked state checkpointed in `workdir/checkpoints`; with each
  checkpoint, `curves` (rows so far, {name: [[S] per step]}) go to
  `workdir/curves.npz` and this call's wall time to `wall.json`."""
  ckpt = checkpoint_lib.Checkpointer(
      os.path.join(workdir, "checkpoints"),
      max_to_keep=config.checkpoint.max_to_keep,
      save_interval_steps=config.checkpoint.every_steps,
  )

  def on_save(step):
    del step
    # Curves are written with each checkpoint (not every step); rows past
    # the restored step are dropped on resume.
    np.savez(
        os.path.join(workdir, "curves.npz"),
        **{k: np.stack(v) for k, v in curves.items()},
    )
    wall_log.write(trained=True)

  return loop.Checkpoints(
      ckpt,
      lambda like, step: learner.restore_train_state(ckpt, like, step=step),
      on_save=on_save,
  )


def train_seeds(
    config: ml_collections.ConfigDict,
    seeds: Sequence[int],
    workdir: str | None = None,
    *,
    resume_free: Sequence[str] = (),
) -> dict[str, Any]:
  """Trains `len(seeds)` independent runs of `config` as one vmapped program.

  Args:
    config: an experiment config (configs/*.py); validated first. `config.seed`
      is ignored in favour of `seeds`.
    seeds: the seeds, e.g. (0, 1, 2).
    workdir: optional folder for checkpoints (resume), per-seed eval reports
      (`seed_<s>/eval_report.json`) and `curves.npz`; None keeps everything in
      memory.
    resume_free: top-level config sections whose changes a resume accepts on
      top of main.py's (e.g. ('rl',) for an SFT-only run that arms with
      different RL settings share; see `check_resume`).

  Returns:
    dict with 'sft' and 'rl': lists (one per seed, in `seeds` order) of the
    held-out metric dicts of `train.evaluate`; 'curves': {metric name:
    float64 [num_steps, S]} of every logged step metric (prefixed 'sft/' or
    'rl/'); 'wall_s': training wall time of this call in seconds;
    'wall_call_s': this call's wall seconds, evaluation included;
    'wall_total_s': this call's seconds plus those of the earlier calls that
    trained `workdir` (up to their last checkpoint; `workdir/wall.json`);
    'wall_complete': False when the workdir held checkpoints without a
    readable log, so 'wall_total_s' misses earlier training (a lower bound).

  Raises:
    ValueError: invalid config (names the field and value) or no seeds.
    validation.ConfigError: the workdir holds a run of a different config or
      seed list (names every differing field with its old and new value).
  """
  if not seeds:
    raise ValueError("train_seeds: seeds must be non-empty")
  t_call = time.time()
  config = schema.with_defaults(config)  # what the config leaves out
  validation.validate_config(config)
  if config.mesh.distributed:
    raise validation.ConfigError(
        "config.mesh.distributed=True: train_seeds runs in one process (its "
        "files are written without a multi-process writer); run the seeds "
        "one after the other with main.py, or use mesh.distributed=False"
    )
  if workdir is not None:
    workdir = os.path.abspath(workdir)
    saved = check_resume(config, seeds, workdir, resume_free)
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "config.json"), "w") as f:
      f.write(saved.to_json_best_effort(indent=2))
  wall_log = _WallLog(workdir, t_call)
  env = train.make_env(config)
  model_cfg = train.make_model_config(config)
  graphdef, state = init_states(config, seeds, model_cfg)
  sft_steps, rl_steps = config.sft.steps, config.rl.steps
  total = sft_steps + rl_steps
  phases = make_phases(config, *make_steps(config, env, graphdef, model_cfg))

  curves_path = None if workdir is None else os.path.join(workdir, "curves.npz")
  curves: dict[str, list] = {}  # {name: one [S] row per step of its phase}
  if curves_path and os.path.exists(curves_path):
    with np.load(curves_path) as f:
      curves.update({k: list(f[k]) for k in f.files})
  checkpoints = None
  if workdir is not None:
    checkpoints = _checkpoints(config, workdir, curves, wall_log)
  state, restored = loop.resume(state, phases, checkpoints)
  wall_log.start(restored=restored is not None)
  ckpt = None if checkpoints is None else checkpoints.ckpt
  sft_reports = None
  sft_path = None if workdir is None else os.path.join(workdir, "eval_sft.json")
  if sft_path and os.path.exists(sft_path):
    with open(sft_path) as f:
      sft_reports = json.load(f)

  def evaluate_all(params_s):
    return [
        train.evaluate(config, env, graphdef, _index(params_s, i), model_cfg)
        for i in range(len(seeds))
    ]

  start = int(state.step[0])
  # Curves saved after the restored checkpoint's step are dropped (re-run below).
  for k in curves:
    keep = (
        min(start, sft_steps)
        if k.startswith("sft/")
        else max(0, start - sft_steps)
    )
    curves[k] = curves[k][:keep]

  def log(step, phase, m):
    del step
    for k, v in m.items():  # one row per step of the phase
      curves.setdefault(f"{phase.name}/{k}", []).append(
          np.asarray(v, np.float64).reshape(len(seeds))
      )

  def evaluate_sft(step, state):
    """The SFT model (the reference) of every seed, once RL has begun."""
    nonlocal sft_reports
    if step >= sft_steps and sft_reports is None:
      sft_reports = evaluate_all(
          lora.reference_params(state.params, state.ref_params)
      )
      if sft_path:
        with open(sft_path, "w") as f:
          json.dump(sft_reports, f, indent=2)

  t0 = time.time()
  state, _ = loop.run(
      state,
      phases,
      start=start,
      log=log,
      checkpoints=checkpoints,
      after_save=evaluate_sft,
      seed_axis=True,
  )
  wall = time.time() - t0
  if sft_reports is None:  # rl.steps == 0 and the run was already past SFT
    sft_reports = evaluate_all(
        lora.reference_params(state.params, state.ref_params)
        if sft_steps
        else state.params
    )
  rl_reports = None
  if workdir is not None and start == total:
    # Nothing trained in this call: the final policy's evaluation, written
    # when the run finished, is reused instead of recomputed (a resumed
    # sequence of single-seed runs re-reads its finished seeds at no cost).
    rl_reports = _stored_rl_reports(workdir, seeds)
  if rl_reports is None and rl_steps == 0 and sft_steps > 0:
    # An SFT-only run (a claim's shared start): its final policy is the SFT
    # policy already evaluated above.
    rl_reports = sft_reports
  if rl_reports is None:
    rl_reports = evaluate_all(state.params)
  if ckpt is not None:
    ckpt.wait()
    ckpt.close()
  if workdir is not None:
    for s, sft_r, rl_r in zip(seeds, sft_reports, rl_reports):
      d = os.path.join(workdir, f"seed_{s}")
      os.makedirs(d, exist_ok=True)
      metrics.write_strict_json(
          os.path.join(d, "eval_report.json"), {"sft": sft_r, "rl": rl_r}
      )
  wall_log.write(trained=start < total)
  return {
      "sft": sft_reports,
      "rl": rl_reports,
      "curves": {k: np.stack(v) for k, v in curves.items()},
      "wall_s": wall,
      "wall_call_s": wall_log.call_s(),
      "wall_total_s": wall_log.total_s(),
      "wall_complete": wall_log.complete,
      "params": state.params,
  }


def _stored_rl_reports(workdir: str, seeds: Sequence[int]) -> list | None:
  """Every seed's 'rl' report from `seed_<s>/eval_report.json`, or None when
  one is missing or unreadable (then the caller evaluates again)."""
  reports = []
  for s in seeds:
    path = os.path.join(workdir, f"seed_{s}", "eval_report.json")
    try:
      with open(path) as f:
        report = json.load(f)["rl"]
    except (OSError, ValueError, KeyError):
      return None
    if not isinstance(report, dict):
      return None
    # write_strict_json stored NaN (e.g. accuracy_hard without hard items)
    # as null: back to NaN, as evaluate returned it.
    reports.append(
        {k: float("nan") if v is None else v for k, v in report.items()}
    )
  return reports


class _WallLog:
  """Wall seconds of the `train_seeds` calls that trained a workdir (`wall.json`).

  A run that is interrupted and resumed trains in several processes; the file
  keeps one entry per call that trained at least one step ({'calls':
  [seconds, ...]}), the current call's entry rewritten at each checkpoint
  and at the end, so the total counts earlier processes up to their last
  checkpoint (work lost after it is not counted). A call that only
  re-evaluates a finished workdir adds no entry. Without a workdir only the
  current call is known.

  `complete` is False when the workdir held checkpoints but no readable log
  (a run from before the log existed, or a damaged file): the total then
  misses the earlier training and is a lower bound. Without checkpoints any
  old log is dropped (the training starts from scratch).
  """

  def __init__(self, workdir: str | None, t_call: float):
    self.path = None if workdir is None else os.path.join(workdir, "wall.json")
    self.t_call = t_call
    self.earlier: list[float] = []
    self.complete = True

  def start(self, restored: bool) -> None:
    """Reads the earlier calls' entries if a checkpoint was restored."""
    if self.path is None:
      return
    if not restored:
      self.earlier = []  # no checkpoint: earlier entries trained nothing kept
      return
    try:
      with open(self.path) as f:
        calls = [float(x) for x in json.load(f)["calls"]]
      if not all(np.isfinite(c) and c >= 0 for c in calls):
        raise ValueError(f"non-finite or negative entry in {calls}")
      self.earlier = calls
    except (OSError, ValueError, KeyError, TypeError):
      # Missing or damaged: the earlier time is unknown, not zero.
      self.earlier, self.complete = [], False

  def call_s(self) -> float:
    return time.time() - self.t_call

  def total_s(self) -> float:
    return sum(self.earlier) + self.call_s()

  def write(self, trained: bool) -> None:
    """Rewrites the log with this call's entry (none if it trained nothing)."""
    if self.path is None:
      return
    calls = [*self.earlier, self.call_s()] if trained else self.earlier
    tmp = self.path + ".tmp"
    with open(tmp, "w") as f:
      json.dump({"calls": calls}, f)
    os.replace(tmp, self.path)  # never a half-written file


def check_resume(
    config: ml_collections.ConfigDict,
    seeds: Sequence[int],
    workdir: str,
    resume_free: Sequence[str] = (),
) -> ml_collections.ConfigDict:
  """Refuses to resume a workdir that holds a run of another config or seed list.

  The config plus `seeds` is compared with the workdir's config.json by
  `train._check_resume_compatible` (main.py's rule: only evaluation, logging,
  checkpointing, mesh, microbatching and rl.steps may change). Sections named
  in `resume_free` are taken from the saved config before the comparison, so
  their changes are accepted. Nothing is written.

  Returns:
    The config to save in the workdir (`config_with_seeds(config, seeds)`).

  Raises:
    validation.ConfigError: naming every refused field with old and new value.
  """
  saved = config_with_seeds(config, seeds)
  checked = saved
  path = os.path.join(workdir, "config.json")
  if resume_free and os.path.exists(path):
    with open(path) as f:
      old = json.load(f)
    d = json.loads(saved.to_json_best_effort())
    d.update({k: old[k] for k in resume_free if k in old})
    # A saved section from before a field existed gets its default, as the
    # saved config itself does in the comparison.
    checked = schema.with_defaults(ml_collections.ConfigDict(d))
  train._check_resume_compatible(checked, workdir)  # pylint: disable=protected-access
  return saved


def config_with_seeds(
    config: ml_collections.ConfigDict, seeds: Sequence[int]
) -> ml_collections.ConfigDict:
  """The config `train_seeds` saves and checks on resume: `config` plus `seeds`
  (a list of ints; `config.seed` is ignored by `train_seeds`)."""
  c = ml_collections.ConfigDict(config.to_dict())
  c.seeds = [int(s) for s in seeds]
  return c


def unstack(tree: Any, n: int) -> list[Any]:
  """Splits a pytree stacked over seeds into n per-seed pytrees."""
  return [_index(tree, i) for i in range(n)]
