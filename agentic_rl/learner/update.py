"""Update stage: the RL loss of one micro-batch (policy loss from
`losses.POLICY_LOSSES`, KL, entropy, value, auxiliary terms) and the PPO
epochs over minibatches and micro-batches.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from agentic_rl import credit
from agentic_rl import estimators
from agentic_rl import losses
from agentic_rl import mixed_precision
from agentic_rl import sampling
from agentic_rl import sharding
from agentic_rl import types
from agentic_rl.models import lora as lora_lib
from agentic_rl.learner.batch import LearnerBatch
from agentic_rl.learner.common import policy_forward
from agentic_rl.learner.common import shared_prefix
from agentic_rl.learner.common import shared_prefix_mismatch
from agentic_rl.learner.common import split_unit


def uses_values(rl_cfg) -> bool:
  """True when the loss trains the value head: the estimator's table entry
  reads it (`estimators.Estimator.needs_value_head`: 'gae'), or the value
  potential."""
  entry = estimators.ESTIMATORS.get(rl_cfg.advantage_estimator)
  return (entry is not None and entry.needs_value_head) or (
      rl_cfg.pbrs_potential == "value" and rl_cfg.pbrs_coef > 0
  )


def policy_loss_settings(rl_cfg, loss: losses.PolicyLoss) -> dict[str, Any]:
  """{keyword: value} of a policy-loss entry's settings (`loss.settings`),
  each read from the `rl` field `losses.SETTINGS` names, as the config holds
  it (no conversion: the traced constants are those of the config values).

  Args:
    rl_cfg: the `rl` block of the config.
    loss: a `losses.POLICY_LOSSES` entry.

  Returns:
    Python scalars by keyword, e.g. {'clip_low': 0.2, 'clip_high': 0.28,
    'dual_clip': 0.0} for 'ppo'.

  Raises:
    AttributeError: the config lacks a declared field.
  """
  return {
      key: getattr(rl_cfg, losses.SETTINGS[key].removeprefix("rl."))
      for key in loss.settings
  }


@functools.lru_cache(maxsize=None)
def log_partition_graphdef(in_dim: int, hidden_dim: int) -> nnx.GraphDef:
  """GraphDef of FlowRL's `losses.LogPartition(in_dim, hidden_dim)`."""
  return nnx.graphdef(
      nnx.eval_shape(
          lambda: losses.LogPartition(in_dim, hidden_dim, rngs=nnx.Rngs(0))
      )
  )


def make_log_partition_optimizer(rl_cfg) -> optax.GradientTransformation:
  """Adam on FlowRL's log-partition parameters, lr `rl.flowrl_log_z_lr`."""
  return optax.adam(rl_cfg.flowrl_log_z_lr)


