"""Reward components (functions of environment facts) and their composition.

A component maps the trajectory's env facts and finish reasons to a [B] float32
reward. Composition here is a weighted sum; later versions add products, gating and
per-component group normalisation (DESIGN.md section 6). Each component is also
returned separately so it can be logged.
"""

from __future__ import annotations

from typing import Callable, Mapping

import jax
import jax.numpy as jnp

from agentic_rl import types

RewardFn = Callable[[types.Trajectory], jax.Array]


def correct_reward(traj: types.Trajectory) -> jax.Array:
  """1 if the final answer is correct, else 0. Returns [B] float32."""
  return traj.facts["correct"].astype(jnp.float32)


def format_reward(traj: types.Trajectory) -> jax.Array:
  """1 if the episode ended with a well-formed answer and every tool call parsed.

  Returns [B] float32 in {0, 1}. Episodes that hit MAX_TURNS or TRUNCATED, or wrote
  a malformed answer or tool call, get 0.
  """
  ok = (traj.finish == types.ANSWERED) & (traj.facts["num_tool_errors"] == 0)
  return ok.astype(jnp.float32)


REWARD_COMPONENTS: dict[str, RewardFn] = {
    "correct": correct_reward,
    "format": format_reward,
}


def make_reward_fn(
    weights: Mapping[str, float],
) -> Callable[[types.Trajectory], tuple[jax.Array, dict[str, jax.Array]]]:
  """Weighted sum R = sum_c w_c * r_c over named components.

  Args:
    weights: component name -> weight; names must be keys of REWARD_COMPONENTS.

  Returns:
    reward_fn(traj) -> (reward [B] float32, {name: component [B] float32}).

  Raises:
    ValueError: unknown component name or empty weights.
  """
  if not weights:
    raise ValueError("rl.rewards must name at least one reward component, got {}")
  for name in weights:
    if name not in REWARD_COMPONENTS:
      raise ValueError(
          f"rl.rewards: unknown reward name {name!r}; known: "
          f"{sorted(REWARD_COMPONENTS)}"
      )
  items = tuple((name, float(w)) for name, w in weights.items())

  def reward_fn(traj):
    parts = {name: REWARD_COMPONENTS[name](traj) for name, _ in items}
    total = sum(w * parts[name] for name, w in items)
    return total, parts

  return reward_fn
