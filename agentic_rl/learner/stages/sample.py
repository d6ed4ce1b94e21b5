"""Sampling stages: one rollout round and its per-round scoring.

A round is `rollout_round` (or a trajectory rolled out on the host), then
`rm_score` (with a frozen reward model), `env_reward` and
`soft_overlong_penalty` (`rl.overlong_soft_cache` > 0). The collect step runs
one round; `dynamic_sampling` keeps its groups whose outcome varies and
re-runs rounds on fresh keys to fill the batch.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx

from agentic_rl import batch_policies
from agentic_rl import rollout
from agentic_rl import sharding
from agentic_rl import tree_rollout
from agentic_rl import types
from agentic_rl.reward_models import frozen as rm_frozen
from agentic_rl.learner.batch import Rollout
from agentic_rl.learner.common import policy_mask


def dual_path_tool_free(num_rows: int, group_size: int, num_free: int):
  """[num_rows] bool: the last `num_free` rows of every contiguous group of
  `group_size` are sampled with tool calls disabled (dual-path groups, AKBE /
  EAPO, docs/papers.md); None when num_free is 0."""
  if num_free <= 0:
    return None
  return (jnp.arange(num_rows) % group_size) >= group_size - num_free


def rollout_round(
    round_key: jax.Array,
    params: Any,
    *,
    env,
    graphdef: nnx.GraphDef,
    model_config,
    num_groups: int,
    group_size: int,
    max_len: int,
    temperature: float,
    tree_branching: tuple[int, ...] = (),
    num_tool_free: int = 0,
    shared_prefix=None,
) -> types.Trajectory:
  """Rolls out `num_groups` groups of `group_size` episodes with the policy.

  `round_key` is split into a task key (`env.sample_tasks`) and a sampling
  key. Without `tree_branching`, each task is repeated `group_size` times
  contiguously (group = task index, `rollout.rollout`), the last
  `num_tool_free` rows of each group sampled with tool calls disabled
  (`dual_path_tool_free`); with it, each group is one task's PORTool tree of
  `group_size` leaves (`tree_rollout.tree_rollout`).

  Args:
    round_key: PRNG key of the round.
    params: the policy's sampling parameters.
    env: the JAX-native environment.
    graphdef, model_config: the policy's graph and config.
    num_groups: tasks sampled (static).
    group_size: episodes per task (static).
    max_len: tokens per episode L (static).
    temperature: sampling temperature.
    tree_branching: the tree's branching factors; () rolls out flat groups.
    num_tool_free: dual-path tool-free rows per group (0: off).
    shared_prefix: optional `transformer.SharedPrefix` (flat groups only):
      the prompts' first `length` tokens are prefilled once per group
      (`rollout.init_state`).

  Returns:
    The Trajectory of B = num_groups * group_size rows, group-major.
  """
  task_key, sample_key = jax.random.split(round_key)
  if tree_branching:
    tasks = env.sample_tasks(task_key, num_groups)
    # PORTool tree: each group is one task's tree of group_size leaves.
    return tree_rollout.tree_rollout(
        env,
        tasks,
        sample_key,
        max_len=max_len,
        branching=tree_branching,
        graphdef=graphdef,
        params=params,
        model_config=model_config,
        temperature=temperature,
    )
  tasks = env.sample_tasks(task_key, num_groups)
  tasks = sharding.constrain_batch(
      jax.tree.map(lambda x: jnp.repeat(x, group_size, axis=0), tasks)
  )
  group = jnp.repeat(jnp.arange(num_groups, dtype=jnp.int32), group_size)
  return rollout.rollout(
      env,
      tasks,
      sample_key,
      max_len=max_len,
      group=group,
      graphdef=graphdef,
      params=params,
      model_config=model_config,
      temperature=temperature,
      tool_free=dual_path_tool_free(
          num_groups * group_size, group_size, num_tool_free
      ),
      shared_prefix=shared_prefix,
  )


def rm_score(
    traj: types.Trajectory,
    rm_params: Any,
    *,
    reward_model: rm_frozen.FrozenRewardModel,
    max_turns: int,
) -> types.Trajectory:
  """Scores a round with the frozen learned reward model, in one pass.

  Args:
    traj: the round's trajectory ([B, L] tokens, role, turn).
    rm_params: the reward model's parameters (`TrainState.reward_model`).
    reward_model: the frozen reward model
      (`reward_models.frozen.trajectory_rm_outputs`).
    max_turns: K (static).

  Returns:
    traj with facts 'rm_score' [B] float32 (read by the `rm` reward
    component), 'rm_potential' [B, K + 1] float32 (the PBRS potential 'rm')
    and, for a process reward model, 'rm_step_score' [B, K] float32.
  """
  rm_out = rm_frozen.trajectory_rm_outputs(
      reward_model,
      rm_params,
      traj.tokens,
      traj.role,
      traj.turn,
      max_turns,
  )
  facts = dict(
      traj.facts,
      rm_score=rm_out["score"],
      rm_potential=rm_out["potential"],
  )
  if "step_score" in rm_out:  # a PRM: per-turn scores
    facts["rm_step_score"] = rm_out["step_score"]
  return traj.replace(facts=facts)


def env_reward(
    traj: types.Trajectory,
    step: jax.Array,
    noise_key: jax.Array,
    *,
    reward_fn: Callable[..., tuple[jax.Array, dict[str, jax.Array]]],
    sft_steps: int,
) -> Rollout:
  """The environment's reward of a round: a new Rollout.

  Reward schedules run on the RL step index, step - sft_steps (0 at the first
  RL iteration).

  Args:
    traj: the round's trajectory (facts read by the reward components).
    step: [] int32 training step (`TrainState.step`).
    noise_key: PRNG key of the reward noise (`rl.reward_noise`).
    reward_fn: `rewards.factory.reward_fn_from_config(config.rl)`.
    sft_steps: `sft.steps`.

  Returns:
    Rollout(traj, reward [B] float32, parts {name: [B] float32}, info {}).
  """
  reward, parts = reward_fn(traj, step - sft_steps, noise_key)
  return Rollout(traj=traj, reward=reward, parts=parts, info={})


def _soft_penalty(traj: types.Trajectory, soft_max: int, cache: int):
  """[B] float32 DAPO soft overlong penalty on each row's POLICY tokens."""
  return batch_policies.soft_overlong_penalty(
      jnp.sum(policy_mask(traj), axis=1), soft_max, cache
  )


