"""Length buckets, trimming and packing measures (agentic_rl/padding.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from agentic_rl import padding
from agentic_rl import sampling
from agentic_text import tokenizers
from agentic_rl import types
from agentic_rl.learner.batch import LearnerBatch, SilSample
from agentic_rl.models import transformer


def test_bucket_length_rounds_the_longest_episode_up():
  assert (
      padding.bucket_length(np.array([3, 17, 9]), bucket=16, max_len=64) == 32
  )
  assert padding.bucket_length(jnp.array([16, 2]), bucket=16, max_len=64) == 16
  assert padding.bucket_length(np.array([0, 0]), bucket=16, max_len=64) == 16
  assert padding.bucket_length(np.array([64]), bucket=16, max_len=64) == 64
  # Capped at the buffer: 35 -> 48 > max_len 40.
  assert padding.bucket_length(np.array([35]), bucket=16, max_len=40) == 40
  with pytest.raises(ValueError, match="bucket=0"):
    padding.bucket_length(np.array([3]), bucket=0, max_len=64)
  with pytest.raises(ValueError, match="length=65: exceeds max_len=64"):
    padding.bucket_length(np.array([65]), bucket=16, max_len=64)


def test_host_trim_length_keeps_the_buffer_where_trimming_changes_the_update():
  from configs import default  # noqa: PLC0415

  config = default.get_config(None)
  lengths = np.array([20, 37, 25])
  assert config.trim_bucket == 16
  assert padding.host_trim_length(config, lengths) == 48
  for field, value in (
      ("trim_bucket", 0),
      ("rl.replay_capacity", 8),
      ("rl.loss_agg_mode", "seq-mean-token-sum-norm"),
  ):
    c = default.get_config(None)
    parent, _, leaf = field.rpartition(".")
    setattr(c.rl if parent else c, leaf, value)
    assert padding.host_trim_length(c, lengths) == 64, field
  c = default.get_config(None)
  c.rl.loss_agg_mode = "seq-mean-token-sum-norm"
  c.rl.loss_norm_constant = 64  # explicit: the trimmed loss is unchanged
  assert padding.host_trim_length(c, lengths) == 48


def _traj(b=3, l=12, k=2):
  r = np.random.default_rng(0)
  return types.Trajectory(
      tokens=jnp.asarray(r.integers(0, 50, (b, l)), jnp.int32),
      role=jnp.asarray(r.integers(0, 4, (b, l)), jnp.int8),
      logprob=jnp.asarray(r.normal(size=(b, l)), jnp.float32),
      turn=jnp.asarray(r.integers(-1, k, (b, l)), jnp.int32),
      length=jnp.array([5, 9, 7], jnp.int32),
      num_turns=jnp.ones((b,), jnp.int32),
      finish=jnp.zeros((b,), jnp.int32),
      group=jnp.arange(b, dtype=jnp.int32),
      facts={
          "correct": jnp.ones((b,), bool),
          "calls_bk": jnp.zeros((b, k), jnp.int32),
      },
  )


def test_trim_cuts_token_axes_only():
  traj = _traj()
  cut = padding.trim(traj, 12, 8)
  for name in ("tokens", "role", "logprob", "turn"):
    np.testing.assert_array_equal(
        getattr(cut, name), getattr(traj, name)[:, :8]
    )
  assert cut.facts["calls_bk"].shape == (3, 2)
  np.testing.assert_array_equal(cut.length, traj.length)
  assert padding.trim(traj, 12, 12) is traj
  with pytest.raises(
      ValueError, match=r"new_len=13: must be in \[1, full_len=12\]"
  ):
    padding.trim(traj, 12, 13)


def test_trimmed_batch_gives_the_same_logprobs_and_token_mean_loss():
  # Right-padded rows of 5, 9 and 7 real tokens in a 24-token buffer: the
  # log-probs (and hence any masked per-token loss) of a buffer cut at the
  # bucket (16) equal the full buffer's first 16 columns; every trained
  # token survives the cut.
  cfg = transformer.TransformerConfig(
      vocab_size=50,
      d_model=32,
      num_layers=2,
      num_heads=2,
      head_dim=16,
      ffn_dim=32,
  )
  graphdef, params = nnx.split(transformer.Transformer(cfg, nnx.Rngs(params=0)))
  length = np.array([5, 9, 7])
  tokens = np.random.default_rng(1).integers(0, 50, (3, 24))
  tokens[np.arange(24)[None] >= length[:, None]] = tokenizers.PAD % 50
  mask = (np.arange(24)[None] >= 2) & (np.arange(24)[None] < length[:, None])
  new_len = padding.bucket_length(length, bucket=8, max_len=24)
  assert new_len == 16
  batch = {"tokens": jnp.asarray(tokens, jnp.int32), "mask": jnp.asarray(mask)}
  cut = padding.trim(batch, 24, new_len)
  logp = jax.jit(sampling.token_logprobs, static_argnums=0)
  full, _ = logp(graphdef, params, batch["tokens"], 1.0)
  short, _ = logp(graphdef, params, cut["tokens"], 1.0)
  np.testing.assert_allclose(short, full[:, :16], rtol=0, atol=1e-5)
  assert int(cut["mask"].sum()) == int(mask.sum())
  loss = lambda lp, m: jnp.sum(lp * m) / jnp.sum(m)
  np.testing.assert_allclose(
      loss(short, cut["mask"]), loss(full, batch["mask"]), rtol=1e-6
  )


def test_first_fit_rows_by_hand():
  # 6 -> row 0 (4 left), 5 -> row 1 (5 left), 4 -> row 0 (0), 3 -> row 1 (2),
  # 2 -> row 1 (0): two rows.
  assert padding.first_fit_rows(np.array([2, 6, 3, 5, 4]), 10) == 2
  assert padding.first_fit_rows(np.array([7, 7, 7]), 10) == 3
  assert padding.first_fit_rows(np.array([], np.int32), 10) == 0
  with pytest.raises(ValueError, match="length=11: exceeds row_len=10"):
    padding.first_fit_rows(np.array([11]), 10)


def test_share_metrics_by_hand():
  mask = jnp.array([[0, 1, 1, 0], [0, 0, 1, 0]], bool)
  m = padding.metrics(mask, jnp.array([3, 4]))
  np.testing.assert_allclose(m["trained_token_share"], 3 / 8)
  np.testing.assert_allclose(m["real_token_share"], 7 / 8)


# -- Length-bucketed update inside the one-jit step -----------------------------


def test_update_lengths_by_hand():
  assert padding.update_lengths(64, 1) == (64,)
  assert padding.update_lengths(64, 4) == (16, 32, 48, 64)
  # 224 / 3 = 74.7 -> 80; 149.3 -> 160; 224.
  assert padding.update_lengths(224, 3) == (80, 160, 224)
  # Rounded-up duplicates are dropped; a cap below the multiple ends at L.
  assert padding.update_lengths(40, 4, multiple=16) == (16, 32, 40)
  assert padding.update_lengths(10, 4, multiple=16) == (10,)
  with pytest.raises(ValueError, match="buckets=0"):
    padding.update_lengths(64, 0)


def test_loss_length_and_trim_batch():
  mask = np.zeros((3, 10), bool)
  mask[0, 2:4] = True
  mask[2, 6] = True
  zeros = jnp.zeros((3, 10))
  batch = LearnerBatch(
      tokens=jnp.arange(30).reshape(3, 10),
      mask=jnp.asarray(mask),
      behaviour_logp=zeros,
      ref_logp=zeros,
      advantage=zeros,
      reward_hat=jnp.ones(3),
      prompt_embedding=jnp.ones((3, 10)),  # [B, D] with D == L: kept
      sil=SilSample(
          tokens=jnp.ones((2, 10), jnp.int32),
          mask=jnp.ones((2, 10), bool),
          returns=jnp.ones(2),
          baseline=jnp.zeros(2),
          valid=jnp.ones(2, bool),
      ),
  )
  assert int(padding.loss_length(batch)) == 7
  obs = np.zeros((3, 10), bool)
  obs[1, 8] = True  # an observation the auxiliary loss reads
  with_obs = batch.replace(obs_mask=jnp.asarray(obs))
  assert int(padding.loss_length(with_obs)) == 9
  cut = padding.trim_batch(batch, 7)
  assert cut.tokens.shape == (3, 7) and cut.mask.shape == (3, 7)
  assert cut.advantage.shape == (3, 7) and cut.obs_mask is None
  assert cut.prompt_embedding.shape == (3, 10)
  assert cut.sil.tokens.shape == (2, 10)


def _bucket_step(buckets, **rl):
  from configs import default  # noqa: PLC0415
  from tests import fakes  # noqa: PLC0415

  config = default.get_config("smoke")
  # One block: the bucket choice, the compiled conditionals and their
  # [*, L_i] shapes do not depend on the depth, and every branch of the
  # step's three conditionals unrolls every block.
  config.model.num_layers = 1
  config.rl.update_length_buckets = buckets
  config.rl.update(rl)
  state, step = fakes.rl_state_and_step(config)
  return config, state, step


@pytest.fixture(scope="module")
def bucket_step():
  """(config, state, step, compiled HLO text) of the 4-bucket one-jit step,
  built and compiled once for the tests that read its program or run it.
  The step donates its state: a test that runs it passes a copy."""
  config, state, step = _bucket_step(4)
  hlo = step.lower(state).compile().as_text()
  return config, state, step, hlo


@pytest.mark.parametrize(
    "rl",
    [
        {},
        dict(ppo_epochs=2, num_minibatches=2, num_microbatches=2),
        dict(obs_prediction_coef=0.5),
    ],
    ids=["one_step", "epochs_minibatches_micro", "obs_prediction"],
)
def test_bucketed_update_matches_the_whole_buffer(rl):
  # A batch whose trained positions end at 21 of L = 64: the update on the
  # 32-token bucket equals the update on the whole buffer (plain SGD, so
  # that float-order noise is not amplified the way Adam amplifies it on
  # near-zero gradients). Two buckets (32, 64): the one chosen and the whole
  # buffer, each compiled into the program (the choice among more lengths,
  # a too short one included: test_bucketed_forward_by_hand, same
  # bucket_index, and the 4-bucket step below). A one-layer policy: the
  # equality does not depend on the depth, and each bucket's update unrolls
  # every block in its forward and backward.
  import optax  # noqa: PLC0415

  from agentic_rl import train  # noqa: PLC0415
  from agentic_rl.learner import update as update_lib  # noqa: PLC0415
  from configs import default  # noqa: PLC0415
  from configs import schema  # noqa: PLC0415

  config = schema.with_defaults(default.get_config("smoke"))
  config.model.num_layers = 1
  config.rl.update(rl)
  graphdef, state = train.init_state(config, train.make_model_config(config))
  rng = np.random.default_rng(0)
  b, length = config.rl.batch_size, config.max_len
  mask = np.zeros((b, length), bool)
  for r in range(b):
    end = 8 + (r * 5) % 14  # last trained position <= 21
    mask[r, 3:end] = rng.random(end - 3) < 0.7
  mask[0, 20] = True
  tokens = jnp.asarray(rng.integers(3, 250, (b, length)), jnp.int32)
  # Behaviour and reference log-probs near the policy's own (ratios ~ 1).
  own, _ = jax.jit(sampling.token_logprobs, static_argnums=0)(
      graphdef, state.params, tokens, 1.0
  )
  noise = lambda: jnp.asarray(rng.normal(0, 0.05, (b, length)), jnp.float32)
  batch = LearnerBatch(
      tokens=tokens,
      mask=jnp.asarray(mask),
      behaviour_logp=own + noise(),
      ref_logp=own + noise(),
      advantage=jnp.asarray(rng.normal(size=(b, length)), jnp.float32),
  )
  if rl.get("obs_prediction_coef"):
    obs = np.zeros((b, length), bool)
    obs[1, 22:26] = True  # observations after the last trained token
    batch = batch.replace(obs_mask=jnp.asarray(obs))
  tx = optax.sgd(0.5)
  update = update_lib.make_update_fn(config, graphdef, tx)
  lengths = padding.update_lengths(length, 2, 16)
  assert lengths == (32, 64)
  bucketed = padding.bucketed_update(update, lengths)
  opt = tx.init(state.params)
  p_b, _, m_b = jax.jit(bucketed)(state.params, opt, batch, 0.05)
  p_1, _, m_1 = jax.jit(update)(state.params, opt, batch, 0.05)
  assert float(m_b["update_length"]) == 32.0
  for k in ("loss", "kl", "entropy", "ratio_mean", "grad_norm"):
    np.testing.assert_allclose(
        float(m_b[k]), float(m_1[k]), rtol=1e-5, atol=1e-7, err_msg=k
    )
  moved = max(
      float(jnp.abs(a - c).max())
      for a, c in zip(jax.tree.leaves(p_1), jax.tree.leaves(state.params))
  )
  assert moved > 1e-3
  for a, c in zip(jax.tree.leaves(p_b), jax.tree.leaves(p_1)):
    np.testing.assert_allclose(
        np.asarray(a), np.asarray(c), atol=1e-5 * moved / 1e-3
    )
  # A trained position in the last bucket selects the whole buffer.
  batch = batch.replace(mask=batch.mask.at[2, 60].set(True))
  _, _, m_full = jax.jit(bucketed)(state.params, opt, batch, 0.05)
  assert float(m_full["update_length"]) == 64.0


def test_rl_step_with_buckets_trains_on_a_shorter_buffer(bucket_step):
  # The one-jit step: same collect (same state and key), so the same reward;
  # the update ran on a bucket shorter than max_len.
  config, state, step, _ = bucket_step
  _, state1, step1 = _bucket_step(1)
  s_b, m_b = step(jax.tree.map(jnp.copy, state))
  s_1, m_1 = step1(state1)
  lengths = padding.update_lengths(config.max_len, 4, config.trim_bucket)
  used = float(m_b["update_length"])
  assert used in lengths and used < config.max_len, (used, lengths)
  assert "update_length" not in m_1
  assert float(m_b["reward"]) == float(m_1["reward"])
  np.testing.assert_allclose(float(m_b["loss"]), float(m_1["loss"]), atol=1e-6)


def test_bucketed_forward_by_hand():
  # A causal "forward" (running sum over columns): on the bucket it equals the
  # whole-buffer result in every computed column, and the rest is 0.
  tokens = jnp.arange(2 * 8, dtype=jnp.int32).reshape(2, 8)
  fwd = lambda t: (jnp.cumsum(t, axis=1).astype(jnp.float32), None)
  lengths = padding.update_lengths(8, 4, 2)  # (2, 4, 6, 8)
  assert lengths == (2, 4, 6, 8)
  full = np.cumsum(np.asarray(tokens), axis=1)
  for need, n in ((1, 2), (3, 4), (4, 4), (5, 6), (8, 8)):
    out, none = jax.jit(
        lambda t, k: padding.bucketed_forward(fwd, lengths, t, k)
    )(tokens, jnp.int32(need))
    assert none is None and out.shape == (2, 8)
    np.testing.assert_array_equal(np.asarray(out)[:, :n], full[:, :n])
    np.testing.assert_array_equal(np.asarray(out)[:, n:], 0.0)
  with pytest.raises(ValueError, match="must end at the token length 8"):
    padding.bucketed_forward(fwd, (2, 4), tokens, 3)


def test_collect_runs_reference_and_behaviour_forwards_on_the_bucket():
  # make_collect_fn with the update's lengths: reference and trainer-side
  # behaviour log-probs equal the whole-buffer ones at every trained
  # position, are 0 from the bucket on (where the whole-buffer reference is
  # not), and the sampler/trainer mismatch metric stays at float noise when
  # truncated rows that rl.overlong_mode='mask' drops run past the bucket.
  from agentic_rl import learner  # noqa: PLC0415
  from agentic_rl import train  # noqa: PLC0415
  from configs import default  # noqa: PLC0415
  from configs import schema  # noqa: PLC0415

  config = schema.with_defaults(default.get_config("smoke"))
  # One block: the bucketed forwards equal the whole-buffer ones at any
  # depth (three programs each unroll every block).
  config.model.num_layers = 1
  config.rl.overlong_mode = "mask"
  train.validation.validate_config(config)
  env = train.make_env(config)
  mc = train.make_model_config(config)
  graphdef, state = train.init_state(config, mc)
  state = train.start_rl(config, state)
  _, rollout = jax.jit(learner.make_collect_fn(config, env, graphdef, mc))(
      state
  )
  traj = rollout.traj
  pm = np.asarray(traj.role) == types.POLICY
  end = np.where(pm.any(1), pm.shape[1] - np.argmax(pm[:, ::-1], 1), 0)
  assert (end > 32).any() and (end <= 32).any(), end
  # Rows whose policy tokens reach past 32: truncated, so the loss drops them.
  finish = np.asarray(traj.finish).copy()
  finish[end > 32] = types.TRUNCATED
  traj = traj.replace(finish=jnp.asarray(finish, traj.finish.dtype))
  lengths = padding.update_lengths(config.max_len, 4, config.trim_bucket)
  out = {}
  for name, lens in (("whole", None), ("bucketed", lengths)):
    collect = learner.make_collect_fn(
        config, env, graphdef, mc, update_lengths=lens
    )
    batch, rollout = jax.jit(collect)(state, traj)
    out[name] = (jax.tree.map(np.asarray, batch), rollout.info)
  (whole, _), (bucketed, info) = out["whole"], out["bucketed"]
  mask = whole.mask
  need = int(padding.loss_length_of(jnp.asarray(mask)))
  n = min(x for x in lengths if x >= need)
  assert n < config.max_len and not mask[:, need:].any()
  for k in ("ref_logp", "behaviour_logp"):
    np.testing.assert_allclose(
        getattr(bucketed, k)[mask],
        getattr(whole, k)[mask],
        atol=2e-5,
        err_msg=k,
    )
    assert not getattr(bucketed, k)[:, n:].any(), k
  assert np.abs(whole.ref_logp[:, n:]).max() > 0.1
  # Fresh rows only: float noise between the sampler and the trainer.
  assert float(info["logp_mismatch_max"]) < 1e-4


def test_rl_step_compiles_reference_and_behaviour_forwards_per_bucket(
    bucket_step,
):
  # The compiled step holds three K-way conditionals (reference, behaviour,
  # update) whose forward branches read [blocks, rows, L_i] token arrays.
  config, _, _, hlo = bucket_step
  assert config.rl.behaviour_logprobs == "trainer"
  conditionals = [line for line in hlo.splitlines() if " conditional(" in line]
  assert len(conditionals) == 3, conditionals
  lengths = padding.update_lengths(config.max_len, 4, config.trim_bucket)
  n_blocks = config.rl.num_minibatches * config.rl.num_microbatches
  rows = config.rl.batch_size // n_blocks
  for n in lengths[:-1]:
    assert f"s32[{n_blocks},{rows},{n}]" in hlo, n


def test_bucketed_update_compiles_one_branch_per_length(bucket_step):
  # The compiled step holds a K-way conditional whose branches train on
  # [*, L_i] token arrays: cost follows the bucket, not the buffer.
  config, _, _, hlo = bucket_step
  lengths = padding.update_lengths(config.max_len, 4, config.trim_bucket)
  assert len(lengths) == 4
  assert "conditional" in hlo
  # Each branch's per-row token array appears (e.g. s32[32,16] for micro-
  # batches of 32 rows at length 16).
  rows = config.rl.batch_size // config.rl.num_minibatches
  for n in lengths[:-1]:
    assert f"s32[{rows},{n}]" in hlo, n


@pytest.mark.parametrize(
    "changes, match",
    [
        (
            {"rl.loss_agg_mode": "seq-mean-token-sum-norm"},
            r"^config\.rl\.update_length_buckets=4: rl\.loss_agg_mode="
            r"'seq-mean-token-sum-norm' with rl\.loss_norm_constant=0",
        ),
        (
            {"trim_bucket": 0},
            r"^config\.rl\.update_length_buckets=4: the bucket lengths are "
            r"multiples of config\.trim_bucket, which is 0",
        ),
    ],
)
def test_inapplicable_length_buckets_are_refused(changes, match):
  # Rather than silently off (found by a fresh-user test).
  from agentic_rl import validation  # noqa: PLC0415
  from configs import default  # noqa: PLC0415

  config = default.get_config("smoke")
  config.rl.update_length_buckets = 4
  validation.validate_config(config)  # valid as is
  for k, v in changes.items():
    section, _, field = k.rpartition(".")
    (config[section] if section else config)[field] = v
  with pytest.raises(validation.ConfigError, match=match):
    validation.validate_config(config)
  # With a constant normaliser the bucketed update is exact again.
  if "rl.loss_agg_mode" in changes:
    config.rl.loss_norm_constant = 64
    validation.validate_config(config)
