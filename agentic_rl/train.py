"""The experiment loop: SFT warm start -> GRPO -> evaluation, with exact resume.

`train_and_evaluate(config, workdir)` is what `main.py` calls. Side effects (files,
progress bar, checkpoints) live here and in metrics.py / checkpoint.py; everything
inside a step is a pure jitted function from the learner/ package. The loop
itself (phases, resume, checkpoint and log cadence) is agentic_rl/loop.py's,
shared with seeds.py and rm_train.py; this module builds its SFT and RL phases
(`make_steps`, `make_phases`) and parts.

Workdir layout:
  config.json                the resolved config
  .lock                      held (fcntl.flock) by the run using the workdir
  checkpoints/               orbax checkpoints of the full TrainState, each with
                             a checksum manifest (checkpoint.py); damaged ones
                             found at resume are moved to checkpoints-damaged/;
                             with LoRA, params = the adapters only
                             (checkpoints/lora_base.json names the frozen base)
  metrics.jsonl, tensorboard/  per-step metrics
  eval_initial.json          held-out evaluation of the initial weights, before SFT
                             (only with `eval.initial=True` and `sft.steps > 0`)
  eval_sft.json              held-out evaluation of the SFT checkpoint (the reference)
  eval_report.{json,md}      [initial vs] SFT vs final evaluation, learning_curves.png

Several processes (`config.mesh.distributed`, agentic_rl/launch.py): every
process runs this same loop on its shards of one global mesh; process 0 alone
writes the files above (and prints the progress bar and report), every process
holds its own lock (process 0 `.lock`, as a one-process run, so that the two
refuse each other; process i `.lock.<i>`), and checkpoints are written by all
processes together (checkpoint.py). Decisions read from files (evaluations
still to run, the checkpoint to restore) are process 0's, broadcast to all.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging
from flax import nnx

from agentic_rl import checkpoint as checkpoint_lib
from agentic_rl import host_rollout
from agentic_rl import learner
from agentic_rl import loop
from agentic_rl import metrics as metrics_lib
from agentic_rl import mixed_precision
from agentic_rl import reward_model_loader
from agentic_rl import rollout
from agentic_rl import sharding
from agentic_rl import types
from agentic_rl import validation
from agentic_rl import workdir_lock
from agentic_rl.models import hf
from agentic_rl.models import lora as lora_lib
from agentic_rl.models import transformer
from configs import schema
import environments
from environments.host import base as host_base


def make_env(config: ml_collections.ConfigDict):
  """Builds the environment named by `config.env.name` from `config.env`.

  `config.tokenizer = "hf"` (host environments only) gives the environment the
  checkpoint's own tokenizer, stop ids and chat template from
  `config.model.hf_path` (tokenizers.HFTokenizer.from_folder); the default
  "byte" keeps the byte-level tokenizer. With a `config.data` block
  (agentic_rl/data.py loader), a host environment reads its tasks through the
  loader (agentic_rl/datasets/tasks.py).
  """
  if config.tokenizer == "hf":
    from agentic_text import tokenizers  # pylint: disable=g-import-not-at-top

    tok = tokenizers.HFTokenizer.from_folder(config.model.hf_path)
    env = environments.make({**dict(config.env), "tokenizer": tok})
  else:
    env = environments.make(config.env)
  if config.data:
    from agentic_rl.datasets import tasks as data_tasks  # noqa: PLC0415

    env = data_tasks.with_loader(env, config)
  return env


def _data_position(env) -> dict | None:
  """Position of the env's task loader (saved in the checkpoint), or None."""
  return env.get_position() if hasattr(env, "get_position") else None


def make_model_config(config) -> transformer.TransformerConfig:
  """TransformerConfig from config.model, or from config.model.hf_path's
  config.json (plus config.model's non-shape fields, hf.RUNTIME_FIELDS)."""
  path = config.model.hf_path
  fields = lora_lib.transformer_fields(config.model)
  if path:
    return hf.config_from_hf(
        hf.read_config(path),
        lora=fields["lora"],
        **{f: config.model[f] for f in hf.RUNTIME_FIELDS},
    )
  return transformer.TransformerConfig(**fields)


