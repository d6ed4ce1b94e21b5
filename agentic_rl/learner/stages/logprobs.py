"""Log-prob stages: the loss length, the reference log-probs and the
KL-in-reward penalty.

After the replay stages the collect step sets `loss_length` (the columns the
update's loss reads), then `reference_logprobs` (one teacher-forced pass of
the reference model over the trained rows, on the update's micro-batch
blocks and length bucket) and, with `rl.kl_reward_coef` > 0, `kl_in_reward`.
"""

from __future__ import annotations

from typing import Any

import jax
from flax import nnx

from agentic_rl import losses
from agentic_rl import padding
from agentic_rl import types
from agentic_rl.learner import behaviour
from agentic_rl.learner.batch import Rollout


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


def loss_length(r: Rollout, *, with_obs: bool) -> Rollout:
  """Sets loss_length: the columns the update's loss reads.

  1 + the last position set in the loss mask, or in the TOOL tokens of the
  trained rows with next-observation prediction (`padding.loss_length_of`);
  the update's length bucket is the shortest that holds it.

  Args:
    r: Rollout with mask [B, L] bool and train_traj (role [B, L] int8).
    with_obs: `rl.obs_prediction_coef` > 0 (the TOOL tokens are loss
      targets too).

  Returns:
    r with loss_length ([] int32).
  """
  need = padding.loss_length_of(
      r.mask,
      r.train_traj.role == types.TOOL if with_obs else None,
  )
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
