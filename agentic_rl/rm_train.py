"""The `rm` mode of main.py: SFT policy -> preference data -> ORM and PRM -> evaluation.

`train_and_evaluate_rm(config, workdir)` runs, with exact resume from one orbax
checkpoint of the whole state (global step: SFT steps [0, S), outcome-RM steps
[S, S + R), process-RM steps [S + R, S + 2R)):

  1. SFT of the policy on expert demonstrations (learner.make_sft_step, as in the
     main job); the policy samples the best-of-N episodes and initialises both
     reward models' trunks (Ouyang et al., arXiv:2203.02155) when
     rm.init_from_sft.
  2. Preference pairs from environment ground truth (agentic_rl/preference_data.py),
     written once to `preferences.jsonl` (re-read on resume).
  3. The outcome RM (Bradley-Terry + optional regression) and the process RM (BCE
     on per-turn labels), each rm.steps steps of rm.batch_size pairs.
  4. Evaluation: held-out pairwise accuracy overall / by negative type / by the
     rejected episode's number of turns; best-of-N rank@1 among rm_eval.num_samples
     SFT-policy samples on rm_eval.num_tasks fixed tasks.

Workdir: config.json, checkpoints/, metrics.jsonl + tensorboard/, preferences.jsonl,
rm_report.{json,md}, rm_report.png. Re-running on a finished workdir (final
checkpoint and rm_report.json present) returns the saved report and writes nothing.

Use inside RL: an RL config names a finished rm-mode workdir in
`rl.reward_model_dir` and which of its two models to use in
`rl.reward_model_kind`; validation.py checks it, agentic_rl/reward_model_loader.py
loads it frozen into TrainState.reward_model (the checkpoint layout written here
is defined there), and the RL step scores every rollout with it.
"""

from __future__ import annotations

import collections
import json
import os
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging

from agentic_rl import checkpoint as checkpoint_lib
from agentic_rl import learner
from agentic_rl import loop
from agentic_rl import metrics as metrics_lib
from agentic_rl import preference_data
from agentic_rl import reward_model_loader
from agentic_rl.reward_models import model as rm_model
from agentic_rl.reward_models import training as rm_training
from agentic_rl import rollout
from agentic_rl import types
from agentic_rl import validation
from configs import schema
import environments

PREFERENCES_FILE = "preferences.jsonl"
REPORT_FILE = "rm_report.json"


def _fail(field: str, value: Any, why: str):
  raise validation.ConfigError(f"config.{field}={value!r}: {why}")


