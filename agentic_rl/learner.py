"""Update functions: loss -> grads -> optax, one jitted program per iteration.

`make_sft_step` and `make_rl_step` read the config once and return pure functions
`step(state) -> (state, metrics)`; the data for step s is generated inside from
fold_in(key, s), so a whole iteration (task sampling, multi-turn rollout, rewards,
advantages, reference log-probs and the PPO epochs) is one XLA program.
"""

from __future__ import annotations

import functools
import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from agentic_rl import advantages
from agentic_rl import batch_policies
from agentic_rl import credit
from agentic_rl import losses
from agentic_rl import replay as replay_lib
from agentic_rl import reward_models
from agentic_rl import host_rollout
from agentic_rl import rewards
from agentic_rl import rollout
from agentic_rl import sampling
from agentic_rl import tokenizers
from agentic_rl import tree_rollout
from agentic_rl import sharding
from agentic_rl import types
from agentic_rl.models import transformer
from environments.host import base as host_base

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

  JAX-native environments: one jitted program. Host environments
  (`env.is_host`): the demonstrations come from the host driver, the update is
  jitted.

  `state_sharding` (sharding.tree_shardings of the state) keeps the state's
  layout across steps on a device mesh; the batch is split over the ambient
  mesh's ('data', 'fsdp') axes (sharding.constrain_batch).
  """
  batch_size = config.sft.batch_size
  max_len = config.max_len

  def learn(state: types.TrainState, traj: types.Trajectory):
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

  if host_base.is_host(env):
    learn_jit = jax.jit(learn, donate_argnums=0)  # host envs: one device

    def host_step(state: types.TrainState):
      key = jax.random.fold_in(state.rng, state.step)
      task_key, expert_key = jax.random.split(jax.random.fold_in(key, 0))
      tasks = env.sample_tasks(host_rollout.numpy_rng(task_key), batch_size)
      traj = host_rollout.rollout(env, tasks, expert_key, max_len=max_len)
      return learn_jit(state, traj)

    return host_step

  def step(state: types.TrainState):
    key = jax.random.fold_in(state.rng, state.step)
    task_key, expert_key = jax.random.split(jax.random.fold_in(key, 0))
    tasks = sharding.constrain_batch(env.sample_tasks(task_key, batch_size))
    traj = rollout.rollout(env, tasks, expert_key, max_len=max_len)
    return learn(state, traj)

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
  aux = {}
  if "aux_advantage" in batch:
    # Dense signal as an auxiliary loss (rl.dense_as='aux_loss').
    aux_pg, _ = losses.clipped_surrogate(
        logp, beh, batch["aux_advantage"], rl_cfg.clip_low, rl_cfg.clip_high)
    aux["aux_loss"] = agg(aux_pg)
    loss = loss + aux["aux_loss"]
  f32 = lambda x: x.astype(jnp.float32)
  metrics = {
      "loss": loss,
      "pg_loss": pg_loss,
      "kl": kl_mean,
      "entropy": ent_mean,
      "ratio_mean": agg(ratio),
      "clip_frac_low": agg(f32((ratio < 1.0 - rl_cfg.clip_low) & (adv < 0))),
      "clip_frac_high": agg(f32((ratio > 1.0 + rl_cfg.clip_high) & (adv > 0))),
      **aux,
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

  sil_coef = rl_cfg.get("sil_coef", 0.0)

  def sil_loss(p, sil):
    logp, _ = sampling.token_logprobs(graphdef, p, sil["tokens"],
                                      rl_cfg.temperature)
    return losses.self_imitation_loss(
        logp, sil["mask"], sil["return"], sil["baseline"], sil["valid"])

  def update(params, opt_state, batch, kl_coef):
    batch = dict(batch)
    sil = batch.pop("sil", None)
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
      if sil is not None:
        # SPEAR self-imitation on replayed episodes, every optimizer step.
        sil_value, sil_grads = jax.value_and_grad(sil_loss)(params, sil)
        grads = jax.tree.map(lambda g, h: g + sil_coef * h, grads, sil_grads)
        m["sil_loss"] = sil_value
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
                     max_turns: int, phi_bk1: jax.Array | None = None):
  """Per-token advantages [B, L] from episode rewards, by `rl.credit`.

  'trajectory': one advantage per episode from `rl.advantage_estimator` (or HDPO),
  on the reward plus, if `rl.pbrs_coef` > 0, the telescoped PBRS return
  sum_k discount^k F_k (closed form; credit.telescoped_episode_returns).
  'per_turn': the reward is placed at the episode's last turn, PBRS terms
  F_k = discount * Phi(s_{k+1}) - Phi(s_k) (Phi = pbrs_coef * facts['progress'],
  Phi(terminal) = 0 for ANSWERED / FORMAT_ERROR endings) are added per turn, the
  per-turn reward-to-go is normalised against the group's returns at the same turn
  index, and each turn's advantage goes to that turn's POLICY tokens.

  'gigpo' (`rl.advantage_estimator`, arXiv:2505.10978) ignores `rl.credit`:
  each turn gets the episode's GRPO advantage plus `rl.gigpo_step_weight`
  times its step advantage within the group of steps of the same task that
  start from the same state (`credit.observation_state_keys`), on discounted
  step returns (outcome at the last turn).

  With `rl.tree_branching` set (PORTool tree rollouts), turn k of a leaf gets
  `credit.tree_fork_advantages` of its step at depth min(k + 1, d) (blend
  weight `rl.tree_alpha`); `rl.credit` and the estimator are not used.

  `phi_bk1` ([B, K + 1], optional) replaces the progress fact as the unscaled
  potential (any source: TRACE log-ratio values, a value head, a reward
  model); it is multiplied by `rl.pbrs_coef` like the progress potential. With
  `rl.dense_as='aux_loss'` the shaping is left out here entirely (see
  `dense_aux_advantages`).

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
    if rl_cfg.get("dense_as", "reward") == "aux_loss" or pbrs_coef <= 0:
      phi = None
    elif phi_bk1 is not None:
      phi = pbrs_coef * phi_bk1
    else:
      phi = pbrs_coef * traj.facts["progress"]
  tree_branching = tuple(rl_cfg.get("tree_branching", ()))
  if tree_branching:
    # PORTool: fork-relative advantages blended with the trajectory advantage,
    # per tree (group rows contiguous, leaves in lexicographic order).
    turn_mask = jnp.arange(k)[None, :] < traj.num_turns[:, None]
    adv_gd = jax.vmap(functools.partial(
        credit.tree_fork_advantages, branching=tree_branching,
        alpha=rl_cfg.tree_alpha, scale_by_std=rl_cfg.scale_by_std,
        eps=rl_cfg.adv_eps))(reward.reshape(-1, math.prod(tree_branching)))
    adv_bd = adv_gd.reshape(reward.shape[0], len(tree_branching))
    adv_bk = jnp.where(turn_mask, credit.tree_turn_advantages(adv_bd, k), 0.0)
    adv_b = adv_bd[:, -1]
    adv_bl = advantages.broadcast_turn_to_tokens(adv_bk, traj.turn, traj.role)
  elif rl_cfg.advantage_estimator == "gigpo":
    # GiGPO (arXiv:2505.10978): episode-level GRPO advantage plus the
    # step-level advantage within groups of identical states.
    turn_mask = jnp.arange(k)[None, :] < traj.num_turns[:, None]
    r_bk = jnp.where(
        jnp.arange(k)[None, :] == (traj.num_turns - 1)[:, None], reward[:, None], 0.0
    ) * turn_mask
    returns_bk = advantages.turn_reward_to_go(r_bk, turn_mask, discount)
    adv_b = advantages.grpo_advantages(
        reward, traj.group, scale_by_std=rl_cfg.scale_by_std, eps=rl_cfg.adv_eps)
    keys_bk = credit.observation_state_keys(traj.tokens, traj.role, traj.turn, k)
    adv_s = credit.gigpo_step_advantages(
        returns_bk, keys_bk, turn_mask, traj.group,
        scale_by_std=rl_cfg.scale_by_std, eps=rl_cfg.adv_eps)
    adv_bk = (adv_b[:, None] + rl_cfg.get("gigpo_step_weight", 1.0) * adv_s)
    adv_bl = advantages.broadcast_turn_to_tokens(
        jnp.where(turn_mask, adv_bk, 0.0), traj.turn, traj.role)
  elif per_turn:
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


