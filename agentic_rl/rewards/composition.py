"""Composition of named [B] reward components into one reward
(`rl.reward_composition`): weighted sum, product (all-or-nothing) or
per-component group normalisation (GDPO).
"""

from __future__ import annotations

from typing import Mapping

import jax
import jax.numpy as jnp

from agentic_rl import advantages
from agentic_rl.rewards.sanitize import finite_or_zero

COMPOSITIONS = ("sum", "product", "gdpo")


def compose(
    parts: Mapping[str, jax.Array],
    weights: Mapping[str, float | jax.Array],
    mode: str,
    group_b: jax.Array | None = None,
    eps: float = 1e-6,
) -> jax.Array:
  """Composes named [B] components into one [B] reward.

  Components used are the keys of `weights` (each must be in `parts`):

  A non-finite component value (NaN, +-inf) counts as 0 in 'sum' and
  'product'; in 'gdpo' it is left out of its group's mean and std and its z is
  0, so the other rows of that group keep finite values.

  - 'sum': R = sum_c w_c r_c.
  - 'product': R = prod_{c: w_c != 0} r_c. Each factor must lie in [0, 1]
    (not checked: values are traced), so any failed factor zeros the reward;
    weights are otherwise ignored (0 drops a component; a traced 0 also
    drops it). ToolRLA multiplicative decomposition (docs/papers.md; inferred
    R = f s p c). Needs non-negative factors: `tool_cost` and
    `failed_call_penalty` do not qualify.
  - 'gdpo': R = sum_c w_c z_g(r_c), z_g(x)_i = (x_i - mean_g x) / (std_g x +
    eps), population std over the row's group; a component that is constant
    within a group contributes exactly 0 there. GDPO per-reward decoupled
    normalisation as described by SMOPD (docs/papers.md; inferred form).
    Requires group_b. The result is already group-normalised; a GRPO
    estimator on top re-normalises it.

  Args:
    parts: name -> [B] float component values.
    weights: name -> weight (Python float or traced scalar).
    mode: one of COMPOSITIONS.
    group_b: [B] int32 group ids in [0, B); required for 'gdpo'.
    eps: added to the group std in 'gdpo'.

  Returns:
    [B] float32 reward.

  Raises:
    ValueError: unknown mode, empty weights, a weight naming a missing part,
      or 'gdpo' without group_b.
  """
  if mode not in COMPOSITIONS:
    raise ValueError(
        f"unknown reward composition {mode!r}; known: {COMPOSITIONS}"
    )
  if not weights:
    raise ValueError("compose: weights must name at least one component")
  for name in weights:
    if name not in parts:
      raise ValueError(
          f"compose: weight for {name!r} but no such part; parts: "
          f"{sorted(parts)}"
      )
  items = tuple(weights.items())
  if mode == "sum":
    return sum(w * finite_or_zero(parts[name]) for name, w in items).astype(
        jnp.float32
    )
  if mode == "product":
    out = None
    for name, w in items:
      if isinstance(w, (int, float)) and w == 0:
        continue
      factor = finite_or_zero(jnp.asarray(parts[name], jnp.float32))
      if not isinstance(w, (int, float)):
        factor = jnp.where(w == 0, 1.0, factor)
      out = factor if out is None else out * factor
    if out is None:
      b = jnp.shape(parts[items[0][0]])
      return jnp.ones(b, jnp.float32)
    return out.astype(jnp.float32)
  if group_b is None:
    raise ValueError("compose: mode 'gdpo' requires group_b")
  total = None
  for name, w in items:
    x = jnp.asarray(parts[name], jnp.float32)
    finite = jnp.isfinite(x)
    z = advantages.grpo_advantages(
        jnp.where(finite, x, 0.0), group_b, eps=eps, valid_b=finite
    )
    total = w * z if total is None else total + w * z
  return total.astype(jnp.float32)
