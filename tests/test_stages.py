"""The collect stages as functions: the typed batch and each lifted stage on
hand values (tiny arrays, no model)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentic_rl import types
from agentic_rl.learner import batch as batch_lib


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


def test_sil_sample_as_dict_uses_the_update_keys():
  s = batch_lib.SilSample(
      tokens=jnp.zeros((1, 3), jnp.int32),
      mask=jnp.ones((1, 3), bool),
      returns=jnp.asarray([1.0]),
      baseline=jnp.asarray([0.25]),
      valid=jnp.asarray([True]),
  )
  d = s.as_dict()
  assert set(d) == {"tokens", "mask", "return", "baseline", "valid"}
  assert d["return"] is s.returns and d["baseline"] is s.baseline


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