def validate_rm_config(config: ml_collections.ConfigDict) -> None:
  """Checks the fields of an rm-mode config.

  Raises:
    ConfigError (a ValueError) naming the first bad field and its value.
  """
  validation.check_known_fields(config)
  if config.mesh.distributed:
    _fail(
        "mesh.distributed",
        True,
        "reward-model training (mode 'rm') runs in one process; multi-process "
        "runs are mode 'rl' (train.py)",
    )
  if config.env.name not in environments.REGISTRY:
    _fail(
        "env.name",
        config.env.name,
        f"unknown environment; known: {tuple(environments.REGISTRY)}",
    )
  if config.model.lora.rank:
    # The reward heads ('head' hidden_dd / bias_d) would be frozen with the base.
    _fail(
        "model.lora.rank",
        config.model.lora.rank,
        "LoRA adapters are for the policy (mode 'rl'); use 0 in mode 'rm'",
    )
  try:
    env = environments.make(config.env)
  except (TypeError, ValueError) as e:
    raise validation.ConfigError(f"config.env: {e}") from None
  for f in (
      "model.d_model",
      "model.num_layers",
      "model.num_heads",
      "model.head_dim",
      "model.ffn_dim",
      "max_len",
      "sft.batch_size",
      "sft.num_microbatches",
      "sft.length_buckets",
      "rm.steps",
      "rm.batch_size",
      "rm.num_train_tasks",
      "rm.num_test_tasks",
      "rm.data_chunk",
      "rm_eval.num_tasks",
      "rm_eval.num_samples",
      "log_every_steps",
      "checkpoint.every_steps",
      "checkpoint.max_to_keep",
  ):
    validation._positive_int(config, f)
  validation._positive_int(config, "sft.steps", allow_zero=True)
  validation.check_sft_bucket_lengths(config)
  if config.sft.batch_size % config.sft.num_microbatches:
    _fail(
        "sft.num_microbatches",
        config.sft.num_microbatches,
        f"must divide sft.batch_size={config.sft.batch_size}",
    )
  rm = config.rm
  if rm.head_layers not in (1, 2):
    _fail("rm.head_layers", rm.head_layers, "must be 1 or 2")
  if rm.prm_aggregation not in rm_model.PRM_AGGREGATIONS:
    _fail(
        "rm.prm_aggregation",
        rm.prm_aggregation,
        f"must be one of {rm_model.PRM_AGGREGATIONS}",
    )
  for f in (
      "learning_rate",
      "bt_coef",
      "regression_coef",
      "margin",
      "max_grad_norm",
  ):
    v = rm[f]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
      _fail(f"rm.{f}", v, "must be a number >= 0")
  if rm.learning_rate <= 0:
    _fail("rm.learning_rate", rm.learning_rate, "must be > 0")
  if rm.bt_coef == 0 and rm.regression_coef == 0:
    _fail(
        "rm.bt_coef",
        rm.bt_coef,
        "bt_coef and regression_coef are both 0 (no loss)",
    )
  for kind, overrides in dict(rm.imperfect).items():
    if kind not in preference_data.NEGATIVE_TYPES:
      _fail(
          f"rm.imperfect.{kind}",
          dict(overrides),
          f"unknown negative type; known: {preference_data.NEGATIVE_TYPES}",
      )
    for name in dict(overrides):
      if not hasattr(env, name):
        _fail(
            f"rm.imperfect.{kind}.{name}",
            overrides[name],
            f"the {config.env.name} environment has no field {name!r}",
        )
  if config.rm_eval.temperature < 0:
    _fail("rm_eval.temperature", config.rm_eval.temperature, "must be >= 0")


def _pairs(config, env, workdir) -> list[dict]:
  path = os.path.join(workdir, PREFERENCES_FILE)
  if os.path.exists(path):
    return preference_data.read_jsonl(path)
  rm = config.rm
  recs = preference_data.build_dataset(
      env,
      num_train_tasks=rm.num_train_tasks,
      num_test_tasks=rm.num_test_tasks,
      seed=config.seed,
      max_len=config.max_len,
      imperfect={k: dict(v) for k, v in dict(rm.imperfect).items()},
      chunk=rm.data_chunk,
  )
  preference_data.write_jsonl(path, recs)
  return recs


def _score_all(score_fn, params, batch, bs: int) -> np.ndarray:
  """Scores a numpy EpisodeBatch in fixed-size chunks (one compile)."""
  n = batch.tokens.shape[0]
  out = []
  for i in range(0, n, bs):
    sl = jax.tree.map(lambda x: x[i : i + bs], batch)
    m = sl.tokens.shape[0]
    if m < bs:
      sl = jax.tree.map(
          lambda x: np.concatenate([x, np.repeat(x[:1], bs - m, 0)]), sl
      )
    out.append(np.asarray(score_fn(params, sl))[:m])
  return np.concatenate(out) if out else np.zeros((0,), np.float32)


