"""Config validation: reject bad values before any work, naming field and value."""

from __future__ import annotations

import jax
import ml_collections

from agentic_rl import advantages
from agentic_rl import batch_policies
from agentic_rl import losses
from agentic_rl import rewards
import environments

KNOWN_ENVS = tuple(environments.REGISTRY)


class ConfigError(ValueError):
  """An invalid config or workdir; main.py prints it as one line (exit code 2)."""


def _fail(field: str, value, why: str):
  raise ConfigError(f"config.{field}={value!r}: {why}")


def _positive_int(config, field: str, allow_zero: bool = False):
  value = config
  for part in field.split("."):
    value = value[part]
  if isinstance(value, bool) or not isinstance(value, int):
    _fail(field, value, "must be an integer")
  if value < 0 or (value == 0 and not allow_zero):
    _fail(field, value, "must be >= 0" if allow_zero else "must be > 0")
  return value


def validate_config(config: ml_collections.ConfigDict) -> None:
  """Checks an experiment config; raises ValueError naming the first bad field.

  Raises:
    ConfigError (a ValueError): e.g. group size 1, batch not divisible by group size, unknown
      reward name, minibatches that would split a group, non-positive sizes.
  """
  if config.env.name not in KNOWN_ENVS:
    _fail("env.name", config.env.name, f"unknown environment; known: {KNOWN_ENVS}")
  for f in ("model.d_model", "model.num_layers", "model.num_heads",
            "model.head_dim", "model.ffn_dim", "max_len", "sft.batch_size",
            "rl.batch_size", "rl.group_size", "rl.num_minibatches",
            "rl.num_microbatches", "rl.kl_horizon",
            "rl.ppo_epochs", "eval.num_tasks", "log_every_steps",
            "checkpoint.every_steps", "checkpoint.max_to_keep"):
    _positive_int(config, f)
  for f in ("sft.steps", "rl.steps", "eval.num_samples"):
    _positive_int(config, f, allow_zero=True)
  if config.model.head_dim % 2:
    _fail("model.head_dim", config.model.head_dim, "must be even (RoPE)")
  rl = config.rl
  if rl.group_size < 2:
    _fail("rl.group_size", rl.group_size,
          "GRPO needs at least 2 episodes per group (the group is the baseline)")
  if rl.batch_size % rl.group_size:
    _fail("rl.batch_size", rl.batch_size,
          f"must be divisible by rl.group_size={rl.group_size}")
  num_groups = rl.batch_size // rl.group_size
  if num_groups % rl.num_minibatches:
    _fail("rl.num_minibatches", rl.num_minibatches,
          f"must divide the number of groups ({num_groups}) so that no group is "
          "split across minibatches")
  mb_rows = rl.batch_size // rl.num_minibatches
  if mb_rows % rl.num_microbatches:
    _fail("rl.num_microbatches", rl.num_microbatches,
          f"must divide the minibatch size ({mb_rows} episodes)")
  known_estimators = sorted(advantages.ESTIMATORS) + ["hdpo"]
  if rl.advantage_estimator not in known_estimators:
    _fail("rl.advantage_estimator", rl.advantage_estimator,
          f"unknown; known: {known_estimators}")
  if not rl.hdpo_efficiency_weight >= 0:
    _fail("rl.hdpo_efficiency_weight", rl.hdpo_efficiency_weight, "must be >= 0")
  if rl.std_ddof not in (0, 1):
    _fail("rl.std_ddof", rl.std_ddof, "must be 0 (population) or 1 (sample)")
  if rl.loss_type not in losses.LOSS_TYPES:
    _fail("rl.loss_type", rl.loss_type, f"unknown; known: {losses.LOSS_TYPES}")
  if rl.loss_agg_mode not in losses.AGG_MODES:
    _fail("rl.loss_agg_mode", rl.loss_agg_mode, f"unknown; known: {losses.AGG_MODES}")
  if rl.loss_type == "gspo" and rl.loss_agg_mode != "seq-mean-token-mean":
    _fail("rl.loss_agg_mode", rl.loss_agg_mode,
          "rl.loss_type='gspo' is a sequence-level objective: use "
          "'seq-mean-token-mean' (or loss_type='gspo_token')")
  if rl.kl_estimator not in losses.KL_ESTIMATORS:
    _fail("rl.kl_estimator", rl.kl_estimator, f"unknown; known: {losses.KL_ESTIMATORS}")
  if rl.dual_clip != 0 and not rl.dual_clip > 1:
    _fail("rl.dual_clip", rl.dual_clip, "must be 0 (off) or > 1")
  if rl.loss_norm_constant < 0:
    _fail("rl.loss_norm_constant", rl.loss_norm_constant, "must be >= 0 (0 = max_len)")
  for f in ("kl_target", "kl_reward_coef", "entropy_coef"):
    if not rl[f] >= 0:
      _fail(f"rl.{f}", rl[f], "must be >= 0")
  over = rl.get("dynamic_sampling_oversample", 1)
  if isinstance(over, bool) or not isinstance(over, int) or over < 1:
    _fail("rl.dynamic_sampling_oversample", over, "must be an integer >= 1 (1 = off)")
  if rl.get("dynamic_sampling_metric", "reward") not in ("reward", "correct"):
    _fail("rl.dynamic_sampling_metric", rl.dynamic_sampling_metric,
          "must be 'reward' or 'correct'")
  if rl.get("overlong_mode", "none") not in batch_policies.OVERLONG_MODES:
    _fail("rl.overlong_mode", rl.overlong_mode,
          f"unknown; known: {batch_policies.OVERLONG_MODES}")
  cache = rl.get("overlong_soft_cache", 0)
  if cache and not 0 < cache <= rl.overlong_soft_max:
    _fail("rl.overlong_soft_cache", cache,
          f"must be in (0, rl.overlong_soft_max={rl.overlong_soft_max}] or 0 (off)")
  credit_mode = rl.get("credit", "trajectory")
  if credit_mode not in ("trajectory", "per_turn"):
    _fail("rl.credit", credit_mode, "must be 'trajectory' or 'per_turn'")
  if credit_mode == "per_turn" and rl.advantage_estimator not in ("grpo", "drgrpo"):
    _fail("rl.advantage_estimator", rl.advantage_estimator,
          "rl.credit='per_turn' uses per-turn GRPO: choose 'grpo' or 'drgrpo' "
          "(scale_by_std=False)")
  if credit_mode == "per_turn" and rl.advantage_estimator == "drgrpo":
    _fail("rl.advantage_estimator", rl.advantage_estimator,
          "with rl.credit='per_turn' use 'grpo' and rl.scale_by_std=False")
  if not 0.0 <= rl.get("discount", 1.0) <= 1.0:
    _fail("rl.discount", rl.discount, "must be in [0, 1]")
  if not rl.get("pbrs_coef", 0.0) >= 0:
    _fail("rl.pbrs_coef", rl.pbrs_coef, "must be >= 0")
  if not rl.temperature > 0:
    _fail("rl.temperature", rl.temperature, "must be > 0 for on-policy sampling")
  if not 0 <= rl.clip_low < 1:
    _fail("rl.clip_low", rl.clip_low, "must be in [0, 1)")
  if not rl.clip_high >= 0:
    _fail("rl.clip_high", rl.clip_high, "must be >= 0")
  if not rl.kl_coef >= 0:
    _fail("rl.kl_coef", rl.kl_coef, "must be >= 0")
  if rl.scale_by_std and not rl.adv_eps > 0:
    _fail("rl.adv_eps", rl.adv_eps, "must be > 0 when rl.scale_by_std")
  for name, w in dict(rl.rewards).items():
    if name not in rewards.REWARD_COMPONENTS:
      _fail(f"rl.rewards.{name}", w,
            f"unknown reward name {name!r}; known: {sorted(rewards.REWARD_COMPONENTS)}")
  if not dict(rl.rewards):
    _fail("rl.rewards", dict(rl.rewards), "must name at least one reward component")
  # Builds the reward function once: unknown params, compositions, schedules and
  # noise settings raise ValueError here, before any work.
  try:
    rewards.reward_fn_from_config(config.rl)
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
      _fail("eval.pass_k", tuple(ev.pass_k),
            f"each k must be in [1, eval.num_samples={ev.num_samples}]")
  env = config.env
  for f in ("hard_fraction", "expert_imperfect_prob"):
    if f in env and not 0.0 <= env[f] <= 1.0:
      _fail(f"env.{f}", env[f], "must be a probability in [0, 1]")
  for f in ("expert_undercall_prob", "expert_overcall_prob"):
    if f in env and not (env[f] == -1.0 or 0.0 <= env[f] <= 1.0):
      _fail(f"env.{f}", env[f], "must be a probability in [0, 1], or -1 (unset)")
  # The environment's own shapes (dataclass defaults included): the buffer must
  # hold the prompt and at least one full assistant turn.
  try:
    env_obj = environments.make(config.env)
  except TypeError as e:
    _fail("env", config.env.to_dict(), f"not accepted by the environment: {e}")
  except ValueError as e:  # the environment's own field checks name the field
    raise ConfigError(f"config.env.{e}") from e
  if config.rl.get("pbrs_coef", 0.0) > 0:
    task = jax.tree.map(lambda x: x[0], env_obj.eval_tasks(1, 0))
    facts = jax.eval_shape(lambda t: env_obj.facts(env_obj.reset(t)[0]), task)
    want = (env_obj.max_turns + 1,)
    if "progress" not in facts or facts["progress"].shape != want:
      _fail("rl.pbrs_coef", config.rl.pbrs_coef,
            f"needs an environment fact 'progress' of shape {want} (the potential)")
  need = env_obj.max_prompt_len + env_obj.max_action_len
  if config.max_len < need:
    _fail("max_len", config.max_len,
          f"must be >= env max_prompt_len + max_action_len = {need}")
