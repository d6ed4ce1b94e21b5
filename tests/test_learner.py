"""GRPO update: micro-batch accumulation equals the full batch, every loss variant
runs, and the first importance ratio is 1."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from agentic_rl import credit
from agentic_rl import estimators
from agentic_rl import learner
from agentic_rl import losses
from agentic_rl import sampling
from agentic_rl import types
from configs import default
from tests import fakes

# fakes.TINY with one block, for the update tests whose assertions (micro-batch
# accumulation = the full batch, first ratios 1, the SFT token mean) hold at
# any depth: each test and parametrisation compiles its own update programs,
# and blocks are unrolled, so one block instead of two makes each smaller.
_TINY_1 = dataclasses.replace(fakes.TINY, num_layers=1)


# One compiled forward per model and shape (op by op it was hundreds of small
# compiles); one jit object, so the tests on the same model share it.
_token_logprobs = jax.jit(sampling.token_logprobs, static_argnums=0)


def _tokens_and_mask(b, l, seed):
  """`_batch`'s tokens [b, l] and POLICY mask, and its advantage key."""
  k1, k2, k3 = jax.random.split(jax.random.PRNGKey(seed), 3)
  tokens = jax.random.randint(k1, (b, l), 0, 200)
  lengths = jax.random.randint(k2, (b,), 4, l + 1)
  pos = jnp.arange(l)[None, :]
  # Rows: 2 prompt tokens, then POLICY tokens up to the row length, a TOOL token
  # at position 4, PAD after the length.
  role = jnp.where(pos < 2, types.PROMPT, types.POLICY)
  role = jnp.where(pos == 4, types.TOOL, role)
  role = jnp.where(pos >= lengths[:, None], types.PAD, role).astype(jnp.int8)
  return tokens, role == types.POLICY, k3


def _batch(graphdef, params, b=8, l=10, seed=0):
  tokens, mask, k3 = _tokens_and_mask(b, l, seed)
  logp, _ = _token_logprobs(graphdef, params, tokens, 1.0)
  adv = jax.random.normal(k3, (b,))
  return learner.LearnerBatch(
      tokens=tokens,
      mask=mask,
      behaviour_logp=jnp.where(mask, logp, 0.0),
      ref_logp=jnp.where(mask, logp - 0.1, 0.0),
      advantage=jnp.where(mask, adv[:, None], 0.0),
  )


def _config(**rl):
  config = default.get_config("smoke")
  config.rl.update(rl)
  config.rl.learning_rate = 1e-2
  config.rl.warmup_steps = 1
  return config


@pytest.mark.parametrize(
    "mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
)
def test_microbatch_accumulation_equals_full_batch(mode):
  graphdef, params, _ = fakes.tiny_policy(0, _TINY_1)
  batch = _batch(graphdef, params)
  out = []
  for micro in (1, 4):
    config = _config(
        num_minibatches=1,
        num_microbatches=micro,
        loss_agg_mode=mode,
        kl_coef=0.1,
        entropy_coef=0.01,
    )
    tx = learner.make_optimizer(config.rl)
    update = jax.jit(learner.make_update_fn(config, graphdef, tx))
    new_params, _, m = update(params, tx.init(params), batch, jnp.float32(0.1))
    out.append((new_params, m))
  (p1, m1), (p4, m4) = out
  for k in ("loss", "pg_loss", "kl", "entropy", "grad_norm"):
    np.testing.assert_allclose(m1[k], m4[k], rtol=2e-5, atol=1e-7)
  for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p4)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(
    "loss_type,mode",
    [
        (
            name,
            losses.SEQUENCE_AGG_MODE if loss.sequence_level else "token-mean",
        )
        for name, loss in losses.POLICY_LOSSES.items()
        # FlowRL's log Z head: test_flowrl.py.
        if not loss.episode_reward
    ],
)
def test_every_loss_type_updates_with_first_ratio_one(loss_type, mode):
  graphdef, params, _ = fakes.tiny_policy(1, _TINY_1)
  batch = _batch(graphdef, params, seed=1)
  config = _config(
      loss_type=loss_type,
      loss_agg_mode=mode,
      dual_clip=3.0,
      num_minibatches=2,
      ppo_epochs=2,
  )
  tx = learner.make_optimizer(config.rl)
  update = jax.jit(learner.make_update_fn(config, graphdef, tx))
  new_params, _, m = update(params, tx.init(params), batch, jnp.float32(0.0))
  assert all(np.isfinite(float(v)) for v in m.values())
  # Behaviour log-probs equal the trainer's: the first step's ratio is 1.
  np.testing.assert_allclose(float(m["ratio_mean_first"]), 1.0, atol=1e-6)
  changed = [
      not np.allclose(a, b)
      for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(new_params))
  ]
  assert any(changed)