def _rl_loss(
    graphdef,
    params,
    batch: LearnerBatch,
    rl_cfg,
    *,
    kl_coef,
    denominator,
    log_z_params=None,
    value_denominator=None,
    first_step=None,
    obs_denominator=None,
    dropout_key=None,
):
  """Policy loss on one micro-batch, aggregated with a batch-wide denominator.

  loss = agg(policy_loss) + kl_coef * agg(KL) - entropy_coef * agg(entropy)
  [+ value_coef * value_loss], each aggregated by `rl.loss_agg_mode` over
  POLICY tokens with `denominator` computed over the whole optimizer batch
  (losses.aggregation_denominator), so summing the micro-batch losses gives
  exactly the full-batch loss. The value loss (present when the batch's
  old_values and returns are set: GAE or the value potential) is token-mean
  with `value_denominator`, the optimizer batch's POLICY-token count.
  The policy term is the `losses.POLICY_LOSSES` entry of `rl.loss_type`,
  called with the arrays its `inputs` name and the settings
  `policy_loss_settings` reads; an entry that `needs_log_partition`
  ('flowrl', `losses.flowrl_loss`) gets log Z from `log_z_params` (a
  `losses.LogPartition` state) applied to the batch's prompt_embedding; its
  gradient flows to `log_z_params` too. With the batch's obs_mask set
  (`rl.obs_prediction_coef` > 0) the loss adds
  obs_prediction_coef * the next-observation cross-entropy over TOOL tokens
  (`credit.observation_prediction_loss`, divided by `obs_denominator`, the
  optimizer batch's TOOL-token count), on obs_targets when set (the
  shuffled placebo labels) and on the observations themselves otherwise.

  `first_step` (traced bool, `rl.behaviour_logprobs='trainer'` only): True on
  the update's first optimizer step, whose parameters ARE the behaviour
  parameters. There the behaviour log-probs are this forward's own
  stop_gradient(logp), so every ratio is exactly 1 however XLA compiles the
  program (the separately recomputed `behaviour_forward` log-probs agree
  only to ~5e-7 inside one fused jitted iteration; their gap is logged as
  'behaviour_gap_max'); the gradient is unchanged (rho A grad logp with
  rho = 1). Later steps use the batch's behaviour log-probs. With
  the batch's behaviour_shift set (dual-path tool-free rows, see
  `masked_behaviour_logprobs`) the first step's behaviour log-prob is
  stop_gradient(logp) + shift, the masked distribution's log-prob, so those
  rows' first ratio is 1 - P(banned) (the unmasked policy over the masked
  behaviour), as with `rl.behaviour_logprobs='sampler'`.

  `dropout_key` (LoRA with `model.lora.dropout` > 0): the key of this
  micro-batch's adapter-dropout masks; only this forward is stochastic (the
  behaviour, reference and sampling forwards are not), so after the first
  optimizer step the ratios also carry the dropout noise.

  Returns:
    (loss scalar, metrics dict of scalars, each already divided by `denominator`
     for the aggregated terms so micro-batch values sum to batch values;
     keys ending in '_max' are maxima, to be combined with max).
  """
  temperature = rl_cfg.temperature
  with_values = batch.returns is not None
  prefix = shared_prefix(rl_cfg)
  logp, entropy, values = policy_forward(
      graphdef,
      params,
      batch.tokens,
      temperature,
      with_values,
      targets_bl=batch.obs_targets,
      dropout_key=dropout_key,
      prefix=prefix,
  )
  mask = batch.mask
  beh = batch.behaviour_logp
  own = jax.lax.stop_gradient(logp)
  if batch.behaviour_shift is not None:
    # Dual-path tool-free rows were sampled from the masked distribution:
    # its log-prob is this forward's plus -log(1 - P(banned)).
    own = own + batch.behaviour_shift
  beh_gap_max = jnp.max(jnp.where(mask, jnp.abs(own - beh), 0.0))
  if first_step is not None and rl_cfg.behaviour_logprobs == "trainer":
    beh = jnp.where(first_step, own, beh)
  adv = batch.advantage
  loss_type = rl_cfg.loss_type
  if loss_type not in losses.POLICY_LOSSES:
    raise ValueError(
        f"rl.loss_type={loss_type!r}: unknown; known {losses.LOSS_TYPES}"
    )
  entry = losses.POLICY_LOSSES[loss_type]
  log_z_b = None
  if entry.needs_log_partition and batch.prompt_embedding is not None:
    # FlowRL's log Z_phi(x) on the pooled prompt embedding.
    emb = batch.prompt_embedding
    z_graphdef = log_partition_graphdef(
        emb.shape[-1], rl_cfg.flowrl_log_z_hidden
    )
    log_z_b = nnx.merge(z_graphdef, log_z_params)(emb)
  arrays = {
      "logp_bl": logp,
      "behaviour_logp_bl": beh,
      "advantage_bl": adv,
      "mask_bl": mask,
      "ref_logp_bl": batch.ref_logp,
      "denominator": denominator,
      "reward_hat_b": batch.reward_hat,
      "log_z_b": log_z_b,
  }
  missing = [
      n for n in entry.inputs if n != "denominator" and arrays[n] is None
  ]
  if missing:
    raise ValueError(
        f"rl.loss_type={loss_type!r} takes {missing}, which the batch lacks"
    )
  pg, ratio, seq_loss = entry.fn(
      *(arrays[n] for n in entry.inputs),
      **policy_loss_settings(rl_cfg, entry),
  )
  norm = rl_cfg.loss_norm_constant or None
  agg = lambda x: losses.aggregate(
      x, mask, rl_cfg.loss_agg_mode, norm_constant=norm, denominator=denominator
  )
  kl = losses.kl_estimate(rl_cfg.kl_estimator, logp, batch.ref_logp)
  pg_loss, kl_mean, ent_mean = agg(pg), agg(kl), agg(entropy)
  extra = {}
  if seq_loss is not None:
    pg_loss = seq_loss
  if log_z_b is not None:
    extra["log_z"] = losses.aggregate(
        jnp.broadcast_to(log_z_b[:, None], mask.shape),
        mask,
        "seq-mean-token-mean",
        denominator=denominator,
    )
  loss = pg_loss + kl_coef * kl_mean - rl_cfg.entropy_coef * ent_mean
  if with_values:
    clip = rl_cfg.value_clip
    v_loss = losses.value_loss(
        values,
        batch.old_values,
        batch.returns,
        mask,
        clip if clip > 0 else jnp.inf,
        denominator=value_denominator,
    )
    extra["value_loss"] = v_loss
    loss = loss + rl_cfg.value_coef * v_loss
  if batch.aux_advantage is not None:
    # Dense signal as an auxiliary loss (rl.dense_as='aux_loss').
    aux_pg, _ = losses.clipped_surrogate(
        logp, beh, batch.aux_advantage, rl_cfg.clip_low, rl_cfg.clip_high
    )
    extra["aux_loss"] = agg(aux_pg)
    loss = loss + extra["aux_loss"]
  if batch.obs_mask is not None:
    # Next-observation prediction as an auxiliary CE (docs/papers.md).
    extra["obs_pred_loss"] = credit.observation_prediction_loss(
        logp, batch.obs_mask, obs_denominator
    )
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
  if prefix is not None:
    # 1 where a row's first rl.shared_prefix_len tokens differ from its
    # group's first row (the shared forward would be wrong; the loop stops).
    metrics["shared_prefix_mismatch_max"] = shared_prefix_mismatch(
        batch.tokens, prefix
    )
  return loss, metrics


