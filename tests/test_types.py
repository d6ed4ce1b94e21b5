"""TrainState's optional per-feature parts hold what their annotations say."""

import typing

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from agentic_rl import train
from agentic_rl import types
from configs import default

_OPTIONAL = (
    "replay",
    "dual_coef",
    "log_partition",
    "log_partition_opt_state",
    "spa",
    "reward_model",
)


def _hints():
  # The annotations (strings: `from __future__ import annotations`) name
  # modules that types.py imports for type checkers only.
  scope = dict(vars(types), nnx=nnx, optax=optax)
  return {
      name: eval(types.TrainState.__annotations__[name], scope)  # pylint: disable=eval-used
      for name in _OPTIONAL
  }


def test_optional_parts_default_to_none_and_are_empty_pytrees():
  state = types.TrainState(
      step=jnp.int32(0),
      params={"w": jnp.ones(2)},
      ref_params={},
      opt_state=(),
      rng=jnp.zeros(2, jnp.uint32),
      kl_coef=jnp.float32(0.0),
  )
  for name in _OPTIONAL:
    assert getattr(state, name) is None
    assert typing.get_args(_hints()[name])[-1] is type(None), name
  # 1 param leaf + step, rng, kl_coef: the None parts add no leaves, so a
  # checkpoint of a run without them keeps its structure.
  assert len(jax.tree.leaves(state)) == 4


def test_rl_transition_fills_the_parts_with_their_declared_types():
  config = default.get_config("smoke")
  config.rl.replay_capacity = 3
  config.rl.dual_constraint = "num_tool_calls"
  config.rl.loss_type = "flowrl"
  config.rl.pbrs_potential = "spa"
  config.rl.pbrs_coef = 0.5
  model_cfg = train.make_model_config(config)
  _, state = train.init_state(config, model_cfg)
  rl = jax.eval_shape(train._rl_transition(config), state)  # pylint: disable=protected-access
  hints = _hints()
  for name in ("replay", "spa", "log_partition"):
    want = typing.get_args(hints[name])[0]
    assert isinstance(getattr(rl, name), want), (name, type(getattr(rl, name)))
  assert rl.replay.tokens.shape == (3, config.max_len)
  assert rl.dual_coef.shape == () and rl.dual_coef.dtype == jnp.float32
  # The log-partition optimizer state is an optax state over its params.
  assert jax.tree.structure(rl.log_partition_opt_state) == jax.tree.structure(
      jax.eval_shape(optax.adam(1e-3).init, rl.log_partition)
  )
  assert rl.reward_model is None  # set only by reward_model_loader in train.py