def init_state(
    config, model_cfg, mesh=None
) -> tuple[nnx.GraphDef, types.TrainState]:
  """Fresh TrainState at step 0 (SFT optimizer state, ref_params = initial params;
  with LoRA (config.model.lora) fresh adapters on the base, ref_params = their copy).

  The initial params are random, or the checkpoint at config.model.hf_path. On a
  mesh of several devices (default: the mesh of `config.mesh`) a random init is
  created directly in its sharded layout (sharding.init_sharded: eval_shape,
  then jit with out_shardings), so no unsharded copy of the parameters or
  optimizer state is ever materialised; an imported checkpoint is read on the
  host, then placed. On one device the state is built eagerly and placed on the
  mesh: XLA's fusion of the jitted initialiser changes the last bit of some
  initial weights, and the eager path keeps earlier single-device runs
  reproducible bit for bit.
  """
  root = jax.random.PRNGKey(config.seed)
  mesh = sharding.make_mesh(config.mesh) if mesh is None else mesh
  hf_path = config.model.hf_path
  if hf_path:
    # Imported Hugging Face checkpoint (agentic_rl/models/hf.py).
    graphdef, imported = hf.params_from_hf_tensors(
        dataclasses.replace(model_cfg, lora=None), hf.read_safetensors(hf_path)
    )
    if model_cfg.lora is not None:
      graphdef, imported = lora_lib.init_adapters(
          model_cfg, graphdef, imported, jax.random.fold_in(root, 2)
      )
  else:
    graphdef = nnx.graphdef(
        nnx.eval_shape(
            lambda: transformer.Transformer(model_cfg, nnx.Rngs(params=0))
        )
    )
  tx = learner.make_optimizer(config.sft)

  def init():
    if hf_path:
      params = imported
    else:
      model = transformer.Transformer(
          model_cfg, nnx.Rngs(params=jax.random.fold_in(root, 0))
      )
      params = nnx.state(model)
    return types.TrainState(
        step=jnp.int32(0),
        params=params,
        # With LoRA only the adapters are copied (lora.reference_state).
        ref_params=lora_lib.reference_state(params),
        opt_state=tx.init(params),
        rng=jax.random.fold_in(root, 1),
        # The 'kl' feature (learner/features.py) has its state from the
        # start; the RL phase's others are added by `start_rl`.
        features=types.FeatureStates(kl=jnp.float32(config.rl.kl_coef)),
    )

  if mesh.size == 1 or hf_path:
    state = init()
    return graphdef, jax.device_put(state, sharding.tree_shardings(state, mesh))
  state, _ = sharding.init_sharded(init, mesh)
  return graphdef, state


def _rl_transition(config):
  """Pure state -> state of `start_rl` (new reference, fresh RL optimizer)."""
  tx = learner.make_optimizer(config.rl)

  def fn(state):
    opt_state = tx.init(state.params)
    if isinstance(opt_state, mixed_precision.MasterWeightsState) and isinstance(
        state.opt_state, mixed_precision.MasterWeightsState
    ):
      # bf16 params: the RL phase continues from the SFT phase's float32
      # master (its progress below bf16 resolution), with fresh moments.
      opt_state = opt_state._replace(master=state.opt_state.master)
    return learner.init_rl_extras(
        config,
        state.replace(
            ref_params=lora_lib.reference_state(state.params),
            opt_state=opt_state,
        ),
    )

  return fn


def start_rl(config, state: types.TrainState) -> types.TrainState:
  """Phase transition: freeze the SFT policy as reference, fresh RL optimizer
  (plus the RL features' states, `learner.init_rl_extras`: replay buffer,
  dual coefficient, FlowRL log Z, SPA head, as the config enables them).

  Runs jitted with output shardings from the partition rules on the mesh the
  state lives on, so the new optimizer state is created sharded.
  """
  fn = _rl_transition(config)
  mesh = sharding.mesh_of(state.params)
  if mesh is None:  # a state built by hand on one device
    return fn(state)
  out = sharding.tree_shardings(jax.eval_shape(fn, state), mesh)
  return jax.jit(fn, out_shardings=out)(state)


def tool_productivity(correct: np.ndarray, calls: np.ndarray) -> float:
  """Correct answers per tool call over a set (OTC-PO, arXiv:2504.14870).

  Args:
    correct: [B] bool, whether each episode's answer is correct.
    calls: [B] number of tool calls of each episode.

  Returns:
    sum(correct) / sum(calls) as a Python float, or NaN when the set has no
    call at all (dividing by max(calls, 1) instead would report a tool-free
    policy's correct answers as "per call"; eval_report.json writes the NaN
    as null).
  """
  total = float(np.sum(calls))
  return float(np.sum(correct)) / total if total > 0 else float("nan")