def _pair_report(sc: np.ndarray, sr: np.ndarray, pairs: list[dict]) -> dict:
  win = np.where(sc > sr, 1.0, np.where(sc == sr, 0.5, 0.0))
  out = {
      "overall": float(win.mean()) if len(win) else float("nan"),
      "n": len(win),
  }
  by_type = collections.defaultdict(list)
  by_len = collections.defaultdict(list)
  for w, p in zip(win, pairs):
    by_type[p["type"]].append(w)
    by_len[str(p["rejected"]["num_turns"])].append(w)
  out["by_type"] = {
      k: {"accuracy": float(np.mean(v)), "n": len(v)}
      for k, v in sorted(by_type.items())
  }
  out["by_rejected_turns"] = {
      k: {"accuracy": float(np.mean(v)), "n": len(v)}
      for k, v in sorted(by_len.items())
  }
  return out


def evaluate_rms(config, env, pgraph, rgraph, state, pairs, model_cfg) -> dict:
  """Held-out pairwise accuracy and best-of-N selection for the ORM and the PRM."""
  k = env.max_turns
  bs = config.rm.batch_size
  test = [p for p in pairs if p["split"] == "test"]
  train = [p for p in pairs if p["split"] == "train"]
  report: dict[str, Any] = {
      "num_pairs": {"train": len(train), "test": len(test)}
  }
  scorers = {
      "orm": (rm_model.make_score_fn(rgraph, "outcome"), state["orm"]),
      "prm": (
          rm_model.make_score_fn(rgraph, "process", config.rm.prm_aggregation),
          state["prm"],
      ),
  }
  tb = preference_data.pairs_to_batch(test, config.max_len, k)
  for name, (fn, params) in scorers.items():
    sc = _score_all(fn, params, tb.chosen, bs)
    sr = _score_all(fn, params, tb.rejected, bs)
    report[f"{name}_pairwise"] = _pair_report(sc, sr, test)
  # Best-of-N among SFT-policy samples.
  ec = config.rm_eval
  tasks = env.eval_tasks(ec.num_tasks, ec.seed)
  rep = jax.tree.map(lambda x: jnp.repeat(x, ec.num_samples, axis=0), tasks)
  traj = jax.device_get(
      rollout.rollout_jit(
          env,
          rep,
          jax.random.PRNGKey(ec.seed),
          max_len=config.max_len,
          graphdef=pgraph,
          params=state["policy"].params,
          model_config=model_cfg,
          temperature=jnp.float32(ec.temperature),
      )
  )
  eb = preference_data.trajectory_to_batch(traj, k)
  correct_tn = np.asarray(traj.facts["correct"], bool).reshape(
      ec.num_tasks, ec.num_samples
  )
  calls = np.asarray(traj.facts["num_tool_calls"]).reshape(
      ec.num_tasks, ec.num_samples
  )
  hard = np.asarray(traj.facts["hard"], bool).reshape(
      ec.num_tasks, ec.num_samples
  )[:, 0]
  answered = (np.asarray(traj.finish) == types.ANSWERED).reshape(
      ec.num_tasks, ec.num_samples
  )
  bon = {}
  for name, (fn, params) in scorers.items():
    s_tn = _score_all(fn, params, eb, bs).reshape(ec.num_tasks, ec.num_samples)
    res = {
        kk: float(v)
        for kk, v in rm_training.best_of_n(s_tn, correct_tn).items()
    }
    pick = np.argmax(s_tn, axis=1)
    res["rank1_tool_calls"] = float(
        np.take_along_axis(calls, pick[:, None], 1).mean()
    )
    for sub, m in (("hard", hard), ("easy", ~hard)):
      if m.any():
        sub_res = rm_training.best_of_n(s_tn[m], correct_tn[m])
        for key in ("rank1_accuracy", "random_accuracy", "oracle_accuracy"):
          res[f"{key}_{sub}"] = float(sub_res[key])
        pk = pick[m][:, None]
        # Diagnostics: is the pick a well-formed answer, and did it call the tool?
        res[f"rank1_answered_{sub}"] = float(
            np.take_along_axis(answered[m], pk, 1).mean()
        )
        res[f"answered_{sub}"] = float(answered[m].mean())
        res[f"rank1_tool_calls_{sub}"] = float(
            np.take_along_axis(calls[m], pk, 1).mean()
        )
        res[f"tool_calls_{sub}"] = float(calls[m].mean())
    bon[name] = res
  bon["num_tasks"], bon["num_samples"] = ec.num_tasks, ec.num_samples
  bon["mean_correct_per_task"] = float(correct_tn.sum(1).mean())
  report["best_of_n"] = bon
  return report


