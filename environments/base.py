"""The environment protocol (docs/design.md).

An environment is a frozen dataclass with pure, *unbatched* methods over token arrays;
the rollout engine vmaps them over the batch. All shapes are static:

  P = env.max_prompt_len   prompt tokens (padded with PAD)
  A = env.max_action_len   tokens of one assistant turn (up to and including a stop token)
  O = env.max_obs_len      tokens of one tool observation (padded with PAD)
  K = env.max_turns        assistant turns per episode

Methods (all jnp, jittable, vmappable; none may raise on malformed model output):

  sample_tasks(key, n) -> Task pytree with leading dim n (infinite stream from a key).
  eval_tasks(n, seed) -> Task pytree, a fixed held-out set.
  reset(task) -> (state, prompt_tokens [P] int32, prompt_len int32)
  step(state, action_tokens [A] int32, action_len int32)
      -> (state, obs_tokens [O] int32, obs_len int32, done bool)
     `action_tokens[:action_len]` is one assistant turn; its last token is a stop token
     (tokenizers.STOP_TOKENS) unless the turn ran out of tokens. Malformed actions give
     an error observation and are recorded in the facts.
  facts(state) -> dict[str, array] of verifiable per-episode facts (scalars) and
     per-turn facts ([K]); must include 'correct' (bool), 'answered' (bool),
     'format_error' (bool) and 'num_tool_calls' (int32).
  expert_action(state, key) -> (action_tokens [A] int32, action_len int32): the
     demonstrator's next turn (for the SFT warm start), possibly deliberately imperfect.
"""

from __future__ import annotations

from typing import Any, Protocol

import jax


class Environment(Protocol):
  """Structural type of a JAX-native environment (see module docstring)."""

  max_prompt_len: int
  max_action_len: int
  max_obs_len: int
  max_turns: int

  def sample_tasks(self, key: jax.Array, n: int) -> Any:
    ...

  def eval_tasks(self, n: int, seed: int) -> Any:
    ...

  def reset(self, task: Any) -> tuple[Any, jax.Array, jax.Array]:
    ...

  def step(
      self, state: Any, action_tokens: jax.Array, action_len: jax.Array
  ) -> tuple[Any, jax.Array, jax.Array, jax.Array]:
    ...

  def facts(self, state: Any) -> dict[str, jax.Array]:
    ...

  def expert_action(
      self, state: Any, key: jax.Array
  ) -> tuple[jax.Array, jax.Array]:
    ...
