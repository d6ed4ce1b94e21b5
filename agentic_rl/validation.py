"""Config validation: reject bad values before any work, naming field and value."""

from __future__ import annotations

import dataclasses
import difflib
import errno
import json
import math
import os
import re
import tempfile

import jax
import ml_collections

from agentic_rl import batch_policies
from agentic_rl import estimators
from agentic_rl import losses
from agentic_rl import padding
from agentic_rl.reward_models import model as rm_model
from agentic_rl.rewards import components
from agentic_rl.rewards import factory
from agentic_rl.rewards import step_rewards
from agentic_text import tokenizers
from agentic_rl.learner import behaviour as learner_behaviour
from agentic_rl.learner import potentials_by_name
from agentic_rl.learner import token_credit
from agentic_rl.models import hf
from agentic_rl.models import lora as lora_lib
from agentic_rl.models import transformer
from agentic_rl import sharding
from configs import common
from configs import schema
import environments

KNOWN_ENVS = tuple(environments.REGISTRY)


class ConfigError(ValueError):
  """An invalid config or workdir; main.py prints it as one line (exit code 2)."""


def _fail(field: str, value, why: str):
  raise ConfigError(f"config.{field}={value!r}: {why}")


def check_sft_bucket_lengths(config) -> None:
  """`sft.bucket_lengths`: () or strictly increasing ints in [1, max_len];
  at most one of `sft.length_buckets` > 1, `sft.bucket_lengths` and
  `sft.fit_bucket` (each gives the bucket lengths).

  Raises:
    ConfigError: naming the field and its value.
  """
  if config.sft.fit_bucket and config.sft.length_buckets > 1:
    _fail(
        "sft.fit_bucket",
        True,
        f"set together with sft.length_buckets={config.sft.length_buckets}; "
        "either gives the bucket lengths: use length_buckets=1",
    )
  lengths = config.sft.bucket_lengths
  if not isinstance(lengths, (tuple, list)):
    _fail("sft.bucket_lengths", lengths, "must be a tuple of ints")
  if not tuple(lengths):
    return
  try:
    padding.explicit_lengths(tuple(lengths), config.max_len)
  except ValueError as e:  # "bucket lengths (...): why" -> "why"
    _fail("sft.bucket_lengths", tuple(lengths), str(e).split("): ", 1)[-1])
  if config.sft.fit_bucket:
    _fail(
        "sft.bucket_lengths",
        tuple(lengths),
        "set together with sft.fit_bucket=True; either gives the bucket "
        "lengths",
    )
  if config.sft.length_buckets > 1:
    _fail(
        "sft.bucket_lengths",
        tuple(lengths),
        f"set together with sft.length_buckets={config.sft.length_buckets}; "
        "either gives the bucket lengths: use length_buckets=1 with explicit "
        "lengths",
    )


def closest(name: str, known) -> str | None:
  """The entry of `known` closest to `name` (difflib ratio >= 0.6), or None."""
  close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
  return close[0] if close else None


def check_known_fields(config: ml_collections.ConfigDict) -> None:
  """Refuses fields that no code reads (typos in a forked config file) and
  values of the wrong type.

  Valid fields and their types are the schema's (configs/schema.py: the fields
  of configs/default.py, or of configs/rm_arithmetic.py when config.mode ==
  'rm'); blocks in schema.OPEN_BLOCKS are checked by their owners instead. A field the
  config leaves out is fine (`schema.with_defaults` fills it).

  Raises:
    ConfigError: one line naming the first unknown field and its value, with the
      nearest valid field (difflib) when there is one; or naming a field whose
      value has the wrong type (e.g. a string where a float is expected), with
      the expected type and the default.
  """
  mode = schema.mode_of(config)
  if mode not in schema.MODES:
    _fail("mode", mode, f"must be one of {schema.MODES}")
  reference = (
      "configs/rm_arithmetic.py" if mode == "rm" else "configs/default.py"
  )
  known = schema.fields(mode)
  paths = schema.flatten(config)
  unknown = [(p, v) for p, v in paths.items() if p not in known]
  # A sub-block that is unknown is reported, not each field inside it.
  unknown = [
      (p, v)
      for p, v in unknown
      if not any(p.startswith(q + ".") for q, _ in unknown)
  ]
  if unknown:
    path, value = unknown[0]
    parent, _, leaf = path.rpartition(".")
    block = f"config.{parent}" if parent else "config"
    near = closest(
        leaf,
        [k.rpartition(".")[2] for k in known if k.rpartition(".")[0] == parent],
    )
    shown = (
        value.to_dict()
        if isinstance(value, ml_collections.ConfigDict)
        else value
    )
    hint = (
        f"did you mean {block}.{near}?"
        if near
        else f"the fields of {block} are those {reference} sets"
    )
    more = (
        f" (also unknown: {', '.join('config.' + p for p, _ in unknown[1:])})"
        if len(unknown) > 1
        else ""
    )
    raise ConfigError(
        f"config.{path}={shown!r}: unknown field (nothing reads it); "
        + hint
        + more
    )
  for path, value in paths.items():
    field = known[path]
    why = schema.type_error(path, value, field.type)
    if why:
      shown = (
          value.to_dict()
          if isinstance(value, ml_collections.ConfigDict)
          else value
      )
      default = (
          "a block"
          if field.type is ml_collections.ConfigDict
          else repr(field.default)
      )
      _fail(path, shown, f"{why} (default {default}, {reference})")


def _positive_int(config, field: str, allow_zero: bool = False):
  value = config
  for part in field.split("."):
    value = value[part]
  if isinstance(value, bool) or not isinstance(value, int):
    _fail(field, value, "must be an integer")
  if value < 0 or (value == 0 and not allow_zero):
    _fail(field, value, "must be >= 0" if allow_zero else "must be > 0")
  return value


def _check_replacing_entry(rl, field: str, value) -> None:
  """The estimator entry that `field` selects instead of
  `rl.advantage_estimator` (`estimators.entry_for`) runs with the needs it
  declares: rl.credit 'trajectory', an advantage_estimator of its
  base_estimators, no PBRS unless it takes the potential, no replay
  injection when it needs the sampled rows."""
  name = estimators.entry_for(field)
  entry = estimators.ESTIMATORS[name]
  need = ["credit 'trajectory'"]
  need.append(f"advantage_estimator one of {list(entry.base_estimators)}")
  if not entry.takes_potential:
    need.append("pbrs_coef 0")
  if entry.needs_sampled_rows:
    need.append("replay_inject False")
  if (
      rl.credit != "trajectory"
      or rl.advantage_estimator not in entry.base_estimators
      or (rl.pbrs_coef > 0 and not entry.takes_potential)
      or (rl.replay_inject and entry.needs_sampled_rows)
  ):
    _fail(
        field,
        value,
        f"the estimator {name!r} replaces rl.advantage_estimator: use "
        + ", ".join(need),
    )