def _combine_metrics(a: dict, b: dict) -> dict:
  """Micro-batch metric accumulation: sum, except max for '*_max' keys."""
  return {
      k: (jnp.maximum(a[k], b[k]) if k.endswith("_max") else a[k] + b[k])
      for k in a
  }


def make_update_fn(
    config, graphdef: nnx.GraphDef, tx: optax.GradientTransformation
):
  """Returns pure `update(params, opt_state, batch, kl_coef[, log_z_state,
  dropout_key])`.

  `batch` is a `batch.LearnerBatch` (`stages.pack.pack`) of [B, L] arrays:
  tokens, mask (POLICY tokens), behaviour_logp, ref_logp, advantage (plus
  old_values and returns when the value head is trained, prompt_embedding
  [B, D] and reward_hat [B] for FlowRL; a field that is off is None; its
  `sil` batch is not split). It is split into `rl.num_minibatches`
  minibatches by a strided split (row i in minibatch i % num_minibatches, `sharding.split_rows`: on a device mesh every
  minibatch keeps each device's share of the rows; with group-major rows each
  minibatch holds an equal share of every group), swept `rl.ppo_epochs` times
  with `lax.scan`, one optimizer step per minibatch. Each minibatch is further
  split (strided again; by whole groups, group g in micro-batch g %
  num_microbatches, with `rl.shared_prefix_len`) into `rl.num_microbatches`
  for gradient accumulation;
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
  tool-free rows (batch field behaviour_shift), whose masked behaviour gives
  ratio 1 - P(banned tokens).

  `log_z_state` (FlowRL only): a `types.LogPartitionState` (log-partition
  params, their optax state; `TrainState.features['flowrl']`); they get the
  loss gradient too and are updated by `make_log_partition_optimizer`.
  `dropout_key` (used only when the model has LoRA adapters with
  `model.lora.dropout` > 0): micro-batch k of optimizer step s draws its
  adapter-dropout masks from fold_in(fold_in(dropout_key, s), k). Returns
  (params, opt_state, metrics), and with `log_z_state` given (params,
  opt_state, metrics, the new LogPartitionState).
  """
  rl_cfg = config.rl
  num_mb = rl_cfg.num_minibatches
  num_micro = rl_cfg.num_microbatches
  epochs = rl_cfg.ppo_epochs
  norm = rl_cfg.loss_norm_constant or None
  tx_z = make_log_partition_optimizer(rl_cfg)

  split = sharding.split_rows

  sil_coef = rl_cfg.sil_coef

  def sil_loss(p, sil):
    logp, _ = sampling.token_logprobs(
        graphdef, p, sil.tokens, rl_cfg.temperature
    )
    return losses.self_imitation_loss(
        logp, sil.mask, sil.returns, sil.baseline, sil.valid
    )

  lora_cfg = lora_lib.from_config(getattr(config.model, "lora", None))
  use_dropout = lora_cfg is not None and lora_cfg.dropout > 0

  def update(
      params, opt_state, batch, kl_coef, log_z_state=None, dropout_key=None
  ):
    if not use_dropout:
      dropout_key = None
    # The SIL batch is not split into minibatches.
    sil, batch = batch.sil, batch.replace(sil=None)
    mb_batch = split(batch, num_mb)
    z_params, z_opt = (
        (None, None)
        if log_z_state is None
        else (log_z_state.params, log_z_state.opt_state)
    )

    def mb_update(carry, xs):
      params, opt_state, z_params, z_opt, step_index = carry
      mb = sharding.constrain_batch(xs)
      denominator = losses.aggregation_denominator(
          mb.mask, rl_cfg.loss_agg_mode, norm_constant=norm
      )
      value_denominator = losses.aggregation_denominator(mb.mask, "token-mean")
      obs_denominator = None
      if mb.obs_mask is not None:
        obs_denominator = jnp.maximum(
            jnp.sum(mb.obs_mask.astype(jnp.float32)), 1.0
        )

      step_key = (
          None
          if dropout_key is None
          else jax.random.fold_in(dropout_key, step_index)
      )
      grad_fn = lora_lib.value_and_grad(
          lambda p, zp, micro_batch, key: _rl_loss(
              graphdef,
              p,
              micro_batch,
              rl_cfg,
              kl_coef=kl_coef,
              denominator=denominator,
              log_z_params=zp,
              value_denominator=value_denominator,
              first_step=step_index == 0,
              obs_denominator=obs_denominator,
              dropout_key=key,
          ),
          argnums=(0, 1),
          has_aux=True,
      )

      def micro_key(k):
        return None if step_key is None else jax.random.fold_in(step_key, k)

      def micro(acc, xs):
        micro_batch, k = xs
        micro_batch = sharding.constrain_batch(micro_batch)
        (_, m), g = grad_fn(params, z_params, micro_batch, micro_key(k))
        acc_g, acc_m = acc
        return (
            mixed_precision.accumulate(acc_g, g),
            _combine_metrics(acc_m, m),
        ), None

      micro_batches = split(mb, num_micro, split_unit(rl_cfg))
      # Zero accumulators shaped like (grads, metrics) of one micro-batch.
      shapes = jax.eval_shape(
          lambda: grad_fn(
              params,
              z_params,
              jax.tree.map(lambda x: x[0], micro_batches),
              micro_key(0),
          )
      )
      # Gradients of bf16 params are accumulated in float32.
      zeros = (
          mixed_precision.accumulation_zeros(shapes[1]),
          jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes[0][1]),
      )
      ((grads, z_grads), m), _ = jax.lax.scan(
          micro, zeros, (micro_batches, jnp.arange(num_micro))
      )
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
        epoch,
        (params, opt_state, z_params, z_opt, jnp.int32(0)),
        None,
        length=epochs,
    )
    metrics = {
        k: (jnp.max(v) if k.endswith("_max") else jnp.mean(v))
        for k, v in m.items()
    }
    metrics["ratio_mean_first"] = m["ratio_mean"][0, 0]
    metrics["ratio_dev_max_first"] = m["ratio_dev_max"][0, 0]
    metrics["behaviour_gap_max_first"] = m["behaviour_gap_max"][0, 0]
    if log_z_state is None:
      return params, opt_state, metrics
    return (
        params,
        opt_state,
        metrics,
        types.LogPartitionState(params=z_params, opt_state=z_opt),
    )

  return update
