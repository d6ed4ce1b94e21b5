"""Next-observation prediction: the policy's own teacher-forced prediction
of the tool observations, as a PBRS potential or as an auxiliary
cross-entropy target (with a shuffled-label placebo).
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from flax import nnx

from agentic_rl import types

# ---------------------------------------------------------------------------
# Next-observation prediction (docs/papers.md "dark room"): the policy's own
# teacher-forced prediction of the tool observations, as a PBRS potential or
# as an auxiliary cross-entropy target (with a shuffled-label placebo).
# ---------------------------------------------------------------------------


def observation_prediction_scores(
    graphdef: nnx.GraphDef,
    params,
    tokens_bl: jax.Array,
    temperature: float | jax.Array = 1.0,
) -> tuple[jax.Array, jax.Array]:
  """Per-token next-token prediction scores of a batch under the policy.

  Teacher forced: position t is predicted from tokens[:, :t] (the policy's
  LM head on the hidden state of position t - 1, at `temperature`), exactly
  the distribution `sampling.token_logprobs` scores. Used on TOOL positions
  (the environment's observation tokens, which the policy never samples), it
  measures how well the policy predicts what the tool will return (docs/papers.md,
  the "dark room" study, next-observation prediction; no arXiv id there). One
  trunk pass; the
  full [B, L, V] logits are formed at once (fine for byte vocabularies; a
  large-vocabulary model would want the chunked path of `sampling`).

  Args:
    graphdef, params: the policy.
    tokens_bl: [B, L] int32 trajectories.
    temperature: > 0, the policy's sampling temperature.

  Returns:
    (prob_bl [B, L] float32, p(tokens[:, t] | tokens[:, :t]) in [0, 1];
     hit_bl [B, L] bool, True where that token is the arg-max prediction).
    Position 0 (nothing to predict from) gets prob 0 and hit False.
    Gradient-free (stop_gradient): a reward or a metric, not a loss.
  """
  model = nnx.merge(graphdef, params)
  hidden_bld, _ = model.hidden_states(tokens_bl[:, :-1])
  logits_blv = model.logits(hidden_bld) / jnp.asarray(temperature, jnp.float32)
  logp_blv = jax.nn.log_softmax(logits_blv, axis=-1)
  target_bl = tokens_bl[:, 1:]
  logp_bl = jnp.take_along_axis(logp_blv, target_bl[..., None], axis=-1)[..., 0]
  hit_bl = jnp.argmax(logits_blv, axis=-1) == target_bl
  pad_f = jnp.zeros((tokens_bl.shape[0], 1), jnp.float32)
  prob = jnp.concatenate([pad_f, jnp.exp(logp_bl)], axis=1)
  hit = jnp.concatenate([jnp.zeros_like(pad_f, bool), hit_bl], axis=1)
  return jax.lax.stop_gradient(prob), hit


def observation_prediction_potential(
    score_bl: jax.Array,
    role_bl: jax.Array,
    turn_bl: jax.Array,
    num_turns: int,
) -> jax.Array:
  """[B, K + 1] potential Phi(s_k) = mean prediction score of s_k's observations.

  Phi(s_k) = mean of score_bl over the TOOL tokens of the context s_k (the
  prompt plus turns 0 .. k-1 and their observations; an observation carries
  its turn's index, as in `state_ends`), and 0 when s_k holds no
  observation (so Phi(s_0) = 0). With score = the policy's probability of
  each observation token (`observation_prediction_scores`), Phi is bounded in
  [0, 1] and `pbrs_shaping` turns it into the potential-based
  next-observation-prediction reward of docs/papers.md ("dark room"):
  with discount 1 and trajectory returns the shaped return is
  R + Phi(s_n) for an episode cut off at the horizon (MAX_TURNS / TRUNCATED
  keep their last potential) and R for a terminated one (Phi(terminal) = 0).

  Args:
    score_bl: [B, L] float per-token scores (e.g. probabilities in [0, 1]).
    role_bl: [B, L] int8 roles (types.TOOL marks observation tokens).
    turn_bl: [B, L] int32 turn index per token.
    num_turns: K (static).

  Returns:
    [B, K + 1] float32 potentials.
  """
  chex.assert_rank([score_bl, role_bl, turn_bl], 2)
  chex.assert_equal_shape([score_bl, role_bl, turn_bl])
  obs_bl = role_bl == types.TOOL
  k_k1 = jnp.arange(num_turns + 1)
  inside = obs_bl[:, None, :] & (turn_bl[:, None, :] < k_k1[None, :, None])
  total = jnp.sum(
      jnp.where(inside, jnp.asarray(score_bl, jnp.float32)[:, None, :], 0.0),
      axis=-1,
  )
  count = jnp.sum(inside, axis=-1)
  return jnp.where(count > 0, total / jnp.maximum(count, 1), 0.0).astype(
      jnp.float32
  )


def shuffle_observation_targets(
    tokens_bl: jax.Array,
    obs_mask_bl: jax.Array,
    key: jax.Array,
) -> jax.Array:
  """Placebo labels: observation tokens permuted at random across the batch.

  The shuffled-gold placebo of docs/papers.md: the auxiliary
  next-observation loss is trained on targets that keep the marginal
  distribution of observation tokens but lose their relation to the context.
  The N = sum(obs_mask) observation tokens of the whole batch (all rows) are
  permuted uniformly at random (`key`); position i-th observation slot (in
  row-major order) receives the token of the i-th slot of the random order.
  Tokens outside the mask are returned unchanged, so the inputs of the
  policy (and its POLICY-token targets) are untouched. Static shapes
  (jittable): two argsorts over B * L.

  Args:
    tokens_bl: [B, L] int32 tokens.
    obs_mask_bl: [B, L] bool, True on observation (TOOL) tokens.
    key: PRNG key.

  Returns:
    [B, L] int32 targets: a permutation of tokens_bl's masked entries placed
    at the masked positions, tokens_bl elsewhere.
  """
  chex.assert_equal_shape([tokens_bl, obs_mask_bl])
  flat = tokens_bl.reshape(-1)
  mask = obs_mask_bl.reshape(-1).astype(bool)
  u = jax.random.uniform(key, flat.shape)
  # Masked slots first, in random order (sources) / in row-major order (dest).
  src = jnp.argsort(jnp.where(mask, u, 2.0))
  dst = jnp.argsort(jnp.where(mask, 0, 1), stable=True)
  n = jnp.sum(mask.astype(jnp.int32))
  moved = jnp.where(jnp.arange(flat.shape[0]) < n, flat[src], flat[dst])
  return (
      flat.at[dst].set(moved).reshape(tokens_bl.shape).astype(tokens_bl.dtype)
  )


def observation_prediction_loss(
    logp_bl: jax.Array,
    obs_mask_bl: jax.Array,
    denominator: jax.Array | float | None = None,
) -> jax.Array:
  """Auxiliary next-observation cross-entropy -sum(mask * logp) / denominator.

  docs/papers.md ("auxiliary-loss channel instead of reward"): the same
  prediction target as the dense reward, trained as a self-supervised CE on
  the policy's LM head at observation (TOOL) positions instead of entering
  the returns. `logp_bl` are the teacher-forced log-probs of the targets
  (the observation tokens, or `shuffle_observation_targets` for the
  placebo).

  Args:
    logp_bl: [B, L] float32 log-probs of the targets.
    obs_mask_bl: [B, L] bool observation positions.
    denominator: token count to divide by (e.g. over the whole optimizer
      batch, so micro-batch losses sum to the batch loss); None = this
      batch's mask count (at least 1).

  Returns:
    float32 scalar, nats per observation token.
  """
  m = jnp.asarray(obs_mask_bl).astype(jnp.float32)
  if denominator is None:
    denominator = jnp.maximum(jnp.sum(m), 1.0)
  return -jnp.sum(jnp.asarray(logp_bl, jnp.float32) * m) / denominator