_rl_state_and_step = fakes.rl_state_and_step


def _one_layer(config):
  """`config` (changed in place and returned) with a one-layer policy.

  For the tests below that check how switches are wired through one jitted
  GRPO iteration (finite metrics, logged keys, hand-computed controller
  steps): nothing they assert depends on the depth, and the iteration is one
  large program whose blocks are unrolled (in the rollout, the reference and
  behaviour forwards and the update), so one layer instead of the smoke
  model's three compiles it in a good deal less time.
  """
  config.model.num_layers = 1
  return config


def test_rl_step_with_non_default_switches_runs():
  """Wiring of reward composition, schedules, noise, HDPO, CISPO, KL in reward,
  adaptive KL and micro-batches through one jitted GRPO iteration."""
  config = _one_layer(default.get_config("smoke"))
  config.rl.rewards = {"otc": 1.0, "tool_bonus": 1.0, "format": 0.1}
  config.rl.reward_schedules = {
      "tool_bonus": {"kind": "linear", "start": 0.2, "end": 0.0, "steps": 2}
  }
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
  assert {
      "reward_otc",
      "reward_tool_bonus",
      "reward_format",
      "usable_groups",
      "skipped_update",
      "env_reward",
      "overlong_soft_penalty",
  } <= set(m)
  # The soft overlong penalty is logged on its own, apart from env_reward.
  assert -1.0 <= float(m["overlong_soft_penalty"]) <= 0.0
  # The adaptive controller moved the coefficient after the first step.
  assert coefs[0] == pytest.approx(0.01) and coefs[1] != coefs[0]


def _pbrs_config(credit_mode):
  config = _one_layer(default.get_config("smoke"))
  config.rl.credit = credit_mode
  config.rl.pbrs_coef = 0.5
  config.rl.discount = 0.9
  return config


def test_rl_step_with_pbrs_credit_runs():
  """credit 'per_turn'; 'trajectory' runs in
  test_dual_ascent_coefficient_moves_by_the_hand_computed_step (the same
  config plus dual ascent: one compiled GRPO iteration serves both)."""
  state, step = _rl_state_and_step(_pbrs_config("per_turn"))
  state, m = step(state)
  assert all(np.isfinite(float(v)) for v in m.values()), m


def _two_episode_traj():
  """Group of 2 (K = 2): ep 0 calls the tool (turn 0) then answers correctly
  (turn 1); ep 1 answers wrongly at once. Token layout: 2 prompt tokens, then
  each turn's POLICY tokens (and ep 0's observation)."""
  P, Q, T, D = types.PROMPT, types.POLICY, types.TOOL, types.PAD
  role = jnp.array([[P, P, Q, Q, T, Q, Q], [P, P, Q, Q, D, D, D]], jnp.int8)
  turn = jnp.array([[-1, -1, 0, 0, 0, 1, 1], [-1, -1, 0, 0, -1, -1, -1]])
  return fakes.trajectory(
      role=role,
      turn=turn,
      length=[7, 4],
      num_turns=[2, 1],
      facts={
          "progress": jnp.array([[0.0, 1.0, 1.0], [0.0, 0.0, 0.0]]),
          "correct": jnp.array([True, False]),
          "num_tool_calls": jnp.array([1, 0]),
      },
  )


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
  np.testing.assert_allclose(
      adv, [[0, 0, 1, 1, 0, 0, 0], [0, 0, -1, -1, 0, 0, 0]], atol=1e-6
  )


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


@pytest.mark.slow  # 20-60 s of training: slow tier keeps the default tier short
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
  for a, b in zip(
      jax.tree.leaves(before), jax.tree.leaves((state.params, state.opt_state))
  ):
    np.testing.assert_array_equal(a, b)
  assert int(state.step) == 1


@pytest.mark.slow  # 20-60 s of training: slow tier keeps the default tier short
def test_rl_steps_with_replay_injection_and_self_imitation():
  """Two GRPO iterations with the replay buffer on: successes are stored
  (then checkpointable in TrainState.features['replay']), SIL runs on buffered episodes.
  """
  config = default.get_config("smoke")
  config.rl.replay_capacity = 8
  config.rl.replay_inject = True
  config.rl.replay_success_threshold = 0.5
  config.rl.sil_coef = 0.1
  config.rl.sil_batch_size = 2
  state, step = _rl_state_and_step(config)
  assert state.features["replay"].tokens.shape == (8, config.max_len)
  for _ in range(2):
    state, m = step(state)
    assert all(np.isfinite(float(v)) for v in m.values()), m
  assert {"replay_size", "replay_injected", "sil_loss"} <= set(m)
  # Buffer size = distinct tasks with a success so far (<= capacity).
  assert float(m["replay_size"]) == float(
      jnp.sum(state.features["replay"].valid)
  )
  assert 0 <= float(m["replay_size"]) <= 8


