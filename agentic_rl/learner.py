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
from agentic_rl import mixed_precision
from agentic_rl import replay as replay_lib
from agentic_rl import reward_models
from agentic_rl import host_rollout
from agentic_rl import rewards
from agentic_rl import rollout
from agentic_rl import sampling
from agentic_text import tokenizers
from agentic_rl import tree_rollout
from agentic_rl import sharding
from agentic_rl import types
from agentic_rl.models import lora as lora_lib
from agentic_rl.models import transformer
from environments.host import base as host_base

StepFn = Callable[[types.TrainState], tuple[types.TrainState, dict[str, jax.Array]]]


def make_optimizer(cfg) -> optax.GradientTransformation:
  """AdamW with global-norm clipping and linear warmup then constant LR.

  The learning rate of update k (k = 0, 1, ...) is lr * k / warmup_steps during
  the warmup, then lr; warmup_steps = 0 means lr from the first update (a
  one-step linear schedule would give the first update a learning rate of 0).

  Low-precision (bfloat16) parameters get float32 master weights and float32
  optimizer state (`mixed_precision.with_float32_master`); for float32
  parameters the optimizer and its state are the plain chain.

  Args:
    cfg: ConfigDict with learning_rate, warmup_steps, weight_decay, max_grad_norm.
  """
  if int(cfg.warmup_steps) <= 0:
    schedule = optax.constant_schedule(cfg.learning_rate)
  else:
    schedule = optax.linear_schedule(0.0, cfg.learning_rate, int(cfg.warmup_steps))
  # With LoRA adapters in the params, only they are optimised (models/lora.py);
  # low-precision trainable params get float32 master weights.
  return lora_lib.optimizer(mixed_precision.with_float32_master(optax.chain(
      optax.clip_by_global_norm(cfg.max_grad_norm),
      optax.adamw(schedule, b1=0.9, b2=0.99, weight_decay=cfg.weight_decay),
  )))


def policy_mask(traj: types.Trajectory) -> jax.Array:
  """[B, L] bool loss mask: True exactly on POLICY (sampled) tokens."""
  return traj.role == types.POLICY


def sft_loss(graphdef, params, traj: types.Trajectory, denominator=None):
  """Token-mean negative log-likelihood of the POLICY tokens of demonstrations.

  Args:
    graphdef, params: the policy.
    traj: demonstrations, [B, L] arrays.
    denominator: the token count to divide the summed NLL by; None = this
      batch's POLICY-token count (clamped to >= 1). Gradient accumulation passes
      the whole batch's count so that the micro-batch losses sum to the
      full-batch token mean.

  Returns:
    (loss, {"loss", "policy_tokens"}): float32 scalars; policy_tokens is the
    mean POLICY-token count per demonstration.
  """
  logp, _ = sampling.token_logprobs(graphdef, params, traj.tokens, 1.0)
  mask = policy_mask(traj)
  if denominator is None:
    nll = losses.token_mean(-logp, mask)
  else:
    nll = jnp.sum(-logp * mask.astype(jnp.float32)) / denominator
  policy_tokens = jnp.mean(jnp.sum(mask, axis=1).astype(jnp.float32))
  return nll, {"loss": nll, "policy_tokens": policy_tokens}


def sft_grad(graphdef, params, traj: types.Trajectory, num_microbatches: int = 1):
  """(loss, metrics, grads) of `sft_loss` with gradient accumulation.

  The [B, L] batch is cut into `num_microbatches` blocks of rows by a strided
  split (row i in block i % num_microbatches, `sharding.split_rows`, so that
  on a device mesh every block keeps each device's share of the rows),
  scanned with `lax.scan`; each block's summed NLL is divided by the whole
  batch's POLICY-token count, so the accumulated loss and gradient equal the
  full-batch token mean (up to float summation order) while only one block's
  activations are live at a time.

  Raises:
    ValueError: if num_microbatches does not divide B.
  """
  rows = traj.tokens.shape[0]
  if num_microbatches < 1 or rows % num_microbatches:
    raise ValueError(f"sft.num_microbatches={num_microbatches} must divide the "
                     f"batch ({rows} demonstrations)")
  # With LoRA adapters, only they are differentiated (models/lora.py).
  grad_fn = lora_lib.value_and_grad(
      lambda p, t, d: sft_loss(graphdef, p, t, d), has_aux=True)
  if num_microbatches == 1:
    (loss, metrics), grads = grad_fn(params, traj, None)
    return loss, metrics, grads
  mask = policy_mask(traj)
  denominator = jnp.maximum(jnp.sum(mask.astype(jnp.float32)), 1.0)
  # Only the fields sft_loss reads are cut into blocks.
  blocks = sharding.split_rows((traj.tokens, traj.role), num_microbatches)

  def micro(acc, block):
    tokens, role = sharding.constrain_batch(block)
    (loss, m), g = grad_fn(params, traj.replace(tokens=tokens, role=role),
                           denominator)
    acc_loss, acc_tokens, acc_g = acc
    return (acc_loss + loss, acc_tokens + m["policy_tokens"],
            mixed_precision.accumulate(acc_g, g)), None

  zeros = mixed_precision.accumulation_zeros(params)  # f32 for bf16 params
  (loss, tokens, grads), _ = jax.lax.scan(
      micro, (jnp.float32(0.0), jnp.float32(0.0), zeros), blocks)
  return loss, {"loss": loss, "policy_tokens": tokens / num_microbatches}, grads


def make_sft_step(config, env, graphdef: nnx.GraphDef,
                  tx: optax.GradientTransformation, state_sharding=None) -> StepFn:
  """SFT on expert demonstrations generated on the fly (one batch per step).

  JAX-native environments: one jitted program. Host environments
  (`env.is_host`): the demonstrations come from the host driver, the update is
  jitted.

  `state_sharding` (sharding.tree_shardings of the state) keeps the state's
  layout across steps on a device mesh; the batch is split over the ambient
  mesh's ('data', 'fsdp') axes (sharding.constrain_batch).
  `sft.num_microbatches` (default 1) accumulates the gradient over that many
  blocks of the batch (`sft_grad`): same loss and update, less memory.
  """
  batch_size = config.sft.batch_size
  num_microbatches = config.sft.get("num_microbatches", 1)
  max_len = config.max_len

  def learn(state: types.TrainState, traj: types.Trajectory):
    _, metrics, grads = sft_grad(graphdef, state.params, traj, num_microbatches)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics["grad_norm"] = optax.tree.norm(grads)
    metrics["expert_tool_calls"] = jnp.mean(traj.facts["num_tool_calls"])
    # Trained (POLICY) tokens / all B * L tokens of the demonstration buffer.
    metrics["trained_token_share"] = jnp.mean(
        policy_mask(traj).astype(jnp.float32))
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


# Where the behaviour log-probs of the importance ratio come from
# (`rl.behaviour_logprobs`, see `behaviour_forward`).
BEHAVIOUR_LOGPROBS = ("trainer", "sampler")
# Potentials of PBRS (`rl.pbrs_potential`).
PBRS_POTENTIALS = ("progress", "trace", "value", "obs_prediction")