def _validate_data(config, is_host: bool) -> None:
  """config.data (optional): the task loader of a host environment (agentic_rl/data.py)."""
  block = config.data
  if not block:
    return
  from agentic_rl import data as data_lib  # noqa: PLC0415 -- grain only when used
  from agentic_rl.datasets import tasks as data_tasks  # noqa: PLC0415

  try:
    data_lib.validate_data_config(dict(block))
  except ValueError as e:
    raise ConfigError(str(e)) from e
  if not is_host or config.env.name not in data_tasks.RECORD_TO_TASK:
    _fail(
        "data",
        dict(block),
        f"only host environments "
        f"{sorted(data_tasks.RECORD_TO_TASK)} read tasks through the loader, not "
        f"env {config.env.name!r}",
    )


def validate_config(config: ml_collections.ConfigDict) -> None:
  """Checks an experiment config; raises ValueError naming the first bad field.

  Raises:
    ConfigError (a ValueError): e.g. group size 1, batch not divisible by group size, unknown
      reward name, minibatches that would split a group, non-positive sizes.
  """
  check_known_fields(config)
  config = schema.with_defaults(config)
  if config.env.name not in KNOWN_ENVS:
    _fail(
        "env.name", config.env.name, f"unknown environment; known: {KNOWN_ENVS}"
    )
  for f in ("sft.warmup_steps", "rl.warmup_steps"):
    _positive_int(config, f, allow_zero=True)
  for f in ("sft.weight_decay", "rl.weight_decay"):
    phase, name = f.split(".")
    if not config[phase][name] >= 0:
      _fail(f, config[phase][name], "must be >= 0")
  for f in (
      "model.d_model",
      "model.num_layers",
      "model.num_heads",
      "model.head_dim",
      "model.ffn_dim",
      "max_len",
      "sft.batch_size",
      "rl.batch_size",
      "rl.group_size",
      "rl.num_minibatches",
      "rl.num_microbatches",
      "rl.update_length_buckets",
      "sft.length_buckets",
      "rl.kl_horizon",
      "rl.ppo_epochs",
      "eval.num_tasks",
      "log_every_steps",
      "checkpoint.every_steps",
      "checkpoint.max_to_keep",
  ):
    _positive_int(config, f)
  for f in ("sft.steps", "rl.steps", "eval.num_samples"):
    _positive_int(config, f, allow_zero=True)
  if config.model.head_dim % 2:
    _fail("model.head_dim", config.model.head_dim, "must be even (RoPE)")
  _validate_model(config.model)
  rl = config.rl
  if rl.group_size < 2:
    _fail(
        "rl.group_size",
        rl.group_size,
        "GRPO needs at least 2 episodes per group (the group is the baseline)",
    )
  if rl.batch_size % rl.group_size:
    _fail(
        "rl.batch_size",
        rl.batch_size,
        f"must be divisible by rl.group_size={rl.group_size}",
    )
  num_groups = rl.batch_size // rl.group_size
  if num_groups % rl.num_minibatches:
    _fail(
        "rl.num_minibatches",
        rl.num_minibatches,
        f"must divide the number of groups ({num_groups}) (equal minibatches; "
        "batch rows are split i % num_minibatches, sharding.split_rows)",
    )
  sft_micro = config.sft.num_microbatches
  if (
      isinstance(sft_micro, bool)
      or not isinstance(sft_micro, int)
      or sft_micro < 1
      or config.sft.batch_size % sft_micro
  ):
    _fail(
        "sft.num_microbatches",
        sft_micro,
        f"must be a positive int dividing sft.batch_size={config.sft.batch_size}",
    )
  mb_rows = rl.batch_size // rl.num_minibatches
  if mb_rows % rl.num_microbatches:
    _fail(
        "rl.num_microbatches",
        rl.num_microbatches,
        f"must divide the minibatch size ({mb_rows} episodes)",
    )
  _validate_shared_prefix(config)
  known_estimators = list(estimators.selected_by("rl.advantage_estimator"))
  if rl.advantage_estimator not in known_estimators:
    _fail(
        "rl.advantage_estimator",
        rl.advantage_estimator,
        f"unknown; known: {known_estimators}",
    )
  tree = rl.tree_branching
  if tree:
    if (
        not isinstance(tree, (tuple, list))
        or any(
            isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in tree
        )
        or math.prod(tree) != rl.group_size
    ):
      _fail(
          "rl.tree_branching",
          tree,
          f"must be fork sizes >= 1 whose product is rl.group_size="
          f"{rl.group_size}, or () (off)",
      )
    if not 0.0 <= rl.tree_alpha <= 1.0:
      _fail("rl.tree_alpha", rl.tree_alpha, "must be in [0, 1]")
    _check_replacing_entry(rl, "rl.tree_branching", tuple(tree))
  selected = token_credit.estimator_name(rl)
  entry = estimators.ESTIMATORS[selected]
  if rl.pbrs_coef > 0 and not entry.takes_potential:
    _fail(
        "rl.pbrs_coef",
        rl.pbrs_coef,
        f"estimator {selected!r} ({entry.selected_by}) takes the unshaped "
        "reward (its table entry declares takes_potential=False): set 0",
    )
  if not rl.gigpo_step_weight >= 0:
    _fail("rl.gigpo_step_weight", rl.gigpo_step_weight, "must be >= 0")
  if not rl.hdpo_efficiency_weight >= 0:
    _fail(
        "rl.hdpo_efficiency_weight", rl.hdpo_efficiency_weight, "must be >= 0"
    )
  if rl.std_ddof not in (0, 1):
    _fail("rl.std_ddof", rl.std_ddof, "must be 0 (population) or 1 (sample)")
  if rl.loss_type not in losses.LOSS_TYPES:
    _fail("rl.loss_type", rl.loss_type, f"unknown; known: {losses.LOSS_TYPES}")
  if rl.loss_agg_mode not in losses.AGG_MODES:
    _fail(
        "rl.loss_agg_mode",
        rl.loss_agg_mode,
        f"unknown; known: {losses.AGG_MODES}",
    )
  policy_loss = losses.POLICY_LOSSES[rl.loss_type]
  if (
      policy_loss.sequence_level
      and rl.loss_agg_mode != losses.SEQUENCE_AGG_MODE
  ):
    token_level = [
        n for n, e in losses.POLICY_LOSSES.items() if not e.sequence_level
    ]
    _fail(
        "rl.loss_agg_mode",
        rl.loss_agg_mode,
        f"rl.loss_type={rl.loss_type!r} is a sequence-level objective: use "
        f"{losses.SEQUENCE_AGG_MODE!r} (or a loss_type of {token_level})",
    )
  if rl.kl_estimator not in losses.KL_ESTIMATORS:
    _fail(
        "rl.kl_estimator",
        rl.kl_estimator,
        f"unknown; known: {losses.KL_ESTIMATORS}",
    )
  # Checked for every loss type, also those that do not read it ('ppo' does).
  if rl.dual_clip != 0 and not rl.dual_clip > 1:
    _fail("rl.dual_clip", rl.dual_clip, "must be 0 (off) or > 1")
  if rl.loss_norm_constant < 0:
    _fail(
        "rl.loss_norm_constant",
        rl.loss_norm_constant,
        "must be >= 0 (0 = max_len)",
    )
  for f in ("kl_target", "kl_reward_coef", "entropy_coef"):
    if not rl[f] >= 0:
      _fail(f"rl.{f}", rl[f], "must be >= 0")
  over = rl.dynamic_sampling_oversample
  if isinstance(over, bool) or not isinstance(over, int) or over < 1:
    _fail(
        "rl.dynamic_sampling_oversample",
        over,
        "must be an integer >= 1 (1 = off)",
    )
  retries = rl.dynamic_sampling_max_retries
  if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
    _fail("rl.dynamic_sampling_max_retries", retries, "must be an integer >= 0")
  if retries > 0 and over == 1:
    _fail(
        "rl.dynamic_sampling_max_retries",
        retries,
        "needs rl.dynamic_sampling_oversample >= 2 (dynamic sampling on)",
    )
  if rl.dynamic_sampling_metric not in ("reward", "correct"):
    _fail(
        "rl.dynamic_sampling_metric",
        rl.dynamic_sampling_metric,
        "must be 'reward' or 'correct'",
    )
  if rl.overlong_mode not in batch_policies.OVERLONG_MODES:
    _fail(
        "rl.overlong_mode",
        rl.overlong_mode,
        f"unknown; known: {batch_policies.OVERLONG_MODES}",
    )
  cache = rl.overlong_soft_cache
  if cache and not 0 < cache <= rl.overlong_soft_max:
    _fail(
        "rl.overlong_soft_cache",
        cache,
        f"must be in (0, rl.overlong_soft_max={rl.overlong_soft_max}] or 0 (off)",
    )
  credit_mode = rl.credit
  if credit_mode not in ("trajectory", "per_turn"):
    _fail("rl.credit", credit_mode, "must be 'trajectory' or 'per_turn'")
  if credit_mode == "per_turn":
    per_turn = estimators.entry_for("rl.credit")
    base = estimators.ESTIMATORS[per_turn].base_estimators
    if rl.advantage_estimator not in base:
      _fail(
          "rl.advantage_estimator",
          rl.advantage_estimator,
          f"rl.credit='per_turn' runs the estimator {per_turn!r} on the "
          f"per-turn returns, with advantage_estimator one of {list(base)} "
          "(rl.scale_by_std=False for the mean-centred form)",
      )
  if not 0.0 <= rl.discount <= 1.0:
    _fail("rl.discount", rl.discount, "must be in [0, 1]")
  if not rl.pbrs_coef >= 0:
    _fail("rl.pbrs_coef", rl.pbrs_coef, "must be >= 0")
  if not rl.temperature > 0:
    _fail(
        "rl.temperature", rl.temperature, "must be > 0 for on-policy sampling"
    )
  if not 0 <= rl.clip_low < 1:
    _fail("rl.clip_low", rl.clip_low, "must be in [0, 1)")
  if not rl.clip_high >= 0:
    _fail("rl.clip_high", rl.clip_high, "must be >= 0")
  if not rl.kl_coef >= 0:
    _fail("rl.kl_coef", rl.kl_coef, "must be >= 0")
  if rl.scale_by_std and not rl.adv_eps > 0:
    _fail("rl.adv_eps", rl.adv_eps, "must be > 0 when rl.scale_by_std")
  for name, w in dict(rl.rewards).items():
    if name not in components.REWARD_COMPONENTS:
      _fail(
          f"rl.rewards.{name}",
          w,
          f"unknown reward name {name!r}; known: {sorted(components.REWARD_COMPONENTS)}",
      )
  if not dict(rl.rewards):
    _fail(
        "rl.rewards",
        dict(rl.rewards),
        "must name at least one reward component",
    )
  # Builds the reward function once: unknown params, compositions, schedules and
  # noise settings raise ValueError here, before any work.
  try:
    factory.reward_fn_from_config(config.rl)
  except ValueError as e:
    raise ConfigError(str(e)) from e
  for phase in ("sft", "rl"):
    c = config[phase]
    if not c.learning_rate > 0:
      _fail(f"{phase}.learning_rate", c.learning_rate, "must be > 0")
    if not c.max_grad_norm > 0:
      _fail(f"{phase}.max_grad_norm", c.max_grad_norm, "must be > 0")
  ev = config.eval
  if ev.num_samples and not ev.temperature > 0:
    _fail("eval.temperature", ev.temperature, "must be > 0 for pass@k sampling")
  for k in ev.pass_k:
    if not 1 <= k <= ev.num_samples:
      _fail(
          "eval.pass_k",
          tuple(ev.pass_k),
          f"each k must be in [1, eval.num_samples={ev.num_samples}]",
      )
  # Device mesh: its sizes must cover every device exactly, and each batch must
  # split evenly over the batch axes (data * fsdp).
  try:
    data, fsdp, tensor = sharding.mesh_shape(config.mesh, jax.device_count())
    num_heads, num_kv_heads = config.model.num_heads, config.model.num_kv_heads
    if config.model.hf_path:
      hf_cfg = hf.config_from_hf(hf.read_config(config.model.hf_path))
      num_heads, num_kv_heads = hf_cfg.num_heads, hf_cfg.kv_heads
    sharding.check_heads_divide_tensor(num_heads, num_kv_heads, tensor)
  except ValueError as e:
    raise ConfigError(str(e)) from e
  for f in ("sft.batch_size", "rl.batch_size"):
    phase, name = f.split(".")
    if config[phase][name] % (data * fsdp):
      _fail(
          f,
          config[phase][name],
          f"must be divisible by mesh data*fsdp = {data}*{fsdp} (the batch is "
          "split over those devices)",
      )
  env = config.env
  for f in ("hard_fraction", "expert_imperfect_prob"):
    if f in env and not 0.0 <= env[f] <= 1.0:
      _fail(f"env.{f}", env[f], "must be a probability in [0, 1]")
  for f in ("expert_undercall_prob", "expert_overcall_prob"):
    if f in env and not (env[f] == -1.0 or 0.0 <= env[f] <= 1.0):
      _fail(
          f"env.{f}", env[f], "must be a probability in [0, 1], or -1 (unset)"
      )
  # The environment's own shapes (dataclass defaults included): the buffer must
  # hold the prompt and at least one full assistant turn.
  try:
    env_obj = environments.make(_env_fields(config))
  except TypeError as e:
    unknown = re.search(r"unexpected keyword argument '(\w+)'", str(e))
    ctor = environments.REGISTRY[config.env.name]
    if unknown and unknown.group(1) in config.env:
      name = unknown.group(1)
      fields = (
          [f.name for f in dataclasses.fields(ctor)]
          if dataclasses.is_dataclass(ctor)
          else []
      )
      near = closest(name, fields)
      _fail(
          f"env.{name}",
          config.env[name],
          f"not a field of environment {config.env.name!r}"
          + (f"; did you mean config.env.{near}?" if near else ""),
      )
    _fail("env", config.env.to_dict(), f"not accepted by the environment: {e}")
  except ValueError as e:  # the environment's own field checks name the field
    raise ConfigError(f"config.env.{e}") from e
  is_host = getattr(env_obj, "is_host", False)
  _validate_tokenizer(
      config, is_host or getattr(env_obj, "takes_hf_tokenizer", False)
  )
  _validate_data(config, is_host)
  if config.rl.pbrs_coef > 0 and is_host:
    _fail(
        "rl.pbrs_coef",
        config.rl.pbrs_coef,
        f"host environment {config.env.name!r} has no 'progress' potential",
    )
  if config.rl.likelihood_coef > 0 and is_host:
    _fail(
        "rl.likelihood_coef",
        config.rl.likelihood_coef,
        f"host environment {config.env.name!r} has no gold-answer facts",
    )
  if config.rl.dynamic_sampling_max_retries > 0 and is_host:
    _fail(
        "rl.dynamic_sampling_max_retries",
        config.rl.dynamic_sampling_max_retries,
        f"retry rounds roll out inside the jitted step; host environment "
        f"{config.env.name!r} is driven from Python (use 0)",
    )
  if tuple(config.rl.tree_branching) and is_host:
    _fail(
        "rl.tree_branching",
        config.rl.tree_branching,
        f"tree rollouts are JAX-native only; host environment {config.env.name!r}",
    )
  potential = config.rl.pbrs_potential
  if potential not in potentials_by_name.POTENTIALS:
    _fail(
        "rl.pbrs_potential",
        potential,
        f"unknown; known: {tuple(potentials_by_name.POTENTIALS)}",
    )
  if config.rl.pbrs_cutoff not in ("keep", "zero", "never"):
    _fail(
        "rl.pbrs_cutoff",
        config.rl.pbrs_cutoff,
        "must be 'keep', 'zero' or 'never'",
    )
  _validate_policy_optimisation(config)
  _validate_obs_prediction(config)
  _validate_dual_path_and_spa(config, is_host)
  if config.rl.dense_as not in ("reward", "aux_loss"):
    _fail("rl.dense_as", config.rl.dense_as, "must be 'reward' or 'aux_loss'")
  lik = config.rl.likelihood_coef
  if not lik >= 0:
    _fail("rl.likelihood_coef", lik, "must be >= 0 (0 = off)")
  pbrs_on = config.rl.pbrs_coef > 0
  if lik > 0 or (pbrs_on and potential == "trace"):
    task = jax.tree.map(lambda x: x[0], env_obj.eval_tasks(1, 0))
    facts = jax.eval_shape(lambda t: env_obj.facts(env_obj.reset(t)[0]), task)
    if (
        "gold_answer" not in facts
        or len(facts["gold_answer"].shape) != 1
        or facts.get("gold_answer_len") is None
        or facts["gold_answer_len"].shape != ()
    ):
      field, value = (
          ("rl.likelihood_coef", lik)
          if lik > 0
          else ("rl.pbrs_potential", potential)
      )
      _fail(
          field,
          value,
          "needs environment facts 'gold_answer' [A] int32 and "
          "'gold_answer_len' [] int32",
      )
  if pbrs_on and potential == "progress":
    task = jax.tree.map(lambda x: x[0], env_obj.eval_tasks(1, 0))
    facts = jax.eval_shape(lambda t: env_obj.facts(env_obj.reset(t)[0]), task)
    want = (env_obj.max_turns + 1,)
    if "progress" not in facts or facts["progress"].shape != want:
      _fail(
          "rl.pbrs_coef",
          config.rl.pbrs_coef,
          f"needs an environment fact 'progress' of shape {want} (the potential)",
      )
  _validate_replay_and_dual(config, env_obj)
  _validate_step_reward(config, env_obj)
  _validate_update_buckets(config, env_obj)
  if (
      config.sft.length_buckets > 1
      and config.trim_bucket <= 0
      and not getattr(env_obj, "is_host", False)  # host envs trim on the host
  ):
    _fail(
        "sft.length_buckets",
        config.sft.length_buckets,
        "the bucket lengths are multiples of config.trim_bucket, which is "
        f"{config.trim_bucket}; use 1",
    )
  check_sft_bucket_lengths(config)
  if config.rl.shared_prefix_len > env_obj.max_prompt_len:
    _fail(
        "rl.shared_prefix_len",
        config.rl.shared_prefix_len,
        f"exceeds the environment's longest prompt ({env_obj.max_prompt_len} "
        "tokens); it must be at most its shortest prompt",
    )
  validate_rl_reward_model(config)  # learned reward model (rl.reward_model_dir)
  need = env_obj.max_prompt_len + env_obj.max_action_len
  if config.max_len < need:
    _fail(
        "max_len",
        config.max_len,
        f"must be >= env max_prompt_len + max_action_len = {need}",
    )


