"""The collect stages as functions: the typed batch and each lifted stage on
hand values (tiny arrays, no model)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentic_rl import credit
from agentic_rl import replay
from agentic_rl import rollout
from agentic_rl import sampling
from agentic_rl import tree_rollout
from agentic_rl import types
from agentic_rl.reward_models import frozen as rm_frozen
from agentic_rl.rewards import factory as reward_factory
from agentic_rl.learner import batch as batch_lib
from agentic_rl.learner import behaviour
from agentic_rl.learner.stages import advantages as advantage_stages
from agentic_rl.learner.stages import build as build_stages_lib
from agentic_rl.learner.stages import logprobs as logprob_stages
from agentic_rl.learner.stages import pack as pack_stages
from agentic_rl.learner.stages import replay as replay_stages
from agentic_rl.learner.stages import sample as sample_stages
from agentic_rl.learner.stages import shaping as shaping_stages


def _traj(
    tokens, role, *, finish=None, group=None, facts=None, logprob=None
) -> types.Trajectory:
  """A hand-made Trajectory: turn 0 on every non-prompt, non-pad token."""
  tokens = jnp.asarray(tokens, jnp.int32)
  role = jnp.asarray(role, jnp.int8)
  b = tokens.shape[0]
  turn = jnp.where((role == types.PROMPT) | (role == types.PAD), -1, 0).astype(
      jnp.int32
  )
  return types.Trajectory(
      tokens=tokens,
      role=role,
      logprob=(
          jnp.zeros(tokens.shape, jnp.float32)
          if logprob is None
          else jnp.asarray(logprob, jnp.float32)
      ),
      turn=turn,
      length=jnp.sum(role != types.PAD, axis=1).astype(jnp.int32),
      num_turns=jnp.ones((b,), jnp.int32),
      finish=jnp.asarray(
          [types.ANSWERED] * b if finish is None else finish, jnp.int32
      ),
      group=jnp.asarray(
          np.arange(b, dtype=np.int32) if group is None else group, jnp.int32
      ),
      facts={} if facts is None else facts,
  )


P, A, T, _ = types.PROMPT, types.POLICY, types.TOOL, types.PAD


def _rollout(**kw) -> batch_lib.Rollout:
  traj = _traj([[1, 2, 3, 0], [1, 4, 5, 6]], [[P, A, A, _], [P, A, T, A]])
  return batch_lib.Rollout(
      traj=traj,
      reward=jnp.asarray([1.0, 0.0]),
      parts={"correct": jnp.asarray([1.0, 0.0])},
      info={},
      **kw,
  )


# ---------------------------------------------------------------- batch.py


def test_rollout_optional_fields_start_none():
  r = _rollout()
  optional = [f.name for f in dataclasses.fields(r) if f.default is None]
  assert "mask" in optional and "returns" in optional
  assert all(getattr(r, name) is None for name in optional)
  # None fields are empty pytrees: the leaves are traj's, reward and parts.
  n_traj = len(jax.tree.leaves(r.traj))
  assert len(jax.tree.leaves(r)) == n_traj + 2


def test_rollout_replace_and_with_info():
  r = _rollout()
  r2 = r.replace(mask=jnp.ones((2, 4), bool)).with_info(a=jnp.float32(1.0))
  assert r.mask is None and r.info == {}
  assert r2.mask.shape == (2, 4)
  r3 = r2.with_info(a=jnp.float32(2.0), b=jnp.float32(3.0))
  assert float(r3.info["a"]) == 2.0 and float(r3.info["b"]) == 3.0
  assert float(r2.info["a"]) == 1.0


def test_rollout_passes_through_jit():
  r = _rollout(adv_b=jnp.asarray([0.5, -0.5]))

  @jax.jit
  def f(r):
    return r.replace(reward=r.reward * 2.0)

  out = f(r)
  np.testing.assert_array_equal(out.reward, [2.0, 0.0])
  np.testing.assert_array_equal(out.adv_b, [0.5, -0.5])
  assert out.mask is None


def test_sil_sample_and_learner_batch_flatten_in_sorted_name_order():
  # The leaf order of the dicts they replaced (jax flattens dicts by key):
  # the lowered update keeps its op order.
  s = batch_lib.SilSample(
      tokens=jnp.zeros((1, 3), jnp.int32),
      mask=jnp.ones((1, 3), bool),
      returns=jnp.asarray([1.0]),
      baseline=jnp.asarray([0.25]),
      valid=jnp.asarray([True]),
  )
  paths = [p[0].name for p, _ in jax.tree_util.tree_flatten_with_path(s)[0]]
  assert paths == ["baseline", "mask", "returns", "tokens", "valid"]
  assert s.replace(returns=jnp.asarray([2.0])).returns[0] == 2.0
  z = jnp.zeros((1, 3))
  lb = batch_lib.LearnerBatch(
      tokens=z, mask=z, behaviour_logp=z, ref_logp=z, advantage=z, sil=s
  )
  names = [p[0].name for p, _ in jax.tree_util.tree_flatten_with_path(lb)[0]]
  assert names == [
      "advantage",
      "behaviour_logp",
      "mask",
      "ref_logp",
      "sil",
      "sil",
      "sil",
      "sil",
      "sil",
      "tokens",
  ]
  back = jax.tree.unflatten(jax.tree.structure(lb), jax.tree.leaves(lb))
  assert back.sil.returns is s.returns and back.obs_mask is None


def test_learner_batch_and_spa_inputs_build():
  lb = batch_lib.LearnerBatch(
      tokens=jnp.zeros((2, 3), jnp.int32),
      mask=jnp.ones((2, 3), bool),
      behaviour_logp=jnp.zeros((2, 3)),
      ref_logp=jnp.zeros((2, 3)),
      advantage=jnp.zeros((2, 3)),
  )
  assert lb.sil is None and len(jax.tree.leaves(lb)) == 5
  spa = batch_lib.SpaInputs(
      features=jnp.zeros((2, 1, 4)),
      turn_mask=jnp.ones((2, 1), bool),
      outcome=jnp.zeros((2,)),
  )
  assert len(jax.tree.leaves(spa)) == 3


def test_stage_context_is_frozen():
  ctx = batch_lib.StageContext(
      key=jax.random.key(0), step=jnp.int32(3), params={}, ref_params={}
  )
  assert ctx.reward_model is None and dict(ctx.features) == {}
  with pytest.raises(dataclasses.FrozenInstanceError):
    ctx.step = jnp.int32(4)  # type: ignore[misc]


# ------------------------------------------------------- stages/sample.py


class _TaskEnv:
  """sample_tasks only: task i of a draw is {'id': i + 10 * draw}."""

  max_turns = 2

  def __init__(self):
    self.keys = []

  def sample_tasks(self, key, n):
    self.keys.append(key)
    return {"id": jnp.arange(n, dtype=jnp.int32) + 10 * (len(self.keys) - 1)}


def test_rollout_round_repeats_tasks_into_groups(monkeypatch):
  seen = {}

  def fake_rollout(env, tasks, key, **kw):
    seen.update(tasks=tasks, key=key, **kw)
    return "traj"

  monkeypatch.setattr(rollout, "rollout", fake_rollout)
  env = _TaskEnv()
  round_key = jax.random.key(7)
  out = sample_stages.rollout_round(
      round_key,
      "params",
      env=env,
      graphdef="graphdef",
      model_config="mc",
      num_groups=2,
      group_size=3,
      max_len=16,
      temperature=0.5,
      num_tool_free=1,
  )
  assert out == "traj"
  task_key, sample_key = jax.random.split(round_key)
  np.testing.assert_array_equal(
      jax.random.key_data(env.keys[0]), jax.random.key_data(task_key)
  )
  np.testing.assert_array_equal(
      jax.random.key_data(seen["key"]), jax.random.key_data(sample_key)
  )
  np.testing.assert_array_equal(seen["tasks"]["id"], [0, 0, 0, 1, 1, 1])
  np.testing.assert_array_equal(seen["group"], [0, 0, 0, 1, 1, 1])
  np.testing.assert_array_equal(
      seen["tool_free"], [False, False, True, False, False, True]
  )
  assert seen["max_len"] == 16 and seen["temperature"] == 0.5
  assert seen["params"] == "params" and seen["graphdef"] == "graphdef"


def test_rollout_round_without_tool_free_rows_passes_none(monkeypatch):
  seen = {}
  monkeypatch.setattr(
      rollout, "rollout", lambda env, tasks, key, **kw: seen.update(kw)
  )
  sample_stages.rollout_round(
      jax.random.key(0),
      None,
      env=_TaskEnv(),
      graphdef=None,
      model_config=None,
      num_groups=1,
      group_size=2,
      max_len=8,
      temperature=1.0,
  )
  assert seen["tool_free"] is None


def test_rollout_round_tree_samples_one_task_per_group(monkeypatch):
  seen = {}

  def fake_tree(env, tasks, key, **kw):
    seen.update(tasks=tasks, **kw)
    return "tree"

  monkeypatch.setattr(tree_rollout, "tree_rollout", fake_tree)
  out = sample_stages.rollout_round(
      jax.random.key(0),
      None,
      env=_TaskEnv(),
      graphdef=None,
      model_config=None,
      num_groups=2,
      group_size=4,
      max_len=8,
      temperature=1.0,
      tree_branching=(2, 2),
  )
  assert out == "tree"
  np.testing.assert_array_equal(seen["tasks"]["id"], [0, 1])
  assert seen["branching"] == (2, 2)


@pytest.mark.parametrize("prm", [False, True])
def test_rm_score_writes_the_reward_model_facts(monkeypatch, prm):
  traj = _traj([[1, 2, 3, 0]], [[P, A, A, _]], facts={"correct": jnp.ones(1)})
  out = {"score": jnp.asarray([0.5]), "potential": jnp.asarray([[0.1, 0.2]])}
  if prm:
    out["step_score"] = jnp.asarray([[0.3]])
  calls = []

  def fake(rm, params, tokens, role, turn, k):
    calls.append((rm, params, k))
    return out

  monkeypatch.setattr(rm_frozen, "trajectory_rm_outputs", fake)
  scored = sample_stages.rm_score(
      traj, "rm_params", reward_model="rm", max_turns=1
  )
  assert calls == [("rm", "rm_params", 1)]
  assert set(scored.facts) == {"correct", "rm_score", "rm_potential"} | (
      {"rm_step_score"} if prm else set()
  )
  np.testing.assert_array_equal(scored.facts["rm_score"], [0.5])
  assert scored.facts["rm_potential"] is out["potential"]
  assert set(traj.facts) == {"correct"}  # the input is unchanged


def test_env_reward_runs_the_reward_on_the_rl_step():
  traj = _traj(
      [[1, 2], [1, 3]],
      [[P, A], [P, A]],
      facts={"correct": jnp.asarray([1.0, 0.0])},
  )
  steps = []

  def reward_fn(t, step, key):
    steps.append(int(step))
    return t.facts["correct"] * 2.0, {"correct": t.facts["correct"]}

  r = sample_stages.env_reward(
      traj, jnp.int32(7), jax.random.key(0), reward_fn=reward_fn, sft_steps=5
  )
  assert steps == [2]
  assert r.traj is traj and r.info == {} and r.mask is None
  np.testing.assert_array_equal(r.reward, [2.0, 0.0])
  np.testing.assert_array_equal(r.parts["correct"], [1.0, 0.0])


def test_env_reward_with_the_config_reward_fn():
  traj = _traj(
      [[1, 2], [1, 3]],
      [[P, A], [P, A]],
      facts={"correct": jnp.asarray([True, False])},
  )
  r = sample_stages.env_reward(
      traj,
      jnp.int32(0),
      None,
      reward_fn=reward_factory.make_reward_fn({"correct": 1.0}),
      sft_steps=0,
  )
  np.testing.assert_array_equal(r.reward, [1.0, 0.0])
  assert r.reward.dtype == jnp.float32


def test_soft_overlong_penalty_on_policy_token_counts():
  # POLICY tokens per row: 2, 3, 5; L_max = 4, L_cache = 2: soft zone (2, 4].
  traj = _traj(
      [[0] * 6] * 3,
      [
          [P, A, A, _, _, _],
          [P, A, T, A, A, _],
          [P, A, A, A, A, A],
      ],
  )
  r = batch_lib.Rollout(
      traj=traj, reward=jnp.asarray([1.0, 1.0, 0.0]), parts={}, info={}
  )
  assert r.env_reward is None
  out = sample_stages.soft_overlong_penalty(r, soft_max=4, cache=2)
  np.testing.assert_allclose(out.reward, [1.0, 0.5, -1.0])
  # The reward before the penalty is kept per row.
  np.testing.assert_array_equal(out.env_reward, [1.0, 1.0, 0.0])
  with pytest.raises(ValueError, match="cache_len"):
    sample_stages.soft_overlong_penalty(r, soft_max=4, cache=0)


def test_dual_path_tool_free_rows():
  np.testing.assert_array_equal(
      sample_stages.dual_path_tool_free(6, 3, 2), [False, True, True] * 2
  )
  assert sample_stages.dual_path_tool_free(6, 3, 0) is None


def _round(tokens_b, reward_b, rollout_key, noise_key):
  """A hand-made round: row i holds token tokens_b[i]; facts record keys."""
  b = len(reward_b)
  reward = jnp.asarray(reward_b, jnp.float32)
  traj = _traj(
      jnp.asarray(tokens_b, jnp.int32)[:, None],
      [[A]] * b,
      group=np.zeros(b, np.int32),
      facts={
          "correct": reward > 0,
          "rollout_key": jnp.broadcast_to(rollout_key, (b, 2)),
          "noise_key": jnp.broadcast_to(noise_key, (b, 2)),
      },
  )
  return batch_lib.Rollout(
      traj=traj, reward=reward, parts={"correct": reward}, info={}
  )


def test_group_metric_by_reward_or_correct():
  r = _round(
      [0, 1, 2, 3], [1.0, 0.5, 0.0, 0.0], *[jnp.zeros(2, jnp.uint32)] * 2
  )
  np.testing.assert_array_equal(
      sample_stages.group_metric(
          r.traj, r.reward, metric="reward", group_size=2
      ),
      [[1.0, 0.5], [0.0, 0.0]],
  )
  m = sample_stages.group_metric(
      r.traj, r.reward, metric="correct", group_size=2
  )
  assert m.dtype == jnp.float32
  np.testing.assert_array_equal(m, [[1.0, 1.0], [0.0, 0.0]])


def test_dynamic_sampling_refills_from_a_retry_round_on_its_keys():
  key = jax.random.PRNGKey(3)
  zero = jnp.zeros(2, jnp.uint32)
  # Round 1, 4 groups of 2: only group 2 varies.
  first = _round(range(8), [1, 1, 0, 0, 1, 0, 0, 0], zero, zero)

  def round_fn(rollout_key, noise_key):  # groups 1 and 2 vary
    return _round(
        range(100, 108), [0, 0, 1, 0, 0, 1, 1, 1], rollout_key, noise_key
    )

  out = sample_stages.dynamic_sampling(
      first,
      key,
      round_fn,
      num_tasks=2,
      group_size=2,
      metric="reward",
      max_retries=3,
  )
  # Slot 0: round 1's group 2; slot 1: the retry's first varied group (1).
  np.testing.assert_array_equal(out.traj.tokens[:, 0], [4, 5, 102, 103])
  np.testing.assert_array_equal(out.reward, [1.0, 0.0, 1.0, 0.0])
  np.testing.assert_array_equal(out.parts["correct"], [1.0, 0.0, 1.0, 0.0])
  np.testing.assert_array_equal(out.traj.group, [0, 0, 1, 1])
  k1 = jax.random.fold_in(jax.random.fold_in(key, 3), 1)
  for name, i in (("rollout_key", 1), ("noise_key", 2)):
    np.testing.assert_array_equal(
        out.traj.facts[name][2], jax.random.fold_in(k1, i)
    )
  assert bool(out.any_usable)
  assert float(out.info["usable_groups"]) == 1.0
  assert float(out.info["dynamic_sampling_rounds"]) == 2.0


def test_dynamic_sampling_without_varied_groups_stops_at_max_retries():
  zero = jnp.zeros(2, jnp.uint32)
  first = _round(range(6), [1, 1, 0, 0, 1, 1], zero, zero)
  calls = []

  def round_fn(rollout_key, noise_key):
    calls.append(1)  # traced once (the while_loop body)
    return _round(range(6), [0.0] * 6, rollout_key, noise_key)

  out = sample_stages.dynamic_sampling(
      first,
      jax.random.PRNGKey(0),
      round_fn,
      num_tasks=2,
      group_size=2,
      metric="correct",
      max_retries=2,
  )
  assert len(calls) == 1
  assert not bool(out.any_usable)
  assert float(out.info["usable_groups"]) == 0.0
  assert float(out.info["dynamic_sampling_rounds"]) == 3.0
  # Constant fillers: round 1's groups 0 and 1, in order.
  np.testing.assert_array_equal(out.traj.tokens[:, 0], [0, 1, 2, 3])


def test_dynamic_sampling_without_retries_selects_round_one():
  zero = jnp.zeros(2, jnp.uint32)
  first = _round(range(6), [0, 0, 0, 1, 1, 0], zero, zero)
  out = sample_stages.dynamic_sampling(
      first,
      jax.random.PRNGKey(0),
      None,
      num_tasks=2,
      group_size=2,
      metric="reward",
      max_retries=0,
  )
  np.testing.assert_array_equal(out.traj.tokens[:, 0], [2, 3, 4, 5])
  assert float(out.info["dynamic_sampling_rounds"]) == 1.0
  assert float(out.info["usable_groups"]) == 1.0
  with pytest.raises(ValueError, match="num_keep"):
    sample_stages.dynamic_sampling(
        first,
        jax.random.PRNGKey(0),
        None,
        num_tasks=4,
        group_size=2,
        metric="reward",
        max_retries=0,
    )


def _penalised_round(tokens_b, env_b, n_policy_b):
  """A hand-made round with the soft overlong penalty (L_max = 3, L_cache =
  2: 0 up to 1 POLICY token, -0.5 at 2, -1 from 3): row i holds token
  tokens_b[i] and n_policy_b[i] POLICY tokens of 4; its environment reward
  (and 'correct' part) is env_b[i]."""
  b = len(env_b)
  tokens = np.zeros((b, 4), np.int32)
  tokens[:, 0] = tokens_b
  role = [[A] * n + [_] * (4 - n) for n in n_policy_b]
  env = jnp.asarray(env_b, jnp.float32)
  traj = _traj(
      tokens, role, group=np.zeros(b, np.int32), facts={"correct": env > 0}
  )
  r = batch_lib.Rollout(traj=traj, reward=env, parts={"correct": env}, info={})
  return sample_stages.soft_overlong_penalty(r, soft_max=3, cache=2)


def test_env_reward_info_without_the_soft_penalty_is_the_reward_mean():
  r = _round(range(4), [1.0, 0.5, 0.0, 0.0], *[jnp.zeros(2, jnp.uint32)] * 2)
  out = sample_stages.env_reward_info(r)
  assert set(out.info) == {"env_reward"}
  assert float(out.info["env_reward"]) == 0.375
  # On with the penalty's field unset: refused, not the penalised mean.
  with pytest.raises(ValueError, match="env_reward is None"):
    sample_stages.env_reward_info(r, soft_max=3, cache=2)


def test_env_reward_info_excludes_the_soft_overlong_penalty():
  # Penalties [0, -0.5, -1, -1] on 1, 2, 3, 4 POLICY tokens.
  r = _penalised_round(range(4), [1.0, 1.0, 0.5, 0.0], [1, 2, 3, 4])
  out = sample_stages.env_reward_info(r, soft_max=3, cache=2)
  assert set(out.info) == {"env_reward", "overlong_soft_penalty"}
  # The environment's reward before the penalty: mean [1, 1, 0.5, 0].
  assert float(out.info["env_reward"]) == 0.625
  assert float(out.info["overlong_soft_penalty"]) == -0.625
  # The reward passed on is env reward + penalty, row by row.
  np.testing.assert_array_equal(out.env_reward, [1.0, 1.0, 0.5, 0.0])
  np.testing.assert_array_equal(out.reward, [1.0, 0.5, -0.5, -1.0])
  np.testing.assert_array_equal(out.parts["correct"], [1.0, 1.0, 0.5, 0.0])


def test_dynamic_sampling_keeps_the_same_rows_of_reward_and_env_reward():
  # 3 groups of 2; the selection reads the penalised reward:
  # group 0: env [1, 0], penalty [-1, 0] -> [0, 0], constant: dropped;
  # group 1: env [1, 1], penalty [0, -0.5] -> [1, 0.5], varies: slot 0;
  # group 2: env [0, 1], penalty [0, 0] -> [0, 1], varies: slot 1.
  first = _penalised_round(range(6), [1, 0, 1, 1, 0, 1], [3, 1, 1, 2, 1, 1])
  out = sample_stages.dynamic_sampling(
      first,
      jax.random.PRNGKey(0),
      None,
      num_tasks=2,
      group_size=2,
      metric="reward",
      max_retries=0,
  )
  np.testing.assert_array_equal(out.traj.tokens[:, 0], [2, 3, 4, 5])
  np.testing.assert_array_equal(out.reward, [1.0, 0.5, 0.0, 1.0])
  np.testing.assert_array_equal(out.env_reward, [1.0, 1.0, 0.0, 1.0])
  np.testing.assert_array_equal(out.parts["correct"], out.env_reward)
  out = sample_stages.env_reward_info(out, soft_max=3, cache=2)
  assert float(out.info["env_reward"]) == 0.75
  assert float(out.info["overlong_soft_penalty"]) == -0.125
  assert float(jnp.mean(out.reward)) == 0.625  # env reward + penalty


def test_dynamic_sampling_retries_keep_the_same_rows_of_env_reward():
  key = jax.random.PRNGKey(3)
  # Round 1, 2 groups of 2: group 0 varies ([1, 0.5]); group 1 is
  # constant after the penalty ([0, 0] from env [1, 0]).
  first = _penalised_round(range(4), [1, 1, 1, 0], [1, 2, 3, 1])

  def round_fn(rollout_key, noise_key):
    # Group 0 constant ([0.5, 0.5] from env [1, 0.5]); group 1 varies:
    # env [0, 1], penalty [0, -0.5] -> [0, 0.5].
    del rollout_key, noise_key
    return _penalised_round(range(100, 104), [1, 0.5, 0, 1], [2, 1, 1, 2])

  out = sample_stages.dynamic_sampling(
      first,
      key,
      round_fn,
      num_tasks=2,
      group_size=2,
      metric="reward",
      max_retries=2,
  )
  # Slot 0: round 1's group 0; slot 1: the retry's group 1.
  np.testing.assert_array_equal(out.traj.tokens[:, 0], [0, 1, 102, 103])
  np.testing.assert_array_equal(out.reward, [1.0, 0.5, 0.0, 0.5])
  np.testing.assert_array_equal(out.env_reward, [1.0, 1.0, 0.0, 1.0])
  np.testing.assert_array_equal(out.parts["correct"], out.env_reward)
  assert float(out.info["dynamic_sampling_rounds"]) == 2.0
  out = sample_stages.env_reward_info(out, soft_max=3, cache=2)
  assert float(out.info["env_reward"]) == 0.75
  assert float(out.info["overlong_soft_penalty"]) == -0.25
  assert float(jnp.mean(out.reward)) == 0.5  # env reward + penalty


# ------------------------------------------------------ stages/shaping.py


def _masked_rollout(finish=None, reward=(1.0, 0.5, 0.25)):
  traj = _traj(
      [[1, 2, 3, 4]] * 3,
      [[P, A, T, A], [P, A, A, _], [P, A, A, A]],
      finish=finish,
      facts={"tool_free": jnp.asarray([False, True, False])},
  )
  return batch_lib.Rollout(
      traj=traj, reward=jnp.asarray(reward, jnp.float32), parts={}, info={}
  )


def test_policy_mask_marks_policy_tokens():
  r = shaping_stages.policy_mask(_masked_rollout(), exclude_tool_free=False)
  np.testing.assert_array_equal(
      r.mask,
      [[0, 1, 0, 1], [0, 1, 1, 0], [0, 1, 1, 1]],
  )
  assert r.mask.dtype == jnp.bool_


def test_policy_mask_excludes_tool_free_rows():
  r = shaping_stages.policy_mask(_masked_rollout(), exclude_tool_free=True)
  np.testing.assert_array_equal(
      r.mask,
      [[0, 1, 0, 1], [0, 0, 0, 0], [0, 1, 1, 1]],
  )


@pytest.mark.parametrize(
    "mode, reward, mask_row2",
    [
        ("none", [1.0, 0.5, 0.25], [0, 1, 1, 1]),
        ("mask", [1.0, 0.5, 0.25], [0, 0, 0, 0]),
        ("reward", [1.0, 0.5, -2.0], [0, 1, 1, 1]),
    ],
)
def test_overlong_modes_on_the_truncated_row(mode, reward, mask_row2):
  finish = [types.ANSWERED, types.MAX_TURNS, types.TRUNCATED]
  r = shaping_stages.policy_mask(
      _masked_rollout(finish), exclude_tool_free=False
  )
  out = shaping_stages.overlong(r, mode=mode, overlong_reward=-2.0)
  np.testing.assert_array_equal(out.reward, reward)
  np.testing.assert_array_equal(out.mask[2], mask_row2)
  np.testing.assert_array_equal(out.mask[:2], r.mask[:2])
  with pytest.raises(ValueError, match="unknown"):
    shaping_stages.overlong(r, mode="drop", overlong_reward=0.0)


def test_gold_logprobs_scores_the_gold_answer_with_the_reference(monkeypatch):
  # Every token log-prob -0.5: each state's score is -0.5 * gold length.
  seen = []

  def fake_logprobs(graphdef, params, tokens, temperature):
    seen.append((graphdef, params, temperature))
    return jnp.full(tokens.shape, -0.5, jnp.float32), None

  monkeypatch.setattr(sampling, "token_logprobs", fake_logprobs)
  traj = _traj(
      [[1, 2, 3, 4]] * 2,
      [[P, A, T, A]] * 2,
      facts={
          "gold_answer": jnp.asarray([[7, 8, 9], [7, 0, 0]], jnp.int32),
          "gold_answer_len": jnp.asarray([3, 1], jnp.int32),
      },
  )
  r = batch_lib.Rollout(traj=traj, reward=jnp.zeros(2), parts={}, info={})
  out = shaping_stages.gold_logprobs(
      r, "ref", graphdef="g", temperature=0.7, max_turns=2
  )
  assert seen == [("g", "ref", 0.7)]
  assert out.gold_logp.shape == (2, 3) and out.gold_logp.dtype == jnp.float32
  np.testing.assert_allclose(out.gold_logp, [[-1.5] * 3, [-0.5] * 3])


def test_likelihood_reward_reads_the_final_context():
  # ANSWERED: the state before the answering turn (num_turns - 1); else
  # the state after the last turn (num_turns).
  traj = _traj(
      [[1, 2]] * 3,
      [[P, A]] * 3,
      finish=[types.ANSWERED, types.MAX_TURNS, types.TRUNCATED],
  ).replace(num_turns=jnp.asarray([2, 1, 2], jnp.int32))
  gold = jnp.asarray(
      [[-3.0, -2.0, -1.0], [-6.0, -5.0, -4.0], [-9.0, -8.0, -7.0]]
  )
  r = batch_lib.Rollout(
      traj=traj,
      reward=jnp.asarray([1.0, 0.0, 0.5]),
      parts={},
      info={"env_reward": jnp.float32(0.5)},
      gold_logp=gold,
  )
  out = shaping_stages.likelihood_reward(r, coef=0.5)
  # lik = [-2, -5, -7]
  np.testing.assert_allclose(out.reward, [0.0, -2.5, -3.0])
  np.testing.assert_allclose(out.info["likelihood"], -14.0 / 3, rtol=1e-6)
  assert set(out.info) == {"env_reward", "likelihood"}


def test_observation_scores_sets_both_fields(monkeypatch):
  seen = []

  def fake(graphdef, params, tokens, temperature):
    seen.append((graphdef, params, temperature))
    return tokens * 0.25, tokens > 2

  monkeypatch.setattr(credit, "observation_prediction_scores", fake)
  r = _rollout()
  out = shaping_stages.observation_scores(
      r, "params", graphdef="g", temperature=0.9
  )
  assert seen == [("g", "params", 0.9)]
  np.testing.assert_allclose(out.obs_prob, r.traj.tokens * 0.25)
  np.testing.assert_array_equal(out.obs_hit, r.traj.tokens > 2)


def _potential_ctx():
  from agentic_rl.learner import potentials_by_name  # noqa: PLC0415

  return potentials_by_name.PotentialContext(
      graphdef=None, params=None, spa=None, max_turns=2
  )


def test_potential_progress_and_rm_read_facts():
  facts = {
      "progress": jnp.asarray([[0.0, 0.5, jnp.nan]]),
      "rm_potential": jnp.asarray([[0.25, jnp.inf, 1.0]]),
  }
  r = batch_lib.Rollout(
      traj=_traj([[1, 2]], [[P, A]], facts=facts),
      reward=jnp.zeros(1),
      parts={},
      info={},
  )
  out = shaping_stages.potential(r, _potential_ctx(), name="progress")
  np.testing.assert_array_equal(out.phi, [[0.0, 0.5, 0.0]])
  out = shaping_stages.potential(r, _potential_ctx(), name="rm")
  np.testing.assert_array_equal(out.phi, [[0.25, 0.0, 1.0]])
  assert out.spa_inputs is None
  with pytest.raises(ValueError, match="unknown"):
    shaping_stages.potential(r, _potential_ctx(), name="nope")


def test_potential_trace_is_the_log_ratio_of_gold_logp():
  r = _rollout(gold_logp=jnp.asarray([[-3.0, -2.0, -0.5], [-1.0, -1.0, -4.0]]))
  out = shaping_stages.potential(r, _potential_ctx(), name="trace")
  np.testing.assert_allclose(out.phi, [[0.0, 1.0, 2.5], [0.0, 0.0, -3.0]])


def test_potential_obs_prediction_means_the_observation_scores():
  # Row 0: one TOOL token (turn 0) scored 0.5; row 1: no observation.
  traj = _traj([[1, 2, 3, 4]] * 2, [[P, A, T, A], [P, A, A, _]])
  traj = traj.replace(turn=jnp.asarray([[-1, 0, 0, 1], [-1, 0, 0, -1]]))
  r = batch_lib.Rollout(
      traj=traj,
      reward=jnp.zeros(2),
      parts={},
      info={},
      obs_prob=jnp.asarray([[0.9, 0.8, 0.5, 0.7]] * 2),
  )
  out = shaping_stages.potential(r, _potential_ctx(), name="obs_prediction")
  np.testing.assert_allclose(out.phi, [[0.0, 0.5, 0.5], [0.0, 0.0, 0.0]])


def test_potential_spa_sets_its_training_inputs(monkeypatch):
  from agentic_rl.learner import potentials_by_name  # noqa: PLC0415

  monkeypatch.setattr(
      credit,
      "spa_policy_features",
      lambda graphdef, params, tokens, role, turn, k: jnp.ones(
          (tokens.shape[0], k, 3)
      ),
  )
  spa = credit.spa_init(3, 0.1)  # zero head: every contribution 0
  ctx = potentials_by_name.PotentialContext(
      graphdef=None, params=None, spa=spa, max_turns=2
  )
  traj = _traj(
      [[1, 2]] * 2, [[P, A]] * 2, facts={"correct": jnp.asarray([True, False])}
  ).replace(num_turns=jnp.asarray([1, 2], jnp.int32))
  r = batch_lib.Rollout(traj=traj, reward=jnp.zeros(2), parts={}, info={})
  out = shaping_stages.potential(r, ctx, name="spa")
  np.testing.assert_array_equal(out.phi, np.zeros((2, 3)))
  np.testing.assert_array_equal(out.spa_inputs.features, np.ones((2, 2, 3)))
  np.testing.assert_array_equal(
      out.spa_inputs.turn_mask, [[True, False], [True, True]]
  )
  np.testing.assert_array_equal(out.spa_inputs.outcome, [1.0, 0.0])
  assert out.spa_inputs.outcome.dtype == jnp.float32


def test_obs_prediction_diagnostics_by_hand():
  traj = _traj(
      [[1, 2, 3, 4]] * 2,
      [[P, T, A, T], [P, A, T, A]],
      finish=[types.ANSWERED, types.MAX_TURNS],
  )
  r = batch_lib.Rollout(
      traj=traj,
      reward=jnp.zeros(2),
      parts={},
      info={"x": jnp.float32(1.0)},
      obs_prob=jnp.asarray([[0.1, 0.2, 0.3, 0.4], [0.5, 0.6, 0.7, 0.8]]),
      obs_hit=jnp.asarray([[0, 1, 0, 0], [1, 1, 1, 1]], bool),
  )
  out = shaping_stages.obs_prediction_diagnostics(r)
  # TOOL tokens: 0.2 (hit), 0.4, 0.7 (hit).
  np.testing.assert_allclose(out.info["obs_pred_prob"], 1.3 / 3, rtol=1e-6)
  np.testing.assert_allclose(out.info["obs_pred_acc"], 2 / 3, rtol=1e-6)
  np.testing.assert_allclose(out.info["horizon_rate"], 0.5)
  assert float(out.info["x"]) == 1.0


def test_dense_aux_advantage_gives_turn_tokens_their_shaping_reward():
  import types as pytypes  # noqa: PLC0415

  rl_cfg = pytypes.SimpleNamespace(
      pbrs_coef=2.0, discount=1.0, pbrs_cutoff="keep"
  )
  # One turn; row 0 answered (terminal: Phi(s_1) = 0), row 1 cut off
  # at the turn budget (Phi(s_1) kept).
  traj = _traj(
      [[1, 2, 3, 4]] * 2,
      [[P, A, A, _]] * 2,
      finish=[types.ANSWERED, types.MAX_TURNS],
  )
  r = _rollout().replace(
      traj=traj, phi=jnp.asarray([[0.25, 0.5, 0.0], [0.25, 0.5, 0.0]])
  )
  out = shaping_stages.dense_aux_advantage(r, rl_cfg=rl_cfg, max_turns=2)
  # F_0 = 2 * (Phi(s_1) - Phi(s_0)): row 0: 2 * (0 - 0.25); row 1: 2 * 0.25.
  np.testing.assert_allclose(
      out.aux_advantage, [[0.0, -0.5, -0.5, 0.0], [0.0, 0.5, 0.5, 0.0]]
  )


@pytest.mark.parametrize(
    "sense, reward", [("max", [0.0, 0.5, 1.0]), ("min", [2.0, 1.5, 1.0])]
)
def test_dual_penalty_by_sense(sense, reward):
  traj = _traj(
      [[1, 2]] * 3,
      [[P, A]] * 3,
      facts={"num_tool_calls": jnp.asarray([2, 1, 0], jnp.int32)},
  )
  r = batch_lib.Rollout(
      traj=traj, reward=jnp.ones(3, jnp.float32), parts={}, info={}
  )
  out = shaping_stages.dual_penalty(
      r, jnp.float32(0.5), fact="num_tool_calls", sense=sense
  )
  np.testing.assert_array_equal(out.reward, reward)
  assert out.reward.dtype == jnp.float32
  np.testing.assert_allclose(out.dual_observed, 1.0)
  with pytest.raises(KeyError):
    shaping_stages.dual_penalty(r, jnp.float32(0.5), fact="x", sense=sense)


# ------------------------------------------------------- stages/replay.py


def _buffer_with_task_a():
  """A 2-slot buffer holding task A's (prompt 5 6) success 9 9, reward 1."""
  buf = replay.init(2, 4)
  t = _traj([[5, 6, 9, 9]], [[P, P, A, A]])
  return replay.insert(
      buf,
      replay.task_keys(t.tokens, t.role),
      t.tokens,
      t.role,
      jnp.full((1, 4), -0.25),
      jnp.asarray([1.0]),
      jnp.asarray([True]),
      jnp.int32(0),
      t.turn,
  )


