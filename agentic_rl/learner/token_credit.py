"""Token-credit stage: per-token advantages [B, L] from episode rewards,
per-turn step rewards and PBRS shaping.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp

from agentic_rl import advantages
from agentic_rl import credit
from agentic_rl.rewards import sanitize
from agentic_rl.rewards import step_rewards
from agentic_rl import types


def last_policy_reward(reward_b: jax.Array, mask_bl: jax.Array) -> jax.Array:
  """[B, L] float32: each episode's reward at its last POLICY token, 0 elsewhere."""
  l = mask_bl.shape[1]
  pos = jnp.arange(l)[None, :]
  last_b = jnp.max(jnp.where(mask_bl, pos, -1), axis=1)
  return jnp.where(pos == last_b[:, None], reward_b[:, None], 0.0).astype(
      jnp.float32
  )


def gae_token_advantages(
    rl_cfg,
    reward_b: jax.Array,
    mask_bl: jax.Array,
    values_bl: jax.Array,
    lambda_: float | None = None,
):
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
  lam = rl_cfg.gae_lambda if lambda_ is None else lambda_
  adv_bl, ret_bl = jax.vmap(
      advantages.token_gae, in_axes=(0, 0, 0, None, None)
  )(
      last_policy_reward(reward_b, mask_bl),
      values_bl,
      mask_bl,
      rl_cfg.discount,
      lam,
  )
  count_b = jnp.maximum(jnp.sum(mask_bl, axis=1), 1).astype(jnp.float32)
  return jnp.sum(adv_bl, axis=1) / count_b, adv_bl, ret_bl


def step_reward_on(rl_cfg) -> bool:
  """True when a per-turn step reward is configured (`rl.step_reward`)."""
  return rl_cfg.step_reward != "none"


def step_scores_bk(
    rl_cfg, traj: types.Trajectory, max_turns: int
) -> tuple[jax.Array, jax.Array]:
  """(p_bk float32 [B, K], scored_bk bool [B, K]): the step scores of
  `rl.step_reward` and the turns they score (see `step_rewards_bk`)."""
  turn_mask = jnp.arange(max_turns)[None, :] < traj.num_turns[:, None]
  if rl_cfg.step_reward == "prm":
    return traj.facts["rm_step_score"].astype(jnp.float32), turn_mask
  p_bk = traj.facts["valid_call_turn"].astype(jnp.float32)
  scored = traj.facts["tool_call_turn"].astype(jnp.bool_) & turn_mask
  return p_bk, scored


def step_clip_eta(rl_cfg, p_bk: jax.Array, scored_bk: jax.Array):
  """The 'clip' threshold: `rl.step_reward_clip_eta`, or with
  `rl.step_reward_clip_quantile` = q > 0 the q-quantile of the batch's scored
  step scores (`step_rewards.masked_quantile`, a float32 scalar)."""
  q = rl_cfg.step_reward_clip_quantile
  if q > 0:
    return step_rewards.masked_quantile(p_bk, scored_bk, q)
  return rl_cfg.step_reward_clip_eta


