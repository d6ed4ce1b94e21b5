"""Tree rollouts (PORTool): forks copy the prefix and its KV-cache rows."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentic_rl import credit
from agentic_rl import sampling
from agentic_rl import tree_rollout
from agentic_rl import types
from tests import fakes


@pytest.fixture(scope="module")
def tree():
  env = fakes.EchoEnv()
  graphdef, params, cfg = fakes.tiny_policy(0)
  traj = jax.jit(
      lambda t, k: tree_rollout.tree_rollout(
          env,
          t,
          k,
          max_len=32,
          branching=(2, 2),
          graphdef=graphdef,
          params=params,
          model_config=cfg,
      )
  )(jnp.array([3, 5]), jax.random.PRNGKey(1))
  return traj, graphdef, params


def test_tree_shape_groups_and_shared_prefixes(tree):
  traj, _, _ = tree
  assert traj.tokens.shape == (8, 32)
  np.testing.assert_array_equal(traj.group, [0] * 4 + [1] * 4)
  ends = np.asarray(credit.state_ends(traj.role, traj.turn, 3))
  tok, lp = np.asarray(traj.tokens), np.asarray(traj.logprob)
  for t0 in (0, 4):
    # The four leaves of a task share the prompt; leaves (0,1) and (2,3)
    # share their turn 0 and its observation, token for token and log-prob
    # for log-prob (copied, not re-sampled).
    p = ends[t0, 0]
    assert (tok[t0 : t0 + 4, :p] == tok[t0, :p]).all()
    for a in (t0, t0 + 2):
      e = ends[a, 1]
      assert ends[a + 1, 1] == e
      np.testing.assert_array_equal(tok[a + 1, :e], tok[a, :e])
      np.testing.assert_array_equal(lp[a + 1, :e], lp[a, :e])
      # Siblings sample their own turn 1.
      assert (tok[a + 1, e:] != tok[a, e:]).any()
    # The two first-level branches sampled different turns 0.
    assert (tok[t0, p : ends[t0, 1]] != tok[t0 + 2, p : ends[t0 + 2, 1]]).any()


def test_behaviour_logprobs_match_teacher_forcing_after_forks(tree):
  """Copied KV-cache rows are the right ones: every sampled token's log-prob
  equals the full forward pass's."""
  traj, graphdef, params = tree
  # The trainer's forward, compiled as the trainer runs it (not op by op).
  logp, _ = jax.jit(sampling.token_logprobs, static_argnums=0)(
      graphdef, params, traj.tokens, 1.0
  )
  mask = np.asarray(traj.role) == types.POLICY
  assert mask.sum() > 0
  np.testing.assert_allclose(
      np.asarray(logp)[mask], np.asarray(traj.logprob)[mask], atol=1e-5
  )
  np.testing.assert_array_equal(traj.finish, [types.MAX_TURNS] * 8)
