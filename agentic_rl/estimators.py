"""The advantage-estimator table: `ESTIMATORS`, one entry per estimator.

Each entry is an `Estimator`: an array function in rlax's style (arrays in
positionally, scalar settings as keywords, arrays out, chex shape checks)
plus what it needs, declared:

* `inputs`: the names of its positional arrays, from a fixed vocabulary
  (`INPUTS`); what an estimator reads follows from them (the value head's
  values, per-turn structure, environment facts);
* `settings`: the names of its keyword settings (`SETTINGS`);
* `level`: what one advantage is for: an episode ([B], broadcast to the
  episode's POLICY tokens), a turn (per-turn advantages on each turn's POLICY
  tokens) or a token (per-token, from the value head);
* `selected_by`: the config field that selects it, and for an entry that a
  field other than `rl.advantage_estimator` selects (per-turn credit, tree
  rollouts), the `rl.advantage_estimator` values it runs with
  (`base_estimators`);
* `takes_potential` (its reward may carry PBRS shaping) and
  `needs_sampled_rows` (it reads the batch's rows in sampling order, which
  replay injection would change).

The learner's adapter from the config (`learner.token_credit`: which entry a
config selects, the arrays and settings it passes) and config validation
(`validation.py`, the compatibility rules) both read this table; a new
estimator is one array function and one entry here.

| name                  | level   | selected by            | source           |
|-----------------------|---------|------------------------|------------------|
| grpo                  | episode | rl.advantage_estimator | arXiv:2402.03300 |
| drgrpo                | episode | rl.advantage_estimator | arXiv:2503.20783 |
| rloo                  | episode | rl.advantage_estimator | arXiv:2402.14740 |
| reinforce_pp          | episode | rl.advantage_estimator | arXiv:2501.03262 |
| reinforce_pp_baseline | episode | rl.advantage_estimator | arXiv:2501.03262 |
| hdpo                  | episode | rl.advantage_estimator | docs/papers.md   |
| gigpo                 | turn    | rl.advantage_estimator | arXiv:2505.10978 |
| gae                   | token   | rl.advantage_estimator | arXiv:1506.02438 |
| per_turn              | turn    | rl.credit='per_turn'   | arXiv:2402.03300 |
| tree                  | turn    | rl.tree_branching      | arXiv:2510.26020 |
"""

from __future__ import annotations

from collections.abc import Callable
import dataclasses
import functools
import math
from typing import Any

import chex
import jax
import jax.numpy as jnp

from agentic_rl import advantages
from agentic_rl.credit import turn_estimators

# The positional arrays an entry may take (`Estimator.inputs`), as the
# learner's adapter (`learner.token_credit`) produces them. B episodes, L token
# positions, K turns.
INPUTS = {
    "reward_b": "[B] float32 episode reward (episode level: with the "
    "telescoped PBRS return when shaped)",
    "group_b": "[B] int32 task-group ids in [0, B)",
    "turn_mask_bk": "[B, K] bool, turn k < the episode's number of turns",
    "outcome_bk": "[B, K] float32 episode reward at its last turn, 0 elsewhere",
    "turn_reward_bk": "[B, K] float32 per-turn rewards: outcome_bk plus the "
    "PBRS terms and the step rewards of the config",
    "tokens_bl": "[B, L] int32 token ids",
    "role_bl": "[B, L] int roles (types.POLICY, ...)",
    "turn_bl": "[B, L] int32 turn index of each token (-1 outside turns)",
    "mask_bl": "[B, L] bool POLICY-token mask",
    "values_bl": "[B, L] float32 behaviour values V_old of the value head",
    "facts.correct": "[B] float32 environment fact 'correct' (0/1)",
    "facts.num_tool_calls": "[B] float32 environment fact 'num_tool_calls'",
}

# The keyword settings an entry may take (`Estimator.settings`) and the `rl`
# config field each comes from (read by `learner.token_credit`).
SETTINGS = {
    "scale_by_std": "rl.scale_by_std",
    "eps": "rl.adv_eps",
    "std_ddof": "rl.std_ddof",
    "discount": "rl.discount",
    "lambda_": "rl.gae_lambda",
    "efficiency_weight": "rl.hdpo_efficiency_weight",
    "step_weight": "rl.gigpo_step_weight",
    "match_turn": "rl.gigpo_match_turn",
    "branching": "rl.tree_branching",
    "alpha": "rl.tree_alpha",
}

