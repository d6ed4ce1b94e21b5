"""DAPO dynamic sampling and overlong handling, hand-computed."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentic_rl import batch_policies
from agentic_rl import types


def test_dynamic_sampling_keeps_exactly_the_first_three_intact():
  groups = jnp.array(
      [
          [1, 0, 0, 0],
          [1, 1, 1, 0],
          [1, 1, 0, 0],
          [1, 1, 1, 1],
          [0, 0, 0, 0],
          [0.5] * 4,
      ],
      jnp.float32,
  )
  keep, usable = jax.jit(batch_policies.select_groups, static_argnums=1)(
      groups, 3
  )
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
  pen = batch_policies.soft_overlong_penalty(
      jnp.array([3, 6, 7, 8, 10, 11]), 10, 4
  )
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


def test_refill_round_keeps_issue_table_groups_intact():
  """Round 0 had no usable group (N = 3 slots of constant fillers); the refill
  round holds the hand-made table: exactly its first three groups fill the slots,
  whole and in order."""
  filler = jnp.array([[1, 1, 1, 1], [0, 0, 0, 0], [1, 1, 1, 1]], jnp.float32)
  table = jnp.array(
      [
          [1, 0, 0, 0],
          [1, 1, 1, 0],
          [1, 1, 0, 0],
          [1, 1, 1, 1],
          [0, 0, 0, 0],
          [0.5] * 4,
      ],
      jnp.float32,
  )
  refill = jax.jit(batch_policies.refill_groups, static_argnums=4)
  kept, filled = refill(
      filler.reshape(-1), jnp.int32(0), table.reshape(-1), table, 4
  )
  assert int(filled) == 3
  np.testing.assert_array_equal(kept.reshape(3, 4), table[:3])


def test_refill_fills_only_the_gaps_in_order_and_is_bounded():
  # N = 3 slots, slot 0 already usable (rows are episode ids 0..5, K = 2).
  kept_rows = jnp.array([10, 11, 20, 20, 30, 30])
  # New round: groups 0 (const), 1 (varied), 2 (const), 3 (varied), 4 (varied).
  new_metric = jnp.array([[0, 0], [0, 1], [1, 1], [1, 0], [0, 1]], jnp.float32)
  new_rows = jnp.arange(10) + 100
  kept, filled = batch_policies.refill_groups(
      kept_rows, jnp.int32(1), new_rows, new_metric, 2
  )
  # Slots 1 and 2 get new groups 1 and 3; group 4 is dropped (batch full).
  np.testing.assert_array_equal(kept, [10, 11, 102, 103, 106, 107])
  assert int(filled) == 3
  # A full batch is left untouched.
  kept2, filled2 = batch_policies.refill_groups(
      kept, jnp.int32(3), new_rows, new_metric, 2
  )
  np.testing.assert_array_equal(kept2, kept)
  assert int(filled2) == 3
  # No varied group in the round: nothing changes.
  kept3, filled3 = batch_policies.refill_groups(
      kept_rows, jnp.int32(1), new_rows, jnp.ones((5, 2)), 2
  )
  np.testing.assert_array_equal(kept3, kept_rows)
  assert int(filled3) == 1