def _nonneg_int(x) -> bool:
  """x is an int >= 0 (not a bool)."""
  return not isinstance(x, bool) and isinstance(x, int) and x >= 0


# Checks of the `rl` fields that some policy-loss entries declare
# (`losses.PolicyLoss.fields`: their settings, the log partition's); the
# fields every loss reads (`losses.SHARED_SETTINGS`) and rl.dual_clip are
# checked for every loss type in `validate_config`.
_LOSS_SETTING_CHECKS = {
    "rl.flowrl_beta": (lambda x: x > 0, "must be > 0"),
    "rl.flowrl_clip": (lambda x: x >= 0, "must be >= 0"),
    "rl.flowrl_log_z_hidden": (
        _nonneg_int,
        "must be an integer >= 0 (0 = one scalar log Z)",
    ),
    "rl.flowrl_log_z_lr": (lambda x: x > 0, "must be > 0"),
}


def _validate_shared_prefix(config) -> None:
  """rl.shared_prefix_len: an int >= 0; when > 0, a layout the shared-prefix
  forward supports (agentic_rl/learner/common.py `shared_prefix`)."""
  rl = config.rl
  length = rl.shared_prefix_len
  if not _nonneg_int(length):
    _fail("rl.shared_prefix_len", length, "must be an int >= 0 (0 = off)")
  if not length:
    return
  if length >= config.max_len:
    _fail(
        "rl.shared_prefix_len",
        length,
        f"must be below max_len={config.max_len} (at most the shortest "
        "prompt)",
    )
  if rl.group_size % rl.num_minibatches:
    _fail(
        "rl.shared_prefix_len",
        length,
        f"needs rl.num_minibatches={rl.num_minibatches} to divide "
        f"rl.group_size={rl.group_size} (a minibatch takes every "
        "num_minibatches-th row, so it holds group_size / num_minibatches "
        "rows of every group, which share the prefix)",
    )
  num_groups = rl.batch_size // rl.group_size
  if num_groups % rl.num_microbatches:
    _fail(
        "rl.shared_prefix_len",
        length,
        f"needs rl.num_microbatches={rl.num_microbatches} to divide the "
        f"{num_groups} groups (micro-batches of whole row groups: a "
        "minibatch holds group_size / num_minibatches rows of every group)",
    )
  model = config.model
  if model.lora.rank > 0 and model.lora.dropout > 0:
    _fail(
        "rl.shared_prefix_len",
        length,
        f"cannot be used with model.lora.dropout={model.lora.dropout} (the "
        "prefix computed once per group would share one dropout mask)",
    )
  impl, block = model.attention_impl, model.attention_block
  if impl == "chunked" or (impl == "auto" and config.max_len - 1 > block):
    _fail(
        "rl.shared_prefix_len",
        length,
        f"needs the dense attention over max_len - 1 = {config.max_len - 1} "
        f"positions (model.attention_impl={impl!r}, attention_block={block}: "
        "chunked); the shared-prefix forward is dense only",
    )