def test_dual_ascent_coefficient_moves_by_the_hand_computed_step():
  """Also test_rl_step_with_pbrs_credit_runs with credit 'trajectory': its
  config (PBRS, discount 0.9) plus dual ascent, whose observed fact and
  multiplier update do not read the advantages; one compiled iteration."""
  config = _pbrs_config("trajectory")
  config.rl.dual_constraint = "num_tool_calls"
  config.rl.dual_target = 0.25
  config.rl.dual_lr = 0.5
  config.rl.dual_init = 0.1
  state, step = _rl_state_and_step(config)
  assert float(state.features["dual"]) == pytest.approx(0.1)
  state, m = step(state)
  # The PBRS (trajectory credit) iteration runs: every metric finite.
  assert all(np.isfinite(float(v)) for v in m.values()), m
  calls = float(m["dual_observed"])
  assert calls == pytest.approx(float(m["tool_calls"]))
  assert float(m["dual_coef"]) == pytest.approx(0.1)
  # lam' = max(0, 0.1 + 0.5 * (calls - 0.25)).
  assert float(state.features["dual"]) == pytest.approx(
      max(0.0, 0.1 + 0.5 * (calls - 0.25)), abs=1e-6
  )
  # 'min' sense: the multiplier grows when the fact is below its target.
  rl = config.rl
  rl.dual_sense = "min"
  np.testing.assert_allclose(
      learner.dual_coef_update(rl, jnp.float32(0.1), jnp.float32(0.0)),
      0.1 + 0.5 * 0.25,
  )
  rl.dual_sense = "max"
  np.testing.assert_allclose(
      learner.dual_coef_update(rl, jnp.float32(0.1), jnp.float32(0.0)), 0.0
  )


def _stall_vs_answer_traj():
  """`_two_episode_traj`'s layout, but ep 0 calls twice, resolving the chain
  (progress 0 -> .5 -> 1), and is cut off at the turn budget without
  answering (reward 0); ep 1 answers correctly at once (reward 1)."""
  return _two_episode_traj().replace(
      finish=jnp.array([types.MAX_TURNS, types.ANSWERED]),
      facts={
          "progress": jnp.array([[0.0, 0.5, 1.0], [0.0, 0.0, 0.0]]),
          "correct": jnp.array([False, True]),
          "num_tool_calls": jnp.array([2, 0]),
      },
  )


@pytest.mark.parametrize("credit_mode", ["trajectory", "per_turn"])
def test_pbrs_cutoff_keep_pays_the_stall_zero_does_not(credit_mode):
  rl = default.get_config().rl
  rl.credit = credit_mode
  rl.pbrs_coef = 1.0
  rl.adv_eps = 0.0
  reward = jnp.array([0.0, 1.0])
  traj = _stall_vs_answer_traj()
  # 'keep': the cut-off episode keeps Phi(s_2) = 1, so its return (trajectory:
  # 0 + 1 - 0; per turn 0: F_0 + F_1 = .5 + .5) ties the correct answer's 1:
  # every advantage is 0 and nothing teaches answering.
  assert rl.pbrs_cutoff == "keep"
  _, _, adv_keep = learner.token_advantages(rl, reward, traj, 2)
  np.testing.assert_allclose(adv_keep, np.zeros((2, 7)), atol=1e-6)
  # 'zero': Phi(s_2) = 0, returns 0 (turn 0: .5 - .5) vs 1 -> z-scores -1, +1;
  # per turn, turn 1 has one episode -> 0.
  rl.pbrs_cutoff = "zero"
  _, _, adv_zero = learner.token_advantages(rl, reward, traj, 2)
  want_ep0 = (
      [0, 0, -1, -1, 0, -1, -1]
      if credit_mode == "trajectory"
      else [0, 0, -1, -1, 0, 0, 0]
  )
  np.testing.assert_allclose(
      adv_zero, [want_ep0, [0, 0, 1, 1, 0, 0, 0]], atol=1e-6
  )
  # The auxiliary-loss path reads the same switch: F = [.5, 1 - .5] kept,
  # [.5, 0 - .5] zeroed, on each turn's POLICY tokens.
  phi = traj.facts["progress"]
  rl.pbrs_cutoff = "keep"
  np.testing.assert_allclose(
      learner.dense_aux_advantages(rl, traj, phi, 2)[0],
      [0, 0, 0.5, 0.5, 0, 0.5, 0.5],
      atol=1e-6,
  )
  rl.pbrs_cutoff = "zero"
  np.testing.assert_allclose(
      learner.dense_aux_advantages(rl, traj, phi, 2)[0],
      [0, 0, 0.5, 0.5, 0, -0.5, -0.5],
      atol=1e-6,
  )