def dense_aux_advantages(rl_cfg, traj: types.Trajectory, phi_bk1: jax.Array,
                         max_turns: int) -> jax.Array:
  """[B, L] per-token dense credit for `rl.dense_as='aux_loss'`.

  Turn k's POLICY tokens get its shaping reward F_k = discount *
  Phi(s_{k+1}) - Phi(s_k) (Phi = pbrs_coef * phi_bk1, Phi(terminal) = 0 for
  ANSWERED / FORMAT_ERROR endings; Ng et al. 1999), i.e. the one-step TD
  credit of TRACE (papers.md F1-9, inferred form). The learner adds the
  clipped surrogate of this signal to the loss as an auxiliary term, so the
  outcome advantages are unchanged.

  Args:
    rl_cfg: `rl` block (pbrs_coef, discount).
    traj: the batch (num_turns, finish, turn, role).
    phi_bk1: [B, K + 1] unscaled potentials.
    max_turns: K.
  """
  k = max_turns
  turn_mask = jnp.arange(k)[None, :] < traj.num_turns[:, None]
  terminated = ((traj.finish == types.ANSWERED)
                | (traj.finish == types.FORMAT_ERROR))
  f_bk = credit.shape_turn_rewards(
      jnp.zeros(turn_mask.shape, jnp.float32), rl_cfg.pbrs_coef * phi_bk1,
      turn_mask, rl_cfg.get("discount", 1.0), terminated)
  return advantages.broadcast_turn_to_tokens(f_bk, traj.turn, traj.role)


