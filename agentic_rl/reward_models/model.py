"""The reward model: the policy's transformer trunk with a scalar head.

Outcome RM (ORM): one score per episode, read at its last real token. Process
RM (PRM): one logit per turn boundary, aggregated into an episode score
(`prm_episode_score`). Sequences are read whatever their padding side.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
from flax import nnx

from agentic_rl.models import transformer

KINDS = ("outcome", "process")
PRM_AGGREGATIONS = ("log_prod", "min")


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


def head_vector(graphdef, params) -> jax.Array:
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
  return h_bd @ head_vector(graphdef, params)


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
  return h_bkd @ head_vector(graphdef, params)


# ---------------------------------------------------------------------------
# Turn boundaries and episode scores.
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


def make_score_fn(
    graphdef: nnx.GraphDef, kind: str, aggregation: str = "log_prod"
):
  """Jitted `score(params, episodes: EpisodeBatch) -> float32 [B]`."""
  if kind not in KINDS:
    raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
  return jax.jit(lambda p, e: episode_scores(graphdef, p, e, kind, aggregation))