def evaluate(
    config, env, graphdef, params, model_cfg, *, share_prefill: bool = True
) -> dict[str, float]:
  """Held-out evaluation on `config.eval.num_tasks` fixed tasks.

  Greedy decoding (temperature 0) gives accuracy (overall, easy, hard), tool calls
  per episode, tool productivity (correct answers per tool call, summed over the
  set; Wang et al., OTC, arXiv:2504.14870; NaN when the set has no call),
  format-error rate (malformed answer or
  tool call, or no answer). `eval.num_samples` samples per task at
  `eval.temperature` give pass@k (unbiased estimator, arXiv:2107.03374).

  The greedy and the sampled passes run over the same tasks with the same
  policy: for a JAX-native environment the prompts are reset and prefilled
  once (`rollout.initial_state_jit`) and every pass starts from that carry
  (`share_prefill`, with `eval.num_samples` > 0; False prefills in every
  pass, as before). The report is the same either way (tests/test_train.py);
  host environments always prefill per pass.

  Returns:
    dict of python floats.
  """
  ec = config.eval
  tasks = env.eval_tasks(ec.num_tasks, ec.seed)
  if not host_base.is_host(env):
    tasks = sharding.put_batch(tasks)
  key = jax.random.PRNGKey(ec.seed)
  policy = dict(
      max_len=config.max_len,
      graphdef=graphdef,
      params=params,
      model_config=model_cfg,
  )
  # Host environments (env.is_host) run through the host driver.
  run = host_rollout.rollout if host_base.is_host(env) else rollout.rollout_jit
  start = {}
  if share_prefill and ec.num_samples > 0 and not host_base.is_host(env):
    start["init"] = rollout.initial_state_jit(env, tasks, **policy)
  traj = run(env, tasks, key, **policy, **start, temperature=jnp.float32(0.0))
  traj = sharding.to_host(traj)  # all rows, also when sharded over processes
  facts = traj.facts
  finish = np.asarray(traj.finish)
  correct = np.asarray(facts["correct"], bool)
  hard = np.asarray(facts["hard"], bool)
  calls = np.asarray(facts["num_tool_calls"], np.float64)
  errors = np.asarray(facts["num_tool_errors"])
  malformed = (finish != types.ANSWERED) | (errors > 0)
  out = {
      "accuracy": float(correct.mean()),
      "accuracy_easy": float(correct[~hard].mean())
      if (~hard).any()
      else float("nan"),
      "accuracy_hard": float(correct[hard].mean())
      if hard.any()
      else float("nan"),
      "tool_calls": float(calls.mean()),
      "tool_calls_easy": float(calls[~hard].mean())
      if (~hard).any()
      else float("nan"),
      "tool_calls_hard": float(calls[hard].mean())
      if hard.any()
      else float("nan"),
      "tool_productivity": tool_productivity(correct, calls),
      "format_error_rate": float(malformed.mean()),
      "response_tokens": float(
          np.mean(np.sum(np.asarray(traj.role) == types.POLICY, 1))
      ),
  }
  n = ec.num_samples
  if n > 0:
    # n passes over the task set with the same compiled program (same shapes).
    c = np.zeros((ec.num_tasks,), np.int64)
    for i in range(n):
      straj = run(
          env,
          tasks,
          jax.random.fold_in(key, i + 1),
          **policy,
          **start,
          temperature=jnp.float32(ec.temperature),
      )
      c += np.asarray(sharding.to_host(straj.facts["correct"]), np.int64)
    out["sample_accuracy"] = float(c.mean() / n)
    for k in ec.pass_k:
      out[f"pass@{k}"] = float(metrics_lib.pass_at_k(n, c, k).mean())
  return out


def _reference(state: types.TrainState):
  """Full parameters of the reference (SFT) model (lora.reference_params)."""
  return lora_lib.reference_params(state.params, state.ref_params)