def _validate_policy_optimisation(config) -> None:
  """GAE / value head, the policy loss's own needs and settings (from its
  `losses.POLICY_LOSSES` entry) and behaviour log-prob switches."""
  rl = config.rl
  beh = rl.behaviour_logprobs
  if beh not in learner_behaviour.BEHAVIOUR_LOGPROBS:
    _fail("rl.behaviour_logprobs", beh, "must be 'trainer' or 'sampler'")
  value_potential = rl.pbrs_potential == "value" and rl.pbrs_coef > 0
  # rl.credit and rl.pbrs_coef with such an estimator: validate_config
  # (base_estimators of the per-turn entry, takes_potential).
  value_estimator = estimators.ESTIMATORS[
      rl.advantage_estimator
  ].needs_value_head
  if (value_estimator or value_potential) and not config.model.value_head:
    field, value = (
        ("rl.advantage_estimator", rl.advantage_estimator)
        if value_estimator
        else ("rl.pbrs_potential", "value")
    )
    _fail(field, value, "needs a value head: set model.value_head=True")
  if value_estimator or value_potential:
    if not 0.0 <= rl.gae_lambda <= 1.0:
      _fail("rl.gae_lambda", rl.gae_lambda, "must be in [0, 1]")
    if not rl.value_coef > 0:
      _fail("rl.value_coef", rl.value_coef, "must be > 0")
    if not rl.value_clip >= 0:
      _fail("rl.value_clip", rl.value_clip, "must be >= 0 (0 = unclipped)")
  if losses.POLICY_LOSSES[rl.loss_type].episode_reward:
    selected = token_credit.estimator_name(rl)
    if estimators.ESTIMATORS[selected].level != "episode":
      episode = [
          n
          for n in estimators.selected_by("rl.advantage_estimator")
          if estimators.ESTIMATORS[n].level == "episode"
      ]
      _fail(
          "rl.loss_type",
          rl.loss_type,
          "takes one normalised reward per episode: use credit "
          f"'trajectory', an episode-level advantage_estimator ({episode}) "
          f"and no tree_branching (the config selects {selected!r})",
      )
  # The settings only some loss types read, checked when the entry of
  # rl.loss_type declares them (`losses.PolicyLoss.fields`), in this order.
  declared = losses.POLICY_LOSSES[rl.loss_type].fields
  for field, (ok, why) in _LOSS_SETTING_CHECKS.items():
    if field not in declared:
      continue
    value = rl[field.removeprefix("rl.")]
    if not ok(value):
      _fail(field, value, why)