def _write_report(workdir: str, config, report: dict) -> None:
  with open(os.path.join(workdir, "rm_report.json"), "w") as f:
    json.dump(report, f, indent=2)
  bon = report["best_of_n"]
  lines = [
      f"# {config.name}: reward models",
      "",
      f"Pairs: {report['num_pairs']['train']} train, "
      f"{report['num_pairs']['test']} held-out (tasks not in train).",
      "",
      "## Held-out pairwise accuracy",
      "",
      "| negative type | n | ORM | PRM |",
      "|---|---|---|---|",
  ]
  o, p = report["orm_pairwise"], report["prm_pairwise"]
  for t in o["by_type"]:
    lines.append(
        f"| {t} | {o['by_type'][t]['n']} | {o['by_type'][t]['accuracy']:.3f} "
        f"| {p['by_type'][t]['accuracy']:.3f} |"
    )
  lines.append(
      f"| **overall** | {o['n']} | {o['overall']:.3f} | {p['overall']:.3f} |"
  )
  lines += [
      "",
      "| rejected episode turns | n | ORM | PRM |",
      "|---|---|---|---|",
  ]
  for t in o["by_rejected_turns"]:
    lines.append(
        f"| {t} | {o['by_rejected_turns'][t]['n']} | "
        f"{o['by_rejected_turns'][t]['accuracy']:.3f} | "
        f"{p['by_rejected_turns'][t]['accuracy']:.3f} |"
    )
  lines += [
      "",
      f"## Best-of-{bon['num_samples']} on {bon['num_tasks']} held-out tasks "
      "(SFT policy samples)",
      "",
      "| | ORM | PRM |",
      "|---|---|---|",
  ]
  for key in (
      "rank1_accuracy",
      "random_accuracy",
      "oracle_accuracy",
      "rank1_accuracy_easy",
      "random_accuracy_easy",
      "oracle_accuracy_easy",
      "rank1_accuracy_hard",
      "random_accuracy_hard",
      "oracle_accuracy_hard",
      "rank1_tool_calls",
      "rank1_answered_easy",
      "answered_easy",
      "rank1_tool_calls_easy",
      "tool_calls_easy",
      "rank1_answered_hard",
      "answered_hard",
      "rank1_tool_calls_hard",
      "tool_calls_hard",
  ):
    if key in bon["orm"]:
      lines.append(f"| {key} | {bon['orm'][key]:.3f} | {bon['prm'][key]:.3f} |")
  with open(os.path.join(workdir, "rm_report.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

    types_ = list(o["by_type"]) + ["overall"]
    ov = [o["by_type"][t]["accuracy"] for t in o["by_type"]] + [o["overall"]]
    pv = [p["by_type"][t]["accuracy"] for t in p["by_type"]] + [p["overall"]]
    fig, axes = plt.subplots(
        1, 2, figsize=(11, 3.6), gridspec_kw={"width_ratios": [3, 1]}
    )
    x = np.arange(len(types_))
    axes[0].bar(x - 0.2, ov, 0.4, label="ORM")
    axes[0].bar(x + 0.2, pv, 0.4, label="PRM")
    axes[0].set_xticks(x, types_, rotation=20, fontsize=8)
    axes[0].axhline(0.5, color="k", lw=0.8, ls="--")
    axes[0].set_ylim(0, 1.05)
    axes[0].set_title("held-out pairwise accuracy")
    axes[0].legend()
    names = ["random", "ORM", "PRM", "oracle"]
    vals = [
        bon["orm"]["random_accuracy"],
        bon["orm"]["rank1_accuracy"],
        bon["prm"]["rank1_accuracy"],
        bon["orm"]["oracle_accuracy"],
    ]
    axes[1].bar(names, vals, color=["gray", "C0", "C1", "k"])
    axes[1].set_ylim(0, 1.05)
    axes[1].set_title(f"best-of-{bon['num_samples']} rank@1")
    fig.tight_layout()
    fig.savefig(os.path.join(workdir, "rm_report.png"), dpi=100)
    plt.close(fig)
  except ImportError:  # matplotlib is optional for the report
    logging.warning("matplotlib missing: no rm_report.png")


def make_steps(
    config, env, pgraph, rgraph, train_pairs: list[dict], train_batch
) -> tuple[learner.StepFn, learner.StepFn, learner.StepFn]:
  """The rm mode's step functions on its state dict, each advancing
  `state['step']`: the policy's SFT step (`learner.make_sft_step` on
  state['policy']), then the ORM's and the PRM's training steps
  (`reward_models.training.make_train_step`) on rm.batch_size pairs of
  `train_batch` drawn by numpy's default_rng([seed, global step])."""
  sft = learner.make_sft_step(
      config, env, pgraph, learner.make_optimizer(config.sft)
  )
  tx = learner.make_optimizer(config.rm)
  kw = dict(
      bt_coef=config.rm.bt_coef,
      regression_coef=config.rm.regression_coef,
      aggregation=config.rm.prm_aggregation,
  )

  def sft_step(state):
    step = int(state["step"])
    policy, m = sft(state["policy"])
    return dict(state, policy=policy, step=jnp.int32(step + 1)), m

  def rm_step(name, kind):
    train_step = rm_training.make_train_step(rgraph, tx, kind=kind, **kw)

    def step_fn(state):
      step = int(state["step"])
      rng = np.random.default_rng([config.seed, step])
      idx = rng.choice(
          len(train_pairs),
          config.rm.batch_size,
          replace=len(train_pairs) < config.rm.batch_size,
      )
      batch = jax.tree.map(lambda x: x[idx], train_batch)
      params, opt, m = train_step(state[name], state[f"{name}_opt"], batch)
      new = {name: params, f"{name}_opt": opt, "step": jnp.int32(step + 1)}
      return dict(state, **new), m

    return step_fn

  return sft_step, rm_step("orm", "outcome"), rm_step("prm", "process")


def make_phases(
    config, sft_step, orm_step, prm_step
) -> tuple[loop.Phase, loop.Phase, loop.Phase]:
  """SFT (`sft.steps`), the ORM (`rm.steps`) and the PRM (`rm.steps`), all
  logged every `log_every_steps`; with `rm.init_from_sft` the ORM phase is
  entered by copying the policy's trunk into both reward models
  (`_init_from_policy`). The state's structure never changes."""
  every = config.log_every_steps
  enter = _init_from_policy if config.rm.init_from_sft else None
  return (
      loop.Phase("sft", config.sft.steps, sft_step, every),
      loop.Phase("orm", config.rm.steps, orm_step, every, enter=enter),
      loop.Phase("prm", config.rm.steps, prm_step, every),
  )


def train_and_evaluate_rm(
    config: ml_collections.ConfigDict, workdir: str
) -> dict | None:
  """Runs (or resumes) the rm mode; returns the report (None if halted early).

  A resumed run restores the newest intact checkpoint (`loop.resume`); newer
  damaged ones are moved aside with a warning. A finished run (its report
  written and that same newest intact checkpoint at the last step) returns
  the saved report without training or evaluating again.

  Raises:
    ConfigError: invalid config (names field and value).
    FloatingPointError: a non-finite loss (names the phase and step).
    checkpoint.CheckpointError: checkpoints exist but none is intact.
  """
  config = schema.with_defaults(config)  # what the config leaves out
  validate_rm_config(config)
  workdir = os.path.abspath(workdir)
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "config.json"), "w") as f:
    f.write(config.to_json_best_effort(indent=2))
  env = environments.make(config.env)
  model_cfg = reward_model_loader.model_config(config)
  pgraph, rgraph, state = reward_model_loader.init_rm_state(config, model_cfg)
  s_steps, r_steps = config.sft.steps, config.rm.steps
  total = s_steps + 2 * r_steps
  ckpt = checkpoint_lib.Checkpointer(
      os.path.join(workdir, "checkpoints"),
      max_to_keep=config.checkpoint.max_to_keep,
      save_interval_steps=config.checkpoint.every_steps,
  )
  report_path = os.path.join(workdir, REPORT_FILE)
  if ckpt.latest_intact_step() == total and os.path.exists(report_path):
    # Finished run: re-running is a no-op (no second evaluation, no duplicate
    # eval line in metrics.jsonl). The step is the one `loop.resume` would
    # restore (damaged newer checkpoints are moved aside): a damaged final
    # checkpoint means the run resumes from an earlier one and trains again.
    ckpt.close()
    logging.info(
        "%s is finished (step %d, %s): nothing to do",
        workdir,
        total,
        REPORT_FILE,
    )
    with open(report_path) as f:
      return json.load(f)
  pairs = _pairs(config, env, workdir)
  train_pairs = [p for p in pairs if p["split"] == "train"]
  if not train_pairs:
    raise validation.ConfigError(
        f"config.rm.num_train_tasks={config.rm.num_train_tasks}: no training pairs"
    )
  train_batch = preference_data.pairs_to_batch(
      train_pairs, config.max_len, env.max_turns, config.rm.margin
  )
  phases = make_phases(
      config, *make_steps(config, env, pgraph, rgraph, train_pairs, train_batch)
  )
  checkpoints = loop.Checkpoints(
      ckpt,
      lambda like, step: learner.restore_train_state(ckpt, like, step=step),
  )
  state, _ = loop.resume(state, phases, checkpoints)
  start = int(state["step"])
  writer = metrics_lib.MetricsWriter(workdir, resume_step=start)
  bar = metrics_lib.ProgressBar(
      total=total,
      initial=start,
      desc=config.name,
      keys=("loss", "pair_accuracy"),
  )
  try:
    state, halted = loop.run(
        state,
        phases,
        start=start,
        log=loop.MetricsLog(writer, bar, phases),
        checkpoints=checkpoints,
        halt_after=config.halt_after_step,
    )
  finally:
    bar.close()
    writer.close()
    ckpt.wait()
  if halted:
    return None
  ckpt.close()
  report = evaluate_rms(config, env, pgraph, rgraph, state, pairs, model_cfg)
  already = any(
      r.get("phase") == "eval" and r["step"] == total
      for r in metrics_lib.read_metrics(workdir)
  )
  if not already:  # a run killed after this line but before the report
    with metrics_lib.MetricsWriter(workdir) as w:
      flat = {
          f"{n}_pairwise_accuracy": report[f"{n}_pairwise"]["overall"]
          for n in ("orm", "prm")
      }
      flat.update(
          {
              f"{n}_rank1_accuracy": report["best_of_n"][n]["rank1_accuracy"]
              for n in ("orm", "prm")
          }
      )
      w.write(total, flat, prefix="eval")
  _write_report(workdir, config, report)
  with open(os.path.join(workdir, "rm_report.md")) as f:
    print(f.read())
  return report


def _init_from_policy(state: dict) -> dict:
  """Copies the policy's trunk weights into both reward models (heads untouched)."""
  pol = state["policy"].params
  return dict(
      state,
      orm=dict(
          state["orm"],
          trunk=rm_model.copy_trunk(state["orm"]["trunk"], pol),
      ),
      prm=dict(
          state["prm"],
          trunk=rm_model.copy_trunk(state["prm"]["trunk"], pol),
      ),
  )