def test_pbrs_cutoff_never_keeps_final_potential():
  """'never': no ending is absorbing, so the shaped turn rewards telescope to
  Phi(s_n) - Phi(s_0) for answered and cut-off episodes alike (by hand:
  Phi = [0.5, 1.0, 0.75], two turns -> F = [0.5, -0.25], sum 0.25)."""
  rl = default.get_config().rl
  rl.pbrs_cutoff = "never"
  finish = jnp.array([types.ANSWERED, types.FORMAT_ERROR, types.TRUNCATED])
  term = learner.pbrs_terminated(rl, finish)
  np.testing.assert_array_equal(term, [False, False, False])
  phi = jnp.array([0.5, 1.0, 0.75])
  f = credit.pbrs_shaping(phi, jnp.array([True, True]), 1.0, term[0])
  np.testing.assert_allclose(f, [0.5, -0.25], atol=1e-7)
  rl.pbrs_cutoff = "zero"  # the answered episode's Phi(s_n) is dropped instead
  f0 = credit.pbrs_shaping(
      phi, jnp.array([True, True]), 1.0, learner.pbrs_terminated(rl, finish)[0]
  )
  np.testing.assert_allclose(f0, [0.5, -1.0], atol=1e-7)


def test_pbrs_cutoff_never_reads_an_answered_episodes_final_state_before_its_answer():
  """'never': an answered or format-error episode's potential after its last
  turn is the one before that turn (s_n would hold the policy's own answer),
  so its answer turn gets no shaping; a cut-off episode keeps Phi(s_n). By
  hand, Phi = [0.5, 1.0, 0.75, 0.75], two turns: answered -> [0.5, 1.0, 1.0,
  1.0]; truncated -> unchanged."""
  rl = default.get_config().rl
  rl.pbrs_cutoff = "never"
  phi = jnp.tile(jnp.array([0.5, 1.0, 0.75, 0.75]), (3, 1))
  traj = fakes.trajectory(
      role=jnp.full((3, 4), types.POLICY, jnp.int8),
      turn=jnp.zeros((3, 4), jnp.int32),
      length=4,
      num_turns=2,
      finish=jnp.array([types.ANSWERED, types.FORMAT_ERROR, types.TRUNCATED]),
  )
  got = learner.pbrs_final_potential(rl, phi, traj)
  np.testing.assert_allclose(
      got,
      [[0.5, 1.0, 1.0, 1.0], [0.5, 1.0, 1.0, 1.0], [0.5, 1.0, 0.75, 0.75]],
  )
  rl.pbrs_cutoff = "zero"  # other cutoffs: untouched
  np.testing.assert_array_equal(
      learner.pbrs_final_potential(rl, phi, traj), phi
  )
  # Through the learner (_two_episode_traj, both answered): ep 0 calls then
  # answers, Phi = [0, 1, 3] -> F = [1, 1 - 1] = [1, 0] (not [1, 2]); ep 1
  # answers at once, Phi = [0, 2, 2] -> F_0 = 0 (not 2).
  rl.pbrs_cutoff = "never"
  rl.pbrs_coef = 1.0
  two = _two_episode_traj()
  phi2 = jnp.array([[0.0, 1.0, 3.0], [0.0, 2.0, 2.0]])
  np.testing.assert_allclose(
      learner.dense_aux_advantages(rl, two, phi2, 2),
      [[0, 0, 1, 1, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0]],
      atol=1e-6,
  )


def test_pbrs_terminated_rejects_unknown_cutoff():
  rl = default.get_config().rl
  rl.pbrs_cutoff = "drop"
  with pytest.raises(ValueError, match="rl.pbrs_cutoff"):
    learner.pbrs_terminated(rl, jnp.array([types.ANSWERED]))


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
  _, _, adv = learner.token_advantages(
      rl, jnp.array([1.0, 0.0]), traj, 2, phi_bk1=phi
  )
  np.testing.assert_allclose(
      adv, [[0, 0, 1, 1, 0, 0, 0], [0, 0, -1, -1, 0, 0, 0]], atol=1e-6
  )