def _validate_dual_path_and_spa(config, is_host: bool) -> None:
  """Dual-path groups (rl.dual_path_tool_free) and the SPA head (rl.spa_*)."""
  rl = config.rl
  free = rl.dual_path_tool_free
  if (
      isinstance(free, bool)
      or not isinstance(free, int)
      or not (0 <= free < rl.group_size)
  ):
    _fail(
        "rl.dual_path_tool_free",
        free,
        f"must be an int in [0, rl.group_size={rl.group_size}) (tool-free "
        "episodes per group; 0 = off)",
    )
  if free and tuple(rl.tree_branching):
    _fail(
        "rl.dual_path_tool_free",
        free,
        "dual-path groups need flat groups: set rl.tree_branching=()",
    )
  if free and is_host:
    _fail(
        "rl.dual_path_tool_free",
        free,
        f"the tool-call logit mask is applied in the JAX-native rollout; "
        f"host environment {config.env.name!r} is not supported",
    )
  if rl.pbrs_potential == "spa":
    if not rl.spa_lr > 0:
      _fail("rl.spa_lr", rl.spa_lr, "must be > 0")
    steps = rl.spa_steps
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
      _fail("rl.spa_steps", steps, "must be an int >= 1")


def _validate_obs_prediction(config) -> None:
  """Next-observation prediction (docs/papers.md): rl.obs_prediction_coef,
  rl.obs_prediction_placebo, rl.log_obs_prediction."""
  rl = config.rl
  coef = rl.obs_prediction_coef
  if (
      isinstance(coef, bool)
      or not isinstance(coef, (int, float))
      or not (0.0 <= coef < float("inf"))
  ):
    _fail(
        "rl.obs_prediction_coef",
        coef,
        "must be a finite number >= 0 (auxiliary next-observation CE "
        "weight; 0 = off)",
    )
  placebo = rl.obs_prediction_placebo
  if not isinstance(placebo, bool):
    _fail("rl.obs_prediction_placebo", placebo, "must be True or False")
  if placebo and not coef > 0:
    _fail(
        "rl.obs_prediction_placebo",
        placebo,
        "shuffles the labels of the auxiliary next-observation loss: needs "
        "rl.obs_prediction_coef > 0",
    )
  log = rl.log_obs_prediction
  if not isinstance(log, bool):
    _fail("rl.log_obs_prediction", log, "must be True or False")


