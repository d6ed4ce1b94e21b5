"""A Lagrange multiplier's update for a constraint on a reward statistic
(`rl.dual_constraint`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def dual_ascent_update(
    lam: float | jax.Array,
    observed: float | jax.Array,
    target: float | jax.Array,
    lr: float | jax.Array,
    lam_min: float = 0.0,
) -> jax.Array:
  """Projected dual ascent on a Lagrange multiplier for observed <= target.

  lam' = max(lam_min, lam + lr (observed - target)).

  Sign convention: the constrained problem max E[R] s.t. E[g] <= target has
  Lagrangian E[R] - lam (E[g] - target), so the policy's reward is
  R - lam g (e.g. lam as the per-call `tool_cost` c with g = tool calls per
  episode). lam grows while the constraint is violated (observed > target)
  and shrinks (down to lam_min >= 0) while it is slack. Standard projected
  subgradient ascent on the dual (e.g. Tessler et al., "Reward Constrained
  Policy Optimization", arXiv:1805.11074).

  Args:
    lam: current multiplier (scalar).
    observed: measured constraint statistic, e.g. mean calls per episode.
    target: the bound.
    lr: dual step size (> 0).
    lam_min: floor of the projection (default 0).

  Returns:
    float32 scalar (or broadcast shape of the inputs).
  """
  lam = jnp.asarray(lam, jnp.float32)
  upd = lam + lr * (jnp.asarray(observed, jnp.float32) - target)
  return jnp.maximum(lam_min, upd).astype(jnp.float32)
