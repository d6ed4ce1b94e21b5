"""Pytrees that cross module boundaries (docs/design.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import flax.struct
import jax

if TYPE_CHECKING:  # annotations only
  import optax
  from flax import nnx

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
  """The SPA progress estimator inside `TrainState.spa` (checkpointed).

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
    kl_coef: float32 scalar; the KL-in-loss coefficient (constant unless an
      adaptive KL target is set).

  Optional per-feature parts: None (an empty pytree) unless the feature is on,
  so states and checkpoints of runs without it keep their structure. Each is
  created at the start of the RL phase by `learner.init_rl_extras`, except
  reward_model (train.py, from `reward_model_loader.load_rl_reward_model`):

    field                    type                  feature (config switch)
    replay                   ReplayBuffer          success replay
                                                   (rl.replay_capacity > 0)
    dual_coef                float32 []            dual-ascent Lagrange
                                                   multiplier (rl.dual_constraint)
    log_partition            nnx.State             FlowRL's learned log Z_phi(x)
                                                   (losses.LogPartition;
                                                   rl.loss_type='flowrl')
    log_partition_opt_state  optax.OptState        its optimizer's state
    spa                      SpaState              SPA progress head and its
                                                   optimizer state
                                                   (rl.pbrs_potential='spa')
    reward_model             RewardModelParams     frozen learned RM, never
                                                   updated, scored inside the
                                                   RL step like ref_params
                                                   (rl.reward_model_dir)

  The policy's value head (GAE, `rl.advantage_estimator='gae'`) is part of
  `params` (TransformerConfig.value_head), not a field of its own.
  """

  step: jax.Array
  params: Any
  ref_params: Any
  opt_state: Any
  rng: jax.Array
  kl_coef: jax.Array
  replay: ReplayBuffer | None = None
  dual_coef: jax.Array | None = None
  log_partition: nnx.State | None = None
  log_partition_opt_state: optax.OptState | None = None
  spa: SpaState | None = None
  reward_model: RewardModelParams | None = None