def step_rewards_bk(
    rl_cfg, traj: types.Trajectory, reward_b: jax.Array, max_turns: int
) -> jax.Array:
  """[B, K] float32 per-turn step rewards of `rl.step_reward` (0 when off).

  'valid_call': the step score p_k = env fact 'valid_call_turn' [B, K] (a
  well-formed call that returned a value; repeats are paid again) on the
  tool-call turns (fact 'tool_call_turn'); transformed by
  `rl.step_reward_transform` ('sum', 'clip', 'delta', 'min', 'gated') and
  scaled by `rl.step_reward_coef` (step_rewards.step_turn_rewards; Clipping /
  Delta arXiv:2410.15115, PURE arXiv:2504.15275, G-RA docs/papers.md). The
  gate of 'gated' reads `reward_b`, the episode's composed outcome reward.
  Added to the per-turn rewards of `rl.credit='per_turn'` before the
  reward-to-go (`token_advantages`).

  'prm': p_k = the frozen process reward model's continuous per-turn score
  sigmoid(s_k) (fact 'rm_step_score', `reward_models.frozen.trajectory_rm_outputs`;
  needs `rl.reward_model_dir` of kind 'process'), scored on EVERY turn that
  happened, the answer turn included.

  `rl.step_reward_clip_quantile` = q in (0, 1] ('clip' only): eta is the
  q-quantile of this batch's scored step scores (`step_rewards.masked_quantile`)
  instead of the fixed `rl.step_reward_clip_eta`; 0 = the fixed eta.
  """
  k = max_turns
  turn_mask = jnp.arange(k)[None, :] < traj.num_turns[:, None]
  if not step_reward_on(rl_cfg):
    return jnp.zeros(turn_mask.shape, jnp.float32)
  p_bk, scored = step_scores_bk(rl_cfg, traj, k)
  eta = step_clip_eta(rl_cfg, p_bk, scored)
  return step_rewards.step_turn_rewards(
      p_bk,
      scored,
      turn_mask,
      reward_b,
      transform=rl_cfg.step_reward_transform,
      coef=rl_cfg.step_reward_coef,
      eta=eta,
      gate_threshold=rl_cfg.step_reward_gate_threshold,
  )


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
    'never' no ending is absorbing: the final potential stays in every
            return, so the shaped turn rewards of an episode sum to
            Phi(s_final) - Phi(s_0) (discount 1), with s_final the state
            before the answer turn for answered / format-error episodes
            (`pbrs_final_potential`) and s_n for cut-off ones. TRACE's
            per-turn reward keeps the value of the final state this way
            (docs/papers.md, TRACE).

  Args:
    rl_cfg: the `rl` block (`pbrs_cutoff`, default 'keep').
    finish_b: [B] int32 finish codes (types.ANSWERED, ...).

  Raises:
    ValueError: `rl.pbrs_cutoff` not 'keep', 'zero' or 'never' (also caught by
      validation before any work).
  """
  cutoff = rl_cfg.pbrs_cutoff
  if cutoff not in ("keep", "zero", "never"):
    raise ValueError(
        f"rl.pbrs_cutoff must be 'keep', 'zero' or 'never', got {cutoff!r}"
    )
  if cutoff == "zero":
    return jnp.ones(finish_b.shape, jnp.bool_)
  if cutoff == "never":
    return jnp.zeros(finish_b.shape, jnp.bool_)
  return _answer_ending(finish_b)


def _answer_ending(finish_b: jax.Array) -> jax.Array:
  """[B] bool: the episode ended on an answer turn (ANSWERED or FORMAT_ERROR)."""
  return (finish_b == types.ANSWERED) | (finish_b == types.FORMAT_ERROR)


def pbrs_final_potential(
    rl_cfg, phi_bk1: jax.Array, traj: types.Trajectory
) -> jax.Array:
  """Phi with the state after an answer turn read as the state before it,
  under `rl.pbrs_cutoff='never'`.

  With 'never' nothing zeroes Phi(s_n), so an answered (or format-error)
  episode would be shaped on its last turn by Phi(s_n) - Phi(s_{n-1}), where
  s_n holds the policy's own answer; for a potential that scores the gold
  answer after s_k (the TRACE log-ratio), s_n is a context with two answers,
  one the reference model never sees. TRACE pays the answer turn the outcome
  reward and the tool turns V(s_{k+1}) - V(s_k), so the kept terminal value
  is that of the state before the answer: here Phi(s_k) for k >= n is set to
  Phi(s_{n-1}) on those episodes (their shaped turn rewards then sum to
  Phi(s_{n-1}) - Phi(s_0), discount 1). Episodes cut off by the turn budget
  or the context (no answer turn) keep Phi(s_n). Other cutoffs: unchanged
  (there Phi(terminal) is 0 for answered endings anyway).

  Args:
    rl_cfg: the `rl` block (`pbrs_cutoff`).
    phi_bk1: [B, K + 1] float32 potentials.
    traj: the batch (`finish` [B], `num_turns` [B] int32).

  Returns:
    [B, K + 1] float32.
  """
  if rl_cfg.pbrs_cutoff != "never":
    return phi_bk1
  answered = _answer_ending(traj.finish)
  k1 = phi_bk1.shape[1]
  n_b = traj.num_turns.astype(jnp.int32)
  before = jnp.take_along_axis(
      phi_bk1, jnp.clip(n_b - 1, 0, k1 - 1)[:, None], axis=1
  )
  after = jnp.arange(k1)[None, :] >= n_b[:, None]
  return jnp.where(answered[:, None] & after, before, phi_bk1)


# ---------------------------------------------------------------------------
# Advantage-estimator tables.
# ---------------------------------------------------------------------------


def _turn_mask(traj: types.Trajectory, max_turns: int) -> jax.Array:
  """[B, K] bool: turn k < the episode's number of turns."""
  return jnp.arange(max_turns)[None, :] < traj.num_turns[:, None]


