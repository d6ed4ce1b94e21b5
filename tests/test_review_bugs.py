"""Review findings, each with a test that failed before its fix: an empty
observation on a continuing turn, stop ids of the policy's own vocabulary,
replay injection under GiGPO, and dual-path behaviour log-probs under
`rl.behaviour_logprobs='trainer'`."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from agentic_rl import rollout
from agentic_rl import sampling
from agentic_text import tokenizers
from agentic_rl import tree_rollout
from agentic_rl import types
from agentic_rl.models import transformer
from tests import fakes


@dataclasses.dataclass(frozen=True)
class SilentEnv(fakes.EchoEnv):
  """EchoEnv whose observations are all empty (obs_len 0) while the episode
  continues: consecutive turns follow each other directly."""

  def step(self, state, action_tokens, action_len):
    state, obs, _, done = super().step(state, action_tokens, action_len)
    return state, jnp.full_like(obs, tokenizers.PAD), jnp.int32(0), done


# Compiled once per module: jit's caches are keyed on this function object.
_token_logprobs = jax.jit(sampling.token_logprobs, static_argnums=0)


def _policy_mismatch(traj, graphdef, params):
  """max |sampler log-prob - teacher-forced log-prob| over POLICY tokens (the
  trainer's forward, compiled as the trainer runs it, not op by op)."""
  logp, _ = _token_logprobs(graphdef, params, traj.tokens, 1.0)
  pol = np.asarray(traj.role) == types.POLICY
  return np.max(np.abs(np.asarray(traj.logprob) - np.asarray(logp))[pol])


def test_empty_observation_keeps_the_logits_after_the_last_sampled_token():
  # The first token of turns 1 and 2 follows the previous turn's last token
  # directly (nothing in between); its behaviour log-prob must be the
  # teacher-forced one, not that of the logits after a phantom PAD.
  graphdef, params, cfg = fakes.tiny_policy(0)
  env = SilentEnv(max_action_len=3)
  traj = jax.jit(
      lambda p, k: rollout.rollout(
          env,
          jnp.array([2, 3, 4, 5]),
          k,
          max_len=24,
          graphdef=graphdef,
          params=p,
          model_config=cfg,
      )
  )(params, jax.random.PRNGKey(0))
  assert np.all(np.asarray(traj.num_turns) == 3)
  assert not np.any(np.asarray(traj.role) == types.TOOL)
  assert _policy_mismatch(traj, graphdef, params) < 1e-4


def test_tree_rollout_empty_observation_keeps_the_last_logits():
  graphdef, params, cfg = fakes.tiny_policy(1)
  env = SilentEnv(max_action_len=3)
  traj = jax.jit(
      lambda p, k: tree_rollout.tree_rollout(
          env,
          jnp.array([2, 4]),
          k,
          max_len=24,
          branching=(2,),
          graphdef=graphdef,
          params=p,
          model_config=cfg,
      )
  )(params, jax.random.PRNGKey(1))
  assert np.all(np.asarray(traj.num_turns) == 3)
  assert _policy_mismatch(traj, graphdef, params) < 1e-4


# ---------------------------------------------------------------------------
# Stop ids.

V = 300  # not the byte tokenizer's 265: ids 258/260/264 are ordinary tokens
STOP = 7
LIKELY = (STOP, tokenizers.EOS, tokenizers.CALL_END, tokenizers.ANSWER_END, 65)


@dataclasses.dataclass(frozen=True)
class OwnStopEnv(fakes.EchoEnv):
  """EchoEnv in a format whose only turn-ending id is 7."""

  stop_tokens: tuple[int, ...] = (STOP,)


def _rigged_policy():
  """(graphdef, params, cfg), vocab 300: blocks add 0 to the residual, every
  embedding row is the same vector, so each next-token distribution is the
  same: logit 10 on the five LIKELY ids, 0 elsewhere (each LIKELY id ~0.2)."""
  cfg = dataclasses.replace(fakes.TINY, vocab_size=V)
  graphdef, params = nnx.split(transformer.Transformer(cfg, nnx.Rngs(params=0)))
  st = nnx.to_pure_dict(params)
  st["embed_vd"] = jnp.ones_like(st["embed_vd"])
  for blk in st["blocks"].values():
    blk["attn"]["o_hkd"] = jnp.zeros_like(blk["attn"]["o_hkd"])
    blk["ffn"]["down_fd"] = jnp.zeros_like(blk["ffn"]["down_fd"])
  # The final hidden state is RMSNorm(ones) = ones: logit_v = sum_d W[d, v].
  w = np.zeros(st["lm_head_dv"].shape, np.float32)
  w[:, list(LIKELY)] = 10.0 / cfg.d_model
  st["lm_head_dv"] = jnp.asarray(w)
  nnx.replace_by_pure_dict(params, st)
  return graphdef, params, cfg


def _turns(traj):
  """Each POLICY segment of each row, as a list of token ids."""
  out = []
  for tok, role in zip(np.asarray(traj.tokens), np.asarray(traj.role)):
    seg = []
    for t, r in zip(tok, role):
      if r == types.POLICY:
        seg.append(int(t))
      elif seg:
        out.append(seg)
        seg = []
    if seg:
      out.append(seg)
  return out


def test_stop_ids_come_from_the_environment_format():
  assert rollout.env_stop_tokens(fakes.EchoEnv()) == tokenizers.STOP_TOKENS
  assert rollout.env_stop_tokens(OwnStopEnv()) == (STOP,)
  graphdef, params, cfg = _rigged_policy()
  # One compiled extension and softmax (op by op it was hundreds of small
  # compiles).
  p = np.asarray(
      jax.jit(
          lambda params: jax.nn.softmax(
              sampling.extend(
                  graphdef,
                  params,
                  transformer.init_cache(cfg, 1, 4),
                  jnp.zeros((1, 2), jnp.int32),
                  jnp.zeros(1, jnp.int32),
                  jnp.full((1,), 2, jnp.int32),
              )[0][0]
          )
      )(params)
  )
  np.testing.assert_allclose(
      p[list(LIKELY)], 1 / (5 + (V - 5) * np.exp(-10)), rtol=1e-4
  )
  env = OwnStopEnv(max_action_len=8)
  traj = jax.jit(
      lambda k: rollout.rollout(
          env,
          jnp.array([2, 3, 4, 5, 2, 3]),
          k,
          max_len=64,
          graphdef=graphdef,
          params=params,
          model_config=cfg,
      )
  )(jax.random.PRNGKey(0))
  turns = _turns(traj)
  assert len(turns) == 18  # 6 episodes x 3 turns, none cut by the buffer
  for seg in turns:
    # A turn ends at its first 7, or at max_action_len without one.
    assert STOP not in seg[:-1]
    assert seg[-1] == STOP or len(seg) == env.max_action_len
  inner = [t for seg in turns for t in seg[:-1]]
  # The byte tokenizer's stop ids were sampled inside turns, not as ends.
  assert set(inner) & set(tokenizers.STOP_TOKENS)


def test_byte_stop_ids_are_refused_for_another_vocabulary():
  graphdef, params, cfg = _rigged_policy()
  with pytest.raises(ValueError, match="vocab_size=300"):
    rollout.rollout(
        fakes.EchoEnv(),
        jnp.array([2]),
        jax.random.PRNGKey(0),
        max_len=16,
        graphdef=graphdef,
        params=params,
        model_config=cfg,
    )
  with pytest.raises(ValueError, match="vocab_size=300"):
    tree_rollout.tree_rollout(
        fakes.EchoEnv(),
        jnp.array([2]),
        jax.random.PRNGKey(0),
        max_len=16,
        branching=(2,),
        graphdef=graphdef,
        params=params,
        model_config=cfg,
    )
  with pytest.raises(ValueError, match="outside the model's vocabulary"):
    rollout.check_stop_tokens((7, 400), OwnStopEnv(), cfg)


# ---------------------------------------------------------------------------
# Replay injection under GiGPO.

P_, Q_, T_, D_ = types.PROMPT, types.POLICY, types.TOOL, types.PAD


def test_replay_injection_keeps_the_buffered_turns_under_gigpo():
  from agentic_rl import learner, replay  # pylint: disable=g-import-not-at-top
  from configs import default  # pylint: disable=g-import-not-at-top
  # Buffered success of task (5, 6): turn 0 = (20, 21), observation 30,
  # turn 1 (the answer) = (40, 41); reward 1.
  s_tok = jnp.array([[5, 6, 20, 21, 30, 40, 41, 0, 0, 0]], jnp.int32)
  s_role = jnp.array([[P_, P_, Q_, Q_, T_, Q_, Q_, D_, D_, D_]], jnp.int8)
  s_turn = jnp.array([[-1, -1, 0, 0, 0, 1, 1, -1, -1, -1]], jnp.int32)
  # A failed group of 2 for the same task: one-turn episodes, reward 0.
  tok = jnp.array(
      [[5, 6, 22, 23, 0, 0, 0, 0, 0, 0], [5, 6, 24, 0, 0, 0, 0, 0, 0, 0]],
      jnp.int32,
  )
  role = jnp.array(
      [[P_, P_, Q_, Q_] + [D_] * 6, [P_, P_, Q_] + [D_] * 7], jnp.int8
  )
  turn = jnp.where(role == Q_, 0, -1).astype(jnp.int32)
  traj = fakes.trajectory(tokens=tok, role=role, turn=turn, length=[4, 3])

  # The buffer, the injection and the advantages as one compiled program (op
  # by op it was dozens of small compiles).
  @jax.jit
  def run(traj):
    buf = replay.insert(
        replay.init(2, 10),
        replay.task_keys(s_tok, s_role),
        s_tok,
        s_role,
        jnp.full((1, 10), -0.5),
        jnp.array([1.0]),
        jnp.array([True]),
        jnp.int32(0),
        s_turn,
    )
    train, reward, injected = learner.inject_replay(
        buf, traj, jnp.zeros(2), group_size=2, success_threshold=1.0
    )
    _, _, adv = learner.token_advantages(rl, reward, train, max_turns=2)
    return train, reward, injected, adv

  rl = default.get_config("smoke").rl
  rl.advantage_estimator = "gigpo"
  train, reward, injected, adv = run(traj)
  np.testing.assert_array_equal(injected, [False, True])
  np.testing.assert_array_equal(train.turn[1], s_turn[0])
  np.testing.assert_array_equal(train.num_turns, [1, 2])
  np.testing.assert_array_equal(reward, [0.0, 1.0])
  # Hand values (eps 1e-6 ignored): episode GRPO of rewards [0, 1] -> [-1, 1];
  # turn 0 steps share the prompt state, returns [0, 1] -> step adv [-1, 1];
  # the injected turn 1 is a step group of one -> 0. Row 0's turn 0:
  # -1 - 1 = -2; row 1's turn 0: 1 + 1 = 2, its answer turn 1: 1 + 0 = 1.
  want = np.zeros((2, 10))
  want[0, 2:4] = -2.0
  want[1, 2:4] = 2.0
  want[1, 5:7] = 1.0
  np.testing.assert_allclose(adv, want, atol=1e-4)


# ---------------------------------------------------------------------------
# Dual-path tool-free rows under rl.behaviour_logprobs='trainer'.


def test_masked_behaviour_logprobs_hand_values():
  from agentic_rl import learner  # pylint: disable=g-import-not-at-top
  from configs import default  # pylint: disable=g-import-not-at-top

  graphdef, params, _ = fakes.tiny_policy(0)
  config = default.get_config("smoke")  # 2 minibatch blocks of 1 row

  # One compiled program (op by op it was hundreds of small compiles).
  @jax.jit
  def run(params):
    tokens = jax.random.randint(jax.random.PRNGKey(5), (2, 7), 0, 256)
    logp, _ = sampling.token_logprobs(graphdef, params, tokens, 1.0)
    got, shift = learner.masked_behaviour_logprobs(
        config,
        graphdef,
        params,
        tokens,
        logp,
        jnp.array([True, False]),
        (tokenizers.CALL,),
    )
    logits, _ = sampling.apply_model(graphdef, params, tokens)
    return tokens, got, shift, logits

  tokens, got, shift, logits = run(params)
  z = np.asarray(logits, np.float64)[:, :-1]
  lp = z - z.max(-1, keepdims=True)
  lp = lp - np.log(np.exp(lp).sum(-1, keepdims=True))
  tok = np.asarray(tokens)[:, 1:]
  p_call = np.exp(lp[..., tokenizers.CALL])
  want = np.take_along_axis(lp, tok[..., None], -1)[..., 0]
  want[0] -= np.log1p(-p_call[0])  # row 0 sampled with CALL masked
  np.testing.assert_allclose(np.asarray(got)[:, 1:], want, atol=2e-5)
  np.testing.assert_allclose(
      np.asarray(shift)[0, 1:], -np.log1p(-p_call[0]), rtol=1e-3
  )
  assert np.all(np.asarray(shift)[1] == 0.0) and float(shift[0, 0]) == 0.0
  assert np.min(np.asarray(shift)[0, 1:]) > 1e-4  # a visible gap to remove


def test_first_step_ratio_of_masked_rows_is_one_minus_banned_mass():
  from agentic_rl import learner, losses  # pylint: disable=g-import-not-at-top
  from configs import default  # pylint: disable=g-import-not-at-top

  graphdef, params, _ = fakes.tiny_policy(2)
  rl = default.get_config("smoke").rl

  # One compiled program (op by op it was hundreds of small compiles).
  @jax.jit
  def run(params):
    tokens = jax.random.randint(jax.random.PRNGKey(6), (2, 6), 0, 256)
    mask = jnp.arange(6)[None, :] >= 2
    mask = jnp.broadcast_to(mask, (2, 6))
    logp, _ = sampling.token_logprobs(graphdef, params, tokens, 1.0)
    shift = jnp.where(jnp.array([[True], [False]]) & mask, 0.05, 0.0)
    batch = learner.LearnerBatch(
        tokens=tokens,
        mask=mask,
        behaviour_logp=jnp.where(mask, logp + shift, 0.0),
        ref_logp=jnp.where(mask, logp, 0.0),
        advantage=jnp.where(mask, 1.0, 0.0),
        behaviour_shift=shift,
    )
    den = losses.aggregation_denominator(mask, rl.loss_agg_mode)
    _, m = learner._rl_loss(
        graphdef,
        params,
        batch,
        rl,
        kl_coef=0.0,
        denominator=den,
        first_step=jnp.bool_(True),
    )
    return m

  m = run(params)
  # Masked rows: ratio = exp(-0.05); others exactly 1; no behaviour gap.
  np.testing.assert_allclose(m["ratio_dev_max"], 1 - np.exp(-0.05), rtol=1e-5)
  assert float(m["behaviour_gap_max"]) < 1e-6


@pytest.mark.slow
def test_dual_path_trainer_behaviour_matches_the_sampler():
  """One collect of the smoke config with 2 tool-free rows per group of 4:
  the trainer's behaviour log-probs of tool-free rows equal the sampler's
  masked ones (mismatch ~1e-6, not the -log(1 - P(<call>)) gap)."""
  from agentic_rl import learner, train  # pylint: disable=g-import-not-at-top
  from configs import default  # pylint: disable=g-import-not-at-top

  config = default.get_config("smoke")
  config.rl.dual_path_tool_free = 2
  config.rl.rewards = {"correct": 1.0, "dual_path_efficiency": 1.0}
  train.validation.validate_config(config)
  env = train.make_env(config)
  model_cfg = train.make_model_config(config)
  graphdef, state = train.init_state(config, model_cfg)
  state = train.start_rl(config, state)
  collect = jax.jit(learner.make_collect_fn(config, env, graphdef, model_cfg))
  batch, rollout = collect(state)
  traj, info = rollout.traj, rollout.info
  free = np.asarray(traj.facts["tool_free"])[:, None] & (
      np.asarray(traj.role) == types.POLICY
  )
  assert free.sum() > 0
  beh = np.asarray(batch.behaviour_logp)
  np.testing.assert_allclose(
      beh[free], np.asarray(traj.logprob)[free], atol=1e-4
  )
  assert float(info["logp_mismatch_max"]) < 1e-4
  unmasked, _ = sampling.token_logprobs(
      graphdef, state.params, traj.tokens, config.rl.temperature
  )
  gap = beh[free] - np.asarray(unmasked)[free]
  assert np.all(gap > 0)  # -log(1 - P(<call>)) > 0 on every masked token
  np.testing.assert_allclose(
      np.asarray(batch.behaviour_shift)[free], gap, atol=1e-5
  )
