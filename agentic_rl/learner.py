"""Update functions: loss -> grads -> optax, one jitted program per iteration.

`make_sft_step` and `make_rl_step` read the config once and return pure functions
`step(state) -> (state, metrics)`; the data for step s is generated inside from
fold_in(key, s), so a whole iteration (task sampling, multi-turn rollout, rewards,
advantages, reference log-probs and the PPO epochs) is one XLA program.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from agentic_rl import advantages
from agentic_rl import batch_policies
from agentic_rl import credit
from agentic_rl import losses
from agentic_rl import rewards
from agentic_rl import rollout
from agentic_rl import sampling
from agentic_rl import sharding
from agentic_rl import types
from agentic_rl.models import transformer

StepFn = Callable[[types.TrainState], tuple[types.TrainState, dict[str, jax.Array]]]


def make_optimizer(cfg) -> optax.GradientTransformation:
  """AdamW with global-norm clipping and linear warmup then constant LR.

  Args:
    cfg: ConfigDict with learning_rate, warmup_steps, weight_decay, max_grad_norm.
  """
  schedule = optax.linear_schedule(
      0.0, cfg.learning_rate, max(int(cfg.warmup_steps), 1)
  )
  return optax.chain(
      optax.clip_by_global_norm(cfg.max_grad_norm),
      optax.adamw(schedule, b1=0.9, b2=0.99, weight_decay=cfg.weight_decay),
  )


def policy_mask(traj: types.Trajectory) -> jax.Array:
  """[B, L] bool loss mask: True exactly on POLICY (sampled) tokens."""
  return traj.role == types.POLICY


def sft_loss(graphdef, params, traj: types.Trajectory):
  """Token-mean negative log-likelihood of the POLICY tokens of demonstrations."""
  logp, _ = sampling.token_logprobs(graphdef, params, traj.tokens, 1.0)
  mask = policy_mask(traj)
  nll = losses.token_mean(-logp, mask)
  policy_tokens = jnp.mean(jnp.sum(mask, axis=1).astype(jnp.float32))
  return nll, {"loss": nll, "policy_tokens": policy_tokens}


def make_sft_step(config, env, graphdef: nnx.GraphDef,
                  tx: optax.GradientTransformation, state_sharding=None) -> StepFn:
  """SFT on expert demonstrations generated on the fly (one batch per step).

  `state_sharding` (sharding.tree_shardings of the state) keeps the state's
  layout across steps on a device mesh; the batch is split over the ambient
  mesh's ('data', 'fsdp') axes (sharding.constrain_batch).
  """
  batch_size = config.sft.batch_size
  max_len = config.max_len

  def step(state: types.TrainState):
    key = jax.random.fold_in(state.rng, state.step)
    task_key, expert_key = jax.random.split(jax.random.fold_in(key, 0))
    tasks = sharding.constrain_batch(env.sample_tasks(task_key, batch_size))
    traj = rollout.rollout(env, tasks, expert_key, max_len=max_len)
    (_, metrics), grads = jax.value_and_grad(
        lambda p: sft_loss(graphdef, p, traj), has_aux=True
    )(state.params)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics["grad_norm"] = optax.tree.norm(grads)
    metrics["expert_tool_calls"] = jnp.mean(traj.facts["num_tool_calls"])
    state = state.replace(
        step=state.step + 1,
        params=params,
        opt_state=opt_state,
    )
    return state, metrics

  return jax.jit(step, donate_argnums=0, **sharding.step_jit_kwargs(state_sharding))


def _rl_loss(graphdef, params, batch, rl_cfg, *, kl_coef, denominator):
  """Policy loss on one micro-batch, aggregated with a batch-wide denominator.

  loss = agg(policy_loss) + kl_coef * agg(KL) - entropy_coef * agg(entropy), each
  aggregated by `rl.loss_agg_mode` over POLICY tokens with `denominator` computed
  over the whole optimizer batch (losses.aggregation_denominator), so summing the
  micro-batch losses gives exactly the full-batch loss.

  Returns:
    (loss scalar, metrics dict of scalars, each already divided by `denominator`
     for the aggregated terms so micro-batch values sum to batch values).
  """
  temperature = rl_cfg.temperature
  logp, entropy = sampling.token_logprobs(
      graphdef, params, batch["tokens"], temperature
  )
  mask = batch["mask"]
  beh = batch["behaviour_logp"]
  adv = batch["advantage"]
  loss_type = rl_cfg.loss_type
  if loss_type == "ppo":
    pg, ratio = losses.clipped_surrogate(
        logp, beh, adv, rl_cfg.clip_low, rl_cfg.clip_high,
        dual_clip=rl_cfg.dual_clip if rl_cfg.dual_clip > 0 else None,
    )
  elif loss_type == "cispo":
    pg, ratio = losses.cispo_loss(logp, beh, adv, rl_cfg.clip_low, rl_cfg.clip_high)
  elif loss_type in ("gspo", "gspo_token"):
    # With seq-mean-token-mean aggregation (enforced for 'gspo' by validation)
    # GSPO-token's loss equals GSPO's sequence-level loss (arXiv:2507.18071).
    pg, ratio = losses.gspo_token_loss(
        logp, beh, adv, mask, rl_cfg.clip_low, rl_cfg.clip_high
    )
  else:
    raise ValueError(f"rl.loss_type={loss_type!r}: unknown; known {losses.LOSS_TYPES}")
  norm = rl_cfg.loss_norm_constant or None
  agg = lambda x: losses.aggregate(
      x, mask, rl_cfg.loss_agg_mode, norm_constant=norm, denominator=denominator
  )
  kl = losses.kl_estimate(rl_cfg.kl_estimator, logp, batch["ref_logp"])
  pg_loss, kl_mean, ent_mean = agg(pg), agg(kl), agg(entropy)
  loss = pg_loss + kl_coef * kl_mean - rl_cfg.entropy_coef * ent_mean
  f32 = lambda x: x.astype(jnp.float32)
  metrics = {
      "loss": loss,
      "pg_loss": pg_loss,
      "kl": kl_mean,
      "entropy": ent_mean,
      "ratio_mean": agg(ratio),
      "clip_frac_low": agg(f32((ratio < 1.0 - rl_cfg.clip_low) & (adv < 0))),
      "clip_frac_high": agg(f32((ratio > 1.0 + rl_cfg.clip_high) & (adv > 0))),
  }
  return loss, metrics


def make_update_fn(config, graphdef: nnx.GraphDef,
                   tx: optax.GradientTransformation):
  """Returns pure `update(params, opt_state, batch, kl_coef) -> (params, opt_state, metrics)`.

  `batch` holds [B, L] arrays: tokens, mask (POLICY tokens), behaviour_logp,
  ref_logp, advantage. It is split into `rl.num_minibatches` contiguous minibatches
  (whole groups when rows are group-major), swept `rl.ppo_epochs` times with
  `lax.scan`, one optimizer step per minibatch. Each minibatch is further split
  into `rl.num_microbatches` for gradient accumulation; the loss denominator is
  computed once over the whole minibatch (the optimizer batch), so accumulation
  does not change the loss or its gradient. Metrics are means over all optimizer
  steps, plus `ratio_mean_first`, the first step's mean importance ratio (1 up to
  float error: behaviour log-probs come from the same model function).
  """
  rl_cfg = config.rl
  num_mb = rl_cfg.num_minibatches
  num_micro = rl_cfg.num_microbatches
  epochs = rl_cfg.ppo_epochs
  norm = rl_cfg.loss_norm_constant or None

  def split(tree, n):
    return jax.tree.map(lambda x: x.reshape((n, x.shape[0] // n) + x.shape[1:]), tree)

  def update(params, opt_state, batch, kl_coef):
    mb_batch = split(batch, num_mb)

    def mb_update(carry, mb):
      params, opt_state = carry
      denominator = losses.aggregation_denominator(
          mb["mask"], rl_cfg.loss_agg_mode, norm_constant=norm
      )

      grad_fn = jax.value_and_grad(
          lambda p, micro_batch: _rl_loss(graphdef, p, micro_batch, rl_cfg,
                                          kl_coef=kl_coef, denominator=denominator),
          has_aux=True,
      )

      def micro(acc, micro_batch):
        (_, m), g = grad_fn(params, micro_batch)
        return jax.tree.map(jnp.add, acc, (g, m)), None

      micro_batches = split(mb, num_micro)
      # Zero accumulators shaped like (grads, metrics) of one micro-batch.
      shapes = jax.eval_shape(
          lambda: grad_fn(params, jax.tree.map(lambda x: x[0], micro_batches))
      )
      zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype),
                           (shapes[1], shapes[0][1]))
      (grads, m), _ = jax.lax.scan(micro, zeros, micro_batches)
      updates, opt_state = tx.update(grads, opt_state, params)
      params = optax.apply_updates(params, updates)
      m["grad_norm"] = optax.tree.norm(grads)
      return (params, opt_state), m

    def epoch(carry, _):
      return jax.lax.scan(mb_update, carry, mb_batch)

    (params, opt_state), m = jax.lax.scan(
        epoch, (params, opt_state), None, length=epochs
    )
    metrics = {k: jnp.mean(v) for k, v in m.items()}
    metrics["ratio_mean_first"] = m["ratio_mean"][0, 0]
    return params, opt_state, metrics

  return update


def token_advantages(rl_cfg, reward: jax.Array, traj: types.Trajectory,
                     max_turns: int):
  """Per-token advantages [B, L] from episode rewards, by `rl.credit`.

  'trajectory': one advantage per episode from `rl.advantage_estimator` (or HDPO),
  on the reward plus, if `rl.pbrs_coef` > 0, the telescoped PBRS return
  sum_k discount^k F_k (closed form; credit.telescoped_episode_returns).
  'per_turn': the reward is placed at the episode's last turn, PBRS terms
  F_k = discount * Phi(s_{k+1}) - Phi(s_k) (Phi = pbrs_coef * facts['progress'],
  Phi(terminal) = 0 for ANSWERED / FORMAT_ERROR endings) are added per turn, the
  per-turn reward-to-go is normalised against the group's returns at the same turn
  index, and each turn's advantage goes to that turn's POLICY tokens.

  Returns:
    (reward [B] actually used, adv_b [B] (per-episode advantage, or the mean |A|
     over turns for 'per_turn', for logging), adv_bl [B, L] float32).
  """
  per_turn = rl_cfg.get("credit", "trajectory") == "per_turn"
  pbrs_coef = rl_cfg.get("pbrs_coef", 0.0)
  discount = rl_cfg.get("discount", 1.0)
  k = max_turns
  phi = None
  if pbrs_coef > 0 or per_turn:
    turn_mask = jnp.arange(k)[None, :] < traj.num_turns[:, None]
    # Episodes that reached an absorbing end (Phi(terminal) = 0) vs cut short.
    terminated = ((traj.finish == types.ANSWERED)
                  | (traj.finish == types.FORMAT_ERROR))
    phi = pbrs_coef * traj.facts["progress"] if pbrs_coef > 0 else None
  if per_turn:
    # Outcome reward at the last turn, PBRS at turn boundaries, reward-to-go,
    # group-relative per turn index, broadcast to each turn's POLICY tokens.
    r_bk = jnp.where(
        jnp.arange(k)[None, :] == (traj.num_turns - 1)[:, None], reward[:, None], 0.0
    ) * turn_mask
    if phi is not None:
      r_bk = credit.shape_turn_rewards(r_bk, phi, turn_mask, discount, terminated)
    returns_bk = advantages.turn_reward_to_go(r_bk, turn_mask, discount)
    adv_bk = advantages.per_turn_grpo_advantages(
        returns_bk, turn_mask, traj.group,
        scale_by_std=rl_cfg.scale_by_std, eps=rl_cfg.adv_eps,
        std_ddof=rl_cfg.std_ddof,
    )
    adv_bl = advantages.broadcast_turn_to_tokens(adv_bk, traj.turn, traj.role)
    adv_b = jnp.sum(jnp.abs(adv_bk) * turn_mask, 1) / jnp.maximum(
        jnp.sum(turn_mask, 1), 1)
  else:
    if phi is not None:
      # Trajectory-level return with PBRS, in closed form (exact in float32).
      reward = credit.telescoped_episode_returns(
          reward, phi, turn_mask, discount, terminated)
    if rl_cfg.advantage_estimator == "hdpo":
      # Accuracy channel + efficiency channel among correct episodes only.
      adv_b = credit.hdpo_advantages(
          traj.facts["correct"].astype(jnp.float32),
          traj.facts["num_tool_calls"].astype(jnp.float32), traj.group,
          efficiency_weight=rl_cfg.hdpo_efficiency_weight, eps=rl_cfg.adv_eps,
      )
    else:
      adv_b = advantages.compute_advantages(
          rl_cfg.advantage_estimator, reward, traj.group,
          scale_by_std=rl_cfg.scale_by_std, eps=rl_cfg.adv_eps,
          std_ddof=rl_cfg.std_ddof,
      )
    adv_bl = advantages.broadcast_to_tokens(adv_b, traj.role)
  return reward, adv_b, adv_bl


def make_collect_fn(config, env, graphdef: nnx.GraphDef,
                    model_config: transformer.TransformerConfig):
  """Returns pure `collect(state) -> (batch, traj, reward, parts, adv_b)`.

  Samples `rl.batch_size // rl.group_size` tasks from fold_in(rng, step), repeats
  each `rl.group_size` times contiguously (group = task index), rolls them out with
  the current policy, scores them, computes GRPO advantages and the reference
  model's log-probs (once per batch), and packs the learner batch.
  """
  rl_cfg = config.rl
  group_size = rl_cfg.group_size
  num_tasks = rl_cfg.batch_size // group_size
  max_len = config.max_len
  temperature = rl_cfg.temperature
  reward_fn = rewards.reward_fn_from_config(config.rl)
  sft_steps = config.sft.steps

  over = rl_cfg.get("dynamic_sampling_oversample", 1)
  overlong_mode = rl_cfg.get("overlong_mode", "none")
  soft_cache = rl_cfg.get("overlong_soft_cache", 0)

  def collect(state: types.TrainState):
    key = jax.random.fold_in(state.rng, state.step)
    task_key, sample_key = jax.random.split(jax.random.fold_in(key, 1))
    num_sampled = num_tasks * over
    tasks = env.sample_tasks(task_key, num_sampled)
    tasks = sharding.constrain_batch(
        jax.tree.map(lambda x: jnp.repeat(x, group_size, axis=0), tasks))
    group = jnp.repeat(jnp.arange(num_sampled, dtype=jnp.int32), group_size)
    traj = rollout.rollout(
        env, tasks, sample_key, max_len=max_len, group=group, graphdef=graphdef,
        params=state.params, model_config=model_config, temperature=temperature,
    )
    # Reward schedules run on the RL step index (0 at the first RL iteration).
    reward, parts = reward_fn(
        traj, state.step - sft_steps, jax.random.fold_in(key, 2)
    )
    if soft_cache > 0:
      reward = reward + batch_policies.soft_overlong_penalty(
          jnp.sum(policy_mask(traj), axis=1), rl_cfg.overlong_soft_max, soft_cache
      )
    info = {}
    if over > 1:
      # DAPO dynamic sampling: keep the first num_tasks groups whose metric varies.
      metric = (reward if rl_cfg.dynamic_sampling_metric == "reward"
                else traj.facts["correct"].astype(jnp.float32))
      keep, usable = batch_policies.select_groups(
          metric.reshape(num_sampled, group_size), num_tasks
      )
      traj, reward, parts = batch_policies.gather_groups(
          (traj, reward, parts), keep, group_size
      )
      traj = traj.replace(
          group=jnp.repeat(jnp.arange(num_tasks, dtype=jnp.int32), group_size)
      )
      info["usable_groups"] = jnp.mean(usable.astype(jnp.float32))
      info["any_usable"] = jnp.any(usable)
    ref_logp, _ = sampling.token_logprobs(
        graphdef, state.ref_params, traj.tokens, temperature
    )
    mask = policy_mask(traj)
    reward, mask = batch_policies.apply_overlong(
        reward, mask, traj.finish, overlong_mode, rl_cfg.get("overlong_reward", 0.0)
    )
    if rl_cfg.kl_reward_coef > 0:
      # KL as a reward penalty (no gradient), estimated on the behaviour samples.
      reward = losses.kl_penalized_rewards(
          reward, traj.logprob, ref_logp, mask, rl_cfg.kl_reward_coef,
          estimator=rl_cfg.kl_estimator,
      )
    reward, adv_b, adv_bl = token_advantages(
        rl_cfg, reward, traj, env.max_turns
    )
    batch = {
        "tokens": traj.tokens,
        "mask": mask,
        "behaviour_logp": traj.logprob,
        "ref_logp": ref_logp,
        "advantage": adv_bl,
    }
    return batch, traj, reward, parts, adv_b, info

  return collect


def make_rl_step(config, env, graphdef: nnx.GraphDef,
                 tx: optax.GradientTransformation,
                 model_config: transformer.TransformerConfig,
                 state_sharding=None) -> StepFn:
  """One GRPO iteration (collect + update) as a single jitted program.

  `state_sharding`: as in `make_sft_step`.
  """
  rl_cfg = config.rl
  group_size = rl_cfg.group_size
  collect = make_collect_fn(config, env, graphdef, model_config)
  update = make_update_fn(config, graphdef, tx)

  def step(state: types.TrainState):
    batch, traj, reward, parts, adv_b, info = collect(state)
    params, opt_state, metrics = update(
        state.params, state.opt_state, batch, state.kl_coef
    )
    if "any_usable" in info:
      # No group with varying outcomes: skip the update (logged), don't crash.
      skip = ~info.pop("any_usable")
      params, opt_state = jax.tree.map(
          lambda old, new: jnp.where(skip, old, new),
          (state.params, state.opt_state), (params, opt_state),
      )
      metrics["skipped_update"] = skip.astype(jnp.float32)
    metrics.update(info)
    kl_coef = state.kl_coef
    if rl_cfg.kl_target > 0:
      kl_coef = losses.adaptive_kl_update(
          kl_coef, metrics["kl"], rl_cfg.kl_target, rl_cfg.kl_horizon,
          rl_cfg.batch_size,
      )
    metrics["kl_coef"] = state.kl_coef
    facts = traj.facts
    reward_gk = reward.reshape(-1, group_size)
    is_const = jnp.all(reward_gk == reward_gk[:, :1], axis=1)
    f32 = lambda x: jnp.mean(x.astype(jnp.float32))
    metrics.update({
        "reward": jnp.mean(reward),
        **{f"reward_{k}": jnp.mean(v) for k, v in parts.items()},
        "accuracy": f32(facts["correct"]),
        "tool_calls": f32(facts["num_tool_calls"]),
        "tool_errors": f32(facts["num_tool_errors"]),
        "format_error_rate": f32(traj.finish == types.FORMAT_ERROR),
        "truncated_rate": f32(traj.finish == types.TRUNCATED),
        "policy_tokens": f32(jnp.sum(batch["mask"], axis=1)),
        "adv_abs_mean": jnp.mean(jnp.abs(adv_b)),
        "zero_variance_groups": f32(is_const),
    })
    state = state.replace(
        step=state.step + 1, params=params, opt_state=opt_state, kl_coef=kl_coef
    )
    return state, metrics

  return jax.jit(step, donate_argnums=0, **sharding.step_jit_kwargs(state_sharding))
