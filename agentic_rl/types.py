"""Pytrees that cross module boundaries (docs/design.md)."""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator, Mapping

import flax.struct
import jax

# Roles of tokens in a trajectory (int8 values of Trajectory.role), defined
# with the chat renderer that assigns them. Only POLICY tokens are ever trained.
from agentic_text.roles import PAD, POLICY, PROMPT, TEMPLATE, TOOL  # noqa: F401

# Finish reasons (int32).
RUNNING = 0  # not finished (only inside the rollout loop)
ANSWERED = 1  # the policy emitted a final answer
MAX_TURNS = 2  # turn budget exhausted without an answer
TRUNCATED = 3  # context full
FORMAT_ERROR = 4  # a turn ended without a stop token or with a malformed answer

FINISH_NAMES = {
    RUNNING: "running",
    ANSWERED: "answered",
    MAX_TURNS: "max_turns",
    TRUNCATED: "truncated",
    FORMAT_ERROR: "format_error",
}


@flax.struct.dataclass
class Trajectory:
  """A batch of B episodes, L tokens, K turns; batch-major and fixed-shape.

  Attributes:
    tokens: [B, L] int32; prompt, then every turn's tokens, then padding.
    role: [B, L] int8; PROMPT, POLICY, TOOL, TEMPLATE or PAD (module constants).
    logprob: [B, L] float32; behaviour log-prob of each POLICY token exactly as
      sampled (temperature applied), 0 elsewhere.
    turn: [B, L] int32; turn index of each token, -1 for prompt and padding.
    length: [B] int32; number of non-pad tokens.
    num_turns: [B] int32; assistant turns taken.
    finish: [B] int32; ANSWERED, MAX_TURNS, TRUNCATED or FORMAT_ERROR.
    group: [B] int32; index of the task the episode belongs to (GRPO group).
    facts: env-defined pytree of verifiable per-episode ([B, ...]) and per-turn
      ([B, K]) facts.
  """

  tokens: jax.Array
  role: jax.Array
  logprob: jax.Array
  turn: jax.Array
  length: jax.Array
  num_turns: jax.Array
  finish: jax.Array
  group: jax.Array
  facts: Any


@flax.struct.dataclass
class ReplayBuffer:
  """S slots of L-token episodes; slot s is used iff valid[s].

  Attributes:
    key: [S] uint32 task key of the stored episode (`replay.task_keys`).
    valid: [S] bool.
    tokens: [S, L] int32 episode tokens.
    role: [S, L] int8 token roles (PROMPT, POLICY, ...).
    logprob: [S, L] float32 behaviour log-probs recorded when it was sampled.
    turn: [S, L] int32 turn index of each token (Trajectory.turn; -1
      on prompt and padding), so that an injected episode keeps its own turn
      structure (per-turn estimators such as GiGPO read it).
    reward: [S] float32 reward it got.
    step: [S] int32 training step at which it was stored (-1 when empty).
  """

  key: jax.Array
  valid: jax.Array
  tokens: jax.Array
  role: jax.Array
  logprob: jax.Array
  turn: jax.Array
  reward: jax.Array
  step: jax.Array


@flax.struct.dataclass
class SpaState:
  """The SPA progress estimator in `TrainState.features['spa']`.

  Attributes:
    params: {'weight': [D] float32, 'bias': [] float32}, a linear head on the
      policy's (stop-gradient) final hidden state at the end of each turn.
    opt_state: its own optax state (`credit.make_spa_optimizer`).
  """

  params: Any
  opt_state: Any


# A frozen reward model's parameters (reward_models.model.init_reward_model):
# {'trunk': nnx.State of the transformer trunk, 'head': {} or
#  {'hidden_dd': [D, D] float32, 'bias_d': [D] float32}}.
RewardModelParams = dict[str, Any]


@flax.struct.dataclass
class LogPartitionState:
  """FlowRL's learned log Z_phi(x) inside `TrainState.features['flowrl']`.

  Attributes:
    params: nnx.State of `losses.LogPartition` (the log Z network on the
      pooled prompt embedding).
    opt_state: its own optax state (`make_log_partition_optimizer`).
  """

  params: Any
  opt_state: Any


