"""Environments: one per file; `base.py` holds the protocol.

`make(env_config)` builds the environment named by `env_config.name` from the
remaining fields (the experiment config's `env` block).
"""

from __future__ import annotations

from typing import Any, Mapping

from environments import arithmetic
from environments import budget
from environments import clarification
from environments import kv_chain
from environments import schema_calls

REGISTRY = {
    "arithmetic": arithmetic.ArithmeticEnv,
    "kv_chain": kv_chain.KVChainEnv,
    "schema_calls": schema_calls.SchemaCallsEnv,
    "clarification": clarification.ClarificationEnv,
    "budget": budget.BudgetEnv,
}


def make(env_config: Mapping[str, Any]):
  """Environment from its config block: name plus the dataclass's fields.

  Raises:
    KeyError: unknown name (validation reports it as a config error first).
    TypeError: a field the environment does not have.
  """
  kwargs = {k: v for k, v in dict(env_config).items() if k != "name"}
  return REGISTRY[env_config["name"]](**kwargs)
