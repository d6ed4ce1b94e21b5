"""RL step: collect + update + state bookkeeping as one jitted program."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from agentic_rl import host_memory
from agentic_rl import padding
from agentic_rl.reward_models import frozen as rm_frozen
from agentic_rl import sharding
from agentic_rl import types
from agentic_rl.models import transformer
from agentic_rl.learner.collect import make_collect_fn, make_host_rollout_fn
from agentic_rl.learner.common import StepFn, adapter_dropout_key
from agentic_rl.learner import features as features_lib
from agentic_rl.learner import step_metrics
from agentic_rl.learner.update import make_update_fn
from environments.host import base as host_base


def update_is_bucketed(config, env) -> bool:
  """Whether the one-jit step runs its update on length buckets.

  `rl.update_length_buckets` > 1 compiles the update for that many lengths
  (`padding.update_lengths`, multiples of `trim_bucket`) and runs the
  shortest that holds every trained position (`padding.bucketed_update`).
  Validation refuses K > 1 for host environments (their batches are already
  trimmed on the host, `padding.host_trim_length`), with `trim_bucket` = 0,
  and for 'seq-mean-token-sum-norm' with `rl.loss_norm_constant` = 0, whose
  denominator is the buffer length itself; the same conditions are checked
  here for configs built without validation.
  """
  rl = config.rl
  return (
      rl.update_length_buckets > 1
      and config.trim_bucket > 0
      and not host_base.is_host(env)
      and not (
          rl.loss_agg_mode == "seq-mean-token-sum-norm"
          and not rl.loss_norm_constant
      )
  )


def make_rl_step(
    config,
    env,
    graphdef: nnx.GraphDef,
    tx: optax.GradientTransformation,
    model_config: transformer.TransformerConfig,
    state_sharding=None,
    reward_model: rm_frozen.FrozenRewardModel | None = None,
    seed_axis_name: str | None = None,
) -> StepFn:
  """One GRPO iteration (collect + update) as a single jitted program.

  `state_sharding`: as in `make_sft_step`. `reward_model`: the frozen learned
  RM (params in `state.reward_model`; see `make_collect_fn`); its
  over-optimisation monitor (`rm_frozen.monitor_metrics`: rm_reward,
  verified_reward, rm_gap, rm_verified_corr, rm_false_positive_rate, plus the
  mean raw rm_score) is added to the metrics of every iteration.

  `seed_axis_name`: the `jax.vmap` axis name when the step is vmapped over
  seeds (`agentic_rl/seeds.py`); with length buckets every seed then takes
  the longest seed's bucket (`padding.bucket_index`), one branch for all.

  After the update and the features' updates, the metric functions of
  `step_metrics.build_step_metrics` (chosen once from the config: dual-path,
  batch, host tool failures, episode facts, RM monitor) add their metrics.
  """
  rl_cfg = config.rl
  lengths = None
  if update_is_bucketed(config, env):
    lengths = padding.update_lengths(
        config.max_len, rl_cfg.update_length_buckets, config.trim_bucket
    )
  # With buckets, the reference and behaviour forwards run on the update's.
  collect = make_collect_fn(
      config,
      env,
      graphdef,
      model_config,
      reward_model,
      update_lengths=lengths,
      seed_axis_name=seed_axis_name,
  )
  update = make_update_fn(config, graphdef, tx)
  features = features_lib.build_features(config)
  metric_fns = step_metrics.build_step_metrics(config, env, reward_model)
  if lengths is not None:
    update = padding.bucketed_update(update, lengths, seed_axis_name)

  def step(state: types.TrainState, first_traj=None):
    batch, r = collect(state, first_traj)
    dropout_key = adapter_dropout_key(config, state)
    # FlowRL's log Z is trained by the loss (learner/features.py): the update
    # advances it with the policy; None without FlowRL.
    z_state = state.features.get("flowrl")
    out = update(
        state.params,
        state.opt_state,
        batch,
        state.features["kl"],
        z_state,
        dropout_key=dropout_key,
    )
    params, opt_state, metrics = out[:3]
    if z_state is not None:
      z_state = out[3]
    if r.any_usable is not None:
      # No group with varying outcomes: skip the update (logged), don't crash.
      skip = ~r.any_usable
      params, opt_state, z_state = jax.tree.map(
          lambda old, new: jnp.where(skip, old, new),
          (state.params, state.opt_state, state.features.get("flowrl")),
          (params, opt_state, z_state),
      )
      metrics["skipped_update"] = skip.astype(jnp.float32)
    metrics.update(r.info)
    states = state.features
    if z_state is not None:
      states = states.replace(flowrl=z_state)
    # Every stateful feature's post-update step (adaptive KL, replay buffer,
    # dual ascent, SPA head), in `types.FEATURE_ORDER`.
    states, feature_metrics = features_lib.update_states(
        features, states, r, metrics
    )
    metrics.update(feature_metrics)
    # The post-update metrics of this config (`step_metrics`), in order.
    for metric in metric_fns:
      metrics.update(metric(r, batch))
    state = state.replace(
        step=state.step + 1,
        params=params,
        opt_state=opt_state,
        features=states,
    )
    return state, metrics

  if host_base.is_host(env):
    # Host environments: the rollout runs in Python between jitted turns; the
    # rest of the iteration is one jitted program.
    rollout_fn = make_host_rollout_fn(config, env, graphdef, model_config)
    # Host envs: one device. Each trimmed length compiles once, and the heap
    # the compiler freed is returned before the program first runs.
    learn_jit = host_memory.CompileThenRelease(jax.jit(step, donate_argnums=0))

    def host_step(state: types.TrainState):
      # Cut the host batch to its longest episode (bucketed) where that leaves
      # the update unchanged (padding.host_trim_length); one compile per bucket.
      traj = rollout_fn(state)
      traj = padding.trim(
          traj,
          config.max_len,
          padding.host_trim_length(config, sharding.to_host(traj.length)),
      )
      return learn_jit(state, traj)

    return host_step

  return jax.jit(
      step, donate_argnums=0, **sharding.step_jit_kwargs(state_sharding)
  )
