"""Clipped surrogate, k3 KL and token-mean aggregation on a hand-computed batch;
the policy-loss table (`losses.POLICY_LOSSES`): every entry on hand values,
what each declares against its function and the config schema."""

import inspect
import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from agentic_rl import learner
from agentic_rl import losses
from configs import schema


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
  # One compiled forward per width (op by op it was hundreds of compiles).
  entropy = jax.jit(sampling.token_entropy, static_argnums=0)
  out = []
  for width in (5, 10):
    tokens = jnp.pad(rows, ((0, 0), (0, width - 5)), constant_values=pad)
    ent = entropy(graphdef, params, tokens)
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


# ------------------------------------------------- the policy-loss table


def _table_arrays():
  """A 2 x 3 batch. Ratios rho = exp(logp - behaviour): [[1, 1.5, 0.5],
  [4, 1, 0.9]]; row 0's last token is not a POLICY token."""
  logp = np.array([[-1.0, -0.5, -2.0], [-0.3, -1.2, -0.7]], np.float32)
  ratio = np.array([[1.0, 1.5, 0.5], [4.0, 1.0, 0.9]], np.float32)
  return {
      "logp_bl": jnp.asarray(logp),
      "behaviour_logp_bl": jnp.asarray(logp - np.log(ratio)),
      "advantage_bl": jnp.array([[1.0, 1.0, -1.0], [-2.0, -2.0, 0.5]]),
      "mask_bl": jnp.array([[True, True, False], [True, True, True]]),
      "ref_logp_bl": jnp.array([[-1.5, -0.5, -9.0], [-0.5, -1.0, -1.0]]),
      "reward_hat_b": jnp.array([1.0, -0.5]),
      "log_z_b": jnp.array([0.5, -0.25]),
      "denominator": None,
  }


# Python scalars, one per keyword of `losses.SETTINGS`.
_TABLE_SETTINGS = {
    "clip_low": 0.2,
    "clip_high": 0.28,
    "dual_clip": 3.0,
    "beta": 2.0,
    "clip_eps": 0.6,
}
_RATIO = [[1.0, 1.5, 0.5], [4.0, 1.0, 0.9]]
_S0 = math.sqrt(1.5)  # GSPO row 0: exp((ln 1 + ln 1.5) / 2), in [0.8, 1.28]
_S1 = 3.6 ** (1.0 / 3.0)  # row 1: exp((ln 4 + ln 1 + ln 0.9) / 3) > 1.28
_GSPO = (
    # Row 0 (s0 unclipped): -s0 * A; the non-POLICY token keeps its value.
    [
        [-_S0, -_S0, _S0],
        # Row 1: A < 0 -> -min(-2 s1, -2 * 1.28) = 2 s1; A = 0.5 -> -0.5 * 1.28.
        [2 * _S1, 2 * _S1, -0.64],
    ],
    [[_S0] * 3, [_S1] * 3],
    None,
)
# FlowRL: n = (2, 3); delta_0 = 0.5 + (-1.5 / 2) - 2 * 1 - (-2 / 2) = -1.25,
# delta_1 = -0.25 + (-2.2 / 3) - 2 * (-0.5) - (-2.5 / 3) = 0.85; weights
# clip(pi / pi_old, 0.4, 1.6): row 0 exp(ln 1.5) = 1.5, row 1 3.6 -> 1.6;
# D = 2 rows with POLICY tokens.
_FLOWRL_LOSS = (1.5 * 1.25**2 + 1.6 * 0.85**2) / 2.0
_TABLE_EXPECTED = {
    # -min(rho A, clip(rho, 0.8, 1.28) A); for A < 0 max with 3 A (dual clip):
    # (1, 2) rho 0.5, A -1: -min(-0.5, -0.8) = 0.8; (1, 0) rho 4, A -2:
    # -max(min(-8, -2.56), -6) = 6; (1, 2) rho 0.9, A 0.5: -0.45.
    "ppo": ([[-1.0, -1.28, 0.8], [6.0, 2.0, -0.45]], _RATIO, None),
    "gspo": _GSPO,
    "gspo_token": _GSPO,
    # -clip(rho, 0.8, 1.28) A logp: weights [[1, 1.28, 0.8], [1.28, 1, 0.9]].
    "cispo": (
        [[1.0, 0.64, -1.6], [-0.768, -2.4, 0.315]],
        _RATIO,
        None,
    ),
    "flowrl": ([[0.0] * 3] * 2, _RATIO, _FLOWRL_LOSS),
}


