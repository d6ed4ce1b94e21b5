"""FlowRL trajectory-balance loss and learned log-partition: hand values."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from agentic_rl import losses


def _rows():
  # Row 0: tokens logp [-1, -3] (mean -2), ref [-2, -2] (mean -2), on-policy.
  # Row 1: one token logp -1, ref -2; behaviour -1 - ln 2 (ratio 2 -> w 1.2).
  # Row 2: no POLICY token (left out).
  logp = jnp.array([[-1.0, -3.0], [-1.0, -9.0], [-5.0, -5.0]])
  beh = jnp.array([[-1.0, -3.0], [-1.0 - np.log(2.0), 0.0], [0.0, 0.0]])
  ref = jnp.array([[-2.0, -2.0], [-2.0, 0.0], [0.0, 0.0]])
  mask = jnp.array([[True, True], [True, False], [False, False]])
  return logp, beh, ref, mask


def test_flowrl_loss_hand_values_and_gradients():
  logp, beh, ref, mask = _rows()
  r_hat = jnp.array([0.5, -1.0, 3.0])
  log_z = jnp.array([0.3, 0.0, 7.0])
  loss, delta = jax.jit(
      lambda *a: losses.flowrl_loss(*a, beta=2.0, clip_eps=0.2)
  )(logp, beh, ref, mask, r_hat, log_z)
  # delta_0 = 0.3 - 2 - 1 + 2 = -0.7 (w 1); delta_1 = 0 - 1 + 2 + 2 = 3 (w 1.2).
  np.testing.assert_allclose(delta[:2], [-0.7, 3.0], rtol=1e-6)
  np.testing.assert_allclose(loss, (0.49 + 1.2 * 9.0) / 2, rtol=1e-6)
  g_z, g_lp = jax.grad(
      lambda z, lp: losses.flowrl_loss(lp, beh, ref, mask, r_hat, z, beta=2.0)[
          0
      ],
      argnums=(0, 1),
  )(log_z, logp)
  # dL/dlogZ_b = 2 w_b delta_b / 2 rows; dL/dlogp_bt = that / |y_b|.
  np.testing.assert_allclose(g_z, [-0.7, 3.6, 0.0], rtol=1e-5)
  np.testing.assert_allclose(
      g_lp, [[-0.35, -0.35], [3.6, 0.0], [0.0, 0.0]], rtol=1e-5, atol=1e-7
  )
  with pytest.raises(ValueError, match="beta"):
    losses.flowrl_loss(logp, beh, ref, mask, r_hat, log_z, beta=0.0)


def test_log_partition_scalar_and_mlp_start_at_zero_and_learn():
  pooled = jnp.array([[1.0, 2.0], [0.5, -1.0]])
  for hidden in (0, 8):
    model = losses.LogPartition(2, hidden, rngs=nnx.Rngs(0))
    np.testing.assert_allclose(model(pooled), [0.0, 0.0])
    # With the policy terms fixed, the optimal log Z of a row is -rest_b:
    # gradient descent on log Z alone lowers the loss.
    logp, beh, ref, mask = _rows()
    r_hat = jnp.array([0.5, -1.0, 0.0])
    graphdef, params = nnx.split(model)

    def loss_fn(p):
      z = nnx.merge(graphdef, p)(jnp.concatenate([pooled, pooled[:1]]))
      return losses.flowrl_loss(logp, beh, ref, mask, r_hat, z, beta=2.0)[0]

    l0, g = jax.value_and_grad(loss_fn)(params)
    assert any(float(jnp.abs(x).sum()) > 0 for x in jax.tree.leaves(g))
    params = jax.tree.map(lambda p, d: p - 0.05 * d, params, g)
    assert float(loss_fn(params)) < float(l0)


def test_masked_mean_pool():
  h = jnp.arange(12.0).reshape(1, 3, 4)
  pooled = losses.masked_mean_pool(h, jnp.array([[True, False, True]]))
  np.testing.assert_allclose(pooled, [[4.0, 5.0, 6.0, 7.0]])


def test_flowrl_micro_batches_with_shared_denominator_sum_to_full():
  logp, beh, ref, mask = _rows()
  r_hat = jnp.array([0.5, -1.0, 3.0])
  log_z = jnp.array([0.3, 0.0, 7.0])
  full, _ = losses.flowrl_loss(logp, beh, ref, mask, r_hat, log_z, beta=2.0)
  den = losses.aggregation_denominator(mask, "seq-mean-token-mean")
  assert float(den) == 2.0  # row 2 has no POLICY token
  parts = sum(
      losses.flowrl_loss(
          logp[s],
          beh[s],
          ref[s],
          mask[s],
          r_hat[s],
          log_z[s],
          beta=2.0,
          denominator=den,
      )[0]
      for s in (slice(0, 1), slice(1, 3))
  )
  np.testing.assert_allclose(parts, full, rtol=1e-6)
  np.testing.assert_allclose(full, (0.49 + 1.2 * 9.0) / 2, rtol=1e-6)