def test_dense_as_aux_loss_leaves_advantages_unchanged():
  rl = default.get_config().rl
  rl.credit = "per_turn"
  rl.scale_by_std = False
  traj = _two_episode_traj()
  traj = traj.replace(
      facts={
          **traj.facts,
          "progress": jnp.array([[0.0, 1.0, 1.0], [0.4, 0.0, 0.0]]),
      }
  )
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
      aux,
      [[0, 0, 0.5, 0.5, 0, -0.5, -0.5], [0, 0, -0.2, -0.2, 0, 0, 0]],
      atol=1e-6,
  )


def test_aux_loss_term_adds_its_surrogate_to_the_loss():
  # One block (the surrogate's value does not depend on the depth); both
  # losses in one compiled program (op by op they were ~90 small compiles).
  graphdef, params, _ = fakes.tiny_policy(2, _TINY_1)
  batch = _batch(graphdef, params, seed=2)
  config = _config(num_minibatches=1, kl_coef=0.0)
  aux = jnp.where(batch.mask, 0.3, 0.0)
  den = batch.mask.sum()

  @jax.jit
  def without_and_with_aux(params, batch, aux, den):
    loss = functools.partial(
        learner._rl_loss, graphdef, rl_cfg=config.rl, kl_coef=0.0
    )
    return (
        loss(params, batch, denominator=den),
        loss(params, batch.replace(aux_advantage=aux), denominator=den),
    )

  (l0, m0), (l1, m1) = without_and_with_aux(params, batch, aux, den)
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
  _, adv_b, adv = learner.token_advantages(
      rl, jnp.array([1.0, 0.0]), _two_episode_traj(), 2
  )
  np.testing.assert_allclose(adv_b, [1, -1], atol=1e-6)
  np.testing.assert_allclose(
      adv, [[0, 0, 2, 2, 0, 1, 1], [0, 0, -2, -2, 0, 0, 0]], atol=1e-6
  )
  rl.gigpo_step_weight = 0.5
  _, _, adv = learner.token_advantages(
      rl, jnp.array([1.0, 0.0]), _two_episode_traj(), 2
  )
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
      rl, jnp.array([1.0, 0.0, 0.0, 0.0]), traj, 2
  )
  np.testing.assert_allclose(adv_b, [0.5, -0.5, 0, 0], atol=1e-6)
  np.testing.assert_allclose(
      adv,
      [
          [0, 0, 0.25, 0.25, 0, 0.5, 0.5],
          [0, 0, 0.25, 0.25, 0, -0.5, -0.5],
          [0, 0, -0.25, -0.25, 0, 0, 0],
          [0, 0, -0.25, -0.25, 0, 0, 0],
      ],
      atol=1e-6,
  )


@pytest.mark.slow  # 20-60 s of training: slow tier keeps the default tier short
def test_rl_step_with_tree_rollouts_runs():
  config = default.get_config("smoke")
  config.rl.tree_branching = (2, 2)
  state, step = _rl_state_and_step(config)
  state, m = step(state)
  assert all(np.isfinite(float(v)) for v in m.values()), m


# ------------------------------------------- behaviour log-probs, GAE, FlowRL


def test_trainer_behaviour_logprobs_make_first_epoch_ratios_exactly_one():
  """rl.behaviour_logprobs='trainer': every POLICY token's first-epoch ratio
  is exactly 1.0 (bitwise) with several PPO epochs and num_minibatches=1;
  'sampler' keeps the batch's log-probs (here offset by 1e-3) in the ratio."""
  graphdef, params, _ = fakes.tiny_policy(1, _TINY_1)
  batch = _batch(graphdef, params, seed=1)
  mask = batch.mask
  # Epoch 0 runs at the warmup's learning rate 0, so epochs 0 and 1 both see
  # the behaviour parameters; epoch 2 sees updated ones.
  for mode in ("trainer", "sampler"):
    config = _config(
        ppo_epochs=3,
        num_minibatches=1,
        num_microbatches=1,
        behaviour_logprobs=mode,
    )
    logp, values = learner.behaviour_forward(
        config, graphdef, params, batch.tokens
    )
    assert values is None
    beh = jnp.where(mask, logp, 0.0)
    if mode == "sampler":
      beh = jnp.where(mask, logp - 1e-3, 0.0)  # a sampler/trainer mismatch
    tx = learner.make_optimizer(config.rl)
    update = jax.jit(learner.make_update_fn(config, graphdef, tx))
    new_params, _, m = update(
        params,
        tx.init(params),
        batch.replace(behaviour_logp=beh),
        jnp.float32(0.0),
    )
    if mode == "trainer":
      assert float(m["ratio_dev_max_first"]) == 0.0
      assert float(m["ratio_mean_first"]) == 1.0
      # The recomputed log-probs themselves agree with the loss's forward to
      # float rounding (bitwise here, where the two programs are separate).
      assert float(m["behaviour_gap_max_first"]) < 1e-5
      # Later epochs see updated parameters: ratios move off 1.
      assert float(m["ratio_dev_max"]) > 0.0
    else:
      np.testing.assert_allclose(
          float(m["ratio_dev_max_first"]), np.expm1(1e-3), rtol=1e-2
      )
    assert any(
        not np.allclose(a, b)
        for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(new_params))
    )