def train_and_evaluate(
    config: ml_collections.ConfigDict, workdir: str, devices_note: str = ""
) -> dict | None:
  """Runs (or resumes) SFT then GRPO then the held-out evaluation.

  Args:
    config: experiment config (configs/*.py); validated before any work.
    workdir: output folder; an existing checkpoint there is resumed.
    devices_note: why the process has its XLA CPU device count (main.py's
      `sharding.cpu_device_count` reason), appended to the mesh's log line
      on the CPU.

  Returns:
    {'sft': eval metrics, 'rl': eval metrics} (plus 'initial' first when
    eval_initial.json was written), or None if the run was halted
    early by `config.halt_after_step` (used by the resume test).

  Raises:
    ValueError: invalid config (names the field and value); a workdir that
      is not writable or is locked by another run; processes of a
      multi-process run started with different configs
      (validation.ConfigError).
    checkpoint.CheckpointError: a checkpoint save failed (e.g. a full disk),
      or checkpoints exist but none passes its checksums.
    FloatingPointError: a non-finite loss (names the step and metric).
  """
  config = schema.with_defaults(config)  # what the config leaves out
  if sharding.maybe_initialize_distributed(config):  # before any backend use
    # Every process must run the same experiment (before any work).
    check_same_config_on_all_processes(config)
  validation.validate_config(config)
  mesh = sharding.make_mesh(config.mesh)
  platform = mesh.devices.flat[0].platform
  logging.info(
      "mesh: %s over %d %s device%s%s",
      ", ".join(f"{k} {v}" for k, v in mesh.shape.items()),
      mesh.size,
      platform,
      "" if mesh.size == 1 else "s",
      f" ({devices_note})" if devices_note and platform == "cpu" else "",
  )
  # One run per workdir at a time (WORKDIR/.lock, held until this returns).
  with workdir_lock.workdir_lock(workdir), jax.set_mesh(mesh):
    return _train_and_evaluate(config, workdir, mesh)


class Setup(NamedTuple):
  """What a run builds before its loop (`setup`).

  Attributes:
    env: the environment (`make_env`).
    model_cfg: the policy's TransformerConfig (`make_model_config`).
    graphdef: the policy's nnx GraphDef.
    state: the TrainState at step 0 on the mesh (`init_state`), holding the
      frozen reward model's params when `rl.reward_model_dir` is set.
    reward_model: that frozen reward model
      (`reward_model_loader.load_rl_reward_model`), or None.
  """

  env: Any
  model_cfg: transformer.TransformerConfig
  graphdef: nnx.GraphDef
  state: types.TrainState
  reward_model: Any


def setup(config, mesh) -> Setup:
  """Environment, model config and the step-0 state of a run on `mesh`."""
  env = make_env(config)
  model_cfg = make_model_config(config)
  graphdef, state = init_state(config, model_cfg, mesh)
  reward_model = None
  if config.rl.reward_model_dir:
    # Frozen learned reward model: carried in the state (and its
    # checkpoints) from step 0, scored inside the jitted RL step.
    reward_model, rm_params = reward_model_loader.load_rl_reward_model(config)
    state = state.replace(
        reward_model=jax.device_put(
            rm_params, sharding.tree_shardings(rm_params, mesh)
        )
    )
  return Setup(env, model_cfg, graphdef, state, reward_model)


def make_steps(
    config, run: Setup, mesh
) -> tuple[learner.StepFn, learner.StepFn]:
  """The SFT and RL step functions of a run (`learner.make_sft_step`,
  `learner.make_rl_step`), each jitted with the shardings of its phase's
  state on `mesh` (the RL state's: `start_rl`'s structure). The one
  construction of the steps: also experiments/hlo_identity.py's."""
  sft_step = learner.make_sft_step(
      config,
      run.env,
      run.graphdef,
      learner.make_optimizer(config.sft),
      state_sharding=sharding.tree_shardings(run.state, mesh),
  )
  rl_sharding = sharding.tree_shardings(
      jax.eval_shape(_rl_transition(config), run.state), mesh
  )
  rl_step = learner.make_rl_step(
      config,
      run.env,
      run.graphdef,
      learner.make_optimizer(config.rl),
      run.model_cfg,
      state_sharding=rl_sharding,
      reward_model=run.reward_model,
  )
  return sft_step, rl_step


def make_phases(config, sft_step, rl_step) -> tuple[loop.Phase, loop.Phase]:
  """SFT (`sft.steps`, logged every `log_every_steps`), then RL (`rl.steps`,
  every `rl.log_every_steps`), entered by `start_rl`."""
  return (
      loop.Phase("sft", config.sft.steps, sft_step, config.log_every_steps),
      loop.Phase(
          "rl",
          config.rl.steps,
          rl_step,
          config.rl.log_every_steps,
          enter=functools.partial(start_rl, config),
          restructures=True,
      ),
  )


