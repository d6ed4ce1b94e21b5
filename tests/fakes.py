"""Tiny models and environments for tests."""

from __future__ import annotations

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp
from flax import nnx

from agentic_rl import tokenizers
from agentic_rl.models import transformer

TINY = transformer.TransformerConfig(
    vocab_size=tokenizers.VOCAB_SIZE, d_model=32, num_layers=2, num_heads=2,
    head_dim=16, ffn_dim=64,
)


def tiny_policy(seed: int = 0, cfg: transformer.TransformerConfig = TINY):
  """(graphdef, params, cfg) of a randomly initialised tiny transformer."""
  model = transformer.Transformer(cfg, nnx.Rngs(params=seed))
  graphdef, params = nnx.split(model)
  return graphdef, params, cfg


@flax.struct.dataclass
class EchoState:
  turn: jax.Array
  calls: jax.Array


@dataclasses.dataclass(frozen=True)
class EchoEnv:
  """Accepts any action; answers every turn with an observation of 1 + turn % 3
  tokens; the episode ends after `max_turns` turns (never 'answered').

  Exercises multi-turn cache appends of ragged observations with any policy,
  including a random one.
  """

  max_prompt_len: int = 6
  max_action_len: int = 5
  max_obs_len: int = 3
  max_turns: int = 3

  def sample_tasks(self, key, n):
    return jax.random.randint(key, (n,), 1, self.max_prompt_len + 1)

  def eval_tasks(self, n, seed):
    return self.sample_tasks(jax.random.PRNGKey(seed), n)

  def reset(self, task):
    prompt = jnp.full((self.max_prompt_len,), tokenizers.PAD, jnp.int32)
    prompt = jnp.where(jnp.arange(self.max_prompt_len) < task, 65, prompt)
    prompt = prompt.at[0].set(tokenizers.BOS)
    return EchoState(jnp.int32(0), jnp.int32(0)), prompt, task.astype(jnp.int32)

  def step(self, state, action_tokens, action_len):
    del action_tokens, action_len
    obs_len = 1 + state.turn % 3
    obs = jnp.where(jnp.arange(self.max_obs_len) < obs_len, 48 + state.turn,
                    tokenizers.PAD)
    turn = state.turn + 1
    return EchoState(turn, state.calls + 1), obs.astype(jnp.int32), obs_len, (
        turn >= self.max_turns)

  def facts(self, state):
    return {
        "correct": jnp.bool_(False),
        "answered": jnp.bool_(False),
        "format_error": jnp.bool_(False),
        "num_tool_calls": state.calls,
        "num_tool_errors": jnp.int32(0),
    }

  def expert_action(self, state, key):
    del state, key
    a = jnp.full((self.max_action_len,), tokenizers.PAD, jnp.int32)
    return a.at[0].set(66).at[1].set(tokenizers.CALL_END), jnp.int32(2)
