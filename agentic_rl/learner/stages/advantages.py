"""Advantage stages: the estimator table's entry of the config
(`estimators.ESTIMATORS`, `token_credit.estimator_name`), with the
step-reward diagnostics and the value head's targets.

A token-level entry (`rl.advantage_estimator='gae'`): `gae_advantages` (PPO
with GAE from the value head). Otherwise `step_reward_diagnostics` (with
`rl.step_reward`), then `advantages` (`token_credit.token_advantages`: the
episode- or turn-level entry, with the telescoped PBRS return).
"""

from __future__ import annotations

import jax.numpy as jnp

from agentic_rl import estimators
from agentic_rl.learner import token_credit
from agentic_rl.learner.batch import Rollout
from agentic_rl.learner.common import policy_mask


def gae_advantages(r: Rollout, *, rl_cfg) -> Rollout:
  """'gae': PPO with GAE from the value head (arXiv:1707.06347,
  arXiv:1506.02438): the config's token-level entry
  (`token_credit.token_level_advantages`, `estimators.gae_token_advantages`).

  Args:
    r: Rollout with train_traj (role [B, L] int8), reward [B] float32 and
      old_values [B, L] float32 (`behaviour_values` / `trainer_behaviour`).
    rl_cfg: the `rl` block (discount, gae_lambda).

  Returns:
    r with adv_b ([B] float32, the mean advantage over each row's POLICY
    tokens, for logging), advantage and returns ([B, L] float32, 0 off the
    POLICY tokens); reward unchanged.
  """
  adv_b, adv_bl, returns_bl = token_credit.token_level_advantages(
      rl_cfg, r.reward, policy_mask(r.train_traj), r.old_values
  )
  return r.replace(adv_b=adv_b, advantage=adv_bl, returns=returns_bl)


def step_reward_diagnostics(r: Rollout, *, rl_cfg, max_turns: int) -> Rollout:
  """The step rewards of `rl.step_reward` as delivered and before the
  transform, per episode, in r.info.

  Args:
    r: Rollout with train_traj (num_turns; facts 'valid_call_turn' and
      'tool_call_turn' [B, K], or 'rm_step_score' [B, K] for 'prm') and reward
      [B] float32 (the gate of 'gated').
    rl_cfg: the `rl` block (step_reward, step_reward_coef,
      step_reward_transform, step_reward_clip_eta / _quantile).
    max_turns: K (static).

  Returns:
    r with info step_reward (mean per-episode sum of the delivered step
    rewards), step_reward_raw (the same of coef * score before the
    transform) and, with `rl.step_reward_clip_quantile` > 0,
    step_reward_clip_eta (the batch's Clip threshold); [] float32 each.

  Raises:
    KeyError: the facts the step reward reads are missing.
  """
  train_traj, reward = r.train_traj, r.reward
  info = {}
  # Step rewards as delivered (per episode sum), and before the transform.
  s_bk = token_credit.step_rewards_bk(rl_cfg, train_traj, reward, max_turns)
  info["step_reward"] = jnp.mean(jnp.sum(s_bk, axis=1))
  p_bk, scored_bk = token_credit.step_scores_bk(rl_cfg, train_traj, max_turns)
  raw = rl_cfg.step_reward_coef * jnp.where(scored_bk, p_bk, 0.0)
  info["step_reward_raw"] = jnp.mean(jnp.sum(raw, 1))
  if rl_cfg.step_reward_clip_quantile > 0:
    # The batch's Clip threshold (a quantile of its step scores).
    info["step_reward_clip_eta"] = token_credit.step_clip_eta(
        rl_cfg, p_bk, scored_bk
    )
  return r.with_info(**info)


def advantages(
    r: Rollout, *, rl_cfg, max_turns: int, value_targets: bool
) -> Rollout:
  """The advantages of the config's estimator (`token_credit.
  token_advantages`: `rl.advantage_estimator`, `rl.credit`,
  `rl.tree_branching`), with the PBRS potential phi when set.

  With a value head (`value_targets`; the 'value' potential), also its
  Monte-Carlo targets (GAE with lambda = 1) of the reward BEFORE the shaping,
  so the potential never regresses on its own shaping terms; computed after
  the estimator, as the collect step always did.

  Args:
    r: Rollout with train_traj, reward [B] float32, phi [B, K + 1] float32
      or None, and old_values [B, L] float32 with value_targets.
    rl_cfg: the `rl` block.
    max_turns: K (static).
    value_targets: `update.uses_values(rl_cfg)` (not 'gae').

  Returns:
    r with reward ([B] float32: with trajectory-level PBRS the telescoped
    return, else unchanged), adv_b ([B] float32), advantage ([B, L] float32)
    and returns ([B, L] float32, or None without value_targets).
  """
  train_traj = r.train_traj
  unshaped = r.reward
  reward, adv_b, adv_bl = token_credit.token_advantages(
      rl_cfg, r.reward, train_traj, max_turns, phi_bk1=r.phi
  )
  returns_bl = None
  if value_targets:
    _, _, returns_bl = estimators.gae_token_advantages(
        unshaped,
        policy_mask(train_traj),
        r.old_values,
        discount=rl_cfg.discount,
        lambda_=1.0,
    )
  return r.replace(
      reward=reward, adv_b=adv_b, advantage=adv_bl, returns=returns_bl
  )