def test_every_policy_loss_entry_on_a_hand_batch():
  assert set(_TABLE_EXPECTED) == set(losses.POLICY_LOSSES)
  arrays = _table_arrays()
  for name, entry in losses.POLICY_LOSSES.items():
    settings = {k: _TABLE_SETTINGS[k] for k in entry.settings}
    pg, ratio, loss = entry.fn(*(arrays[n] for n in entry.inputs), **settings)
    want_pg, want_ratio, want_loss = _TABLE_EXPECTED[name]
    np.testing.assert_allclose(pg, want_pg, rtol=1e-5, atol=1e-6, err_msg=name)
    np.testing.assert_allclose(ratio, want_ratio, rtol=1e-5, err_msg=name)
    if want_loss is None:
      assert loss is None, name
    else:
      np.testing.assert_allclose(float(loss), want_loss, rtol=1e-5)


def test_ppo_entry_without_dual_clip_and_flowrl_with_a_denominator():
  arrays = _table_arrays()
  ppo = losses.POLICY_LOSSES["ppo"]
  pg, _, _ = ppo.fn(
      *(arrays[n] for n in ppo.inputs),
      clip_low=0.2,
      clip_high=0.28,
      dual_clip=0.0,
  )
  # dual_clip 0 is plain PPO: token (1, 0) keeps -min(-8, -2.56) = 8.
  np.testing.assert_allclose(
      pg, [[-1.0, -1.28, 0.8], [8.0, 2.0, -0.45]], rtol=1e-5
  )
  flowrl = losses.POLICY_LOSSES["flowrl"]
  arrays["denominator"] = jnp.float32(4.0)
  _, _, loss = flowrl.fn(
      *(arrays[n] for n in flowrl.inputs), beta=2.0, clip_eps=0.6
  )
  np.testing.assert_allclose(float(loss), _FLOWRL_LOSS * 2.0 / 4.0, rtol=1e-5)


def test_every_policy_loss_entry_declares_what_it_reads():
  rl_fields = {path for path in schema.fields("rl") if path.startswith("rl.")}
  for field in (
      *losses.SETTINGS.values(),
      *losses.SHARED_SETTINGS,
      *losses.LOG_PARTITION_SETTINGS,
  ):
    assert field in rl_fields, field
  rl = schema.reference("rl").rl
  for name, entry in losses.POLICY_LOSSES.items():
    params = inspect.signature(entry.fn).parameters.values()
    positional = [p.name for p in params if p.kind == p.POSITIONAL_OR_KEYWORD]
    keywords = [p.name for p in params if p.kind == p.KEYWORD_ONLY]
    # Its arrays are its declared inputs, in order; its keywords are its
    # declared settings, all of them and nothing else (no config object).
    assert positional == list(entry.inputs), name
    assert sorted(keywords) == sorted(entry.settings), name
    # The adapter reads only the declared fields: a config holding just
    # them is enough, and it passes the values as the config holds them.
    only = ml_collections.ConfigDict(
        {f.removeprefix("rl."): rl[f.removeprefix("rl.")] for f in entry.fields}
    )
    got = learner.policy_loss_settings(only, entry)
    assert list(got) == list(entry.settings), name
    for key, value in got.items():
      field = losses.SETTINGS[key].removeprefix("rl.")
      assert value == rl[field] and type(value) is type(rl[field]), key
  assert {n: e.fields for n, e in losses.POLICY_LOSSES.items()} == {
      "ppo": ("rl.clip_low", "rl.clip_high", "rl.dual_clip"),
      "gspo": ("rl.clip_low", "rl.clip_high"),
      "gspo_token": ("rl.clip_low", "rl.clip_high"),
      "cispo": ("rl.clip_low", "rl.clip_high"),
      "flowrl": (
          "rl.flowrl_beta",
          "rl.flowrl_clip",
          "rl.flowrl_log_z_hidden",
          "rl.flowrl_log_z_lr",
      ),
  }


