"""Next-observation prediction as reward or auxiliary loss (docs/papers.md).

Hand-computed values for the prediction potential, the dark-room proposition
(z-scored advantages of an all-fail group do not depend on the shaping
coefficient; mean-only ones scale with it), the shuffled-label placebo, the
auxiliary CE term of the learner's loss and the config validation.
"""

import jax
import ml_collections
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from agentic_rl import credit
from agentic_rl import learner
from agentic_rl import sampling
from agentic_rl import types
from agentic_rl import validation
from configs import default
from tests import fakes

P, X, T, D = types.PROMPT, types.POLICY, types.TOOL, types.PAD


# Episode A: call (turn 0) + 2-token observation, call (turn 1) + 2-token
# observation, answer (turn 2). Episode B: three calls, each with a 1-token
# observation (cut off at the horizon K = 3).
_A = [(P, -1, 2), (X, 0, 1), (T, 0, 2), (X, 1, 1), (T, 1, 2), (X, 2, 1)]
_B = [
    (P, -1, 2),
    (X, 0, 1),
    (T, 0, 1),
    (X, 1, 1),
    (T, 1, 1),
    (X, 2, 1),
    (T, 2, 1),
]


def test_potential_is_mean_score_of_observations_seen_so_far():
  traj = fakes.trajectory(
      segments=[_A, _B],
      width=10,
      num_turns=3,
      finish=[types.ANSWERED, types.MAX_TURNS],
  )
  # Scores on every position; only TOOL ones may count.
  score = jnp.asarray(
      [
          [0.9, 0.9, 0.7, 0.2, 0.4, 0.7, 1.0, 0.0, 0.7, 0.5],
          [0.9, 0.9, 0.7, 0.6, 0.7, 0.1, 0.7, 0.8, 0.0, 0.0],
      ]
  )
  phi = credit.observation_prediction_potential(score, traj.role, traj.turn, 3)
  # A: s_1 holds obs 0 = (0.2, 0.4) -> 0.3; s_2 adds (1.0, 0.0) -> 0.4; the
  # answer turn adds no observation -> 0.4. B: 0.6, (0.6 + 0.1)/2, + 0.8 -> 0.5.
  np.testing.assert_allclose(
      phi, [[0.0, 0.3, 0.4, 0.4], [0.0, 0.6, 0.35, 0.5]], atol=1e-6
  )
  # Jitted and vmapped over a leading axis give the same values.
  f = jax.jit(credit.observation_prediction_potential, static_argnums=3)
  np.testing.assert_allclose(f(score, traj.role, traj.turn, 3), phi, atol=1e-7)
  # PBRS on it (discount 1): A terminated -> sum F = -Phi(s_0) = 0; B cut off
  # -> sum F = Phi(s_3) = 0.5: the bonus goes to the episode that never answers.
  f_bk = credit.shape_turn_rewards(
      jnp.zeros((2, 3)),
      phi,
      jnp.ones((2, 3), bool),
      1.0,
      jnp.array([True, False]),
  )
  np.testing.assert_allclose(
      f_bk, [[0.3, 0.1, -0.4], [0.6, -0.25, 0.15]], atol=1e-6
  )
  np.testing.assert_allclose(f_bk.sum(1), [0.0, 0.5], atol=1e-6)


@pytest.fixture(scope="module")
def policy():
  return fakes.tiny_policy(3)


def test_prediction_scores_match_the_trainer_logprobs(policy):
  graphdef, params, _ = policy
  tokens = jax.random.randint(jax.random.PRNGKey(0), (3, 9), 0, 200)
  prob, hit = credit.observation_prediction_scores(
      graphdef, params, tokens, 0.7
  )
  logp, _ = sampling.token_logprobs(graphdef, params, tokens, 0.7)
  np.testing.assert_allclose(prob[:, 1:], np.exp(logp[:, 1:]), rtol=1e-5)
  assert np.all(np.asarray(prob[:, 0]) == 0) and not np.any(hit[:, 0])
  model = nnx.merge(graphdef, params)
  hidden, _ = model.hidden_states(tokens[:, :-1])
  want_hit = np.argmax(np.asarray(model.logits(hidden)), -1) == np.asarray(
      tokens[:, 1:]
  )
  np.testing.assert_array_equal(hit[:, 1:], want_hit)


def test_prediction_scores_of_a_zero_model_are_uniform(policy):
  # All-zero parameters: every logit is 0, so p(token) = 1 / V exactly and the
  # arg-max (first index) hits only token 0.
  graphdef, params, cfg = policy
  zero = jax.tree.map(jnp.zeros_like, params)
  tokens = jnp.asarray([[5, 0, 7, 0, 0, 9]])
  prob, hit = credit.observation_prediction_scores(graphdef, zero, tokens)
  np.testing.assert_allclose(prob[0, 1:], 1.0 / cfg.vocab_size, rtol=1e-6)
  np.testing.assert_array_equal(hit[0], [False, True, False, True, True, False])


