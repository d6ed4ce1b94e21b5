"""Per-turn step rewards (`rl.step_reward`): hand-computed rewards, returns and
advantages for every transform on a hand-built two-episode group with a repeated
call, the kv_chain 'valid_call_turn' fact, and config validation."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentic_rl import learner
from agentic_rl.rewards import step_rewards
from agentic_rl.rewards import transforms
from agentic_rl import types
from agentic_rl import validation
from configs import default
from configs import kv_chain
from tests import fakes
from tests.test_env_kv_chain import T3, _run, answer, call

C = 0.5  # step-reward coefficient of the hand examples

# Episode A (K = 5): get(s), get(s) again (a repeat), get(b) (b is not in the
# map: a tool error), get(a), answer. Episode B: get(s), answer.
P_A = [1.0, 1.0, 0.0, 1.0, 0.0]
CALL_A = [1, 1, 1, 1, 0]
P_B = [1.0, 0.0, 0.0, 0.0, 0.0]
CALL_B = [1, 0, 0, 0, 0]

# Hand-computed per-turn step rewards c * transform(p) (eta = 1, tau = 1,
# outcome A = 1, B = 0):
HAND_STEP = {
    # c p_k on call turns: A pays the repeat again.
    "sum": ([0.5, 0.5, 0, 0.5, 0], [0.5, 0, 0, 0, 0]),
    # c min(p - 1, 0): only the failed call (p = 0) costs -c.
    "clip": ([0, 0, -0.5, 0, 0], [0, 0, 0, 0, 0]),
    # c (p_k - p_next call); the last call keeps c p_k: A [1-1, 1-0, 0-1, 1].
    "delta": ([0, 0.5, -0.5, 0.5, 0], [0.5, 0, 0, 0, 0]),
    # Same, but the last call gets 0: A [0, 1, -1, 0], B (one call) [0].
    "delta_drop": ([0, 0.5, -0.5, 0, 0], [0, 0, 0, 0, 0]),
    # V = c min_{j>=k} p_j = A [0, 0, 0, .5, 0], B [.5, 0]; r' = V_k - V_{k+1}.
    "min": ([0, 0, -0.5, 0.5, 0], [0.5, 0, 0, 0, 0]),
    # c p_k only when the outcome >= 1: A yes, B (outcome 0) no.
    "gated": ([0.5, 0.5, 0, 0.5, 0], [0, 0, 0, 0, 0]),
}
# Per-turn returns: outcome (A 1 at turn 4, B 0 at turn 1) + reward-to-go of
# the step rewards above (B has 2 valid turns).
HAND_RETURNS = {
    "none": ([1, 1, 1, 1, 1], [0, 0]),
    "sum": ([2.5, 2.0, 1.5, 1.5, 1.0], [0.5, 0]),
    "clip": ([0.5, 0.5, 0.5, 1, 1], [0, 0]),
    "delta": ([1.5, 1.5, 1.0, 1.5, 1.0], [0.5, 0]),
    "delta_drop": ([1, 1, 0.5, 1, 1], [0, 0]),
    "min": ([1, 1, 1, 1.5, 1], [0.5, 0]),
    "gated": ([2.5, 2.0, 1.5, 1.5, 1.0], [0, 0]),
}


def _arrays():
  p = jnp.array([P_A, P_B])
  scored = jnp.array([CALL_A, CALL_B], bool)
  mask = jnp.array([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]], bool)
  outcome = jnp.array([1.0, 0.0])
  return p, scored, mask, outcome


@pytest.mark.parametrize("transform", step_rewards.STEP_REWARD_TRANSFORMS)
def test_step_turn_rewards_hand_values(transform):
  p, scored, mask, outcome = _arrays()
  out = step_rewards.step_turn_rewards(
      p,
      scored,
      mask,
      outcome,
      transform=transform,
      coef=C,
      eta=1.0,
      gate_threshold=1.0,
  )
  np.testing.assert_allclose(out, np.array(HAND_STEP[transform]), atol=1e-7)


def test_episode_totals_match_the_bounds_and_gated_accumulation():
  p, scored, mask, outcome = _arrays()
  tot = {
      t: np.asarray(
          step_rewards.step_turn_rewards(
              p, scored, mask, outcome, transform=t, coef=C
          ).sum(1)
      )
      for t in step_rewards.STEP_REWARD_TRANSFORMS
  }
  # Clip: <= 0; Delta: c * p(first call) = c; min-form: c * min over all calls.
  np.testing.assert_allclose(tot["clip"], [-0.5, 0])
  np.testing.assert_allclose(tot["delta"], [0.5, 0.5])
  # Delta with the last step dropped: c * (p_first - p_last) = 0 for both.
  np.testing.assert_allclose(tot["delta_drop"], [0, 0])
  np.testing.assert_allclose(tot["min"], [0, 0.5])
  # Gated, summed per episode = G-RA's R - o (transforms.gated_accumulation).
  ref = (
      transforms.gated_accumulation(outcome, C * p * scored, mask, 1.0)
      - outcome
  )
  np.testing.assert_allclose(tot["gated"], ref)


def test_min_form_turn_rewards_reward_to_go_is_min_form_values():
  # Every valid turn scored: the reward-to-go equals transforms.min_form_values.
  r = jnp.array([[0.3, 0.9, 0.5, 0.7], [0.8, 0.2, 0.6, 0.0]])
  mask = jnp.array([[1, 1, 1, 1], [1, 1, 1, 0]], bool)
  out = step_rewards.min_form_turn_rewards(r, mask, mask)
  rtg = np.cumsum(np.asarray(out)[:, ::-1], 1)[:, ::-1]
  np.testing.assert_allclose(
      rtg, transforms.min_form_values(r, mask), atol=1e-7
  )
  np.testing.assert_allclose(rtg[0], [0.3, 0.5, 0.5, 0.7], atol=1e-7)
  np.testing.assert_allclose(rtg[1], [0.2, 0.2, 0.6, 0], atol=1e-7)


@pytest.mark.parametrize("transform", step_rewards.STEP_REWARD_TRANSFORMS)
def test_a_repeated_valid_call_pays_only_under_sum_and_gated(transform):
  """One more repeated valid call before the answer: the return at turn 0
  rises by c under the unbounded forms and not at all under clip/delta/min."""
  p = jnp.array([[1, 1, 0, 0, 0], [1, 1, 1, 0, 0]], jnp.float32)
  scored = p.astype(bool)
  mask = jnp.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 0]], bool)
  out = step_rewards.step_turn_rewards(
      p, scored, mask, jnp.ones(2), transform=transform, coef=C
  )
  gain = float(out[1].sum() - out[0].sum())
  assert gain == pytest.approx(C if transform in ("sum", "gated") else 0.0)


@pytest.mark.parametrize(
    "transform, call_minus_answer",
    [
        ("sum", C),
        ("clip", 0.0),
        ("delta", C),
        ("delta_drop", 0.0),
        ("min", C),
        ("gated", C),
    ],
)
def test_return_of_calling_vs_answering_at_the_same_turn(
    transform, call_minus_answer
):
  """Per-turn credit compares turn 1 across the group: X answers at turn 1,
  Y calls again (a repeat) at turn 1 and answers at turn 2, both correct.
  Y's return at turn 1 exceeds X's by c under sum, delta and min-form (the
  answer turn is not scored), and by 0 under clip and delta_drop."""
  p = jnp.array([[1, 0, 0], [1, 1, 0]], jnp.float32)
  scored = jnp.array([[1, 0, 0], [1, 1, 0]], bool)
  mask = jnp.array([[1, 1, 0], [1, 1, 1]], bool)
  out = np.asarray(
      step_rewards.step_turn_rewards(
          p, scored, mask, jnp.ones(2), transform=transform, coef=C
      )
  )
  rtg = np.cumsum(out[:, ::-1], 1)[:, ::-1]
  assert rtg[1, 1] - rtg[0, 1] == pytest.approx(call_minus_answer)


def _hand_traj():
  """Episodes A and B as a Trajectory: one POLICY token per turn, one TOOL
  token after each call; facts from stepping the real kv_chain env."""
  fa, _, done_a, _ = _run(
      T3, [call("s"), call("s"), call("b"), call("a"), answer("q")]
  )
  fb, _, done_b, _ = _run(T3, [call("s"), answer("a")])
  assert done_a and done_b
  P, Q, T, D = types.PROMPT, types.POLICY, types.TOOL, types.PAD
  role = jnp.array(
      [[P, Q, T, Q, T, Q, T, Q, T, Q], [P, Q, T, Q, D, D, D, D, D, D]], jnp.int8
  )
  turn = jnp.array(
      [[-1, 0, 0, 1, 1, 2, 2, 3, 3, 4], [-1, 0, 0, 1, -1, -1, -1, -1, -1, -1]]
  )
  facts = jax.tree.map(lambda a, b: jnp.stack([a, b]), fa, fb)
  return fakes.trajectory(
      facts, role=role, turn=turn, length=[10, 4], num_turns=[5, 2]
  )


def test_kv_chain_valid_call_turn_fact_counts_repeats_not_errors():
  traj = _hand_traj()
  np.testing.assert_array_equal(
      traj.facts["valid_call_turn"], np.array([P_A, P_B], bool)
  )
  np.testing.assert_array_equal(
      traj.facts["tool_call_turn"], np.array([CALL_A, CALL_B], bool)
  )
  np.testing.assert_array_equal(traj.facts["num_redundant_calls"], [1, 0])
  np.testing.assert_array_equal(traj.facts["correct"], [True, False])


def _rl(transform):
  rl = default.get_config().rl
  rl.credit = "per_turn"
  rl.scale_by_std = False  # mean-centred: advantages are return - group mean
  if transform != "none":
    rl.step_reward = "valid_call"
    rl.step_reward_transform = transform
    rl.step_reward_coef = C
    rl.step_reward_clip_eta = 1.0
    rl.step_reward_gate_threshold = 1.0
  return rl


@pytest.mark.parametrize(
    "transform", ("none",) + step_rewards.STEP_REWARD_TRANSFORMS
)
def test_token_advantages_per_turn_hand_values(transform):
  """Through learner.token_advantages: turn 0 and turn 1 are shared by A and B
  (advantage = +-(G_A - G_B) / 2); turns 2-4 exist only in A (advantage 0)."""
  traj = _hand_traj()
  ga, gb = HAND_RETURNS[transform]
  reward = jnp.array([1.0, 0.0])
  used, _, adv_bl = learner.token_advantages(_rl(transform), reward, traj, 5)
  np.testing.assert_allclose(
      used, reward
  )  # the outcome reward is returned as is
  a0, a1 = (ga[0] - gb[0]) / 2, (ga[1] - gb[1]) / 2
  want = np.array(
      [[0, a0, 0, a1, 0, 0, 0, 0, 0, 0], [0, -a0, 0, -a1, 0, 0, 0, 0, 0, 0]]
  )
  np.testing.assert_allclose(adv_bl, want, atol=1e-6)


def test_step_rewards_off_by_default_leave_advantages_unchanged():
  traj = _hand_traj()
  rl = default.get_config().rl
  rl.credit = "per_turn"
  reward = jnp.array([1.0, 0.0])
  base = learner.token_advantages(rl, reward, traj, 5)[2]
  rl.step_reward = "none"
  rl.step_reward_coef = 5.0
  np.testing.assert_array_equal(
      learner.token_advantages(rl, reward, traj, 5)[2], base
  )
  np.testing.assert_array_equal(
      learner.step_rewards_bk(rl, traj, reward, 5), 0.0
  )


def _kv_config(**rl):
  config = kv_chain.get_config("smoke")
  config.rl.credit = "per_turn"
  config.rl.step_reward = "valid_call"
  config.rl.step_reward_transform = "clip"
  config.rl.step_reward_coef = 0.5
  config.rl.step_reward_clip_eta = 1.0
  config.rl.step_reward_gate_threshold = 1.0
  for k, v in rl.items():
    config.rl[k] = v
  return config


def test_valid_step_reward_configs_pass():
  for t in step_rewards.STEP_REWARD_TRANSFORMS:
    validation.validate_config(_kv_config(step_reward_transform=t))


@pytest.mark.parametrize(
    "changes, match",
    [
        (
            {"step_reward": "learned"},
            r"config\.rl\.step_reward='learned': unknown",
        ),
        (
            {"step_reward": "prm"},
            r"config\.rl\.step_reward='prm': scores turns with a frozen "
            r"process reward model",
        ),
        (
            {"step_reward_clip_quantile": 1.5},
            r"config\.rl\.step_reward_clip_quantile=1\.5: must be in \[0, 1\]",
        ),
        (
            {
                "step_reward_transform": "delta",
                "step_reward_clip_quantile": 0.5,
            },
            r"config\.rl\.step_reward_clip_quantile=0\.5: sets the 'clip' "
            r"threshold",
        ),
        (
            {"step_reward_transform": "softmin"},
            r"config\.rl\.step_reward_transform='softmin': unknown",
        ),
        (
            {"step_reward_coef": 0.0},
            r"config\.rl\.step_reward_coef=0\.0: must be > 0",
        ),
        (
            {"step_reward_coef": float("nan")},
            r"config\.rl\.step_reward_coef=nan: must be a finite number",
        ),
        (
            {"step_reward_clip_eta": 1.5},
            r"config\.rl\.step_reward_clip_eta=1\.5: must be in \[0, 1\]",
        ),
        (
            {"credit": "trajectory"},
            r"config\.rl\.credit='trajectory': rl\.step_reward='valid_call' is delivered "
            r"per turn",
        ),
        (
            {"step_reward_transform": "delta", "discount": 0.9},
            r"config\.rl\.discount=0\.9: rl\.step_reward_transform='delta'",
        ),
        (
            {"step_reward_transform": "min", "discount": 0.9},
            r"config\.rl\.discount=0\.9: rl\.step_reward_transform='min'",
        ),
    ],
)
def test_bad_step_reward_configs_name_field_and_value(changes, match):
  with pytest.raises(ValueError, match=match):
    validation.validate_config(_kv_config(**changes))


def test_environment_without_the_fact_is_rejected():
  config = default.get_config("smoke")
  config.rl.credit = "per_turn"
  config.rl.step_reward = "valid_call"
  config.rl.step_reward_coef = 0.5
  with pytest.raises(
      ValueError,
      match=r"config\.rl\.step_reward='valid_call': needs "
      r"an environment fact 'valid_call_turn'",
  ):
    validation.validate_config(config)


def test_quantile_without_a_step_reward_is_refused():
  # Nothing would read it (found by a fresh-user test); 0 stays accepted.
  with pytest.raises(
      ValueError,
      match=r"config\.rl\.step_reward_clip_quantile=0\.5: "
      r"rl\.step_reward='none', so nothing reads this field",
  ):
    validation.validate_config(
        _kv_config(step_reward="none", step_reward_clip_quantile=0.5)
    )
  with pytest.raises(
      ValueError, match=r"step_reward_clip_quantile=1\.5: must be in"
  ):
    validation.validate_config(
        _kv_config(step_reward="none", step_reward_clip_quantile=1.5)
    )


def test_clip_with_zero_coefficient_off_is_accepted():
  # step_reward 'none' ignores the coefficient (old behaviour).
  validation.validate_config(
      _kv_config(step_reward="none", step_reward_coef=0.0)
  )


@pytest.mark.slow
def test_rl_step_with_step_rewards_runs_and_logs():
  """Two jitted GRPO iterations on kv_chain (smoke size) with the sum-form
  step reward: finite metrics, step-reward and hacking metrics logged."""
  from agentic_rl import train  # noqa: PLC0415

  config = _kv_config(step_reward_transform="sum")
  config.sft.steps = 0
  env = train.make_env(config)
  model_cfg = train.make_model_config(config)
  graphdef, state = train.init_state(config, model_cfg)
  state = train.start_rl(config, state)
  step = learner.make_rl_step(
      config, env, graphdef, learner.make_optimizer(config.rl), model_cfg
  )
  for _ in range(2):
    state, m = step(state)
  m = {k: float(v) for k, v in m.items()}
  assert all(np.isfinite(v) for v in m.values()), m
  assert {"step_reward", "step_reward_raw", "redundant_calls", "turns"} <= set(
      m
  )
  # Sum form: delivered = raw = 0.5 * valid calls per episode.
  assert m["step_reward"] == pytest.approx(m["step_reward_raw"], abs=1e-6)
  assert 1.0 <= m["turns"] <= env.max_turns


def test_masked_quantile_matches_numpy():
  rng = np.random.default_rng(0)
  for _ in range(20):
    x = rng.random((6, 5))
    m = rng.random((6, 5)) < 0.5
    m[0, 0] = True
    for q in (0.0, 0.1, 0.5, 0.9, 1.0):
      want = np.quantile(x[m], q)
      got = float(
          step_rewards.masked_quantile(jnp.asarray(x), jnp.asarray(m), q)
      )
      np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
  assert (
      float(
          step_rewards.masked_quantile(
              jnp.ones((2, 2)), jnp.zeros((2, 2), bool), 0.5
          )
      )
      == 0.0
  )


class _PrmTraj:
  """What step_rewards_bk reads: num_turns and the PRM's step scores."""

  def __init__(self, scores, num_turns):
    self.facts = {"rm_step_score": jnp.asarray(scores, jnp.float32)}
    self.num_turns = jnp.asarray(num_turns, jnp.int32)


