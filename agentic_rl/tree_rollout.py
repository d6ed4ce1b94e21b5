"""Tree rollouts that branch at turn boundaries by copying KV-cache rows (PORTool).

A static tree: each of N tasks is prefilled once; before turn j (j = 0 .. d-1)
every row is copied `branching[j]` times (its tokens, roles, log-probs, env
state AND its KV-cache rows), so the copies share the prefix exactly (same
token ids, same behaviour log-probs, no recomputation) and then sample their
own turn j. After the d-th fork the episodes continue independently to the end
(the regular turn loop). Leaf rows of a task are contiguous, in lexicographic
order of their branch indices, as `credit.tree_fork_advantages` expects.

Reuses rollout.py's building blocks (`generate_turn`, `write_segment`,
`_append`, `_tree_where`) without changing that module; the turn step below
mirrors `rollout.rollout`'s turn body.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from agentic_rl import rollout
from agentic_rl import sampling
from agentic_text import tokenizers
from agentic_rl import types
from agentic_rl.models import transformer


def fork_rows(tree: Any, copies: int) -> Any:
  """Repeats every batch-major leaf's rows `copies` times (row r -> rows
  r * copies .. r * copies + copies - 1): KV cache, tokens, env state..."""
  return jax.tree.map(lambda x: jnp.repeat(x, copies, axis=0), tree)


def _turn(env, graphdef, params, state: rollout.RolloutState, key, temperature):
  """One assistant turn + env step + observation append (rollout's turn body)."""
  l = state.tokens.shape[1]
  active = ~state.done
  state, action, action_len = rollout.generate_turn(
      graphdef,
      params,
      state,
      key,
      max_action_len=env.max_action_len,
      temperature=temperature,
      stop_tokens=rollout.env_stop_tokens(env),
  )
  new_env_state, obs, obs_len, env_done = jax.vmap(env.step)(
      state.env_state, action, action_len
  )
  env_state = rollout._tree_where(active, new_env_state, state.env_state)
  facts = jax.vmap(env.facts)(env_state)
  num_turns = state.num_turns + active.astype(jnp.int32)
  full = state.length >= l
  cont = active & ~env_done & ~full
  obs_fits = state.length + obs_len <= l
  write_obs = cont & obs_fits
  obs_len = jnp.where(write_obs, obs_len, 0)
  logits, cache = sampling.extend(
      graphdef, params, state.cache, obs, state.length, obs_len
  )
  # Empty observation: keep the logits after the last sampled token.
  next_logits = jnp.where(
      (write_obs & (obs_len > 0))[:, None], logits, state.next_logits
  )
  state = rollout._append(state, obs, obs_len, write_obs, types.TOOL)
  truncated = (
      active
      & ~facts["answered"]
      & (full | (cont & ~obs_fits) | (~env_done & (state.length >= l)))
  )
  finish_now = jnp.where(
      facts["answered"],
      types.ANSWERED,
      jnp.where(
          truncated,
          types.TRUNCATED,
          jnp.where(facts["format_error"], types.FORMAT_ERROR, types.MAX_TURNS),
      ),
  )
  ended = active & (env_done | truncated)
  return state.replace(
      done=state.done | ended,
      finish=jnp.where(ended, finish_now, state.finish),
      num_turns=num_turns,
      env_state=env_state,
      cache=cache,
      next_logits=next_logits,
  )


def tree_rollout(
    env,
    tasks: Any,
    key: jax.Array,
    *,
    max_len: int,
    branching: tuple[int, ...],
    graphdef: nnx.GraphDef,
    params: Any,
    model_config: transformer.TransformerConfig,
    temperature: float | jax.Array = 1.0,
) -> types.Trajectory:
  """Rolls out a tree of episodes per task (PORTool, docs/papers.md).

  Args:
    env: a JAX-native environment.
    tasks: task pytree with leading dim N.
    key: PRNG key.
    max_len: L (static).
    branching: (b_1, .., b_d), fork sizes before turns 0 .. d-1 (static, >= 1).
    graphdef, params, model_config: the policy.
    temperature: sampling temperature.

  Returns:
    Trajectory of N * prod(branching) rows; rows n * G .. n * G + G - 1 are
    task n's leaves (group = n).

  Raises:
    ValueError: empty branching or a fork size < 1; stop ids that do not fit
      the model's vocabulary (`rollout.check_stop_tokens`).
  """
  if not branching or any(b < 1 for b in branching):
    raise ValueError(f"branching={branching!r}: need fork sizes >= 1")
  rollout.check_stop_tokens(rollout.env_stop_tokens(env), env, model_config)
  n = jax.tree.leaves(tasks)[0].shape[0]
  l = max_len
  env_state, prompt, prompt_len = jax.vmap(env.reset)(tasks)
  prompt_len = jnp.minimum(prompt_len, l)
  zeros = jnp.zeros((n,), jnp.int32)
  all_rows = jnp.ones((n,), bool)
  tokens = rollout.write_segment(
      jnp.full((n, l), tokenizers.PAD, jnp.int32),
      zeros,
      prompt,
      prompt_len,
      all_rows,
  )
  role = rollout.write_segment(
      jnp.full((n, l), types.PAD, jnp.int8),
      zeros,
      jnp.full(prompt.shape, types.PROMPT),
      prompt_len,
      all_rows,
  )
  cache = transformer.init_cache(model_config, n, l)
  next_logits, cache = sampling.extend(
      graphdef, params, cache, prompt[:, :l], zeros, prompt_len
  )
  state = rollout.RolloutState(
      tokens=tokens,
      role=role,
      logprob=jnp.zeros((n, l), jnp.float32),
      turn=jnp.full((n, l), -1, jnp.int32),
      length=prompt_len,
      done=prompt_len >= l,
      finish=jnp.where(prompt_len >= l, types.TRUNCATED, types.RUNNING),
      num_turns=zeros,
      env_state=env_state,
      cache=cache,
      next_logits=next_logits,
  )
  for j, b in enumerate(branching):
    state = fork_rows(state, b)  # copies the KV-cache rows with the prefix
    state = _turn(
        env, graphdef, params, state, jax.random.fold_in(key, j), temperature
    )

  def body(carry):
    state, key = carry
    key, sub = jax.random.split(key)
    return _turn(env, graphdef, params, state, sub, temperature), key

  state, _ = jax.lax.while_loop(
      lambda c: jnp.any(~c[0].done),
      body,
      (state, jax.random.fold_in(key, len(branching))),
  )
  g = math.prod(branching)
  return types.Trajectory(
      tokens=state.tokens,
      role=state.role,
      logprob=state.logprob,
      turn=state.turn,
      length=state.length,
      num_turns=state.num_turns,
      finish=state.finish,
      group=jnp.repeat(jnp.arange(n, dtype=jnp.int32), g),
      facts=jax.vmap(env.facts)(state.env_state),
  )