def _replay_rollout(reward):
  """One group of 2 of task A (answers 1 1, 2 2), then one of task B (7 8)."""
  traj = _traj(
      [[5, 6, 1, 1], [5, 6, 2, 2], [7, 8, 3, 0], [7, 8, 4, 4]],
      [[P, P, A, A], [P, P, A, A], [P, P, A, _], [P, P, A, A]],
      group=[0, 0, 1, 1],
      logprob=[[0.0, 0.0, -1.0, -1.0]] * 4,
  )
  return batch_lib.Rollout(
      traj=traj,
      reward=jnp.asarray(reward, jnp.float32),
      parts={},
      info={},
      mask=traj.role == A,
  )


def test_train_rows_are_the_fresh_batch():
  r = replay_stages.train_rows(_rollout())
  assert r.train_traj is r.traj
  assert r.fresh_reward is None and r.replay is None


def test_replay_fresh_keys_the_tasks_by_prompt():
  r = replay_stages.replay_fresh(_replay_rollout([0.0, 0.0, 1.0, 0.0]))
  assert r.train_traj is r.traj and r.fresh_reward is r.reward
  keys = np.asarray(r.fresh_keys)
  assert r.fresh_keys.dtype == jnp.uint32 and keys.shape == (4,)
  assert keys[0] == keys[1] and keys[2] == keys[3] and keys[0] != keys[2]
  np.testing.assert_array_equal(
      keys, replay.task_keys(r.traj.tokens, r.traj.role)
  )


