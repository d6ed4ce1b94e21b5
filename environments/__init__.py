"""Environments: one per file; `base.py` holds the protocol.

`make(env_config)` builds the environment named by `env_config.name` from the
remaining fields (the experiment config's `env` block).
"""

from __future__ import annotations

from typing import Any, Mapping

from environments import budget
from environments import registry

# Every environment by config name: the base ones and the wrappers around them.
REGISTRY = {**registry.BASE_ENVS, "budget": budget.BudgetEnv}


def make(env_config: Mapping[str, Any]):
  """Environment from its config block: name plus the dataclass's fields.

  Raises:
    KeyError: unknown name (validation reports it as a config error first).
    TypeError: a field the environment does not have.
  """
  kwargs = {k: v for k, v in dict(env_config).items() if k != "name"}
  return REGISTRY[env_config["name"]](**kwargs)
