"""The collect chain of a config, built once (like `optax.chain`).

`build_stages(config, ...)` reads the config once and returns the stages of
one RL iteration's collect step, in order, as named functions
`stage(r, ctx) -> Rollout` (`StageContext`: the iteration's key, step,
parameters, reference parameters, frozen-RM parameters, feature states and
a host rollout). A feature that is off has no stage: no branch on the
config is left at run time. Each entry binds a top-level stage function of
`stages/` to the context's arrays and the config's static settings. The first
stage (`sample`) starts the Rollout: its input is None. `chain` runs them.

The order is the traced program's (results stay bit-identical with the
collect step before the stages were lifted): each shared model pass runs
just before its first reader (the gold-answer pass before the likelihood
reward or a 'trace' potential; the observation pass before an
'obs_prediction' potential, else before the dark-room diagnostics), the
reward is rewritten in the order env reward -> soft overlong (per round) ->
overlong mode -> likelihood -> dual penalty -> replay injection ->
KL-in-reward -> telescoped PBRS.
"""

from __future__ import annotations

from typing import Callable

import jax

from agentic_rl import estimators
from agentic_rl import rollout
from agentic_rl.learner.batch import Rollout, StageContext
from agentic_rl.learner.potentials_by_name import PotentialContext
from agentic_rl.learner.stages import advantages as advantage_stages
from agentic_rl.learner.stages import logprobs as logprob_stages
from agentic_rl.learner.stages import replay as replay_stages
from agentic_rl.learner import common
from agentic_rl.learner.stages import sample as sample_stages
from agentic_rl.learner.stages import shaping as shaping_stages
from agentic_rl.learner import token_credit
from agentic_rl.learner.update import uses_values
from agentic_rl.rewards import factory

Stage = Callable[[Rollout | None, StageContext], Rollout]


def _named(name: str, fn: Stage) -> Stage:
  """fn with __name__ = name (the stage's name in `build_stages`' list)."""
  fn.__name__ = name
  fn.__qualname__ = name
  return fn


def chain(*stages: Stage) -> Stage:
  """One stage that runs `stages` in order (the first may receive None)."""

  def run(r: Rollout | None, ctx: StageContext) -> Rollout:
    for stage in stages:
      r = stage(r, ctx)
    return r

  return run