LEVELS = ("episode", "turn", "token")
SELECTING_FIELDS = ("rl.advantage_estimator", "rl.credit", "rl.tree_branching")


@dataclasses.dataclass(frozen=True)
class Estimator:
  """One advantage estimator: its array function and what it needs.

  Attributes:
    fn: fn(*arrays, **settings), arrays in the order of `inputs`, settings
      the keywords of `settings`. Returns, by `level`: 'episode' adv_b [B]
      float32; 'turn' (adv_b [B] float32 for logging, adv_bl [B, L] float32,
      0 off POLICY); 'token' (adv_b [B], adv_bl [B, L], returns_bl [B, L]
      float32, 0 off POLICY).
    level: 'episode', 'turn' or 'token' (see the module docstring).
    inputs: names of the positional arrays (keys of `INPUTS`).
    settings: names of the keyword settings (keys of `SETTINGS`).
    selected_by: the config field that selects the entry
      (`SELECTING_FIELDS`): 'rl.advantage_estimator' (by the entry's name),
      'rl.credit' (the value 'per_turn') or 'rl.tree_branching' (non-empty).
    base_estimators: for an entry selected by another field than
      'rl.advantage_estimator': the `rl.advantage_estimator` values it runs
      with (its math is theirs, per turn or per fork).
    takes_potential: its reward may carry PBRS shaping (rl.pbrs_coef > 0).
    needs_sampled_rows: it reads the rows in sampling order (tree layout), so
      replay injection (which replaces rows) is refused.
  """

  fn: Callable[..., Any]
  level: str
  inputs: tuple[str, ...]
  settings: tuple[str, ...] = ()
  selected_by: str = "rl.advantage_estimator"
  base_estimators: tuple[str, ...] = ()
  takes_potential: bool = True
  needs_sampled_rows: bool = False

  def __post_init__(self):
    if self.level not in LEVELS:
      raise ValueError(f"level={self.level!r}: must be one of {LEVELS}")
    if self.selected_by not in SELECTING_FIELDS:
      raise ValueError(
          f"selected_by={self.selected_by!r}: must be one of "
          f"{SELECTING_FIELDS}"
      )
    unknown = [i for i in self.inputs if i not in INPUTS] + [
        s for s in self.settings if s not in SETTINGS
    ]
    if unknown:
      raise ValueError(f"unknown inputs or settings: {unknown}")

  @property
  def needs_value_head(self) -> bool:
    """It reads the value head's behaviour values (input 'values_bl')."""
    return "values_bl" in self.inputs

  @property
  def needs_turns(self) -> bool:
    """It reads per-turn structure (an input of shape [B, K])."""
    return any(i.endswith("_bk") for i in self.inputs)

  @property
  def takes_turn_rewards(self) -> bool:
    """It takes the per-turn rewards with step rewards ('turn_reward_bk')."""
    return "turn_reward_bk" in self.inputs

  @property
  def reads_facts(self) -> tuple[str, ...]:
    """The environment facts it reads (inputs 'facts.NAME')."""
    return tuple(
        i.partition(".")[2] for i in self.inputs if i.startswith("facts.")
    )


# ---------------------------------------------------------------------------
# Array functions of the turn- and token-level entries (the episode-level
# ones are in advantages.py and credit/turn_estimators.py).
# ---------------------------------------------------------------------------


def _mean_abs_over_turns(adv_bk: jax.Array, turn_mask_bk: jax.Array):
  """[B] float32 mean |A| over each episode's valid turns."""
  return jnp.sum(jnp.abs(adv_bk) * turn_mask_bk, 1) / jnp.maximum(
      jnp.sum(turn_mask_bk, 1), 1
  )


