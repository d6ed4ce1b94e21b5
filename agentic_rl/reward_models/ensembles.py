"""Robust variants of a reward model: ensembles of members (mean or min of
their scores) and WARM weight averaging of fine-tunes from one initialisation.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp

ENSEMBLE_REDUCTIONS = ("mean", "min")


def ensemble_reduce(scores_mb: jax.Array, reduction: str = "mean") -> jax.Array:
  """Combines the scores of M ensemble members: mean or min over axis 0.

  Coste et al., arXiv:2310.02743 (mean and worst-case optimisation).

  Args:
    scores_mb: float [M, B].
    reduction: 'mean' or 'min'.

  Returns:
    float32 [B].

  Raises:
    ValueError: unknown reduction.
  """
  s = jnp.asarray(scores_mb, jnp.float32)
  if reduction == "mean":
    return jnp.mean(s, axis=0)
  if reduction == "min":
    return jnp.min(s, axis=0)
  raise ValueError(
      f"reduction must be one of {ENSEMBLE_REDUCTIONS}, got {reduction!r}"
  )


def ensemble_scores(
    score_fn: Callable[[Any, Any], jax.Array],
    params_list: Sequence[Any],
    episodes: Any,
    reduction: str = "mean",
) -> jax.Array:
  """Scores `episodes` with every member (same structure) and reduces: float32 [B]."""
  stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *params_list)
  scores_mb = jax.vmap(score_fn, in_axes=(0, None))(stacked, episodes)
  return ensemble_reduce(scores_mb, reduction)


def average_params(
    params_list: Sequence[Any], weights: Sequence[float] | None = None
) -> Any:
  """WARM: weighted average of the parameters of M fine-tunes of one init.

  Rame et al., "WARM: On the Benefits of Weight Averaged Reward Models",
  arXiv:2401.12187: theta = sum_i w_i theta_i with sum_i w_i = 1.

  Args:
    params_list: M >= 1 pytrees of identical structure and shapes.
    weights: M non-negative floats (normalised to sum 1); uniform if None.

  Returns:
    pytree like params_list[0] (float32 leaves averaged in float32).

  Raises:
    ValueError: empty list, wrong number of weights, or weights not summing > 0.
  """
  m = len(params_list)
  if m == 0:
    raise ValueError("average_params: params_list is empty")
  w = [1.0] * m if weights is None else [float(x) for x in weights]
  if len(w) != m or min(w) < 0 or sum(w) <= 0:
    raise ValueError(
        f"average_params: weights={weights!r} must be {m} non-negative "
        "numbers with a positive sum"
    )
  total = sum(w)
  w = [x / total for x in w]
  return jax.tree.map(
      lambda *xs: sum(
          wi * x.astype(jnp.float32) for wi, x in zip(w, xs)
      ).astype(xs[0].dtype),
      *params_list,
  )
