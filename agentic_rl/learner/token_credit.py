"""Token-credit stage: per-token advantages [B, L] from episode rewards,
per-turn step rewards and PBRS shaping.

The one adapter from the config to the estimator table
(`estimators.ESTIMATORS`): which entry a config runs (`estimator_name`), its
keyword settings from the `rl` block (`estimator_settings`) and its arrays
from the trajectory (`token_advantages`, `token_level_advantages`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from agentic_rl import advantages
from agentic_rl import credit
from agentic_rl import estimators
from agentic_rl.rewards import sanitize
from agentic_rl.rewards import step_rewards
from agentic_rl import types


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
# The adapter from the config to the estimator table (`estimators.ESTIMATORS`).
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


def estimator_name(rl_cfg) -> str:
  """The `estimators.ESTIMATORS` key the config runs.

  The entry `rl.tree_branching` selects when it is set; else the
  `rl.advantage_estimator` entry when it is not episode level (it ignores
  `rl.credit`); else, with `rl.credit='per_turn'`, the entry `rl.credit`
  selects; else the `rl.advantage_estimator` entry (an unknown name is
  returned as is).
  """
  if tuple(rl_cfg.tree_branching):
    return estimators.entry_for("rl.tree_branching")
  name = rl_cfg.advantage_estimator
  entry = estimators.ESTIMATORS.get(name)
  if rl_cfg.credit == "per_turn" and (
      entry is None or entry.level == "episode"
  ):
    return estimators.entry_for("rl.credit")
  return name


def estimator_settings(entry: estimators.Estimator, rl_cfg) -> dict[str, Any]:
  """{keyword: value} of the entry's settings, read from the `rl` fields
  `estimators.SETTINGS` names (sequences as tuples: static under jit)."""
  out = {}
  for key in entry.settings:
    value = getattr(rl_cfg, estimators.SETTINGS[key].removeprefix("rl."))
    out[key] = tuple(value) if isinstance(value, (list, tuple)) else value
  return out


class _Inputs:
  """The arrays of `estimators.INPUTS`, each computed on first use (so the
  traced ops follow the order in which an entry reads them) and kept."""

  def __init__(self, rl_cfg, reward, traj, max_turns, phi):
    self._rl, self._reward, self._traj = rl_cfg, reward, traj
    self._k, self._phi = max_turns, phi
    self._done: dict[str, jax.Array] = {}

  def __getitem__(self, key: str) -> jax.Array:
    if key not in self._done:
      self._done[key] = self._make(key)
    return self._done[key]

  def _make(self, key: str) -> jax.Array:
    traj = self._traj
    if key.startswith("facts."):
      return traj.facts[key.partition(".")[2]].astype(jnp.float32)
    if key == "turn_reward_bk":
      return self._turn_rewards()
    make = {
        "reward_b": lambda: self._reward,
        "group_b": lambda: traj.group,
        "turn_mask_bk": lambda: _turn_mask(traj, self._k),
        "outcome_bk": lambda: _outcome_at_last_turn(
            self._reward, traj, self["turn_mask_bk"]
        ),
        "tokens_bl": lambda: traj.tokens,
        "role_bl": lambda: traj.role,
        "turn_bl": lambda: traj.turn,
    }
    if key not in make:
      raise ValueError(f"input {key!r} is not produced from a trajectory")
    return make[key]()

  def _turn_rewards(self) -> jax.Array:
    """Outcome at the last turn, PBRS terms F_k = discount Phi(s_{k+1}) -
    Phi(s_k) at the turn boundaries (`credit.shape_turn_rewards`, Ng et al.
    1999) and the step rewards of `step_rewards_bk`."""
    rl_cfg, traj = self._rl, self._traj
    turn_mask = self["turn_mask_bk"]
    r_bk = self["outcome_bk"]
    if self._phi is not None:
      r_bk = credit.shape_turn_rewards(
          r_bk,
          self._phi,
          turn_mask,
          rl_cfg.discount,
          pbrs_terminated(rl_cfg, traj.finish),
      )
    if step_reward_on(rl_cfg):
      # Per-turn step (process) rewards (rl.step_reward), after the outcome.
      r_bk = r_bk + step_rewards_bk(rl_cfg, traj, self._reward, self._k)
    return r_bk


def _apply(entry: estimators.Estimator, arrays, rl_cfg):
  """entry.fn on its inputs (in order) and the config's settings."""
  args = [arrays[key] for key in entry.inputs]
  return entry.fn(*args, **estimator_settings(entry, rl_cfg))