def test_a_policy_loss_entry_with_an_unknown_input_is_refused():
  with pytest.raises(ValueError, match="unknown inputs"):
    losses.PolicyLoss(lambda x: x, ("logp",))
  with pytest.raises(ValueError, match="unknown inputs or settings"):
    losses.PolicyLoss(lambda x: x, ("logp_bl",), ("eps",))


def test_rl_loss_names_the_inputs_the_batch_lacks(monkeypatch):
  """The RL loss refuses a batch without an input its policy-loss entry
  declares, naming every missing one ('flowrl' takes ref_logp_bl,
  reward_hat_b and log_z_b, the last from prompt_embedding), instead of
  passing None into the loss; the complete batch gives the hand value."""
  rl = ml_collections.ConfigDict(
      dict(
          temperature=1.0,
          loss_type="flowrl",
          flowrl_log_z_hidden=0,
          flowrl_beta=1.0,
          flowrl_clip=0.2,
          clip_low=0.2,
          clip_high=0.2,
          loss_agg_mode="seq-mean-token-mean",
          loss_norm_constant=0,
          kl_estimator="k3",
          entropy_coef=0.0,
      )
  )
  zeros = jnp.zeros((2, 3), jnp.float32)
  # Every log-prob and entropy 0 (no model: the forward is replaced).
  monkeypatch.setattr(
      learner.sampling,
      "token_logprobs",
      lambda graphdef, params, tokens, temperature: (zeros, zeros),
  )
  log_z = nnx.state(losses.LogPartition(2, 0, rngs=nnx.Rngs(0)))
  full = learner.LearnerBatch(
      tokens=jnp.zeros((2, 3), jnp.int32),
      mask=jnp.array([[False, True, True], [False, True, False]]),
      behaviour_logp=zeros,
      ref_logp=zeros,
      advantage=zeros,
      reward_hat=jnp.array([1.0, 0.0], jnp.float32),
      prompt_embedding=jnp.ones((2, 2), jnp.float32),
  )

  def loss(batch):
    return learner._rl_loss(  # pylint: disable=protected-access
        None,
        None,
        batch,
        rl,
        kl_coef=0.0,
        denominator=None,
        log_z_params=log_z,
    )

  for changes, missing in (
      ({"reward_hat": None}, "['reward_hat_b']"),
      ({"ref_logp": None}, "['ref_logp_bl']"),
      ({"prompt_embedding": None}, "['log_z_b']"),  # no log Z without it
      (
          {"ref_logp": None, "reward_hat": None},
          "['ref_logp_bl', 'reward_hat_b']",
      ),
  ):
    with pytest.raises(ValueError) as err:
      loss(full.replace(**changes))
    assert str(err.value) == (
        f"rl.loss_type='flowrl' takes {missing}, which the batch lacks"
    ), changes
  # Complete: log Z = 0 and every log-prob 0, so delta_b = -beta * r_hat_b =
  # [-1, 0], both weights 1 (ratio 1), loss (1 + 0) / 2 rows.
  value, metrics = loss(full)
  np.testing.assert_allclose(float(value), 0.5, rtol=1e-6)
  np.testing.assert_allclose(float(metrics["pg_loss"]), 0.5, rtol=1e-6)
  assert float(metrics["log_z"]) == 0.0
