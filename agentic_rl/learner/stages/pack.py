"""The last collect stage: the learner batch that `make_update_fn` reads."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from agentic_rl import credit
from agentic_rl import losses
from agentic_rl import types
from agentic_rl.learner.batch import LearnerBatch, Rollout


def prompt_embedding(
    graphdef: nnx.GraphDef, params, traj: types.Trajectory
) -> jax.Array:
  """[B, D] float32 mean of the policy's final hidden states over PROMPT tokens.

  The input of FlowRL's log-partition network (arXiv:2509.15207 feeds the
  policy's prompt hidden states to it); computed once per batch with the
  parameters that sampled it and treated as a constant feature
  (stop_gradient: the log Z loss does not train the policy's trunk; the
  authors' code lets that gradient through, our choice differs).
  """
  model = nnx.merge(graphdef, params)
  hidden_bld, _ = model.hidden_states(traj.tokens)
  pooled = losses.masked_mean_pool(
      hidden_bld.astype(jnp.float32), traj.role == types.PROMPT
  )
  return jax.lax.stop_gradient(pooled)


def pack(
    r: Rollout,
    params: Any,
    key: jax.Array,
    *,
    graphdef: nnx.GraphDef,
    episode_reward: bool,
    log_partition: bool,
    obs_prediction: bool,
    placebo: bool,
) -> LearnerBatch:
  """The learner batch of `make_update_fn`.

  Args:
    r: the Rollout after the advantage stage: train_traj, mask [B, L] bool,
      behaviour_logp, ref_logp, advantage [B, L] float32; optional returns
      and old_values, adv_b (FlowRL), sil, behaviour_shift, aux_advantage.
    params: the sampling parameters (FlowRL's prompt embedding).
    key: the iteration's PRNG key, fold_in(state.rng, state.step); the
      placebo labels use fold_in(key, 5).
    graphdef: the policy's graph.
    episode_reward: the `rl.loss_type` entry of `losses.POLICY_LOSSES`
      takes `reward_hat_b` (`PolicyLoss.episode_reward`, 'flowrl'): sets
      reward_hat [B] (the episode-level advantage adv_b).
    log_partition: that entry `needs_log_partition` ('flowrl'): sets
      prompt_embedding [B, D] (the log-partition network's input).
    obs_prediction: `rl.obs_prediction_coef` > 0: sets obs_mask [B, L] bool
      (the TOOL tokens of the auxiliary next-observation loss).
    placebo: `rl.obs_prediction_placebo` (with obs_prediction): sets
      obs_targets [B, L] int32, the observation labels permuted across the
      batch (`credit.shuffle_observation_targets`).

  Returns:
    A `LearnerBatch`: tokens [B, L] int32, mask, behaviour_logp, ref_logp,
    advantage, plus, when set: old_values and returns (value head),
    reward_hat and prompt_embedding (FlowRL), sil, behaviour_shift,
    aux_advantage (0 off the mask), obs_mask, obs_targets; the others None.
  """
  train_traj, mask = r.train_traj, r.mask
  values = {}
  if r.returns is not None:
    values = {"old_values": r.old_values, "returns": r.returns}
  if episode_reward:
    # FlowRL: r_hat = the episode-level (group-normalised) advantage.
    values["reward_hat"] = r.adv_b
  if log_partition:
    # The log-partition network's input.
    values["prompt_embedding"] = prompt_embedding(graphdef, params, train_traj)
  if r.aux_advantage is not None:
    values["aux_advantage"] = jnp.where(mask, r.aux_advantage, 0.0)
  if obs_prediction:
    # Auxiliary next-observation CE on the TOOL tokens; the placebo
    # (`rl.obs_prediction_placebo`) permutes its labels across the batch.
    obs_mask = train_traj.role == types.TOOL
    values["obs_mask"] = obs_mask
    if placebo:
      values["obs_targets"] = credit.shuffle_observation_targets(
          train_traj.tokens, obs_mask, jax.random.fold_in(key, 5)
      )
  return LearnerBatch(
      tokens=train_traj.tokens,
      mask=mask,
      behaviour_logp=r.behaviour_logp,
      ref_logp=r.ref_logp,
      advantage=r.advantage,
      sil=r.sil,
      behaviour_shift=r.behaviour_shift,
      **values,
  )