def _validate_replay_and_dual(config, env_obj) -> None:
  """Replay buffer, self-imitation and dual-ascent switches."""
  rl = config.rl
  cap = rl.replay_capacity
  if isinstance(cap, bool) or not isinstance(cap, int) or cap < 0:
    _fail("rl.replay_capacity", cap, "must be an integer >= 0 (0 = off)")
  inject = rl.replay_inject
  if not isinstance(inject, bool):
    _fail("rl.replay_inject", inject, "must be True or False")
  sil = rl.sil_coef
  if not sil >= 0:
    _fail("rl.sil_coef", sil, "must be >= 0 (0 = off)")
  if (inject or sil > 0) and cap == 0:
    _fail(
        "rl.replay_capacity",
        cap,
        "must be > 0 when rl.replay_inject or rl.sil_coef is on",
    )
  if sil > 0:
    _positive_int(config, "rl.sil_batch_size")
  dual = rl.dual_constraint
  if inject:
    if rl.credit != "trajectory":
      _fail("rl.replay_inject", inject, "needs rl.credit='trajectory'")
    facts = estimators.ESTIMATORS[rl.advantage_estimator].reads_facts
    if facts or rl.pbrs_coef > 0 or dual:
      readers = {
          n: list(e.reads_facts)
          for n, e in estimators.ESTIMATORS.items()
          if e.reads_facts
      }
      _fail(
          "rl.replay_inject",
          inject,
          "replayed episodes carry no env facts: not with pbrs_coef > 0, "
          f"dual_constraint or an advantage_estimator that reads facts "
          f"({readers})",
      )
  if not dual:
    return
  task = jax.tree.map(lambda x: x[0], env_obj.eval_tasks(1, 0))
  facts = jax.eval_shape(lambda t: env_obj.facts(env_obj.reset(t)[0]), task)
  if dual not in facts or facts[dual].shape != ():
    scalars = sorted(k for k, v in facts.items() if v.shape == ())
    _fail(
        "rl.dual_constraint",
        dual,
        f"must name a per-episode scalar env fact; known: {scalars}",
    )
  if rl.dual_sense not in ("max", "min"):
    _fail("rl.dual_sense", rl.dual_sense, "must be 'max' or 'min'")
  if not rl.dual_lr > 0:
    _fail("rl.dual_lr", rl.dual_lr, "must be > 0")
  if not rl.dual_init >= 0:
    _fail("rl.dual_init", rl.dual_init, "must be >= 0")


def _validate_update_buckets(config, env_obj) -> None:
  """`rl.update_length_buckets` > 1 only where the one-jit step can use it
  (learner.rl_step.update_is_bucketed): refused rather than silently off."""
  rl = config.rl
  k = rl.update_length_buckets
  if k <= 1:
    return
  why = None
  if getattr(env_obj, "is_host", False):
    why = (
        f"host environment {config.env.name!r}: its batches are already "
        "trimmed on the host (config.trim_bucket); use 1"
    )
  elif config.trim_bucket <= 0:
    why = "the bucket lengths are multiples of config.trim_bucket, which is 0"
  elif (
      rl.loss_agg_mode == "seq-mean-token-sum-norm"
      and not rl.loss_norm_constant
  ):
    why = (
        "rl.loss_agg_mode='seq-mean-token-sum-norm' with "
        "rl.loss_norm_constant=0 divides by the buffer length itself, which "
        "a shorter bucket would change: set rl.loss_norm_constant or use 1"
    )
  if why:
    _fail("rl.update_length_buckets", k, why)


