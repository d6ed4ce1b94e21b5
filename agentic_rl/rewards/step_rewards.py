"""Per-turn step (process) rewards and their bounded transforms (`rl.step_reward`).

A per-turn step score p_k in [0, 1] (a valid tool call, or a process RM's
score) becomes per-turn rewards through a `STEP_TRANSFORMS` entry
(`step_turn_rewards`), added to the outcome reward before reward-to-go.
"""

from __future__ import annotations

from typing import Callable

import chex
import jax
import jax.numpy as jnp

from agentic_rl.rewards.transforms import clip_transform, delta_transform

# `rl.step_reward`: where the per-turn step score p_k in [0, 1] comes from.
# 'valid_call': p_k = 1 for a well-formed tool call that returned a value (env
# fact 'valid_call_turn' [K]), 0 for any other call; repeats are paid again,
# so the score is hackable by design (experiments/step_hacking).
STEP_REWARDS = ("none", "valid_call", "prm")


def masked_quantile(
    x_bk: jax.Array, mask_bk: jax.Array, q: float | jax.Array
) -> jax.Array:
  """The q-quantile of the entries of x where mask is True (linear
  interpolation between order statistics, numpy's default 'linear' method).

  Used as the Clip threshold eta of `rl.step_reward_clip_quantile`: eta is a
  quantile of the batch's step scores, so that a fixed share of steps falls
  below it whatever the PRM's calibration (Gao et al., arXiv:2410.15115, set
  the Clip threshold from the distribution of PRM rewards).

  Args:
    x_bk: float array (any shape).
    mask_bk: bool array of x's shape.
    q: quantile in [0, 1].

  Returns:
    float32 scalar; 0.0 when no entry is masked in.
  """
  x = jnp.asarray(x_bk, jnp.float32).reshape(-1)
  m = jnp.asarray(mask_bk, jnp.bool_).reshape(-1)
  n = jnp.sum(m)
  # Masked-out entries sort last (+inf); order statistics 0..n-1 are real.
  srt = jnp.sort(jnp.where(m, x, jnp.inf))
  pos = jnp.asarray(q, jnp.float32) * jnp.maximum(n - 1, 0).astype(jnp.float32)
  lo = jnp.floor(pos).astype(jnp.int32)
  hi = jnp.minimum(lo + 1, jnp.maximum(n - 1, 0))
  frac = pos - lo.astype(jnp.float32)
  v_lo, v_hi = srt[lo], srt[hi]
  out = v_lo + frac * (v_hi - v_lo)
  return jnp.where(n > 0, out, 0.0).astype(jnp.float32)


def min_form_turn_rewards(
    p_bk: jax.Array, scored_bk: jax.Array, turn_mask_bk: jax.Array
) -> jax.Array:
  """Per-turn rewards whose undiscounted reward-to-go is PURE's min-form value.

  Cheng et al., "Stop Summation: Min-Form Credit Assignment Is All Process
  Reward Model Needs for Reasoning" (PURE, arXiv:2504.15275; docs/papers.md,
  form inferred there as V(s_t) = min_{k >= t} r_k). Here
  V_k = min_{j >= k, j scored} p_j over the scored turns at or after turn k,
  and V_k = 0 when no scored turn follows (e.g. the final answer turn); the
  returned rewards are r'_k = V_k - V_{k+1} (V_K = 0), so that
  sum_{j >= k} r'_j = V_k exactly (discount 1). Unlike `min_form_values`,
  a valid but unscored turn gets the min over the scored turns AFTER it, not 0
  (the two agree on scored turns).

  Args:
    p_bk: [B, K] float step scores.
    scored_bk: [B, K] bool (or 0/1) turns that carry a step score (a subset of
      the valid turns).
    turn_mask_bk: [B, K] bool (or 0/1) valid turns, a prefix per row.

  Returns:
    [B, K] float32 rewards, 0 at invalid turns.

  Raises:
    AssertionError: (chex) on rank/shape mismatch.
  """
  chex.assert_rank([p_bk, scored_bk, turn_mask_bk], 2)
  chex.assert_equal_shape([p_bk, scored_bk, turn_mask_bk])
  m = jnp.asarray(turn_mask_bk).astype(jnp.bool_)
  s = jnp.asarray(scored_bk).astype(jnp.bool_) & m
  r = jnp.where(s, jnp.asarray(p_bk, jnp.float32), jnp.inf)
  v = jax.lax.cummin(r, axis=1, reverse=True)
  v = jnp.where(jnp.isinf(v), 0.0, v)
  v_next = jnp.concatenate([v[:, 1:], jnp.zeros_like(v[:, :1])], axis=1)
  return jnp.where(m, v - v_next, 0.0).astype(jnp.float32)


# `rl.step_reward_transform`: how the scored steps enter the per-turn rewards.
# Uniform signature of an entry: fn(p_bk, scored_bk, turn_mask_bk, outcome_b,
# *, eta, gate_threshold) -> [B, K] float32 unscaled step rewards, where p_bk
# [B, K] float32 is already 0 off the scored turns, scored_bk and
# turn_mask_bk are [B, K] bool (scored is a subset of the valid turns) and
# outcome_b [B] is the episode's outcome reward. `step_turn_rewards` masks the
# result to the valid turns and multiplies it by the coefficient. A new
# transform is one function plus one entry here.
StepTransformFn = Callable[..., jax.Array]


def _step_sum(p, s, m, outcome_b, *, eta, gate_threshold):
  """'sum': s'_k = p_k, the naive sum-form process reward (unbounded)."""
  del s, m, outcome_b, eta, gate_threshold
  return p