def test_prm_step_scores_with_a_quantile_clip_by_hand():
  # Two episodes, K = 4; row 0 has 3 turns (the 3rd is its answer), row 1 two.
  # Scored = every turn that happened: 0.9, 0.4, 0.7 | 0.2, 0.8.
  # eta = median of {0.2, 0.4, 0.7, 0.8, 0.9} = 0.7; clip: c min(p - eta, 0)
  # with c = 0.5: row 0 -> 0, -0.15, 0, 0; row 1 -> -0.25, 0, 0, 0.
  traj = _PrmTraj([[0.9, 0.4, 0.7, 0.3], [0.2, 0.8, 0.6, 0.6]], [3, 2])
  rl = default.get_config().rl
  rl.update(
      step_reward="prm",
      step_reward_transform="clip",
      step_reward_coef=0.5,
      step_reward_clip_quantile=0.5,
  )
  got = learner.step_rewards_bk(rl, traj, jnp.zeros(2), 4)
  np.testing.assert_allclose(
      got, [[0.0, -0.15, 0.0, 0.0], [-0.25, 0.0, 0.0, 0.0]], atol=1e-6
  )
  # Fixed eta (quantile 0): eta = 1 -> c (p - 1) on every turn that happened.
  rl.step_reward_clip_quantile = 0.0
  got = learner.step_rewards_bk(rl, traj, jnp.zeros(2), 4)
  np.testing.assert_allclose(
      got, [[-0.05, -0.3, -0.15, 0.0], [-0.4, -0.1, 0.0, 0.0]], atol=1e-6
  )
  # Delta on continuous scores, answer turn scored: c (p_k - p_{k+1}), the
  # last keeps c p_last: row 0 -> 0.25, -0.15, 0.35.
  rl.step_reward_transform = "delta"
  got = learner.step_rewards_bk(rl, traj, jnp.zeros(2), 4)
  np.testing.assert_allclose(
      got, [[0.25, -0.15, 0.35, 0.0], [-0.3, 0.4, 0.0, 0.0]], atol=1e-6
  )
