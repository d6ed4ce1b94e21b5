"""Replay-buffer stages: injection, insertion and the self-imitation sample.

With a replay buffer (`rl.replay_capacity` > 0) the collect step runs, in this
order: `replay_fresh` (what the later stages read of the fresh batch before
injection rewrites it), `replay_inject` (`rl.replay_inject`: buffered
successes replace the last row of failed groups), `replay_store` (the fresh
successes go into the buffer), `injected_mask` (`rl.replay_inject`: the
injected rows' loss mask), `sil_sample` (`rl.sil_coef` > 0: SPEAR
self-imitation episodes from the buffer as it was before this batch) and
`replay_size` (a metric). Without a buffer, `train_rows` only sets the
trained rows. Every stage reads the buffer `TrainState.features['replay']`
of the start of the iteration; `replay_store` returns the new one.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from agentic_rl import replay as replay_lib
from agentic_rl import types
from agentic_rl.learner.batch import Rollout, SilSample


def inject_replay(
    buf,
    traj: types.Trajectory,
    reward_b: jax.Array,
    group_size: int,
    success_threshold: float,
):
  """`rl.replay_inject`: buffered successes replace failed groups' last rows.

  The injected rows take the buffered episode's tokens, roles, behaviour
  log-probs, turn indices and reward (`replay.inject_into_failed_groups`),
  and num_turns = 1 + its largest turn index, so per-turn estimators (GiGPO)
  see the injected episode's own turns. Facts and finish stay the replaced
  row's (validation rules out the switches that read them).

  Args:
    buf: the `types.ReplayBuffer`.
    traj: the fresh batch (B = groups * group_size rows, group-major).
    reward_b: [B] float32 rewards of the fresh batch.
    group_size: K (static).
    success_threshold: reward counting as a success.

  Returns:
    (train_traj, reward [B] float32, injected [B] bool).
  """
  tokens, role, logprob, turn, reward, injected = (
      replay_lib.inject_into_failed_groups(
          buf,
          traj.tokens,
          traj.role,
          traj.logprob,
          traj.turn,
          reward_b,
          group_size,
          success_threshold,
      )
  )
  num_turns = jnp.where(injected, jnp.max(turn, axis=1) + 1, traj.num_turns)
  return (
      traj.replace(
          tokens=tokens,
          role=role,
          logprob=logprob,
          turn=turn,
          num_turns=num_turns.astype(traj.num_turns.dtype),
      ),
      reward,
      injected,
  )


def train_rows(r: Rollout) -> Rollout:
  """Sets train_traj = traj: the trained rows are the fresh batch (no buffer).

  Args:
    r: Rollout with traj.

  Returns:
    r with train_traj (the same Trajectory as traj).
  """
  return r.replace(train_traj=r.traj)


def replay_fresh(r: Rollout) -> Rollout:
  """Sets what the replay stages read of the FRESH batch, before
  `replay_inject` rewrites reward and the trained rows.

  Args:
    r: Rollout with traj (tokens [B, L] int32, role [B, L] int8) and reward
      [B] float32.

  Returns:
    r with train_traj = traj, fresh_reward = reward ([B] float32) and
    fresh_keys ([B] uint32 task keys of the fresh rows, `replay.task_keys`;
    read by `sil_sample`).
  """
  traj = r.traj
  return r.replace(
      train_traj=traj,
      fresh_reward=r.reward,
      fresh_keys=replay_lib.task_keys(traj.tokens, traj.role),
  )


def replay_inject(
    r: Rollout,
    buf: types.ReplayBuffer,
    *,
    group_size: int,
    success_threshold: float,
) -> Rollout:
  """`rl.replay_inject`: buffered successes replace the last row of groups
  without a success (`inject_replay`).

  Args:
    r: Rollout with traj (the fresh batch, B = groups * group_size rows,
      group-major), reward [B] float32 and train_traj (`replay_fresh`).
    buf: the buffer at the start of the iteration
      (`TrainState.features['replay']`).
    group_size: `rl.group_size` (static).
    success_threshold: `rl.replay_success_threshold`.

  Returns:
    r with train_traj (the injected rows replaced), reward [B] float32 (the
    injected rows' stored reward) and injected [B] bool.
  """
  train_traj, reward, injected = inject_replay(
      buf, r.traj, r.reward, group_size, success_threshold
  )
  return r.replace(train_traj=train_traj, reward=reward, injected=injected)


def replay_store(
    r: Rollout,
    buf: types.ReplayBuffer,
    step: jax.Array,
    *,
    success_threshold: float,
) -> Rollout:
  """Stores this batch's FRESH successes in the buffer (`replay.insert`).

  The sampled episodes with their own rewards (fresh_reward), never an
  injected row's reward paired with the fresh tokens it replaced (that
  pairing stored a failed episode as a success in its task's slot). The task
  keys are computed here again (not read from fresh_keys), as the collect
  step always did.

  Args:
    r: Rollout with traj (tokens, role, logprob, turn [B, L]) and
      fresh_reward [B] float32 (`replay_fresh`).
    buf: the buffer at the start of the iteration
      (`TrainState.features['replay']`).
    step: [] int32 training step (the insertion time).
    success_threshold: `rl.replay_success_threshold`: a fresh row with
      fresh_reward >= it is stored.

  Returns:
    r with replay, the buffer after the insertion.

  Raises:
    ValueError: fresh_reward is None (`replay_fresh` did not run).
  """
  if r.fresh_reward is None:
    raise ValueError("replay_store reads fresh_reward: run replay_fresh first")
  traj, fresh_reward = r.traj, r.fresh_reward
  new_buf = replay_lib.insert(
      buf,
      replay_lib.task_keys(traj.tokens, traj.role),
      traj.tokens,
      traj.role,
      traj.logprob,
      fresh_reward,
      fresh_reward >= success_threshold,
      step,
      traj.turn,
  )
  return r.replace(replay=new_buf)


def injected_mask(r: Rollout) -> Rollout:
  """The injected rows' loss mask: their own POLICY tokens.

  Args:
    r: Rollout with mask [B, L] bool, injected [B] bool and train_traj
      (`replay_inject`).

  Returns:
    r with mask [B, L] bool and info replay_injected ([] float32, the number
    of injected rows).
  """
  mask = jnp.where(
      r.injected[:, None], r.train_traj.role == types.POLICY, r.mask
  )
  return r.replace(mask=mask).with_info(
      replay_injected=jnp.sum(r.injected.astype(jnp.float32))
  )


def sil_sample(
    r: Rollout, buf: types.ReplayBuffer, key: jax.Array, *, batch_size: int
) -> Rollout:
  """SPEAR self-imitation: `batch_size` episodes drawn from the buffer.

  Slots are drawn uniformly among the valid ones of the buffer as it was at
  the start of the iteration (`replay.sample_slots`, key fold_in(key, 4)).
  Each episode's baseline is the current policy's reward on its task: the
  mean fresh_reward of the fresh rows with the same task key, else of the
  whole batch (`replay.sil_baselines`; never an injected row's reward).

  Args:
    r: Rollout with fresh_keys [B] uint32 and fresh_reward [B] float32
      (`replay_fresh`).
    buf: the buffer at the start of the iteration
      (`TrainState.features['replay']`).
    key: the iteration's PRNG key, fold_in(state.rng, state.step).
    batch_size: `rl.sil_batch_size`, S (static).

  Returns:
    r with sil (`SilSample`: tokens [S, L] int32, mask [S, L] bool, returns
    [S] float32, baseline [S] float32, valid [S] bool).
  """
  slots = replay_lib.sample_slots(buf, jax.random.fold_in(key, 4), batch_size)
  sil = SilSample(
      tokens=buf.tokens[slots],
      mask=buf.role[slots] == types.POLICY,
      returns=buf.reward[slots],
      # The current policy's rewards on the buffered tasks (the fresh
      # rows, not an injected row's buffered reward).
      baseline=replay_lib.sil_baselines(
          buf.key[slots], r.fresh_keys, r.fresh_reward
      ),
      valid=buf.valid[slots],
  )
  return r.replace(sil=sil)


def replay_size(r: Rollout) -> Rollout:
  """Adds the buffer's size after the insertion to r.info.

  Args:
    r: Rollout with replay (`replay_store`).

  Returns:
    r with info replay_size ([] float32, the number of valid slots).
  """
  return r.with_info(replay_size=jnp.sum(r.replay.valid.astype(jnp.float32)))
