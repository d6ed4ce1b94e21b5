"""Log-prob stages: the loss length, the reference and behaviour log-probs,
the KL-in-reward penalty and the behaviour values.

After the replay stages the collect step sets `loss_length` (the columns the
update's loss reads), then `reference_logprobs` (one teacher-forced pass of
the reference model over the trained rows, on the update's micro-batch
blocks and length bucket) and, with `rl.kl_reward_coef` > 0, `kl_in_reward`.
The behaviour log-probs of the importance ratio are the sampler's
(`sampler_behaviour`, with `behaviour_values` for a value head) or the
trainer's (`trainer_behaviour`, `rl.behaviour_logprobs='trainer'`: one pass
with the sampling parameters, the sampler/trainer mismatch metrics and the
dual-path masked distribution).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from agentic_rl import losses
from agentic_rl import padding
from agentic_rl import types
from agentic_rl.learner import behaviour
from agentic_rl.learner.batch import Rollout
from agentic_rl.learner.common import policy_mask


def forward_on_bucket(
    params: Any,
    tokens_bl: jax.Array,
    need: jax.Array,
    *,
    config,
    graphdef: nnx.GraphDef,
    update_lengths: tuple | None,
) -> jax.Array:
  """`behaviour.behaviour_forward`'s log-probs, on the update's length bucket.

  Args:
    params: the parameters of the forward (policy or reference).
    tokens_bl: [B, L] int32 trained rows.
    need: [] int32 columns the loss reads (`padding.loss_length_of`).
    config: experiment config (rl.num_minibatches, rl.num_microbatches,
      rl.temperature: the row blocks of the forward).
    graphdef: the policy's graph.
    update_lengths: the length buckets of a bucketed update
      (`padding.update_lengths`), or None: the whole length.

  Returns:
    [B, L] float32 log-probs; on a bucket, 0 from the bucket's length on
    (`padding.bucketed_forward`).
  """
  fwd = lambda t: behaviour.behaviour_forward(config, graphdef, params, t)[0]
  if update_lengths is None:
    return fwd(tokens_bl)
  return padding.bucketed_forward(fwd, update_lengths, tokens_bl, need)


def loss_length(
    r: Rollout, *, with_obs: bool, axis_name: str | None = None
) -> Rollout:
  """Sets loss_length: the columns the update's loss reads.

  1 + the last position set in the loss mask, or in the TOOL tokens of the
  trained rows with next-observation prediction (`padding.loss_length_of`);
  the update's length bucket is the shortest that holds it.

  Args:
    r: Rollout with mask [B, L] bool and train_traj (role [B, L] int8).
    with_obs: `rl.obs_prediction_coef` > 0 (the TOOL tokens are loss
      targets too).
    axis_name: the `jax.vmap` axis of vmapped seeds, or None: the length is
      maximised over it (one length bucket for all seeds; the
      sampler/trainer mismatch window of `trainer_behaviour` is then that
      maximum too).

  Returns:
    r with loss_length ([] int32).
  """
  need = padding.loss_length_of(
      r.mask,
      r.train_traj.role == types.TOOL if with_obs else None,
  )
  if axis_name is not None:
    need = jax.lax.pmax(need, axis_name)
  return r.replace(loss_length=need)


def reference_logprobs(
    r: Rollout,
    ref_params: Any,
    *,
    config,
    graphdef: nnx.GraphDef,
    update_lengths: tuple | None,
) -> Rollout:
  """Sets ref_logp: the reference model's log-probs of the trained rows.

  The forward runs over the update's row blocks (`behaviour_forward`: the
  strided split into num_minibatches * num_microbatches blocks, one block at
  a time under `lax.map`), so its activations are those of one micro-batch,
  not of the whole batch; with `update_lengths`, on the update's bucket.

  Args:
    r: Rollout with train_traj (tokens [B, L] int32) and loss_length
      (`loss_length`).
    ref_params: the full reference parameters (with LoRA: the policy's frozen
      base plus the reference adapters, `lora.reference_params`).
    config: experiment config (see `forward_on_bucket`).
    graphdef: the policy's graph.
    update_lengths: the update's length buckets, or None.

  Returns:
    r with ref_logp ([B, L] float32).
  """
  ref_logp = forward_on_bucket(
      ref_params,
      r.train_traj.tokens,
      r.loss_length,
      config=config,
      graphdef=graphdef,
      update_lengths=update_lengths,
  )
  return r.replace(ref_logp=ref_logp)


def kl_in_reward(r: Rollout, *, coef: float, estimator: str) -> Rollout:
  """The KL-in-reward penalty: reward - coef * sum of the per-token KL.

  Estimated on the behaviour samples (the sampler's log-probs of the trained
  rows) over the loss mask, without gradient (`losses.kl_penalized_rewards`).

  Args:
    r: Rollout with reward [B] float32, train_traj (logprob [B, L] float32),
      ref_logp [B, L] float32 and mask [B, L] bool.
    coef: `rl.kl_reward_coef` (> 0).
    estimator: `rl.kl_estimator` ('k1', 'k2' or 'k3').

  Returns:
    r with reward ([B] float32).

  Raises:
    ValueError: unknown estimator.
  """
  reward = losses.kl_penalized_rewards(
      r.reward,
      r.train_traj.logprob,
      r.ref_logp,
      r.mask,
      coef,
      estimator=estimator,
  )
  return r.replace(reward=reward)


def sampler_behaviour(r: Rollout) -> Rollout:
  """Sets behaviour_logp: the sampler's log-probs of the trained rows
  (`rl.behaviour_logprobs='sampler'`; replay-injected rows keep the stored
  episode's).

  Args:
    r: Rollout with train_traj (logprob [B, L] float32).

  Returns:
    r with behaviour_logp ([B, L] float32, the same array).
  """
  return r.replace(behaviour_logp=r.train_traj.logprob)


def behaviour_values(
    r: Rollout, params: Any, *, config, graphdef: nnx.GraphDef
) -> Rollout:
  """Sets old_values: the value head's behaviour values V_old.

  One teacher-forced pass with the sampling parameters over the whole length
  (`behaviour.behaviour_forward` with values; its log-probs are not used).

  Args:
    r: Rollout with train_traj (tokens [B, L] int32).
    params: the sampling parameters (with a value head).
    config: experiment config (see `forward_on_bucket`).
    graphdef: the policy's graph.

  Returns:
    r with old_values ([B, L] float32).
  """
  _, old_values = behaviour.behaviour_forward(
      config, graphdef, params, r.train_traj.tokens, True
  )
  return r.replace(old_values=old_values)


def trainer_behaviour(
    r: Rollout,
    params: Any,
    *,
    config,
    graphdef: nnx.GraphDef,
    update_lengths: tuple | None,
    with_values: bool,
    banned_tokens: tuple[int, ...] | None = None,
) -> Rollout:
  """`rl.behaviour_logprobs='trainer'`: the behaviour log-probs recomputed by
  the trainer, with the sampler/trainer mismatch metrics.

  One teacher-forced pass with the sampling parameters on the update's
  micro-batch shapes (`behaviour.behaviour_forward`): with a value head over
  the whole length (also V_old), else on the update's length bucket. The
  mismatch (sampler: cached one-token decode; trainer: full forward) is
  measured on the FRESH rows' POLICY tokens (replay-injected rows carry an
  older policy's log-probs), before the loss length on a bucket. With
  `banned_tokens` (dual path), the fresh tool-free rows were sampled with
  those tokens masked: their log-probs are the masked distribution's
  (`behaviour.masked_behaviour_logprobs`).

  Args:
    r: Rollout with traj (the fresh rows; facts 'tool_free' [B] bool with
      banned_tokens), train_traj (tokens [B, L] int32, logprob [B, L]
      float32, role) and loss_length ([] int32).
    params: the sampling parameters.
    config: experiment config (see `forward_on_bucket`).
    graphdef: the policy's graph.
    update_lengths: the update's length buckets, or None.
    with_values: the update trains a value head (`update.uses_values`).
    banned_tokens: `rollout.tool_call_tokens(env)` with dual-path tool-free
      rows (`rl.dual_path_tool_free` > 0), else None.

  Returns:
    r with behaviour_logp ([B, L] float32, 0 off the POLICY tokens and from
    the loss length on a bucket), old_values ([B, L] float32 or None),
    behaviour_shift ([B, L] float32 log-prob shift of the masked rows, or
    None without banned_tokens) and info logp_mismatch_max,
    logp_mismatch_mean ([] float32).

  Raises:
    KeyError: banned_tokens without the facts 'tool_free'.
  """
  traj, train_traj, need = r.traj, r.train_traj, r.loss_length
  if with_values:  # GAE's V_old: the whole buffer
    trainer_logp, old_values = behaviour.behaviour_forward(
        config, graphdef, params, train_traj.tokens, with_values
    )
  else:
    old_values = None
    trainer_logp = forward_on_bucket(
        params,
        train_traj.tokens,
        need,
        config=config,
        graphdef=graphdef,
        update_lengths=update_lengths,
    )
  # Training/inference mismatch: sampler (cached one-token decode) vs
  # trainer (full forward) log-probs of the same tokens. Fresh rows only:
  # replay-injected episodes carry an older policy's log-probs.
  pmask = policy_mask(train_traj)
  if update_lengths is not None:
    # On a length bucket, the columns from the loss length on are not
    # computed (no loss reads them; e.g. truncated rows that
    # rl.overlong_mode='mask' drops may run past it): left out of the
    # mismatch metric and 0 in the batch.
    pos = jnp.arange(pmask.shape[1], dtype=jnp.int32)[None, :]
    pmask = pmask & (pos < need)
  fresh_b = jnp.all(train_traj.tokens == traj.tokens, axis=1)
  fresh = pmask & fresh_b[:, None]
  behaviour_shift = None
  if banned_tokens is not None:
    # Dual-path tool-free rows were sampled with the tool-call tokens
    # masked: their behaviour log-probs are the masked distribution's.
    trainer_logp, shift = behaviour.masked_behaviour_logprobs(
        config,
        graphdef,
        params,
        train_traj.tokens,
        trainer_logp,
        traj.facts["tool_free"] & fresh_b,
        banned_tokens,
    )
    behaviour_shift = jnp.where(pmask, shift, 0.0)
  gap = jnp.where(fresh, jnp.abs(train_traj.logprob - trainer_logp), 0.0)
  info = {}
  info["logp_mismatch_max"] = jnp.max(gap)
  info["logp_mismatch_mean"] = jnp.sum(gap) / jnp.maximum(
      jnp.sum(fresh), 1
  ).astype(jnp.float32)
  return r.replace(
      behaviour_logp=jnp.where(pmask, trainer_logp, 0.0),
      old_values=old_values,
      behaviour_shift=behaviour_shift,
  ).with_info(**info)
