"""Clipped surrogate, k3 KL and token-mean aggregation on a hand-computed batch."""

import math

import jax.numpy as jnp
import ml_collections
import numpy as np

from agentic_rl import learner
from agentic_rl import losses


def test_k3_values_and_clamp():
  # d = ref - logp = ln 2  ->  2 - ln 2 - 1.
  v = losses.kl_k3(jnp.array([0.0]), jnp.array([math.log(2.0)]))
  np.testing.assert_allclose(v, [1.0 - math.log(2.0)], rtol=1e-6)
  assert float(losses.kl_k3(jnp.array(0.3), jnp.array(0.3))) == 0.0
  big = losses.kl_k3(jnp.array([0.0]), jnp.array([-jnp.inf]))
  assert np.isfinite(np.asarray(big)).all()


def test_clipped_surrogate_hand_values():
  logp = jnp.log(jnp.array([1.5, 0.5, 1.1, 0.7]))  # ratios vs behaviour 0
  beh = jnp.zeros(4)
  adv = jnp.array([2.0, 2.0, -1.0, -1.0])
  loss, ratio = losses.clipped_surrogate(logp, beh, adv, 0.2, 0.3)
  np.testing.assert_allclose(ratio, [1.5, 0.5, 1.1, 0.7], rtol=1e-6)
  # A>0: -min(1.5*2, 1.3*2) = -2.6 ; -min(0.5*2, 0.8*2) = -1.0
  # A<0: -min(-1.1, -1.1) = 1.1 ; -min(-0.7, -0.8) = 0.8
  np.testing.assert_allclose(loss, [-2.6, -1.0, 1.1, 0.8], rtol=1e-6)


def test_token_mean_loss_of_known_batch():
  """GRPO loss of a 2 x 4 batch, POLICY tokens only, computed by hand."""
  rl = ml_collections.ConfigDict(
      dict(
          temperature=1.0,
          clip_low=0.2,
          clip_high=0.2,
          loss_type="ppo",
          dual_clip=0.0,
          loss_agg_mode="token-mean",
          loss_norm_constant=0,
          kl_estimator="k3",
          entropy_coef=0.0,
      )
  )
  mask = jnp.array([[False, True, True, False], [False, True, False, False]])
  logp = jnp.log(jnp.array([[0.9, 0.5, 0.25, 0.3], [0.9, 0.8, 0.1, 0.1]]))
  batch = learner.LearnerBatch(
      tokens=jnp.zeros((2, 4), jnp.int32),
      mask=mask,
      behaviour_logp=jnp.log(
          jnp.array([[0.1, 0.5, 0.5, 0.1], [0.1, 0.4, 0.1, 0.1]])
      ),
      ref_logp=jnp.log(
          jnp.array([[0.2, 0.25, 0.25, 0.7], [0.2, 0.8, 0.7, 0.7]])
      ),
      advantage=jnp.array([[0.0, 1.0, 1.0, 0.0], [0.0, -2.0, 0.0, 0.0]]),
  )
  # Token (0,1): ratio 1, A=1 -> pg -1; k3 with d = ln(0.25/0.5): 0.5 - ln 0.5 - 1.
  # Token (0,2): ratio 0.5, A=1 -> -min(0.5, 0.8) = -0.5; k3: d = 0 -> 0.
  # Token (1,1): ratio 2, A=-2 -> -min(-4, -2.4) = 4; k3: d = 0 -> 0.
  k3 = 0.5 - math.log(0.5) - 1.0
  expected = (-1.0 + 0.5 * k3 - 0.5 + 4.0) / 3.0

  def fake_token_logprobs(graphdef, params, tokens, temperature):
    del graphdef, params, tokens, temperature
    return logp, jnp.zeros_like(logp)

  orig = learner.sampling.token_logprobs
  learner.sampling.token_logprobs = fake_token_logprobs
  try:
    loss, metrics = learner._rl_loss(
        None, None, batch, rl, kl_coef=0.5, denominator=None
    )
  finally:
    learner.sampling.token_logprobs = orig
  np.testing.assert_allclose(float(loss), expected, rtol=1e-6)
  np.testing.assert_allclose(float(metrics["kl"]), k3 / 3.0, rtol=1e-6)
  np.testing.assert_allclose(float(metrics["pg_loss"]), 2.5 / 3.0, rtol=1e-6)
  # Clipping is active only for ratio > 1 + eps with A > 0 (high) or ratio < 1 - eps
  # with A < 0 (low): token (0,2) has ratio 0.5 with A > 0 and token (1,1) ratio 2
  # with A < 0, so neither fraction counts any token.
  assert float(metrics["clip_frac_high"]) == 0.0
  np.testing.assert_allclose(float(metrics["clip_frac_low"]), 0.0)