def soft_overlong_penalty(r: Rollout, *, soft_max: int, cache: int) -> Rollout:
  """DAPO's soft overlong punishment added to the reward, per round.

  The penalty (`batch_policies.soft_overlong_penalty`) reads each episode's
  POLICY token count; it is applied to every round before dynamic sampling
  selects groups (the selection reads the penalised reward). The reward
  before it is kept per row in `env_reward` (logged as rl/env_reward).

  Args:
    r: the round's Rollout (traj, reward [B] float32: the environment's).
    soft_max: `rl.overlong_soft_max`, L_max.
    cache: `rl.overlong_soft_cache`, L_cache (> 0).

  Returns:
    r with reward + penalty ([B] float32, penalty in [-1, 0]) and env_reward
    = r.reward ([B] float32, the reward before the penalty).

  Raises:
    ValueError: cache outside (0, soft_max].
  """
  return r.replace(
      reward=r.reward + _soft_penalty(r.traj, soft_max, cache),
      env_reward=r.reward,
  )


def group_metric(
    traj: types.Trajectory,
    reward: jax.Array,
    *,
    metric: str,
    group_size: int,
) -> jax.Array:
  """[G, group_size] float32 per-episode metric of dynamic sampling.

  Args:
    traj: the round's trajectory (facts 'correct' for metric 'correct').
    reward: [B] float32 the round's reward.
    metric: `rl.dynamic_sampling_metric`: 'reward', else the facts
      'correct' as float32.
    group_size: K (static); B = G * K rows, group-major.
  """
  metric_b = (
      reward
      if metric == "reward"
      else traj.facts["correct"].astype(jnp.float32)
  )
  return metric_b.reshape(-1, group_size)