def _validate_step_reward(config, env_obj) -> None:
  """Per-turn step rewards (`rl.step_reward`, learner.step_rewards_bk)."""
  rl = config.rl
  kind = rl.step_reward
  if kind not in step_rewards.STEP_REWARDS:
    _fail(
        "rl.step_reward", kind, f"unknown; known: {step_rewards.STEP_REWARDS}"
    )
  transform = rl.step_reward_transform
  if transform not in step_rewards.STEP_REWARD_TRANSFORMS:
    _fail(
        "rl.step_reward_transform",
        transform,
        f"unknown; known: {step_rewards.STEP_REWARD_TRANSFORMS}",
    )
  for f in (
      "step_reward_coef",
      "step_reward_clip_eta",
      "step_reward_clip_quantile",
      "step_reward_gate_threshold",
  ):
    v = rl[f]
    if (
        isinstance(v, bool)
        or not isinstance(v, (int, float))
        or not math.isfinite(v)
    ):
      _fail(f"rl.{f}", v, "must be a finite number")
  q = rl.step_reward_clip_quantile
  if not 0.0 <= q <= 1.0:
    _fail("rl.step_reward_clip_quantile", q, "must be in [0, 1] (0 = off)")
  if kind == "none":
    if q > 0:
      _fail(
          "rl.step_reward_clip_quantile",
          q,
          "rl.step_reward='none', so nothing reads this field; set "
          "rl.step_reward or leave it at 0",
      )
    return
  coef = rl.step_reward_coef
  if not coef > 0:
    _fail(
        "rl.step_reward_coef",
        coef,
        f"must be > 0 with rl.step_reward={kind!r} (use rl.step_reward='none' "
        "for no step reward)",
    )
  if not 0.0 <= rl.step_reward_clip_eta <= 1.0:
    _fail(
        "rl.step_reward_clip_eta",
        rl.step_reward_clip_eta,
        "must be in [0, 1] (step scores are in [0, 1])",
    )
  if q > 0 and transform != "clip":
    _fail(
        "rl.step_reward_clip_quantile",
        q,
        f"sets the 'clip' threshold; rl.step_reward_transform={transform!r} "
        "reads no threshold (use 0)",
    )
  if kind == "prm":
    if not rl.reward_model_dir or rl.reward_model_kind != "process":
      _fail(
          "rl.step_reward",
          kind,
          "scores turns with a frozen process reward model: set "
          "rl.reward_model_dir to an rm-mode workdir and "
          "rl.reward_model_kind='process'",
      )
  if rl.credit != "per_turn":
    _fail(
        "rl.credit",
        rl.credit,
        f"rl.step_reward={kind!r} is delivered per turn: use rl.credit='per_turn'",
    )
  selected = token_credit.estimator_name(rl)
  if not estimators.ESTIMATORS[selected].takes_turn_rewards:
    takers = [
        n for n, e in estimators.ESTIMATORS.items() if e.takes_turn_rewards
    ]
    _fail(
        "rl.advantage_estimator",
        rl.advantage_estimator,
        f"rl.step_reward={kind!r} is added to the per-turn rewards, which "
        f"only the estimators {takers} take (the config selects "
        f"{selected!r}): see their base_estimators, and no tree_branching",
    )
  if transform in ("delta", "delta_drop", "min") and rl.discount != 1.0:
    _fail(
        "rl.discount",
        rl.discount,
        f"rl.step_reward_transform={transform!r} is bounded through an "
        "undiscounted reward-to-go (telescoping / min-form): use 1.0",
    )
  if getattr(env_obj, "is_host", False):
    _fail(
        "rl.step_reward",
        kind,
        f"host environment {config.env.name!r} has no per-turn call facts",
    )
  if kind == "prm":
    return  # scores come from the reward model, not from env facts
  task = jax.tree.map(lambda x: x[0], env_obj.eval_tasks(1, 0))
  facts = jax.eval_shape(lambda t: env_obj.facts(env_obj.reset(t)[0]), task)
  want = (env_obj.max_turns,)
  for fact in ("valid_call_turn", "tool_call_turn"):
    if fact not in facts or facts[fact].shape != want:
      _fail(
          "rl.step_reward",
          kind,
          f"needs an environment fact {fact!r} of shape {want} (env "
          f"{config.env.name!r} has none; kv_chain has it)",
      )


# ---------------------------------------------------------------------------
# A finished rm-mode workdir as a frozen reward model inside RL
# (agentic_rl/reward_model_loader.py loads it).
# ---------------------------------------------------------------------------


def _policy_vocab_size(config) -> int:
  """The policy's vocabulary size (from its HF config.json when hf_path is set)."""
  path = config.model.hf_path
  if path:
    return hf.read_config(path).get("vocab_size", -1)
  return int(config.model.vocab_size)


def read_rm_dir(
    config,
) -> tuple[ml_collections.ConfigDict, transformer.TransformerConfig, int]:
  """Reads `rl.reward_model_dir` without loading weights.

  Returns:
    (the rm workdir's config, its RM TransformerConfig, the checkpoint step to
    load), after checking everything that can be checked without loading.

  Raises:
    ConfigError naming `rl.reward_model_dir` or `rl.reward_model_kind`.
  """
  path = config.rl.reward_model_dir
  kind = config.rl.reward_model_kind
  if kind not in rm_model.KINDS:
    _fail("rl.reward_model_kind", kind, f"must be one of {rm_model.KINDS}")
  if not isinstance(path, str) or not os.path.isdir(path):
    _fail(
        "rl.reward_model_dir",
        path,
        "not a directory (an rm-mode workdir: "
        "python main.py --config=configs/rm_arithmetic.py --workdir=DIR)",
    )
  cfg_path = os.path.join(path, "config.json")
  try:
    with open(cfg_path) as f:
      rm_config = schema.with_defaults(ml_collections.ConfigDict(json.load(f)))
  except (OSError, ValueError) as e:
    _fail("rl.reward_model_dir", path, f"no readable config.json: {e}")
  if rm_config.mode != "rm":
    _fail(
        "rl.reward_model_dir",
        path,
        f"holds a {rm_config.mode!r}-mode run, not an rm-mode run",
    )
  try:
    fields = {
        k: tuple(v) if isinstance(v, list) else v
        for k, v in lora_lib.transformer_fields(
            rm_config.model.to_dict()
        ).items()
    }
    model_cfg = transformer.TransformerConfig(**fields)
    s_steps, r_steps = int(rm_config.sft.steps), int(rm_config.rm.steps)
  except (AttributeError, KeyError, TypeError, ValueError) as e:
    _fail(
        "rl.reward_model_dir",
        path,
        f"config.json is not an rm-mode config: {e}",
    )
  need = s_steps + (r_steps if kind == "outcome" else 2 * r_steps)
  ckpt_dir = os.path.join(path, "checkpoints")
  steps = sorted(
      int(d)
      for d in (os.listdir(ckpt_dir) if os.path.isdir(ckpt_dir) else [])
      if d.isdigit()
  )
  if not steps or steps[-1] < need:
    _fail(
        "rl.reward_model_dir",
        path,
        f"holds no trained {kind} RM: latest checkpoint step "
        f"{steps[-1] if steps else None}, the {kind} RM is done at step {need}",
    )
  vocab = _policy_vocab_size(config)
  if model_cfg.vocab_size != vocab:
    _fail(
        "rl.reward_model_dir",
        path,
        f"the RM's model.vocab_size={model_cfg.vocab_size} differs from the "
        f"policy's {vocab} (they must share the tokenizer)",
    )
  return rm_config, model_cfg, steps[-1]


def validate_rl_reward_model(config: ml_collections.ConfigDict) -> None:
  """Checks the learned-RM fields of an RL config (no loading, no compiles).

  `rl.rewards.rm` or `rl.pbrs_potential='rm'` (with pbrs_coef > 0) need
  `rl.reward_model_dir`: a directory holding an rm-mode config.json and a
  checkpoint in which the `rl.reward_model_kind` model ('outcome' or
  'process') has finished training, whose vocabulary equals the policy's. A
  reward_model_dir without either use loads the RM for the monitor only.

  Raises:
    ConfigError (a ValueError) naming the field and value.
  """
  rl = config.rl
  path = rl.reward_model_dir
  uses = [
      f
      for f, on in (
          ("rl.rewards.rm", "rm" in dict(rl.rewards)),
          (
              "rl.pbrs_potential='rm'",
              rl.pbrs_potential == "rm" and rl.pbrs_coef > 0,
          ),
      )
      if on
  ]
  if uses and not path:
    _fail(
        "rl.reward_model_dir",
        path,
        f"{' and '.join(uses)} need a trained reward "
        "model: set rl.reward_model_dir to an rm-mode workdir",
    )
  if path:
    read_rm_dir(config)