def build_stages(
    config,
    env,
    graphdef,
    model_config,
    reward_model=None,
    update_lengths: tuple | None = None,
    seed_axis_name: str | None = None,
) -> tuple[Stage, ...]:
  """The collect stages of `config`, in the order they run.

  Args:
    config: the experiment config (`rl`, `sft.steps`, `max_len`; read once).
    env: the environment (max_turns; its tool-call tokens with dual path).
    graphdef: the policy's graph.
    model_config: the policy's `TransformerConfig` (the rollout).
    reward_model: the frozen reward model (`rl.reward_model_dir`), or None;
      its parameters are ctx.reward_model.
    update_lengths: the update's length buckets (`padding.update_lengths`),
      or None.
    seed_axis_name: the `jax.vmap` axis of vmapped seeds, or None; with
      update_lengths the loss length is maximised over it.

  Returns:
    The stages, each named by its function (`stage.__name__`): 'sample',
    'env_reward_info', 'policy_mask', 'overlong', then the shaping, replay,
    log-prob, behaviour and advantage stages the config turns on. Read
    ctx.features['replay'] (the buffer at the start of the iteration),
    ['dual'] (the dual-ascent multiplier) and ['spa'] (the SPA head).
  """
  rl_cfg = config.rl
  group_size = rl_cfg.group_size
  num_tasks = rl_cfg.batch_size // group_size
  max_turns = env.max_turns
  temperature = rl_cfg.temperature
  reward_fn = factory.reward_fn_from_config(config.rl)
  sft_steps = config.sft.steps
  over = rl_cfg.dynamic_sampling_oversample
  num_sampled = num_tasks * over
  tree_branching = tuple(rl_cfg.tree_branching)
  num_free = rl_cfg.dual_path_tool_free  # dual-path tool-free rows per group
  with_values = uses_values(rl_cfg)
  pbrs = rl_cfg.pbrs_coef > 0
  # The shared passes of the shaping terms, and who reads them.
  needs_gold = rl_cfg.likelihood_coef > 0 or (
      pbrs and rl_cfg.pbrs_potential == "trace"
  )
  potential_reads_obs = pbrs and rl_cfg.pbrs_potential == "obs_prediction"
  log_obs_prediction = (
      rl_cfg.obs_prediction_coef > 0
      or rl_cfg.log_obs_prediction
      or potential_reads_obs
  )

  def sample_round(ctx, round_key, noise_key, traj=None) -> Rollout:
    """One round of num_sampled groups: rollout (unless traj, a host
    rollout of the same keys), frozen-RM scores, env reward, soft overlong."""
    if traj is None:
      traj = sample_stages.rollout_round(
          round_key,
          ctx.params,
          env=env,
          graphdef=graphdef,
          model_config=model_config,
          num_groups=num_sampled,
          group_size=group_size,
          max_len=config.max_len,
          temperature=temperature,
          tree_branching=tree_branching,
          num_tool_free=num_free,
          shared_prefix=common.rollout_shared_prefix(rl_cfg),
      )
    if reward_model is not None:
      # Frozen learned RM: episode score and per-state potentials, one pass.
      traj = sample_stages.rm_score(
          traj,
          ctx.reward_model,
          reward_model=reward_model,
          max_turns=max_turns,
      )
    r = sample_stages.env_reward(
        traj, ctx.step, noise_key, reward_fn=reward_fn, sft_steps=sft_steps
    )
    if rl_cfg.overlong_soft_cache > 0:
      r = sample_stages.soft_overlong_penalty(
          r,
          soft_max=rl_cfg.overlong_soft_max,
          cache=rl_cfg.overlong_soft_cache,
      )
    return r

  def sample(r, ctx):
    """Round 1 on fold_in(key, 1) (noise fold_in(key, 2)), then DAPO dynamic
    sampling (`rl.dynamic_sampling_oversample` > 1)."""
    del r  # the first stage starts the Rollout
    first = sample_round(
        ctx,
        jax.random.fold_in(ctx.key, 1),
        jax.random.fold_in(ctx.key, 2),
        traj=ctx.first_traj,
    )
    if over <= 1:
      return first
    return sample_stages.dynamic_sampling(
        first,
        ctx.key,
        lambda round_key, noise_key: sample_round(ctx, round_key, noise_key),
        num_tasks=num_tasks,
        group_size=group_size,
        metric=rl_cfg.dynamic_sampling_metric,
        max_retries=rl_cfg.dynamic_sampling_max_retries,
    )

  stages = [
      _named("sample", sample),
      _named(
          "env_reward_info",
          lambda r, ctx: sample_stages.env_reward_info(
              r,
              soft_max=rl_cfg.overlong_soft_max,
              cache=rl_cfg.overlong_soft_cache,
          ),
      ),
      _named(
          "policy_mask",
          lambda r, ctx: shaping_stages.policy_mask(
              r,
              exclude_tool_free=num_free > 0
              and not rl_cfg.dual_path_train_tool_free,
          ),
      ),
      _named(
          "overlong",
          lambda r, ctx: shaping_stages.overlong(
              r,
              mode=rl_cfg.overlong_mode,
              overlong_reward=rl_cfg.overlong_reward,
          ),
      ),
  ]
  add = lambda name, fn: stages.append(_named(name, fn))

  # Shaping terms: each shared pass just before its first reader.
  observation_scores = lambda r, ctx: shaping_stages.observation_scores(
      r, ctx.params, graphdef=graphdef, temperature=temperature
  )
  if needs_gold:
    add(
        "gold_logprobs",
        lambda r, ctx: shaping_stages.gold_logprobs(
            r,
            ctx.ref_params,
            graphdef=graphdef,
            temperature=temperature,
            max_turns=max_turns,
        ),
    )
  if rl_cfg.likelihood_coef > 0:
    add(
        "likelihood_reward",
        lambda r, ctx: shaping_stages.likelihood_reward(
            r, coef=rl_cfg.likelihood_coef
        ),
    )
  if potential_reads_obs:
    add("observation_scores", observation_scores)
  if pbrs:
    add(
        "potential",
        lambda r, ctx: shaping_stages.potential(
            r,
            PotentialContext(
                graphdef=graphdef,
                params=ctx.params,
                spa=ctx.features.get("spa"),
                max_turns=max_turns,
            ),
            name=rl_cfg.pbrs_potential,
        ),
    )
  if log_obs_prediction:
    if not potential_reads_obs:
      add("observation_scores", observation_scores)
    add(
        "obs_prediction_diagnostics",
        lambda r, ctx: shaping_stages.obs_prediction_diagnostics(r),
    )
  if rl_cfg.dense_as == "aux_loss" and pbrs:
    add(
        "dense_aux_advantage",
        lambda r, ctx: shaping_stages.dense_aux_advantage(
            r, rl_cfg=rl_cfg, max_turns=max_turns
        ),
    )
  if rl_cfg.dual_constraint:
    add(
        "dual_penalty",
        lambda r, ctx: shaping_stages.dual_penalty(
            r,
            ctx.features["dual"],
            fact=rl_cfg.dual_constraint,
            sense=rl_cfg.dual_sense,
        ),
    )

  # Replay buffer: injection, insertion, SIL samples.
  if rl_cfg.replay_capacity <= 0:
    add("train_rows", lambda r, ctx: replay_stages.train_rows(r))
  else:
    add("replay_fresh", lambda r, ctx: replay_stages.replay_fresh(r))
    if rl_cfg.replay_inject:
      add(
          "replay_inject",
          lambda r, ctx: replay_stages.replay_inject(
              r,
              ctx.features["replay"],
              group_size=group_size,
              success_threshold=rl_cfg.replay_success_threshold,
          ),
      )
    add(
        "replay_store",
        lambda r, ctx: replay_stages.replay_store(
            r,
            ctx.features["replay"],
            ctx.step,
            success_threshold=rl_cfg.replay_success_threshold,
        ),
    )
    if rl_cfg.replay_inject:
      add("injected_mask", lambda r, ctx: replay_stages.injected_mask(r))
    if rl_cfg.sil_coef > 0:
      add(
          "sil_sample",
          lambda r, ctx: replay_stages.sil_sample(
              r,
              ctx.features["replay"],
              ctx.key,
              batch_size=rl_cfg.sil_batch_size,
          ),
      )
    add("replay_size", lambda r, ctx: replay_stages.replay_size(r))

  # The loss length, the reference log-probs, KL-in-reward.
  add(
      "loss_length",
      lambda r, ctx: logprob_stages.loss_length(
          r,
          with_obs=rl_cfg.obs_prediction_coef > 0,
          axis_name=seed_axis_name if update_lengths is not None else None,
      ),
  )
  add(
      "reference_logprobs",
      lambda r, ctx: logprob_stages.reference_logprobs(
          r,
          ctx.ref_params,
          config=config,
          graphdef=graphdef,
          update_lengths=update_lengths,
      ),
  )
  if rl_cfg.kl_reward_coef > 0:
    add(
        "kl_in_reward",
        lambda r, ctx: logprob_stages.kl_in_reward(
            r, coef=rl_cfg.kl_reward_coef, estimator=rl_cfg.kl_estimator
        ),
    )

  # The behaviour log-probs of the importance ratio (and V_old).
  if rl_cfg.behaviour_logprobs == "trainer":
    banned = rollout.tool_call_tokens(env) if num_free > 0 else None
    add(
        "trainer_behaviour",
        lambda r, ctx: logprob_stages.trainer_behaviour(
            r,
            ctx.params,
            config=config,
            graphdef=graphdef,
            update_lengths=update_lengths,
            with_values=with_values,
            banned_tokens=banned,
        ),
    )
  else:
    add("sampler_behaviour", lambda r, ctx: logprob_stages.sampler_behaviour(r))
    if with_values:
      add(
          "behaviour_values",
          lambda r, ctx: logprob_stages.behaviour_values(
              r, ctx.params, config=config, graphdef=graphdef
          ),
      )

  # The advantages (the estimator table's entry of the config).
  entry = estimators.ESTIMATORS.get(token_credit.estimator_name(rl_cfg))
  if entry is not None and entry.level == "token":
    add(
        "gae_advantages",
        lambda r, ctx: advantage_stages.gae_advantages(r, rl_cfg=rl_cfg),
    )
  else:
    if token_credit.step_reward_on(rl_cfg):
      add(
          "step_reward_diagnostics",
          lambda r, ctx: advantage_stages.step_reward_diagnostics(
              r, rl_cfg=rl_cfg, max_turns=max_turns
          ),
      )
    add(
        "advantages",
        lambda r, ctx: advantage_stages.advantages(
            r, rl_cfg=rl_cfg, max_turns=max_turns, value_targets=with_values
        ),
    )
  return tuple(stages)