def token_level_advantages(
    rl_cfg, reward_b: jax.Array, mask_bl: jax.Array, values_bl: jax.Array
):
  """The config's token-level estimator (PPO-GAE, `rl.advantage_estimator=
  'gae'`) on the value head's behaviour values.

  Args:
    rl_cfg: the `rl` block.
    reward_b: [B] float32 episode rewards.
    mask_bl: [B, L] bool POLICY-token mask.
    values_bl: [B, L] float32 behaviour values V_old.

  Returns:
    (adv_b [B] float32 (logging), adv_bl [B, L] float32, returns_bl [B, L]
    float32), as `estimators.gae_token_advantages`.

  Raises:
    ValueError: the config selects no token-level estimator.
  """
  name = estimator_name(rl_cfg)
  entry = estimators.ESTIMATORS.get(name)
  if entry is None or entry.level != "token":
    raise ValueError(f"estimator {name!r} is not token level")
  arrays = {"reward_b": reward_b, "mask_bl": mask_bl, "values_bl": values_bl}
  return _apply(entry, arrays, rl_cfg)


def token_advantages(
    rl_cfg,
    reward: jax.Array,
    traj: types.Trajectory,
    max_turns: int,
    phi_bk1: jax.Array | None = None,
):
  """Per-token advantages [B, L]: the config's `estimators.ESTIMATORS` entry
  (`estimator_name`) on the arrays it declares, with its settings read from
  the config (`estimator_settings`).

  Episode level (`rl.advantage_estimator`, `rl.credit='trajectory'`): one
  advantage per episode on the reward plus, if `rl.pbrs_coef` > 0, the
  telescoped PBRS return sum_k discount^k F_k (closed form;
  credit.telescoped_episode_returns), broadcast to its POLICY tokens.

  Turn level: `rl.credit='per_turn'` places the reward at the episode's last
  turn, adds the PBRS terms F_k = discount * Phi(s_{k+1}) - Phi(s_k) (Phi =
  pbrs_coef * facts['progress'], Phi(terminal) = 0 for ANSWERED /
  FORMAT_ERROR endings, and for cut-off ones with `rl.pbrs_cutoff='zero'`;
  `pbrs_terminated`; with 'never' no ending is terminal and an answered
  episode's final potential is that of the state before its answer,
  `pbrs_final_potential`) and, with `rl.step_reward` set, the step rewards
  of `step_rewards_bk`; the per-turn reward-to-go is normalised against the
  group's returns at the same turn index ('per_turn'). 'gigpo'
  (arXiv:2505.10978) ignores `rl.credit`; with `rl.tree_branching` set
  (PORTool tree rollouts) the 'tree' entry replaces the estimator.

  `phi_bk1` ([B, K + 1], optional) replaces the progress fact as the unscaled
  potential (any source: TRACE log-ratio values, a value head, a reward
  model); it is multiplied by `rl.pbrs_coef` like the progress potential. With
  `rl.dense_as='aux_loss'` the shaping is left out here entirely (see
  `dense_aux_advantages`).

  Args:
    rl_cfg: the `rl` block.
    reward: [B] float32 episode rewards.
    traj: the batch (group, num_turns, finish, tokens, role, turn, facts).
    max_turns: K (static).
    phi_bk1: optional [B, K + 1] float32 unscaled potential.

  Returns:
    (reward [B] actually used, adv_b [B] (per-episode advantage, or the mean
     |A| over turns for 'per_turn', for logging), adv_bl [B, L] float32).

  Raises:
    ValueError: the config selects no episode- or turn-level entry.
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
  name = estimator_name(rl_cfg)
  entry = estimators.ESTIMATORS.get(name)
  if entry is None or entry.level == "token":
    known = [
        n
        for n in estimators.selected_by("rl.advantage_estimator")
        if estimators.ESTIMATORS[n].level != "token"
    ]
    raise ValueError(
        f"rl.advantage_estimator={name!r}: not an episode- or turn-level "
        f"estimator; known: {known}"
    )
  if entry.level == "turn":
    arrays = _Inputs(rl_cfg, reward, traj, max_turns, phi)
    adv_b, adv_bl = _apply(entry, arrays, rl_cfg)
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
  adv_b = _apply(entry, _Inputs(rl_cfg, reward, traj, max_turns, phi), rl_cfg)
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
