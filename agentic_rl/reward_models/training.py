"""Reward-model training (rm mode): losses, preference-pair batches, the
jitted train step, and the evaluation math of a trained RM.
"""

from __future__ import annotations

from typing import Any, Callable

import chex
import flax.struct
import jax
import jax.numpy as jnp
import optax
from flax import nnx

from agentic_rl.reward_models.model import (
    KINDS,
    EpisodeBatch,
    boundary_logits,
    outcome_scores,
    prm_episode_score,
)

# ---------------------------------------------------------------------------
# Losses (hand-checked in tests/test_reward_models.py).
# ---------------------------------------------------------------------------


def bradley_terry_loss(
    r_chosen: jax.Array, r_rejected: jax.Array, margin: float | jax.Array = 0.0
) -> jax.Array:
  """Pairwise Bradley-Terry loss -log sigmoid(r_chosen - r_rejected - margin).

  Ouyang et al., arXiv:2203.02155, eq. 1 (margin: Touvron et al.,
  arXiv:2307.09288, eq. 2). A score difference of 0 gives log 2; (2, 0) gives
  log(1 + e^-2) = 0.1269; (0, 2) gives 2.1269.

  Args:
    r_chosen: float [...] scores of the preferred episodes.
    r_rejected: float [...] scores of the dispreferred episodes (same shape).
    margin: scalar or broadcastable float >= 0; the chosen score must exceed the
      rejected one by this much before the loss flattens.

  Returns:
    float32 [...] per-pair losses (no reduction).
  """
  chex.assert_equal_shape([r_chosen, r_rejected])
  d = jnp.asarray(r_chosen, jnp.float32) - jnp.asarray(r_rejected, jnp.float32)
  return -jax.nn.log_sigmoid(d - margin)


def regression_loss(score: jax.Array, target: jax.Array) -> jax.Array:
  """Squared error (score - target)^2, elementwise float32 (no reduction)."""
  chex.assert_equal_shape([score, target])
  return jnp.square(
      jnp.asarray(score, jnp.float32) - jnp.asarray(target, jnp.float32)
  )


def process_bce_loss(
    logits_bk: jax.Array, labels_bk: jax.Array, mask_bk: jax.Array
) -> jax.Array:
  """Mean binary cross-entropy over the valid turn boundaries.

  PRM training objective (Lightman et al., arXiv:2305.20050): each turn boundary
  k is a binary "this step is good" prediction sigmoid(s_k).

  Args:
    logits_bk: float [B, K] boundary logits s_k.
    labels_bk: float [B, K] labels in [0, 1].
    mask_bk: bool [B, K]; True on turns that happened.

  Returns:
    float32 scalar: sum of masked BCE / max(number of valid boundaries, 1).
  """
  chex.assert_equal_shape([logits_bk, labels_bk, mask_bk])
  bce = optax.sigmoid_binary_cross_entropy(
      jnp.asarray(logits_bk, jnp.float32), jnp.asarray(labels_bk, jnp.float32)
  )
  m = mask_bk.astype(jnp.float32)
  return jnp.sum(bce * m) / jnp.maximum(jnp.sum(m), 1.0)


# ---------------------------------------------------------------------------
# Batches and the train step.
# ---------------------------------------------------------------------------


@flax.struct.dataclass
class PairBatch:
  """B preference pairs: chosen and rejected EpisodeBatches, margin float32 [B]."""

  chosen: EpisodeBatch
  rejected: EpisodeBatch
  margin: jax.Array


