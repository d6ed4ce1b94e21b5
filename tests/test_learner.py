"""GRPO update: micro-batch accumulation equals the full batch, every loss variant
runs, and the first importance ratio is 1."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentic_rl import learner
from agentic_rl import sampling
from agentic_rl import types
from configs import default
from tests import fakes


def _batch(graphdef, params, b=8, l=10, seed=0):
  k1, k2, k3 = jax.random.split(jax.random.PRNGKey(seed), 3)
  tokens = jax.random.randint(k1, (b, l), 0, 200)
  lengths = jax.random.randint(k2, (b,), 4, l + 1)
  pos = jnp.arange(l)[None, :]
  # Rows: 2 prompt tokens, then POLICY tokens up to the row length, a TOOL token
  # at position 4, PAD after the length.
  role = jnp.where(pos < 2, types.PROMPT, types.POLICY)
  role = jnp.where(pos == 4, types.TOOL, role)
  role = jnp.where(pos >= lengths[:, None], types.PAD, role).astype(jnp.int8)
  mask = role == types.POLICY
  logp, _ = sampling.token_logprobs(graphdef, params, tokens, 1.0)
  adv = jax.random.normal(k3, (b,))
  return {
      "tokens": tokens,
      "mask": mask,
      "behaviour_logp": jnp.where(mask, logp, 0.0),
      "ref_logp": jnp.where(mask, logp - 0.1, 0.0),
      "advantage": jnp.where(mask, adv[:, None], 0.0),
  }


def _config(**rl):
  config = default.get_config("smoke")
  config.rl.update(rl)
  config.rl.learning_rate = 1e-2
  config.rl.warmup_steps = 1
  return config


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean",
                                  "seq-mean-token-sum-norm"])
def test_microbatch_accumulation_equals_full_batch(mode):
  graphdef, params, _ = fakes.tiny_policy(0)
  batch = _batch(graphdef, params)
  out = []
  for micro in (1, 4):
    config = _config(num_minibatches=1, num_microbatches=micro, loss_agg_mode=mode,
                     kl_coef=0.1, entropy_coef=0.01)
    tx = learner.make_optimizer(config.rl)
    update = jax.jit(learner.make_update_fn(config, graphdef, tx))
    new_params, _, m = update(params, tx.init(params), batch, jnp.float32(0.1))
    out.append((new_params, m))
  (p1, m1), (p4, m4) = out
  for k in ("loss", "pg_loss", "kl", "entropy", "grad_norm"):
    np.testing.assert_allclose(m1[k], m4[k], rtol=2e-5, atol=1e-7)
  for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p4)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("loss_type,mode", [
    ("ppo", "token-mean"), ("cispo", "token-mean"),
    ("gspo", "seq-mean-token-mean"), ("gspo_token", "token-mean")])
def test_every_loss_type_updates_with_first_ratio_one(loss_type, mode):
  graphdef, params, _ = fakes.tiny_policy(1)
  batch = _batch(graphdef, params, seed=1)
  config = _config(loss_type=loss_type, loss_agg_mode=mode, dual_clip=3.0,
                   num_minibatches=2, ppo_epochs=2)
  tx = learner.make_optimizer(config.rl)
  update = jax.jit(learner.make_update_fn(config, graphdef, tx))
  new_params, _, m = update(params, tx.init(params), batch, jnp.float32(0.0))
  assert all(np.isfinite(float(v)) for v in m.values())
  # Behaviour log-probs equal the trainer's: the first step's ratio is 1.
  np.testing.assert_allclose(float(m["ratio_mean_first"]), 1.0, atol=1e-6)
  changed = [not np.allclose(a, b) for a, b in
             zip(jax.tree.leaves(params), jax.tree.leaves(new_params))]
  assert any(changed)


def _rl_state_and_step(config):
  """Validated config -> (RL-phase TrainState at step 0, jitted GRPO step)."""
  from agentic_rl import train
  train.validation.validate_config(config)
  env = train.make_env(config)
  model_cfg = train.make_model_config(config)
  graphdef, state = train.init_state(config, model_cfg)
  state = train.start_rl(config, state)
  step = learner.make_rl_step(config, env, graphdef,
                              learner.make_optimizer(config.rl), model_cfg)
  return state, step


def test_rl_step_with_non_default_switches_runs():
  """Wiring of reward composition, schedules, noise, HDPO, CISPO, KL in reward,
  adaptive KL and micro-batches through one jitted GRPO iteration."""
  config = default.get_config("smoke")
  config.rl.rewards = {"otc": 1.0, "tool_bonus": 1.0, "format": 0.1}
  config.rl.reward_schedules = {
      "tool_bonus": {"kind": "linear", "start": 0.2, "end": 0.0, "steps": 2}}
  config.rl.reward_noise = {"flip_p": 0.1}
  config.rl.advantage_estimator = "hdpo"
  config.rl.loss_type = "cispo"
  config.rl.kl_reward_coef = 0.01
  config.rl.kl_target = 0.05
  config.rl.num_microbatches = 2
  config.rl.dynamic_sampling_oversample = 2
  config.rl.overlong_mode = "mask"
  config.rl.overlong_soft_cache = 8
  state, step = _rl_state_and_step(config)
  coefs = []
  for _ in range(2):
    state, m = step(state)
    assert all(np.isfinite(float(v)) for v in m.values()), m
    coefs.append(float(m["kl_coef"]))
  assert {"reward_otc", "reward_tool_bonus", "reward_format", "usable_groups",
          "skipped_update"} <= set(m)
  # The adaptive controller moved the coefficient after the first step.
  assert coefs[0] == pytest.approx(0.01) and coefs[1] != coefs[0]


@pytest.mark.parametrize("credit_mode", ["per_turn", "trajectory"])
def test_rl_step_with_pbrs_credit_runs(credit_mode):
  config = default.get_config("smoke")
  config.rl.credit = credit_mode
  config.rl.pbrs_coef = 0.5
  config.rl.discount = 0.9
  state, step = _rl_state_and_step(config)
  state, m = step(state)
  assert all(np.isfinite(float(v)) for v in m.values()), m


def _two_episode_traj():
  """Group of 2 (K = 2): ep 0 calls the tool (turn 0) then answers correctly
  (turn 1); ep 1 answers wrongly at once. Token layout: 2 prompt tokens, then
  each turn's POLICY tokens (and ep 0's observation)."""
  P, Q, T, D = types.PROMPT, types.POLICY, types.TOOL, types.PAD
  role = jnp.array([[P, P, Q, Q, T, Q, Q], [P, P, Q, Q, D, D, D]], jnp.int8)
  turn = jnp.array([[-1, -1, 0, 0, 0, 1, 1], [-1, -1, 0, 0, -1, -1, -1]])
  return types.Trajectory(
      tokens=jnp.zeros((2, 7), jnp.int32), role=role,
      logprob=jnp.zeros((2, 7)), turn=turn, length=jnp.array([7, 4]),
      num_turns=jnp.array([2, 1]),
      finish=jnp.array([types.ANSWERED, types.ANSWERED]),
      group=jnp.array([0, 0]),
      facts={"progress": jnp.array([[0.0, 1.0, 1.0], [0.0, 0.0, 0.0]]),
             "correct": jnp.array([True, False]),
             "num_tool_calls": jnp.array([1, 0])})


def test_per_turn_credit_with_pbrs_hand_values():
  rl = default.get_config().rl
  rl.credit = "per_turn"
  rl.pbrs_coef = 0.5
  rl.adv_eps = 0.0
  reward = jnp.array([1.0, 0.0])
  # ep 0: r = [0, 1], Phi = [0, .5, .5] -> F = [.5, 0 - .5] (terminal Phi = 0),
  # shaped [.5, .5], returns [1, .5]; ep 1: returns [0, -]. Turn 0 of the group:
  # [1, 0] -> z-scores [1, -1]; turn 1 has one episode -> 0.
  _, _, adv = learner.token_advantages(rl, reward, _two_episode_traj(), 2)
  np.testing.assert_allclose(adv, [[0, 0, 1, 1, 0, 0, 0], [0, 0, -1, -1, 0, 0, 0]],
                             atol=1e-6)


def test_trajectory_credit_pbrs_leaves_grpo_unchanged_at_discount_one():
  rl = default.get_config().rl
  rl.pbrs_coef = 0.5
  rl.adv_eps = 0.0
  reward = jnp.array([1.0, 0.0])
  r, adv_b, adv = learner.token_advantages(rl, reward, _two_episode_traj(), 2)
  # Terminated, discount 1: sum F = Phi(terminal) - Phi(s_0) = 0 for both.
  np.testing.assert_allclose(r, [1.0, 0.0], atol=1e-6)
  np.testing.assert_allclose(adv_b, [1.0, -1.0], atol=1e-6)
  np.testing.assert_allclose(adv[0], [0, 0, 1, 1, 0, 1, 1], atol=1e-6)


def test_dynamic_sampling_retries_then_skips_update_without_usable_group():
  """A freshly initialised policy is never correct: with the 'correct' metric
  no group varies, so the step retries up to the bound, then skips the update
  (params and optimizer state unchanged) and logs why."""
  config = default.get_config("smoke")
  config.sft.steps = 0
  config.rl.dynamic_sampling_oversample = 2
  config.rl.dynamic_sampling_max_retries = 2
  config.rl.dynamic_sampling_metric = "correct"
  state, step = _rl_state_and_step(config)
  before = jax.tree.map(np.asarray, (state.params, state.opt_state))
  state, m = step(state)
  assert float(m["accuracy"]) == 0.0
  assert float(m["skipped_update"]) == 1.0
  assert float(m["usable_groups"]) == 0.0
  assert float(m["dynamic_sampling_rounds"]) == 3.0  # 1 + 2 retries
  for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(
      (state.params, state.opt_state))):
    np.testing.assert_array_equal(a, b)
  assert int(state.step) == 1


def test_rl_steps_with_replay_injection_and_self_imitation():
  """Two GRPO iterations with the replay buffer on: successes are stored
  (then checkpointable in TrainState.replay), SIL runs on buffered episodes."""
  config = default.get_config("smoke")
  config.rl.replay_capacity = 8
  config.rl.replay_inject = True
  config.rl.replay_success_threshold = 0.5
  config.rl.sil_coef = 0.1
  config.rl.sil_batch_size = 2
  state, step = _rl_state_and_step(config)
  assert state.replay.tokens.shape == (8, config.max_len)
  for _ in range(2):
    state, m = step(state)
    assert all(np.isfinite(float(v)) for v in m.values()), m
  assert {"replay_size", "replay_injected", "sil_loss"} <= set(m)
  # Buffer size = distinct tasks with a success so far (<= capacity).
  assert float(m["replay_size"]) == float(jnp.sum(state.replay.valid))
  assert 0 <= float(m["replay_size"]) <= 8


def test_dual_ascent_coefficient_moves_by_the_hand_computed_step():
  config = default.get_config("smoke")
  config.rl.dual_constraint = "num_tool_calls"
  config.rl.dual_target = 0.25
  config.rl.dual_lr = 0.5
  config.rl.dual_init = 0.1
  state, step = _rl_state_and_step(config)
  assert float(state.dual_coef) == pytest.approx(0.1)
  state, m = step(state)
  calls = float(m["dual_observed"])
  assert calls == pytest.approx(float(m["tool_calls"]))
  assert float(m["dual_coef"]) == pytest.approx(0.1)
  # lam' = max(0, 0.1 + 0.5 * (calls - 0.25)).
  assert float(state.dual_coef) == pytest.approx(
      max(0.0, 0.1 + 0.5 * (calls - 0.25)), abs=1e-6)
  # 'min' sense: the multiplier grows when the fact is below its target.
  rl = config.rl
  rl.dual_sense = "min"
  np.testing.assert_allclose(
      learner.dual_coef_update(rl, jnp.float32(0.1), jnp.float32(0.0)),
      0.1 + 0.5 * 0.25)
  rl.dual_sense = "max"
  np.testing.assert_allclose(
      learner.dual_coef_update(rl, jnp.float32(0.1), jnp.float32(0.0)), 0.0)


def test_any_potential_array_plugs_into_pbrs_credit():
  """Hand-made potentials passed as phi_bk1 reproduce the progress-fact path
  (per_turn hand values of test_per_turn_credit_with_pbrs_hand_values)."""
  rl = default.get_config().rl
  rl.credit = "per_turn"
  rl.pbrs_coef = 0.5
  rl.adv_eps = 0.0
  traj = _two_episode_traj()
  traj = traj.replace(facts={**traj.facts, "progress": jnp.zeros((2, 3))})
  phi = jnp.array([[0.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
  _, _, adv = learner.token_advantages(rl, jnp.array([1.0, 0.0]), traj, 2,
                                       phi_bk1=phi)
  np.testing.assert_allclose(adv, [[0, 0, 1, 1, 0, 0, 0], [0, 0, -1, -1, 0, 0, 0]],
                             atol=1e-6)


def test_dense_as_aux_loss_leaves_advantages_unchanged():
  rl = default.get_config().rl
  rl.credit = "per_turn"
  rl.scale_by_std = False
  traj = _two_episode_traj()
  traj = traj.replace(facts={**traj.facts, "progress": jnp.array(
      [[0.0, 1.0, 1.0], [0.4, 0.0, 0.0]])})
  reward = jnp.array([1.0, 0.0])
  # Without shaping: returns ep0 [1, 1], ep1 [0, -]; turn 0 -> [.5, -.5].
  # With PBRS (coef .5) ep 1's turn-0 return is 0 - .5 * .4 = -.2.
  _, _, plain = learner.token_advantages(rl, reward, traj, 2)
  rl.pbrs_coef = 0.5
  _, _, shaped = learner.token_advantages(rl, reward, traj, 2)
  rl.dense_as = "aux_loss"
  _, _, aux_path = learner.token_advantages(rl, reward, traj, 2)
  np.testing.assert_array_equal(aux_path, plain)
  assert not np.allclose(shaped, plain)  # the reward path does change them
  np.testing.assert_allclose(plain[:, 2], [0.5, -0.5], atol=1e-6)
  np.testing.assert_allclose(shaped[:, 2], [0.6, -0.6], atol=1e-6)
  # The dense signal goes to the aux loss: F = [0.5 * 1 - 0, 0 - 0.5] for
  # ep 0 (terminal Phi = 0), [0 - 0.2] for ep 1, on each turn's POLICY tokens.
  aux = learner.dense_aux_advantages(rl, traj, traj.facts["progress"], 2)
  np.testing.assert_allclose(
      aux, [[0, 0, .5, .5, 0, -.5, -.5], [0, 0, -.2, -.2, 0, 0, 0]], atol=1e-6)


def test_aux_loss_term_adds_its_surrogate_to_the_loss():
  graphdef, params, _ = fakes.tiny_policy(2)
  batch = _batch(graphdef, params, seed=2)
  config = _config(num_minibatches=1, kl_coef=0.0)
  aux = jnp.where(batch["mask"], 0.3, 0.0)
  den = batch["mask"].sum()
  l0, m0 = learner._rl_loss(graphdef, params, batch, config.rl, kl_coef=0.0,
                            denominator=den)
  l1, m1 = learner._rl_loss(graphdef, params, {**batch, "aux_advantage": aux},
                            config.rl, kl_coef=0.0, denominator=den)
  # Ratio 1: the surrogate of a constant +0.3 is -0.3 per token (token-mean).
  np.testing.assert_allclose(m1["aux_loss"], -0.3, rtol=1e-5)
  np.testing.assert_allclose(l1 - l0, -0.3, rtol=1e-5)
  np.testing.assert_allclose(m1["pg_loss"], m0["pg_loss"], rtol=1e-6)


def test_gigpo_token_advantages_hand_values():
  rl = default.get_config().rl
  rl.advantage_estimator = "gigpo"
  rl.adv_eps = 0.0
  # Episode GRPO [1, -1]; step group s_0 = both episodes (same prompt):
  # returns [1, 0] -> [1, -1]; s_1 holds ep 0 alone -> 0. A = A_E + A_S.
  _, adv_b, adv = learner.token_advantages(rl, jnp.array([1.0, 0.0]),
                                           _two_episode_traj(), 2)
  np.testing.assert_allclose(adv_b, [1, -1], atol=1e-6)
  np.testing.assert_allclose(adv, [[0, 0, 2, 2, 0, 1, 1], [0, 0, -2, -2, 0, 0, 0]],
                             atol=1e-6)
  rl.gigpo_step_weight = 0.5
  _, _, adv = learner.token_advantages(rl, jnp.array([1.0, 0.0]),
                                       _two_episode_traj(), 2)
  np.testing.assert_allclose(adv[:, 2], [1.5, -1.5], atol=1e-6)


def test_tree_token_advantages_hand_values():
  """The hand-drawn 2x2 tree (outcomes [1, 0, 0, 0], alpha 1, mean-only):
  turn 0 (depth 1) gets [.25, .25, -.25, -.25], turn 1 (depth 2)
  [.5, -.5, 0, 0]; TOOL and PROMPT tokens get 0."""
  rl = default.get_config().rl
  rl.tree_branching = (2, 2)
  rl.tree_alpha = 1.0
  rl.scale_by_std = False
  base = _two_episode_traj()
  traj = jax.tree.map(lambda x: jnp.concatenate([x[:1]] * 4), base)
  traj = traj.replace(group=jnp.zeros(4, jnp.int32))
  _, adv_b, adv = learner.token_advantages(
      rl, jnp.array([1.0, 0.0, 0.0, 0.0]), traj, 2)
  np.testing.assert_allclose(adv_b, [.5, -.5, 0, 0], atol=1e-6)
  np.testing.assert_allclose(adv, [
      [0, 0, .25, .25, 0, .5, .5], [0, 0, .25, .25, 0, -.5, -.5],
      [0, 0, -.25, -.25, 0, 0, 0], [0, 0, -.25, -.25, 0, 0, 0]], atol=1e-6)


def test_rl_step_with_tree_rollouts_runs():
  config = default.get_config("smoke")
  config.rl.tree_branching = (2, 2)
  state, step = _rl_state_and_step(config)
  state, m = step(state)
  assert all(np.isfinite(float(v)) for v in m.values()), m
