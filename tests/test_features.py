"""learner/features.py: the stateful features' (init, update) pairs, their
states in TrainState.features, and the restore shim of the older layout."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentic_rl import checkpoint
from agentic_rl import losses
from agentic_rl import replay
from agentic_rl import types
from agentic_rl.learner import features as features_lib
from agentic_rl.learner.batch import Rollout
from configs import default


def _config(**rl):
  config = default.get_config("smoke")
  config.rl.update(rl)
  return config


def _rollout(**kw):
  return Rollout(traj=None, reward=jnp.zeros(2), parts={}, info={}, **kw)


def test_build_features_lists_the_features_that_are_on_in_feature_order():
  names = lambda c: [f.name for f in features_lib.build_features(c)]
  assert names(_config()) == ["kl"]
  everything = _config(
      replay_capacity=4,
      dual_constraint="num_tool_calls",
      loss_type="flowrl",
      pbrs_potential="spa",
      pbrs_coef=0.5,
  )
  assert names(everything) == list(types.FEATURE_ORDER)
  flowrl = features_lib.build_features(everything)[3]
  assert flowrl.name == "flowrl" and flowrl.update is None


def test_update_states_adaptive_kl_dual_ascent_and_replay_by_hand():
  config = _config(
      kl_target=0.05,
      replay_capacity=2,
      dual_constraint="num_tool_calls",
      dual_target=0.25,
      dual_lr=0.5,
  )
  feats = features_lib.build_features(config)
  buf = replay.init(2, 4)
  states = types.FeatureStates(
      kl=jnp.float32(0.1), replay=buf, dual=jnp.float32(0.1)
  )
  new_buf = buf.replace(step=jnp.full((2,), 3, jnp.int32))
  r = _rollout(dual_observed=jnp.float32(0.5), replay=new_buf)
  out, m = features_lib.update_states(
      feats, states, r, {"kl": jnp.float32(0.2)}
  )
  rl = config.rl
  np.testing.assert_allclose(
      out["kl"],
      losses.adaptive_kl_update(
          0.1, 0.2, rl.kl_target, rl.kl_horizon, rl.batch_size
      ),
  )
  # lam' = max(0, 0.1 + 0.5 * (0.5 - 0.25)).
  np.testing.assert_allclose(out["dual"], 0.225, rtol=1e-6)
  assert out["replay"] is new_buf
  # The metrics are the values this iteration used.
  assert set(m) == {"kl_coef", "dual_coef", "dual_observed"}
  np.testing.assert_allclose(m["kl_coef"], 0.1)
  np.testing.assert_allclose(m["dual_coef"], 0.1)
  # Without kl_target the coefficient stays; no insertion keeps the buffer.
  out, _ = features_lib.update_states(
      features_lib.build_features(_config(replay_capacity=2)),
      types.FeatureStates(kl=jnp.float32(0.1), replay=buf),
      _rollout(),
      {"kl": jnp.float32(0.2)},
  )
  assert float(out["kl"]) == pytest.approx(0.1) and out["replay"] is buf


def test_init_states_adds_only_the_missing_states():
  config = _config(dual_constraint="num_tool_calls", dual_init=0.7)
  feats = features_lib.build_features(config)
  state = types.TrainState(
      step=jnp.int32(0),
      params={},
      ref_params={},
      opt_state=(),
      rng=jnp.zeros(2, jnp.uint32),
      features=types.FeatureStates(kl=jnp.float32(0.3)),
  )
  out = features_lib.init_states(feats, state)
  assert list(out.features) == ["kl", "dual"]
  assert float(out.features["kl"]) == pytest.approx(0.3)  # carried
  assert float(out.features["dual"]) == pytest.approx(0.7)
  assert features_lib.init_states(feats, out) is out


def _legacy_state(seed=0):
  k = jax.random.split(jax.random.PRNGKey(seed), 6)
  z = {"linear": {"kernel": jax.random.normal(k[0], (3, 2))}}
  return features_lib.LegacyTrainState(
      step=jnp.int32(5),
      params={"w": jax.random.normal(k[1], (3,))},
      ref_params={"w": jax.random.normal(k[2], (3,))},
      opt_state={"m": jax.random.normal(k[3], (3,))},
      rng=jnp.asarray([1, 2], jnp.uint32),
      kl_coef=jnp.float32(0.02),
      replay=replay.init(2, 4).replace(reward=jnp.asarray([0.5, 1.0])),
      dual_coef=jnp.float32(0.4),
      log_partition=z,
      log_partition_opt_state=(
          {"count": jnp.int32(3)},
          jax.tree.map(lambda x: x + 1.0, z),
      ),
      spa=types.SpaState(
          params={"weight": jax.random.normal(k[4], (3,))},
          opt_state={"nu": jax.random.normal(k[5], (3,))},
      ),
  )


def test_legacy_layout_maps_leaf_for_leaf_in_the_same_order():
  old = _legacy_state()
  new = features_lib.from_legacy(old)
  assert list(new.features) == ["kl", "replay", "dual", "flowrl", "spa"]
  # Same leaves in the same order: the jitted step's arguments keep theirs.
  for a, b in zip(jax.tree.leaves(old), jax.tree.leaves(new), strict=True):
    assert a is b
  back = features_lib.to_legacy(new)
  assert jax.tree.structure(back) == jax.tree.structure(old)
  # A legacy state without the optional fields: 'kl' only.
  plain = old.replace(
      replay=None,
      dual_coef=None,
      log_partition=None,
      log_partition_opt_state=None,
      spa=None,
  )
  assert list(features_lib.from_legacy(plain).features) == ["kl"]


def test_checkpoint_of_the_legacy_layout_restores_into_features(tmp_path):
  old = _legacy_state(1)
  like = jax.tree.map(jnp.zeros_like, features_lib.from_legacy(old))
  with checkpoint.Checkpointer(str(tmp_path / "old")) as ck:
    ck.save(5, old, force=True)
    ck.wait()
    assert "kl_coef" in ck.saved_tree(5)
    got = features_lib.restore_train_state(ck, like, step=5)
  assert isinstance(got, types.TrainState)
  assert isinstance(got.features["flowrl"], types.LogPartitionState)
  for a, b in zip(jax.tree.leaves(old), jax.tree.leaves(got), strict=True):
    np.testing.assert_array_equal(a, b)
  # Nested (the rm-mode state's 'policy'), latest step by default.
  with checkpoint.Checkpointer(str(tmp_path / "rm")) as ck:
    ck.save(2, {"step": jnp.int32(2), "policy": old}, force=True)
    ck.wait()
    got = features_lib.restore_train_state(
        ck, {"step": jnp.int32(0), "policy": like}
    )
  assert int(got["step"]) == 2
  np.testing.assert_array_equal(got["policy"].features["dual"], np.float32(0.4))
  # The current layout restores as it is.
  with checkpoint.Checkpointer(str(tmp_path / "new")) as ck:
    ck.save(5, got["policy"], force=True)
    ck.wait()
    assert "features" in ck.saved_tree(5)
    again = features_lib.restore_train_state(ck, like, step=5)
  for a, b in zip(jax.tree.leaves(old), jax.tree.leaves(again), strict=True):
    np.testing.assert_array_equal(a, b)