def test_replay_inject_and_mask_replace_the_failed_groups_last_row():
  # Group 0 (task A) fails and A is buffered: its row 1 becomes 5 6 9 9 with
  # the stored reward and log-probs. Group 1 (task B) has a success.
  buf = _buffer_with_task_a()
  r = replay_stages.replay_fresh(_replay_rollout([0.0, 0.0, 1.0, 0.0]))
  r = replay_stages.replay_inject(r, buf, group_size=2, success_threshold=1.0)
  np.testing.assert_array_equal(r.injected, [False, True, False, False])
  np.testing.assert_array_equal(r.train_traj.tokens[1], [5, 6, 9, 9])
  np.testing.assert_array_equal(r.train_traj.logprob[1], [-0.25] * 4)
  np.testing.assert_array_equal(r.train_traj.num_turns, [1, 1, 1, 1])
  np.testing.assert_array_equal(r.reward, [0.0, 1.0, 1.0, 0.0])
  np.testing.assert_array_equal(r.fresh_reward, [0.0, 0.0, 1.0, 0.0])
  np.testing.assert_array_equal(r.traj.tokens[1], [5, 6, 2, 2])
  # The injected row trains on its own POLICY tokens; row 2's pad stays out.
  r = r.replace(mask=r.mask.at[1].set(False))
  out = replay_stages.injected_mask(r)
  np.testing.assert_array_equal(out.mask[1], [False, False, True, True])
  np.testing.assert_array_equal(out.mask[2], [False, False, True, False])
  assert float(out.info["replay_injected"]) == 1.0