def _step_clip(p, s, m, outcome_b, *, eta, gate_threshold):
  """'clip': s'_k = min(p_k - eta, 0) on scored turns (`clip_transform`;
  Gao et al., arXiv:2410.15115, inferred form)."""
  del m, outcome_b, gate_threshold
  return jnp.where(s, clip_transform(p, eta), 0.0)


def _step_delta(p, s, m, outcome_b, *, eta, gate_threshold):
  """'delta': s'_k = p_k - p_next(k), the last scored turn keeps p_k
  (`delta_transform`; arXiv:2410.15115, inferred form)."""
  del m, outcome_b, eta, gate_threshold
  return delta_transform(p, s)


def _step_delta_drop(p, s, m, outcome_b, *, eta, gate_threshold):
  """'delta_drop': as 'delta' but the last scored turn gets 0 (the paper's
  figure; arXiv:2410.15115)."""
  del m, outcome_b, eta, gate_threshold
  return delta_transform(p, s, keep_last=False)


def _step_min(p, s, m, outcome_b, *, eta, gate_threshold):
  """'min': PURE's min-form V_k - V_{k+1}, V_k = min_{j >= k} p_j
  (`min_form_turn_rewards`; arXiv:2504.15275)."""
  del outcome_b, eta, gate_threshold
  return min_form_turn_rewards(p, s, m)


def _step_gated(p, s, m, outcome_b, *, eta, gate_threshold):
  """'gated': s'_k = p_k 1[outcome_b >= gate_threshold] (G-RA, inferred)."""
  del s, m, eta
  gate_b = jnp.asarray(outcome_b, jnp.float32) >= gate_threshold
  return jnp.where(gate_b[:, None], p, 0.0)


STEP_TRANSFORMS: dict[str, StepTransformFn] = {
    "sum": _step_sum,
    "clip": _step_clip,
    "delta": _step_delta,
    "delta_drop": _step_delta_drop,
    "min": _step_min,
    "gated": _step_gated,
}
STEP_REWARD_TRANSFORMS = tuple(STEP_TRANSFORMS)


def step_turn_rewards(
    p_bk: jax.Array,
    scored_bk: jax.Array,
    turn_mask_bk: jax.Array,
    outcome_b: jax.Array,
    *,
    transform: str,
    coef: float | jax.Array,
    eta: float | jax.Array = 1.0,
    gate_threshold: float | jax.Array = 1.0,
) -> jax.Array:
  """Per-turn step rewards s'_bk added to the outcome reward before reward-to-go.

  p_k in [0, 1] is a per-turn step (process) score, defined on the scored turns
  (e.g. every tool call); unscored turns get no step reward of their own. With
  c = coef and discount 1 (learner.token_advantages, `rl.credit='per_turn'`):

  | transform | s'_k                                   | source                   |
  |-----------|----------------------------------------|--------------------------|
  | sum       | c p_k                                  | naive sum-form PRM       |
  | clip      | c min(p_k - eta, 0)                    | Clipping |
  | delta     | c (p_k - p_next(k)); last scored: c p_k| Delta |
  | delta_drop| c (p_k - p_next(k)); last scored: 0    | Delta, paper's figure    |
  | min       | c (V_k - V_{k+1}), V_k = min_{j>=k} p_j| PURE min-form |
  | gated     | c p_k 1[outcome_b >= gate_threshold]   | G-RA             |

  Clipping / Delta: Gao et al., "On Designing Effective RL Reward at Training
  Time for LLM Reasoning", arXiv:2410.15115 (docs/papers.md; both
  forms inferred from the abstract, see `clip_transform`, `delta_transform`). The
  sum of step rewards of an episode is then <= 0 (clip) or c p_first (delta),
  whatever the number of steps; the reward-to-go from scored turn k is c p_k
  for delta. PURE: arXiv:2504.15275 (`min_form_turn_rewards`); the step part
  of the return from turn k is c min_{j >= k} p_j. G-RA (docs/papers.md,
  inferred): R = o + 1[o >= tau] sum_k c p_k, delivered per turn
  (`gated_accumulation` is its episode total). 'sum' and 'gated' are not
  bounded: every extra scored step with p > 0 adds c p.

  Args:
    p_bk: [B, K] float step scores (0 off the scored turns is fine).
    scored_bk: [B, K] bool turns with a step score.
    turn_mask_bk: [B, K] bool valid turns (a prefix per row).
    outcome_b: [B] float outcome reward (read by 'gated' only).
    transform: a key of `STEP_TRANSFORMS` (= STEP_REWARD_TRANSFORMS).
    coef: c, the step-reward coefficient (reward units per unit score).
    eta: clip threshold in score units ('clip' only).
    gate_threshold: tau ('gated' only).

  Returns:
    [B, K] float32 per-turn step rewards, 0 at invalid turns.

  Raises:
    ValueError: unknown transform.
    AssertionError: (chex) on rank/shape mismatch.
  """
  if transform not in STEP_REWARD_TRANSFORMS:
    raise ValueError(
        f"step_turn_rewards: transform={transform!r}; known: "
        f"{STEP_REWARD_TRANSFORMS}"
    )
  chex.assert_rank([p_bk, scored_bk, turn_mask_bk], 2)
  chex.assert_equal_shape([p_bk, scored_bk, turn_mask_bk])
  chex.assert_rank(outcome_b, 1)
  chex.assert_equal_shape_prefix([outcome_b, p_bk], 1)
  m = jnp.asarray(turn_mask_bk).astype(jnp.bool_)
  s = jnp.asarray(scored_bk).astype(jnp.bool_) & m
  p = jnp.where(s, jnp.asarray(p_bk, jnp.float32), 0.0)
  out = STEP_TRANSFORMS[transform](
      p, s, m, outcome_b, eta=eta, gate_threshold=gate_threshold
  )
  return jnp.where(m, coef * out, 0.0).astype(jnp.float32)