def policy_forward(graphdef, params, tokens_bl: jax.Array,
                   temperature, with_values: bool = False,
                   targets_bl: jax.Array | None = None):
  """Teacher-forced log-probs, entropies and (optionally) values of a batch.

  The one function both the loss and the behaviour recomputation call, so the
  two see the same computation. Without values it is exactly
  `sampling.token_logprobs`. With values, one trunk pass gives both heads:
  hidden h_t = model.hidden_states(tokens[:, :-1])[:, t] reads tokens 0..t,
  logp[:, t + 1] = log_softmax(lm_head(h_t) / T)[tokens[:, t + 1]] and
  values[:, t + 1] = model.value(h_t): the value of a token is the value of
  the state (the whole prefix, prompt, observations and template tokens
  included) just BEFORE that token is emitted, i.e. V(s) of the state in
  which the token is the action. Position 0 gets 0 for all three.

  Args:
    graphdef, params: the policy (value_head=True when with_values).
    tokens_bl: [B, L] int32.
    temperature: sampling temperature (> 0).
    with_values: also return values (needs TransformerConfig.value_head).
    targets_bl: optional [B, L] int32 tokens to score in place of tokens_bl
      (the context stays tokens_bl): logp[:, t] = log p(targets[:, t] |
      tokens[:, :t]). Used by the shuffled-label placebo of the auxiliary
      next-observation loss (`rl.obs_prediction_placebo`, which changes
      targets at TOOL positions only). None = tokens_bl.

  Returns:
    (logp [B, L] float32, entropy [B, L] float32, values [B, L] float32 or
     None).

  Raises:
    ValueError: with_values and the model has no value head.
  """
  if not with_values and targets_bl is None:
    logp, entropy = sampling.token_logprobs(graphdef, params, tokens_bl,
                                            temperature)
    return logp, entropy, None
  model = nnx.merge(graphdef, params)
  hidden_bld, _ = model.hidden_states(tokens_bl[:, :-1])
  targets_bl = tokens_bl if targets_bl is None else targets_bl
  logp, entropy = sampling.chunked_logprob_and_entropy(
      hidden_bld, model.output_weights_dv(), targets_bl[:, 1:], temperature,
      model.cfg.logprob_chunk_size)
  pad = jnp.zeros((tokens_bl.shape[0], 1), jnp.float32)
  cat = lambda x: jnp.concatenate([pad, x.astype(jnp.float32)], axis=1)
  if not with_values:
    return cat(logp), cat(entropy), None
  values = model.value(hidden_bld)
  return cat(logp), cat(entropy), cat(values)


def _uses_values(rl_cfg) -> bool:
  """True when the loss trains the value head (GAE, or the value potential)."""
  return (rl_cfg.get("advantage_estimator", "grpo") == "gae"
          or (rl_cfg.get("pbrs_potential", "progress") == "value"
              and rl_cfg.get("pbrs_coef", 0.0) > 0))


@functools.lru_cache(maxsize=None)
def log_partition_graphdef(in_dim: int, hidden_dim: int) -> nnx.GraphDef:
  """GraphDef of FlowRL's `losses.LogPartition(in_dim, hidden_dim)`."""
  return nnx.graphdef(nnx.eval_shape(
      lambda: losses.LogPartition(in_dim, hidden_dim, rngs=nnx.Rngs(0))))


def make_log_partition_optimizer(rl_cfg) -> optax.GradientTransformation:
  """Adam on FlowRL's log-partition parameters, lr `rl.flowrl_log_z_lr`."""
  return optax.adam(rl_cfg.get("flowrl_log_z_lr", 1e-3))


def _rl_loss(graphdef, params, batch, rl_cfg, *, kl_coef, denominator,
             log_z_params=None, value_denominator=None, first_step=None,
             obs_denominator=None):
  """Policy loss on one micro-batch, aggregated with a batch-wide denominator.

  loss = agg(policy_loss) + kl_coef * agg(KL) - entropy_coef * agg(entropy)
  [+ value_coef * value_loss], each aggregated by `rl.loss_agg_mode` over
  POLICY tokens with `denominator` computed over the whole optimizer batch
  (losses.aggregation_denominator), so summing the micro-batch losses gives
  exactly the full-batch loss. The value loss (present when the batch holds
  'old_values' and 'returns': GAE or the value potential) is token-mean with
  `value_denominator`, the optimizer batch's POLICY-token count.
  `rl.loss_type='flowrl'` replaces the policy term by `losses.flowrl_loss`
  with log Z from `log_z_params` (a `losses.LogPartition` state) applied to
  the batch's 'prompt_embedding'; its gradient flows to `log_z_params` too.
  With 'obs_mask' in the batch (`rl.obs_prediction_coef` > 0) the loss adds
  obs_prediction_coef * the next-observation cross-entropy over TOOL tokens
  (`credit.observation_prediction_loss`, divided by `obs_denominator`, the
  optimizer batch's TOOL-token count), on 'obs_targets' when present (the
  shuffled placebo labels) and on the observations themselves otherwise.

  `first_step` (traced bool, `rl.behaviour_logprobs='trainer'` only): True on
  the update's first optimizer step, whose parameters ARE the behaviour
  parameters. There the behaviour log-probs are this forward's own
  stop_gradient(logp), so every ratio is exactly 1 however XLA compiles the
  program (the separately recomputed `behaviour_forward` log-probs agree
  only to ~5e-7 inside one fused jitted iteration; their gap is logged as
  'behaviour_gap_max'); the gradient is unchanged (rho A grad logp with
  rho = 1). Later steps use the batch's behaviour log-probs. With
  'behaviour_shift' in the batch (dual-path tool-free rows, see
  `masked_behaviour_logprobs`) the first step's behaviour log-prob is
  stop_gradient(logp) + shift, the masked distribution's log-prob, so those
  rows' first ratio is 1 - P(banned) (the unmasked policy over the masked
  behaviour), as with `rl.behaviour_logprobs='sampler'`.

  Returns:
    (loss scalar, metrics dict of scalars, each already divided by `denominator`
     for the aggregated terms so micro-batch values sum to batch values;
     keys ending in '_max' are maxima, to be combined with max).
  """
  temperature = rl_cfg.temperature
  with_values = "returns" in batch
  logp, entropy, values = policy_forward(graphdef, params, batch["tokens"],
                                         temperature, with_values,
                                         targets_bl=batch.get("obs_targets"))
  mask = batch["mask"]
  beh = batch["behaviour_logp"]
  own = jax.lax.stop_gradient(logp)
  if "behaviour_shift" in batch:
    # Dual-path tool-free rows were sampled from the masked distribution:
    # its log-prob is this forward's plus -log(1 - P(banned)).
    own = own + batch["behaviour_shift"]
  beh_gap_max = jnp.max(jnp.where(mask, jnp.abs(own - beh), 0.0))
  if (first_step is not None
      and rl_cfg.get("behaviour_logprobs", "trainer") == "trainer"):
    beh = jnp.where(first_step, own, beh)
  adv = batch["advantage"]
  loss_type = rl_cfg.loss_type
  flow = None
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
  elif loss_type == "flowrl":
    emb = batch["prompt_embedding"]
    z_graphdef = log_partition_graphdef(
        emb.shape[-1], rl_cfg.get("flowrl_log_z_hidden", 0))
    log_z_b = nnx.merge(z_graphdef, log_z_params)(emb)
    flow, _ = losses.flowrl_loss(
        logp, beh, batch["ref_logp"], mask, batch["reward_hat"], log_z_b,
        beta=rl_cfg.flowrl_beta, clip_eps=rl_cfg.flowrl_clip,
        denominator=denominator)
    ratio = jnp.exp(logp - beh)
    pg = jnp.zeros_like(logp)
  else:
    raise ValueError(f"rl.loss_type={loss_type!r}: unknown; known {losses.LOSS_TYPES}")
  norm = rl_cfg.loss_norm_constant or None
  agg = lambda x: losses.aggregate(
      x, mask, rl_cfg.loss_agg_mode, norm_constant=norm, denominator=denominator
  )
  kl = losses.kl_estimate(rl_cfg.kl_estimator, logp, batch["ref_logp"])
  pg_loss, kl_mean, ent_mean = agg(pg), agg(kl), agg(entropy)
  extra = {}
  if flow is not None:
    pg_loss = flow
    extra["log_z"] = losses.aggregate(
        jnp.broadcast_to(log_z_b[:, None], mask.shape), mask,
        "seq-mean-token-mean", denominator=denominator)
  loss = pg_loss + kl_coef * kl_mean - rl_cfg.entropy_coef * ent_mean
  if with_values:
    clip = rl_cfg.get("value_clip", 0.0)
    v_loss = losses.value_loss(
        values, batch["old_values"], batch["returns"], mask,
        clip if clip > 0 else jnp.inf, denominator=value_denominator)
    extra["value_loss"] = v_loss
    loss = loss + rl_cfg.get("value_coef", 0.5) * v_loss
  if "aux_advantage" in batch:
    # Dense signal as an auxiliary loss (rl.dense_as='aux_loss').
    aux_pg, _ = losses.clipped_surrogate(
        logp, beh, batch["aux_advantage"], rl_cfg.clip_low, rl_cfg.clip_high)
    extra["aux_loss"] = agg(aux_pg)
    loss = loss + extra["aux_loss"]
  if "obs_mask" in batch:
    # Next-observation prediction as an auxiliary CE (docs/papers.md).
    extra["obs_pred_loss"] = credit.observation_prediction_loss(
        logp, batch["obs_mask"], obs_denominator)
    loss = loss + rl_cfg.obs_prediction_coef * extra["obs_pred_loss"]
  f32 = lambda x: x.astype(jnp.float32)
  metrics = {
      "loss": loss,
      "pg_loss": pg_loss,
      "kl": kl_mean,
      "entropy": ent_mean,
      "ratio_mean": agg(ratio),
      # max |rho - 1| over POLICY tokens (0 exactly when logp == behaviour).
      "ratio_dev_max": jnp.max(jnp.where(mask, jnp.abs(ratio - 1.0), 0.0)),
      # max |logp - batch behaviour logp| over POLICY tokens (before the
      # first-step substitution above).
      "behaviour_gap_max": beh_gap_max,
      "clip_frac_low": agg(f32((ratio < 1.0 - rl_cfg.clip_low) & (adv < 0))),
      "clip_frac_high": agg(f32((ratio > 1.0 + rl_cfg.clip_high) & (adv > 0))),
      **extra,
  }
  return loss, metrics