def _dark_room_rl(lam, scale_by_std):
  rl = default.get_config().rl
  rl.pbrs_potential = "obs_prediction"
  rl.pbrs_coef = lam
  rl.scale_by_std = scale_by_std
  rl.adv_eps = 1e-6
  return rl


def test_zscored_all_fail_group_ignores_lambda_mean_only_scales_with_it():
  """the "dark room" study's proposition through the learner's PBRS path, by hand.

  One all-fail group of 4 (outcome 0): episodes 0 and 2 answer (terminated,
  shaped return 0); episodes 1 and 3 are cut off at the horizon with final
  potentials 0.5 and 0.9 (shaped returns 0.5 lam, 0.9 lam). Returns / lam:
  [0, 0.5, 0, 0.9], mean 0.35, deviations [-0.35, 0.15, -0.35, 0.55],
  population std sqrt(0.57 / 4) = 0.3774917.
  """
  rows = [_A, _B, _A, _B]
  traj = fakes.trajectory(
      segments=rows,
      width=10,
      num_turns=3,
      finish=[types.ANSWERED, types.MAX_TURNS] * 2,
  )
  phi = jnp.asarray(
      [
          [0.0, 0.3, 0.4, 0.4],
          [0.0, 0.6, 0.2, 0.5],
          [0.0, 0.1, 0.8, 0.8],
          [0.0, 0.4, 0.7, 0.9],
      ]
  )
  dev = np.array([-0.35, 0.15, -0.35, 0.55])
  z = dev / np.sqrt(0.57 / 4)
  policy_bl = np.asarray(traj.role) == X
  for lam in (0.01, 0.1, 1.0):
    reward, adv_b, adv_bl = learner.token_advantages(
        _dark_room_rl(lam, True), jnp.zeros(4), traj, 3, phi_bk1=phi
    )
    np.testing.assert_allclose(
        reward, lam * np.array([0, 0.5, 0, 0.9]), atol=1e-7
    )
    # eps = 1e-6 << lam * std, so z is lambda-free to ~1e-6 / (lam * 0.377).
    np.testing.assert_allclose(adv_b, z, rtol=1e-3)
    np.testing.assert_allclose(
        adv_bl, np.where(policy_bl, z[:, None], 0.0), rtol=1e-3, atol=1e-7
    )
    _, adv_mean, _ = learner.token_advantages(
        _dark_room_rl(lam, False), jnp.zeros(4), traj, 3, phi_bk1=phi
    )
    np.testing.assert_allclose(adv_mean, lam * dev, rtol=1e-4, atol=1e-8)
  # A group with a success: the bounded bonus is small next to the outcome in
  # both variants (z of [1, 0.05, 0, 0.09]).
  r = np.array([1.0, 0.5 * 0.1, 0.0, 0.9 * 0.1])
  _, adv_b, _ = learner.token_advantages(
      _dark_room_rl(0.1, True), jnp.array([1.0, 0, 0, 0]), traj, 3, phi_bk1=phi
  )
  np.testing.assert_allclose(
      adv_b, (r - r.mean()) / (r.std() + 1e-6), rtol=1e-4
  )


def test_placebo_shuffle_permutes_observation_tokens_across_rows():
  tokens = jnp.arange(40, dtype=jnp.int32).reshape(4, 10) + 100
  mask = jnp.zeros((4, 10), bool).at[:, 3:7].set(True).at[1, 3:].set(False)
  key = jax.random.PRNGKey(7)
  out = np.asarray(credit.shuffle_observation_targets(tokens, mask, key))
  t, m = np.asarray(tokens), np.asarray(mask)
  np.testing.assert_array_equal(out[~m], t[~m])  # inputs elsewhere untouched
  np.testing.assert_array_equal(np.sort(out[m]), np.sort(t[m]))  # a permutation
  # Independent reference: the i-th masked slot (row-major) gets the token of
  # the i-th masked slot in order of the uniform draws.
  u = np.asarray(jax.random.uniform(key, (40,)))
  slots = np.flatnonzero(m.reshape(-1))
  src = slots[np.argsort(u[slots], kind="stable")]
  np.testing.assert_array_equal(out.reshape(-1)[slots], t.reshape(-1)[src])
  # Labels move across rows (12 distinct tokens: a fixed point everywhere has
  # probability 1/12!), and the same key gives the same labels under jit.
  rows_of = (out[m] - 100) // 10
  assert np.any(rows_of != np.nonzero(m)[0])
  np.testing.assert_array_equal(
      jax.jit(credit.shuffle_observation_targets)(tokens, mask, key), out
  )