def per_turn_token_advantages(
    turn_reward_bk: jax.Array,
    turn_mask_bk: jax.Array,
    group_b: jax.Array,
    turn_bl: jax.Array,
    role_bl: jax.Array,
    *,
    discount: float,
    scale_by_std: bool = True,
    eps: float = 1e-6,
    std_ddof: int = 0,
) -> tuple[jax.Array, jax.Array]:
  """Per-turn GRPO on reward-to-go, on each turn's POLICY tokens.

  G_bk = sum_{j>=k} discount^{j-k} r_bj (Sutton & Barto 2018, eq. 3.8;
  `advantages.turn_reward_to_go`), A_bk = (G_bk - mean_{g,k}) / (std_{g,k}
  + eps) within the episodes of the group with a turn k (GRPO's process
  supervision, Shao et al., arXiv:2402.03300, section 4.1.3;
  `advantages.per_turn_grpo_advantages`).

  Args:
    turn_reward_bk: [B, K] float per-turn rewards.
    turn_mask_bk: [B, K] bool valid turns.
    group_b: [B] int group ids in [0, B).
    turn_bl: [B, L] int turn index of each token.
    role_bl: [B, L] int roles.
    discount: per-turn discount in [0, 1].
    scale_by_std: divide by the (group, turn) std (+ eps).
    eps: added to the std.
    std_ddof: delta degrees of freedom of the std.

  Returns:
    (adv_b [B] float32 mean |A| over the episode's turns, adv_bl [B, L]
    float32, 0 off POLICY).
  """
  chex.assert_rank([turn_reward_bk, turn_mask_bk, turn_bl, role_bl], 2)
  returns_bk = advantages.turn_reward_to_go(
      turn_reward_bk, turn_mask_bk, discount
  )
  adv_bk = advantages.per_turn_grpo_advantages(
      returns_bk,
      turn_mask_bk,
      group_b,
      scale_by_std=scale_by_std,
      eps=eps,
      std_ddof=std_ddof,
  )
  adv_bl = advantages.broadcast_turn_to_tokens(adv_bk, turn_bl, role_bl)
  return _mean_abs_over_turns(adv_bk, turn_mask_bk), adv_bl


def gigpo_token_advantages(
    outcome_bk: jax.Array,
    turn_mask_bk: jax.Array,
    reward_b: jax.Array,
    group_b: jax.Array,
    tokens_bl: jax.Array,
    role_bl: jax.Array,
    turn_bl: jax.Array,
    *,
    discount: float,
    step_weight: float,
    match_turn: bool = True,
    scale_by_std: bool = True,
    eps: float = 1e-6,
) -> tuple[jax.Array, jax.Array]:
  """GiGPO: A_bk = A^E_b + step_weight * A^S_bk on each turn's POLICY tokens.

  Feng et al., arXiv:2505.10978, section 4.2: the episode's GRPO advantage
  A^E_b plus the step advantage A^S_bk within the group of steps of the same
  task that start from the same state (`turn_estimators.
  observation_state_keys`, `turn_estimators.gigpo_step_advantages`), on
  discounted step returns of the unshaped outcome.

  Args:
    outcome_bk: [B, K] float episode reward at its last turn.
    turn_mask_bk: [B, K] bool valid turns.
    reward_b: [B] float episode rewards.
    group_b: [B] int group ids in [0, B).
    tokens_bl, role_bl, turn_bl: [B, L] trajectory fields.
    discount: per-turn discount of the step returns.
    step_weight: weight of the step advantage (>= 0).
    match_turn: only steps at the same turn share a state group.
    scale_by_std: divide by the (step) group std (+ eps).
    eps: added to the std.

  Returns:
    (adv_b [B] float32 episode GRPO advantage, adv_bl [B, L] float32, 0 off
    POLICY).
  """
  chex.assert_rank([outcome_bk, turn_mask_bk, tokens_bl, role_bl, turn_bl], 2)
  returns_bk = advantages.turn_reward_to_go(outcome_bk, turn_mask_bk, discount)
  adv_b = advantages.grpo_advantages(
      reward_b, group_b, scale_by_std=scale_by_std, eps=eps
  )
  keys_bk = turn_estimators.observation_state_keys(
      tokens_bl,
      role_bl,
      turn_bl,
      turn_mask_bk.shape[1],
      match_turn=match_turn,
  )
  adv_s = turn_estimators.gigpo_step_advantages(
      returns_bk,
      keys_bk,
      turn_mask_bk,
      group_b,
      scale_by_std=scale_by_std,
      eps=eps,
  )
  adv_bk = adv_b[:, None] + step_weight * adv_s
  adv_bl = advantages.broadcast_turn_to_tokens(
      jnp.where(turn_mask_bk, adv_bk, 0.0), turn_bl, role_bl
  )
  return adv_b, adv_bl


