"""The environments that wrap no other one, by config name (`env.name`).

Wrappers (`budget.BudgetEnv`) build their inner environment from this table;
`environments.REGISTRY` adds the wrappers to it.
"""

from __future__ import annotations

import importlib

from environments import arithmetic
from environments import chat_arithmetic
from environments import clarification
from environments import kv_chain
from environments import schema_calls


def _lazy(module: str, name: str):
  """Constructor that imports a host environment's module on first use (their
  optional dependencies, e.g. bfcl-eval, are only needed when selected)."""

  def make_env(**kwargs):
    return getattr(importlib.import_module(module), name)(**kwargs)

  make_env.__name__ = name
  # Declared without importing the module (validation reads it).
  make_env.is_host = True
  return make_env


BASE_ENVS = {
    "arithmetic": arithmetic.ArithmeticEnv,
    # JAX-native on an HF chat checkpoint's token ids (config.tokenizer='hf').
    "chat_arithmetic": chat_arithmetic.ChatArithmeticEnv,
    "kv_chain": kv_chain.KVChainEnv,
    "schema_calls": schema_calls.SchemaCallsEnv,
    "clarification": clarification.ClarificationEnv,
    # Host environments (environments/host/README.md).
    "bfcl": _lazy("environments.host.bfcl.single_turn", "BFCLEnv"),
    "bfcl_multi_turn": _lazy(
        "environments.host.bfcl.multi_turn", "BFCLMultiTurnEnv"
    ),
    "chat_arithmetic_host": _lazy(
        "environments.host.chat_arithmetic", "HostChatArithmeticEnv"
    ),
    "reasoning_gym": _lazy(
        "environments.host.reasoning_gym_env", "ReasoningGymEnv"
    ),
}
