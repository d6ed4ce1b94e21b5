"""Host rollout driver: a Python loop over turns for environments whose tools run in
Python (docs/design.md; environments/host/base.py).

Each turn calls the very same jitted pieces as the JAX-native engine
(agentic_rl/rollout.py): `init_state` (prompt write + prefill), `generate_turn`
(KV-cache decode loop, stop tokens, behaviour log-probs) and `end_turn`
(observation write + one chunked prefill, finish bookkeeping). Between them the
host decodes each active row's sampled turn with the environment's tokenizer (for
the environment's parser only; cut to base.MAX_TURN_CHARS characters), calls
`env.step` (or `env.step_batch`, which may run the tools concurrently) through
`environments.host.base.guarded_step_batch`: a step that raises or passes its
time limit (`env.step_timeout_s`) becomes a tool-error observation and is
counted in the facts 'num_tool_exceptions' / 'num_tool_timeouts' [B] int32
(added to the environment's own counts of these when it reports them), and the
run goes on. Observations longer than O ids are cut, then padded to [B, O]. The trajectory
keeps the sampled token ids and their log-probs exactly as generated: nothing is
re-tokenised. The result is the same `Trajectory` type; its facts are numpy
arrays stacked from `env.facts` ([B] per-episode, [B, K] per-turn).

Compiled programs are cached by jax.jit on (graphdef, shapes, static sizes), so
every call with the same shapes reuses them (temperature is traced).

Chat checkpoints (an environment whose `chat_format` is an
agentic_text.chat.ChatFormat, i.e. built with an HF tokenizer): turns stop on the
checkpoint's stop ids (`chat_format.stop_tokens`), sampled turns are decoded
with `chat_format.decode` (stop ids dropped), and each observation is preceded
by `chat_format.close_turn(sampled ids)` (the newline after `<|im_end|>`, or a
TEMPLATE `<|im_end|>` first when the sample was cut), so the buffer holds
exactly the template's render of the conversation around the sampled ids.
Environments may return (ids, roles) instead of ids from `reset` / `step`; the
roles (e.g. TEMPLATE for scaffolding) then replace the driver's default PROMPT
/ TOOL roles in the trajectory.
"""

from __future__ import annotations

import collections.abc
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from flax import nnx

from agentic_rl import rollout as rollout_lib
from agentic_rl import sharding
from agentic_text import tokenizers
from agentic_rl import types
from agentic_rl.models import transformer
from environments.host import base as host_base

init_state_jit = jax.jit(
    rollout_lib.init_state,
    static_argnames=("max_len", "graphdef", "model_config"),
)
# The rollout state (with its KV cache: 2.2 GB for SmolLM2 at 100 rows x 480
# positions in float32) is donated to every step: the driver never reads a
# state it has passed on, so XLA updates the buffers in place instead of
# holding a second copy of the cache.
generate_turn_jit = jax.jit(
    rollout_lib.generate_turn,
    static_argnames=("graphdef", "max_action_len", "stop_tokens"),
    donate_argnames=("state",),
)
end_turn_jit = jax.jit(
    rollout_lib.end_turn,
    static_argnames=("graphdef",),
    donate_argnames=("state",),
)
append_jit = jax.jit(
    rollout_lib._append,
    static_argnames=("role",),  # noqa: SLF001
    donate_argnames=("state",),
)


@jax.jit
def _overlay_roles(role_bl, start_b, roles_bs, len_b):
  """Writes per-token roles `roles_bs[b, :len_b[b]]` at `start_b[b]`."""
  return rollout_lib.write_segment(role_bl, start_b, roles_bs, len_b, len_b > 0)


def _split(x) -> tuple[np.ndarray, np.ndarray | None]:
  """An environment's ids, or (ids, roles) pair -> (ids, roles or None)."""
  if isinstance(x, tuple):
    return np.asarray(x[0], np.int32).reshape(-1), np.asarray(
        x[1], np.int8
    ).reshape(-1)
  return np.asarray(x, np.int32).reshape(-1), None


def numpy_rng(key: jax.Array) -> np.random.Generator:
  """A numpy Generator seeded by a JAX PRNG key (raw uint32 or typed)."""
  if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    key = jax.random.key_data(key)
  return np.random.default_rng(np.asarray(key, np.uint64).reshape(-1).tolist())


def _pad_rows(
    rows: Sequence[np.ndarray], width: int
) -> tuple[np.ndarray, np.ndarray]:
  """[B, width] int32 PAD-padded array (rows cut to width) and [B] int32 lengths."""
  out = np.full((len(rows), width), tokenizers.PAD, np.int32)
  lens = np.zeros((len(rows),), np.int32)
  for i, r in enumerate(rows):
    r = np.asarray(r, np.int32).reshape(-1)[:width]
    out[i, : len(r)] = r
    lens[i] = len(r)
  return out, lens