def _outcome_at_last_turn(
    reward: jax.Array, traj: types.Trajectory, turn_mask: jax.Array
) -> jax.Array:
  """[B, K] float32: the episode reward at its last turn, 0 elsewhere."""
  k = turn_mask.shape[1]
  return (
      jnp.where(
          jnp.arange(k)[None, :] == (traj.num_turns - 1)[:, None],
          reward[:, None],
          0.0,
      )
      * turn_mask
  )


# Episode-level estimators: fn(reward_b [B] float32, traj, rl_cfg) -> adv_b
# [B] float32, one advantage per episode (broadcast to its POLICY tokens).
EpisodeEstimatorFn = Callable[[jax.Array, types.Trajectory, Any], jax.Array]


def _from_advantages(name: str) -> EpisodeEstimatorFn:
  """The `advantages.ESTIMATORS` entry `name` as an episode-level estimator."""

  def estimator(reward_b, traj, rl_cfg):
    return advantages.compute_advantages(
        name,
        reward_b,
        traj.group,
        scale_by_std=rl_cfg.scale_by_std,
        eps=rl_cfg.adv_eps,
        std_ddof=rl_cfg.std_ddof,
    )

  estimator.__name__ = f"{name}_episode_advantages"
  estimator.__doc__ = (
      f"'{name}': `advantages.compute_advantages('{name}', ...)` on the [B]\n"
      "float32 episode rewards within each task group (traj.group), with\n"
      "rl.scale_by_std, rl.adv_eps, rl.std_ddof; [B] float32. Equations and\n"
      "sources: `advantages.compute_advantages`."
  )
  return estimator


def hdpo_episode_advantages(
    reward_b: jax.Array, traj: types.Trajectory, rl_cfg
) -> jax.Array:
  """'hdpo': accuracy channel + efficiency channel among correct episodes only
  (`credit.hdpo_advantages`, weight `rl.hdpo_efficiency_weight`). Reads the
  facts 'correct' and 'num_tool_calls', not `reward_b`; [B] float32."""
  del reward_b
  return credit.hdpo_advantages(
      traj.facts["correct"].astype(jnp.float32),
      traj.facts["num_tool_calls"].astype(jnp.float32),
      traj.group,
      efficiency_weight=rl_cfg.hdpo_efficiency_weight,
      eps=rl_cfg.adv_eps,
  )


EPISODE_ESTIMATORS: dict[str, EpisodeEstimatorFn] = {
    **{name: _from_advantages(name) for name in advantages.ESTIMATORS},
    "hdpo": hdpo_episode_advantages,
}


# Per-turn estimators: fn(rl_cfg, reward_b [B] float32, traj, max_turns K,
# phi_bk1 [B, K + 1] float32 scaled potential or None) -> (adv_b [B] float32
# for logging, adv_bl [B, L] float32 per-token advantages).
TurnEstimatorFn = Callable[..., tuple[jax.Array, jax.Array]]