def test_replay_store_keeps_the_fresh_rewards():
  buf = _buffer_with_task_a()
  r = replay_stages.replay_fresh(_replay_rollout([0.0, 0.0, 1.0, 0.0]))
  r = replay_stages.replay_inject(r, buf, group_size=2, success_threshold=1.0)
  out = replay_stages.replay_store(r, buf, jnp.int32(7), success_threshold=1.0)
  # Only task B's fresh success (row 2) is new; A's slot keeps 9 9 (the
  # injected reward 1 is not paired with the fresh tokens 2 2).
  new = out.replay
  np.testing.assert_array_equal(new.valid, [True, True])
  np.testing.assert_array_equal(new.tokens, [[5, 6, 9, 9], [7, 8, 3, 0]])
  np.testing.assert_array_equal(new.reward, [1.0, 1.0])
  np.testing.assert_array_equal(new.step, [0, 7])
  sized = replay_stages.replay_size(out)
  assert float(sized.info["replay_size"]) == 2.0
  with pytest.raises(ValueError, match="replay_fresh"):
    replay_stages.replay_store(
        _replay_rollout([0.0] * 4), buf, jnp.int32(7), success_threshold=1.0
    )


def test_sil_sample_draws_valid_slots_with_fresh_baselines():
  buf = _buffer_with_task_a()
  # Fresh rewards of task A's rows 0.5 and 0 (baseline 0.25).
  r = replay_stages.replay_fresh(_replay_rollout([0.5, 0.0, 1.0, 1.0]))
  r = replay_stages.replay_inject(r, buf, group_size=2, success_threshold=1.0)
  key = jax.random.key(3)
  out = replay_stages.sil_sample(r, buf, key, batch_size=3)
  sil = out.sil
  # One valid slot (0): every draw takes it.
  np.testing.assert_array_equal(
      replay.sample_slots(buf, jax.random.fold_in(key, 4), 3), [0, 0, 0]
  )
  np.testing.assert_array_equal(sil.tokens, [[5, 6, 9, 9]] * 3)
  np.testing.assert_array_equal(sil.mask, [[False, False, True, True]] * 3)
  np.testing.assert_array_equal(sil.returns, [1.0] * 3)
  np.testing.assert_allclose(sil.baseline, [0.25] * 3)
  np.testing.assert_array_equal(sil.valid, [True] * 3)
  assert sil.tokens.dtype == jnp.int32 and sil.mask.dtype == jnp.bool_