def tree_token_advantages(
    reward_b: jax.Array,
    turn_mask_bk: jax.Array,
    turn_bl: jax.Array,
    role_bl: jax.Array,
    *,
    branching: tuple[int, ...],
    alpha: float,
    scale_by_std: bool = True,
    eps: float = 1e-6,
) -> tuple[jax.Array, jax.Array]:
  """PORTool tree rollouts: turn k gets its step's fork-relative advantage.

  PORTool (Wu et al., arXiv:2510.26020; inferred form in docs/papers.md):
  `turn_estimators.tree_fork_advantages` per tree (G = prod(branching) leaf
  rows per tree, contiguous, leaves in lexicographic order), blended with the
  trajectory advantage by alpha; turn k of a leaf gets its step at depth
  min(k + 1, d) (`turn_estimators.tree_turn_advantages`).

  Args:
    reward_b: [B] float leaf outcomes, B a multiple of prod(branching).
    turn_mask_bk: [B, K] bool valid turns.
    turn_bl, role_bl: [B, L] trajectory fields.
    branching: static fork sizes (b_1, .., b_d).
    alpha: blend weight in [0, 1].
    scale_by_std: divide by the siblings' std (+ eps).
    eps: added to the std.

  Returns:
    (adv_b [B] float32 the leaf's deepest-step advantage, adv_bl [B, L]
    float32, 0 off POLICY).
  """
  chex.assert_rank(reward_b, 1)
  chex.assert_rank([turn_mask_bk, turn_bl, role_bl], 2)
  adv_gd = jax.vmap(
      functools.partial(
          turn_estimators.tree_fork_advantages,
          branching=branching,
          alpha=alpha,
          scale_by_std=scale_by_std,
          eps=eps,
      )
  )(reward_b.reshape(-1, math.prod(branching)))
  adv_bd = adv_gd.reshape(reward_b.shape[0], len(branching))
  adv_bk = jnp.where(
      turn_mask_bk,
      turn_estimators.tree_turn_advantages(adv_bd, turn_mask_bk.shape[1]),
      0.0,
  )
  adv_bl = advantages.broadcast_turn_to_tokens(adv_bk, turn_bl, role_bl)
  return adv_bd[:, -1], adv_bl


def last_policy_reward(reward_b: jax.Array, mask_bl: jax.Array) -> jax.Array:
  """[B, L] float32: each episode's reward at its last POLICY token, else 0.

  Args:
    reward_b: [B] float episode rewards.
    mask_bl: [B, L] bool POLICY-token mask.
  """
  l = mask_bl.shape[1]
  pos = jnp.arange(l)[None, :]
  last_b = jnp.max(jnp.where(mask_bl, pos, -1), axis=1)
  return jnp.where(pos == last_b[:, None], reward_b[:, None], 0.0).astype(
      jnp.float32
  )