def _env_fields(config) -> dict:
  """config.env as environments.make takes it: with config.tokenizer = 'hf'
  and a tokenizer.json at config.model.hf_path, plus the checkpoint's
  tokenizer, as train.make_env builds it (an environment that reads its
  token ids from the tokenizer needs it to be built at all)."""
  fields = dict(config.env)
  path = config.model.hf_path
  ctor = environments.REGISTRY.get(config.env.name)
  if (
      config.tokenizer == "hf"
      # Only an environment that takes it (else _validate_tokenizer names the
      # problem instead of the constructor's TypeError).
      and (
          getattr(ctor, "takes_hf_tokenizer", False)
          or getattr(ctor, "is_host", False)
      )
      and path
      and os.path.isfile(os.path.join(path, "tokenizer.json"))
  ):
    fields["tokenizer"] = tokenizers.HFTokenizer.from_folder(path)
  return fields


def _validate_tokenizer(config, takes_hf: bool) -> None:
  """config.tokenizer: 'byte' (default) or 'hf' (the checkpoint's tokenizer and
  chat template, from config.model.hf_path; host environments and JAX-native
  ones that declare `takes_hf_tokenizer` only)."""
  name = config.tokenizer
  if name not in ("byte", "hf"):
    _fail("tokenizer", name, "must be 'byte' or 'hf'")
  if name != "hf":
    return
  if not takes_hf:
    _fail(
        "tokenizer",
        name,
        f"environment {config.env.name!r} is JAX-native and "
        "emits byte-tokenizer ids; 'hf' needs a host environment (or "
        "one that reads its ids from the tokenizer, e.g. chat_arithmetic)",
    )
  path = config.model.hf_path
  if not path or not os.path.isfile(os.path.join(path, "tokenizer.json")):
    _fail(
        "tokenizer",
        name,
        f"needs config.model.hf_path with a tokenizer.json "
        f"(hf_path={path!r})",
    )
  tok = tokenizers.HFTokenizer.from_folder(path)
  vocab = hf.read_config(path)["vocab_size"]
  if tok.vocab_size > vocab:
    _fail(
        "tokenizer",
        name,
        f"the tokenizer has {tok.vocab_size} ids; the "
        f"checkpoint's vocab_size is {vocab}",
    )
  from agentic_text import chat  # pylint: disable=g-import-not-at-top

  try:
    chat.ChatFormat(tok)
  except ValueError as e:
    _fail("tokenizer", name, f"{path}: {e}")


def _validate_model(model) -> None:
  """The model fields build a TransformerConfig; an hf_path is an importable
  checkpoint whose vocabulary covers the byte tokenizer the environments use."""
  try:
    fields = lora_lib.transformer_fields(model)
  except ValueError as e:
    raise ConfigError(f"config.{e}") from e
  if fields["lora"] is None:
    # LoRA off (rank 0): a changed adapter field would be silently ignored.
    defaults = common.model().lora
    for name in ("dropout", "alpha", "targets"):
      value, default = model.lora[name], defaults[name]
      if (tuple(value) if isinstance(value, list) else value) != default:
        _fail(
            f"model.lora.{name}",
            value,
            "LoRA is off (model.lora.rank=0), so nothing reads this field; "
            "set model.lora.rank > 0 or leave it at its default",
        )
  try:
    transformer.TransformerConfig(**fields)
  except ValueError as e:
    raise ConfigError(f"config.model.{e}") from e
  except TypeError as e:
    raise ConfigError(f"config.model: {e}") from e
  path = model.hf_path
  if not path:
    # Token ids >= vocab_size index past the embedding table: NaN losses
    # minutes into the run, so refuse them here.
    if model.vocab_size < tokenizers.VOCAB_SIZE:
      _fail(
          "model.vocab_size",
          model.vocab_size,
          f"smaller than the byte tokenizer's {tokenizers.VOCAB_SIZE} ids "
          f"(agentic_text/tokenizers.py) the environments emit: use >= "
          f"{tokenizers.VOCAB_SIZE}",
      )
    return
  if not os.path.isfile(os.path.join(path, "config.json")):
    _fail("model.hf_path", path, "no config.json in this directory")
  try:
    cfg = hf.config_from_hf(
        hf.read_config(path), **{f: model[f] for f in hf.RUNTIME_FIELDS}
    )
  except (ValueError, KeyError) as e:
    _fail("model.hf_path", path, f"not an importable checkpoint: {e}")
  if cfg.vocab_size < tokenizers.VOCAB_SIZE:
    _fail(
        "model.hf_path",
        path,
        f"vocab_size {cfg.vocab_size} does not cover the {tokenizers.VOCAB_SIZE} "
        "byte-tokenizer ids the environments emit",
    )


def _free_space(path: str) -> str:
  from agentic_rl import checkpoint  # pylint: disable=g-import-not-at-top

  return checkpoint.disk_space(path)


def check_workdir(workdir: str, create: bool = True) -> str:
  """Checks that files can be written in `workdir` (creating it if `create`).

  Args:
    workdir: the run's output folder.
    create: make the folder (and its parents); False probes the nearest
      existing parent instead, leaving nothing behind.

  Returns:
    The absolute path.

  Raises:
    ConfigError: one line saying what is wrong and what to do: the path is a
      file (or under one), cannot be created, is not writable (read-only file
      system or permissions), or its disk is full (with the free space).
  """
  path = os.path.abspath(workdir)
  if os.path.exists(path) and not os.path.isdir(path):
    raise ConfigError(
        f"workdir {path} is a file, not a folder: pass --workdir=A_FOLDER "
        "(created if missing)"
    )
  try:
    probe = path
    if create:
      os.makedirs(path, exist_ok=True)
    else:
      while not os.path.exists(probe):
        probe = os.path.dirname(probe)
      if not os.path.isdir(probe):
        raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), probe)
    with tempfile.TemporaryFile(dir=probe) as f:
      f.write(b"x")
      f.flush()
      os.fsync(f.fileno())
  except OSError as e:
    why = e.strerror or type(e).__name__
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
      raise ConfigError(
          f"workdir {path}: no space left on device ({_free_space(path)}): "
          "free some space or pass a --workdir on another disk"
      ) from None
    if e.errno == errno.ENOTDIR:
      why = "a parent of it is a file"
    raise ConfigError(
        f"workdir {path} is not writable ({why}): pass a --workdir "
        "you can write to"
    ) from None
  return path