# ------------------------------------------------------ stages/logprobs.py


def _fwd_config(num_minibatches=1, num_microbatches=1):
  import types as pytypes  # noqa: PLC0415

  return pytypes.SimpleNamespace(
      rl=pytypes.SimpleNamespace(
          num_minibatches=num_minibatches,
          num_microbatches=num_microbatches,
          temperature=1.0,
      )
  )


@pytest.mark.parametrize("with_obs, want", [(False, 3), (True, 4)])
def test_loss_length_reads_the_mask_and_the_tool_tokens(with_obs, want):
  # Row 1's TOOL token at column 3 is a loss target with next-observation
  # prediction only; the masks' last set column is 2.
  r = _rollout(mask=jnp.asarray([[0, 1, 1, 0], [0, 1, 0, 0]], bool))
  r = r.replace(train_traj=r.traj.replace(role=r.traj.role.at[1, 3].set(T)))
  out = logprob_stages.loss_length(r, with_obs=with_obs)
  assert int(out.loss_length) == want
  assert out.loss_length.dtype == jnp.int32


def test_reference_logprobs_run_the_forward_with_the_reference(monkeypatch):
  seen = []

  def fake_forward(config, graphdef, params, tokens_bl, with_values=False):
    seen.append((graphdef, params, tokens_bl.shape))
    return -0.5 * tokens_bl.astype(jnp.float32), None

  monkeypatch.setattr(behaviour, "behaviour_forward", fake_forward)
  r = _rollout()
  r = r.replace(train_traj=r.traj, loss_length=jnp.int32(2))
  out = logprob_stages.reference_logprobs(
      r, "ref", config=_fwd_config(), graphdef="g", update_lengths=None
  )
  assert seen == [("g", "ref", (2, 4))]
  np.testing.assert_allclose(out.ref_logp, -0.5 * np.asarray(r.traj.tokens))
  # On a length bucket: the shortest of (2, 4) holding 2 columns; the
  # columns from it on are 0.
  out = logprob_stages.reference_logprobs(
      r, "ref", config=_fwd_config(), graphdef="g", update_lengths=(2, 4)
  )
  want = -0.5 * np.asarray(r.traj.tokens, np.float32)
  want[:, 2:] = 0.0
  np.testing.assert_allclose(out.ref_logp, want)