def per_turn_advantages(rl_cfg, reward, traj, max_turns, phi):
  """'per_turn' (`rl.credit='per_turn'`): outcome reward at the last turn,
  PBRS terms F_k = discount Phi(s_{k+1}) - Phi(s_k) at the turn boundaries
  (`credit.shape_turn_rewards`, Ng et al. 1999), the step rewards of
  `step_rewards_bk`, reward-to-go, group-relative per turn index
  (`advantages.per_turn_grpo_advantages`), broadcast to each turn's POLICY
  tokens. adv_b is the mean |A| over the episode's turns."""
  k, discount = max_turns, rl_cfg.discount
  turn_mask = _turn_mask(traj, k)
  r_bk = _outcome_at_last_turn(reward, traj, turn_mask)
  if phi is not None:
    r_bk = credit.shape_turn_rewards(
        r_bk, phi, turn_mask, discount, pbrs_terminated(rl_cfg, traj.finish)
    )
  if step_reward_on(rl_cfg):
    # Per-turn step (process) rewards (rl.step_reward), after the outcome.
    r_bk = r_bk + step_rewards_bk(rl_cfg, traj, reward, k)
  returns_bk = advantages.turn_reward_to_go(r_bk, turn_mask, discount)
  adv_bk = advantages.per_turn_grpo_advantages(
      returns_bk,
      turn_mask,
      traj.group,
      scale_by_std=rl_cfg.scale_by_std,
      eps=rl_cfg.adv_eps,
      std_ddof=rl_cfg.std_ddof,
  )
  adv_bl = advantages.broadcast_turn_to_tokens(adv_bk, traj.turn, traj.role)
  adv_b = jnp.sum(jnp.abs(adv_bk) * turn_mask, 1) / jnp.maximum(
      jnp.sum(turn_mask, 1), 1
  )
  return adv_b, adv_bl


def gigpo_advantages(rl_cfg, reward, traj, max_turns, phi):
  """'gigpo' (GiGPO, arXiv:2505.10978): the episode's GRPO advantage plus
  `rl.gigpo_step_weight` times the step advantage within the group of steps
  of the same task that start from the same state
  (`credit.observation_state_keys`, `credit.gigpo_step_advantages`), on
  discounted step returns (outcome at the last turn). Unshaped (validation
  rejects PBRS with it). adv_b is the episode-level GRPO advantage."""
  del phi
  k = max_turns
  turn_mask = _turn_mask(traj, k)
  r_bk = _outcome_at_last_turn(reward, traj, turn_mask)
  returns_bk = advantages.turn_reward_to_go(r_bk, turn_mask, rl_cfg.discount)
  adv_b = advantages.grpo_advantages(
      reward, traj.group, scale_by_std=rl_cfg.scale_by_std, eps=rl_cfg.adv_eps
  )
  keys_bk = credit.observation_state_keys(
      traj.tokens, traj.role, traj.turn, k, match_turn=rl_cfg.gigpo_match_turn
  )
  adv_s = credit.gigpo_step_advantages(
      returns_bk,
      keys_bk,
      turn_mask,
      traj.group,
      scale_by_std=rl_cfg.scale_by_std,
      eps=rl_cfg.adv_eps,
  )
  adv_bk = adv_b[:, None] + rl_cfg.gigpo_step_weight * adv_s
  adv_bl = advantages.broadcast_turn_to_tokens(
      jnp.where(turn_mask, adv_bk, 0.0), traj.turn, traj.role
  )
  return adv_b, adv_bl


def tree_advantages(rl_cfg, reward, traj, max_turns, phi):
  """'tree' (`rl.tree_branching` set; PORTool tree rollouts): turn k of a leaf
  gets `credit.tree_fork_advantages` of its step at depth min(k + 1, d),
  blended with the trajectory advantage by `rl.tree_alpha`, per tree (group
  rows contiguous, leaves in lexicographic order). adv_b is the leaf's
  deepest-step advantage."""
  del phi
  k = max_turns
  branching = tuple(rl_cfg.tree_branching)
  turn_mask = _turn_mask(traj, k)
  adv_gd = jax.vmap(
      functools.partial(
          credit.tree_fork_advantages,
          branching=branching,
          alpha=rl_cfg.tree_alpha,
          scale_by_std=rl_cfg.scale_by_std,
          eps=rl_cfg.adv_eps,
      )
  )(reward.reshape(-1, math.prod(branching)))
  adv_bd = adv_gd.reshape(reward.shape[0], len(branching))
  adv_bk = jnp.where(turn_mask, credit.tree_turn_advantages(adv_bd, k), 0.0)
  adv_bl = advantages.broadcast_turn_to_tokens(adv_bk, traj.turn, traj.role)
  return adv_bd[:, -1], adv_bl


TURN_ESTIMATORS: dict[str, TurnEstimatorFn] = {
    "per_turn": per_turn_advantages,
    "gigpo": gigpo_advantages,
    "tree": tree_advantages,
}

