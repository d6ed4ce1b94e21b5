"""Per-task replay buffer, RAPO injection, SPEAR self-imitation: hand values."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentic_rl import advantages
from agentic_rl import checkpoint
from agentic_rl import losses
from agentic_rl import replay
from agentic_rl import types

P, Q, T, D = types.PROMPT, types.POLICY, types.TOOL, types.PAD


def _rows(prompts, answers):
  """Rows of 2 PROMPT tokens then 2 POLICY tokens (L = 4)."""
  tokens = jnp.array(
      [list(p) + list(a) for p, a in zip(prompts, answers)], jnp.int32
  )
  role = jnp.array([[P, P, Q, Q]] * len(prompts), jnp.int8)
  return tokens, role


def _turns(n):
  """Turn indices of `_rows`' layout: -1 on the prompt, turn 0 after."""
  return jnp.array([[-1, -1, 0, 0]] * n, jnp.int32)


def test_task_keys_depend_only_on_prompt_tokens_in_order():
  tokens, role = _rows(
      [(5, 6), (5, 6), (6, 5), (5, 7)], [(1, 2), (3, 4), (1, 2), (1, 2)]
  )
  k = np.asarray(replay.task_keys(tokens, role))
  assert k.dtype == np.uint32
  assert k[0] == k[1]  # same prompt, different answers
  assert len({k[0], k[2], k[3]}) == 3  # order matters; other prompt differs


def test_insert_keeps_one_episode_per_task_and_evicts_the_oldest():
  buf = replay.init(2, 4)
  tokens, role = _rows([(5, 6), (5, 6), (7, 7)], [(1, 1), (2, 2), (3, 3)])
  keys = replay.task_keys(tokens, role)
  lp = jnp.full((3, 4), -0.5)
  # Rows 0 and 1 (same task) succeed: the later one is kept. Row 2 fails.
  buf = jax.jit(replay.insert)(
      buf,
      keys,
      tokens,
      role,
      lp,
      jnp.array([1.0, 0.9, 0.0]),
      jnp.array([True, True, False]),
      jnp.int32(3),
      _turns(3),
  )
  np.testing.assert_array_equal(buf.valid, [True, False])
  np.testing.assert_array_equal(buf.tokens[0], [5, 6, 2, 2])
  np.testing.assert_allclose(buf.reward[0], 0.9)
  assert int(buf.step[0]) == 3
  # Task (7, 7) at step 4 takes the empty slot; a third task at step 5
  # evicts the oldest entry (slot 0, stored at step 3).
  buf = replay.insert(
      buf,
      keys[2:],
      tokens[2:],
      role[2:],
      lp[2:],
      jnp.array([1.0]),
      jnp.array([True]),
      jnp.int32(4),
      _turns(1),
  )
  t3, r3 = _rows([(8, 8)], [(4, 4)])
  buf = replay.insert(
      buf,
      replay.task_keys(t3, r3),
      t3,
      r3,
      lp[:1],
      jnp.array([1.0]),
      jnp.array([True]),
      jnp.int32(5),
      _turns(1),
  )
  np.testing.assert_array_equal(buf.tokens[:, 0], [8, 7])
  np.testing.assert_array_equal(buf.step, [5, 4])
  slot, found = replay.lookup(
      buf, jnp.concatenate([replay.task_keys(t3, r3), keys])
  )
  np.testing.assert_array_equal(found, [True, False, False, True])
  assert int(slot[0]) == 0 and int(slot[3]) == 1