# _TINY_1 with a value head (the value tests' assertions hold at any depth).
_TINY_1_VALUE = dataclasses.replace(_TINY_1, value_head=True)


def _value_batch(seed=3):
  graphdef, params, _ = fakes.tiny_policy(seed, _TINY_1_VALUE)
  batch = _batch(graphdef, params, seed=seed)
  return graphdef, params, batch


def test_value_loss_decreases_over_a_few_steps_on_a_toy_batch():
  """Advantage 0, returns = +1 on POLICY tokens: only the value term acts and
  the clipped value loss falls over the steps (value head starts at 0)."""
  graphdef, params, batch = _value_batch()
  config = _config(
      num_minibatches=1, kl_coef=0.0, value_clip=0.2, value_coef=1.0
  )
  config.rl.learning_rate = 3e-2
  mask = batch.mask
  _, old_values = learner.behaviour_forward(
      config, graphdef, params, batch.tokens, with_values=True
  )
  np.testing.assert_array_equal(old_values, 0.0)  # head initialised at 0
  batch = batch.replace(
      advantage=jnp.zeros_like(batch.advantage),
      old_values=old_values,
      returns=jnp.where(mask, 1.0, 0.0),
  )
  tx = learner.make_optimizer(config.rl)
  update = jax.jit(learner.make_update_fn(config, graphdef, tx))
  opt_state = tx.init(params)
  seen = []
  for _ in range(4):
    params, opt_state, m = update(params, opt_state, batch, jnp.float32(0.0))
    seen.append(float(m["value_loss"]))
  # Steps 0 and 1: V = V_old = 0 -> 0.5 * (0 - 1)^2 = 0.5 (step 0 runs at
  # the warmup's learning rate 0). Then the loss falls until the value clip
  # (V_old = 0 stays fixed, eps 0.2) floors it at 0.5 * (0.2 - 1)^2 = 0.32.
  assert seen[:2] == pytest.approx([0.5, 0.5], abs=1e-6)
  assert seen[1] > seen[2] > seen[3], seen
  assert seen[3] == pytest.approx(0.32, abs=1e-5)


def test_gae_token_advantages_reward_at_last_policy_token():
  rl = default.get_config().rl
  rl.discount = 0.9
  rl.gae_lambda = 0.5
  P, Q, T, D = types.PROMPT, types.POLICY, types.TOOL, types.PAD
  role = jnp.array([[P, Q, Q, T, T, Q, D]], jnp.int8)
  values = jnp.array([[9.0, 0.5, 0.2, 9.0, 9.0, 0.8, 9.0]])
  adv_b, adv, ret = estimators.gae_token_advantages(
      jnp.array([1.0]),
      role == types.POLICY,
      values,
      discount=rl.discount,
      lambda_=rl.gae_lambda,
  )
  # As tests/test_advantages.py::test_token_gae_hand_values_with_observations.
  np.testing.assert_allclose(adv, [[0, -0.0455, 0.61, 0, 0, 0.2, 0]], atol=1e-6)
  np.testing.assert_allclose(ret, [[0, 0.4545, 0.81, 0, 0, 1.0, 0]], atol=1e-6)
  np.testing.assert_allclose(adv_b, [(-0.0455 + 0.61 + 0.2) / 3], atol=1e-6)
  # Through the config adapter: the token-level entry 'gae' of the table.
  rl.advantage_estimator = "gae"
  via_config = learner.token_level_advantages(
      rl, jnp.array([1.0]), role == types.POLICY, values
  )
  for got, want in zip(via_config, (adv_b, adv, ret)):
    np.testing.assert_array_equal(got, want)


def _assert_finite(m):
  assert all(np.isfinite(float(v)) for v in m.values()), m


