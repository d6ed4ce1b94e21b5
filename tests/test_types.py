"""TrainState's feature states hold what `TrainState`'s docstring says."""

import jax
import jax.numpy as jnp
import optax
import pytest

from agentic_rl import train
from agentic_rl import types
from configs import default


def test_features_default_to_empty_and_add_no_leaves():
  state = types.TrainState(
      step=jnp.int32(0),
      params={"w": jnp.ones(2)},
      ref_params={},
      opt_state=(),
      rng=jnp.zeros(2, jnp.uint32),
  )
  assert dict(state.features) == {} and state.reward_model is None
  # 1 param leaf + step, rng: a feature that is off adds no leaf, so a
  # checkpoint of a run without it keeps its structure.
  assert len(jax.tree.leaves(state)) == 3


def test_feature_states_flatten_in_feature_order_with_dict_keys():
  states = types.FeatureStates(
      spa=jnp.float32(4), dual=jnp.float32(2), kl=jnp.float32(0)
  ).replace(replay=jnp.float32(1), zzz=jnp.float32(9))
  assert list(states) == ["kl", "replay", "dual", "spa", "zzz"]
  paths, treedef = jax.tree_util.tree_flatten_with_path(states)
  assert [p[0].key for p, _ in paths] == list(states)
  assert [float(x) for _, x in paths] == [0, 1, 2, 4, 9]
  back = jax.tree.unflatten(treedef, [x for _, x in paths])
  assert list(back) == list(states) and float(back["spa"]) == 4.0
  with pytest.raises(AttributeError):
    states.foo = 1  # pylint: disable=attribute-defined-outside-init


def test_rl_transition_fills_the_features_with_their_declared_types():
  config = default.get_config("smoke")
  config.rl.replay_capacity = 3
  config.rl.dual_constraint = "num_tool_calls"
  config.rl.loss_type = "flowrl"
  config.rl.pbrs_potential = "spa"
  config.rl.pbrs_coef = 0.5
  model_cfg = train.make_model_config(config)
  _, state = train.init_state(config, model_cfg)
  assert list(state.features) == ["kl"]
  rl = jax.eval_shape(train._rl_transition(config), state)  # pylint: disable=protected-access
  f = rl.features
  assert list(f) == ["kl", "replay", "dual", "flowrl", "spa"]
  assert f["kl"].shape == () and f["kl"].dtype == jnp.float32
  assert isinstance(f["replay"], types.ReplayBuffer)
  assert f["replay"].tokens.shape == (3, config.max_len)
  assert f["dual"].shape == () and f["dual"].dtype == jnp.float32
  assert isinstance(f["flowrl"], types.LogPartitionState)
  assert isinstance(f["spa"], types.SpaState)
  # The log-partition optimizer state is an optax state over its params.
  assert jax.tree.structure(f["flowrl"].opt_state) == jax.tree.structure(
      jax.eval_shape(optax.adam(1e-3).init, f["flowrl"].params)
  )
  assert rl.reward_model is None  # set only by reward_model_loader in train.py