def init_rl_extras(config, state: types.TrainState) -> types.TrainState:
  """Adds the optional RL-phase state: the replay buffer (`rl.replay_capacity`
  > 0) and the dual-ascent multiplier (`rl.dual_constraint` set, starting at
  `rl.dual_init`). Without these switches the state is returned unchanged
  (fields stay None), so checkpoints of such runs keep their structure."""
  rl_cfg = config.rl
  if rl_cfg.get("replay_capacity", 0) > 0 and state.replay is None:
    state = state.replace(
        replay=replay_lib.init(rl_cfg.replay_capacity, config.max_len))
  if rl_cfg.get("dual_constraint", "") and state.dual_coef is None:
    state = state.replace(dual_coef=jnp.float32(rl_cfg.dual_init))
  return state


def dual_coef_update(rl_cfg, lam: jax.Array, observed: jax.Array) -> jax.Array:
  """One projected dual-ascent step on the constraint multiplier.

  'max' (E[g] <= target): lam' = max(0, lam + lr (observed - target));
  'min' (E[g] >= target): lam' = max(0, lam + lr (target - observed))
  (`rewards.dual_ascent_update`; RCPO, arXiv:1805.11074).

  Args:
    rl_cfg: the `rl` config block (dual_sense, dual_target, dual_lr).
    lam: float32 scalar multiplier.
    observed: float32 scalar, the batch mean of the constrained fact.

  Returns:
    float32 scalar.
  """
  sign = 1.0 if rl_cfg.get("dual_sense", "max") == "max" else -1.0
  return rewards.dual_ascent_update(
      lam, sign * observed, sign * rl_cfg.dual_target, rl_cfg.dual_lr)


