"""Collect stage: rollout, rewards, potentials, reference and behaviour
log-probs, advantages, packed into the learner batch.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from agentic_rl.reward_models import frozen as rm_frozen
from agentic_rl import host_rollout
from agentic_rl.rewards import factory
from agentic_rl import rollout
from agentic_rl import types
from agentic_rl.models import lora as lora_lib
from agentic_rl.models import transformer
from agentic_rl.learner.batch import Rollout
from agentic_rl.learner.potentials_by_name import PotentialContext
from agentic_rl.learner.stages import advantages as advantage_stages
from agentic_rl.learner.stages import logprobs as logprob_stages
from agentic_rl.learner.stages import pack as pack_stages
from agentic_rl.learner.stages import replay as replay_stages
from agentic_rl.learner.stages import sample as sample_stages
from agentic_rl.learner.stages import shaping as shaping_stages
from agentic_rl.learner.stages.sample import dual_path_tool_free  # noqa: F401
from agentic_rl.learner.stages.shaping import obs_prediction_info  # noqa: F401
from agentic_rl.learner.token_credit import step_reward_on
from agentic_rl.learner.update import uses_values


def make_collect_fn(
    config,
    env,
    graphdef: nnx.GraphDef,
    model_config: transformer.TransformerConfig,
    reward_model: rm_frozen.FrozenRewardModel | None = None,
    update_lengths: tuple | None = None,
):
  """Returns pure `collect(state, first_traj=None) -> (batch, rollout)`.

  `batch`: the learner batch of `make_update_fn` (a dict of [B, L] arrays).
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

  The pipeline, one named stage each (all inside one jitted program):

    1. `sample_batch`       rollout round(s), frozen-RM scores, rewards, DAPO
                            dynamic sampling (`rl.dynamic_sampling_*`;
                            the functions of `stages.sample`)
    2. `policy_mask`,       POLICY mask, dual-path tool-free rows, overlong
       `overlong`           (`stages.shaping`)
    3. `shaping_terms`      gold-answer / observation passes, likelihood
                            reward, the PBRS potential
                            (`potentials_by_name.POTENTIALS`), dark-room
                            diagnostics, dense auxiliary advantages,
                            dual-ascent penalty
                            (the functions of `stages.shaping`)
    4. `replay_stage`       replay insertion / injection, SIL samples
                            (the functions of `stages.replay`)
    5. `loss_length`,       the loss length, reference log-probs,
       `reference_logprobs`, KL-in-reward (`stages.logprobs`)
       `kl_in_reward`
    6. `trainer_behaviour`  trainer-side behaviour log-probs and values V_old
       (or `sampler_behaviour`, `behaviour_values`; `stages.logprobs`)
    7. `advantages`         GAE or `token_advantages` (the estimator tables),
                            step-reward diagnostics (`stages.advantages`)
    8. `pack`               the learner batch (FlowRL, SIL, aux and
                            next-observation-prediction keys;
                            `stages.pack`)

  Also once per batch, before the update and with the sampling parameters:
  trainer-side behaviour log-probs (`rl.behaviour_logprobs='trainer'`, with
  the sampler/trainer mismatch in `info`), behaviour values V_old and their
  targets (`rl.advantage_estimator='gae'`: GAE advantages replace the
  estimator; `rl.pbrs_potential='value'`: V(s_k) as the PBRS potential and
  Monte-Carlo targets for the head), and FlowRL's `reward_hat` (the
  episode-level advantage) and `prompt_embedding`.
  """
  rl_cfg = config.rl
  group_size = rl_cfg.group_size
  num_tasks = rl_cfg.batch_size // group_size
  max_turns = env.max_turns
  temperature = rl_cfg.temperature
  reward_fn = factory.reward_fn_from_config(config.rl)
  sft_steps = config.sft.steps
  over = rl_cfg.dynamic_sampling_oversample
  tree_branching = tuple(rl_cfg.tree_branching)
  num_free = rl_cfg.dual_path_tool_free  # dual-path tool-free rows per group
  with_values = uses_values(rl_cfg)
  trainer_beh = rl_cfg.behaviour_logprobs == "trainer"
  # The shared passes of the shaping terms, and who reads them.
  pbrs = rl_cfg.pbrs_coef > 0
  needs_gold = rl_cfg.likelihood_coef > 0 or (
      pbrs and rl_cfg.pbrs_potential == "trace"
  )
  potential_reads_obs = pbrs and rl_cfg.pbrs_potential == "obs_prediction"
  log_obs_prediction = (
      rl_cfg.obs_prediction_coef > 0
      or rl_cfg.log_obs_prediction
      or potential_reads_obs
  )

  def sample_round(
      state, round_key, noise_key, num_groups, traj=None
  ) -> Rollout:
    """Rolls out num_groups groups of group_size episodes and scores them.

    `traj`: the round's trajectory when it was rolled out outside this program
    (host environments: `make_host_rollout_fn` with the same keys).
    """
    if traj is None:
      traj = sample_stages.rollout_round(
          round_key,
          state.params,
          env=env,
          graphdef=graphdef,
          model_config=model_config,
          num_groups=num_groups,
          group_size=group_size,
          max_len=config.max_len,
          temperature=temperature,
          tree_branching=tree_branching,
          num_tool_free=num_free,
      )
    if reward_model is not None:
      # Frozen learned RM: episode score and per-state potentials, one pass.
      traj = sample_stages.rm_score(
          traj,
          state.reward_model,
          reward_model=reward_model,
          max_turns=max_turns,
      )
    r = sample_stages.env_reward(
        traj, state.step, noise_key, reward_fn=reward_fn, sft_steps=sft_steps
    )
    if rl_cfg.overlong_soft_cache > 0:
      r = sample_stages.soft_overlong_penalty(
          r,
          soft_max=rl_cfg.overlong_soft_max,
          cache=rl_cfg.overlong_soft_cache,
      )
    return r

  def sample_batch(state, key, first_traj) -> Rollout:
    """Stage 1: the Rollout (traj, reward [B], parts) of num_tasks groups.

    DAPO dynamic sampling (`rl.dynamic_sampling_oversample` > 1,
    `stages.sample.dynamic_sampling`): keep the first num_tasks groups whose
    metric varies; with retries, roll out fresh groups into the remaining
    slots (at most `rl.dynamic_sampling_max_retries` more rounds, stopping
    once the batch is full).
    """
    num_sampled = num_tasks * over
    first = sample_round(
        state,
        jax.random.fold_in(key, 1),
        jax.random.fold_in(key, 2),
        num_sampled,
        traj=first_traj,
    )
    if over <= 1:
      return first
    return sample_stages.dynamic_sampling(
        first,
        key,
        lambda round_key, noise_key: sample_round(
            state, round_key, noise_key, num_sampled
        ),
        num_tasks=num_tasks,
        group_size=group_size,
        metric=rl_cfg.dynamic_sampling_metric,
        max_retries=rl_cfg.dynamic_sampling_max_retries,
    )

  def shaping_terms(r: Rollout, state, ref_params) -> Rollout:
    """Stage 3: rewrites reward [B]; sets gold_logp / obs_prob / obs_hit
    (the shared passes, when read), phi [B, K + 1] (None without PBRS),
    spa_inputs, aux_advantage, dual_observed and info entries.

    The likelihood reward (`rl.likelihood_coef`), the PBRS potential
    (`stages.shaping.potential`), the dark-room diagnostics (logged when
    next-observation prediction is used in any way or
    `rl.log_obs_prediction`), the dense auxiliary advantages
    (`rl.dense_as='aux_loss'`) and the dual-ascent penalty
    (`rl.dual_constraint`). Each shared pass runs once, just before its
    first reader.
    """
    if needs_gold:
      r = shaping_stages.gold_logprobs(
          r,
          ref_params,
          graphdef=graphdef,
          temperature=temperature,
          max_turns=max_turns,
      )
    if rl_cfg.likelihood_coef > 0:
      r = shaping_stages.likelihood_reward(r, coef=rl_cfg.likelihood_coef)
    if potential_reads_obs:
      r = shaping_stages.observation_scores(
          r, state.params, graphdef=graphdef, temperature=temperature
      )
    if pbrs:
      r = shaping_stages.potential(
          r,
          PotentialContext(
              graphdef=graphdef,
              params=state.params,
              spa=state.spa,
              max_turns=max_turns,
          ),
          name=rl_cfg.pbrs_potential,
      )
    if log_obs_prediction:
      if r.obs_prob is None:
        r = shaping_stages.observation_scores(
            r, state.params, graphdef=graphdef, temperature=temperature
        )
      r = shaping_stages.obs_prediction_diagnostics(r)
    if rl_cfg.dense_as == "aux_loss" and pbrs:
      r = shaping_stages.dense_aux_advantage(
          r, rl_cfg=rl_cfg, max_turns=max_turns
      )
    if rl_cfg.dual_constraint:
      r = shaping_stages.dual_penalty(
          r,
          state.dual_coef,
          fact=rl_cfg.dual_constraint,
          sense=rl_cfg.dual_sense,
      )
    return r

  def replay_stage(state, key, r: Rollout) -> Rollout:
    """Stage 4: sets train_traj (traj without the replay buffer) and, with
    the buffer (`rl.replay_capacity` > 0), rewrites reward and mask
    (injection of buffered successes into failed groups, `rl.replay_inject`)
    and sets injected, sil (SIL samples, `rl.sil_coef`) and replay (the
    buffer after this batch's insertion): the functions of
    `stages.replay`."""
    if rl_cfg.replay_capacity <= 0:
      return replay_stages.train_rows(r)
    r = replay_stages.replay_fresh(r)
    if rl_cfg.replay_inject:
      r = replay_stages.replay_inject(
          r,
          state.replay,
          group_size=group_size,
          success_threshold=rl_cfg.replay_success_threshold,
      )
    r = replay_stages.replay_store(
        r,
        state.replay,
        state.step,
        success_threshold=rl_cfg.replay_success_threshold,
    )
    if rl_cfg.replay_inject:
      r = replay_stages.injected_mask(r)
    if rl_cfg.sil_coef > 0:
      r = replay_stages.sil_sample(
          r, state.replay, key, batch_size=rl_cfg.sil_batch_size
      )
    return replay_stages.replay_size(r)

  def collect(state: types.TrainState, first_traj=None):
    key = jax.random.fold_in(state.rng, state.step)
    # With LoRA: the policy's frozen base plus the reference's adapters.
    ref_params = lora_lib.reference_params(state.params, state.ref_params)
    r = sample_batch(state, key, first_traj)
    # The environment's reward (rl.rewards composed), before the overlong
    # policy, shaping, replay, KL-in-reward and the advantage stage change it.
    r = r.with_info(env_reward=jnp.mean(r.reward))
    # Stage 2: the loss mask and the overlong policy.
    r = shaping_stages.policy_mask(
        r,
        exclude_tool_free=num_free > 0 and not rl_cfg.dual_path_train_tool_free,
    )
    r = shaping_stages.overlong(
        r,
        mode=rl_cfg.overlong_mode,
        overlong_reward=rl_cfg.overlong_reward,
    )
    r = shaping_terms(r, state, ref_params)
    r = replay_stage(state, key, r)
    # The columns the update's loss reads (its length bucket's choice).
    r = logprob_stages.loss_length(r, with_obs=rl_cfg.obs_prediction_coef > 0)
    # Stage 5: the reference log-probs and the KL-in-reward penalty (no
    # gradient, estimated on the behaviour samples).
    r = logprob_stages.reference_logprobs(
        r,
        ref_params,
        config=config,
        graphdef=graphdef,
        update_lengths=update_lengths,
    )
    if rl_cfg.kl_reward_coef > 0:
      r = logprob_stages.kl_in_reward(
          r, coef=rl_cfg.kl_reward_coef, estimator=rl_cfg.kl_estimator
      )
    # Stage 6: the behaviour log-probs of the importance ratio (and V_old).
    if trainer_beh:
      r = logprob_stages.trainer_behaviour(
          r,
          state.params,
          config=config,
          graphdef=graphdef,
          update_lengths=update_lengths,
          with_values=with_values,
          banned_tokens=rollout.tool_call_tokens(env) if num_free > 0 else None,
      )
    else:
      r = logprob_stages.sampler_behaviour(r)
      if with_values:
        r = logprob_stages.behaviour_values(
            r, state.params, config=config, graphdef=graphdef
        )
    # Stage 7: the advantages ('gae', or the estimator tables).
    if rl_cfg.advantage_estimator == "gae":
      r = advantage_stages.gae_advantages(r, rl_cfg=rl_cfg)
    else:
      if step_reward_on(rl_cfg):
        r = advantage_stages.step_reward_diagnostics(
            r, rl_cfg=rl_cfg, max_turns=max_turns
        )
      r = advantage_stages.advantages(
          r, rl_cfg=rl_cfg, max_turns=max_turns, value_targets=with_values
      )
    # Stage 8: the learner batch.
    batch = pack_stages.pack(
        r,
        state.params,
        key,
        graphdef=graphdef,
        flowrl=rl_cfg.loss_type == "flowrl",
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