# Valid `rl.advantage_estimator` names: the episode-level table, the per-turn
# estimator 'gigpo', and 'gae' (PPO-GAE from the value head, which needs the
# behaviour values: `gae_token_advantages`, called by the collect stage).
ADVANTAGE_ESTIMATORS = (*EPISODE_ESTIMATORS, "gigpo", "gae")


def turn_estimator_name(rl_cfg) -> str | None:
  """The `TURN_ESTIMATORS` key the config selects, or None (one advantage per
  episode): 'tree' when `rl.tree_branching` is set, else 'gigpo' for
  `rl.advantage_estimator='gigpo'`, else 'per_turn' for
  `rl.credit='per_turn'`."""
  if tuple(rl_cfg.tree_branching):
    return "tree"
  if rl_cfg.advantage_estimator == "gigpo":
    return "gigpo"
  if rl_cfg.credit == "per_turn":
    return "per_turn"
  return None


def token_advantages(
    rl_cfg,
    reward: jax.Array,
    traj: types.Trajectory,
    max_turns: int,
    phi_bk1: jax.Array | None = None,
):
  """Per-token advantages [B, L] from episode rewards, by `rl.credit`.

  'trajectory': one advantage per episode from `EPISODE_ESTIMATORS[rl.advantage_estimator]`,
  on the reward plus, if `rl.pbrs_coef` > 0, the telescoped PBRS return
  sum_k discount^k F_k (closed form; credit.telescoped_episode_returns).
  'per_turn': the reward is placed at the episode's last turn, PBRS terms
  F_k = discount * Phi(s_{k+1}) - Phi(s_k) (Phi = pbrs_coef * facts['progress'],
  Phi(terminal) = 0 for ANSWERED / FORMAT_ERROR endings, and for cut-off ones
  with `rl.pbrs_cutoff='zero'`; `pbrs_terminated`; with 'never' no ending is
  terminal and an answered episode's final potential is that of the state
  before its answer, `pbrs_final_potential`) are added per turn, the
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

  The per-turn paths are the `TURN_ESTIMATORS` entries 'per_turn', 'gigpo'
  and 'tree' (`turn_estimator_name` picks one from the config).

  Returns:
    (reward [B] actually used, adv_b [B] (per-episode advantage, or the mean |A|
     over turns for 'per_turn', for logging), adv_bl [B, L] float32).
  """
  pbrs_coef = rl_cfg.pbrs_coef
  phi = None
  if pbrs_coef > 0 and rl_cfg.dense_as != "aux_loss":
    phi = pbrs_final_potential(
        rl_cfg,
        pbrs_coef
        * (
            sanitize.finite_or_zero(traj.facts["progress"])
            if phi_bk1 is None
            else phi_bk1
        ),
        traj,
    )
  turn_name = turn_estimator_name(rl_cfg)
  if turn_name is not None:
    adv_b, adv_bl = TURN_ESTIMATORS[turn_name](
        rl_cfg, reward, traj, max_turns, phi
    )
    return reward, adv_b, adv_bl
  if phi is not None:
    # Trajectory-level return with PBRS, in closed form (exact in float32).
    reward = credit.telescoped_episode_returns(
        reward,
        phi,
        _turn_mask(traj, max_turns),
        rl_cfg.discount,
        pbrs_terminated(rl_cfg, traj.finish),
    )
  name = rl_cfg.advantage_estimator
  if name not in EPISODE_ESTIMATORS:
    raise ValueError(
        f"rl.advantage_estimator={name!r}: unknown; known: "
        f"{ADVANTAGE_ESTIMATORS}"
    )
  adv_b = EPISODE_ESTIMATORS[name](reward, traj, rl_cfg)
  return reward, adv_b, advantages.broadcast_to_tokens(adv_b, traj.role)


def dense_aux_advantages(
    rl_cfg, traj: types.Trajectory, phi_bk1: jax.Array, max_turns: int
) -> jax.Array:
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
      jnp.zeros(turn_mask.shape, jnp.float32),
      pbrs_final_potential(rl_cfg, rl_cfg.pbrs_coef * phi_bk1, traj),
      turn_mask,
      rl_cfg.discount,
      terminated,
  )
  return advantages.broadcast_turn_to_tokens(f_bk, traj.turn, traj.role)
