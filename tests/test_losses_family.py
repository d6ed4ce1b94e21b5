"""Loss family: KL estimators, dual-clip PPO, GSPO, CISPO, aggregation modes,
value loss, KL-penalised rewards and the adaptive KL coefficient.

Expected values are computed by hand in the comments.

Each test's computations run as one jitted program (inputs built with NumPy):
eager code would compile one small XLA program per op and shape. The tests
that compare eager with jitted code keep their eager calls.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentic_rl import losses

EPS = 0.2


def _group_batch():
  """Response X (2 tokens, A=+1) and Y (8 tokens, A=-1), ratio 1, L = 8."""
  mask = jnp.asarray(np.array([[True] * 2 + [False] * 6, [True] * 8]))
  adv = jnp.asarray(np.array([[1.0] * 8, [-1.0] * 8], np.float32))
  logp = jnp.asarray(np.full((2, 8), -1.0, np.float32))
  return logp, adv, mask


# ---------------------------------------------------------------- aggregation


@jax.jit
def _group_aggregation_outputs(logp, adv, mask):
  loss, ratio = losses.clipped_surrogate(logp, logp, adv, EPS, EPS)
  return {
      "ratio": ratio,
      "token_mean": losses.aggregate(loss, mask, "token-mean"),
      "token_mean_fn": losses.token_mean(loss, mask),
      "seq_mean": losses.aggregate(loss, mask, "seq-mean-token-mean"),
      "sum_norm": losses.aggregate(
          loss,
          mask,
          "seq-mean-token-sum-norm",
          num_sequences=2,
          norm_constant=8,
      ),
      "sum_norm_default": losses.aggregate(
          loss, mask, "seq-mean-token-sum-norm"
      ),
  }


def test_group_aggregation_modes_hand_values():
  out = _group_aggregation_outputs(*_group_batch())
  np.testing.assert_allclose(out["ratio"], 1.0)
  # X tokens: -1 (x2); Y tokens: +1 (x8).
  # token-mean: (-2 + 8) / 10 = 0.6.
  np.testing.assert_allclose(out["token_mean"], 0.6, rtol=1e-6)
  np.testing.assert_allclose(out["token_mean"], out["token_mean_fn"], rtol=1e-6)
  # seq-mean-token-mean: (-1 + 1) / 2 = 0.
  np.testing.assert_allclose(out["seq_mean"], 0.0, atol=1e-7)
  # seq-mean-token-sum-norm, constant 8, 2 sequences: 6 / 16 = 0.375.
  np.testing.assert_allclose(out["sum_norm"], 0.375, rtol=1e-6)
  # Defaults: num_sequences = B = 2, norm_constant = L = 8.
  np.testing.assert_allclose(out["sum_norm_default"], 0.375, rtol=1e-6)


@jax.jit
def _empty_rows_outputs(x, m):
  none = jnp.zeros_like(m)
  return losses.aggregate(x, m, "seq-mean-token-mean"), {
      mode: losses.aggregate(x, none, mode) for mode in losses.AGG_MODES
  }


def test_aggregate_empty_rows_and_all_masked():
  x = np.array([[1.0, 3.0], [5.0, 7.0], [9.0, 9.0]], np.float32)
  m = np.array([[True, True], [False, False], [True, False]])
  seq_mean, all_masked = _empty_rows_outputs(x, m)
  # Row means 2 and 9 over the 2 non-empty rows: 5.5.
  np.testing.assert_allclose(seq_mean, 5.5, rtol=1e-6)
  for mode in losses.AGG_MODES:
    assert float(all_masked[mode]) == 0.0


def test_aggregation_denominators_by_hand():
  _, _, mask = _group_batch()
  assert float(losses.aggregation_denominator(mask, "token-mean")) == 10.0
  assert (
      float(losses.aggregation_denominator(mask, "seq-mean-token-mean")) == 2.0
  )
  assert (
      float(losses.aggregation_denominator(mask, "seq-mean-token-sum-norm"))
      == 16.0
  )
  assert (
      float(
          losses.aggregation_denominator(
              mask, "seq-mean-token-sum-norm", norm_constant=4
          )
      )
      == 8.0
  )


@functools.partial(jax.jit, static_argnames="mode")
def _micro_batch_outputs(x, mask, mode):
  full = losses.aggregate(x, mask, mode, norm_constant=8.0)
  denom = losses.aggregation_denominator(mask, mode, norm_constant=8.0)
  parts = [(x[:2], mask[:2]), (x[2:], mask[2:])]
  summed = sum(
      losses.aggregate(xi, mi, mode, denominator=denom) for xi, mi in parts
  )
  denom_parts = sum(
      losses.aggregation_denominator(mi, mode, norm_constant=8.0)
      for _, mi in parts
  )
  local = sum(
      losses.aggregate(xi, mi, mode, norm_constant=8.0) for xi, mi in parts
  )
  return full, denom, summed, denom_parts, local


@pytest.mark.parametrize("mode", losses.AGG_MODES)
def test_micro_batches_with_full_batch_denominator_sum_to_full(mode):
  rng = np.random.default_rng(0)
  x = rng.normal(size=(4, 6)).astype(np.float32)
  mask = rng.random((4, 6)) < 0.6
  mask[1] = False  # one empty sequence
  mask[0, 0] = mask[3, 0] = True
  full, denom, summed, denom_parts, local = _micro_batch_outputs(x, mask, mode)
  np.testing.assert_allclose(summed, full, rtol=1e-6)
  # Denominators are additive over micro-batches (psum-able over devices).
  np.testing.assert_allclose(denom_parts, denom, rtol=1e-6)
  # Without the shared denominator the micro-batch means do NOT sum to it.
  assert not np.isclose(float(local), float(full))


def test_aggregate_unknown_mode_raises():
  x = jnp.zeros((1, 2))
  m = jnp.ones((1, 2), bool)
  with pytest.raises(ValueError, match="bogus"):
    losses.aggregate(x, m, "bogus")
  with pytest.raises(ValueError, match="bogus"):
    losses.aggregation_denominator(m, "bogus")


# ------------------------------------------------------------------------ KL


_KL_FNS = (("k1", losses.kl_k1), ("k2", losses.kl_k2), ("k3", losses.kl_k3))


@jax.jit
def _kl_hand_outputs(same, logp, ref):
  return {
      "same": {
          n: losses.kl_estimate(n, same, same) for n in losses.KL_ESTIMATORS
      },
      "fn": {n: fn(logp, ref) for n, fn in _KL_FNS},
      "estimate": {n: losses.kl_estimate(n, logp, ref) for n, _ in _KL_FNS},
  }


def test_kl_estimators_hand_values():
  logp, ref = np.float32(-1.0), np.float32(-2.0)  # d = ref - logp = -1
  out = _kl_hand_outputs(np.float32(-0.7), logp, ref)
  for name in losses.KL_ESTIMATORS:
    assert float(out["same"][name]) == 0.0
  np.testing.assert_allclose(out["fn"]["k1"], 1.0, rtol=1e-6)
  np.testing.assert_allclose(out["fn"]["k2"], 0.5, rtol=1e-6)
  # k3 = e^-1 - (-1) - 1 = e^-1.
  np.testing.assert_allclose(out["fn"]["k3"], math.exp(-1.0), rtol=1e-6)
  np.testing.assert_allclose(out["fn"]["k3"], 0.3679, atol=1e-4)
  for name, _ in _KL_FNS:
    assert float(out["estimate"][name]) == float(out["fn"][name])


@jax.jit
def _kl_clamp_outputs(logp, ref):
  return {
      "fn": {n: fn(logp, ref) for n, fn in _KL_FNS},
      "value": {
          n: losses.kl_estimate(n, logp, ref) for n in losses.KL_ESTIMATORS
      },
      "grad": {
          n: jax.grad(lambda lp, n=n: losses.kl_estimate(n, lp, ref))(logp)
          for n in losses.KL_ESTIMATORS
      },
  }


def test_kl_clamp_keeps_extremes_finite_and_bounded():
  # d = -0.5 - (-25) = 24.5, clamped to 20.
  out = _kl_clamp_outputs(np.float32(-25.0), np.float32(-0.5))
  c = losses.KL_LOG_RATIO_CLAMP
  np.testing.assert_allclose(out["fn"]["k1"], -c)
  np.testing.assert_allclose(out["fn"]["k2"], 0.5 * c * c)
  np.testing.assert_allclose(out["fn"]["k3"], math.exp(c) - c - 1, rtol=1e-6)
  for name in losses.KL_ESTIMATORS:
    assert np.isfinite(float(out["value"][name]))
    # Beyond the clamp the gradient w.r.t. logp is 0.
    assert float(out["grad"][name]) == 0.0


@jax.jit
def _random_kl_minima():
  key1, key2 = jax.random.split(jax.random.PRNGKey(0))
  logp = 5.0 * jax.random.normal(key1, (1000,))
  ref = 5.0 * jax.random.normal(key2, (1000,))
  return jnp.min(losses.kl_k3(logp, ref)), jnp.min(losses.kl_k2(logp, ref))


def test_k3_and_k2_nonnegative_on_random_inputs():
  min_k3, min_k2 = _random_kl_minima()
  assert float(min_k3) >= 0.0
  assert float(min_k2) >= 0.0


@functools.partial(jax.jit, static_argnames="name")
def _junk_padding_outputs(logp, ref, logp_j, ref_j, mask, name):
  def agg(lp, rf):
    return losses.aggregate(
        losses.kl_estimate(name, lp, rf), mask, "token-mean"
    )

  return agg(logp, ref), agg(logp_j, ref_j), jax.grad(agg)(logp_j, ref_j)


@pytest.mark.parametrize("name", losses.KL_ESTIMATORS)
def test_junk_padding_leaves_masked_kl_unchanged(name):
  rng = np.random.default_rng(1)
  logp = (-rng.random((2, 10))).astype(np.float32)
  ref = (-rng.random((2, 10))).astype(np.float32)
  mask = np.array([[True] * 5 + [False] * 5] * 2)  # 10 padding positions
  junk_logp = np.array([-np.inf, 1e30, -1e30, 3.0, -np.inf], np.float32)
  junk_ref = np.array([0.0, -np.inf, 1e30, -np.inf, -50.0], np.float32)
  logp_j, ref_j = logp.copy(), ref.copy()
  logp_j[:, 5:] = junk_logp
  ref_j[:, 5:] = junk_ref
  clean, junked, g = _junk_padding_outputs(logp, ref, logp_j, ref_j, mask, name)
  np.testing.assert_allclose(junked, clean, rtol=1e-6)
  assert np.isfinite(np.asarray(g)).all()
  assert np.all(np.asarray(g)[:, 5:] == 0.0)


def test_kl_estimate_unknown_raises():
  with pytest.raises(ValueError, match="k4"):
    losses.kl_estimate("k4", jnp.zeros(1), jnp.zeros(1))


# ------------------------------------------------------------ PPO clipping


@functools.partial(jax.jit, static_argnames="dual_clip")
def _jitted_objective_and_grad(ratio, adv, dual_clip):
  def objective(logp):
    loss, _ = losses.clipped_surrogate(
        logp, jnp.float32(0.0), adv, EPS, EPS, dual_clip=dual_clip
    )
    return -loss

  logp = jnp.log(ratio)
  return objective(logp), jax.grad(objective)(logp)


def _objective_and_grad(ratio, adv, dual_clip=None):
  """Objective -loss and its derivative w.r.t. logp, behaviour logp 0."""
  obj, g = _jitted_objective_and_grad(
      np.float32(ratio), np.float32(adv), dual_clip
  )
  return float(obj), float(g)


def test_clipping_objective_and_gradients():
  # A=+1, ratio 1.5: min(1.5, 1.2) = 1.2, clipped -> no gradient.
  obj, g = _objective_and_grad(1.5, 1.0)
  np.testing.assert_allclose(obj, 1.2, rtol=1e-6)
  assert g == 0.0
  # A=-1, ratio 0.5: min(-0.5, -0.8) = -0.8, clipped -> no gradient.
  obj, g = _objective_and_grad(0.5, -1.0)
  np.testing.assert_allclose(obj, -0.8, rtol=1e-6)
  assert g == 0.0
  # A=-1, ratio 1.5: min(-1.5, -1.2) = -1.5, unclipped: d(rho A)/dlogp = -1.5.
  obj, g = _objective_and_grad(1.5, -1.0)
  np.testing.assert_allclose(obj, -1.5, rtol=1e-6)
  np.testing.assert_allclose(g, -1.5, rtol=1e-6)


def test_dual_clip():
  # c = 3, A=-1, ratio 5: max(min(-5, -1.2), -3) = -3, no gradient.
  obj, g = _objective_and_grad(5.0, -1.0, dual_clip=3.0)
  np.testing.assert_allclose(obj, -3.0, rtol=1e-6)
  assert g == 0.0
  # Below c the dual clip is inactive: ratio 1.5 as plain PPO.
  obj, g = _objective_and_grad(1.5, -1.0, dual_clip=3.0)
  np.testing.assert_allclose((obj, g), (-1.5, -1.5), rtol=1e-6)
  # A > 0 untouched: ratio 5, A=+1 -> 1.2.
  obj, g = _objective_and_grad(5.0, 1.0, dual_clip=3.0)
  np.testing.assert_allclose(obj, 1.2, rtol=1e-6)
  # Default (None) identical to the old behaviour.
  np.testing.assert_allclose(_objective_and_grad(5.0, -1.0)[0], -5.0, rtol=1e-6)
  for bad in (1.0, 0.5):
    with pytest.raises(ValueError, match="dual_clip"):
      losses.clipped_surrogate(
          jnp.zeros(1), jnp.zeros(1), jnp.ones(1), EPS, EPS, dual_clip=bad
      )


# ---------------------------------------------------------------------- GSPO

# Row 0: 3 POLICY tokens, log-ratios 0.1, -0.1, 0.3 -> mean 0.1, s = e^0.1,
#   A = 2: s = 1.10517 in [0.8, 1.2], loss = -2 e^0.1 (unclipped).
# Row 1: 2 POLICY tokens, log-ratios 0.4, 0.6 -> mean 0.5, s = e^0.5 = 1.6487,
#   A = +1: loss = -min(1.6487, 1.2) = -1.2 (clipped).
# Row 2: 2 POLICY tokens, log-ratios -0.5, -0.5 -> s = e^-0.5 = 0.6065,
#   A = -1: loss = -min(-0.6065, -0.8) = 0.8 (clipped).
# Row 3: 1 POLICY token, log-ratio 0.2 -> s = e^0.2 = 1.2214,
#   A = -1: loss = -min(-1.2214, -1.2) = 1.2214 (unclipped: ratio above 1 + eps
#   with A < 0 is not clipped).
_LOG_RATIOS = [
    [0.1, -0.1, 0.3, 0.0],
    [0.4, 0.6, 0.0, 0.0],
    [-0.5, -0.5, 0.0, 0.0],
    [0.2, 0.0, 0.0, 0.0],
]
_GSPO_MASK = [[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 0, 0], [1, 0, 0, 0]]


def _gspo_batch():
  mask = np.array(_GSPO_MASK, bool)
  beh = np.full((4, 4), -1.0, np.float32)
  logp = beh + np.array(_LOG_RATIOS, np.float32)
  logp = np.where(mask, logp, np.float32(-np.inf))  # junk in padding
  adv = np.array([2.0, 1.0, -1.0, -1.0], np.float32)
  return tuple(map(jnp.asarray, (logp, beh, adv, mask)))


_gspo = jax.jit(
    functools.partial(losses.gspo_loss, clip_low=EPS, clip_high=EPS)
)


def test_gspo_hand_values():
  loss_b, s_b = _gspo(*_gspo_batch())
  e = math.exp
  np.testing.assert_allclose(s_b, [e(0.1), e(0.5), e(-0.5), e(0.2)], rtol=1e-6)
  np.testing.assert_allclose(
      loss_b, [-2 * e(0.1), -1.2, 0.8, e(0.2)], rtol=1e-6
  )


@jax.jit
def _gspo_grad(logp, beh, adv, mask):
  return jax.grad(
      lambda lp: jnp.sum(losses.gspo_loss(lp, beh, adv, mask, EPS, EPS)[0])
  )(logp)


def test_gspo_gradient_by_hand():
  g = _gspo_grad(*_gspo_batch())
  # d loss_i / d logp_t = -A_i s_i / |y_i| on unclipped rows, 0 elsewhere.
  expected = np.zeros((4, 4))
  expected[0, :3] = -2.0 * math.exp(0.1) / 3
  expected[3, 0] = 1.0 * math.exp(0.2) / 1
  np.testing.assert_allclose(g, expected, rtol=1e-5, atol=1e-7)


def test_gspo_empty_sequence_has_zero_loss():
  logp = np.zeros((1, 3), np.float32)
  loss_b, s_b = _gspo(
      logp, logp, np.array([5.0], np.float32), np.zeros((1, 3), bool)
  )
  assert float(loss_b[0]) == 0.0 and float(s_b[0]) == 1.0


@jax.jit
def _gspo_token_outputs(logp, beh, adv, mask):
  loss_b, s_b = losses.gspo_loss(logp, beh, adv, mask, EPS, EPS)
  token = [
      losses.gspo_token_loss(logp, beh, a, mask, EPS, EPS)
      for a in (adv, jnp.broadcast_to(adv[:, None], (4, 4)))
  ]

  def token_obj(lp):
    loss_bl, _ = losses.gspo_token_loss(lp, beh, adv, mask, EPS, EPS)
    return losses.aggregate(loss_bl, mask, "seq-mean-token-mean")

  def seq_obj(lp):
    return jnp.mean(losses.gspo_loss(lp, beh, adv, mask, EPS, EPS)[0])

  g_raw = jax.grad(
      lambda lp: jnp.sum(
          jnp.where(
              mask, losses.gspo_token_loss(lp, beh, adv, mask, EPS, EPS)[0], 0.0
          )
      )
  )(logp)
  return {
      "loss_b": jnp.broadcast_to(loss_b[:, None], (4, 4)),
      "s_b": jnp.broadcast_to(s_b[:, None], (4, 4)),
      "token": token,
      "token_obj": token_obj(logp),
      "seq_obj": seq_obj(logp),
      "g_tok": jax.grad(token_obj)(logp),
      "g_seq": jax.grad(seq_obj)(logp),
      "g_raw": g_raw,
  }


def test_gspo_token_value_and_gradient_match_gspo():
  out = _gspo_token_outputs(*_gspo_batch())
  for loss_bl, ratio_bl in out["token"]:
    np.testing.assert_allclose(loss_bl, out["loss_b"], rtol=1e-6)
    np.testing.assert_allclose(ratio_bl, out["s_b"], rtol=1e-6)

  # With A_{i,t} = A_i and seq-mean-token-mean over non-empty rows, the
  # GSPO-token gradient equals the GSPO gradient, -A_i s_i / (B |y_i|).
  np.testing.assert_allclose(out["token_obj"], out["seq_obj"], rtol=1e-6)
  g_tok = out["g_tok"]
  np.testing.assert_allclose(g_tok, out["g_seq"], rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(
      g_tok[0, 0], -2.0 * math.exp(0.1) / (4 * 3), rtol=1e-5
  )
  # Per token, before aggregation: d loss_{i,t} / d logp_t = -A_i s_i.
  g_raw = out["g_raw"]
  np.testing.assert_allclose(g_raw[0, :3], -2.0 * math.exp(0.1), rtol=1e-5)
  assert np.all(np.asarray(g_raw)[1:3] == 0.0)  # clipped rows


# --------------------------------------------------------------------- CISPO


@jax.jit
def _cispo_outputs(ratios, adv):
  beh = jnp.log(jnp.full((3,), 0.4))
  logp = beh + jnp.log(ratios)
  loss, ratio = losses.cispo_loss(logp, beh, adv, EPS, EPS)
  g = jax.grad(
      lambda lp: jnp.sum(losses.cispo_loss(lp, beh, adv, EPS, EPS)[0])
  )(logp)
  return logp, loss, ratio, g


def test_cispo_gradient_keeps_clipped_tokens():
  ratios = np.array([1.5, 0.5, 1.1], np.float32)
  adv = np.array([1.0, -1.0, 2.0], np.float32)
  logp, loss, ratio, g = _cispo_outputs(ratios, adv)
  np.testing.assert_allclose(ratio, ratios, rtol=1e-6)
  # weights clip(rho, 0.8, 1.2) = 1.2, 0.8, 1.1 ; loss = -w A logp.
  w = np.array([1.2, 0.8, 1.1])
  np.testing.assert_allclose(
      loss, -w * np.array(adv) * np.array(logp), rtol=1e-6
  )
  # -clip(rho) * A = [-1.2, 0.8, -2.2]: non-zero even where PPO would clip.
  np.testing.assert_allclose(g, [-1.2, 0.8, -2.2], rtol=1e-6)


# ---------------------------------------------------------------- value loss


_value_loss_and_grad = jax.jit(
    jax.value_and_grad(lambda v, o, r, m: losses.value_loss(v, o, r, m, 0.2))
)


def test_value_loss_hand_values():
  values = np.array([[1.0, 2.0, 0.6, 123.0]], np.float32)
  old = np.array([[0.5, 0.5, 0.5, 0.0]], np.float32)
  returns = np.array([[1.2, 0.0, 1.0, -7.0]], np.float32)
  mask = np.array([[True, True, True, False]])
  # t0: (1 - 1.2)^2 = 0.04 ; clipped V = 0.5 + 0.2 = 0.7, (0.7-1.2)^2 = 0.25
  #     -> 0.5 * 0.25 = 0.125 (clipping active and raises the loss).
  # t1: (2 - 0)^2 = 4 ; (0.7 - 0)^2 = 0.49 -> 0.5 * 4 = 2 (clip inactive).
  # t2: |V - V_old| = 0.1 < 0.2: both 0.16 -> 0.08.
  expected = (0.125 + 2.0 + 0.08) / 3
  loss, g = _value_loss_and_grad(values, old, returns, mask)
  np.testing.assert_allclose(loss, expected, rtol=1e-6)
  # t0 on the clipped branch: no gradient; t1: (V - R) / 3 = 2/3;
  # t2: (0.6 - 1) / 3.
  np.testing.assert_allclose(
      g, [[0.0, 2.0 / 3, -0.4 / 3, 0.0]], rtol=1e-5, atol=1e-7
  )
  with pytest.raises(ValueError, match="clip_eps"):
    losses.value_loss(values, old, returns, mask, -0.1)


# ------------------------------------------------- KL reward, adaptive coef


@jax.jit
def _kl_penalized_outputs(rewards, logp, ref, mask):
  out = losses.kl_penalized_rewards(rewards, logp, ref, mask, 0.1)
  out3 = losses.kl_penalized_rewards(rewards, logp, ref, mask, 0.1, "k3")
  g = jax.grad(
      lambda lp: jnp.sum(
          losses.kl_penalized_rewards(rewards, lp, ref, mask, 0.1)
      )
  )(logp)
  return out, out3, g


def test_kl_penalized_rewards_hand_values():
  rewards = np.array([1.0, 0.0], np.float32)
  logp = np.array([[-1.0, -1.0, -np.inf], [-0.5, 7.0, 7.0]], np.float32)
  ref = np.array([[-2.0, -1.5, 0.0], [-1.0, -np.inf, 0.0]], np.float32)
  mask = np.array([[True, True, False], [True, False, False]])
  out, out3, g = _kl_penalized_outputs(rewards, logp, ref, mask)
  # k1: row 0: 1 + 0.5 = 1.5 -> 1 - 0.1 * 1.5 = 0.85; row 1: 0.5 -> -0.05.
  np.testing.assert_allclose(out, [0.85, -0.05], rtol=1e-6)
  # k3, row 1: d = -0.5: e^-0.5 + 0.5 - 1.
  np.testing.assert_allclose(out3[1], -0.1 * (math.exp(-0.5) - 0.5), rtol=1e-6)
  assert np.all(np.asarray(g) == 0.0)
  with pytest.raises(ValueError, match="k9"):
    losses.kl_penalized_rewards(rewards, logp, ref, mask, 0.1, "k9")


@jax.jit
def _adaptive_kl_outputs(observed_kls):
  return [
      losses.adaptive_kl_update(0.1, kl, 0.1, 10000, 64) for kl in observed_kls
  ]


def test_adaptive_kl_update_hand_values():
  kl_05, kl_0, kl_011 = _adaptive_kl_outputs(
      [np.float32(0.5), np.float32(0.0), np.float32(0.11)]
  )
  # n / H = 64 / 10000 = 0.0064.
  # KL 0.5 vs target 0.1: error 4 -> clipped 0.2 -> 0.1 * (1 + 0.00128).
  np.testing.assert_allclose(kl_05, 0.100128, rtol=1e-6)
  # KL 0: error -1 -> clipped -0.2 -> 0.1 * (1 - 0.00128).
  np.testing.assert_allclose(kl_0, 0.099872, rtol=1e-6)
  # KL 0.11: error 0.1 inside the band -> 0.1 * (1 + 0.00064).
  np.testing.assert_allclose(kl_011, 0.100064, rtol=1e-6)
  with pytest.raises(ValueError, match="target_kl"):
    losses.adaptive_kl_update(0.1, 0.1, 0.0, 10000, 64)
  with pytest.raises(ValueError, match="horizon"):
    losses.adaptive_kl_update(0.1, 0.1, 0.1, 0, 64)


def test_constants():
  assert losses.LOSS_TYPES == ("ppo", "gspo", "gspo_token", "cispo", "flowrl")
  assert set(losses.AGG_MODES) == {
      "token-mean",
      "seq-mean-token-mean",
      "seq-mean-token-sum-norm",
  }
  assert losses.KL_ESTIMATORS == ("k1", "k2", "k3")


# ---------------------------------------------------------------- jit, vmap


def test_jit_gives_same_values():
  logp, beh, adv, mask = _gspo_batch()
  beh_safe = jnp.where(mask, logp, beh)
  adv_bl = jnp.broadcast_to(adv[:, None], (4, 4))
  cases = [
      (
          functools.partial(losses.gspo_loss, clip_low=EPS, clip_high=EPS),
          (logp, beh, adv, mask),
      ),
      (
          functools.partial(
              losses.gspo_token_loss, clip_low=EPS, clip_high=EPS
          ),
          (logp, beh, adv, mask),
      ),
      (
          functools.partial(
              losses.clipped_surrogate,
              clip_low=EPS,
              clip_high=EPS,
              dual_clip=3.0,
          ),
          (beh_safe, beh, adv_bl),
      ),
      (
          functools.partial(losses.cispo_loss, clip_low=EPS, clip_high=EPS),
          (beh_safe, beh, adv_bl),
      ),
      (functools.partial(losses.kl_estimate, "k3"), (beh_safe, beh)),
      (
          functools.partial(losses.value_loss, clip_eps=0.2),
          (beh_safe, beh, adv_bl, mask),
      ),
      (
          functools.partial(
              losses.kl_penalized_rewards, coef=0.1, estimator="k2"
          ),
          (adv, beh_safe, beh, mask),
      ),
      (
          losses.adaptive_kl_update,
          (jnp.float32(0.1), jnp.float32(0.5), 0.1, 10000.0, 64),
      ),
  ]
  for mode in losses.AGG_MODES:
    cases.append(
        (functools.partial(losses.aggregate, mode=mode), (adv_bl, mask))
    )
    cases.append(
        (
            functools.partial(
                losses.aggregate, mode=mode, denominator=jnp.float32(3.0)
            ),
            (adv_bl, mask),
        )
    )
    cases.append(
        (functools.partial(losses.aggregation_denominator, mode=mode), (mask,))
    )
  for fn, args in cases:
    eager = fn(*args)
    jitted = jax.jit(fn)(*args)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), eager, jitted
    )


@jax.jit
def _vmap_over_groups_outputs(logp, beh, adv, mask):
  stack = lambda x: jnp.stack([x, x[::-1]])
  fn = functools.partial(losses.gspo_loss, clip_low=EPS, clip_high=EPS)
  loss_gb, s_gb = jax.vmap(fn)(stack(logp), stack(beh), stack(adv), stack(mask))
  loss_b, s_b = fn(logp, beh, adv, mask)
  x = jnp.where(mask, 1.0, 0.0) * adv[:, None]
  per_group = {
      mode: (
          jax.vmap(functools.partial(losses.aggregate, mode=mode))(
              stack(x), stack(mask)
          ),
          losses.aggregate(x, mask, mode),
      )
      for mode in losses.AGG_MODES
  }
  coefs = jax.vmap(losses.adaptive_kl_update, in_axes=(0, 0, None, None, None))(
      jnp.array([0.1, 0.2]), jnp.array([0.5, 0.0]), 0.1, 10000.0, 64
  )
  return loss_gb, s_gb, loss_b, s_b, per_group, coefs


def test_vmap_over_groups():
  loss_gb, s_gb, loss_b, s_b, per_group, coefs = _vmap_over_groups_outputs(
      *_gspo_batch()
  )
  np.testing.assert_allclose(loss_gb[0], loss_b, rtol=1e-6)
  np.testing.assert_allclose(loss_gb[1], loss_b[::-1], rtol=1e-6)
  np.testing.assert_allclose(s_gb[1], s_b[::-1], rtol=1e-6)
  # Per-group aggregation.
  for mode in losses.AGG_MODES:
    batched, single = per_group[mode]
    np.testing.assert_allclose(batched, single, rtol=1e-6)
  # Adaptive KL over several controllers at once.
  np.testing.assert_allclose(coefs, [0.100128, 0.2 * 0.99872], rtol=1e-6)


def test_every_loss_vmaps_over_groups_like_a_loop():
  """Every loss function under vmap (over a leading group axis) equals the
  same function applied group by group."""
  rng = np.random.default_rng(3)
  g, b, l = 3, 4, 5
  f = lambda *shape: rng.normal(size=shape).astype(np.float32)
  logp = -np.abs(f(g, b, l))
  beh = logp + np.float32(0.1) * f(g, b, l)
  ref = logp + np.float32(0.2) * f(g, b, l)
  mask = rng.random((g, b, l)) < 0.7
  adv_b = f(g, b)
  adv_bl = np.broadcast_to(adv_b[..., None], (g, b, l))
  cases = {
      "ppo": (
          lambda lp, bh, a, m: losses.aggregate(
              losses.clipped_surrogate(lp, bh, a, EPS, 0.28, dual_clip=3.0)[0],
              m,
              "token-mean",
          ),
          (logp, beh, adv_bl, mask),
      ),
      "cispo": (
          lambda lp, bh, a, m: losses.aggregate(
              losses.cispo_loss(lp, bh, a, EPS, 0.28)[0], m, "token-mean"
          ),
          (logp, beh, adv_bl, mask),
      ),
      "gspo": (
          lambda lp, bh, a, m: losses.gspo_loss(lp, bh, a, m, EPS, EPS)[0],
          (logp, beh, adv_b, mask),
      ),
      "gspo_token": (
          lambda lp, bh, a, m: losses.gspo_token_loss(lp, bh, a, m, EPS, EPS)[
              0
          ],
          (logp, beh, adv_b, mask),
      ),
      "value": (
          lambda v, o, r, m: losses.value_loss(v, o, r, m, 0.2),
          (logp, beh, ref, mask),
      ),
      "flowrl": (
          lambda lp, bh, rf, m, a: losses.flowrl_loss(
              lp, bh, rf, m, a, jnp.zeros(a.shape), beta=2.0
          )[0],
          (logp, beh, ref, mask, adv_b),
      ),
      "sil": (
          lambda lp, m, a: losses.self_imitation_loss(
              lp, m, a, jnp.zeros(a.shape)
          ),
          (logp, mask, adv_b),
      ),
      "kl_reward": (
          lambda r, lp, rf, m: losses.kl_penalized_rewards(
              r, lp, rf, m, 0.1, "k3"
          ),
          (adv_b, logp, ref, mask),
      ),
  }
  for est in losses.KL_ESTIMATORS:
    cases["kl_" + est] = (
        lambda lp, rf, m, est=est: losses.aggregate(
            losses.kl_estimate(est, lp, rf), m, "token-mean"
        ),
        (logp, ref, mask),
    )
  fns = {name: fn for name, (fn, _) in cases.items()}

  # One program: every case vmapped, and applied group by group.
  @jax.jit
  def batched_and_looped(all_args):
    return {
        name: (
            jax.vmap(fns[name])(*args),
            jnp.stack([fns[name](*[x[i] for x in args]) for i in range(g)]),
        )
        for name, args in all_args.items()
    }

  out = batched_and_looped({name: args for name, (_, args) in cases.items()})
  for name in cases:
    batched, looped = out[name]
    np.testing.assert_allclose(
        batched, looped, rtol=1e-5, atol=1e-6, err_msg=name
    )
