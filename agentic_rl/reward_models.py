"""Reward models for tool-using agents: outcome (Bradley-Terry / regression) and
process (per-turn) reward models on the policy's transformer trunk.

Model: the decoder of agentic_rl/models/transformer.py with its scalar reward head
`reward_head_d` (TransformerConfig.reward_head=True), optionally preceded by one
extra hidden layer of our own (`head_layers=2`: r = w . gelu(W h + c)). Sequences
are read whatever their padding side: positions count real tokens only and
padding keys are masked (as in `Transformer.reward`).

  outcome RM (ORM):  one score per episode, read at its last real token.
  process RM (PRM):  one logit per turn boundary (the last token of turn k: its
                     action and, for a tool call, the observation), trained with a
                     binary cross-entropy on per-turn labels; an episode's score is
                     sum_k log sigmoid(s_k) (the product of step-correctness
                     probabilities, Lightman et al., "Let's Verify Step by Step",
                     arXiv:2305.20050) or min_k sigmoid(s_k).

Losses (per pair / per episode; means are taken by the caller):

  Bradley-Terry:  -log sigmoid(r_chosen - r_rejected - m)   (Ouyang et al.,
                  InstructGPT, arXiv:2203.02155, eq. 1; margin m as in Touvron et
                  al., Llama 2, arXiv:2307.09288, eq. 2)
  regression:     (r - y)^2
  process BCE:    -[y log sigmoid(s) + (1 - y) log(1 - sigmoid(s))]

Robust variants: an ensemble of members (mean or min of their scores; Coste et al.,
"Reward Model Ensembles Help Mitigate Overoptimization", arXiv:2310.02743) and WARM
weight averaging of fine-tunes from one initialisation (Rame et al.,
arXiv:2401.12187). Use inside RL: `trajectory_rm_outputs` scores a batch of
episodes in one pass (episode logit for the `rm` reward component of
rewards/components.py, and per-state potentials for PBRS); `monitor_metrics` /
`overoptimization_gap` are the gold-verifier monitor (Gao et al., "Scaling Laws
for Reward Model Overoptimization", arXiv:2210.10760); `rm_score_to_reward`
bounds a score offline.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import chex
import flax.struct
import jax
import jax.numpy as jnp
import optax
from flax import nnx

from agentic_rl.rewards import transforms
from agentic_rl.models import transformer

KINDS = ("outcome", "process")
PRM_AGGREGATIONS = ("log_prod", "min")
ENSEMBLE_REDUCTIONS = ("mean", "min")
# The bounded score transforms (one table: transforms.SCORE_TRANSFORMS).
BOUNDED_TRANSFORMS = transforms.RM_TRANSFORMS


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


def prm_episode_score(
    logits_bk: jax.Array, mask_bk: jax.Array, aggregation: str = "log_prod"
) -> jax.Array:
  """Episode score from per-turn PRM logits.

  'log_prod': sum_k log sigmoid(s_k) over valid turns (log of the product of
  step-correctness probabilities, Lightman et al., arXiv:2305.20050);
  'min': min_k sigmoid(s_k) over valid turns (1 if none).

  Args:
    logits_bk: float [B, K].
    mask_bk: bool [B, K].
    aggregation: 'log_prod' or 'min'.

  Returns:
    float32 [B].

  Raises:
    ValueError: unknown aggregation.
  """
  x = jnp.asarray(logits_bk, jnp.float32)
  if aggregation == "log_prod":
    return jnp.sum(jnp.where(mask_bk, jax.nn.log_sigmoid(x), 0.0), axis=-1)
  if aggregation == "min":
    return jnp.min(jnp.where(mask_bk, jax.nn.sigmoid(x), 1.0), axis=-1)
  raise ValueError(
      f"aggregation must be one of {PRM_AGGREGATIONS}, got {aggregation!r}"
  )


# ---------------------------------------------------------------------------
# Turn boundaries.
# ---------------------------------------------------------------------------


def turn_boundaries(
    turn_bl: jax.Array, num_turns_k: int
) -> tuple[jax.Array, jax.Array]:
  """Position of the last token of each turn (its action and its observation).

  Args:
    turn_bl: int32 [B, L] turn index of each token (-1 on prompt and padding),
      as in types.Trajectory.turn.
    num_turns_k: static K, the number of boundary slots.

  Returns:
    boundary_bk: int32 [B, K] position of the last token with turn == k (0 when
      turn k has no tokens).
    mask_bk: bool [B, K]; turn k has at least one token.
  """
  l = turn_bl.shape[1]
  pos_l = jnp.arange(l, dtype=jnp.int32)
  hit_bkl = (
      turn_bl[:, None, :]
      == jnp.arange(num_turns_k, dtype=jnp.int32)[None, :, None]
  )
  idx_bk = jnp.max(jnp.where(hit_bkl, pos_l, -1), axis=-1)
  return jnp.maximum(idx_bk, 0).astype(jnp.int32), idx_bk >= 0


# ---------------------------------------------------------------------------
# Model.
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RewardModelConfig:
  """Reward model shape.

  Attributes:
    trunk: TransformerConfig of the trunk (reward_head is forced on).
    head_layers: 1 (linear head reward_head_d on the final hidden state) or 2
      (r = reward_head_d . gelu(head_hidden_dd h + head_bias_d)).
  """

  trunk: transformer.TransformerConfig
  head_layers: int = 1

  def __post_init__(self):
    if self.head_layers not in (1, 2):
      raise ValueError(f"head_layers must be 1 or 2, got {self.head_layers}")


def init_reward_model(
    cfg: RewardModelConfig, key: jax.Array, trunk_params: Any = None
) -> tuple[nnx.GraphDef, dict[str, Any]]:
  """Fresh reward-model parameters.

  Args:
    cfg: RewardModelConfig.
    key: PRNG key.
    trunk_params: optional nnx.State of a policy of the same shape without a
      reward head (e.g. the SFT policy, as InstructGPT initialises its RM from the
      SFT model, arXiv:2203.02155); its weights are copied into the trunk.

  Returns:
    graphdef: the trunk's nnx.GraphDef (static).
    params: {'trunk': nnx.State, 'head': {} or {'hidden_dd' [D, D], 'bias_d' [D]}};
      reward_head_d starts at 0, so every initial score is 0.
  """
  tcfg = dataclasses.replace(cfg.trunk, reward_head=True)
  k_trunk, k_head = jax.random.split(key)
  model = transformer.Transformer(tcfg, nnx.Rngs(params=k_trunk))
  graphdef, trunk = nnx.split(model)
  if trunk_params is not None:
    trunk = copy_trunk(trunk, trunk_params)
  head = {}
  if cfg.head_layers == 2:
    d = tcfg.d_model
    head = {
        "hidden_dd": jax.random.normal(k_head, (d, d), jnp.float32)
        / jnp.sqrt(d),
        "bias_d": jnp.zeros((d,), jnp.float32),
    }
  return graphdef, {"trunk": trunk, "head": head}


def copy_trunk(trunk: Any, src: Any) -> Any:
  """`trunk` with every parameter that `src` also has (same pytree path) replaced
  by src's value, e.g. a policy's weights copied into a reward-model trunk."""
  src_flat = {
      path: v for path, v in jax.tree_util.tree_flatten_with_path(src)[0]
  }

  def pick(path, v):
    return src_flat.get(path, v)

  return jax.tree_util.tree_map_with_path(pick, trunk)


def hidden_states(
    graphdef: nnx.GraphDef,
    params: dict[str, Any],
    tokens_bl: jax.Array,
    mask_bl: jax.Array,
) -> jax.Array:
  """Head inputs: [B, L, D] float32 (after the optional hidden layer).

  Positions count real tokens (cumsum(mask) - 1) and padding keys are masked, so
  the result at a real token does not depend on the padding side.

  Args:
    graphdef, params: from `init_reward_model`.
    tokens_bl: int32 [B, L].
    mask_bl: bool [B, L]; True on real tokens.
  """
  model = nnx.merge(graphdef, params["trunk"])
  mask_bl = mask_bl.astype(bool)
  positions_bl = jnp.maximum(jnp.cumsum(mask_bl, axis=1) - 1, 0).astype(
      jnp.int32
  )
  h_bld, _ = model.hidden_states(tokens_bl, positions_bl, mask_bt=mask_bl)
  h_bld = h_bld.astype(jnp.float32)
  head = params["head"]
  if head:
    h_bld = jax.nn.gelu(h_bld @ head["hidden_dd"] + head["bias_d"])
  return h_bld


def _head_vector(graphdef, params) -> jax.Array:
  model = nnx.merge(graphdef, params["trunk"])
  return model.reward_head_d[...].astype(jnp.float32)


def outcome_scores(
    graphdef: nnx.GraphDef,
    params: dict[str, Any],
    tokens_bl: jax.Array,
    mask_bl: jax.Array,
) -> jax.Array:
  """ORM score of each sequence, read at its last real token.

  Equal to `Transformer.reward` when head_layers == 1.

  Args:
    tokens_bl: int32 [B, L]; mask_bl: bool [B, L] (>= 1 real token per row).

  Returns:
    float32 [B].
  """
  h_bld = hidden_states(graphdef, params, tokens_bl, mask_bl)
  last_b = transformer.last_token_index(mask_bl.astype(bool))
  h_bd = jnp.take_along_axis(h_bld, last_b[:, None, None], axis=1)[:, 0]
  return h_bd @ _head_vector(graphdef, params)


def boundary_logits(
    graphdef: nnx.GraphDef,
    params: dict[str, Any],
    tokens_bl: jax.Array,
    mask_bl: jax.Array,
    boundary_bk: jax.Array,
) -> jax.Array:
  """PRM logits s_k read at each turn boundary.

  Args:
    tokens_bl: int32 [B, L]; mask_bl: bool [B, L].
    boundary_bk: int32 [B, K] positions (from `turn_boundaries`).

  Returns:
    float32 [B, K] (meaningless where the boundary mask is False).
  """
  h_bld = hidden_states(graphdef, params, tokens_bl, mask_bl)
  h_bkd = jnp.take_along_axis(h_bld, boundary_bk[:, :, None], axis=1)
  return h_bkd @ _head_vector(graphdef, params)


# ---------------------------------------------------------------------------
# Batches and the train step.
# ---------------------------------------------------------------------------


@flax.struct.dataclass
class EpisodeBatch:
  """B tokenised episodes for a reward model.

  Attributes:
    tokens: int32 [B, L]; mask: bool [B, L] (True on real tokens).
    boundary: int32 [B, K] turn-boundary positions; turn_mask: bool [B, K].
    turn_labels: float32 [B, K] per-turn labels (PRM targets).
    score: float32 [B] outcome target (e.g. 1 = correct; regression target).
  """

  tokens: jax.Array
  mask: jax.Array
  boundary: jax.Array
  turn_mask: jax.Array
  turn_labels: jax.Array
  score: jax.Array


@flax.struct.dataclass
class PairBatch:
  """B preference pairs: chosen and rejected EpisodeBatches, margin float32 [B]."""

  chosen: EpisodeBatch
  rejected: EpisodeBatch
  margin: jax.Array


def episode_scores(
    graphdef: nnx.GraphDef,
    params: dict[str, Any],
    episodes: EpisodeBatch,
    kind: str,
    aggregation: str = "log_prod",
) -> jax.Array:
  """float32 [B] episode scores: ORM score ('outcome') or aggregated PRM
  ('process', see `prm_episode_score`).

  Raises:
    ValueError: unknown kind.
  """
  if kind == "outcome":
    return outcome_scores(graphdef, params, episodes.tokens, episodes.mask)
  if kind == "process":
    s_bk = boundary_logits(
        graphdef, params, episodes.tokens, episodes.mask, episodes.boundary
    )
    return prm_episode_score(s_bk, episodes.turn_mask, aggregation)
  raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")


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


def make_score_fn(
    graphdef: nnx.GraphDef, kind: str, aggregation: str = "log_prod"
):
  """Jitted `score(params, episodes: EpisodeBatch) -> float32 [B]`."""
  if kind not in KINDS:
    raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
  return jax.jit(lambda p, e: episode_scores(graphdef, p, e, kind, aggregation))


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


# ---------------------------------------------------------------------------
# Robust variants and use inside RL.
# ---------------------------------------------------------------------------


def ensemble_reduce(scores_mb: jax.Array, reduction: str = "mean") -> jax.Array:
  """Combines the scores of M ensemble members: mean or min over axis 0.

  Coste et al., arXiv:2310.02743 (mean and worst-case optimisation).

  Args:
    scores_mb: float [M, B].
    reduction: 'mean' or 'min'.

  Returns:
    float32 [B].

  Raises:
    ValueError: unknown reduction.
  """
  s = jnp.asarray(scores_mb, jnp.float32)
  if reduction == "mean":
    return jnp.mean(s, axis=0)
  if reduction == "min":
    return jnp.min(s, axis=0)
  raise ValueError(
      f"reduction must be one of {ENSEMBLE_REDUCTIONS}, got {reduction!r}"
  )


def ensemble_scores(
    score_fn: Callable[[Any, Any], jax.Array],
    params_list: Sequence[Any],
    episodes: Any,
    reduction: str = "mean",
) -> jax.Array:
  """Scores `episodes` with every member (same structure) and reduces: float32 [B]."""
  stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *params_list)
  scores_mb = jax.vmap(score_fn, in_axes=(0, None))(stacked, episodes)
  return ensemble_reduce(scores_mb, reduction)


def average_params(
    params_list: Sequence[Any], weights: Sequence[float] | None = None
) -> Any:
  """WARM: weighted average of the parameters of M fine-tunes of one init.

  Rame et al., "WARM: On the Benefits of Weight Averaged Reward Models",
  arXiv:2401.12187: theta = sum_i w_i theta_i with sum_i w_i = 1.

  Args:
    params_list: M >= 1 pytrees of identical structure and shapes.
    weights: M non-negative floats (normalised to sum 1); uniform if None.

  Returns:
    pytree like params_list[0] (float32 leaves averaged in float32).

  Raises:
    ValueError: empty list, wrong number of weights, or weights not summing > 0.
  """
  m = len(params_list)
  if m == 0:
    raise ValueError("average_params: params_list is empty")
  w = [1.0] * m if weights is None else [float(x) for x in weights]
  if len(w) != m or min(w) < 0 or sum(w) <= 0:
    raise ValueError(
        f"average_params: weights={weights!r} must be {m} non-negative "
        "numbers with a positive sum"
    )
  total = sum(w)
  w = [x / total for x in w]
  return jax.tree.map(
      lambda *xs: sum(
          wi * x.astype(jnp.float32) for wi, x in zip(w, xs)
      ).astype(xs[0].dtype),
      *params_list,
  )


def rm_score_to_reward(
    score_b: jax.Array,
    transform: str = "sigmoid",
    ref: float = 0.0,
    temperature: float = 1.0,
    eta: float = 0.0,
) -> jax.Array:
  """A learned-RM score as a bounded reward component.

  One table of transforms for every learned score: `transforms.SCORE_TRANSFORMS`
  through `transforms.bounded_score` ('sigmoid': sigma((r - ref) / T) in (0, 1),
  PAR; 'tanh': tanh((r - ref) / T) in (-1, 1); 'clip': min(r - eta, 0);
  'none': r).

  Args:
    score_b: float [B] RM scores.
    transform: a key of `transforms.SCORE_TRANSFORMS`.
    ref, temperature: centre and scale (> 0).
    eta: threshold of 'clip'.

  Returns:
    float32 [B].

  Raises:
    ValueError: unknown transform.
  """
  return transforms.bounded_score(
      transform, score_b, ref=ref, temperature=temperature, eta=eta
  )


def overoptimization_gap(
    rm_reward_b: jax.Array, verified_b: jax.Array
) -> dict[str, jax.Array]:
  """Gold-verifier monitor: how far the RM reward has drifted from the verified one.

  Gao et al., arXiv:2210.10760: under optimisation pressure the proxy (RM) reward
  keeps rising while the gold (here: the verifier's) reward stalls or falls; log
  both and their gap during RL.

  Args:
    rm_reward_b: float [B] bounded RM rewards (e.g. from `rm_score_to_reward`).
    verified_b: float [B] verified rewards (e.g. 1.0 correct / 0.0).

  Returns:
    dict of float32 []: 'rm_reward', 'verified_reward' (batch means), 'gap'
    (their difference), 'false_positive_rate' (fraction of unverified episodes,
    verified <= 0.5, with rm_reward > 0.5).
  """
  r = jnp.asarray(rm_reward_b, jnp.float32)
  v = jnp.asarray(verified_b, jnp.float32)
  wrong = v <= 0.5
  fp = jnp.sum(wrong & (r > 0.5)) / jnp.maximum(jnp.sum(wrong), 1)
  return {
      "rm_reward": jnp.mean(r),
      "verified_reward": jnp.mean(v),
      "gap": jnp.mean(r) - jnp.mean(v),
      "false_positive_rate": fp.astype(jnp.float32),
  }


def correlation(x_b: jax.Array, y_b: jax.Array) -> jax.Array:
  """Pearson correlation of two [B] arrays, float32 []; 0 when either is constant.

  corr = sum (x - mean x)(y - mean y) / sqrt(sum (x - mean x)^2 sum (y - mean y)^2).
  """
  x = jnp.asarray(x_b, jnp.float32)
  y = jnp.asarray(y_b, jnp.float32)
  dx, dy = x - jnp.mean(x), y - jnp.mean(y)
  den = jnp.sqrt(jnp.sum(dx * dx) * jnp.sum(dy * dy))
  return jnp.where(
      den > 0, jnp.sum(dx * dy) / jnp.where(den > 0, den, 1.0), 0.0
  )


def monitor_metrics(
    rm_reward_b: jax.Array, verified_b: jax.Array
) -> dict[str, jax.Array]:
  """The RL loop's gold-verifier over-optimisation monitor (logged every iteration).

  Gao et al., arXiv:2210.10760: the proxy (RM) reward can keep rising while the
  gold (verified) reward stalls or falls; a falling correlation between the two
  on the policy's own samples is the early sign.

  Args:
    rm_reward_b: float [B] RM rewards (the `rm` reward component's values).
    verified_b: float [B] verified rewards (1.0 correct / 0.0 from the env).

  Returns:
    dict of float32 []: 'rm_reward', 'verified_reward', 'rm_gap' (rm_reward -
    verified_reward), 'rm_verified_corr' (Pearson, 0 if either is constant),
    'rm_false_positive_rate' (see `overoptimization_gap`).
  """
  g = overoptimization_gap(rm_reward_b, verified_b)
  return {
      "rm_reward": g["rm_reward"],
      "verified_reward": g["verified_reward"],
      "rm_gap": g["gap"],
      "rm_verified_corr": correlation(rm_reward_b, verified_b),
      "rm_false_positive_rate": g["false_positive_rate"],
  }


def _logit_from_log_prob(logp_b: jax.Array) -> jax.Array:
  """logit(p) = log p - log(1 - p) from log p <= 0 (clamped to +-30)."""
  lp = jnp.minimum(jnp.asarray(logp_b, jnp.float32), -1e-7)
  return jnp.clip(lp - jnp.log(-jnp.expm1(lp)), -30.0, 30.0)


@dataclasses.dataclass(frozen=True)
class FrozenRewardModel:
  """Static description of a frozen RM used inside RL (its params live in
  types.TrainState.reward_model).

  Attributes:
    graphdef: the RM trunk's nnx.GraphDef (from `init_reward_model`).
    kind: 'outcome' or 'process'.
    aggregation: PRM episode aggregation ('log_prod' or 'min').
  """

  graphdef: nnx.GraphDef
  kind: str = "outcome"
  aggregation: str = "log_prod"

  def __post_init__(self):
    if self.kind not in KINDS:
      raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
    if self.aggregation not in PRM_AGGREGATIONS:
      raise ValueError(
          f"aggregation must be one of {PRM_AGGREGATIONS}, got "
          f"{self.aggregation!r}"
      )


def trajectory_rm_outputs(
    rm: FrozenRewardModel,
    params: dict[str, Any],
    tokens_bl: jax.Array,
    role_bl: jax.Array,
    turn_bl: jax.Array,
    num_turns_k: int,
) -> dict[str, jax.Array]:
  """Episode score and PBRS potentials of a batch of episodes, one RM pass.

  One forward pass of the trunk over the [B, L] episodes; the head is read at
  the last real token (episode score), at each turn boundary (PRM logits s_k)
  and at the end of each state s_k = prompt + turns 0..k-1 with their
  observations (credit.state_ends; s_0 = the prompt). The trunk is causal, so
  the read at the end of s_k equals the score of the prefix s_k on its own.

  score_b (a logit): ORM: its score r at the last real token. PRM: logit(P)
  with P = prod_k sigmoid(s_k) ('log_prod', Lightman et al., arXiv:2305.20050)
  or min_k sigmoid(s_k) ('min'), over the turns that happened; so
  sigmoid(score_b) = P, a probability that every step was good.

  potential_bk1 (in [0, 1]; Phi(s_0) .. Phi(s_K)): ORM on prefixes:
  Phi(s_k) = sigmoid(r(s_k)). PRM: Phi(s_k) = prod_{j<k} sigmoid(s_j) ('log_prod')
  or min_{j<k} sigmoid(s_j) ('min'), Phi(s_0) = 1. A success-probability
  potential as in PiCA (credit.success_probability_potential); entries past the
  episode's last turn repeat the last state (PBRS never reads them).

  Args:
    rm: FrozenRewardModel (static).
    params: RM params {'trunk', 'head'} (no gradient flows to them).
    tokens_bl: int32 [B, L]; role_bl: int8 [B, L] (types.PAD = 0 is padding);
      turn_bl: int32 [B, L] turn index (-1 on prompt and padding), as in
      types.Trajectory.
    num_turns_k: static K (the environment's max_turns).

  Returns:
    {'score': float32 [B], 'potential': float32 [B, K + 1]}; a PRM adds
    'step_score': float32 [B, K], sigmoid(s_k) on the turns that happened (the
    answer turn included) and 0 elsewhere: the continuous per-step scores of
    `rl.step_reward='prm'`.
  """
  params = jax.lax.stop_gradient(params)
  mask_bl = role_bl != 0  # types.PAD
  h_bld = hidden_states(rm.graphdef, params, tokens_bl, mask_bl)
  w_d = _head_vector(rm.graphdef, params)
  k = num_turns_k
  boundary_bk, turn_mask_bk = turn_boundaries(turn_bl, k)
  k_k1 = jnp.arange(k + 1)
  ends_bk1 = jnp.sum(
      mask_bl[:, None, :] & (turn_bl[:, None, :] < k_k1[None, :, None]), axis=-1
  )
  state_pos_bk1 = jnp.maximum(ends_bk1 - 1, 0).astype(jnp.int32)
  last_b = transformer.last_token_index(mask_bl)
  pos_bn = jnp.concatenate(
      [last_b[:, None], boundary_bk, state_pos_bk1], axis=1
  )
  read_bn = jnp.take_along_axis(h_bld, pos_bn[:, :, None], axis=1) @ w_d
  last_b, s_bk, state_bk1 = (
      read_bn[:, 0],
      read_bn[:, 1 : k + 1],
      read_bn[:, k + 1 :],
  )
  if rm.kind == "outcome":
    return {"score": last_b, "potential": jax.nn.sigmoid(state_bk1)}
  logsig_bk = jnp.where(turn_mask_bk, jax.nn.log_sigmoid(s_bk), 0.0)
  step_bk = jnp.where(turn_mask_bk, jax.nn.sigmoid(s_bk), 0.0)
  b = s_bk.shape[0]
  if rm.aggregation == "log_prod":
    score_b = _logit_from_log_prob(jnp.sum(logsig_bk, axis=1))
    cum_bk1 = jnp.concatenate(
        [jnp.zeros((b, 1)), jnp.cumsum(logsig_bk, axis=1)], 1
    )
    return {
        "score": score_b,
        "potential": jnp.exp(cum_bk1),
        "step_score": step_bk,
    }
  p_bk = jnp.where(turn_mask_bk, jax.nn.sigmoid(s_bk), 1.0)
  p_min_b = jnp.min(p_bk, axis=1)
  score_b = jnp.clip(
      jnp.log(p_min_b) - jnp.log1p(-jnp.minimum(p_min_b, 1 - 1e-7)), -30.0, 30.0
  )
  cum_bk1 = jnp.concatenate([jnp.ones((b, 1)), jax.lax.cummin(p_bk, axis=1)], 1)
  return {"score": score_b, "potential": cum_bk1, "step_score": step_bk}


def make_rm_reward_fn(
    graphdef: nnx.GraphDef,
    params: dict[str, Any],
    *,
    kind: str = "outcome",
    num_turns_k: int,
    transform: str = "sigmoid",
    ref: float = 0.0,
    temperature: float = 1.0,
    aggregation: str = "log_prod",
) -> Callable[[Any], tuple[jax.Array, dict[str, jax.Array]]]:
  """A frozen RM as an RL reward component with the over-optimisation monitor.

  The returned pure function maps a types.Trajectory (tokens [B, L], role [B, L],
  turn [B, L], facts with 'correct' [B]) to (reward float32 [B] =
  `rm_score_to_reward` of the episode score, monitor dict from
  `overoptimization_gap` against the verified 'correct' fact). Jittable;
  `params` are closed over (no gradient flows to them). For offline scoring:
  the RL loop does not use this closure (under jit it would embed the params
  as constants in the program); it passes the params in
  TrainState.reward_model to `trajectory_rm_outputs` and reads the score through
  the `rm` reward component (rewards.components.rm_reward).

  Raises:
    ValueError: unknown kind or transform.
  """
  if kind not in KINDS:
    raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
  if transform not in BOUNDED_TRANSFORMS:
    raise ValueError(
        f"transform must be one of {BOUNDED_TRANSFORMS}, got {transform!r}"
    )

  def reward_fn(traj):
    mask_bl = traj.role != 0  # types.PAD
    boundary_bk, turn_mask_bk = turn_boundaries(traj.turn, num_turns_k)
    b = traj.tokens.shape[0]
    episodes = EpisodeBatch(
        tokens=traj.tokens,
        mask=mask_bl,
        boundary=boundary_bk,
        turn_mask=turn_mask_bk,
        turn_labels=jnp.zeros(boundary_bk.shape, jnp.float32),
        score=jnp.zeros((b,), jnp.float32),
    )
    score_b = jax.lax.stop_gradient(
        episode_scores(graphdef, params, episodes, kind, aggregation)
    )
    r_b = rm_score_to_reward(score_b, transform, ref, temperature)
    verified_b = jnp.asarray(traj.facts["correct"], jnp.float32)
    return r_b, overoptimization_gap(r_b, verified_b)

  return reward_fn
