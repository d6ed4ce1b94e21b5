"""Loss mask and reward shaping stages.

`policy_mask` sets the loss mask, `overlong` applies `rl.overlong_mode` to
the mask or the reward. `gold_logprobs` and `observation_scores` are the
shared model passes of the shaping terms (each computed once per batch,
just before its first reader); `likelihood_reward` adds the reference
model's log-likelihood of the gold answer to the reward; `potential` sets
the PBRS potential (`potentials_by_name.POTENTIALS`);
`obs_prediction_diagnostics` logs the dark-room metrics;
`dense_aux_advantage` sets the dense auxiliary advantages of
`rl.dense_as='aux_loss'`; `dual_penalty` adds the dual-ascent constraint
term to the reward.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from agentic_rl import batch_policies
from agentic_rl import credit
from agentic_rl import types
from agentic_rl.learner import common
from agentic_rl.learner import potentials_by_name
from agentic_rl.learner import token_credit
from agentic_rl.learner.batch import Rollout


def policy_mask(r: Rollout, *, exclude_tool_free: bool) -> Rollout:
  """Sets the loss mask: the POLICY tokens of the fresh batch.

  Args:
    r: Rollout with traj (role [B, L]; facts 'tool_free' [B] bool when
      exclude_tool_free).
    exclude_tool_free: drop the dual-path tool-free rows from the loss
      (`rl.dual_path_tool_free` > 0 and not `rl.dual_path_train_tool_free`:
      they only measure tool necessity).

  Returns:
    r with mask [B, L] bool.

  Raises:
    KeyError: exclude_tool_free without facts 'tool_free'.
  """
  traj = r.traj
  mask = common.policy_mask(traj)
  if exclude_tool_free:
    # Tool-free episodes only measure tool necessity: no loss on them.
    mask = mask & ~traj.facts["tool_free"][:, None]
  return r.replace(mask=mask)


def overlong(r: Rollout, *, mode: str, overlong_reward: float) -> Rollout:
  """Overlong (TRUNCATED) episodes by `rl.overlong_mode`.

  'none': unchanged; 'mask': their tokens leave the loss mask (DAPO overlong
  filtering); 'reward': their reward becomes `overlong_reward`
  (`batch_policies.apply_overlong`).

  Args:
    r: Rollout with traj (finish [B] int32), reward [B] float32 and mask
      [B, L] bool.
    mode: `rl.overlong_mode`, one of `batch_policies.OVERLONG_MODES`.
    overlong_reward: `rl.overlong_reward`, the reward of mode 'reward'.

  Returns:
    r with reward [B] float32 and mask [B, L] bool.

  Raises:
    ValueError: unknown mode.
  """
  reward, mask = batch_policies.apply_overlong(
      r.reward,
      r.mask,
      r.traj.finish,
      mode,
      overlong_reward,
  )
  return r.replace(reward=reward, mask=mask)


def gold_logprobs(
    r: Rollout,
    ref_params: Any,
    *,
    graphdef: nnx.GraphDef,
    temperature: float,
    max_turns: int,
) -> Rollout:
  """Sets gold_logp: the reference model's log-probs of the gold answer.

  One batched pass (`potentials_by_name.reference_gold_logprobs`), read by
  the likelihood reward and the 'trace' potential.

  Args:
    r: Rollout with traj (facts 'gold_answer' [B, A] int32,
      'gold_answer_len' [B] int32).
    ref_params: the full reference parameters.
    graphdef: the policy's (and reference's) graph.
    temperature: the sampling temperature.
    max_turns: K (static).

  Returns:
    r with gold_logp [B, K + 1] float32 (log p_ref(y* | s_k), k = 0 .. K).

  Raises:
    KeyError: the facts lack the gold answer.
  """
  return r.replace(
      gold_logp=potentials_by_name.reference_gold_logprobs(
          graphdef, ref_params, r.traj, temperature, max_turns
      )
  )


def likelihood_reward(r: Rollout, *, coef: float) -> Rollout:
  """Adds coef * log p_ref(gold answer | final context) to the reward.

  The final context is the state before the answering turn for ANSWERED
  episodes, after the last turn otherwise (`credit.likelihood_reward`).

  Args:
    r: Rollout with traj (num_turns, finish [B] int32), reward [B] float32
      and gold_logp [B, K + 1] float32 (`gold_logprobs`).
    coef: `rl.likelihood_coef`.

  Returns:
    r with reward + coef * lik [B] float32 and info 'likelihood' (mean lik).
  """
  traj = r.traj
  lik = credit.likelihood_reward(r.gold_logp, traj.num_turns, traj.finish)
  return r.replace(reward=r.reward + coef * lik).with_info(
      likelihood=jnp.mean(lik)
  )


def observation_scores(
    r: Rollout,
    params: Any,
    *,
    graphdef: nnx.GraphDef,
    temperature: float,
) -> Rollout:
  """Sets obs_prob / obs_hit: the policy's next-token prediction scores.

  One teacher-forced pass of the sampling policy
  (`credit.observation_prediction_scores`), read by the 'obs_prediction'
  potential and the dark-room diagnostics.

  Args:
    r: Rollout with traj (tokens [B, L] int32).
    params: the sampling parameters.
    graphdef: the policy's graph.
    temperature: the sampling temperature.

  Returns:
    r with obs_prob [B, L] float32 (p(token_t | tokens before t)) and obs_hit
    [B, L] bool (the token is the arg-max prediction).
  """
  prob_bl, hit_bl = credit.observation_prediction_scores(
      graphdef, params, r.traj.tokens, temperature
  )
  return r.replace(obs_prob=prob_bl, obs_hit=hit_bl)


def potential(
    r: Rollout, ctx: potentials_by_name.PotentialContext, *, name: str
) -> Rollout:
  """Sets phi: the unscaled PBRS potential `rl.pbrs_potential` = name.

  Args:
    r: Rollout with traj and the shared passes the potential reads
      (gold_logp for 'trace', obs_prob for 'obs_prediction').
    ctx: the policy, its sampling parameters, the SPA head and K.
    name: a key of `potentials_by_name.POTENTIALS`.

  Returns:
    r with phi [B, K + 1] float32 (and spa_inputs for 'spa').

  Raises:
    ValueError: unknown name (validation catches it first).
  """
  if name not in potentials_by_name.POTENTIALS:
    raise ValueError(
        f"rl.pbrs_potential={name!r}: unknown; known: "
        f"{tuple(potentials_by_name.POTENTIALS)}"
    )
  return potentials_by_name.POTENTIALS[name](r, ctx)


def obs_prediction_info(
    prob_bl: jax.Array, hit_bl: jax.Array, traj: types.Trajectory
) -> dict[str, jax.Array]:
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


def obs_prediction_diagnostics(r: Rollout) -> Rollout:
  """Adds the dark-room diagnostics (`obs_prediction_info`) to r.info.

  Args:
    r: Rollout with traj, obs_prob [B, L] float32 and obs_hit [B, L] bool
      (`observation_scores`).

  Returns:
    r with info obs_pred_prob, obs_pred_acc, horizon_rate (float32 scalars).
  """
  return r.with_info(**obs_prediction_info(r.obs_prob, r.obs_hit, r.traj))


def dense_aux_advantage(r: Rollout, *, rl_cfg, max_turns: int) -> Rollout:
  """Sets aux_advantage: the per-token dense credit of `rl.dense_as='aux_loss'`.

  Turn k's POLICY tokens get its shaping reward F_k (`token_credit.
  dense_aux_advantages`; Phi = rl.pbrs_coef * phi).

  Args:
    r: Rollout with traj and phi [B, K + 1] float32.
    rl_cfg: the `rl` block (pbrs_coef, discount and the PBRS terminal
      settings).
    max_turns: K (static).

  Returns:
    r with aux_advantage [B, L] float32.
  """
  return r.replace(
      aux_advantage=token_credit.dense_aux_advantages(
          rl_cfg, r.traj, r.phi, max_turns
      )
  )


def dual_penalty(
    r: Rollout, dual_coef: jax.Array, *, fact: str, sense: str
) -> Rollout:
  """The Lagrangian reward of a constrained fact g (`rl.dual_constraint`).

  R - lam * g for sense 'max' (E[g] <= target), R + lam * g for 'min'
  (E[g] >= target); lam adapts by dual ascent in the RL step (RCPO,
  arXiv:1805.11074).

  Args:
    r: Rollout with traj (facts[fact] [B], any numeric dtype) and reward
      [B] float32.
    dual_coef: [] float32 multiplier lam (`TrainState.features['dual']`).
    fact: `rl.dual_constraint`, the name of the constrained fact.
    sense: `rl.dual_sense`: 'max' (an upper bound), else a lower bound.

  Returns:
    r with reward [B] float32 and dual_observed ([] float32, mean g).

  Raises:
    KeyError: the facts lack `fact`.
  """
  dual_sign = 1.0 if sense == "max" else -1.0
  g_b = r.traj.facts[fact].astype(jnp.float32)
  return r.replace(
      reward=r.reward - dual_sign * dual_coef * g_b,
      dual_observed=jnp.mean(g_b),
  )