def dynamic_sampling(
    r: Rollout,
    key: jax.Array,
    round_fn: Callable[[jax.Array, jax.Array], Rollout],
    *,
    num_tasks: int,
    group_size: int,
    metric: str,
    max_retries: int,
) -> Rollout:
  """DAPO dynamic sampling: keep num_tasks groups whose metric varies.

  Keeps the first num_tasks groups of the oversampled round `r` whose
  `group_metric` is not constant (`batch_policies.select_groups`; constant
  groups fill the rest). With `max_retries` > 0, fresh rounds fill the
  remaining slots (`batch_policies.refill_groups`) until the batch is full,
  at most max_retries more rounds: retry round i (1, 2, ...) runs
  round_fn(fold_in(k_i, 1), fold_in(k_i, 2)) with k_i = fold_in(fold_in(key,
  3), i). The kept rows' groups are renumbered 0 .. num_tasks - 1. The
  per-row arrays traj, reward, parts and env_reward (when set: the reward
  before the soft overlong penalty) keep the same rows; the selection reads
  reward.

  Args:
    r: the first round's Rollout (traj, reward [B] float32, parts, env_reward
      [B] float32 or None) of G >= num_tasks groups of group_size rows,
      group-major.
    key: the iteration's PRNG key, fold_in(rng, step).
    round_fn: (rollout_key, noise_key) -> Rollout of a fresh round with
      the first round's fields and shapes (traced inside a while_loop).
    num_tasks: groups kept (static).
    group_size: K (static).
    metric: `rl.dynamic_sampling_metric` ('reward' or 'correct').
    max_retries: `rl.dynamic_sampling_max_retries` (static).

  Returns:
    Rollout of num_tasks * group_size rows with any_usable ([] bool: at least
    one kept group varies) and info usable_groups (share of kept groups that
    vary) and dynamic_sampling_rounds (rounds run), float32 scalars.

  Raises:
    ValueError: num_tasks > G.
  """
  # The per-row arrays of a round; env_reward None (an empty subtree) when
  # the soft overlong penalty is off.
  rows_of = lambda x: (x.traj, x.reward, x.parts, x.env_reward)
  traj, reward = r.traj, r.reward
  metric_gk = lambda t, rew: group_metric(
      t, rew, metric=metric, group_size=group_size
  )
  keep, usable = batch_policies.select_groups(
      metric_gk(traj, reward), num_tasks
  )
  kept = batch_policies.gather_groups(rows_of(r), keep, group_size)
  filled = jnp.sum(usable.astype(jnp.int32))
  rounds = jnp.int32(1)
  if max_retries > 0:
    retry_key = jax.random.fold_in(key, 3)

    def retry_cond(carry):
      _, filled, i = carry
      return (filled < num_tasks) & (i <= max_retries)

    def retry_body(carry):
      kept, filled, i = carry
      round_key = jax.random.fold_in(retry_key, i)
      new = round_fn(
          jax.random.fold_in(round_key, 1),
          jax.random.fold_in(round_key, 2),
      )
      new = rows_of(new)
      kept, filled = batch_policies.refill_groups(
          kept, filled, new, metric_gk(new[0], new[1]), group_size
      )
      return kept, filled, i + 1

    kept, filled, rounds = jax.lax.while_loop(
        retry_cond, retry_body, (kept, filled, rounds)
    )
  traj, reward, parts, env_reward = kept
  traj = traj.replace(
      group=jnp.repeat(jnp.arange(num_tasks, dtype=jnp.int32), group_size)
  )
  info = {
      "usable_groups": filled.astype(jnp.float32) / num_tasks,
      "dynamic_sampling_rounds": rounds.astype(jnp.float32),
  }
  return Rollout(
      traj=traj,
      reward=reward,
      parts=parts,
      info={**r.info, **info},
      any_usable=filled > 0,
      env_reward=env_reward,
  )


def env_reward_info(
    r: Rollout, *, soft_max: int = 0, cache: int = 0
) -> Rollout:
  """Adds the environment's reward to r.info (logged rl/env_reward), before
  the soft overlong penalty, the overlong policy, shaping, replay,
  KL-in-reward and the advantages change it (rl/shaped_reward, alias
  rl/reward, is the reward after them).

  With DAPO's soft overlong penalty (`rl.overlong_soft_cache` > 0), which
  `soft_overlong_penalty` adds to every round before dynamic sampling selects
  the groups, the environment's reward is r.env_reward (the kept rows' reward
  before the penalty), and the penalty's mean over the batch is logged as
  rl/overlong_soft_penalty (recomputed from the kept rows' POLICY token
  counts: the same values that were added).

  Args:
    r: the sampled Rollout (reward [B] float32: `rl.rewards` composed, with
      the soft overlong penalty when it is on; env_reward [B] float32, the
      reward before it, or None when it is off).
    soft_max: `rl.overlong_soft_max`, L_max (read when cache > 0).
    cache: `rl.overlong_soft_cache`, L_cache; 0: the penalty is off.

  Returns:
    r with info env_reward ([] float32, the batch mean) and, when cache > 0,
    overlong_soft_penalty ([] float32, the batch mean of the penalty).

  Raises:
    ValueError: cache > 0 and r.env_reward is None (the penalty is on but
      `soft_overlong_penalty` did not run).
  """
  if cache > 0 and r.env_reward is None:
    raise ValueError(
        "env_reward_info: the soft overlong penalty is on (cache > 0) but "
        "r.env_reward is None"
    )
  env = r.reward if r.env_reward is None else r.env_reward
  info = {"env_reward": jnp.mean(env)}
  if cache > 0:
    info["overlong_soft_penalty"] = jnp.mean(
        _soft_penalty(r.traj, soft_max, cache)
    )
  return r.with_info(**info)
