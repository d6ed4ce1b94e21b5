"""A frozen learned reward model used inside RL.

Its parameters live in `types.TrainState.reward_model` and are never updated.
`trajectory_rm_outputs` scores a batch of episodes in one pass (episode logit
for the `rm` reward component of rewards/components.py, per-state potentials
for PBRS, per-turn step scores of a PRM); `monitor_metrics` /
`overoptimization_gap` are the gold-verifier monitor (Gao et al., "Scaling Laws
for Reward Model Overoptimization", arXiv:2210.10760); `rm_score_to_reward`
bounds a score offline.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx

from agentic_rl.models import transformer
from agentic_rl.rewards import transforms
from agentic_rl.reward_models.model import (
    KINDS,
    PRM_AGGREGATIONS,
    EpisodeBatch,
    episode_scores,
    head_vector,
    hidden_states,
    turn_boundaries,
)

# The bounded score transforms (one table: transforms.SCORE_TRANSFORMS).
BOUNDED_TRANSFORMS = transforms.RM_TRANSFORMS


def rm_score_to_reward(
    score_b: jax.Array,
    transform: str = "sigmoid",
    ref: float = 0.0,
    temperature: float = 1.0,
    eta: float = 0.0,
) -> jax.Array:
  """A learned-RM score as a bounded reward component.

  One table of transforms for every learned score: `transforms.SCORE_TRANSFORMS`
  through `transforms.bounded_score` ('sigmoid': sigma((r - ref) / T) in (0, 1),
  PAR; 'tanh': tanh((r - ref) / T) in (-1, 1); 'clip': min(r - eta, 0);
  'none': r).

  Args:
    score_b: float [B] RM scores.
    transform: a key of `transforms.SCORE_TRANSFORMS`.
    ref, temperature: centre and scale (> 0).
    eta: threshold of 'clip'.

  Returns:
    float32 [B].

  Raises:
    ValueError: unknown transform.
  """
  return transforms.bounded_score(
      transform, score_b, ref=ref, temperature=temperature, eta=eta
  )


def overoptimization_gap(
    rm_reward_b: jax.Array, verified_b: jax.Array
) -> dict[str, jax.Array]:
  """Gold-verifier monitor: how far the RM reward has drifted from the verified one.

  Gao et al., arXiv:2210.10760: under optimisation pressure the proxy (RM) reward
  keeps rising while the gold (here: the verifier's) reward stalls or falls; log
  both and their gap during RL.

  Args:
    rm_reward_b: float [B] bounded RM rewards (e.g. from `rm_score_to_reward`).
    verified_b: float [B] verified rewards (e.g. 1.0 correct / 0.0).

  Returns:
    dict of float32 []: 'rm_reward', 'verified_reward' (batch means), 'gap'
    (their difference), 'false_positive_rate' (fraction of unverified episodes,
    verified <= 0.5, with rm_reward > 0.5).
  """
  r = jnp.asarray(rm_reward_b, jnp.float32)
  v = jnp.asarray(verified_b, jnp.float32)
  wrong = v <= 0.5
  fp = jnp.sum(wrong & (r > 0.5)) / jnp.maximum(jnp.sum(wrong), 1)
  return {
      "rm_reward": jnp.mean(r),
      "verified_reward": jnp.mean(v),
      "gap": jnp.mean(r) - jnp.mean(v),
      "false_positive_rate": fp.astype(jnp.float32),
  }


def correlation(x_b: jax.Array, y_b: jax.Array) -> jax.Array:
  """Pearson correlation of two [B] arrays, float32 []; 0 when either is constant.

  corr = sum (x - mean x)(y - mean y) / sqrt(sum (x - mean x)^2 sum (y - mean y)^2).
  """
  x = jnp.asarray(x_b, jnp.float32)
  y = jnp.asarray(y_b, jnp.float32)
  dx, dy = x - jnp.mean(x), y - jnp.mean(y)
  den = jnp.sqrt(jnp.sum(dx * dx) * jnp.sum(dy * dy))
  return jnp.where(
      den > 0, jnp.sum(dx * dy) / jnp.where(den > 0, den, 1.0), 0.0
  )


def monitor_metrics(
    rm_reward_b: jax.Array, verified_b: jax.Array
) -> dict[str, jax.Array]:
  """The RL loop's gold-verifier over-optimisation monitor (logged every iteration).

  Gao et al., arXiv:2210.10760: the proxy (RM) reward can keep rising while the
  gold (verified) reward stalls or falls; a falling correlation between the two
  on the policy's own samples is the early sign.

  Args:
    rm_reward_b: float [B] RM rewards (the `rm` reward component's values).
    verified_b: float [B] verified rewards (1.0 correct / 0.0 from the env).

  Returns:
    dict of float32 []: 'rm_reward', 'verified_reward', 'rm_gap' (rm_reward -
    verified_reward), 'rm_verified_corr' (Pearson, 0 if either is constant),
    'rm_false_positive_rate' (see `overoptimization_gap`).
  """
  g = overoptimization_gap(rm_reward_b, verified_b)
  return {
      "rm_reward": g["rm_reward"],
      "verified_reward": g["verified_reward"],
      "rm_gap": g["gap"],
      "rm_verified_corr": correlation(rm_reward_b, verified_b),
      "rm_false_positive_rate": g["false_positive_rate"],
  }


def _logit_from_log_prob(logp_b: jax.Array) -> jax.Array:
  """logit(p) = log p - log(1 - p) from log p <= 0 (clamped to +-30)."""
  lp = jnp.minimum(jnp.asarray(logp_b, jnp.float32), -1e-7)
  return jnp.clip(lp - jnp.log(-jnp.expm1(lp)), -30.0, 30.0)


@dataclasses.dataclass(frozen=True)
class FrozenRewardModel:
  """Static description of a frozen RM used inside RL (its params live in
  types.TrainState.reward_model).

  Attributes:
    graphdef: the RM trunk's nnx.GraphDef (from `init_reward_model`).
    kind: 'outcome' or 'process'.
    aggregation: PRM episode aggregation ('log_prod' or 'min').
  """

  graphdef: nnx.GraphDef
  kind: str = "outcome"
  aggregation: str = "log_prod"

  def __post_init__(self):
    if self.kind not in KINDS:
      raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
    if self.aggregation not in PRM_AGGREGATIONS:
      raise ValueError(
          f"aggregation must be one of {PRM_AGGREGATIONS}, got "
          f"{self.aggregation!r}"
      )


def trajectory_rm_outputs(
    rm: FrozenRewardModel,
    params: dict[str, Any],
    tokens_bl: jax.Array,
    role_bl: jax.Array,
    turn_bl: jax.Array,
    num_turns_k: int,
) -> dict[str, jax.Array]:
  """Episode score and PBRS potentials of a batch of episodes, one RM pass.

  One forward pass of the trunk over the [B, L] episodes; the head is read at
  the last real token (episode score), at each turn boundary (PRM logits s_k)
  and at the end of each state s_k = prompt + turns 0..k-1 with their
  observations (credit.state_ends; s_0 = the prompt). The trunk is causal, so
  the read at the end of s_k equals the score of the prefix s_k on its own.

  score_b (a logit): ORM: its score r at the last real token. PRM: logit(P)
  with P = prod_k sigmoid(s_k) ('log_prod', Lightman et al., arXiv:2305.20050)
  or min_k sigmoid(s_k) ('min'), over the turns that happened; so
  sigmoid(score_b) = P, a probability that every step was good.

  potential_bk1 (in [0, 1]; Phi(s_0) .. Phi(s_K)): ORM on prefixes:
  Phi(s_k) = sigmoid(r(s_k)). PRM: Phi(s_k) = prod_{j<k} sigmoid(s_j) ('log_prod')
  or min_{j<k} sigmoid(s_j) ('min'), Phi(s_0) = 1. A success-probability
  potential as in PiCA (credit.success_probability_potential); entries past the
  episode's last turn repeat the last state (PBRS never reads them).

  Args:
    rm: FrozenRewardModel (static).
    params: RM params {'trunk', 'head'} (no gradient flows to them).
    tokens_bl: int32 [B, L]; role_bl: int8 [B, L] (types.PAD = 0 is padding);
      turn_bl: int32 [B, L] turn index (-1 on prompt and padding), as in
      types.Trajectory.
    num_turns_k: static K (the environment's max_turns).

  Returns:
    {'score': float32 [B], 'potential': float32 [B, K + 1]}; a PRM adds
    'step_score': float32 [B, K], sigmoid(s_k) on the turns that happened (the
    answer turn included) and 0 elsewhere: the continuous per-step scores of
    `rl.step_reward='prm'`.
  """
  params = jax.lax.stop_gradient(params)
  mask_bl = role_bl != 0  # types.PAD
  h_bld = hidden_states(rm.graphdef, params, tokens_bl, mask_bl)
  w_d = head_vector(rm.graphdef, params)
  k = num_turns_k
  boundary_bk, turn_mask_bk = turn_boundaries(turn_bl, k)
  k_k1 = jnp.arange(k + 1)
  ends_bk1 = jnp.sum(
      mask_bl[:, None, :] & (turn_bl[:, None, :] < k_k1[None, :, None]), axis=-1
  )
  state_pos_bk1 = jnp.maximum(ends_bk1 - 1, 0).astype(jnp.int32)
  last_b = transformer.last_token_index(mask_bl)
  pos_bn = jnp.concatenate(
      [last_b[:, None], boundary_bk, state_pos_bk1], axis=1
  )
  read_bn = jnp.take_along_axis(h_bld, pos_bn[:, :, None], axis=1) @ w_d
  last_b, s_bk, state_bk1 = (
      read_bn[:, 0],
      read_bn[:, 1 : k + 1],
      read_bn[:, k + 1 :],
  )
  if rm.kind == "outcome":
    return {"score": last_b, "potential": jax.nn.sigmoid(state_bk1)}
  logsig_bk = jnp.where(turn_mask_bk, jax.nn.log_sigmoid(s_bk), 0.0)
  step_bk = jnp.where(turn_mask_bk, jax.nn.sigmoid(s_bk), 0.0)
  b = s_bk.shape[0]
  if rm.aggregation == "log_prod":
    score_b = _logit_from_log_prob(jnp.sum(logsig_bk, axis=1))
    cum_bk1 = jnp.concatenate(
        [jnp.zeros((b, 1)), jnp.cumsum(logsig_bk, axis=1)], 1
    )
    return {
        "score": score_b,
        "potential": jnp.exp(cum_bk1),
        "step_score": step_bk,
    }
  p_bk = jnp.where(turn_mask_bk, jax.nn.sigmoid(s_bk), 1.0)
  p_min_b = jnp.min(p_bk, axis=1)
  score_b = jnp.clip(
      jnp.log(p_min_b) - jnp.log1p(-jnp.minimum(p_min_b, 1 - 1e-7)), -30.0, 30.0
  )
  cum_bk1 = jnp.concatenate([jnp.ones((b, 1)), jax.lax.cummin(p_bk, axis=1)], 1)
  return {"score": score_b, "potential": cum_bk1, "step_score": step_bk}


def make_rm_reward_fn(
    graphdef: nnx.GraphDef,
    params: dict[str, Any],
    *,
    kind: str = "outcome",
    num_turns_k: int,
    transform: str = "sigmoid",
    ref: float = 0.0,
    temperature: float = 1.0,
    aggregation: str = "log_prod",
) -> Callable[[Any], tuple[jax.Array, dict[str, jax.Array]]]:
  """A frozen RM as an RL reward component with the over-optimisation monitor.

  The returned pure function maps a types.Trajectory (tokens [B, L], role [B, L],
  turn [B, L], facts with 'correct' [B]) to (reward float32 [B] =
  `rm_score_to_reward` of the episode score, monitor dict from
  `overoptimization_gap` against the verified 'correct' fact). Jittable;
  `params` are closed over (no gradient flows to them). For offline scoring:
  the RL loop does not use this closure (under jit it would embed the params
  as constants in the program); it passes the params in
  TrainState.reward_model to `trajectory_rm_outputs` and reads the score through
  the `rm` reward component (rewards.components.rm_reward).

  Raises:
    ValueError: unknown kind or transform.
  """
  if kind not in KINDS:
    raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
  if transform not in BOUNDED_TRANSFORMS:
    raise ValueError(
        f"transform must be one of {BOUNDED_TRANSFORMS}, got {transform!r}"
    )

  def reward_fn(traj):
    mask_bl = traj.role != 0  # types.PAD
    boundary_bk, turn_mask_bk = turn_boundaries(traj.turn, num_turns_k)
    b = traj.tokens.shape[0]
    episodes = EpisodeBatch(
        tokens=traj.tokens,
        mask=mask_bl,
        boundary=boundary_bk,
        turn_mask=turn_mask_bk,
        turn_labels=jnp.zeros(boundary_bk.shape, jnp.float32),
        score=jnp.zeros((b,), jnp.float32),
    )
    score_b = jax.lax.stop_gradient(
        episode_scores(graphdef, params, episodes, kind, aggregation)
    )
    r_b = rm_score_to_reward(score_b, transform, ref, temperature)
    verified_b = jnp.asarray(traj.facts["correct"], jnp.float32)
    return r_b, overoptimization_gap(r_b, verified_b)

  return reward_fn
