"""Bounded transforms for learned and step rewards.

`clip_transform`, `delta_transform`, `min_form_values`, `saturating_transform`
(any-shape / per-turn arrays); `SCORE_TRANSFORMS` / `bounded_score`, the bounded
maps of a learned score (e.g. a frozen reward model's logit) to a reward
(`rl.reward_params.rm.transform`); `gated_accumulation` (G-RA's episode total).
"""

from __future__ import annotations

from typing import Callable

import chex
import jax
import jax.numpy as jnp


def clip_transform(r_k: jax.Array, eta: float | jax.Array) -> jax.Array:
  """Clipping refinement r'_k = min(r_k - eta, 0) (inferred form).

  "Clipping" of Gao et al., "On Designing Effective RL Reward at Training Time
  for LLM Reasoning" (docs/papers.md; formula inferred, recalled from
  the full paper): every step reward is <= 0, so repeating steps can never
  raise the return; the cumulative reward of any trajectory is bounded above
  by 0.

  Args:
    r_k: any-shape float rewards (e.g. [B, K] per-turn PRM scores).
    eta: threshold, scalar or broadcastable to r_k.

  Returns:
    float32 array of r_k's shape, <= 0. Masking is the caller's job.
  """
  r = jnp.asarray(r_k, jnp.float32)
  return jnp.minimum(r - eta, 0.0).astype(jnp.float32)


def delta_transform(
    r_k: jax.Array, mask_k: jax.Array, keep_last: bool = True
) -> jax.Array:
  """Delta refinement r'_k = r_k - r_{next(k)}; the last valid turn keeps r_k.

  "Delta" of Gao et al., "On Designing Effective RL Reward at Training Time for
  LLM Reasoning" (docs/papers.md; formula inferred). next(k) is the
  next VALID turn after k (the next position for the usual prefix mask). The
  sum telescopes: sum_k r'_k = r_{first valid turn}, bounded whatever the
  number of turns; the reward-to-go from turn k is r_k. With
  keep_last=False the last valid turn gets 0 instead (the paper's figure and
  our reading of it: sum_k r'_k = r_first - r_last; the reward-to-go from
  turn k is r_k - r_last).

  Args:
    r_k: [..., K] float step rewards (turns on the last axis).
    mask_k: [..., K] bool (or 0/1) valid turns, same shape.
    keep_last: Python bool; see above.

  Returns:
    [..., K] float32, 0 at invalid turns.

  Raises:
    AssertionError: (chex) if shapes differ.
  """
  chex.assert_equal_shape([r_k, mask_k])
  m = jnp.moveaxis(jnp.asarray(mask_k).astype(jnp.bool_), -1, 0)
  r = jnp.moveaxis(jnp.asarray(r_k, jnp.float32), -1, 0)
  r = jnp.where(m, r, 0.0)

  def step(carry, xs):
    next_r, has_next = carry
    r_t, m_t = xs
    if keep_last:
      out = jnp.where(m_t, r_t - jnp.where(has_next, next_r, 0.0), 0.0)
    else:
      out = jnp.where(m_t & has_next, r_t - next_r, 0.0)
    carry = (jnp.where(m_t, r_t, next_r), has_next | m_t)
    return carry, out

  init = (jnp.zeros(r.shape[1:], jnp.float32), jnp.zeros(r.shape[1:], bool))
  _, out = jax.lax.scan(step, init, (r, m), reverse=True)
  return jnp.moveaxis(out, 0, -1)


def min_form_values(r_k: jax.Array, mask_k: jax.Array) -> jax.Array:
  """PURE min-form credit V_k = min_{j >= k, j valid} r_j (inferred form).

  Cheng et al., "Stop Summation: Min-Form Credit Assignment Is All Process
  Reward Model Needs for Reasoning" (PURE, docs/papers.md; formula
  inferred): the value of turn k is the minimum of the future process rewards
  instead of their (discounted) sum, which bounds the value range by the range
  of r and removes the incentive to add steps.

  Args:
    r_k: [..., K] float step rewards (turns on the last axis).
    mask_k: [..., K] bool (or 0/1) valid turns, same shape.

  Returns:
    [..., K] float32 values, 0 at invalid turns.

  Raises:
    AssertionError: (chex) if shapes differ.
  """
  chex.assert_equal_shape([r_k, mask_k])
  m = jnp.asarray(mask_k).astype(jnp.bool_)
  r = jnp.where(m, jnp.asarray(r_k, jnp.float32), jnp.inf)
  v = jax.lax.cummin(r, axis=r.ndim - 1, reverse=True)
  return jnp.where(m, v, 0.0).astype(jnp.float32)


