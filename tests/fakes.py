"""Tiny models and environments for tests."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import flax.struct
import jax
import jax.numpy as jnp
from flax import nnx

from agentic_text import tokenizers
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


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_on_8_devices(script: str) -> str:
  """Runs `script` in a fresh Python with 8 simulated CPU devices; its stdout.

  A subprocess, because the device count is fixed when JAX starts. Fails the
  calling test with the tail of stderr when the script exits non-zero.
  """
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
             JAX_PLATFORMS="cpu", PYTHONPATH=REPO)
  proc = subprocess.run([sys.executable, "-c", script], env=env, cwd=REPO,
                        capture_output=True, text=True, timeout=1800)
  assert proc.returncode == 0, proc.stderr[-4000:]
  return proc.stdout


def rl_state_and_step(config):
  """Validated config -> (RL-phase TrainState at step 0, jitted GRPO step)."""
  from agentic_rl import learner  # pylint: disable=g-import-not-at-top
  from agentic_rl import train  # pylint: disable=g-import-not-at-top
  from configs import schema  # pylint: disable=g-import-not-at-top
  config = schema.with_defaults(config)
  train.validation.validate_config(config)
  env = train.make_env(config)
  model_cfg = train.make_model_config(config)
  graphdef, state = train.init_state(config, model_cfg)
  state = train.start_rl(config, state)
  step = learner.make_rl_step(config, env, graphdef,
                              learner.make_optimizer(config.rl), model_cfg)
  return state, step