def _graded_reward_smoke_config():
  """Smoke config whose untrained policy gets non-constant rewards: DAPO's
  soft overlong penalty on its (long, random) responses."""
  config = default.get_config("smoke")
  config.rl.overlong_soft_max = 20
  config.rl.overlong_soft_cache = 16
  return config


def test_ppo_gae_smoke_runs_and_trains_the_value_head():
  config = _one_layer(_graded_reward_smoke_config())
  config.model.value_head = True
  config.rl.advantage_estimator = "gae"
  config.rl.ppo_epochs = 2
  state, step = _rl_state_and_step(config)
  v0 = np.asarray(state.params["value_head_d"][...])
  for _ in range(2):
    state, m = step(state)
    _assert_finite(m)
    assert float(m["reward"]) != 0.0
    # Default behaviour log-probs ('trainer'): exact first ratios in the loop.
    assert float(m["ratio_dev_max_first"]) == 0.0
    assert float(m["behaviour_gap_max_first"]) < 1e-5
  assert {"value_loss", "logp_mismatch_max", "logp_mismatch_mean"} <= set(m)
  assert float(m["logp_mismatch_max"]) < 1e-4
  assert not np.allclose(np.asarray(state.params["value_head_d"][...]), v0)


def test_value_potential_smoke_runs_per_turn():
  config = _one_layer(default.get_config("smoke"))
  config.model.value_head = True
  config.rl.credit = "per_turn"
  config.rl.pbrs_coef = 0.5
  config.rl.pbrs_potential = "value"
  state, step = _rl_state_and_step(config)
  state, m = step(state)
  _assert_finite(m)
  assert "value_loss" in m


def test_value_potential_reads_the_value_head_at_turn_boundaries():
  graphdef, params, _ = fakes.tiny_policy(4, _TINY_1_VALUE)
  params["value_head_d"] = jax.tree.map(
      lambda x: jnp.full_like(x, 0.1), params["value_head_d"]
  )
  traj = _two_episode_traj()
  traj = traj.replace(tokens=jnp.arange(14, dtype=jnp.int32).reshape(2, 7) + 65)

  # The potential and the reference values of every position in one compiled
  # program (op by op the two forwards were ~60 small compiles).
  @jax.jit
  def potential_and_values(params, traj):
    model = nnx.merge(graphdef, params)
    return (
        learner.value_potential(graphdef, params, traj, 2),
        model.value(model.hidden_states(traj.tokens)[0]),
    )

  phi, v = potential_and_values(params, traj)
  # s_0 ends after the 2 prompt tokens; ep 0: s_1 after turn 0 and its
  # observation (5 tokens), s_2 = whole episode (7); ep 1 has 4 tokens.
  np.testing.assert_allclose(
      phi, [[v[0, 1], v[0, 4], v[0, 6]], [v[1, 1], v[1, 3], v[1, 3]]], rtol=1e-6
  )


@pytest.mark.slow  # 20-60 s of training: slow tier keeps the default tier short
def test_flowrl_smoke_runs_log_partition_learns_and_checkpoints(tmp_path):
  from agentic_rl import checkpoint as checkpoint_lib
  from agentic_rl import train

  config = _graded_reward_smoke_config()
  config.rl.loss_type = "flowrl"
  config.rl.loss_agg_mode = "seq-mean-token-mean"
  config.rl.flowrl_log_z_hidden = 8
  config.rl.flowrl_log_z_lr = 1e-2
  state, step = _rl_state_and_step(config)
  z0 = jax.tree.map(np.asarray, state.features["flowrl"].params)
  for _ in range(2):
    state, m = step(state)
    _assert_finite(m)
  assert "log_z" in m
  changed = [
      not np.allclose(a, b)
      for a, b in zip(
          jax.tree.leaves(z0), jax.tree.leaves(state.features["flowrl"].params)
      )
  ]
  assert any(changed)
  # Checkpointed with the state and restored into a fresh RL-phase state.
  ckpt = checkpoint_lib.Checkpointer(
      str(tmp_path / "ckpt"), max_to_keep=1, save_interval_steps=1
  )
  ckpt.save(int(state.step), state, force=True)
  ckpt.wait()
  model_cfg = train.make_model_config(config)
  _, fresh = train.init_state(config, model_cfg)
  fresh = train.start_rl(config, fresh)
  restored = ckpt.restore(fresh, step=int(state.step))
  ckpt.close()
  for a, b in zip(
      jax.tree.leaves(state.features["flowrl"]),
      jax.tree.leaves(restored.features["flowrl"]),
  ):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.slow
