"""Tool-call budget: a wrapper that puts a call budget in the prompt of any
JAX-native environment and cuts the episode when the budget is exhausted.

`BudgetEnv(base="kv_chain", budget=2, base_kwargs={...})` wraps
`environments.registry.BASE_ENVS[base](**base_kwargs)`. The prompt is the base prompt followed
by "Budget: 2 calls.\n". A tool call that would be call number budget + 1 is not
executed for the policy: the episode ends at once (done, empty observation, fact
'budget_exceeded'); the base environment still records the attempted call in its
own facts (num_tool_calls counts it). Everything else (tasks, answers, facts,
the expert) is the base environment's; the expert is not budget-aware, so demos
of a base expert that over-calls get cut too.

Extra facts: 'budget_exceeded' (bool []), 'budget' (int32 [], the budget) and
'calls_left' (int32 [], budget minus calls made, floored at 0).

Config: configs/budget.py (env.name="budget", env.base, env.budget,
env.base_kwargs).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from agentic_text import tokenizers as tok
from environments import common
from environments import registry


@flax.struct.dataclass
class BudgetState:
  """The base environment's state plus the cut flag (bool [])."""

  base: Any
  exceeded: jax.Array
  done: jax.Array


@dataclasses.dataclass(frozen=True)
class BudgetEnv:
  """A tool-call budget around a base environment (see module docstring).

  Attributes:
    base: name of the base environment in environments.registry.BASE_ENVS.
    budget: tool calls allowed (>= 0).
    base_kwargs: the base environment's fields (a mapping, stored as sorted
      (name, value) pairs so that the environment stays hashable).
  """

  base: str = "kv_chain"
  budget: int = 2
  base_kwargs: Any = ()

  def __post_init__(self):
    kwargs = self.base_kwargs
    if hasattr(kwargs, "items"):
      kwargs = tuple(sorted(dict(kwargs).items()))
    object.__setattr__(self, "base_kwargs", tuple(kwargs))
    if self.base not in registry.BASE_ENVS:
      raise ValueError(
          f"base must name a non-budget environment in "
          f"{sorted(registry.BASE_ENVS)}, got {self.base!r}"
      )
    if (
        isinstance(self.budget, bool)
        or not isinstance(self.budget, int)
        or self.budget < 0
    ):
      raise ValueError(f"budget must be an integer >= 0, got {self.budget!r}")
    object.__setattr__(
        self, "_inner", registry.BASE_ENVS[self.base](**dict(self.base_kwargs))
    )

  @property
  def inner(self):
    """The base environment."""
    return self._inner  # pytype: disable=attribute-error

  @property
  def _suffix(self) -> tuple[int, ...]:
    return tuple(f"Budget: {self.budget} calls.\n".encode())

  @property
  def max_prompt_len(self) -> int:
    return self.inner.max_prompt_len + len(self._suffix)

  @property
  def max_action_len(self) -> int:
    return self.inner.max_action_len

  @property
  def max_obs_len(self) -> int:
    return self.inner.max_obs_len

  @property
  def max_turns(self) -> int:
    return self.inner.max_turns

  @property
  def max_answer_len(self) -> int:
    return self.inner.max_answer_len

  def sample_tasks(self, key, n: int):
    """The base environment's tasks."""
    return self.inner.sample_tasks(key, n)

  def eval_tasks(self, n: int, seed: int):
    """The base environment's held-out set."""
    return self.inner.eval_tasks(n, seed)

  def reset(self, task):
    """Base prompt followed by "Budget: N calls.\\n" (int32 [P], length)."""
    state, prompt, prompt_len = self.inner.reset(task)
    keep = jnp.arange(prompt.shape[0]) < prompt_len
    out, out_len = common.assemble(
        [(prompt, keep), common.const_piece(self._suffix)], self.max_prompt_len
    )
    f = jnp.zeros((), bool)
    return BudgetState(base=state, exceeded=f, done=f), out, out_len

  def step(self, state: BudgetState, action_tokens, action_len):
    """The base step, cut when the call count passes the budget.

    Returns:
      (state, obs_tokens int32 [O], obs_len int32 [], done bool []).
    """
    base, obs, obs_len, done = self.inner.step(
        state.base, action_tokens, action_len
    )
    active = ~state.done
    # A finished (e.g. cut) episode is left as it is.
    base = jax.tree.map(lambda n, o: jnp.where(active, n, o), base, state.base)
    obs = jnp.where(active, obs, tok.PAD)
    obs_len = jnp.where(active, obs_len, 0)
    calls = self.inner.facts(base)["num_tool_calls"]
    cut = active & (calls > self.budget)
    obs = jnp.where(cut, tok.PAD, obs).astype(jnp.int32)
    obs_len = jnp.where(cut, 0, obs_len).astype(jnp.int32)
    done = state.done | done | cut
    return (
        BudgetState(base=base, exceeded=state.exceeded | cut, done=done),
        obs,
        obs_len,
        done,
    )

  def facts(self, state: BudgetState) -> dict[str, jax.Array]:
    """The base facts plus 'budget_exceeded', 'budget', 'calls_left'."""
    out = dict(self.inner.facts(state.base))
    out["budget_exceeded"] = state.exceeded
    out["budget"] = jnp.int32(self.budget)
    out["calls_left"] = jnp.maximum(
        self.budget - out["num_tool_calls"], 0
    ).astype(jnp.int32)
    return out

  def expert_action(self, state: BudgetState, key):
    """The base environment's expert."""
    return self.inner.expert_action(state.base, key)