def _train_and_evaluate(config, workdir: str, mesh) -> dict | None:
  workdir = os.path.abspath(workdir)
  # Of a multi-process run, process 0 writes the files and prints the
  # reports; checkpoints are written by all processes together (orbax).
  primary = sharding.is_primary()
  _check_resume_compatible(config, workdir)
  os.makedirs(workdir, exist_ok=True)
  if primary:
    _write_text(
        os.path.join(workdir, "config.json"),
        config.to_json_best_effort(indent=2),
    )

  run = setup(config, mesh)
  env, model_cfg, graphdef, state, _ = run
  sft_steps, rl_steps = config.sft.steps, config.rl.steps
  total = sft_steps + rl_steps
  logging.info("policy parameters: %d", transformer.count_params(state.params))
  if model_cfg.lora is not None:
    logging.info(
        "LoRA %s: %d trainable parameters (adapters and scalar heads) of %d",
        model_cfg.lora,
        *lora_lib.count(state.params),
    )

  ckpt = checkpoint_lib.Checkpointer(
      os.path.join(workdir, "checkpoints"),
      max_to_keep=config.checkpoint.max_to_keep,
      save_interval_steps=config.checkpoint.every_steps,
  )
  if model_cfg.lora is not None:
    _check_lora_base(config, ckpt.directory, state.params)

  def restore(like, step):
    restored = _restore(ckpt, like, step, model_cfg)
    position = ckpt.restore_data_position(step)
    if position is not None and hasattr(env, "set_position"):
      env.set_position(position)  # the task loader continues where it was
    return restored

  checkpoints = loop.Checkpoints(
      ckpt,
      restore,
      to_save=_to_save,
      data_position=lambda: _data_position(env),
  )
  phases = make_phases(config, *make_steps(config, run, mesh))
  # The latest intact checkpoint (damaged newer ones: one warning, set
  # aside), restored into start_rl's structure when it is past SFT.
  state, _ = loop.resume(state, phases, checkpoints)
  start = int(state.step)

  sft_eval_path = os.path.join(workdir, "eval_sft.json")
  initial_eval_path = os.path.join(workdir, "eval_initial.json")
  # Which evaluations are still to run: process 0's view of the files, so
  # that every process runs the same (collective) evaluations.
  have_initial, have_sft = (
      bool(x)
      for x in sharding.from_primary(
          np.array(
              [os.path.exists(initial_eval_path), os.path.exists(sft_eval_path)]
          )
      )
  )
  initial_report = sft_report = None  # evaluations run by this process
  if config.eval.initial and sft_steps > 0 and not have_initial:
    # The weights before SFT (e.g. an imported checkpoint's zero-shot score);
    # with sft.steps = 0 the SFT evaluation already is this one.
    if start == 0:
      logging.info("evaluating the initial weights on the held-out set...")
      initial_report = evaluate(config, env, graphdef, state.params, model_cfg)
      if primary:
        _write_json(initial_eval_path, initial_report)
      have_initial = True
    else:
      logging.warning(
          "eval.initial: resumed at step %d without %s; the initial "
          "weights are gone, so that column is left out",
          start,
          initial_eval_path,
      )
  writer = metrics_lib.MetricsWriter(
      workdir, resume_step=start, enabled=primary
  )
  bar = metrics_lib.ProgressBar(
      total=total,
      initial=start,
      desc=config.name,
      keys=("loss", "reward", "accuracy", "tool_calls", "kl"),
      phase_ends=(sft_steps,),
      eval_steps=(sft_steps, total),
      disable=not primary,
  )
  metrics_log = loop.MetricsLog(writer, bar, phases)
  t0 = time.time()

  def log(step, phase, m):
    m["steps_per_sec"] = (step - start) / max(time.time() - t0, 1e-9)
    metrics_log(step, phase, m)

  def evaluate_sft(step, state):
    """The SFT model (the reference), once RL has begun."""
    nonlocal sft_report, have_sft
    if step >= sft_steps and not have_sft:
      ckpt.wait()
      bar.write("evaluating the SFT checkpoint on the held-out set...")
      with bar.evaluating():
        sft_report = evaluate(
            config, env, graphdef, _reference(state), model_cfg
        )
      if primary:
        _write_json(sft_eval_path, sft_report)
      have_sft = True

  try:
    state, halted = loop.run(
        state,
        phases,
        start=start,
        log=log,
        checkpoints=checkpoints,
        after_save=evaluate_sft,
        halt_after=config.halt_after_step,
    )
  finally:
    bar.close()
    writer.close()
    ckpt.wait()
  if halted:
    return None
  if sft_steps == total and not have_sft:
    sft_report = evaluate(config, env, graphdef, _reference(state), model_cfg)
    if primary:
      _write_json(sft_eval_path, sft_report)

  reports = {}
  if initial_report is None and have_initial:  # evaluated by an earlier run
    with open(initial_eval_path) as f:
      initial_report = json.load(f)
  if initial_report is not None:
    reports["initial"] = initial_report
  if sft_report is None:  # evaluated by an earlier run
    with open(sft_eval_path) as f:
      sft_report = json.load(f)
  reports["sft"] = sft_report
  logging.info("evaluating the final policy on the held-out set...")
  reports["rl"] = evaluate(config, env, graphdef, state.params, model_cfg)
  ckpt.close()
  if not primary:
    return reports
  metrics_lib.write_eval_report(
      workdir, reports, title=f"{config.name}: held-out evaluation"
  )
  metrics_lib.plot_learning_curves(
      workdir,
      # The environment's reward and the shaped one the advantages used
      # (rl/reward is an alias of rl/shaped_reward, kept for older runs).
      keys=(
          "sft/loss",
          "rl/env_reward",
          "rl/shaped_reward",
          "rl/accuracy",
          "rl/tool_calls",
          "rl/kl",
      ),
      held_out=metrics_lib.held_out_points(
          reports, {"initial": 0, "sft": sft_steps, "rl": total}
      ),
      held_out_key="rl/accuracy",
  )
  print(metrics_lib.format_eval_table(reports))
  return reports