def _combine_metrics(a: dict, b: dict) -> dict:
  """Micro-batch metric accumulation: sum, except max for '*_max' keys."""
  return {k: (jnp.maximum(a[k], b[k]) if k.endswith("_max") else a[k] + b[k])
          for k in a}


def make_update_fn(config, graphdef: nnx.GraphDef,
                   tx: optax.GradientTransformation):
  """Returns pure `update(params, opt_state, batch, kl_coef[, log_z_state])`.

  `batch` holds [B, L] arrays: tokens, mask (POLICY tokens), behaviour_logp,
  ref_logp, advantage (plus old_values and returns when the value head is
  trained, prompt_embedding [B, D] and reward_hat [B] for FlowRL). It is
  split into `rl.num_minibatches` minibatches by a strided split (row i in
  minibatch i % num_minibatches, `sharding.split_rows`: on a device mesh every
  minibatch keeps each device's share of the rows; with group-major rows each
  minibatch holds an equal share of every group), swept `rl.ppo_epochs` times
  with `lax.scan`, one optimizer step per minibatch. Each minibatch is further
  split (strided again) into `rl.num_microbatches` for gradient accumulation;
  the loss denominator is
  computed once over the whole minibatch (the optimizer batch), so accumulation
  does not change the loss or its gradient. Metrics are means over all optimizer
  steps (maxima for '*_max' keys), plus `ratio_mean_first` and
  `ratio_dev_max_first`, the first optimizer step's mean importance ratio and
  max |ratio - 1| over POLICY tokens, and `behaviour_gap_max_first`, the max
  |logp - batch behaviour logp| there. With `rl.behaviour_logprobs='trainer'`
  the behaviour log-probs come from `behaviour_forward` (the loss's function
  on the same micro-batch shapes) and, on the first optimizer step, from the
  loss's own forward (see `_rl_loss`): the first step's ratios are exactly 1
  (`ratio_dev_max_first == 0`; tests/test_learner.py), except on dual-path
  tool-free rows (batch key 'behaviour_shift'), whose masked behaviour gives
  ratio 1 - P(banned tokens).

  `log_z_state` (FlowRL only): (log-partition params, their optax state);
  they get the loss gradient too and are updated by
  `make_log_partition_optimizer`. Returns (params, opt_state, metrics), and
  with `log_z_state` given (params, opt_state, metrics, log_z_state).
  """
  rl_cfg = config.rl
  num_mb = rl_cfg.num_minibatches
  num_micro = rl_cfg.num_microbatches
  epochs = rl_cfg.ppo_epochs
  norm = rl_cfg.loss_norm_constant or None
  tx_z = make_log_partition_optimizer(rl_cfg)

  split = sharding.split_rows

  sil_coef = rl_cfg.get("sil_coef", 0.0)

  def sil_loss(p, sil):
    logp, _ = sampling.token_logprobs(graphdef, p, sil["tokens"],
                                      rl_cfg.temperature)
    return losses.self_imitation_loss(
        logp, sil["mask"], sil["return"], sil["baseline"], sil["valid"])

  def update(params, opt_state, batch, kl_coef, log_z_state=None):
    batch = dict(batch)
    sil = batch.pop("sil", None)
    mb_batch = split(batch, num_mb)
    z_params, z_opt = (None, None) if log_z_state is None else log_z_state

    def mb_update(carry, xs):
      params, opt_state, z_params, z_opt, step_index = carry
      mb = sharding.constrain_batch(xs)
      denominator = losses.aggregation_denominator(
          mb["mask"], rl_cfg.loss_agg_mode, norm_constant=norm
      )
      value_denominator = losses.aggregation_denominator(
          mb["mask"], "token-mean")
      obs_denominator = None
      if "obs_mask" in mb:
        obs_denominator = jnp.maximum(
            jnp.sum(mb["obs_mask"].astype(jnp.float32)), 1.0)

      grad_fn = lora_lib.value_and_grad(
          lambda p, zp, micro_batch: _rl_loss(
              graphdef, p, micro_batch, rl_cfg, kl_coef=kl_coef,
              denominator=denominator, log_z_params=zp,
              value_denominator=value_denominator,
              first_step=step_index == 0, obs_denominator=obs_denominator),
          argnums=(0, 1), has_aux=True,
      )

      def micro(acc, micro_batch):
        micro_batch = sharding.constrain_batch(micro_batch)
        (_, m), g = grad_fn(params, z_params, micro_batch)
        acc_g, acc_m = acc
        return (mixed_precision.accumulate(acc_g, g),
                _combine_metrics(acc_m, m)), None

      micro_batches = split(mb, num_micro)
      # Zero accumulators shaped like (grads, metrics) of one micro-batch.
      shapes = jax.eval_shape(
          lambda: grad_fn(params, z_params,
                          jax.tree.map(lambda x: x[0], micro_batches))
      )
      # Gradients of bf16 params are accumulated in float32.
      zeros = (mixed_precision.accumulation_zeros(shapes[1]),
               jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes[0][1]))
      ((grads, z_grads), m), _ = jax.lax.scan(micro, zeros, micro_batches)
      if sil is not None:
        # SPEAR self-imitation on replayed episodes, every optimizer step.
        sil_value, sil_grads = lora_lib.value_and_grad(sil_loss)(params, sil)
        grads = jax.tree.map(lambda g, h: g + sil_coef * h, grads, sil_grads)
        m["sil_loss"] = sil_value
      updates, opt_state = tx.update(grads, opt_state, params)
      params = optax.apply_updates(params, updates)
      if z_params is not None:
        z_updates, z_opt = tx_z.update(z_grads, z_opt, z_params)
        z_params = optax.apply_updates(z_params, z_updates)
      m["grad_norm"] = optax.tree.norm(grads)
      return (params, opt_state, z_params, z_opt, step_index + 1), m

    def epoch(carry, _):
      return jax.lax.scan(mb_update, carry, mb_batch)

    (params, opt_state, z_params, z_opt, _), m = jax.lax.scan(
        epoch, (params, opt_state, z_params, z_opt, jnp.int32(0)), None,
        length=epochs
    )
    metrics = {k: (jnp.max(v) if k.endswith("_max") else jnp.mean(v))
               for k, v in m.items()}
    metrics["ratio_mean_first"] = m["ratio_mean"][0, 0]
    metrics["ratio_dev_max_first"] = m["ratio_dev_max"][0, 0]
    metrics["behaviour_gap_max_first"] = m["behaviour_gap_max"][0, 0]
    if log_z_state is None:
      return params, opt_state, metrics
    return params, opt_state, metrics, (z_params, z_opt)

  return update


