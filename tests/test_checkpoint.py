"""Tests for agentic_rl.checkpoint."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentic_rl.checkpoint import Checkpointer


def _state(seed: int):
  rng = np.random.default_rng(seed)
  return {
      "params": {
          "dense": {
              "w": jnp.asarray(rng.standard_normal((3, 4)), jnp.float32),
              "b": jnp.asarray(rng.standard_normal((4,)), jnp.float32),
          },
          "embed": jnp.asarray(rng.integers(-5, 5, (5, 2)), jnp.int32),
      },
      "rng": jax.random.key_data(jax.random.PRNGKey(seed)),  # uint32 [2]
      "host": np.arange(seed, seed + 3, dtype=np.int32),
      "step": seed,
  }


def _assert_bitwise_equal(a, b):
  la, ta = jax.tree.flatten(a)
  lb, tb = jax.tree.flatten(b)
  assert ta == tb
  for x, y in zip(la, lb):
    if isinstance(x, int):
      assert x == y and isinstance(y, int)
      continue
    x, y = np.asarray(x), np.asarray(y)
    assert x.dtype == y.dtype and x.shape == y.shape
    np.testing.assert_array_equal(x.view(np.uint8), y.view(np.uint8))


def test_round_trip_bitwise(tmp_path):
  state = _state(7)
  with Checkpointer(str(tmp_path / "ckpt")) as ck:
    assert ck.latest_step() is None
    assert ck.save(7, state)
    ck.wait()
    assert ck.latest_step() == 7
    restored = ck.restore(_state(0))
  _assert_bitwise_equal(restored, state)
  assert restored["rng"].dtype == jnp.uint32
  assert isinstance(restored["params"]["dense"]["w"], jax.Array)


def test_restore_from_shape_dtype_struct(tmp_path):
  state = _state(3)
  ck = Checkpointer(str(tmp_path))
  ck.save(3, state)
  ck.close()
  abstract = jax.tree.map(
      lambda x: x if isinstance(x, int) else jax.ShapeDtypeStruct(x.shape, x.dtype),
      state)
  ck = Checkpointer(str(tmp_path))  # Fresh manager, as after a restart.
  assert ck.latest_step() == 3
  _assert_bitwise_equal(ck.restore(abstract), state)
  ck.close()


def test_max_to_keep_and_restore_by_step(tmp_path):
  with Checkpointer(str(tmp_path), max_to_keep=2) as ck:
    for s in range(1, 5):
      assert ck.save(s, _state(s))
    ck.wait()
    assert ck.all_steps() == [3, 4]
    assert ck.latest_step() == 4
    _assert_bitwise_equal(ck.restore(_state(0), step=3), _state(3))
    _assert_bitwise_equal(ck.restore(_state(0)), _state(4))
    with pytest.raises(FileNotFoundError):
      ck.restore(_state(0), step=1)


def test_save_interval_and_force(tmp_path):
  with Checkpointer(str(tmp_path), max_to_keep=5, save_interval_steps=3) as ck:
    saved = [s for s in range(1, 8) if ck.save(s, _state(s))]
    assert saved == [3, 6]
    assert ck.save(7, _state(7), force=True)
    assert not ck.save(7, _state(7), force=True)  # Step already exists.
    ck.wait()
    assert ck.all_steps() == [3, 6, 7]
    assert ck.latest_step() == 7


def test_restore_without_checkpoint_raises(tmp_path):
  with Checkpointer(str(tmp_path)) as ck:
    with pytest.raises(FileNotFoundError):
      ck.restore(_state(0))


def test_invalid_options(tmp_path):
  with pytest.raises(ValueError):
    Checkpointer(str(tmp_path), max_to_keep=0)
  with pytest.raises(ValueError):
    Checkpointer(str(tmp_path), save_interval_steps=0)