def saturating_transform(
    r: jax.Array,
    ref: float | jax.Array = 0.0,
    temperature: float | jax.Array = 1.0,
) -> jax.Array:
  """Bounded, centred reward sigma((r - ref) / temperature) in (0, 1).

  PAR, "Preference As Reward" (Fu et al., "Reward Shaping to Mitigate Reward
  Hacking in RLHF", docs/papers.md; inferred form sigma(r - r_ref)): bounded,
  grows fast near the reference then saturates, a function of the centred
  reward. temperature generalises the unit scale.

  Args:
    r: any-shape float rewards (e.g. a learned RM score).
    ref: reference reward (scalar or broadcastable).
    temperature: > 0 scale.

  Returns:
    float32 array of r's shape, in (0, 1).
  """
  x = (jnp.asarray(r, jnp.float32) - ref) / temperature
  return jax.nn.sigmoid(x).astype(jnp.float32)


# Bounded maps of a learned score s [B] (e.g. a frozen reward model's logit)
# to a reward. Uniform signature of an entry: fn(s_b float32 [B], *, ref,
# temperature, eta) -> [B] float32; arguments an entry does not use are
# ignored. Used by the `rm` reward component (`components.rm_reward`) and by
# reward_models.frozen.rm_score_to_reward; config name
# `rl.reward_params.rm.transform`.
ScoreTransformFn = Callable[..., jax.Array]


def _score_sigmoid(s_b, *, ref, temperature, eta):
  """sigma((s - ref) / temperature) in (0, 1): `saturating_transform` (PAR,
  Fu et al., "Reward Shaping to Mitigate Reward Hacking in RLHF"; inferred)."""
  del eta
  return saturating_transform(s_b, ref, temperature)


def _score_tanh(s_b, *, ref, temperature, eta):
  """tanh((s - ref) / temperature) in (-1, 1)."""
  del eta
  return jnp.tanh((s_b - ref) / temperature).astype(jnp.float32)


def _score_clip(s_b, *, ref, temperature, eta):
  """min(s - eta, 0) <= 0: `clip_transform` (Gao et al., arXiv:2410.15115)."""
  del ref, temperature
  return clip_transform(s_b, eta)


def _score_none(s_b, *, ref, temperature, eta):
  """s unchanged (float32)."""
  del ref, temperature, eta
  return s_b


SCORE_TRANSFORMS: dict[str, ScoreTransformFn] = {
    "sigmoid": _score_sigmoid,
    "tanh": _score_tanh,
    "clip": _score_clip,
    "none": _score_none,
}
RM_TRANSFORMS = tuple(SCORE_TRANSFORMS)


def bounded_score(
    name: str,
    s_b: jax.Array,
    *,
    ref: float = 0.0,
    temperature: float = 1.0,
    eta: float = 0.0,
) -> jax.Array:
  """A learned score mapped by the `SCORE_TRANSFORMS` entry `name`.

  Args:
    name: 'sigmoid', 'tanh', 'clip' or 'none' (a Python str).
    s_b: [B] float scores (cast to float32 first).
    ref, temperature: centre and scale (> 0) of 'sigmoid' and 'tanh'.
    eta: threshold of 'clip'.

  Returns:
    [B] float32.

  Raises:
    ValueError: unknown transform name.
  """
  if name not in SCORE_TRANSFORMS:
    raise ValueError(f"transform={name!r}: unknown; known: {RM_TRANSFORMS}")
  s = jnp.asarray(s_b, jnp.float32)
  return SCORE_TRANSFORMS[name](s, ref=ref, temperature=temperature, eta=eta)


def gated_accumulation(
    outcome_b: jax.Array,
    step_rewards_bk: jax.Array,
    mask_bk: jax.Array,
    threshold: float | jax.Array,
) -> jax.Array:
  """G-RA: R_b = o_b + 1[o_b >= tau] * sum_k m_bk r_bk (inferred form).

  Gated Reward Accumulation (docs/papers.md; form inferred from
  "accumulates immediate rewards only when high-level rewards meet a
  predefined threshold"): step rewards count only for episodes whose outcome
  reward reaches the threshold, so they cannot be hacked at the expense of the
  goal.

  Args:
    outcome_b: [B] float high-level (outcome) reward.
    step_rewards_bk: [B, K] float step rewards.
    mask_bk: [B, K] bool (or 0/1) valid turns.
    threshold: tau, scalar.

  Returns:
    [B] float32.

  Raises:
    AssertionError: (chex) on rank/shape mismatch.
  """
  chex.assert_rank(outcome_b, 1)
  chex.assert_rank([step_rewards_bk, mask_bk], 2)
  chex.assert_equal_shape([step_rewards_bk, mask_bk])
  chex.assert_equal_shape_prefix([outcome_b, step_rewards_bk], 1)
  o = jnp.asarray(outcome_b, jnp.float32)
  m = jnp.asarray(mask_bk).astype(jnp.bool_)
  acc = jnp.sum(
      jnp.where(m, jnp.asarray(step_rewards_bk, jnp.float32), 0.0), axis=1
  )
  return (o + jnp.where(o >= threshold, acc, 0.0)).astype(jnp.float32)
