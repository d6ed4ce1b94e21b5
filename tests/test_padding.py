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