def test_injection_replaces_last_row_of_failed_groups_and_recomputes_advantage():
  # Buffer holds a success for task A (prompt 5 6) with reward 1.
  buf = replay.init(3, 4)
  ta, ra = _rows([(5, 6)], [(9, 9)])
  buf = replay.insert(
      buf,
      replay.task_keys(ta, ra),
      ta,
      ra,
      jnp.full((1, 4), -0.25),
      jnp.array([1.0]),
      jnp.array([True]),
      jnp.int32(0),
      _turns(1),
  )
  # Groups of K = 2: g0 = task A, both failed -> last row replaced;
  # g1 = task A with a success -> unchanged; g2 = task B failed, not buffered.
  tokens, role = _rows(
      [(5, 6)] * 4 + [(7, 7)] * 2,
      [(1, 1), (2, 2), (3, 3), (4, 4), (1, 1), (2, 2)],
  )
  reward = jnp.array([0.0, 0.0, 1.0, 0.0, 0.0, 0.0])
  lp = jnp.full((6, 4), -1.0)
  out = jax.jit(replay.inject_into_failed_groups, static_argnums=(6, 7))(
      buf, tokens, role, lp, _turns(6), reward, 2, 1.0
  )
  tok, rol, logp, _, rew, inj = out
  np.testing.assert_array_equal(inj, [False, True, False, False, False, False])
  np.testing.assert_array_equal(tok[1], [5, 6, 9, 9])
  np.testing.assert_allclose(logp[1], -0.25)
  keep = np.array([0, 2, 3, 4, 5])
  np.testing.assert_array_equal(np.asarray(tok)[keep], np.asarray(tokens)[keep])
  np.testing.assert_allclose(rew, [0, 1, 1, 0, 0, 0])
  # GRPO against the current group: g0 = [0, 1] -> [-1, +1]; g2 stays 0.
  adv = advantages.grpo_advantages(rew, jnp.repeat(jnp.arange(3), 2), eps=0.0)
  np.testing.assert_allclose(adv, [-1, 1, 1, -1, 0, 0], atol=1e-6)


def test_sil_baselines_per_task_mean_or_batch_mean():
  batch_keys = jnp.array([10, 10, 20, 20], jnp.uint32)
  batch_reward = jnp.array([1.0, 0.0, 0.0, 0.0])
  b = replay.sil_baselines(
      jnp.array([10, 20, 30], jnp.uint32), batch_keys, batch_reward
  )
  np.testing.assert_allclose(b, [0.5, 0.0, 0.25])


def test_self_imitation_loss_hand_value_and_gradient():
  logp = jnp.array([[-1.0, -2.0, -3.0], [-0.5, -0.5, -0.5], [-4.0, -4.0, -4.0]])
  mask = jnp.array([[1, 1, 0], [1, 0, 0], [1, 1, 1]], bool)
  ret = jnp.array([1.0, 1.0, 1.0])
  base = jnp.array([0.5, 1.5, 0.0])  # weights 0.5, 0 (clipped), 1
  valid = jnp.array([True, True, False])  # row 2 left out entirely
  loss = losses.self_imitation_loss(logp, mask, ret, base, valid)
  # -(0.5 * (-1 - 2) + 0 * (-0.5)) / 3 tokens = 0.5
  np.testing.assert_allclose(loss, 0.5, rtol=1e-6)
  g = jax.grad(lambda x: losses.self_imitation_loss(x, mask, ret, base, valid))(
      logp
  )
  np.testing.assert_allclose(
      g, [[-0.5 / 3, -0.5 / 3, 0], [0, 0, 0], [0, 0, 0]], rtol=1e-6
  )