def _to_save(state: types.TrainState) -> types.TrainState:
  """What a checkpoint holds: with LoRA, the params are the trainable subtree
  only (adapters, scalar heads); the frozen base is named by lora_base.json."""
  if not lora_lib.has_adapters(state.params):
    return state
  return state.replace(params=lora_lib.trainable(state.params))


def _restore(
    ckpt, state: types.TrainState, step: int, model_cfg
) -> types.TrainState:
  """Restores checkpoint `step` into `state`'s structure; with LoRA the saved
  adapters are put back onto `state`'s (freshly built, fingerprinted) base.
  Checkpoints of the layout before `TrainState.features` restore too
  (`learner.restore_train_state`)."""
  if model_cfg.lora is None:
    return learner.restore_train_state(ckpt, state, step=step)
  restored = learner.restore_train_state(ckpt, _to_save(state), step=step)
  return restored.replace(
      params=lora_lib.with_trainable(state.params, restored.params)
  )


_LORA_BASE = "lora_base.json"


def _check_lora_base(config, directory: str, params) -> None:
  """Names the frozen base of a LoRA run in `directory`/lora_base.json (the
  checkpoints there hold adapters only), or checks that a resumed run's base
  is the one its adapters were trained on.

  Raises:
    validation.ConfigError: the base's fingerprint differs.
  """
  info = {
      "hf_path": config.model.hf_path,
      "seed": config.seed,
      "sha256": lora_lib.base_fingerprint(params),
      "lora": dataclasses.asdict(lora_lib.from_config(config.model.lora)),
  }
  path = os.path.join(directory, _LORA_BASE)
  if os.path.exists(path):
    with open(path) as f:
      old = json.load(f)
    if old.get("sha256") != info["sha256"]:
      raise validation.ConfigError(
          f"{path}: the checkpoints' adapters were trained on base "
          f"{old.get('hf_path') or 'random init'} sha256={old.get('sha256')}; "
          f"this run's base has sha256={info['sha256']}"
      )
    return
  if sharding.is_primary():
    os.makedirs(directory, exist_ok=True)
    _write_json(path, info)


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
  out = {}
  for k, v in d.items():
    if isinstance(v, dict):
      out.update(_flatten(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = list(v) if isinstance(v, tuple) else v
  return out


# Fields that may change when a run is resumed (extending training, changing the
# evaluation, logging or the device mesh, or the gradient-accumulation split,
# which leaves the update unchanged: e.g. resume an OOM-killed run with more
# microbatches; workdirs written before sft.num_microbatches existed also
# resume; or the shared prompt's length, which changes only float summation
# order: e.g. resume after a mismatch stop with a shorter one); any other
# change is refused.
_RESUMABLE_CHANGES = (
    "rl.steps",
    "eval.",
    "log_every_steps",
    "checkpoint.",
    "halt_after_step",
    "name",
    "mesh.",
    "sft.num_microbatches",
    "rl.num_microbatches",
    "rl.shared_prefix_len",
    "rl.log_every_steps",
)


# Fields that differ between the processes of one run: left out when their
# configs are compared, and on resume.
_PER_PROCESS = ("mesh.process_id",)
# Also left out on resume: where this launch's coordinator listens (the
# launcher picks a free port each time); it changes nothing in the run.
_PER_LAUNCH = _PER_PROCESS + ("mesh.coordinator_address",)


def _comparable(
    config_json: str, left_out: tuple[str, ...] = _PER_PROCESS
) -> dict[str, Any]:
  """Flat {dotted field: value} of a config's JSON, without `left_out`."""
  flat = _flatten(json.loads(config_json))
  return {k: v for k, v in flat.items() if k not in left_out}


def check_same_config_on_all_processes(config) -> None:
  """Refuses a multi-process run whose processes were given different configs.

  Every process sends its config (as JSON, without mesh.process_id) to all
  others (`sharding.allgather_bytes`, a collective right after
  `jax.distributed.initialize`), and each compares them with process 0's, so
  every process raises the same error before any work. On one process it
  does nothing.

  Raises:
    validation.ConfigError: naming each process whose config differs from
      process 0's and its first differing fields (this process's and process
      0's values).
  """
  if jax.process_count() == 1:
    return
  own = json.dumps(_comparable(config.to_json_best_effort()), sort_keys=True)
  configs = [json.loads(b) for b in sharding.allgather_bytes(own.encode())]
  ref, problems = configs[0], []
  for i, other in enumerate(configs[1:], start=1):
    diff = sorted(
        k for k in set(ref) | set(other) if ref.get(k) != other.get(k)
    )
    if diff:
      shown = ", ".join(
          f"config.{k}={other.get(k)!r} (process 0: {ref.get(k)!r})"
          for k in diff[:5]
      )
      more = f" and {len(diff) - 5} more" if len(diff) > 5 else ""
      problems.append(f"process {i} has {shown}{more}")
  if problems:
    raise validation.ConfigError(
        f"the {len(configs)} processes of this run were started with different "
        f"configs: {'; '.join(problems)}. Start every process with the same "
        "config (only mesh.process_id may differ)"
    )


def _check_resume_compatible(config, workdir: str) -> None:
  """Compares the config with the one saved in an existing workdir.

  Resuming a run with different training settings would silently switch the
  algorithm mid-run (or do nothing on a finished run while the workdir claims the
  new settings), so only the fields in _RESUMABLE_CHANGES may differ.

  Raises:
    ValueError: naming every differing field with its old and new value.
  """
  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path):
    return
  with open(path) as f:
    # Fields added to the schema since that run get their defaults.
    old = _comparable(
        schema.with_defaults(
            ml_collections.ConfigDict(json.load(f))
        ).to_json_best_effort(),
        _PER_LAUNCH,
    )
  # mesh.process_id is left out: process 0 wrote the file, and every process
  # of a multi-process run reads it.
  new = _comparable(config.to_json_best_effort(), _PER_LAUNCH)
  diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
  refused = [k for k in diff if not k.startswith(_RESUMABLE_CHANGES)]
  if refused:
    changes = "; ".join(
        f"config.{k}={new.get(k)!r} (was {old.get(k)!r})" for k in refused
    )
    raise validation.ConfigError(
        f"workdir {workdir} holds a run with a different config: {changes}. "
        "Resuming it would mix two experiments; use a new --workdir."
    )
  if diff:
    logging.warning(
        "resuming %s with changed fields: %s",
        workdir,
        ", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in diff),
    )


def _write_text(path: str, text: str) -> None:
  """Writes `path` through `path.tmp` and a rename: readers (e.g. the other
  processes of a run, checking config.json) see the old or the new file."""
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    f.write(text)
  os.replace(tmp, path)


def _write_json(path: str, obj: Any) -> None:
  _write_text(path, json.dumps(obj, indent=2))