def behaviour_forward(config, graphdef: nnx.GraphDef, params,
                      tokens_bl: jax.Array, with_values: bool = False):
  """Trainer-side behaviour log-probs (and values) of a batch, before the update.

  `rl.behaviour_logprobs='trainer'`: the behaviour log-probs of the importance
  ratio are recomputed once per batch by `policy_forward` (exactly the
  function the loss calls: a teacher-forced forward over the whole
  trajectory) on the same micro-batches the update uses (the batch cut into
  n = num_minibatches * num_microbatches blocks by the strided split
  `sharding.split_rows`, row i in block i % n, mapped with `lax.map`: block
  j + num_minibatches * k holds, in the same order, the rows of micro-batch k
  of minibatch j), with the parameters that sampled the batch. The loss then
  reproduces them bit for bit on the first optimizer step, so the first
  epoch's ratios are exactly 1 (no float drift from the sampler's cached
  one-token decode). Values are the behaviour values V_old of GAE.

  Args:
    config: experiment config (rl.num_minibatches, rl.num_microbatches,
      rl.temperature).
    graphdef, params: the policy that sampled the batch.
    tokens_bl: [B, L] int32 trajectories.
    with_values: also return the value head's values.

  Returns:
    (logp [B, L] float32, values [B, L] float32 or None); see
    `policy_forward` for the alignment.
  """
  rl_cfg = config.rl
  n = rl_cfg.num_minibatches * rl_cfg.num_microbatches
  blocks = sharding.split_rows(tokens_bl, n)
  logp, _, values = jax.lax.map(
      lambda t: policy_forward(graphdef, params, sharding.constrain_batch(t),
                               rl_cfg.temperature, with_values), blocks)
  unblock = lambda x: None if x is None else sharding.merge_rows(x)
  return unblock(logp), unblock(values)


def masked_behaviour_logprobs(config, graphdef: nnx.GraphDef, params,
                              tokens_bl: jax.Array, logp_bl: jax.Array,
                              rows_b: jax.Array,
                              banned_tokens: tuple[int, ...]):
  """Behaviour log-probs of rows sampled with `banned_tokens` masked.

  Dual-path tool-free rows (`rl.dual_path_tool_free`) sample every token from
  the policy renormalised over the allowed tokens (`rollout.mask_logits`):
  log p_masked(a_t) = log p(a_t) - log(1 - P_t), P_t = sum over banned v of
  p(v | tokens[:, :t]), all at the sampling temperature. P_t comes from
  `policy_forward` scoring each banned id at every position (one extra
  teacher-forced pass per banned id, on `behaviour_forward`'s strided blocks).

  Args:
    config: experiment config (rl.temperature, rl.num_minibatches,
      rl.num_microbatches).
    graphdef, params: the policy that sampled the batch.
    tokens_bl: [B, L] int32 trajectories.
    logp_bl: [B, L] float32 unmasked log-probs (`behaviour_forward`).
    rows_b: [B] bool, rows sampled with the mask.
    banned_tokens: static tuple of banned ids (`rollout.tool_call_tokens`).

  Returns:
    (logp [B, L] float32: logp_bl + shift on `rows_b`, shift [B, L] float32:
     -log(1 - P_t) on `rows_b` from position 1, 0 elsewhere).
  """
  rl_cfg = config.rl
  n = rl_cfg.num_minibatches * rl_cfg.num_microbatches

  def banned_mass(t):
    t = sharding.constrain_batch(t)
    total = jnp.zeros(t.shape, jnp.float32)
    for v in banned_tokens:
      lp, _, _ = policy_forward(graphdef, params, t, rl_cfg.temperature,
                                targets_bl=jnp.full_like(t, v))
      total = total + jnp.exp(lp)
    return total

  # The same strided blocks as `behaviour_forward` (each keeps every device's
  # share of the rows on a data-sharded mesh).
  mass = sharding.merge_rows(
      jax.lax.map(banned_mass, sharding.split_rows(tokens_bl, n)))
  mass = jnp.clip(mass, 0.0, 1.0 - 1e-7).at[:, 0].set(0.0)
  shift = jnp.where(jnp.asarray(rows_b, bool)[:, None], -jnp.log1p(-mass), 0.0)
  return logp_bl + shift, shift


def last_policy_reward(reward_b: jax.Array, mask_bl: jax.Array) -> jax.Array:
  """[B, L] float32: each episode's reward at its last POLICY token, 0 elsewhere."""
  l = mask_bl.shape[1]
  pos = jnp.arange(l)[None, :]
  last_b = jnp.max(jnp.where(mask_bl, pos, -1), axis=1)
  return jnp.where(pos == last_b[:, None], reward_b[:, None], 0.0).astype(
      jnp.float32)


def gae_token_advantages(rl_cfg, reward_b: jax.Array, mask_bl: jax.Array,
                         values_bl: jax.Array, lambda_: float | None = None):
  """PPO-GAE per-token advantages and value targets for `advantage_estimator='gae'`.

  The episode's (composed) reward is the reward of its last POLICY token;
  `advantages.token_gae` runs over the POLICY tokens only (observation and
  template tokens add no discount step; docs/rewards_and_credit.md) with discount
  `rl.discount` per POLICY token and lambda `rl.gae_lambda` (or `lambda_`;
  1.0 gives Monte-Carlo returns, used to train the value head as a PBRS
  potential). Values are the behaviour values V_old (`behaviour_forward`).
  Advantages are not normalised.

  Args:
    rl_cfg: `rl` block.
    reward_b: [B] float32 episode rewards.
    mask_bl: [B, L] bool POLICY-token mask of the trajectory.
    values_bl: [B, L] float32 behaviour values.
    lambda_: optional override of `rl.gae_lambda`.

  Returns:
    (adv_b [B] mean advantage over each row's POLICY tokens (logging),
     adv_bl [B, L] float32, returns_bl [B, L] float32; both 0 off POLICY).
  """
  lam = rl_cfg.get("gae_lambda", 0.95) if lambda_ is None else lambda_
  adv_bl, ret_bl = jax.vmap(advantages.token_gae, in_axes=(0, 0, 0, None, None))(
      last_policy_reward(reward_b, mask_bl), values_bl, mask_bl,
      rl_cfg.get("discount", 1.0), lam)
  count_b = jnp.maximum(jnp.sum(mask_bl, axis=1), 1).astype(jnp.float32)
  return jnp.sum(adv_bl, axis=1) / count_b, adv_bl, ret_bl