def test_train_state_with_buffer_and_dual_coef_checkpoints(tmp_path):
  buf = replay.init(2, 4)
  tokens, role = _rows([(5, 6)], [(1, 2)])
  buf = replay.insert(
      buf,
      replay.task_keys(tokens, role),
      tokens,
      role,
      jnp.full((1, 4), -0.5),
      jnp.array([1.0]),
      jnp.array([True]),
      jnp.int32(7),
      _turns(1),
  )
  base = dict(
      step=jnp.int32(7),
      params={"w": jnp.ones(3)},
      ref_params={"w": jnp.zeros(3)},
      opt_state={"m": jnp.zeros(3)},
      rng=jnp.zeros(2, jnp.uint32),
  )
  kl = types.FeatureStates(kl=jnp.float32(0.01))
  state = types.TrainState(
      **base, features=kl.replace(replay=buf, dual=jnp.float32(0.3))
  )
  plain = types.TrainState(**base, features=kl)  # no replay, no dual
  assert set(plain.features) == {"kl"}
  with checkpoint.Checkpointer(str(tmp_path / "a")) as ck:
    ck.save(7, state, force=True)
    ck.wait()
    like = types.TrainState(
        **base,
        features=kl.replace(replay=replay.init(2, 4), dual=jnp.float32(0.0)),
    )
    got = ck.restore(like)
  for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(got)):
    np.testing.assert_array_equal(a, b)
  assert isinstance(got.features["replay"], types.ReplayBuffer)
  with checkpoint.Checkpointer(str(tmp_path / "b")) as ck:
    ck.save(7, plain, force=True)
    ck.wait()
    got = ck.restore(plain)
  assert set(got.features) == {"kl"}
  assert len(jax.tree.leaves(got)) == len(jax.tree.leaves(plain))


def test_init_rejects_empty_capacity():
  with pytest.raises(ValueError, match="capacity=0"):
    replay.init(0, 4)


def test_injected_reward_is_never_stored_with_the_fresh_tokens():
  # The buffer holds task A's success (answer 9 9, reward 1). A fresh group of
  # task A fails twice (answers 1 1 and 2 2): injection replaces its last row
  # with the buffered success, and the buffer must keep 9 9 in A's slot. It
  # used to store the fresh failed row 2 2 with the injected reward 1.
  from agentic_rl.learner import batch as batch_lib  # noqa: PLC0415
  from agentic_rl.learner.stages import replay as replay_stages  # noqa: PLC0415

  buf = replay.init(2, 4)
  ta, ra = _rows([(5, 6)], [(9, 9)])
  buf = replay.insert(
      buf,
      replay.task_keys(ta, ra),
      ta,
      ra,
      jnp.full((1, 4), -0.25),
      jnp.array([1.0]),
      jnp.array([True]),
      jnp.int32(0),
      _turns(1),
  )
  tokens, role = _rows([(5, 6)] * 2, [(1, 1), (2, 2)])
  traj = types.Trajectory(
      tokens=tokens,
      role=role,
      logprob=jnp.full((2, 4), -1.0),
      turn=_turns(2),
      length=jnp.full((2,), 4, jnp.int32),
      num_turns=jnp.ones((2,), jnp.int32),
      finish=jnp.zeros((2,), jnp.int32),
      group=jnp.zeros((2,), jnp.int32),
      facts={},
  )

  def inject_and_store(reward):
    r = batch_lib.Rollout(traj=traj, reward=reward, parts={}, info={})
    r = replay_stages.replay_fresh(r)
    r = replay_stages.replay_inject(r, buf, group_size=2, success_threshold=1.0)
    r = replay_stages.replay_store(r, buf, jnp.int32(3), success_threshold=1.0)
    return r.train_traj, r.reward, r.injected, r.replay

  train_traj, reward, injected, new_buf = inject_and_store(
      jnp.array([0.0, 0.0])
  )
  np.testing.assert_array_equal(injected, [False, True])
  np.testing.assert_array_equal(train_traj.tokens[1], [5, 6, 9, 9])
  np.testing.assert_allclose(reward, [0.0, 1.0])
  # Nothing fresh succeeded: the buffer is unchanged.
  for a, b in zip(jax.tree.leaves(buf), jax.tree.leaves(new_buf)):
    np.testing.assert_array_equal(a, b)
  # A fresh success of task A does replace the stored one.
  _, _, _, new_buf = inject_and_store(jnp.array([0.0, 1.0]))
  slot = int(np.argmax(np.asarray(new_buf.valid)))
  np.testing.assert_array_equal(new_buf.tokens[slot], [5, 6, 2, 2])
  assert int(np.sum(np.asarray(new_buf.valid))) == 1