def test_token_mean_ignores_masked_values_even_if_nan_free():
  x = jnp.array([[1.0, 100.0], [3.0, -50.0]])
  m = jnp.array([[True, False], [True, False]])
  assert float(losses.token_mean(x, m)) == 2.0
  assert float(losses.token_mean(x, jnp.zeros_like(m))) == 0.0


def test_padding_mask_from_lengths_with_pad_id_equal_to_eos():
  """Pad id == eos id (2): the mask comes from the real length, never from
  comparing token values; lengths 3 and 5 give the same entropy whether the
  batch is padded to 5 or to 10."""
  from agentic_rl import sampling
  from tests import fakes

  eos = pad = 2
  response = jnp.array([[7, 8, eos, pad, pad]])
  mask = losses.length_mask(jnp.array([3]), 5)
  np.testing.assert_array_equal(mask, [[True, True, True, False, False]])
  # Comparing with the pad id would drop the real eos token.
  np.testing.assert_array_equal(
      response != pad, [[True, True, False, False, False]]
  )
  np.testing.assert_array_equal(
      losses.length_mask(jnp.array([3, 2]), 6, start_b=jnp.array([1, 0])),
      [[0, 1, 1, 1, 0, 0], [1, 1, 0, 0, 0, 0]],
  )
  graphdef, params, _ = fakes.tiny_policy(0)
  lengths = jnp.array([3, 5])
  rows = jnp.array([[65, 66, eos, pad, pad], [70, 71, 72, 73, eos]])
  out = []
  for width in (5, 10):
    tokens = jnp.pad(rows, ((0, 0), (0, width - 5)), constant_values=pad)
    ent = sampling.token_entropy(graphdef, params, tokens)
    m = losses.length_mask(lengths, width)
    out.append(
        (
            float(losses.aggregate(ent, m, "token-mean")),
            float(losses.aggregate(ent, m, "seq-mean-token-mean")),
        )
    )
  np.testing.assert_allclose(out[0], out[1], rtol=1e-6)


def test_loss_and_gradients_finite_on_a_batch_with_an_unrepresentable_group():
  """Group 0 has four rewards -11.000002 (not exact in float32): its GRPO
  advantages are 0 within 1e-6 and the clipped-surrogate loss, its KL and
  their gradients are finite, eagerly and under jit."""
  import jax
  from agentic_rl import advantages

  r = jnp.array([-11.000002] * 4 + [1.0, 0.0, 1.0, 0.0], jnp.float32)
  g = jnp.repeat(jnp.arange(2, dtype=jnp.int32), 4)
  mask = jnp.ones((8, 3), bool)
  beh = jnp.full((8, 3), -1.0)

  def loss_fn(logp, r):
    adv = advantages.grpo_advantages(r, g)
    pg, _ = losses.clipped_surrogate(logp, beh, adv[:, None], 0.2, 0.2)
    kl = losses.kl_estimate("k3", logp, beh - 0.1)
    return losses.aggregate(pg + 0.1 * kl, mask, "token-mean")

  logp = beh + 0.05
  for fn in (loss_fn, jax.jit(loss_fn)):
    value = fn(logp, r)
    g_logp, g_r = jax.grad(fn, argnums=(0, 1))(logp, r)
    assert np.isfinite(float(value))
    assert np.isfinite(np.asarray(g_logp)).all()
    assert np.isfinite(np.asarray(g_r)).all()
  np.testing.assert_allclose(
      advantages.grpo_advantages(r, g)[:4], 0.0, atol=1e-6
  )