def test_kl_in_reward_k1_sums_the_masked_log_ratio():
  r = _rollout(
      mask=jnp.asarray([[0, 1, 1, 0], [0, 1, 0, 1]], bool),
      ref_logp=jnp.full((2, 4), -1.0),
  )
  logp = jnp.asarray([[0.0, -0.5, -2.0, 9.0], [0.0, -1.0, 9.0, -3.0]])
  r = r.replace(train_traj=r.traj.replace(logprob=logp))
  out = logprob_stages.kl_in_reward(r, coef=0.5, estimator="k1")
  # k1 = logp - ref_logp on the mask: row 0: 0.5 - 1.0; row 1: 0 - 2.
  np.testing.assert_allclose(out.reward, [1.0 + 0.25, 0.0 + 1.0])
  assert out.reward.dtype == jnp.float32
  with pytest.raises(ValueError, match="estimator"):
    logprob_stages.kl_in_reward(r, coef=0.5, estimator="k9")


def test_sampler_behaviour_is_the_sampled_logprob():
  r = _rollout()
  r = r.replace(train_traj=r.traj)
  out = logprob_stages.sampler_behaviour(r)
  assert out.behaviour_logp is r.traj.logprob and out.old_values is None


def test_behaviour_values_reads_the_value_head(monkeypatch):
  seen = []

  def fake_forward(config, graphdef, params, tokens_bl, with_values=False):
    seen.append(with_values)
    return jnp.zeros(tokens_bl.shape), 0.25 * tokens_bl.astype(jnp.float32)

  monkeypatch.setattr(behaviour, "behaviour_forward", fake_forward)
  r = _rollout()
  r = r.replace(train_traj=r.traj)
  out = logprob_stages.behaviour_values(
      r, "params", config=_fwd_config(), graphdef="g"
  )
  assert seen == [True]
  np.testing.assert_allclose(out.old_values, 0.25 * np.asarray(r.traj.tokens))
  assert out.behaviour_logp is None


def _behaviour_rollout():
  # Row 0 fresh (POLICY at 1, 2), row 1 replaced by a replayed episode.
  traj = _traj(
      [[1, 2, 3, 0], [1, 4, 5, 6]],
      [[P, A, A, _], [P, A, T, A]],
      logprob=[[0.0, -1.0, -2.0, 0.0], [0.0, -1.0, 0.0, -1.0]],
      facts={"tool_free": jnp.asarray([True, True])},
  )
  train = traj.replace(tokens=traj.tokens.at[1, 3].set(7))
  return batch_lib.Rollout(
      traj=traj,
      reward=jnp.zeros(2),
      parts={},
      info={},
      train_traj=train,
      loss_length=jnp.int32(4),
  )


def test_trainer_behaviour_masks_and_measures_the_fresh_rows(monkeypatch):
  # Trainer log-probs -0.5 * token (the sampler recorded -1 and -2).
  def fake_forward(config, graphdef, params, tokens_bl, with_values=False):
    logp = jnp.where(tokens_bl > 0, -0.5, 0.0) * tokens_bl
    return logp, (jnp.ones(tokens_bl.shape) if with_values else None)

  monkeypatch.setattr(behaviour, "behaviour_forward", fake_forward)
  r = _behaviour_rollout()
  out = logprob_stages.trainer_behaviour(
      r,
      "params",
      config=_fwd_config(),
      graphdef="g",
      update_lengths=None,
      with_values=False,
  )
  # Trainer log-probs -0.5 * token on POLICY tokens, 0 elsewhere.
  np.testing.assert_allclose(
      out.behaviour_logp, [[0.0, -1.0, -1.5, 0.0], [0.0, -2.0, 0.0, -3.5]]
  )
  assert out.old_values is None and out.behaviour_shift is None
  # Fresh row 0 only: |-1 - -1| = 0, |-2 - -1.5| = 0.5.
  np.testing.assert_allclose(out.info["logp_mismatch_max"], 0.5)
  np.testing.assert_allclose(out.info["logp_mismatch_mean"], 0.25)
  out = logprob_stages.trainer_behaviour(
      r,
      "params",
      config=_fwd_config(),
      graphdef="g",
      update_lengths=None,
      with_values=True,
  )
  np.testing.assert_array_equal(out.old_values, np.ones((2, 4)))


