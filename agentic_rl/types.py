"""Pytrees that cross module boundaries (docs/design.md)."""

from __future__ import annotations

from typing import Any

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
    replay: None, or a `replay.ReplayBuffer` of successful episodes (when
      `rl.replay_capacity` > 0); set at the start of the RL phase.
    dual_coef: None, or the float32 scalar Lagrange multiplier of the
      dual-ascent constraint (when `rl.dual_constraint` is set).
    log_partition: None, or the parameters (flax.nnx.State) of FlowRL's
      learned log-partition log Z_phi(x) (`losses.LogPartition`; when
      `rl.loss_type='flowrl'`), set at the start of the RL phase.
    log_partition_opt_state: None, or the optax state of its optimizer.
    reward_model: None, or the frozen learned reward model's params
      {'trunk', 'head'} (when `rl.reward_model_dir` is set; never updated,
      scored inside the RL step like ref_params).
    spa: None, or the SPA progress estimator `credit.SpaState` (head
      parameters and its optimizer state; when `rl.pbrs_potential='spa'`).

  The optional fields default to None (an empty pytree), so states and
  checkpoints of runs without these switches keep their structure. The
  policy's value head (GAE, `rl.advantage_estimator='gae'`) is part of
  `params` (TransformerConfig.value_head), not a field of its own.
  """

  step: jax.Array
  params: Any
  ref_params: Any
  opt_state: Any
  rng: jax.Array
  kl_coef: jax.Array
  replay: Any = None
  dual_coef: Any = None
  log_partition: Any = None
  log_partition_opt_state: Any = None
  spa: Any = None
  reward_model: Any = None