def make_collect_fn(config, env, graphdef: nnx.GraphDef,
                    model_config: transformer.TransformerConfig,
                    reward_model: reward_models.FrozenRewardModel | None = None):
  """Returns pure `collect(state, first_traj=None) -> (batch, traj, reward,
  parts, adv_b, info, extras)`.

  `first_traj`: the first round's rollout when it was made outside the jitted
  program (host environments, see `make_host_rollout_fn`); None rolls out here.

  `reward_model` (with its params in `state.reward_model`, set when
  `rl.reward_model_dir` is): every rollout round is scored by the frozen RM in
  one batched pass (reward_models.trajectory_rm_outputs), stored as env facts
  'rm_score' [B] (read by the `rm` reward component) and 'rm_potential'
  [B, K + 1] (the PBRS potential when `rl.pbrs_potential` is 'rm').

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
  max_retries = rl_cfg.get("dynamic_sampling_max_retries", 0)
  overlong_mode = rl_cfg.get("overlong_mode", "none")
  soft_cache = rl_cfg.get("overlong_soft_cache", 0)
  use_replay = rl_cfg.get("replay_capacity", 0) > 0
  replay_inject = rl_cfg.get("replay_inject", False)
  replay_threshold = rl_cfg.get("replay_success_threshold", 1.0)
  sil_coef = rl_cfg.get("sil_coef", 0.0)
  dual_fact = rl_cfg.get("dual_constraint", "")
  tree_branching = tuple(rl_cfg.get("tree_branching", ()))
  likelihood_coef = rl_cfg.get("likelihood_coef", 0.0)
  potential = rl_cfg.get("pbrs_potential", "progress")
  use_gold = likelihood_coef > 0 or (
      potential == "trace" and rl_cfg.get("pbrs_coef", 0.0) > 0)
  dense_aux = rl_cfg.get("dense_as", "reward") == "aux_loss"
  dual_sign = 1.0 if rl_cfg.get("dual_sense", "max") == "max" else -1.0

  def sample_round(state, round_key, noise_key, num_groups, traj=None):
    """Rolls out num_groups groups of group_size episodes and scores them.

    `traj`: the round's trajectory when it was rolled out outside this program
    (host environments: `make_host_rollout_fn` with the same keys).
    """
    task_key, sample_key = jax.random.split(round_key)
    if traj is None and tree_branching:
      tasks = env.sample_tasks(task_key, num_groups)
      # PORTool tree: each group is one task's tree of group_size leaves.
      traj = tree_rollout.tree_rollout(
          env, tasks, sample_key, max_len=max_len, branching=tree_branching,
          graphdef=graphdef, params=state.params, model_config=model_config,
          temperature=temperature)
    elif traj is None:
      tasks = env.sample_tasks(task_key, num_groups)
      tasks = sharding.constrain_batch(
          jax.tree.map(lambda x: jnp.repeat(x, group_size, axis=0), tasks))
      group = jnp.repeat(jnp.arange(num_groups, dtype=jnp.int32), group_size)
      traj = rollout.rollout(
          env, tasks, sample_key, max_len=max_len, group=group,
          graphdef=graphdef, params=state.params, model_config=model_config,
          temperature=temperature,
      )
    if reward_model is not None:
      # Frozen learned RM: episode score and per-state potentials, one pass.
      rm_out = reward_models.trajectory_rm_outputs(
          reward_model, state.reward_model, traj.tokens, traj.role, traj.turn,
          env.max_turns)
      traj = traj.replace(facts=dict(traj.facts, rm_score=rm_out["score"],
                                     rm_potential=rm_out["potential"]))
    # Reward schedules run on the RL step index (0 at the first RL iteration).
    reward, parts = reward_fn(traj, state.step - sft_steps, noise_key)
    if soft_cache > 0:
      reward = reward + batch_policies.soft_overlong_penalty(
          jnp.sum(policy_mask(traj), axis=1), rl_cfg.overlong_soft_max, soft_cache
      )
    return traj, reward, parts

  def ds_metric_gk(traj, reward):
    metric = (reward if rl_cfg.dynamic_sampling_metric == "reward"
              else traj.facts["correct"].astype(jnp.float32))
    return metric.reshape(-1, group_size)

  def collect(state: types.TrainState, first_traj=None):
    key = jax.random.fold_in(state.rng, state.step)
    num_sampled = num_tasks * over
    traj, reward, parts = sample_round(
        state, jax.random.fold_in(key, 1), jax.random.fold_in(key, 2), num_sampled,
        traj=first_traj,
    )
    info = {}
    if over > 1:
      # DAPO dynamic sampling: keep the first num_tasks groups whose metric
      # varies; with retries, roll out fresh groups into the remaining slots
      # (at most max_retries more rounds, stopping once the batch is full).
      keep, usable = batch_policies.select_groups(
          ds_metric_gk(traj, reward), num_tasks
      )
      kept = batch_policies.gather_groups((traj, reward, parts), keep, group_size)
      filled = jnp.sum(usable.astype(jnp.int32))
      rounds = jnp.int32(1)
      if max_retries > 0:
        retry_key = jax.random.fold_in(key, 3)

        def retry_cond(carry):
          _, filled, r = carry
          return (filled < num_tasks) & (r <= max_retries)

        def retry_body(carry):
          kept, filled, r = carry
          round_key = jax.random.fold_in(retry_key, r)
          new = sample_round(state, jax.random.fold_in(round_key, 1),
                             jax.random.fold_in(round_key, 2), num_sampled)
          kept, filled = batch_policies.refill_groups(
              kept, filled, new, ds_metric_gk(new[0], new[1]), group_size
          )
          return kept, filled, r + 1

        kept, filled, rounds = jax.lax.while_loop(
            retry_cond, retry_body, (kept, filled, rounds)
        )
      traj, reward, parts = kept
      traj = traj.replace(
          group=jnp.repeat(jnp.arange(num_tasks, dtype=jnp.int32), group_size)
      )
      info["usable_groups"] = filled.astype(jnp.float32) / num_tasks
      info["dynamic_sampling_rounds"] = rounds.astype(jnp.float32)
      info["any_usable"] = filled > 0
    mask = policy_mask(traj)
    reward, mask = batch_policies.apply_overlong(
        reward, mask, traj.finish, overlong_mode, rl_cfg.get("overlong_reward", 0.0)
    )
    extras = {}
    phi_bk1 = None
    if use_gold:
      # One batched pass of the reference model over every (episode, state).
      gold_lp = credit.gold_answer_logprobs(
          lambda x: sampling.token_logprobs(
              graphdef, state.ref_params, x, temperature)[0],
          traj.tokens, traj.role, traj.turn, traj.facts["gold_answer"],
          traj.facts["gold_answer_len"], num_turns=env.max_turns,
          answer_prefix=(tokenizers.ANSWER,), pad_id=tokenizers.PAD)
      if likelihood_coef > 0:
        lik = credit.likelihood_reward(gold_lp, traj.num_turns, traj.finish)
        reward = reward + likelihood_coef * lik
        info["likelihood"] = jnp.mean(lik)
      if potential == "trace":
        phi_bk1 = credit.log_ratio_potential(gold_lp)
    if potential == "rm" and reward_model is not None:
      phi_bk1 = traj.facts["rm_potential"]  # learned-RM potential (issue 7)
    if dense_aux and rl_cfg.pbrs_coef > 0:
      extras["aux_advantage"] = dense_aux_advantages(
          rl_cfg, traj, traj.facts["progress"] if phi_bk1 is None else phi_bk1,
          env.max_turns)
    if dual_fact:
      # Lagrangian reward R - lam * g ('max': E[g] <= target) or R + lam * g
      # ('min': E[g] >= target); lam adapts by dual ascent (make_rl_step).
      g_b = traj.facts[dual_fact].astype(jnp.float32)
      reward = reward - dual_sign * state.dual_coef * g_b
      extras["dual_observed"] = jnp.mean(g_b)
    train_traj = traj
    if use_replay:
      fresh_keys = replay_lib.task_keys(traj.tokens, traj.role)
      if replay_inject:
        tokens, role, logprob, reward, injected = (
            replay_lib.inject_into_failed_groups(
                state.replay, traj.tokens, traj.role, traj.logprob, reward,
                group_size, replay_threshold))
        train_traj = traj.replace(tokens=tokens, role=role, logprob=logprob)
        mask = jnp.where(injected[:, None], role == types.POLICY, mask)
        info["replay_injected"] = jnp.sum(injected.astype(jnp.float32))
      if sil_coef > 0:
        buf = state.replay
        slots = replay_lib.sample_slots(
            buf, jax.random.fold_in(key, 4), rl_cfg.sil_batch_size)
        extras["sil"] = {
            "tokens": buf.tokens[slots],
            "mask": buf.role[slots] == types.POLICY,
            "return": buf.reward[slots],
            "baseline": replay_lib.sil_baselines(buf.key[slots], fresh_keys,
                                                 reward),
            "valid": buf.valid[slots],
        }
      extras["replay"] = replay_lib.insert(
          state.replay, fresh_keys, traj.tokens, traj.role, traj.logprob,
          reward, reward >= replay_threshold, state.step)
      info["replay_size"] = jnp.sum(extras["replay"].valid.astype(jnp.float32))
    ref_logp, _ = sampling.token_logprobs(
        graphdef, state.ref_params, train_traj.tokens, temperature
    )
    if rl_cfg.kl_reward_coef > 0:
      # KL as a reward penalty (no gradient), estimated on the behaviour samples.
      reward = losses.kl_penalized_rewards(
          reward, train_traj.logprob, ref_logp, mask, rl_cfg.kl_reward_coef,
          estimator=rl_cfg.kl_estimator,
      )
    reward, adv_b, adv_bl = token_advantages(
        rl_cfg, reward, train_traj, env.max_turns, phi_bk1=phi_bk1
    )
    batch = {
        "tokens": train_traj.tokens,
        "mask": mask,
        "behaviour_logp": train_traj.logprob,
        "ref_logp": ref_logp,
        "advantage": adv_bl,
    }
    if "sil" in extras:
      batch["sil"] = extras.pop("sil")
    if "aux_advantage" in extras:
      batch["aux_advantage"] = jnp.where(mask, extras.pop("aux_advantage"), 0.0)
    return batch, traj, reward, parts, adv_b, info, extras

  return collect


def make_host_rollout_fn(config, env, graphdef: nnx.GraphDef,
                         model_config: transformer.TransformerConfig):
  """Returns `rollout_fn(state) -> Trajectory`: the first-round RL rollout of a
  host environment (`env.is_host`), driven by agentic_rl/host_rollout.py.

  Same keys and grouping as the JAX-native round in `make_collect_fn`: tasks
  from a numpy Generator seeded by fold_in(fold_in(rng, step), 1)'s task half,
  each repeated `rl.group_size` times contiguously (group = task index).
  """
  rl_cfg = config.rl
  group_size = rl_cfg.group_size
  num_sampled = rl_cfg.batch_size // group_size * rl_cfg.get(
      "dynamic_sampling_oversample", 1)

  def rollout_fn(state: types.TrainState) -> types.Trajectory:
    key = jax.random.fold_in(state.rng, state.step)
    task_key, sample_key = jax.random.split(jax.random.fold_in(key, 1))
    tasks = env.sample_tasks(host_rollout.numpy_rng(task_key), num_sampled)
    tasks = [t for t in tasks for _ in range(group_size)]
    group = np.repeat(np.arange(num_sampled, dtype=np.int32), group_size)
    return host_rollout.rollout(
        env, tasks, sample_key, max_len=config.max_len, group=group,
        graphdef=graphdef, params=state.params, model_config=model_config,
        temperature=rl_cfg.temperature,
    )

  return rollout_fn


def make_rl_step(config, env, graphdef: nnx.GraphDef,
                 tx: optax.GradientTransformation,
                 model_config: transformer.TransformerConfig,
                 state_sharding=None,
                 reward_model: reward_models.FrozenRewardModel | None = None,
                 ) -> StepFn:
  """One GRPO iteration (collect + update) as a single jitted program.

  `state_sharding`: as in `make_sft_step`. `reward_model`: the frozen learned
  RM (params in `state.reward_model`; see `make_collect_fn`); its
  over-optimisation monitor (`reward_models.monitor_metrics`: rm_reward,
  verified_reward, rm_gap, rm_verified_corr, rm_false_positive_rate, plus the
  mean raw rm_score) is added to the metrics of every iteration.
  """
  rl_cfg = config.rl
  group_size = rl_cfg.group_size
  collect = make_collect_fn(config, env, graphdef, model_config, reward_model)
  rm_params = dict(rl_cfg.get("reward_params", {}) or {}).get("rm", {})
  rm_params = dict(rm_params.to_dict() if hasattr(rm_params, "to_dict") else rm_params)
  update = make_update_fn(config, graphdef, tx)

  def step(state: types.TrainState, first_traj=None):
    batch, traj, reward, parts, adv_b, info, extras = collect(state, first_traj)
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
    dual_coef = state.dual_coef
    if "dual_observed" in extras:
      metrics["dual_coef"] = state.dual_coef
      metrics["dual_observed"] = extras["dual_observed"]
      dual_coef = dual_coef_update(rl_cfg, state.dual_coef, extras["dual_observed"])
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
    if reward_model is not None:
      # Gold-verifier over-optimisation monitor (Gao et al., arXiv:2210.10760).
      rm_r = parts["rm"] if "rm" in parts else rewards.rm_reward(traj, **rm_params)
      metrics.update(reward_models.monitor_metrics(rm_r, facts["correct"]))
      metrics["rm_score"] = jnp.mean(facts["rm_score"])
    state = state.replace(
        step=state.step + 1, params=params, opt_state=opt_state, kl_coef=kl_coef,
        replay=extras.get("replay", state.replay), dual_coef=dual_coef,
    )
    return state, metrics

  if host_base.is_host(env):
    # Host environments: the rollout runs in Python between jitted turns; the
    # rest of the iteration is one jitted program.
    rollout_fn = make_host_rollout_fn(config, env, graphdef, model_config)
    learn_jit = jax.jit(step, donate_argnums=0)  # host envs: one device
    return lambda state: learn_jit(state, rollout_fn(state))

  return jax.jit(step, donate_argnums=0, **sharding.step_jit_kwargs(state_sharding))
