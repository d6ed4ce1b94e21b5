"""Per-task replay buffer of successful episodes (RAPO / SPEAR style).

A fixed-capacity pytree of arrays (static shapes, checkpointable as
`TrainState.features['replay']`), holding at most one episode per task: the
latest successful episode seen for that task. Tasks are identified by a hash
of their prompt tokens (`task_keys`), so the buffer works for any environment
whose prompt determines the task.

Two uses (agentic_rl/learner/):

* RAPO-style per-prompt replay (Fathom-DeepResearch; docs/papers.md, arXiv
  id not given there): a group of fresh episodes with no success whose task
  has a buffered success gets that episode in place of its last row; its
  advantage is then computed against the current group like any other row
  (advantage recalibration against the current group, SPEAR arXiv:2509.22601).
* SPEAR self-imitation (Qin et al., arXiv:2509.22601; classic SIL, Oh et al.,
  arXiv:1806.05635): L_SIL = -sum m_t (R - b)_+ log pi(a_t | s_t) / sum m_t
  over episodes drawn from the buffer (`losses.self_imitation_loss`), with the
  baseline b recomputed from the current batch (`sil_baselines`).
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from agentic_rl import types


def init(capacity: int, max_len: int) -> types.ReplayBuffer:
  """Empty buffer of `capacity` slots of `max_len` tokens.

  Raises:
    ValueError: capacity or max_len < 1.
  """
  if capacity < 1 or max_len < 1:
    raise ValueError(f"capacity={capacity} and max_len={max_len} must be >= 1")
  s, l = capacity, max_len
  return types.ReplayBuffer(
      key=jnp.zeros((s,), jnp.uint32),
      valid=jnp.zeros((s,), bool),
      tokens=jnp.zeros((s, l), jnp.int32),
      role=jnp.full((s, l), types.PAD, jnp.int8),
      logprob=jnp.zeros((s, l), jnp.float32),
      turn=jnp.full((s, l), -1, jnp.int32),
      reward=jnp.zeros((s,), jnp.float32),
      step=jnp.full((s,), -1, jnp.int32),
  )


def task_keys(tokens_bl: jax.Array, role_bl: jax.Array) -> jax.Array:
  """[B] uint32 FNV-1a hash of each row's PROMPT tokens (other roles ignored).

  Two episodes of the same task (same prompt) get the same key; different
  prompts collide with probability ~2^-32 per pair (a collision makes one
  task's episode count as another's).

  Args:
    tokens_bl: [B, L] int32 tokens.
    role_bl: [B, L] int8 roles.

  Returns:
    [B] uint32 keys.
  """
  chex.assert_rank([tokens_bl, role_bl], 2)
  prompt_bl = role_bl == types.PROMPT
  # Position-tagged token ids, so that PROMPT tokens hash in order.
  tok = jnp.where(prompt_bl, tokens_bl.astype(jnp.uint32) + 1, 0).astype(
      jnp.uint32
  )

  def step(h_b, t_b):
    h_new = (h_b ^ t_b) * jnp.uint32(16777619)
    return jnp.where(t_b != 0, h_new, h_b), None

  h0 = jnp.full(tokens_bl.shape[:1], 2166136261, jnp.uint32)
  h, _ = jax.lax.scan(step, h0, tok.T)
  return h


def insert(
    buf: types.ReplayBuffer,
    key_b: jax.Array,
    tokens_bl: jax.Array,
    role_bl: jax.Array,
    logprob_bl: jax.Array,
    reward_b: jax.Array,
    success_b: jax.Array,
    step: jax.Array,
    turn_bl: jax.Array,
) -> types.ReplayBuffer:
  """Stores each successful row: in its task's slot if the task is present
  (the newer episode replaces the older), else in an empty slot, else in the
  slot stored longest ago (lowest `step`, then lowest index). Rows are
  processed in order, so of several successes of one task the last is kept.

  Args:
    buf: the buffer (S slots).
    key_b: [B] uint32 task keys.
    tokens_bl, role_bl, logprob_bl: [B, L] episode arrays.
    reward_b: [B] float32 rewards.
    success_b: [B] bool, rows to store.
    step: int32 scalar, the current training step.
    turn_bl: [B, L] int32 turn indices of the episodes.

  Returns:
    The updated buffer.
  """
  chex.assert_rank([key_b, reward_b, success_b], 1)

  def body(b, row):
    key, tokens, role, logprob, turn, reward, ok = row
    same = b.valid & (b.key == key)
    # Priority: the task's own slot, then empty slots, then the oldest.
    age = jnp.where(b.valid, b.step, jnp.iinfo(jnp.int32).min)
    slot = jnp.where(jnp.any(same), jnp.argmax(same), jnp.argmin(age))

    def put(field, value):
      return field.at[slot].set(jnp.where(ok, value, field[slot]))

    return (
        b.replace(
            key=put(b.key, key),
            valid=put(b.valid, True),
            tokens=put(b.tokens, tokens),
            role=put(b.role, role),
            logprob=put(b.logprob, logprob),
            turn=put(b.turn, turn),
            reward=put(b.reward, reward),
            step=put(b.step, jnp.asarray(step, jnp.int32)),
        ),
        None,
    )

  rows = (
      key_b.astype(jnp.uint32),
      tokens_bl.astype(jnp.int32),
      role_bl.astype(jnp.int8),
      logprob_bl.astype(jnp.float32),
      turn_bl.astype(jnp.int32),
      reward_b.astype(jnp.float32),
      success_b.astype(bool),
  )
  buf, _ = jax.lax.scan(body, buf, rows)
  return buf


def lookup(
    buf: types.ReplayBuffer, key_b: jax.Array
) -> tuple[jax.Array, jax.Array]:
  """(slot [B] int32, found [B] bool): each key's slot in the buffer."""
  same_bs = buf.valid[None, :] & (buf.key[None, :] == key_b[:, None])
  return jnp.argmax(same_bs, axis=1).astype(jnp.int32), jnp.any(same_bs, axis=1)