def rm_loss(
    graphdef: nnx.GraphDef,
    params: dict[str, Any],
    batch: PairBatch,
    *,
    kind: str,
    bt_coef: float = 1.0,
    regression_coef: float = 0.0,
    aggregation: str = "log_prod",
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Reward-model loss on a batch of pairs.

  outcome: bt_coef * mean BT(r_c, r_r, margin) + regression_coef * mean over both
  sides of (r - score)^2.  process: mean BCE of the boundary logits of both sides
  against their per-turn labels.

  Returns:
    (loss float32 [], metrics: loss, pair_accuracy (fraction with score_c >
    score_r), score_gap (mean score_c - score_r)).
  """
  both = jax.tree.map(
      lambda c, r: jnp.concatenate([c, r], 0), batch.chosen, batch.rejected
  )
  n = batch.margin.shape[0]
  if kind == "outcome":
    r_2b = outcome_scores(graphdef, params, both.tokens, both.mask)
    r_c, r_r = r_2b[:n], r_2b[n:]
    loss = bt_coef * jnp.mean(bradley_terry_loss(r_c, r_r, batch.margin))
    if regression_coef:
      loss += regression_coef * jnp.mean(regression_loss(r_2b, both.score))
  elif kind == "process":
    s_2bk = boundary_logits(
        graphdef, params, both.tokens, both.mask, both.boundary
    )
    loss = process_bce_loss(s_2bk, both.turn_labels, both.turn_mask)
    r_2b = prm_episode_score(s_2bk, both.turn_mask, aggregation)
    r_c, r_r = r_2b[:n], r_2b[n:]
  else:
    raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
  metrics = {
      "loss": loss,
      "pair_accuracy": jnp.mean((r_c > r_r).astype(jnp.float32)),
      "score_gap": jnp.mean(r_c - r_r),
  }
  return loss, metrics


def make_train_step(
    graphdef: nnx.GraphDef,
    tx: optax.GradientTransformation,
    *,
    kind: str,
    bt_coef: float = 1.0,
    regression_coef: float = 0.0,
    aggregation: str = "log_prod",
) -> Callable[..., tuple[Any, Any, dict[str, jax.Array]]]:
  """Pure jitted `step(params, opt_state, batch) -> (params, opt_state, metrics)`.

  Args:
    graphdef: from `init_reward_model`.
    tx: optax optimizer.
    kind, bt_coef, regression_coef, aggregation: see `rm_loss`.

  Raises:
    ValueError: unknown kind.
  """
  if kind not in KINDS:
    raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")

  def step(params, opt_state, batch: PairBatch):
    (_, metrics), grads = jax.value_and_grad(
        lambda p: rm_loss(
            graphdef,
            p,
            batch,
            kind=kind,
            bt_coef=bt_coef,
            regression_coef=regression_coef,
            aggregation=aggregation,
        ),
        has_aux=True,
    )(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    metrics["grad_norm"] = optax.tree.norm(grads)
    return params, opt_state, metrics

  return jax.jit(step)


# ---------------------------------------------------------------------------
# Evaluation math.
# ---------------------------------------------------------------------------


def pairwise_accuracy(
    score_chosen_b: jax.Array, score_rejected_b: jax.Array, ties: float = 0.5
) -> jax.Array:
  """Fraction of pairs ranked correctly (score_c > score_r); a tie counts `ties`.

  Args:
    score_chosen_b, score_rejected_b: float [B].

  Returns:
    float32 [].
  """
  c, r = jnp.asarray(score_chosen_b), jnp.asarray(score_rejected_b)
  win = jnp.where(c > r, 1.0, jnp.where(c == r, ties, 0.0))
  return jnp.mean(win).astype(jnp.float32)


def best_of_n(
    score_tn: jax.Array, correct_tn: jax.Array
) -> dict[str, jax.Array]:
  """Best-of-N selection on T tasks with N sampled episodes each.

  Args:
    score_tn: float [T, N] reward-model scores.
    correct_tn: bool [T, N] verified correctness.

  Returns:
    dict of float32 []: 'rank1_accuracy' (the top-scored episode is correct; ties
    broken by the first index), 'random_accuracy' (mean correctness, the expected
    accuracy of a uniformly random pick), 'oracle_accuracy' (any episode correct,
    pass@N), 'rank1_regret' (oracle - rank1).
  """
  chex.assert_equal_shape([score_tn, correct_tn])
  c = jnp.asarray(correct_tn, jnp.float32)
  pick_t = jnp.argmax(score_tn, axis=1)
  rank1 = jnp.mean(jnp.take_along_axis(c, pick_t[:, None], axis=1))
  oracle = jnp.mean(jnp.max(c, axis=1))
  return {
      "rank1_accuracy": rank1,
      "random_accuracy": jnp.mean(c),
      "oracle_accuracy": oracle,
      "rank1_regret": oracle - rank1,
  }
