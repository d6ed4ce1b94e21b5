"""Collect stage: rollout, rewards, potentials, reference and behaviour
log-probs, advantages, packed into the learner batch.
"""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx

from agentic_rl.reward_models import frozen as rm_frozen
from agentic_rl import host_rollout
from agentic_rl import losses
from agentic_rl import types
from agentic_rl.models import lora as lora_lib
from agentic_rl.models import transformer
from agentic_rl.learner.batch import StageContext
from agentic_rl.learner.stages import build
from agentic_rl.learner.stages import pack as pack_stages
from agentic_rl.learner.stages.sample import dual_path_tool_free  # noqa: F401
from agentic_rl.learner.stages.shaping import obs_prediction_info  # noqa: F401


def make_collect_fn(
    config,
    env,
    graphdef: nnx.GraphDef,
    model_config: transformer.TransformerConfig,
    reward_model: rm_frozen.FrozenRewardModel | None = None,
    update_lengths: tuple | None = None,
    seed_axis_name: str | None = None,
):
  """Returns pure `collect(state, first_traj=None) -> (batch, rollout)`.

  `batch`: the learner batch of `make_update_fn` (a `batch.LearnerBatch`).
  `rollout`: the iteration's `batch.Rollout` after the last stage: the fresh
  trajectory, the final reward (after every reassignment), its parts, the
  episode advantages, the metrics in `info`, and the values the RL step
  needs after the update (any_usable, dual_observed, spa_inputs, replay).

  `update_lengths`: the length buckets of a bucketed update
  (`padding.update_lengths`, `rl.update_length_buckets` > 1; None: off). The
  reference forward and the trainer-side behaviour forward then run on the
  bucket the update will use (`padding.bucketed_forward`: the shortest that
  holds the batch's `padding.loss_length`); their log-probs (and the
  dual-path behaviour shift) are 0 from the loss length on, where no loss
  term reads them, and the sampler/trainer mismatch metrics cover the columns
  before it only. The behaviour values of GAE stay full-length.
  `seed_axis_name` (vmapped seeds, `agentic_rl/seeds.py`): the loss length
  is maximised over that `jax.vmap` axis, so all seeds use one bucket.

  `first_traj`: the first round's rollout when it was made outside the jitted
  program (host environments, see `make_host_rollout_fn`); None rolls out here.

  `reward_model` (with its params in `state.reward_model`, set when
  `rl.reward_model_dir` is): every rollout round is scored by the frozen RM in
  one batched pass (rm_frozen.trajectory_rm_outputs), stored as env facts
  'rm_score' [B] (read by the `rm` reward component) and 'rm_potential'
  [B, K + 1] (the PBRS potential when `rl.pbrs_potential` is 'rm').

  Samples `rl.batch_size // rl.group_size` tasks from fold_in(rng, step), repeats
  each `rl.group_size` times contiguously (group = task index), rolls them out with
  the current policy, scores them, computes the advantages and the reference
  model's log-probs (once per batch), and packs the learner batch.

  The stages (`stages.build.build_stages`: built once from the config, a
  feature that is off has no stage; run by `stages.build.chain`), all inside
  one jitted program:

    sample, env_reward_info    rollout round(s), frozen-RM scores, rewards,
                               DAPO dynamic sampling (`stages.sample`)
    policy_mask, overlong      loss mask, overlong policy (`stages.shaping`)
    gold_logprobs ..           gold-answer / observation passes, likelihood
      dual_penalty             reward, PBRS potential, dark-room
                               diagnostics, dense auxiliary advantages,
                               dual-ascent penalty (`stages.shaping`)
    train_rows or              replay injection / insertion, SIL samples
      replay_fresh ..          (`stages.replay`)
      replay_size
    loss_length,               the loss length, reference log-probs,
      reference_logprobs,      KL-in-reward (`stages.logprobs`)
      kl_in_reward
    trainer_behaviour or       behaviour log-probs and values V_old
      sampler_behaviour,       (`stages.logprobs`)
      behaviour_values
    gae_advantages or          GAE, or the estimator tables with the
      step_reward_diagnostics, step-reward diagnostics
      advantages               (`stages.advantages`)

  then `stages.pack.pack`: the learner batch (FlowRL, SIL, aux and
  next-observation-prediction keys).

  Also once per batch, before the update and with the sampling parameters:
  trainer-side behaviour log-probs (`rl.behaviour_logprobs='trainer'`, with
  the sampler/trainer mismatch in `info`), behaviour values V_old and their
  targets (`rl.advantage_estimator='gae'`: GAE advantages replace the
  estimator; `rl.pbrs_potential='value'`: V(s_k) as the PBRS potential and
  Monte-Carlo targets for the head), and FlowRL's `reward_hat` (the
  episode-level advantage) and `prompt_embedding`.
  """
  rl_cfg = config.rl
  run = build.chain(
      *build.build_stages(
          config,
          env,
          graphdef,
          model_config,
          reward_model,
          update_lengths,
          seed_axis_name,
      )
  )

  def collect(state: types.TrainState, first_traj=None):
    key = jax.random.fold_in(state.rng, state.step)
    # With LoRA: the policy's frozen base plus the reference's adapters.
    ref_params = lora_lib.reference_params(state.params, state.ref_params)
    ctx = StageContext(
        key=key,
        step=state.step,
        params=state.params,
        ref_params=ref_params,
        reward_model=state.reward_model,
        features=state.features,
        first_traj=first_traj,
    )
    r = run(None, ctx)
    # The learner batch, with the optional inputs the policy loss takes.
    policy_loss = losses.POLICY_LOSSES[rl_cfg.loss_type]
    batch = pack_stages.pack(
        r,
        state.params,
        key,
        graphdef=graphdef,
        episode_reward=policy_loss.episode_reward,
        log_partition=policy_loss.needs_log_partition,
        obs_prediction=rl_cfg.obs_prediction_coef > 0,
        placebo=bool(rl_cfg.obs_prediction_placebo),
    )
    return batch, r

  return collect


def make_host_rollout_fn(
    config,
    env,
    graphdef: nnx.GraphDef,
    model_config: transformer.TransformerConfig,
):
  """Returns `rollout_fn(state) -> Trajectory`: the first-round RL rollout of a
  host environment (`env.is_host`), driven by agentic_rl/host_rollout.py.

  Same keys and grouping as the JAX-native round in `make_collect_fn`: tasks
  from a numpy Generator seeded by fold_in(fold_in(rng, step), 1)'s task half,
  each repeated `rl.group_size` times contiguously (group = task index).
  """
  rl_cfg = config.rl
  group_size = rl_cfg.group_size
  num_sampled = (
      rl_cfg.batch_size // group_size * (rl_cfg.dynamic_sampling_oversample)
  )

  def rollout_fn(state: types.TrainState) -> types.Trajectory:
    key = jax.random.fold_in(state.rng, state.step)
    task_key, sample_key = jax.random.split(jax.random.fold_in(key, 1))
    tasks = env.sample_tasks(host_rollout.numpy_rng(task_key), num_sampled)
    # Read lazily: a process of a multi-process run touches its rows' only.
    tasks = host_rollout.RepeatedTasks(tasks, group_size)
    group = np.repeat(np.arange(num_sampled, dtype=np.int32), group_size)
    return host_rollout.rollout(
        env,
        tasks,
        sample_key,
        max_len=config.max_len,
        group=group,
        graphdef=graphdef,
        params=state.params,
        model_config=model_config,
        temperature=rl_cfg.temperature,
    )

  return rollout_fn
