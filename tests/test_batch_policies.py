"""DAPO dynamic sampling and overlong handling, hand-computed."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentic_rl import batch_policies
from agentic_rl import types


def test_dynamic_sampling_keeps_exactly_the_first_three_intact():
  groups = jnp.array([[1, 0, 0, 0], [1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1],
                      [0, 0, 0, 0], [0.5] * 4], jnp.float32)
  keep, usable = jax.jit(batch_policies.select_groups, static_argnums=1)(groups, 3)
  np.testing.assert_array_equal(keep, [0, 1, 2])
  assert usable.all()
  rows = batch_policies.gather_groups(groups.reshape(-1), keep, 4)
  np.testing.assert_array_equal(rows, groups[:3].reshape(-1))


def test_dynamic_sampling_fills_with_flagged_constant_groups():
  groups = jnp.array([[1, 1], [0, 1], [0, 0], [1, 0]], jnp.float32)
  keep, usable = batch_policies.select_groups(groups, 3)
  np.testing.assert_array_equal(keep, [1, 3, 0])
  np.testing.assert_array_equal(usable, [True, True, False])
  keep, usable = batch_policies.select_groups(jnp.ones((3, 2)), 2)
  np.testing.assert_array_equal(keep, [0, 1])
  assert not usable.any()
  with pytest.raises(ValueError, match="num_keep=5"):
    batch_policies.select_groups(groups, 5)


def test_soft_overlong_penalty_hand_values():
  # L_max 10, L_cache 4: no penalty up to 6, linear to -1 at 10, -1 beyond.
  pen = batch_policies.soft_overlong_penalty(jnp.array([3, 6, 7, 8, 10, 11]), 10, 4)
  np.testing.assert_allclose(pen, [0, 0, -0.25, -0.5, -1.0, -1.0])


def test_overlong_modes_and_truncated_never_get_the_correct_reward():
  reward = jnp.array([1.0, 0.0, 1.0])
  mask = jnp.ones((3, 4), bool)
  finish = jnp.array([types.ANSWERED, types.TRUNCATED, types.TRUNCATED])
  r, m = batch_policies.apply_overlong(reward, mask, finish, "none")
  np.testing.assert_array_equal(r, reward)
  r, m = batch_policies.apply_overlong(reward, mask, finish, "mask")
  np.testing.assert_array_equal(m.sum(1), [4, 0, 0])
  r, m = batch_policies.apply_overlong(reward, mask, finish, "reward", -0.5)
  np.testing.assert_array_equal(r, [1.0, -0.5, -0.5])
  with pytest.raises(ValueError, match="'cut'"):
    batch_policies.apply_overlong(reward, mask, finish, "cut")