def inject_into_failed_groups(
    buf: types.ReplayBuffer,
    tokens_bl: jax.Array,
    role_bl: jax.Array,
    logprob_bl: jax.Array,
    turn_bl: jax.Array,
    reward_b: jax.Array,
    group_size: int,
    success_threshold: float,
):
  """RAPO-style per-prompt replay: a buffered success joins its failed group.

  For every group (rows group-major, K = group_size) in which no row reached
  `success_threshold` and whose task has a buffered episode, the group's last
  row is replaced by the buffered episode (tokens, roles, behaviour log-probs,
  turn indices, reward). Its advantage is then computed against the current group
  (SPEAR's recalibration, arXiv:2509.22601; the replacement rule is the
  inferred RAPO per-prompt replay, docs/papers.md).

  Args:
    buf: the buffer.
    tokens_bl, role_bl, logprob_bl, turn_bl: [B, L] batch arrays, B = G * K.
    reward_b: [B] float32 rewards.
    group_size: K (static).
    success_threshold: reward counting as a success.

  Returns:
    (tokens, role, logprob, turn, reward, injected_b [B] bool).
  """
  b = reward_b.shape[0]
  keys_b = task_keys(tokens_bl, role_bl)
  slot_b, found_b = lookup(buf, keys_b)
  success_gk = (reward_b >= success_threshold).reshape(-1, group_size)
  failed_b = jnp.repeat(~jnp.any(success_gk, axis=1), group_size)
  last_b = (jnp.arange(b) % group_size) == group_size - 1
  inj_b = failed_b & last_b & found_b

  def pick(batch, stored):
    new = stored[slot_b]
    m = inj_b.reshape(inj_b.shape + (1,) * (batch.ndim - 1))
    return jnp.where(m, new.astype(batch.dtype), batch)

  return (
      pick(tokens_bl, buf.tokens),
      pick(role_bl, buf.role),
      pick(logprob_bl, buf.logprob),
      pick(turn_bl, buf.turn),
      pick(reward_b, buf.reward),
      inj_b,
  )


def sample_slots(
    buf: types.ReplayBuffer, rng: jax.Array, num: int
) -> jax.Array:
  """[num] int32 slots drawn uniformly (with replacement) among valid ones;
  arbitrary (and to be masked by `buf.valid`) when the buffer is empty."""
  logits = jnp.where(buf.valid, 0.0, -jnp.inf)
  logits = jnp.where(jnp.any(buf.valid), logits, 0.0)
  return jax.random.categorical(rng, logits, shape=(num,)).astype(jnp.int32)


def sil_baselines(
    slot_key_m: jax.Array,
    batch_key_b: jax.Array,
    batch_reward_b: jax.Array,
) -> jax.Array:
  """Current-policy baselines b for replayed episodes (SPEAR recalibration).

  b_m = mean reward of the current batch's episodes of the same task, when
  the task is in the batch; otherwise the mean reward of the whole current
  batch. SPEAR (arXiv:2509.22601) recalibrates buffered advantages against
  the current policy to account for drift (from the abstract). Our reading
  of the abstract (docs/papers.md) infers A = R_buf - mean of the
  current group's R, which is the per-task rule here; the whole-batch
  fallback for tasks absent from the batch is our choice. Neither is taken
  from the paper's equations.

  Args:
    slot_key_m: [M] uint32 task keys of the replayed episodes.
    batch_key_b: [B] uint32 task keys of the current batch.
    batch_reward_b: [B] float rewards of the current batch.

  Returns:
    [M] float32 baselines.
  """
  same_mb = slot_key_m[:, None] == batch_key_b[None, :]
  r = batch_reward_b.astype(jnp.float32)
  count = jnp.sum(same_mb, axis=1)
  task_mean = jnp.sum(jnp.where(same_mb, r[None, :], 0.0), 1) / jnp.maximum(
      count, 1
  )
  return jnp.where(count > 0, task_mean, jnp.mean(r))