def test_trainer_behaviour_on_a_bucket_drops_the_late_columns(monkeypatch):
  monkeypatch.setattr(
      behaviour,
      "behaviour_forward",
      lambda config, graphdef, params, t, with_values=False: (
          -0.5 * t.astype(jnp.float32),
          None,
      ),
  )
  r = _behaviour_rollout().replace(loss_length=jnp.int32(2))
  out = logprob_stages.trainer_behaviour(
      r,
      "params",
      config=_fwd_config(),
      graphdef="g",
      update_lengths=(2, 4),
      with_values=False,
  )
  np.testing.assert_allclose(
      out.behaviour_logp, [[0.0, -1.0, 0.0, 0.0], [0.0, -2.0, 0.0, 0.0]]
  )
  # Row 0, column 1 only: |-1 - -1| = 0.
  np.testing.assert_allclose(out.info["logp_mismatch_max"], 0.0)


def test_trainer_behaviour_masked_rows_of_the_dual_path(monkeypatch):
  monkeypatch.setattr(
      behaviour,
      "behaviour_forward",
      lambda config, graphdef, params, t, with_values=False: (
          jnp.full(t.shape, -1.0),
          None,
      ),
  )
  seen = []

  def fake_masked(config, graphdef, params, tokens, logp, rows, banned):
    seen.append((np.asarray(rows).tolist(), banned))
    shift = jnp.where(rows[:, None], 0.25, 0.0) * jnp.ones(tokens.shape)
    return logp + shift, shift

  monkeypatch.setattr(behaviour, "masked_behaviour_logprobs", fake_masked)
  out = logprob_stages.trainer_behaviour(
      _behaviour_rollout(),
      "params",
      config=_fwd_config(),
      graphdef="g",
      update_lengths=None,
      with_values=False,
      banned_tokens=(9,),
  )
  # Only the fresh tool-free row 0 is re-scored under the mask.
  assert seen == [([True, False], (9,))]
  np.testing.assert_allclose(
      out.behaviour_shift, [[0.0, 0.25, 0.25, 0.0], [0.0, 0.0, 0.0, 0.0]]
  )
  np.testing.assert_allclose(out.behaviour_logp[0], [0.0, -0.75, -0.75, 0.0])


# ---------------------------------------------------- stages/advantages.py


def _smoke_rl(**overrides):
  from configs import default  # noqa: PLC0415

  rl = default.get_config("smoke").rl
  for name, value in overrides.items():
    setattr(rl, name, value)
  return rl


def _advantage_rollout(reward, **kw):
  # One group of two one-turn episodes with POLICY tokens at columns 1, 2.
  traj = _traj([[1, 2, 3, 0]] * 2, [[P, A, A, _]] * 2, group=[0, 0])
  return batch_lib.Rollout(
      traj=traj,
      reward=jnp.asarray(reward, jnp.float32),
      parts={},
      info={},
      train_traj=traj,
      **kw,
  )


def test_gae_advantages_with_zero_values_are_the_returns():
  # discount 1, lambda 1, V_old = 0: every POLICY token's advantage and
  # return is the episode reward.
  rl = _smoke_rl(advantage_estimator="gae", gae_lambda=1.0, discount=1.0)
  r = _advantage_rollout([1.0, -0.5], old_values=jnp.zeros((2, 4)))
  out = advantage_stages.gae_advantages(r, rl_cfg=rl)
  want = [[0.0, 1.0, 1.0, 0.0], [0.0, -0.5, -0.5, 0.0]]
  np.testing.assert_allclose(out.advantage, want)
  np.testing.assert_allclose(out.returns, want)
  np.testing.assert_allclose(out.adv_b, [1.0, -0.5])
  assert out.reward is r.reward


def test_advantages_grpo_on_one_group():
  # Rewards 1 and 0: mean 0.5, std 0.5 (ddof 0): advantages +-1 (eps 1e-6).
  rl = _smoke_rl(advantage_estimator="grpo", pbrs_coef=0.0)
  out = advantage_stages.advantages(
      _advantage_rollout([1.0, 0.0]),
      rl_cfg=rl,
      max_turns=1,
      value_targets=False,
  )
  np.testing.assert_allclose(out.adv_b, [1.0, -1.0], rtol=1e-5)
  np.testing.assert_allclose(
      out.advantage,
      [[0.0, 1.0, 1.0, 0.0], [0.0, -1.0, -1.0, 0.0]],
      rtol=1e-5,
  )
  np.testing.assert_array_equal(out.reward, [1.0, 0.0])
  assert out.returns is None


def test_advantages_value_targets_read_the_unshaped_reward():
  # PBRS, Phi = 0.5 * phi; one turn, ANSWERED (Phi(s_1) = 0, terminal): the
  # telescoped return is R + Phi(s_1) - Phi(s_0) = R - 0.5; the value
  # targets (lambda = 1, V_old = 0) stay the unshaped R.
  rl = _smoke_rl(
      advantage_estimator="grpo", pbrs_coef=0.5, gae_lambda=0.95, discount=1.0
  )
  r = _advantage_rollout(
      [1.0, 0.0],
      phi=jnp.asarray([[1.0, 2.0]] * 2),
      old_values=jnp.zeros((2, 4)),
  )
  out = advantage_stages.advantages(
      r, rl_cfg=rl, max_turns=1, value_targets=True
  )
  np.testing.assert_allclose(out.reward, [0.5, -0.5])
  np.testing.assert_allclose(
      out.returns, [[0.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]]
  )


def test_step_reward_diagnostics_valid_call_sum():
  # K = 2; row 0 took 2 turns, row 1 one. Scored: tool-call turns taken.
  rl = _smoke_rl(
      step_reward="valid_call",
      step_reward_transform="sum",
      step_reward_coef=0.5,
      step_reward_clip_quantile=0.0,
  )
  facts = {
      "valid_call_turn": jnp.asarray([[1.0, 0.0], [1.0, 1.0]]),
      "tool_call_turn": jnp.asarray([[True, True], [True, True]]),
  }
  traj = _traj([[1, 2]] * 2, [[P, A]] * 2, facts=facts).replace(
      num_turns=jnp.asarray([2, 1], jnp.int32)
  )
  r = batch_lib.Rollout(
      traj=traj,
      reward=jnp.ones(2),
      parts={},
      info={"x": jnp.float32(1.0)},
      train_traj=traj,
  )
  out = advantage_stages.step_reward_diagnostics(r, rl_cfg=rl, max_turns=2)
  # Per episode: row 0 0.5 * (1 + 0), row 1 0.5 * 1 (turn 1 not taken).
  np.testing.assert_allclose(out.info["step_reward_raw"], 0.5)
  np.testing.assert_allclose(out.info["step_reward"], 0.5)
  assert set(out.info) == {"x", "step_reward", "step_reward_raw"}
  with pytest.raises(KeyError):
    advantage_stages.step_reward_diagnostics(
        r.replace(train_traj=_traj([[1, 2]] * 2, [[P, A]] * 2)),
        rl_cfg=rl,
        max_turns=2,
    )


# ---------------------------------------------------------- stages/pack.py


def _packed_rollout(**kw):
  r = _rollout(
      mask=jnp.asarray([[0, 1, 1, 0], [0, 1, 0, 1]], bool),
      behaviour_logp=jnp.full((2, 4), -1.0),
      ref_logp=jnp.full((2, 4), -2.0),
      advantage=jnp.full((2, 4), 0.5),
      adv_b=jnp.asarray([0.5, -0.5]),
      **kw,
  )
  return r.replace(train_traj=r.traj)