def test_observation_prediction_loss_hand_values():
  logp = jnp.asarray([[-1.0, -2.0, -3.0], [-0.5, -4.0, 0.0]])
  mask = jnp.asarray([[False, True, True], [True, False, False]])
  # (2 + 3 + 0.5) / 3 tokens.
  np.testing.assert_allclose(
      credit.observation_prediction_loss(logp, mask), 5.5 / 3, rtol=1e-6
  )
  np.testing.assert_allclose(
      credit.observation_prediction_loss(logp, mask, denominator=11.0),
      0.5,
      rtol=1e-6,
  )
  np.testing.assert_allclose(
      credit.observation_prediction_loss(logp, jnp.zeros_like(mask)), 0.0
  )


def _loss_batch(graphdef, params):
  b, l = 4, 10
  tokens = jax.random.randint(jax.random.PRNGKey(1), (b, l), 0, 200)
  pos = jnp.arange(l)[None, :]
  role = jnp.where(pos < 2, P, X)
  role = jnp.where((pos == 4) | (pos == 5), T, role).astype(jnp.int8)
  role = jnp.broadcast_to(role, (b, l))
  mask = role == X
  logp, _ = sampling.token_logprobs(graphdef, params, tokens, 1.0)
  return (
      learner.LearnerBatch(
          tokens=tokens,
          mask=mask,
          behaviour_logp=jnp.where(mask, logp, 0.0),
          ref_logp=jnp.where(mask, logp, 0.0),
          advantage=jnp.where(mask, 0.5, 0.0),
      ),
      role == T,
      logp,
  )


def test_aux_loss_adds_coef_times_observation_ce_true_and_placebo(policy):
  graphdef, params, _ = policy
  batch, obs, logp = _loss_batch(graphdef, params)
  rl = default.get_config("smoke").rl
  rl.obs_prediction_coef = 0.25
  den = batch.mask.sum()
  l0, m0 = learner._rl_loss(
      graphdef, params, batch, rl, kl_coef=0.0, denominator=den
  )
  l1, m1 = learner._rl_loss(
      graphdef,
      params,
      batch.replace(obs_mask=obs),
      rl,
      kl_coef=0.0,
      denominator=den,
      obs_denominator=8.0,
  )
  ce = -float(jnp.sum(jnp.where(obs, logp, 0.0))) / 8.0  # 8 TOOL tokens
  np.testing.assert_allclose(m1["obs_pred_loss"], ce, rtol=1e-5)
  np.testing.assert_allclose(l1 - l0, 0.25 * ce, rtol=1e-4)
  np.testing.assert_allclose(m1["pg_loss"], m0["pg_loss"], rtol=1e-6)
  # Placebo labels: the CE scores the given targets in the true context;
  # the policy terms (POLICY targets unchanged) stay as they were.
  targets = credit.shuffle_observation_targets(
      batch.tokens, obs, jax.random.PRNGKey(3)
  )
  l2, m2 = learner._rl_loss(
      graphdef,
      params,
      batch.replace(obs_mask=obs, obs_targets=targets),
      rl,
      kl_coef=0.0,
      denominator=den,
      obs_denominator=8.0,
  )
  model = nnx.merge(graphdef, params)
  hidden, _ = model.hidden_states(batch.tokens[:, :-1])
  logp_v = jax.nn.log_softmax(model.logits(hidden), -1)
  lp_t = jnp.take_along_axis(logp_v, targets[:, 1:, None], -1)[..., 0]
  ce_placebo = -float(jnp.sum(jnp.where(obs[:, 1:], lp_t, 0.0))) / 8.0
  np.testing.assert_allclose(m2["obs_pred_loss"], ce_placebo, rtol=1e-5)
  np.testing.assert_allclose(m2["pg_loss"], m0["pg_loss"], rtol=1e-6)
  assert abs(ce_placebo - ce) > 1e-3


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("obs_prediction_coef", -0.1, "rl.obs_prediction_coef"),
        ("obs_prediction_coef", float("nan"), "rl.obs_prediction_coef"),
        ("obs_prediction_placebo", True, "rl.obs_prediction_placebo"),
        ("obs_prediction_placebo", 1, "rl.obs_prediction_placebo"),
        ("log_obs_prediction", "yes", "rl.log_obs_prediction"),
        ("pbrs_potential", "obs_predict", "rl.pbrs_potential"),
    ],
)
def test_invalid_obs_prediction_configs_raise(field, value, match):
  config = default.get_config("smoke")
  # Rebuilt so that values of another type than the default's are accepted
  # (as from a forked config file).
  config.rl = ml_collections.ConfigDict(
      dict(config.rl.to_dict(), **{field: value})
  )
  with pytest.raises(ValueError, match=match):
    validation.validate_config(config)


def test_valid_obs_prediction_configs_pass():
  config = default.get_config("smoke")
  config.rl.pbrs_potential = "obs_prediction"
  config.rl.pbrs_coef = 0.1
  config.rl.obs_prediction_coef = 0.1
  config.rl.obs_prediction_placebo = True
  config.rl.log_obs_prediction = True
  validation.validate_config(config)