def gae_token_advantages(
    reward_b: jax.Array,
    mask_bl: jax.Array,
    values_bl: jax.Array,
    *,
    discount: float,
    lambda_: float,
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """PPO-GAE over each episode's POLICY tokens, outcome at the last one.

  Schulman et al., arXiv:1506.02438, eq. (16), by `advantages.token_gae`:
  observation and template tokens add no discount step
  (docs/rewards_and_credit.md); the episode reward is the reward of its last
  POLICY token (`last_policy_reward`). lambda_ = 1 gives Monte-Carlo returns
  (the value head's targets). Not normalised.

  Args:
    reward_b: [B] float episode rewards.
    mask_bl: [B, L] bool POLICY-token mask.
    values_bl: [B, L] float behaviour values V_old.
    discount: per-POLICY-token discount in [0, 1].
    lambda_: GAE lambda in [0, 1].

  Returns:
    (adv_b [B] float32 mean advantage over each row's POLICY tokens (for
    logging), adv_bl [B, L] float32, returns_bl [B, L] float32; both 0 off
    POLICY).
  """
  chex.assert_rank(reward_b, 1)
  chex.assert_rank([mask_bl, values_bl], 2)
  adv_bl, ret_bl = jax.vmap(
      advantages.token_gae, in_axes=(0, 0, 0, None, None)
  )(
      last_policy_reward(reward_b, mask_bl),
      values_bl,
      mask_bl,
      discount,
      lambda_,
  )
  count_b = jnp.maximum(jnp.sum(mask_bl, axis=1), 1).astype(jnp.float32)
  return jnp.sum(adv_bl, axis=1) / count_b, adv_bl, ret_bl


# ---------------------------------------------------------------------------
# The table.
# ---------------------------------------------------------------------------

_GROUP_STD = ("scale_by_std", "eps", "std_ddof")

ESTIMATORS: dict[str, Estimator] = {
    "grpo": Estimator(
        advantages.grpo_advantages,
        "episode",
        ("reward_b", "group_b"),
        _GROUP_STD,
    ),
    "drgrpo": Estimator(
        advantages.drgrpo_advantages, "episode", ("reward_b", "group_b")
    ),
    "rloo": Estimator(
        advantages.rloo_advantages,
        "episode",
        ("reward_b", "group_b"),
        _GROUP_STD,
    ),
    "reinforce_pp": Estimator(
        advantages.reinforce_pp_advantages,
        "episode",
        ("reward_b",),
        ("eps", "std_ddof"),
    ),
    "reinforce_pp_baseline": Estimator(
        advantages.reinforce_pp_baseline_advantages,
        "episode",
        ("reward_b", "group_b"),
        ("eps", "std_ddof"),
    ),
    "hdpo": Estimator(
        turn_estimators.hdpo_advantages,
        "episode",
        ("facts.correct", "facts.num_tool_calls", "group_b"),
        ("efficiency_weight", "eps"),
    ),
    "gigpo": Estimator(
        gigpo_token_advantages,
        "turn",
        (
            "outcome_bk",
            "turn_mask_bk",
            "reward_b",
            "group_b",
            "tokens_bl",
            "role_bl",
            "turn_bl",
        ),
        ("discount", "step_weight", "match_turn", "scale_by_std", "eps"),
        takes_potential=False,
    ),
    "gae": Estimator(
        gae_token_advantages,
        "token",
        ("reward_b", "mask_bl", "values_bl"),
        ("discount", "lambda_"),
        takes_potential=False,
    ),
    "per_turn": Estimator(
        per_turn_token_advantages,
        "turn",
        ("turn_reward_bk", "turn_mask_bk", "group_b", "turn_bl", "role_bl"),
        ("discount",) + _GROUP_STD,
        selected_by="rl.credit",
        base_estimators=("grpo",),
    ),
    "tree": Estimator(
        tree_token_advantages,
        "turn",
        ("reward_b", "turn_mask_bk", "turn_bl", "role_bl"),
        ("branching", "alpha", "scale_by_std", "eps"),
        selected_by="rl.tree_branching",
        base_estimators=("grpo",),
        takes_potential=False,
        needs_sampled_rows=True,
    ),
}


def selected_by(field: str) -> tuple[str, ...]:
  """The names of the `ESTIMATORS` entries that config field `field` selects
  (one of `SELECTING_FIELDS`), in table order; for 'rl.advantage_estimator'
  these are its valid values."""
  if field not in SELECTING_FIELDS:
    raise ValueError(f"{field!r}: must be one of {SELECTING_FIELDS}")
  return tuple(n for n, e in ESTIMATORS.items() if e.selected_by == field)


def entry_for(field: str) -> str:
  """The name of the one `ESTIMATORS` entry that config field `field`
  selects instead of `rl.advantage_estimator` ('rl.credit' with the value
  'per_turn', or 'rl.tree_branching' when set)."""
  names = selected_by(field)
  if field == "rl.advantage_estimator" or len(names) != 1:
    raise ValueError(f"{field!r} does not select one entry: {names}")
  return names[0]