class RepeatedTasks(collections.abc.Sequence):
  """Each of `tasks` repeated k times in a row (a GRPO group's rows), without
  touching a task before its row is accessed (tasks may be read lazily,
  agentic_rl/datasets/tasks.py). Slicing gives a list."""

  def __init__(self, tasks: Sequence[Any], k: int):
    self._tasks, self._k = tasks, k

  def __len__(self) -> int:
    return len(self._tasks) * self._k

  def __getitem__(self, i):
    if isinstance(i, slice):
      return [self[j] for j in range(*i.indices(len(self)))]
    if not -len(self) <= i < len(self):
      raise IndexError(i)
    return self._tasks[(i % len(self)) // self._k]


def stack_facts(facts: Sequence[dict[str, Any]]) -> dict[str, np.ndarray]:
  """Stacks per-episode fact dicts into {name: [B, ...] array}.

  Raises:
    ValueError: the rows do not share keys (an environment bug).
  """
  keys = set(facts[0])
  for f in facts[1:]:
    if set(f) != keys:
      raise ValueError(
          f"env.facts keys differ between episodes: {sorted(keys)} vs "
          f"{sorted(f)}"
      )
  return {k: np.stack([np.asarray(f[k]) for f in facts]) for k in sorted(keys)}


def rollout(
    env,
    tasks: Sequence[Any],
    key: jax.Array,
    *,
    max_len: int,
    group: np.ndarray | jax.Array | None = None,
    graphdef: nnx.GraphDef | None = None,
    params: Any = None,
    model_config: transformer.TransformerConfig | None = None,
    temperature: float | jax.Array = 1.0,
) -> types.Trajectory:
  """Runs a batch of host-environment episodes to completion.

  With (graphdef, params, model_config) the policy samples every turn; with
  graphdef None the environment's expert acts (SFT demonstrations: role POLICY,
  log-prob 0), as in `rollout.rollout`.

  Args:
    env: a host environment (`is_host = True`; environments/host/base.py).
    tasks: B tasks (from env.sample_tasks / env.eval_tasks).
    key: PRNG key for sampling (and, via numpy, the expert's randomness).
    max_len: L, the buffer length. Episodes that do not fit end TRUNCATED.
    group: [B] int32 GRPO group of each episode (default arange(B)).
    graphdef, params, model_config: the policy.
    temperature: sampling temperature (0 = greedy); traced, so greedy and
      sampled decoding share one compiled program.

  Of a multi-process run (ambient mesh over several processes), each process
  resets and steps only its own rows `sharding.process_rows(B)` of the
  batch-sharded global batch (every process passes the same B tasks): it reads
  its rows of each sampled turn from its own shards and builds the global
  observations, prompts and flags with `sharding.global_batch`, so the policy
  decodes the global batch in one program and no process runs another's
  tools. The facts are then global [B, ...] jax arrays, not numpy. The
  expert's numpy randomness (graphdef None) is drawn per process, so SFT
  demonstrations differ from a one-process run's (same distribution).

  Returns:
    Trajectory with [B, L] token arrays (jax) and numpy facts (global jax
    arrays on several processes).
  """
  b = len(tasks)
  lo, hi = sharding.process_rows(b)
  split = (lo, hi) != (0, b)  # this process holds part of the batch
  n = hi - lo
  to_global = lambda x: jnp.asarray(sharding.global_batch(x, b))
  use_model = graphdef is not None
  tokenizer = env.tokenizer
  fmt = getattr(env, "chat_format", None)
  stop_tokens = rollout_lib.env_stop_tokens(env)  # as the JAX-native rollout
  decode = fmt.decode if fmt is not None else tokenizer.decode
  resets = [env.reset(t) for t in tasks[lo:hi]]
  host_states = [r[0] for r in resets]
  prompts = [_split(r[1]) for r in resets]
  prompt, prompt_len = _pad_rows([p[0] for p in prompts], env.max_prompt_len)
  state = init_state_jit(
      to_global(prompt),
      to_global(prompt_len),
      None,
      max_len=max_len,
      graphdef=graphdef,
      params=params,
      model_config=model_config,
  )
  if sharding.any_process(any(p[1] is not None for p in prompts)):
    roles = [
        p[1] if p[1] is not None else np.full(len(p[0]), types.PROMPT, np.int8)
        for p in prompts
    ]
    role_pad, _ = _pad_rows(roles, env.max_prompt_len)
    state = state.replace(
        role=_overlay_roles(
            state.role,
            jnp.zeros((b,), jnp.int32),
            to_global(role_pad.astype(np.int8)),
            jnp.minimum(to_global(prompt_len), max_len),
        )
    )
  temperature = jnp.float32(temperature)
  expert_key = jax.random.fold_in(key, 7)
  if split:  # each process draws for its own rows
    expert_key = jax.random.fold_in(expert_key, lo)
  expert_rng = None if use_model else numpy_rng(expert_key)
  a_len, o_len = env.max_action_len, env.max_obs_len
  tool_exceptions = np.zeros((n,), np.int32)
  tool_timeouts = np.zeros((n,), np.int32)
  num_steps = 0  # env steps run by this process
  for _ in range(env.max_turns):
    if split:
      if bool(jnp.all(state.done)):  # every process's rows
        break
      done = sharding.local_rows(state.done, lo, hi)
    else:
      done = np.asarray(state.done)
      if done.all():
        break
    active = ~done
    key, sub = jax.random.split(key)
    if use_model:
      state, action, action_len = generate_turn_jit(
          graphdef,
          params,
          state,
          sub,
          max_action_len=a_len,
          temperature=temperature,
          stop_tokens=stop_tokens,
      )
      action, action_len = sharding.local_rows((action, action_len), lo, hi)
    else:
      rows = [
          env.expert_action(s, expert_rng) if a else np.zeros((0,), np.int32)
          for s, a in zip(host_states, active)
      ]
      action, action_len = _pad_rows(rows, a_len)
      action_len = np.where(active, action_len, 0).astype(np.int32)
      state = append_jit(
          state,
          to_global(action),
          to_global(action_len),
          to_global(active),
          role=types.POLICY,
      )
    idx = np.flatnonzero(active)
    texts = [
        decode(action[i, : action_len[i]])[: host_base.MAX_TURN_CHARS]
        for i in idx
    ]
    results, exc, tmo = host_base.guarded_step_batch(
        env, [host_states[i] for i in idx], texts
    )
    num_steps += len(idx)
    tool_exceptions[idx] += exc
    tool_timeouts[idx] += tmo
    obs_rows = [np.zeros((0,), np.int32)] * n
    role_rows = [np.zeros((0,), np.int8)] * n
    env_done = np.zeros((n,), bool)
    for i, (s, obs_x, d) in zip(idx, results):
      host_states[i] = s
      obs_ids, obs_roles = _split(obs_x)
      obs_ids = obs_ids[:o_len]  # output-size limit, before any concatenation
      obs_roles = None if obs_roles is None else obs_roles[:o_len]
      if obs_roles is None:
        obs_roles = np.full(len(obs_ids), types.TOOL, np.int8)
      if fmt is not None and len(obs_ids):
        close_ids, close_roles = fmt.close_turn(action[i, : action_len[i]])
        obs_ids = np.concatenate([close_ids, obs_ids])
        obs_roles = np.concatenate([close_roles, obs_roles])
      obs_rows[i] = obs_ids
      role_rows[i] = obs_roles
      env_done[i] = bool(d)
    obs, obs_len = _pad_rows(obs_rows, o_len)
    obs_roles_pad, _ = _pad_rows(role_rows, o_len)
    length_before = jnp.copy(state.length)  # state is donated to end_turn_jit
    facts = [env.facts(s) for s in host_states]
    answered = np.array([bool(f["answered"]) for f in facts])
    format_error = np.array([bool(f["format_error"]) for f in facts])
    state = end_turn_jit(
        state,
        to_global(active),
        to_global(env_done),
        to_global(answered),
        to_global(format_error),
        to_global(obs),
        to_global(obs_len),
        graphdef=graphdef,
        params=params,
    )
    if fmt is not None or sharding.any_process(
        any(len(r) and (r != types.TOOL).any() for r in role_rows)
    ):
      state = state.replace(
          role=_overlay_roles(
              state.role,
              length_before,
              to_global(obs_roles_pad.astype(np.int8)),
              state.length - length_before,
          )
      )
  # An environment that did not end its episodes within max_turns: MAX_TURNS.
  done, finish = sharding.local_rows((state.done, state.finish), lo, hi)
  finish = np.where(~done, types.MAX_TURNS, finish).astype(np.int32)
  group = (
      np.arange(b, dtype=np.int32)
      if group is None
      else np.asarray(group, np.int32)
  )[lo:hi]
  facts = stack_facts([env.facts(s) for s in host_states])
  for name, counts in (
      ("num_tool_exceptions", tool_exceptions),
      ("num_tool_timeouts", tool_timeouts),
  ):
    facts[name] = (np.asarray(facts.get(name, 0), np.int32) + counts).astype(
        np.int32
    )
  if split:
    logging.info(
        "host rollout: process %d stepped rows [%d, %d) of %d (%d env steps)",
        jax.process_index(),
        lo,
        hi,
        b,
        num_steps,
    )
    facts = sharding.global_batch(facts, b)
  return types.Trajectory(
      tokens=state.tokens,
      role=state.role,
      logprob=state.logprob,
      turn=state.turn,
      length=state.length,
      num_turns=state.num_turns,
      finish=to_global(finish),
      group=to_global(group),
      facts=facts,
  )