def value_potential(graphdef: nnx.GraphDef, params, traj: types.Trajectory,
                    max_turns: int) -> jax.Array:
  """[B, K + 1] PBRS potential Phi(s_k) = V(s_k) from the policy's value head.

  s_k is the context after k turns (`credit.state_ends`: the prompt plus
  turns 0 .. k-1 and their observations); V(s_k) is the value head read at
  the last token of s_k (one forward over the full trajectory; the value
  after token t depends on tokens 0..t only). For k past the last turn it is
  the value of the whole episode; PBRS then sets Phi(terminal) = 0 for
  terminated episodes (credit.shape_turn_rewards). Gradient-free (the
  potential is part of the reward).

  Args:
    graphdef, params: the policy (TransformerConfig.value_head=True).
    traj: the batch (tokens, role, turn).
    max_turns: K.
  """
  model = nnx.merge(graphdef, params)
  hidden_bld, _ = model.hidden_states(traj.tokens)
  v_bl = model.value(hidden_bld)
  end_bk1 = credit.state_ends(traj.role, traj.turn, max_turns)
  idx = jnp.clip(end_bk1 - 1, 0, traj.tokens.shape[1] - 1)
  return jax.lax.stop_gradient(jnp.take_along_axis(v_bl, idx, axis=1))


def prompt_embedding(graphdef: nnx.GraphDef, params,
                     traj: types.Trajectory) -> jax.Array:
  """[B, D] float32 mean of the policy's final hidden states over PROMPT tokens.

  The input of FlowRL's log-partition network (arXiv:2509.15207 feeds the
  policy's prompt hidden states to it); computed once per batch with the
  parameters that sampled it and treated as a constant feature
  (stop_gradient: the log Z loss does not train the policy's trunk; the
  authors' code lets that gradient through, our choice differs).
  """
  model = nnx.merge(graphdef, params)
  hidden_bld, _ = model.hidden_states(traj.tokens)
  pooled = losses.masked_mean_pool(hidden_bld.astype(jnp.float32),
                                   traj.role == types.PROMPT)
  return jax.lax.stop_gradient(pooled)


# ---------------------------------------------------------------------------
# Per-turn step (process) rewards (`rl.step_reward`; experiments/step_hacking).
# ---------------------------------------------------------------------------


def step_reward_on(rl_cfg) -> bool:
  """True when a per-turn step reward is configured (`rl.step_reward`)."""
  return rl_cfg.get("step_reward", "none") != "none"


def step_rewards_bk(rl_cfg, traj: types.Trajectory, reward_b: jax.Array,
                    max_turns: int) -> jax.Array:
  """[B, K] float32 per-turn step rewards of `rl.step_reward` (0 when off).

  'valid_call': the step score p_k = env fact 'valid_call_turn' [B, K] (a
  well-formed call that returned a value; repeats are paid again) on the
  tool-call turns (fact 'tool_call_turn'); transformed by
  `rl.step_reward_transform` ('sum', 'clip', 'delta', 'min', 'gated') and
  scaled by `rl.step_reward_coef` (rewards.step_turn_rewards; Clipping /
  Delta arXiv:2410.15115, PURE arXiv:2504.15275, G-RA docs/papers.md). The
  gate of 'gated' reads `reward_b`, the episode's composed outcome reward.
  Added to the per-turn rewards of `rl.credit='per_turn'` before the
  reward-to-go (`token_advantages`).
  """
  k = max_turns
  turn_mask = jnp.arange(k)[None, :] < traj.num_turns[:, None]
  if not step_reward_on(rl_cfg):
    return jnp.zeros(turn_mask.shape, jnp.float32)
  p_bk = traj.facts["valid_call_turn"].astype(jnp.float32)
  scored = traj.facts["tool_call_turn"].astype(jnp.bool_) & turn_mask
  return rewards.step_turn_rewards(
      p_bk, scored, turn_mask, reward_b,
      transform=rl_cfg.get("step_reward_transform", "sum"),
      coef=rl_cfg.get("step_reward_coef", 0.0),
      eta=rl_cfg.get("step_reward_clip_eta", 1.0),
      gate_threshold=rl_cfg.get("step_reward_gate_threshold", 1.0))


def pbrs_terminated(rl_cfg, finish_b: jax.Array) -> jax.Array:
  """[B] bool: which episodes end in an absorbing state for PBRS (Phi = 0).

  ANSWERED and FORMAT_ERROR endings always do. Episodes cut off at the turn
  budget or the context length (MAX_TURNS, TRUNCATED) depend on
  `rl.pbrs_cutoff`:
    'keep'  not terminal: Phi(s_n) stays in the return (the task is treated as
            continuing past the cut, Phi as its value estimate). Not policy
            invariant for a task whose budget is part of it: the episode that
            never answers collects Phi(s_n) (the "dark room" path).
    'zero'  terminal: Phi(s_n) = 0 for every ending, so every shaped
            trajectory return is R - Phi(s_0) (discount 1) and PBRS is policy
            invariant for the budgeted task (Ng, Harada & Russell, ICML 1999:
            invariance needs Phi = 0 at every terminal state).

  Args:
    rl_cfg: the `rl` block (`pbrs_cutoff`, default 'keep').
    finish_b: [B] int32 finish codes (types.ANSWERED, ...).

  Raises:
    ValueError: `rl.pbrs_cutoff` not 'keep' or 'zero' (also caught by
      validation before any work).
  """
  cutoff = rl_cfg.get("pbrs_cutoff", "keep")
  if cutoff not in ("keep", "zero"):
    raise ValueError(f"rl.pbrs_cutoff must be 'keep' or 'zero', got {cutoff!r}")
  if cutoff == "zero":
    return jnp.ones(finish_b.shape, jnp.bool_)
  return (finish_b == types.ANSWERED) | (finish_b == types.FORMAT_ERROR)