def test_pack_the_required_keys_only():
  r = _packed_rollout()
  batch = pack_stages.pack(
      r,
      "params",
      jax.random.key(0),
      graphdef="g",
      episode_reward=False,
      log_partition=False,
      obs_prediction=False,
      placebo=False,
  )
  assert isinstance(batch, batch_lib.LearnerBatch)
  unset = [
      f.name
      for f in dataclasses.fields(batch)
      if getattr(batch, f.name) is None
  ]
  assert len(unset) == 9 and "tokens" not in unset
  assert batch.tokens is r.train_traj.tokens and batch.mask is r.mask
  assert batch.advantage is r.advantage


def test_pack_optional_keys(monkeypatch):
  seen = []

  def fake_embedding(graphdef, params, traj):
    seen.append((graphdef, params))
    return jnp.ones((traj.tokens.shape[0], 3))

  monkeypatch.setattr(pack_stages, "prompt_embedding", fake_embedding)
  sil = batch_lib.SilSample(
      tokens=jnp.zeros((1, 4), jnp.int32),
      mask=jnp.ones((1, 4), bool),
      returns=jnp.asarray([1.0]),
      baseline=jnp.asarray([0.25]),
      valid=jnp.asarray([True]),
  )
  r = _packed_rollout(
      old_values=jnp.zeros((2, 4)),
      returns=jnp.ones((2, 4)),
      sil=sil,
      behaviour_shift=jnp.full((2, 4), 0.1),
      aux_advantage=jnp.full((2, 4), 3.0),
  )
  key = jax.random.key(7)
  batch = pack_stages.pack(
      r,
      "params",
      key,
      graphdef="g",
      episode_reward=True,
      log_partition=True,
      obs_prediction=True,
      placebo=True,
  )
  assert seen == [("g", "params")]
  np.testing.assert_array_equal(batch.reward_hat, [0.5, -0.5])
  assert batch.prompt_embedding.shape == (2, 3)
  assert batch.returns is r.returns and batch.old_values is r.old_values
  assert batch.sil is sil
  assert batch.behaviour_shift is r.behaviour_shift
  np.testing.assert_array_equal(
      batch.aux_advantage, [[0.0, 3.0, 3.0, 0.0], [0.0, 3.0, 0.0, 3.0]]
  )
  # Row 1's only TOOL token (column 2) is the observation target.
  np.testing.assert_array_equal(
      batch.obs_mask, [[False] * 4, [False, False, True, False]]
  )
  np.testing.assert_array_equal(
      batch.obs_targets,
      credit.shuffle_observation_targets(
          r.traj.tokens, batch.obs_mask, jax.random.fold_in(key, 5)
      ),
  )


# --------------------------------------------------------- stages/build.py


def _stage_names(**rl_overrides):
  import types as pytypes  # noqa: PLC0415

  from configs import default  # noqa: PLC0415

  config = default.get_config("smoke")
  for name, value in rl_overrides.items():
    setattr(config.rl, name, value)
  env = pytypes.SimpleNamespace(max_turns=2)
  stages = build_stages_lib.build_stages(config, env, None, None)
  return [s.__name__ for s in stages]


_TAIL = ["loss_length", "reference_logprobs", "trainer_behaviour", "advantages"]


def test_build_stages_default_grpo():
  assert _stage_names() == [
      "sample",
      "env_reward_info",
      "policy_mask",
      "overlong",
      "train_rows",
      *_TAIL,
  ]


def test_build_stages_orders_the_shared_passes_before_their_readers():
  # The gold pass before the likelihood reward (and the 'trace' potential);
  # the observation pass before the dark-room diagnostics.
  names = _stage_names(
      likelihood_coef=0.1,
      pbrs_coef=0.5,
      pbrs_potential="trace",
      log_obs_prediction=True,
      dual_constraint="num_tool_calls",
  )
  assert names[4:11] == [
      "gold_logprobs",
      "likelihood_reward",
      "potential",
      "observation_scores",
      "obs_prediction_diagnostics",
      "dual_penalty",
      "train_rows",
  ]
  # An 'obs_prediction' potential reads the observation pass: it runs
  # before the potential, once.
  names = _stage_names(pbrs_coef=0.5, pbrs_potential="obs_prediction")
  assert names[4:8] == [
      "observation_scores",
      "potential",
      "obs_prediction_diagnostics",
      "train_rows",
  ]


def test_build_stages_replay_and_trainer_behaviour():
  names = _stage_names(
      replay_capacity=8,
      replay_inject=True,
      sil_coef=0.1,
      behaviour_logprobs="trainer",
      kl_reward_coef=0.01,
  )
  assert names[4:] == [
      "replay_fresh",
      "replay_inject",
      "replay_store",
      "injected_mask",
      "sil_sample",
      "replay_size",
      "loss_length",
      "reference_logprobs",
      "kl_in_reward",
      "trainer_behaviour",
      "advantages",
  ]
  names = _stage_names(replay_capacity=8)
  assert names[4:7] == ["replay_fresh", "replay_store", "replay_size"]


def test_build_stages_gae_and_step_rewards():
  names = _stage_names(advantage_estimator="gae", behaviour_logprobs="sampler")
  assert names[-3:] == [
      "sampler_behaviour",
      "behaviour_values",
      "gae_advantages",
  ]
  names = _stage_names(step_reward="valid_call", step_reward_coef=0.1)
  assert names[-2:] == ["step_reward_diagnostics", "advantages"]


def test_build_sample_and_env_reward_info_with_the_soft_penalty():
  # The first two stages of a config with the soft overlong penalty and
  # dynamic sampling x2, on a host-style first round (ctx.first_traj).
  import types as pytypes  # noqa: PLC0415

  import ml_collections  # noqa: PLC0415

  from configs import default  # noqa: PLC0415

  config = default.get_config("smoke")
  config.rl.batch_size = 4
  config.rl.group_size = 2
  config.rl.dynamic_sampling_oversample = 2
  config.rl.dynamic_sampling_max_retries = 0
  config.rl.dynamic_sampling_metric = "reward"
  config.rl.rewards = ml_collections.ConfigDict({"correct": 1.0})
  config.rl.overlong_soft_max = 3
  config.rl.overlong_soft_cache = 2
  stages = build_stages_lib.build_stages(
      config, pytypes.SimpleNamespace(max_turns=2), None, None
  )
  assert [s.__name__ for s in stages[:2]] == ["sample", "env_reward_info"]
  # 4 groups of 2: env (correct) rewards and POLICY token counts; penalties
  # 0 (1 token), -0.5 (2), -1 (3). Penalised: [0, 0], [1, 0.5], [0, 0],
  # [0, 1]: groups 1 and 3 are kept.
  env_b = [1, 0, 1, 1, 0, 0, 0, 1]
  tokens = np.zeros((8, 4), np.int32)
  tokens[:, 0] = np.arange(8)
  role = [[A] * n + [_] * (4 - n) for n in [3, 1, 1, 2, 1, 1, 1, 1]]
  traj = _traj(
      tokens,
      role,
      group=np.repeat(np.arange(4, dtype=np.int32), 2),
      facts={"correct": jnp.asarray(env_b, bool)},
  )
  ctx = batch_lib.StageContext(
      key=jax.random.PRNGKey(0),
      step=jnp.int32(0),
      params=None,
      ref_params=None,
      first_traj=traj,
  )
  r = stages[1](stages[0](None, ctx), ctx)
  np.testing.assert_array_equal(r.traj.tokens[:, 0], [2, 3, 6, 7])
  np.testing.assert_array_equal(r.env_reward, [1.0, 1.0, 0.0, 1.0])
  np.testing.assert_array_equal(r.reward, [1.0, 0.5, 0.0, 1.0])
  assert float(r.info["env_reward"]) == 0.75
  assert float(r.info["overlong_soft_penalty"]) == -0.125
  assert float(r.info["usable_groups"]) == 1.0


def test_chain_runs_the_stages_in_order():
  calls = []

  def stage(name):
    def fn(r, ctx):
      calls.append((name, r, ctx))
      return f"{r}>{name}"

    return fn

  run = build_stages_lib.chain(stage("a"), stage("b"))
  assert run(None, "ctx") == "None>a>b"
  assert calls == [("a", None, "ctx"), ("b", "None>a", "ctx")]
