"""GRPO advantages against hand-computed values (arXiv:2402.03300)."""

import math

import jax
import jax.numpy as jnp
import numpy as np

from agentic_rl import advantages
from agentic_rl import types


def test_all_equal_group_gives_exact_zero_and_finite():
  r = jnp.array([0.1, 0.1, 0.1, 0.7, 0.7, 0.7], jnp.float32)
  g = jnp.array([0, 0, 0, 1, 1, 1])
  for eps in (1e-6, 1e-30):
    a = advantages.grpo_advantages(r, g, eps=eps)
    assert np.all(np.asarray(a) == 0.0)
    assert np.all(np.isfinite(np.asarray(a)))


def test_hand_computed_z_scores_and_interleaved_groups():
  # Group 0 = rows 0, 2, 4, 6 with rewards 1, 0, 0, 0: mean 0.25,
  # population std sqrt(0.1875) = 0.4330127.
  r = jnp.array([1.0, 5.0, 0.0, 3.0, 0.0, 5.0, 0.0, 3.0])
  g = jnp.array([0, 1, 0, 1, 0, 1, 0, 1])
  a = advantages.grpo_advantages(r, g, eps=0.0)
  s0 = math.sqrt(0.1875)
  expected0 = [0.75 / s0, -0.25 / s0, -0.25 / s0, -0.25 / s0]
  # Group 1: rewards 5, 3, 5, 3: mean 4, std 1.
  expected1 = [1.0, -1.0, 1.0, -1.0]
  np.testing.assert_allclose(a[::2], expected0, rtol=1e-6)
  np.testing.assert_allclose(a[1::2], expected1, rtol=1e-6)


def test_mean_only_switch():
  r = jnp.array([1.0, 0.0, 0.0, 0.0])
  a = advantages.grpo_advantages(r, jnp.zeros(4, jnp.int32), scale_by_std=False)
  np.testing.assert_allclose(a, [0.75, -0.25, -0.25, -0.25], rtol=1e-6)


def test_jit_and_broadcast_to_policy_tokens():
  r = jnp.array([1.0, 0.0])
  a = jax.jit(advantages.grpo_advantages)(r, jnp.array([0, 0]))
  np.testing.assert_allclose(a, [1.0, -1.0], rtol=1e-5)
  role = jnp.array([[types.PROMPT, types.POLICY, types.TOOL, types.POLICY],
                    [types.PROMPT, types.POLICY, types.PAD, types.PAD]], jnp.int8)
  tok = advantages.broadcast_to_tokens(a, role)
  np.testing.assert_allclose(tok, [[0, a[0], 0, a[0]], [0, a[1], 0, 0]])