def token_advantages(rl_cfg, reward: jax.Array, traj: types.Trajectory,
                     max_turns: int, phi_bk1: jax.Array | None = None):
  """Per-token advantages [B, L] from episode rewards, by `rl.credit`.

  'trajectory': one advantage per episode from `rl.advantage_estimator` (or HDPO),
  on the reward plus, if `rl.pbrs_coef` > 0, the telescoped PBRS return
  sum_k discount^k F_k (closed form; credit.telescoped_episode_returns).
  'per_turn': the reward is placed at the episode's last turn, PBRS terms
  F_k = discount * Phi(s_{k+1}) - Phi(s_k) (Phi = pbrs_coef * facts['progress'],
  Phi(terminal) = 0 for ANSWERED / FORMAT_ERROR endings, and for cut-off ones
  with `rl.pbrs_cutoff='zero'`; `pbrs_terminated`) are added per turn, the
  per-turn reward-to-go is normalised against the group's returns at the same turn
  index, and each turn's advantage goes to that turn's POLICY tokens. With
  `rl.step_reward` set, the per-turn step rewards of `step_rewards_bk` are
  added to the per-turn rewards before the reward-to-go.

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
    # Episodes whose last state is absorbing (Phi = 0; rl.pbrs_cutoff).
    terminated = pbrs_terminated(rl_cfg, traj.finish)
    if rl_cfg.get("dense_as", "reward") == "aux_loss" or pbrs_coef <= 0:
      phi = None
    elif phi_bk1 is not None:
      phi = pbrs_coef * phi_bk1
    else:
      phi = pbrs_coef * rewards.finite_or_zero(traj.facts["progress"])
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
    keys_bk = credit.observation_state_keys(
        traj.tokens, traj.role, traj.turn, k,
        match_turn=rl_cfg.get("gigpo_match_turn", True))
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
    if step_reward_on(rl_cfg):
      # Per-turn step (process) rewards (rl.step_reward), after the outcome.
      r_bk = r_bk + step_rewards_bk(rl_cfg, traj, reward, k)
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
  the endings `pbrs_terminated` names; Ng et al. 1999), i.e. the one-step TD
  credit of TRACE (docs/papers.md, inferred form). The learner adds the
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
  terminated = pbrs_terminated(rl_cfg, traj.finish)
  f_bk = credit.shape_turn_rewards(
      jnp.zeros(turn_mask.shape, jnp.float32), rl_cfg.pbrs_coef * phi_bk1,
      turn_mask, rl_cfg.get("discount", 1.0), terminated)
  return advantages.broadcast_turn_to_tokens(f_bk, traj.turn, traj.role)


def obs_prediction_info(prob_bl: jax.Array, hit_bl: jax.Array,
                        traj: types.Trajectory) -> dict[str, jax.Array]:
  """Dark-room diagnostics of a batch (docs/papers.md), float32 scalars.

  Args:
    prob_bl, hit_bl: [B, L] `credit.observation_prediction_scores` of the
      batch (probability of each token under the policy; arg-max hit).
    traj: the batch (role, finish, num_turns).

  Returns:
    obs_pred_prob: mean probability of the observation (TOOL) tokens;
    obs_pred_acc: share of TOOL tokens that are the arg-max prediction (both
    over all TOOL tokens of the batch, 0 without any); horizon_rate: share of
    episodes cut off at the horizon (finish MAX_TURNS or TRUNCATED). Mean
    assistant turns per episode are logged in every run as 'turns'.
  """
  obs = traj.role == types.TOOL
  n = jnp.maximum(jnp.sum(obs.astype(jnp.float32)), 1.0)
  horizon = (traj.finish == types.MAX_TURNS) | (traj.finish == types.TRUNCATED)
  return {
      "obs_pred_prob": jnp.sum(jnp.where(obs, prob_bl, 0.0)) / n,
      "obs_pred_acc": jnp.sum((obs & hit_bl).astype(jnp.float32)) / n,
      "horizon_rate": jnp.mean(horizon.astype(jnp.float32)),
  }


def init_rl_extras(config, state: types.TrainState) -> types.TrainState:
  """Adds the optional RL-phase state: the replay buffer (`rl.replay_capacity`
  > 0), the dual-ascent multiplier (`rl.dual_constraint` set, starting at
  `rl.dual_init`) and FlowRL's log-partition parameters with their optimizer
  state (`rl.loss_type='flowrl'`). Without these switches the state is returned unchanged
  (fields stay None), so checkpoints of such runs keep their structure."""
  rl_cfg = config.rl
  if rl_cfg.get("replay_capacity", 0) > 0 and state.replay is None:
    state = state.replace(
        replay=replay_lib.init(rl_cfg.replay_capacity, config.max_len))
  if rl_cfg.get("dual_constraint", "") and state.dual_coef is None:
    state = state.replace(dual_coef=jnp.float32(rl_cfg.dual_init))
  if rl_cfg.get("loss_type", "ppo") == "flowrl" and state.log_partition is None:
    # FlowRL's learned log Z_phi(x) on the pooled prompt embedding [D]; its
    # output layer starts at 0 (log Z = 0), the hidden layer is drawn from
    # fold_in(rng, -1) so the policy's keys are untouched.
    d = jax.tree.leaves(state.params["embed_vd"])[0].shape[1]
    model = losses.LogPartition(
        d, rl_cfg.get("flowrl_log_z_hidden", 0),
        rngs=nnx.Rngs(params=jax.random.fold_in(state.rng, 2**31 - 1)))
    z = nnx.state(model)
    state = state.replace(
        log_partition=z,
        log_partition_opt_state=make_log_partition_optimizer(rl_cfg).init(z))
  if uses_spa(rl_cfg) and state.spa is None:
    state = state.replace(
        spa=credit.spa_init(_d_model(state.params), rl_cfg.spa_lr))
  return state


def uses_spa(rl_cfg) -> bool:
  """True when PBRS uses the learned SPA potential (`rl.pbrs_potential='spa'`
  with `rl.pbrs_coef` > 0): the head lives in `TrainState.spa`."""
  return (rl_cfg.get("pbrs_potential", "progress") == "spa"
          and rl_cfg.get("pbrs_coef", 0.0) > 0)


def _d_model(params) -> int:
  """Hidden width D of the policy, read from its embedding table [V, D]."""
  return int(jnp.shape(params["embed_vd"][...])[-1])


def dual_path_tool_free(num_rows: int, group_size: int, num_free: int):
  """[num_rows] bool: the last `num_free` rows of every contiguous group of
  `group_size` are sampled with tool calls disabled (dual-path groups, AKBE /
  EAPO, docs/papers.md); None when num_free is 0."""
  if num_free <= 0:
    return None
  return (jnp.arange(num_rows) % group_size) >= group_size - num_free


def dual_path_metrics(traj: types.Trajectory) -> dict[str, jax.Array]:
  """Tool-necessity metrics of a dual-path batch (facts['tool_free'] set).

  Per group (`rewards.tool_necessity_stats`): acc_t (tool-enabled accuracy),
  acc_n (tool-free accuracy), necessity = acc_t - acc_n. Logged: the two
  accuracies over their episodes, the mean necessity over groups, the share
  of groups where tools are needed (acc_n = 0 < acc_t) or unneeded
  (acc_n > 0), and tool calls per tool-enabled episode in each kind of group
  (overuse shows as calls where tools are unneeded), and, when the env has a
  'tool_necessary' label, the mean necessity on labelled-necessary and
  labelled-unnecessary tasks. Means over rows equal
  means over groups (equal-size groups); an empty selection gives 0.
  """
  facts = traj.facts
  free = facts["tool_free"]
  correct = facts["correct"].astype(bool)
  calls = facts["num_tool_calls"].astype(jnp.float32)
  st = rewards.tool_necessity_stats(correct, calls.astype(jnp.int32), free,
                                    traj.group)
  f32 = lambda x: x.astype(jnp.float32)

  def mean_where(x, w):
    w = f32(w)
    return jnp.sum(x * w) / jnp.maximum(jnp.sum(w), 1.0)

  needed = (st["acc_no_tool"] == 0) & (st["acc_tool"] > 0)
  unneeded = st["acc_no_tool"] > 0
  extra = {}
  if "tool_necessary" in facts:
    # Measured necessity against the environment's ground-truth label.
    label = facts["tool_necessary"].astype(bool)
    extra = {
        "dual_path_necessity_labelled_necessary": mean_where(
            st["necessity"], label),
        "dual_path_necessity_labelled_unnecessary": mean_where(
            st["necessity"], ~label),
    }
  return {
      **extra,
      "dual_path_acc_tool": mean_where(f32(correct), ~free),
      "dual_path_acc_no_tool": mean_where(f32(correct), free),
      "dual_path_necessity": jnp.mean(st["necessity"]),
      "dual_path_needed_frac": jnp.mean(f32(needed)),
      "dual_path_unneeded_frac": jnp.mean(f32(unneeded)),
      "dual_path_calls_needed": mean_where(calls, ~free & needed),
      "dual_path_calls_unneeded": mean_where(calls, ~free & unneeded),
      # Exactly 0 when the logit mask works (a health check).
      "dual_path_calls_tool_free": mean_where(calls, free),
  }


def inject_replay(buf, traj: types.Trajectory, reward_b: jax.Array,
                  group_size: int, success_threshold: float):
  """`rl.replay_inject`: buffered successes replace the last row of failed groups.

  The injected rows take the buffered episode's tokens, roles, behaviour
  log-probs, turn indices and reward (`replay.inject_into_failed_groups`),
  and num_turns = 1 + its largest turn index, so per-turn estimators (GiGPO)
  see the injected episode's own turns. Facts and finish stay the replaced
  row's (validation rules out the switches that read them).

  Args:
    buf: the `replay.ReplayBuffer`.
    traj: the fresh batch (B = groups * group_size rows, group-major).
    reward_b: [B] float32 rewards of the fresh batch.
    group_size: K (static).
    success_threshold: reward counting as a success.

  Returns:
    (train_traj, reward [B] float32, injected [B] bool).
  """
  tokens, role, logprob, turn, reward, injected = (
      replay_lib.inject_into_failed_groups(
          buf, traj.tokens, traj.role, traj.logprob, traj.turn, reward_b,
          group_size, success_threshold))
  num_turns = jnp.where(injected, jnp.max(turn, axis=1) + 1, traj.num_turns)
  return (traj.replace(tokens=tokens, role=role, logprob=logprob, turn=turn,
                       num_turns=num_turns.astype(traj.num_turns.dtype)),
          reward, injected)


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

  Also once per batch, before the update and with the sampling parameters:
  trainer-side behaviour log-probs (`rl.behaviour_logprobs='trainer'`, with
  the sampler/trainer mismatch in `info`), behaviour values V_old and their
  targets (`rl.advantage_estimator='gae'`: GAE advantages replace the
  estimator; `rl.pbrs_potential='value'`: V(s_k) as the PBRS potential and
  Monte-Carlo targets for the head), and FlowRL's `reward_hat` (the
  episode-level advantage) and `prompt_embedding`.
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
  use_gae = rl_cfg.advantage_estimator == "gae"
  value_pbrs = potential == "value" and rl_cfg.get("pbrs_coef", 0.0) > 0
  with_values = _uses_values(rl_cfg)
  trainer_beh = rl_cfg.get("behaviour_logprobs", "trainer") == "trainer"
  flowrl = rl_cfg.loss_type == "flowrl"
  # Dual-path groups: tool-free episodes per group (0 = off).
  num_free = rl_cfg.get("dual_path_tool_free", 0)
  train_free = rl_cfg.get("dual_path_train_tool_free", True)
  use_spa = uses_spa(rl_cfg)
  # Next-observation prediction (docs/papers.md): as a PBRS potential, as an
  # auxiliary CE (optionally on shuffled placebo labels), and/or logged.
  obs_potential = (potential == "obs_prediction"
                   and rl_cfg.get("pbrs_coef", 0.0) > 0)
  obs_coef = rl_cfg.get("obs_prediction_coef", 0.0)
  obs_placebo = rl_cfg.get("obs_prediction_placebo", False)
  obs_log = obs_potential or obs_coef > 0 or rl_cfg.get(
      "log_obs_prediction", False)

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
          tool_free=dual_path_tool_free(num_groups * group_size, group_size,
                                        num_free),
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
    # With LoRA: the policy's frozen base plus the reference's adapters.
    ref_params = lora_lib.reference_params(state.params, state.ref_params)
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
    if num_free > 0 and not train_free:
      # Tool-free episodes only measure tool necessity: no loss on them.
      mask = mask & ~traj.facts["tool_free"][:, None]
    reward, mask = batch_policies.apply_overlong(
        reward, mask, traj.finish, overlong_mode, rl_cfg.get("overlong_reward", 0.0)
    )
    extras = {}
    phi_bk1 = None
    if use_gold:
      # One batched pass of the reference model over every (episode, state).
      gold_lp = credit.gold_answer_logprobs(
          lambda x: sampling.token_logprobs(
              graphdef, ref_params, x, temperature)[0],
          traj.tokens, traj.role, traj.turn, traj.facts["gold_answer"],
          traj.facts["gold_answer_len"], num_turns=env.max_turns,
          answer_prefix=(tokenizers.ANSWER,), pad_id=tokenizers.PAD)
      if likelihood_coef > 0:
        lik = credit.likelihood_reward(gold_lp, traj.num_turns, traj.finish)
        reward = reward + likelihood_coef * lik
        info["likelihood"] = jnp.mean(lik)
      if potential == "trace":
        phi_bk1 = credit.log_ratio_potential(gold_lp)
    if value_pbrs:
      # PBRS potential Phi(s_k) = V(s_k) from the value head (rl.pbrs_potential
      # = 'value'), read at each turn boundary with the sampling parameters.
      phi_bk1 = value_potential(graphdef, state.params, traj, env.max_turns)
    if use_spa:
      # SPA: per-turn contributions of the learned head on the policy's
      # stop-gradient hidden states (one batched pass), cumulated into the
      # potential; the head is trained on this batch in make_rl_step.
      k = env.max_turns
      feat = credit.spa_policy_features(
          graphdef, state.params, traj.tokens, traj.role, traj.turn, k)
      turn_mask = jnp.arange(k)[None, :] < traj.num_turns[:, None]
      phi_bk1 = credit.spa_potential(
          credit.spa_contributions(state.spa.params, feat), turn_mask)
      extras["spa"] = (feat, turn_mask,
                       traj.facts["correct"].astype(jnp.float32))
    if potential == "rm" and reward_model is not None:
      # learned-RM potential; a non-finite entry reads as 0
      phi_bk1 = rewards.finite_or_zero(traj.facts["rm_potential"])
    if obs_log:
      prob_bl, hit_bl = credit.observation_prediction_scores(
          graphdef, state.params, traj.tokens, temperature)
      info.update(obs_prediction_info(prob_bl, hit_bl, traj))
      if obs_potential:
        # Phi(s_k) = the sampling policy's mean probability of the
        # observation tokens in s_k (docs/papers.md "dark room").
        phi_bk1 = credit.observation_prediction_potential(
            prob_bl, traj.role, traj.turn, env.max_turns)
    if dense_aux and rl_cfg.pbrs_coef > 0:
      extras["aux_advantage"] = dense_aux_advantages(
          rl_cfg, traj,
          (rewards.finite_or_zero(traj.facts["progress"]) if phi_bk1 is None
           else phi_bk1),
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
        train_traj, reward, injected = inject_replay(
            state.replay, traj, reward, group_size, replay_threshold)
        mask = jnp.where(injected[:, None], train_traj.role == types.POLICY,
                         mask)
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
          reward, reward >= replay_threshold, state.step, traj.turn)
      info["replay_size"] = jnp.sum(extras["replay"].valid.astype(jnp.float32))
    ref_logp, _ = sampling.token_logprobs(
        graphdef, ref_params, train_traj.tokens, temperature
    )
    if rl_cfg.kl_reward_coef > 0:
      # KL as a reward penalty (no gradient), estimated on the behaviour samples.
      reward = losses.kl_penalized_rewards(
          reward, train_traj.logprob, ref_logp, mask, rl_cfg.kl_reward_coef,
          estimator=rl_cfg.kl_estimator,
      )
    behaviour_logp, old_values = train_traj.logprob, None
    if trainer_beh or with_values:
      # One teacher-forced pass with the sampling parameters, on the update's
      # micro-batch shapes: behaviour log-probs (and behaviour values).
      trainer_logp, old_values = behaviour_forward(
          config, graphdef, state.params, train_traj.tokens, with_values)
      if trainer_beh:
        # Training/inference mismatch: sampler (cached one-token decode) vs
        # trainer (full forward) log-probs of the same tokens.
        # Fresh rows only: replay-injected episodes carry an older policy's
        # log-probs.
        pmask = policy_mask(train_traj)
        fresh_b = jnp.all(train_traj.tokens == traj.tokens, axis=1)
        fresh = pmask & fresh_b[:, None]
        if num_free > 0:
          # Dual-path tool-free rows were sampled with the tool-call tokens
          # masked: their behaviour log-probs are the masked distribution's.
          trainer_logp, shift = masked_behaviour_logprobs(
              config, graphdef, state.params, train_traj.tokens, trainer_logp,
              traj.facts["tool_free"] & fresh_b, rollout.tool_call_tokens(env))
          extras["behaviour_shift"] = jnp.where(pmask, shift, 0.0)
        gap = jnp.where(fresh, jnp.abs(train_traj.logprob - trainer_logp), 0.0)
        info["logp_mismatch_max"] = jnp.max(gap)
        info["logp_mismatch_mean"] = jnp.sum(gap) / jnp.maximum(
            jnp.sum(fresh), 1).astype(jnp.float32)
        behaviour_logp = jnp.where(pmask, trainer_logp, 0.0)
    returns_bl = None
    if use_gae:
      # PPO with GAE from the value head (arXiv:1707.06347, arXiv:1506.02438).
      adv_b, adv_bl, returns_bl = gae_token_advantages(
          rl_cfg, reward, policy_mask(train_traj), old_values)
    else:
      unshaped = reward
      if step_reward_on(rl_cfg):
        # Step rewards as delivered (per episode sum), and before the transform.
        s_bk = step_rewards_bk(rl_cfg, train_traj, reward, env.max_turns)
        info["step_reward"] = jnp.mean(jnp.sum(s_bk, axis=1))
        raw = rl_cfg.step_reward_coef * (train_traj.facts["valid_call_turn"]
                                         & train_traj.facts["tool_call_turn"])
        info["step_reward_raw"] = jnp.mean(jnp.sum(raw.astype(jnp.float32), 1))
      reward, adv_b, adv_bl = token_advantages(
          rl_cfg, reward, train_traj, env.max_turns, phi_bk1=phi_bk1
      )
      if with_values:
        # Value head as a PBRS potential: trained on Monte-Carlo returns
        # (lambda = 1) of the reward before shaping, so the potential never
        # regresses on its own shaping terms.
        _, _, returns_bl = gae_token_advantages(
            rl_cfg, unshaped, policy_mask(train_traj), old_values, lambda_=1.0)
    batch = {
        "tokens": train_traj.tokens,
        "mask": mask,
        "behaviour_logp": behaviour_logp,
        "ref_logp": ref_logp,
        "advantage": adv_bl,
    }
    if returns_bl is not None:
      batch["old_values"] = old_values
      batch["returns"] = returns_bl
    if flowrl:
      # FlowRL: r_hat = the episode-level (group-normalised) advantage, and
      # the log-partition network's input.
      batch["reward_hat"] = adv_b
      batch["prompt_embedding"] = prompt_embedding(graphdef, state.params,
                                                   train_traj)
    if "sil" in extras:
      batch["sil"] = extras.pop("sil")
    if "behaviour_shift" in extras:
      batch["behaviour_shift"] = extras.pop("behaviour_shift")
    if "aux_advantage" in extras:
      batch["aux_advantage"] = jnp.where(mask, extras.pop("aux_advantage"), 0.0)
    if obs_coef > 0:
      # Auxiliary next-observation CE on the TOOL tokens (docs/papers.md);
      # the placebo permutes its labels across the batch.
      obs_mask = train_traj.role == types.TOOL
      batch["obs_mask"] = obs_mask
      if obs_placebo:
        batch["obs_targets"] = credit.shuffle_observation_targets(
            train_traj.tokens, obs_mask, jax.random.fold_in(key, 5))
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
    z_state = None
    if state.log_partition is not None:
      params, opt_state, metrics, z_state = update(
          state.params, state.opt_state, batch, state.kl_coef,
          (state.log_partition, state.log_partition_opt_state))
    else:
      params, opt_state, metrics = update(
          state.params, state.opt_state, batch, state.kl_coef
      )
    if "any_usable" in info:
      # No group with varying outcomes: skip the update (logged), don't crash.
      skip = ~info.pop("any_usable")
      params, opt_state, z_state = jax.tree.map(
          lambda old, new: jnp.where(skip, old, new),
          (state.params, state.opt_state,
           None if z_state is None else (state.log_partition,
                                         state.log_partition_opt_state)),
          (params, opt_state, z_state),
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
    spa = state.spa
    if "spa" in extras:
      feat, turn_mask, outcome = extras["spa"]
      spa, metrics["spa_loss"] = credit.spa_update(
          spa, feat, turn_mask, outcome, learning_rate=rl_cfg.spa_lr,
          num_steps=rl_cfg.get("spa_steps", 1))
    facts = traj.facts
    if "tool_free" in facts:
      metrics.update(dual_path_metrics(traj))
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
        # Trained (loss-mask) tokens / all B * L tokens of the batch buffer.
        "trained_token_share": f32(batch["mask"]),
        "adv_abs_mean": jnp.mean(jnp.abs(adv_b)),
        "zero_variance_groups": f32(is_const),
    })
    # Host tool steps that raised / timed out (host_rollout facts), counted
    # over the batch, and non-finite float facts the reward sanitised.
    for name in ("tool_exceptions", "tool_timeouts"):
      if f"num_{name}" in facts:
        metrics[name] = jnp.sum(facts[f"num_{name}"]).astype(jnp.float32)
    metrics["reward_nonfinite_inputs"] = jnp.sum(
        rewards.nonfinite_fact_counts(facts)).astype(jnp.float32)
    # Episode length in turns and repeated calls (step-reward hacking).
    metrics["turns"] = f32(traj.num_turns)
    if "num_redundant_calls" in facts:
      metrics["redundant_calls"] = f32(facts["num_redundant_calls"])
    if reward_model is not None:
      # Gold-verifier over-optimisation monitor (Gao et al., arXiv:2210.10760).
      rm_r = parts["rm"] if "rm" in parts else rewards.rm_reward(traj, **rm_params)
      metrics.update(reward_models.monitor_metrics(rm_r, facts["correct"]))
      metrics["rm_score"] = jnp.mean(facts["rm_score"])
    state = state.replace(
        step=state.step + 1, params=params, opt_state=opt_state, kl_coef=kl_coef,
        replay=extras.get("replay", state.replay), dual_coef=dual_coef,
        spa=spa,
    )
    if z_state is not None:
      state = state.replace(log_partition=z_state[0],
                            log_partition_opt_state=z_state[1])
    return state, metrics

  if host_base.is_host(env):
    # Host environments: the rollout runs in Python between jitted turns; the
    # rest of the iteration is one jitted program.
    rollout_fn = make_host_rollout_fn(config, env, graphdef, model_config)
    learn_jit = jax.jit(step, donate_argnums=0)  # host envs: one device
    return lambda state: learn_jit(state, rollout_fn(state))

  return jax.jit(step, donate_argnums=0, **sharding.step_jit_kwargs(state_sharding))
