"""The host-environment protocol (docs/design.md, host half).

A host environment runs its tools in Python, so its `step` works on decoded text and
the rollout is driven turn by turn from the host (agentic_rl/host_rollout.py), which
calls the same jitted `generate_turn` and observation-append functions as the
JAX-native rollout. It declares `is_host = True`; the train loop dispatches on it.

Shapes are static, as for JAX-native environments:

  P = max_prompt_len, A = max_action_len, O = max_obs_len, K = max_turns.

Methods (plain Python/numpy; none may raise on malformed model output):

  sample_tasks(rng: np.random.Generator, n) -> list of n tasks (infinite stream).
  eval_tasks(n, seed) -> list of n tasks, a fixed held-out set.
  reset(task) -> (state, prompt_ids: int32 [<= P] array). Longer prompts are cut
      to their first P tokens by the rollout.
  step(state, action_text: str) -> (state, obs_ids: int32 [<= O] array, done: bool)
      `action_text` is the tokenizer's decoding of the sampled turn (for parsing
      only; the trajectory keeps the sampled ids). An observation longer than O
      is cut by the rollout; environments should keep theirs within O.
  step_batch(states, action_texts) -> list of step results; optional, for
      environments whose tools run concurrently (e.g. the sandbox pool).
  facts(state) -> dict[str, np.ndarray] with fixed keys, shapes and dtypes:
      per-episode scalars and per-turn [K] arrays; must include 'correct',
      'answered', 'format_error' (bool), 'num_tool_calls', 'num_tool_errors'
      (int32) and 'hard' (bool; False where the notion does not apply).
  expert_action(state, rng) -> int32 token ids of the demonstrator's next turn.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence

import numpy as np


class HostEnvironment(Protocol):
  """Structural type of a host environment (see module docstring)."""

  is_host: bool
  max_prompt_len: int
  max_action_len: int
  max_obs_len: int
  max_turns: int
  tokenizer: Any

  def sample_tasks(self, rng: np.random.Generator, n: int) -> list[Any]: ...

  def eval_tasks(self, n: int, seed: int) -> list[Any]: ...

  def reset(self, task: Any) -> tuple[Any, np.ndarray]: ...

  def step(self, state: Any, action_text: str) -> tuple[Any, np.ndarray, bool]: ...

  def facts(self, state: Any) -> dict[str, np.ndarray]: ...

  def expert_action(self, state: Any, rng: np.random.Generator) -> np.ndarray: ...


def is_host(env: Any) -> bool:
  """Whether `env` is a host environment (declares `is_host = True`)."""
  return bool(getattr(env, "is_host", False))


def step_batch(env: Any, states: Sequence[Any], texts: Sequence[str]) -> list:
  """`env.step_batch` if the environment has one, else `env.step` row by row."""
  if hasattr(env, "step_batch"):
    return list(env.step_batch(states, texts))
  return [env.step(s, t) for s, t in zip(states, texts)]
