"""An rm-mode workdir's checkpoint layout, and its trained RM loaded frozen for RL.

rm-mode (agentic_rl/rm_train.py) checkpoints one state dict:

  {'step': int32 [], 'policy': types.TrainState of the SFT policy,
   'orm': {'trunk', 'head'}, 'orm_opt': optax state,
   'prm': {'trunk', 'head'}, 'prm_opt': optax state}

`init_rm_state` builds it (rm_train starts from it; `load_rl_reward_model`
restores into its shapes). An RL config names a finished rm-mode workdir in
`rl.reward_model_dir` and which of its two models to use in
`rl.reward_model_kind`; validation.validate_rl_reward_model checks both
without loading, train.py calls `load_rl_reward_model` to put the params into
TrainState.reward_model, and the RL step scores every rollout with them.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
from absl import logging
from flax import nnx

from agentic_rl import checkpoint as checkpoint_lib
from agentic_rl import learner
from agentic_rl.reward_models import frozen as rm_frozen
from agentic_rl.reward_models import model as rm_model
from agentic_rl import types
from agentic_rl import validation
from agentic_rl.models import lora as lora_lib
from agentic_rl.models import transformer


def model_config(
    config: ml_collections.ConfigDict,
) -> transformer.TransformerConfig:
  """The TransformerConfig of `config.model` (policy and RM trunks share it)."""
  return transformer.TransformerConfig(
      **lora_lib.transformer_fields(config.model)
  )


def init_rm_state(
    config: ml_collections.ConfigDict,
    model_cfg: transformer.TransformerConfig,
) -> tuple[nnx.GraphDef, nnx.GraphDef, dict[str, Any]]:
  """A fresh rm-mode state (layout in the module docstring).

  Keys: fold_in(PRNGKey(config.seed), i) for i = 0 policy init, 1 the
  policy's rng, 2 the outcome RM, 3 the process RM.

  Returns:
    (policy graphdef, reward-model graphdef, state dict).
  """
  root = jax.random.PRNGKey(config.seed)
  policy = transformer.Transformer(
      model_cfg, nnx.Rngs(params=jax.random.fold_in(root, 0))
  )
  pgraph, pparams = nnx.split(policy)
  policy_state = types.TrainState(
      step=jnp.int32(0),
      params=pparams,
      ref_params=jax.tree.map(jnp.copy, pparams),
      opt_state=learner.make_optimizer(config.sft).init(pparams),
      rng=jax.random.fold_in(root, 1),
      features=types.FeatureStates(kl=jnp.float32(0.0)),
  )
  rm_cfg = rm_model.RewardModelConfig(model_cfg, config.rm.head_layers)
  rgraph, orm = rm_model.init_reward_model(rm_cfg, jax.random.fold_in(root, 2))
  _, prm = rm_model.init_reward_model(rm_cfg, jax.random.fold_in(root, 3))
  tx = learner.make_optimizer(config.rm)
  state = {
      "step": jnp.int32(0),
      "policy": policy_state,
      "orm": orm,
      "orm_opt": tx.init(orm),
      "prm": prm,
      "prm_opt": tx.init(prm),
  }
  return pgraph, rgraph, state


def load_rl_reward_model(
    config: ml_collections.ConfigDict,
) -> tuple[rm_frozen.FrozenRewardModel, dict[str, Any]]:
  """Loads the `rl.reward_model_kind` RM of `rl.reward_model_dir`, frozen.

  Returns:
    (FrozenRewardModel with the graphdef, kind and the rm run's PRM aggregation;
     its params {'trunk', 'head'} as restored from the latest checkpoint).

  Raises:
    validation.ConfigError: as `validation.validate_rl_reward_model`, or a
      checkpoint whose shapes do not match the workdir's config.json.
  """
  path = config.rl.reward_model_dir
  kind = config.rl.get("reward_model_kind", "outcome")
  rm_config, model_cfg, step = validation.read_rm_dir(config)
  holder = {}

  def init():
    _, rgraph, state = init_rm_state(rm_config, model_cfg)
    holder["rgraph"] = rgraph
    return state

  like = jax.eval_shape(init)
  ckpt = checkpoint_lib.Checkpointer(os.path.join(path, "checkpoints"))
  try:
    state = learner.restore_train_state(ckpt, like, step=step)
  except (ValueError, KeyError, TypeError) as e:
    raise validation.ConfigError(
        f"config.rl.reward_model_dir={path!r}: checkpoint {step} does not "
        f"match its config.json: {e}"
    )
  finally:
    ckpt.close()
  params = state["orm" if kind == "outcome" else "prm"]
  spec = rm_frozen.FrozenRewardModel(
      holder["rgraph"], kind, rm_config.rm.get("prm_aggregation", "log_prod")
  )
  logging.info(
      "loaded the frozen %s RM of %s (checkpoint %d)", kind, path, step
  )
  return spec, params
