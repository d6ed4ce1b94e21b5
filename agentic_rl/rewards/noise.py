"""Reward noise for robustness studies: label flips and Gaussian dithering.

Applied to the composed reward by `factory.make_reward_fn` (`rl.reward_noise`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def flip_rewards(
    key: jax.Array,
    r_b: jax.Array,
    p: float | jax.Array,
    low: float = 0.0,
    high: float = 1.0,
) -> jax.Array:
  """Symmetric label noise on a binary reward: r -> low + high - r w.p. p.

  Each entry is flipped independently with probability p (Bernoulli(p) from
  `key`); a flip swaps low <-> high. Entries not in {low, high} are mapped by
  the same affine reflection.

  Args:
    key: PRNG key.
    r_b: any-shape float rewards with values in {low, high}.
    p: flip probability in [0, 1].
    low, high: the two reward levels.

  Returns:
    float32 array of r_b's shape.
  """
  r = jnp.asarray(r_b, jnp.float32)
  flip = jax.random.uniform(key, r.shape) < p
  return jnp.where(flip, low + high - r, r).astype(jnp.float32)


def dither_rewards(
    key: jax.Array, r_b: jax.Array, sigma: float | jax.Array
) -> jax.Array:
  """Additive Gaussian reward noise r + sigma * N(0, 1).

  Args:
    key: PRNG key.
    r_b: any-shape float rewards.
    sigma: noise std (>= 0).

  Returns:
    float32 array of r_b's shape.
  """
  r = jnp.asarray(r_b, jnp.float32)
  return (r + sigma * jax.random.normal(key, r.shape, jnp.float32)).astype(
      jnp.float32
  )
