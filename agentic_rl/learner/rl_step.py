"""RL step: collect + update + state bookkeeping as one jitted program."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from agentic_rl import host_memory
from agentic_rl import padding
from agentic_rl.reward_models import frozen as rm_frozen
from agentic_rl.rewards import components
from agentic_rl.rewards import sanitize
from agentic_rl import sharding
from agentic_rl import types
from agentic_rl.models import transformer
from agentic_rl.learner.collect import make_collect_fn, make_host_rollout_fn
from agentic_rl.learner.common import StepFn, adapter_dropout_key
from agentic_rl.learner import features as features_lib
from agentic_rl.learner.update import make_update_fn
from environments.host import base as host_base


def dual_path_metrics(traj: types.Trajectory) -> dict[str, jax.Array]:
  """Tool-necessity metrics of a dual-path batch (facts['tool_free'] set).

  Per group (`components.tool_necessity_stats`): acc_t (tool-enabled accuracy),
  acc_n (tool-free accuracy), necessity = acc_t - acc_n. Logged: the two
  accuracies over their episodes, the mean necessity over groups, the share
  of groups where tools are needed (acc_n = 0 < acc_t) or unneeded
  (acc_n > 0), and tool calls per tool-enabled episode in each kind of group
  (overuse shows as calls where tools are unneeded), and, when the env has a
  'tool_necessary' label, the mean necessity on labelled-necessary and
  labelled-unnecessary tasks. Means over rows equal
  means over groups (equal-size groups); an empty selection gives 0.
  """
  facts = traj.facts
  free = facts["tool_free"]
  correct = facts["correct"].astype(bool)
  calls = facts["num_tool_calls"].astype(jnp.float32)
  st = components.tool_necessity_stats(
      correct, calls.astype(jnp.int32), free, traj.group
  )
  f32 = lambda x: x.astype(jnp.float32)

  def mean_where(x, w):
    w = f32(w)
    return jnp.sum(x * w) / jnp.maximum(jnp.sum(w), 1.0)

  needed = (st["acc_no_tool"] == 0) & (st["acc_tool"] > 0)
  unneeded = st["acc_no_tool"] > 0
  extra = {}
  if "tool_necessary" in facts:
    # Measured necessity against the environment's ground-truth label.
    label = facts["tool_necessary"].astype(bool)
    extra = {
        "dual_path_necessity_labelled_necessary": mean_where(
            st["necessity"], label
        ),
        "dual_path_necessity_labelled_unnecessary": mean_where(
            st["necessity"], ~label
        ),
    }
  return {
      **extra,
      "dual_path_acc_tool": mean_where(f32(correct), ~free),
      "dual_path_acc_no_tool": mean_where(f32(correct), free),
      "dual_path_necessity": jnp.mean(st["necessity"]),
      "dual_path_needed_frac": jnp.mean(f32(needed)),
      "dual_path_unneeded_frac": jnp.mean(f32(unneeded)),
      "dual_path_calls_needed": mean_where(calls, ~free & needed),
      "dual_path_calls_unneeded": mean_where(calls, ~free & unneeded),
      # Exactly 0 when the logit mask works (a health check).
      "dual_path_calls_tool_free": mean_where(calls, free),
  }


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
) -> StepFn:
  """One GRPO iteration (collect + update) as a single jitted program.

  `state_sharding`: as in `make_sft_step`. `reward_model`: the frozen learned
  RM (params in `state.reward_model`; see `make_collect_fn`); its
  over-optimisation monitor (`rm_frozen.monitor_metrics`: rm_reward,
  verified_reward, rm_gap, rm_verified_corr, rm_false_positive_rate, plus the
  mean raw rm_score) is added to the metrics of every iteration.
  """
  rl_cfg = config.rl
  group_size = rl_cfg.group_size
  lengths = None
  if update_is_bucketed(config, env):
    lengths = padding.update_lengths(
        config.max_len, rl_cfg.update_length_buckets, config.trim_bucket
    )
  # With buckets, the reference and behaviour forwards run on the update's.
  collect = make_collect_fn(
      config, env, graphdef, model_config, reward_model, update_lengths=lengths
  )
  rm_params = dict(rl_cfg.reward_params or {}).get("rm", {})
  rm_params = dict(
      rm_params.to_dict() if hasattr(rm_params, "to_dict") else rm_params
  )
  update = make_update_fn(config, graphdef, tx)
  features = features_lib.build_features(config)
  if lengths is not None:
    update = padding.bucketed_update(update, lengths)

  def step(state: types.TrainState, first_traj=None):
    batch, r = collect(state, first_traj)
    traj, reward, parts, adv_b = r.traj, r.reward, r.parts, r.adv_b
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
    facts = traj.facts
    if "tool_free" in facts:
      metrics.update(dual_path_metrics(traj))
    reward_gk = reward.reshape(-1, group_size)
    is_const = jnp.all(reward_gk == reward_gk[:, :1], axis=1)
    f32 = lambda x: jnp.mean(x.astype(jnp.float32))
    metrics.update(
        {
            # The reward the advantages were computed from (after every
            # reassignment; 'env_reward' is the environment's, before them);
            # 'reward' is its old name, kept for earlier runs' records.
            "reward": jnp.mean(reward),
            "shaped_reward": jnp.mean(reward),
            **{f"reward_{k}": jnp.mean(v) for k, v in parts.items()},
            "accuracy": f32(facts["correct"]),
            "tool_calls": f32(facts["num_tool_calls"]),
            "tool_errors": f32(facts["num_tool_errors"]),
            "format_error_rate": f32(traj.finish == types.FORMAT_ERROR),
            "truncated_rate": f32(traj.finish == types.TRUNCATED),
            "policy_tokens": f32(jnp.sum(batch.mask, axis=1)),
            # Trained (loss-mask) tokens and non-pad tokens / all B * L tokens.
            **padding.metrics(batch.mask, traj.length),
            "adv_abs_mean": jnp.mean(jnp.abs(adv_b)),
            "zero_variance_groups": f32(is_const),
        }
    )
    # Host tool steps that raised / timed out (host_rollout facts), counted
    # over the batch, and non-finite float facts the reward sanitised.
    for name in ("tool_exceptions", "tool_timeouts"):
      if f"num_{name}" in facts:
        metrics[name] = jnp.sum(facts[f"num_{name}"]).astype(jnp.float32)
    metrics["reward_nonfinite_inputs"] = jnp.sum(
        sanitize.nonfinite_fact_counts(facts)
    ).astype(jnp.float32)
    # Episode length in turns and repeated calls (step-reward hacking).
    metrics["turns"] = f32(traj.num_turns)
    if "num_redundant_calls" in facts:
      metrics["redundant_calls"] = f32(facts["num_redundant_calls"])
    if reward_model is not None:
      # Gold-verifier over-optimisation monitor (Gao et al., arXiv:2210.10760).
      rm_r = (
          parts["rm"]
          if "rm" in parts
          else components.rm_reward(traj, **rm_params)
      )
      metrics.update(rm_frozen.monitor_metrics(rm_r, facts["correct"]))
      metrics["rm_score"] = jnp.mean(facts["rm_score"])
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