# The order in which `FeatureStates` flattens its states (hence the order of
# the RL step's arguments and of a checkpoint's leaves); names not listed
# follow, sorted. It is the order of the TrainState fields the states had
# before they moved into `TrainState.features` (kl_coef, replay, dual_coef,
# log_partition + log_partition_opt_state, spa), so the jitted step's
# signature is unchanged.
FEATURE_ORDER = ("kl", "replay", "dual", "flowrl", "spa")


def _feature_rank(name: str) -> tuple[int, str]:
  if name in FEATURE_ORDER:
    return FEATURE_ORDER.index(name), ""
  return len(FEATURE_ORDER), name


@jax.tree_util.register_pytree_with_keys_class
class FeatureStates(Mapping[str, Any]):
  """The states of the stateful features, by name (`TrainState.features`).

  An immutable mapping (a feature that is off is absent) and a pytree whose
  children are the states in `FEATURE_ORDER` (key paths DictKey(name), as a
  dict's; checkpoints store them under features/<name>/...). `learner.features`
  defines each feature's (init, update) pair.
  """

  __slots__ = ("_states",)

  def __init__(self, states: Mapping[str, Any] | None = None, **more: Any):
    merged = {**(states or {}), **more}
    ordered = {k: merged[k] for k in sorted(merged, key=_feature_rank)}
    object.__setattr__(self, "_states", ordered)

  def __getitem__(self, name: str) -> Any:
    return self._states[name]

  def __iter__(self) -> Iterator[str]:
    return iter(self._states)

  def __len__(self) -> int:
    return len(self._states)

  def __repr__(self) -> str:
    return f"FeatureStates({self._states!r})"

  def __setattr__(self, name, value):
    raise AttributeError("FeatureStates is immutable; use .replace")

  def replace(self, **states: Any) -> FeatureStates:
    """A copy with `states` set (added or replaced)."""
    return FeatureStates(self._states, **states)

  def tree_flatten_with_keys(self):
    children = [(jax.tree_util.DictKey(k), v) for k, v in self._states.items()]
    return children, tuple(self._states)

  @classmethod
  def tree_unflatten(cls, names, children) -> FeatureStates:
    return cls(dict(zip(names, children)))


@flax.struct.dataclass
class TrainState:
  """Everything needed to resume a run exactly.

  Attributes:
    step: int32 scalar; optimizer updates done so far (SFT steps, then RL steps).
      It is also the data position: the batch of step s is generated from
      fold_in(data key, s), so resuming at step s replays the same stream.
    params: the policy's parameters (flax.nnx.State).
    ref_params: the frozen reference model (the SFT checkpoint) used for the KL
      penalty; equal to params during SFT.
    opt_state: optax state of the current phase's optimizer.
    rng: uint32 [2] base PRNG key data; per-step keys are fold_in(rng, step).
    features: the states of the stateful features (`FeatureStates`, defined
      by `learner.features`: each an (init, update) pair). A feature that is
      off has no state, so states and checkpoints of runs without it keep
      their structure. 'kl' exists from the start (`train.init_state`); the
      others are created at the start of the RL phase
      (`learner.init_rl_extras`):

        name     type                 feature (config switch)
        kl       float32 []           the KL-in-loss coefficient (constant
                                      unless rl.kl_target > 0: adaptive KL)
        replay   ReplayBuffer         success replay (rl.replay_capacity > 0)
        dual     float32 []           dual-ascent Lagrange multiplier
                                      (rl.dual_constraint)
        flowrl   LogPartitionState    FlowRL's learned log Z_phi(x) and its
                                      optimizer state (rl.loss_type='flowrl')
        spa      SpaState             SPA progress head and its optimizer
                                      state (rl.pbrs_potential='spa')

      Checkpoints written before the states moved here (fields kl_coef,
      replay, dual_coef, log_partition, log_partition_opt_state, spa) restore
      through `learner.features.restore_train_state`.
    reward_model: the frozen learned RM (`RewardModelParams`), never updated,
      scored inside the RL step like ref_params (rl.reward_model_dir; set by
      train.py from `reward_model_loader.load_rl_reward_model`), or None.

  The policy's value head (GAE, `rl.advantage_estimator='gae'`) is part of
  `params` (TransformerConfig.value_head), not a feature of its own.
  """

  step: jax.Array
  params: Any
  ref_params: Any
  opt_state: Any
  rng: jax.Array
  features: FeatureStates = dataclasses.field(default_factory=FeatureStates)
  reward_model: RewardModelParams | None = None