def test_flowrl_and_gae_smoke_configs_run_end_to_end_and_resume(tmp_path):
  """configs/default.py:smoke with each new switch through the whole loop
  (SFT -> RL -> eval); halted after the first RL step and resumed, the
  log-partition parameters are restored and keep training."""
  from agentic_rl import checkpoint as checkpoint_lib
  from agentic_rl import train

  for name, switches in (
      ("flowrl", dict(loss_type="flowrl", loss_agg_mode="seq-mean-token-mean")),
      ("gae", dict(advantage_estimator="gae")),
  ):
    config = default.get_config("smoke")
    config.rl.update(switches)
    config.model.value_head = name == "gae"
    config.checkpoint.every_steps = 1
    config.checkpoint.max_to_keep = 10
    workdir = str(tmp_path / name)
    config.halt_after_step = config.sft.steps + 1
    assert train.train_and_evaluate(config, workdir) is None
    config.halt_after_step = -1
    reports = train.train_and_evaluate(config, workdir)
    assert {"sft", "rl"} <= set(reports)
    if name == "flowrl":
      ckpt = checkpoint_lib.Checkpointer(workdir + "/checkpoints")
      model_cfg = train.make_model_config(config)
      _, like = train.init_state(config, model_cfg)
      like = train.start_rl(config, like)
      first = ckpt.restore(like, step=config.sft.steps + 1)
      last = ckpt.restore(like, step=ckpt.latest_step())
      ckpt.close()
      assert any(
          not np.allclose(a, b)
          for a, b in zip(
              jax.tree.leaves(first.features["flowrl"].params),
              jax.tree.leaves(last.features["flowrl"].params),
          )
      )


def _sft_traj(tokens, mask):
  """A Trajectory around _batch's tokens and roles (other fields unused by SFT)."""
  role = jnp.where(mask, types.POLICY, types.PROMPT)
  return fakes.trajectory(tokens=tokens, role=role, num_turns=0, finish=0)


def test_sft_microbatches_give_the_full_batch_token_mean_and_gradient():
  graphdef, params, _ = fakes.tiny_policy(0, _TINY_1)
  # _batch's tokens and mask (its log-probs and advantages are not read).
  traj = _sft_traj(*_tokens_and_mask(8, 12, 0)[:2])

  # Reference: token-mean NLL of the POLICY tokens, from the model's own
  # logits; one compiled program (op by op it was ~100 small compiles).
  @jax.jit
  def reference(params, tokens, role):
    logits, _ = nnx.merge(graphdef, params)(tokens)
    logp_all = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
    logp = jnp.take_along_axis(logp_all, tokens[:, 1:, None], axis=-1)[..., 0]
    mask = (role == types.POLICY)[:, 1:]
    return -jnp.sum(logp * mask) / jnp.sum(mask)

  expected = float(reference(params, traj.tokens, traj.role))
  out = {}
  for micro in (1, 2, 4):
    loss, m, grads = jax.jit(
        lambda p, t, n=micro: learner.sft_grad(graphdef, p, t, n)
    )(params, traj)
    np.testing.assert_allclose(float(loss), expected, rtol=1e-5)
    np.testing.assert_allclose(float(m["loss"]), expected, rtol=1e-5)
    np.testing.assert_allclose(
        float(m["policy_tokens"]),
        float(jnp.sum(traj.role == types.POLICY)) / 8,
        rtol=1e-6,
    )
    out[micro] = grads
  for micro in (2, 4):
    for a, b in zip(jax.tree.leaves(out[1]), jax.tree.leaves(out[micro])):
      np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)
  with pytest.raises(ValueError, match="num_microbatches=3"):
    learner.sft_grad(graphdef, params, traj, 3)


@pytest.mark.parametrize(
    "warmup,expected_lrs",
    [
        (0, [0.1, 0.1, 0.1]),  # no warmup: the first update moves too
        (2, [0.0, 0.05, 0.1]),  # lr * k / warmup for k < warmup
    ],
)
def test_optimizer_schedule_first_updates(warmup, expected_lrs):
  cfg = default.get_config().rl
  cfg.learning_rate, cfg.warmup_steps, cfg.weight_decay = 0.1, warmup, 0.0
  tx = learner.make_optimizer(cfg)
  params = {"w": jnp.zeros((1,))}
  state = tx.init(params)
  for lr in expected_lrs:
    # A constant gradient: AdamW's bias-corrected step is exactly 1 (up to eps),
    # so each update is -lr (clipping leaves a norm-0.5 gradient alone).
    updates, state = tx.update({"w": jnp.full((1,), 0.5)}, state, params)
    np.testing.assert_allclose(updates["w"], [-lr], atol=1e-6)
