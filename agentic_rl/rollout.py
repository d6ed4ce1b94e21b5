"""Multi-turn episode engine for JAX-native environments (docs/design.md).

(`init_state`, `generate_turn` and `end_turn` are also the building blocks of the
host driver, agentic_rl/host_rollout.py.)

Turn-synchronous: `generate_turn` (a `lax.while_loop` over decode steps with a KV
cache, stopping each row at a stop token) -> `env.step` (vmapped) -> the observation
is written into the sequence and prefilled into the cache in one chunk. The turn loop
is itself a `lax.while_loop`, so a whole episode batch is one XLA program.

Every token is written exactly once, in place, at its final position: sampled tokens
are never decoded and re-encoded, and the trainer sees the very ids (and positions)
the sampler produced. Roles come from who wrote a token, never from token values.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
from flax import nnx

from agentic_rl import sampling
from agentic_rl import sharding
from agentic_text import tokenizers
from agentic_rl import types
from agentic_rl.models import transformer


@flax.struct.dataclass
class RolloutState:
  """Carry of the episode loop (batch of B rows, buffer of L tokens)."""

  tokens: jax.Array  # [B, L] int32
  role: jax.Array  # [B, L] int8
  logprob: jax.Array  # [B, L] float32
  turn: jax.Array  # [B, L] int32
  length: jax.Array  # [B] int32, tokens written so far
  done: jax.Array  # [B] bool
  finish: jax.Array  # [B] int32
  num_turns: jax.Array  # [B] int32
  env_state: Any
  cache: Any  # KV cache or None (expert rollouts)
  next_logits: Any  # [B, V] float32 or None (expert rollouts)


def write_segment(
    buf_bl: jax.Array,
    start_b: jax.Array,
    seg_bs: jax.Array,
    seg_len_b: jax.Array,
    write_b: jax.Array,
) -> jax.Array:
  """Writes row b's `seg_bs[b, :seg_len_b[b]]` at `buf_bl[b, start_b[b]:]`.

  Only rows with `write_b` set are written; positions past L are dropped.

  Args:
    buf_bl: [B, L] buffer.
    start_b: [B] int32 start positions.
    seg_bs: [B, S] values (same dtype as buf, or broadcastable scalars per row).
    seg_len_b: [B] int32 number of valid entries per row.
    write_b: [B] bool.

  Returns:
    The updated [B, L] buffer.
  """
  b, s = seg_bs.shape
  pos_bs = start_b[:, None] + jnp.arange(s, dtype=jnp.int32)[None, :]
  valid_bs = (jnp.arange(s)[None, :] < seg_len_b[:, None]) & write_b[:, None]
  # Invalid entries are sent out of bounds and dropped.
  pos_bs = jnp.where(valid_bs, pos_bs, buf_bl.shape[1])
  # One scatter per row (vmapped), which a mesh splitting rows partitions
  # without moving rows (tests/test_decode_mesh.py).
  return jax.vmap(
      lambda buf_l, pos_s, seg_s: buf_l.at[pos_s].set(seg_s, mode="drop")
  )(buf_bl, pos_bs, seg_bs.astype(buf_bl.dtype))


def _tree_where(mask_b: jax.Array, new: Any, old: Any) -> Any:
  def pick(n, o):
    m = mask_b.reshape(mask_b.shape + (1,) * (n.ndim - 1))
    return jnp.where(m, n, o)

  return jax.tree.map(pick, new, old)


def generate_turn(
    graphdef: nnx.GraphDef,
    params: Any,
    state: RolloutState,
    key: jax.Array,
    *,
    max_action_len: int,
    temperature: float | jax.Array,
    stop_tokens: tuple[int, ...],
    banned_b: jax.Array | None = None,
    banned_tokens: tuple[int, ...] = (),
    cache_prefix: transformer.CachePrefix | None = None,
) -> tuple[RolloutState, jax.Array, jax.Array]:
  """Samples one assistant turn for every row that is not done.

  Each active row samples from `state.next_logits`, writes the token (role POLICY,
  its behaviour log-prob, the current turn index) at its own position, feeds it
  through the model with the KV cache, and stops after a stop token, after
  `max_action_len` tokens, or when the buffer is full. `stop_tokens` are the
  ids that end a turn in the policy's vocabulary (`env_stop_tokens`); there is
  no default, since the byte tokenizer's stop ids are ordinary tokens of an
  imported checkpoint's vocabulary.

  Per-episode logit mask (dual-path groups, `mask_logits`): rows with
  `banned_b` set never sample a token of `banned_tokens` (their logits are
  set to -1e9 before sampling), and their recorded behaviour log-prob is that
  of the masked distribution actually sampled from. `banned_b` is an array
  (any per-row pattern, one compiled program); `banned_tokens` is static.

  `cache_prefix` (optional `transformer.CachePrefix`): the cache's first
  entries are each group's shared prompt, read once per group by every
  decode step (`sampling.extend`).

  Returns:
    (state, action_tokens [B, A] int32 padded with PAD, action_len [B] int32).
  """
  b, l = state.tokens.shape
  active0 = ~state.done
  turn_idx = state.num_turns
  stop = jnp.asarray(stop_tokens, jnp.int32)

  def cond(carry):
    _, _, _, active, t, _ = carry
    return jnp.any(active) & (t < max_action_len)

  def body(carry):
    st, action, action_len, active, t, key = carry
    key, sub = jax.random.split(key)
    logits_bv = st.next_logits
    if banned_b is not None and banned_tokens:
      logits_bv = mask_logits(logits_bv, banned_b, banned_tokens)
    tok_b, logp_b = sampling.sample_token(sub, logits_bv, temperature)
    one = jnp.ones((b, 1), jnp.int32)
    tokens = write_segment(
        st.tokens, st.length, tok_b[:, None], one[:, 0], active
    )
    role = write_segment(
        st.role, st.length, jnp.full((b, 1), types.POLICY), one[:, 0], active
    )
    logprob = write_segment(
        st.logprob, st.length, logp_b[:, None], one[:, 0], active
    )
    turn = write_segment(
        st.turn, st.length, turn_idx[:, None], one[:, 0], active
    )
    action = action.at[:, t].set(jnp.where(active, tok_b, tokenizers.PAD))
    # Inactive rows pass length 0: their (ignored) logits do not widen the
    # cache prefix the step reads (length buckets, sampling.extend).
    logits, cache = sampling.extend(
        graphdef,
        params,
        st.cache,
        tok_b[:, None],
        st.length,
        active.astype(jnp.int32),
        cache_prefix=cache_prefix,
    )
    next_logits = jnp.where(active[:, None], logits, st.next_logits)
    length = st.length + active.astype(jnp.int32)
    action_len = action_len + active.astype(jnp.int32)
    is_stop = jnp.any(tok_b[:, None] == stop[None, :], axis=-1)
    st = st.replace(
        tokens=tokens,
        role=role,
        logprob=logprob,
        turn=turn,
        length=length,
        cache=cache,
        next_logits=next_logits,
    )
    active = active & ~is_stop & (length < l)
    return st, action, action_len, active, t + 1, key

  action = jnp.full((b, max_action_len), tokenizers.PAD, jnp.int32)
  action_len = jnp.zeros((b,), jnp.int32)
  carry = (state, action, action_len, active0, jnp.int32(0), key)
  state, action, action_len, _, _, _ = jax.lax.while_loop(cond, body, carry)
  return state, action, action_len


# Logit given to banned tokens: exp(-1e9 - max) is exactly 0 in float32, and
# unlike -inf it never produces inf - inf = nan (e.g. in an entropy).
BANNED_LOGIT = -1e9


def mask_logits(
    logits_bv: jax.Array, banned_b: jax.Array, banned_tokens: tuple[int, ...]
) -> jax.Array:
  """Per-row logit mask: logits of `banned_tokens` set to BANNED_LOGIT where
  `banned_b` is True.

  Used for dual-path groups (AKBE / EAPO, docs/papers.md): rows
  sampled with tool calls disabled ban the environment's tool-call opening
  token(s), so the sampled distribution is the policy renormalised over the
  remaining tokens (log-probs of the masked distribution: log p(v) -
  log(1 - sum_{banned} p)).

  Args:
    logits_bv: [B, V] float logits.
    banned_b: [B] bool, rows whose banned tokens are masked.
    banned_tokens: static tuple of token ids in [0, V).

  Returns:
    [B, V] logits (same dtype).
  """
  ids = jnp.asarray(banned_tokens, jnp.int32)
  cols_bn = logits_bv[:, ids]
  new_bn = jnp.where(
      jnp.asarray(banned_b, bool)[:, None],
      jnp.asarray(BANNED_LOGIT, logits_bv.dtype),
      cols_bn,
  )
  return logits_bv.at[:, ids].set(new_bn)


def env_stop_tokens(env) -> tuple[int, ...]:
  """The token ids that end an assistant turn in `env`'s token format.

  In order: the chat format's stop ids (`env.chat_format.stop_tokens`, an HF
  checkpoint's `<|im_end|>` and end-of-text ids), ids the environment declares
  (`env.stop_tokens`), the end-of-sequence ids of its tokenizer
  (`env.tokenizer.eos_ids`), else the byte tokenizer's
  `tokenizers.STOP_TOKENS` (</call>, </answer>, <eos>), the format every
  JAX-native environment here parses.
  """
  fmt = getattr(env, "chat_format", None)
  if fmt is not None:
    return tuple(int(t) for t in fmt.stop_tokens)
  declared = getattr(env, "stop_tokens", None)
  if declared is not None:
    return tuple(int(t) for t in declared)
  eos = getattr(getattr(env, "tokenizer", None), "eos_ids", None)
  if eos:
    return tuple(int(t) for t in eos)
  return tokenizers.STOP_TOKENS


def check_stop_tokens(
    stop_tokens: tuple[int, ...],
    env,
    model_config: transformer.TransformerConfig | None,
) -> None:
  """Refuses byte-tokenizer stop ids for a model with another vocabulary.

  Raises:
    ValueError: `stop_tokens` are the byte defaults while the model's
      vocab_size is not the byte tokenizer's (e.g. an imported checkpoint),
      where those ids are ordinary tokens; or a stop id is outside the
      vocabulary.
  """
  if model_config is None:
    return
  v = model_config.vocab_size
  if (
      tuple(stop_tokens) == tokenizers.STOP_TOKENS
      and v != tokenizers.VOCAB_SIZE
  ):
    raise ValueError(
        f"model.vocab_size={v}: {type(env).__name__} gives no stop ids of its "
        f"own (chat_format, stop_tokens or tokenizer.eos_ids), and the byte "
        f"tokenizer's {tokenizers.STOP_TOKENS} are ordinary tokens of a "
        f"{v}-token vocabulary"
    )
  bad = [t for t in stop_tokens if not 0 <= t < v]
  if bad:
    raise ValueError(
        f"stop_tokens={tuple(stop_tokens)}: {bad} outside the "
        f"model's vocabulary (vocab_size={v})"
    )


def tool_call_tokens(env) -> tuple[int, ...]:
  """The token ids that open a tool call in `env`: `env.tool_call_tokens` if
  the environment declares it, else (tokenizers.CALL,), the call-opening token
  of every JAX-native environment here (a turn is a call iff it starts with
  CALL). Banning them disables tool calls (and any other CALL-framed action,
  e.g. clarification's `ask`)."""
  return tuple(
      int(t) for t in getattr(env, "tool_call_tokens", (tokenizers.CALL,))
  )


def _append(
    state: RolloutState,
    seg_bs: jax.Array,
    seg_len_b: jax.Array,
    write_b: jax.Array,
    role: int,
) -> RolloutState:
  """Writes a segment (one expert turn or one observation) at each row's end.

  Its tokens get `role` and the row's current turn index; `length` advances by
  the written length (capped at L). The log-prob stays 0 (not sampled).
  """
  seg_len_b = jnp.where(write_b, seg_len_b, 0)
  shape = seg_bs.shape
  return state.replace(
      tokens=write_segment(
          state.tokens, state.length, seg_bs, seg_len_b, write_b
      ),
      role=write_segment(
          state.role, state.length, jnp.full(shape, role), seg_len_b, write_b
      ),
      turn=write_segment(
          state.turn,
          state.length,
          jnp.broadcast_to(state.num_turns[:, None], shape),
          seg_len_b,
          write_b,
      ),
      length=jnp.minimum(state.length + seg_len_b, state.tokens.shape[1]),
  )


def _expert_turn(env, state: RolloutState, key: jax.Array):
  """Writes the environment expert's next turn (role POLICY, log-prob 0)."""
  b = state.tokens.shape[0]
  keys = jax.random.split(key, b)
  action, action_len = jax.vmap(env.expert_action)(state.env_state, keys)
  active = ~state.done
  action_len = jnp.where(active, action_len, 0)
  state = _append(state, action, action_len, active, types.POLICY)
  return state, action, action_len


def init_state(
    prompt: jax.Array,
    prompt_len: jax.Array,
    env_state: Any,
    *,
    max_len: int,
    graphdef: nnx.GraphDef | None = None,
    params: Any = None,
    model_config: transformer.TransformerConfig | None = None,
    shared_prefix: transformer.SharedPrefix | None = None,
) -> RolloutState:
  """The loop's initial carry: prompts written (role PROMPT) and prefilled.

  Shared by the JAX-native and the host driver (agentic_rl/host_rollout.py).

  Args:
    prompt: [B, P] int32 prompts padded with PAD.
    prompt_len: [B] int32; rows with prompt_len >= max_len start TRUNCATED.
    env_state: the environment's batched state (None for host environments).
    max_len: L, the buffer length (static).
    graphdef, params, model_config: the policy; graphdef None for expert
      rollouts (no cache, no logits).
    shared_prefix: optional `transformer.SharedPrefix`: rows come in groups
      of `group` whose prompts agree on their first `length` tokens (and are
      at least that long); those positions are prefilled for the first row of
      each group and their cache entries copied to the group's rows, the rest
      of each prompt prefilled per row. Same cache and logits up to float
      summation order; rows that break the assumption get their group's
      first row's prefix (not checked here).

  Returns:
    RolloutState with B rows of L tokens.
  """
  b = prompt.shape[0]
  l = max_len
  prompt_len = jnp.minimum(prompt_len, l)
  zeros_b = jnp.zeros((b,), jnp.int32)
  all_b = jnp.ones((b,), bool)
  tokens = write_segment(
      jnp.full((b, l), tokenizers.PAD, jnp.int32),
      zeros_b,
      prompt,
      prompt_len,
      all_b,
  )
  role = write_segment(
      jnp.full((b, l), types.PAD, jnp.int8),
      zeros_b,
      jnp.full(prompt.shape, types.PROMPT),
      prompt_len,
      all_b,
  )
  if graphdef is not None:
    # Sharded from the start on a mesh (sharding.cache_spec); no-op without one.
    if shared_prefix is not None and min(shared_prefix.length, l) > 0:
      next_logits, cache = _shared_prefill(
          graphdef,
          params,
          model_config,
          prompt[:, :l],
          prompt_len,
          shared_prefix,
          l,
      )
    else:
      cache = sharding.constrain_cache(
          transformer.init_cache(model_config, b, l)
      )
      next_logits, cache = sampling.extend(
          graphdef, params, cache, prompt[:, :l], zeros_b, prompt_len
      )
  else:
    cache, next_logits = None, None
  return RolloutState(
      tokens=tokens,
      role=role,
      logprob=jnp.zeros((b, l), jnp.float32),
      turn=jnp.full((b, l), -1, jnp.int32),
      length=prompt_len,
      done=prompt_len >= l,
      finish=jnp.where(prompt_len >= l, types.TRUNCATED, types.RUNNING),
      num_turns=zeros_b,
      env_state=env_state,
      cache=cache,
      next_logits=next_logits,
  )


def _shared_prefill(
    graphdef, params, model_config, prompt, prompt_len, shared_prefix, l
):
  """`init_state`'s prefill with a shared prefix: (next_logits [B, V], cache)."""
  b, p = prompt.shape
  g = shared_prefix.group
  if b % g:
    raise ValueError(
        f"shared_prefix: group {g} must divide the batch ({b} rows)"
    )
  s = min(shared_prefix.length, p)
  n = b // g
  cache_n = transformer.init_cache(model_config, n, l)
  logits_n, cache_n = sampling.extend(
      graphdef,
      params,
      cache_n,
      prompt[::g, :s],
      jnp.zeros((n,), jnp.int32),
      jnp.minimum(prompt_len[::g], s),
  )
  repeat = lambda x: jnp.repeat(x, g, axis=0)
  cache = sharding.constrain_cache(jax.tree.map(repeat, cache_n))
  next_logits = repeat(logits_n)
  if p > s:
    rest_b = jnp.maximum(prompt_len - s, 0)
    logits_b, cache = sampling.extend(
        graphdef,
        params,
        cache,
        prompt[:, s:],
        jnp.full((b,), s, jnp.int32),
        rest_b,
    )
    next_logits = jnp.where((rest_b > 0)[:, None], logits_b, next_logits)
  return next_logits, cache


def _cache_prefix(
    state: RolloutState,
    shared_prefix: transformer.SharedPrefix | None,
    prompt_width: int,
) -> transformer.CachePrefix | None:
  """The decode's view of `init_state`'s shared prefill (None without one).

  `init_state` prefilled each group's first s = min(length, prompt width,
  L) positions once and copied them to the group's rows; they stay shared
  while no row writes below s, i.e. when every row's prompt has at least s
  tokens (a shorter prompt's own later tokens sit below s). That flag is
  traced: `state` is the carry right after `init_state`.
  """
  if state.cache is None or shared_prefix is None:
    return None
  s = min(shared_prefix.length, prompt_width, state.tokens.shape[1])
  if s <= 0:
    return None
  return transformer.CachePrefix(
      length=s,
      group=shared_prefix.group,
      shared=jnp.all(state.length >= s),
  )


def end_turn(
    state: RolloutState,
    active: jax.Array,
    env_done: jax.Array,
    answered: jax.Array,
    format_error: jax.Array,
    obs: jax.Array,
    obs_len: jax.Array,
    *,
    graphdef: nnx.GraphDef | None = None,
    params: Any = None,
    cache_prefix: transformer.CachePrefix | None = None,
) -> RolloutState:
  """Closes a turn after the environment stepped: appends observations, ends rows.

  Counts the turn for rows that were active, writes each continuing row's
  observation (role TOOL) and prefills it into the KV cache in one chunk (when
  a policy is given), and marks rows done with their finish reason (ANSWERED,
  TRUNCATED, FORMAT_ERROR or MAX_TURNS). Shared by the JAX-native and the host
  driver; `state.env_state` is left as is.

  Args:
    state: the carry after `generate_turn` (or an expert turn).
    active: [B] bool, rows that took this turn.
    env_done, answered, format_error: [B] bool from the environment's step/facts.
    obs: [B, O] int32 observations padded with PAD; obs_len [B] int32.
    graphdef, params: the policy (None for expert rollouts).
    cache_prefix: optional `transformer.CachePrefix` for the observation's
      prefill (`sampling.extend`).

  Returns:
    The updated RolloutState.
  """
  l = state.tokens.shape[1]
  num_turns = state.num_turns + active.astype(jnp.int32)
  full = state.length >= l
  cont = active & ~env_done & ~full
  obs_fits = state.length + obs_len <= l
  write_obs = cont & obs_fits
  obs_len = jnp.where(write_obs, obs_len, 0)
  cache, next_logits = state.cache, state.next_logits
  if graphdef is not None:
    logits, cache = sampling.extend(
        graphdef,
        params,
        cache,
        obs,
        state.length,
        obs_len,
        cache_prefix=cache_prefix,
    )
    # An empty observation leaves the context as it is: the next turn starts
    # from the logits after the last sampled token, not from `extend`'s
    # (meaningless) logits of a length-0 chunk.
    next_logits = jnp.where(
        (write_obs & (obs_len > 0))[:, None], logits, next_logits
    )
  state = _append(state, obs, obs_len, write_obs, types.TOOL)
  length = state.length
  # A row whose buffer filled up (during its action, or with no room for the
  # observation or a next turn) is TRUNCATED unless it had just answered.
  truncated = (
      active
      & ~answered
      & (full | (cont & ~obs_fits) | (~env_done & (length >= l)))
  )
  finish_now = jnp.where(
      answered,
      types.ANSWERED,
      jnp.where(
          truncated,
          types.TRUNCATED,
          jnp.where(format_error, types.FORMAT_ERROR, types.MAX_TURNS),
      ),
  )
  ended = active & (env_done | truncated)
  return state.replace(
      done=state.done | ended,
      finish=jnp.where(ended, finish_now, state.finish),
      num_turns=num_turns,
      cache=cache,
      next_logits=next_logits,
  )


def initial_state(
    env,
    tasks: Any,
    *,
    max_len: int,
    graphdef: nnx.GraphDef | None = None,
    params: Any = None,
    model_config: transformer.TransformerConfig | None = None,
    shared_prefix: transformer.SharedPrefix | None = None,
) -> RolloutState:
  """`rollout`'s initial carry for `tasks`: the environments reset, the
  prompts written and prefilled through the policy (`init_state`).

  `rollout(env, tasks, ..., init=initial_state(env, tasks, ...))` runs from
  it instead of building it again: passes over the same tasks with the same
  policy and buffer length (evaluation's greedy and sampled passes) prefill
  the prompts once. Arguments as for `rollout`.
  """
  env_state, prompt, prompt_len = jax.vmap(env.reset)(tasks)
  return init_state(
      prompt,
      prompt_len,
      env_state,
      max_len=max_len,
      graphdef=graphdef,
      params=params,
      model_config=model_config,
      shared_prefix=shared_prefix,
  )


def rollout(
    env,
    tasks: Any,
    key: jax.Array,
    *,
    max_len: int,
    group: jax.Array | None = None,
    graphdef: nnx.GraphDef | None = None,
    params: Any = None,
    model_config: transformer.TransformerConfig | None = None,
    temperature: float | jax.Array = 1.0,
    tool_free: jax.Array | None = None,
    init: RolloutState | None = None,
    shared_prefix: transformer.SharedPrefix | None = None,
) -> types.Trajectory:
  """Runs a batch of episodes to completion and returns their `Trajectory`.

  With (graphdef, params, model_config) the policy samples every assistant turn,
  each ending at one of `env_stop_tokens(env)`; with graphdef None the
  environment's expert acts instead (SFT demonstrations, same format, behaviour
  log-prob 0).

  Args:
    env: a JAX-native environment (environments/base.py).
    tasks: task pytree with leading dim B.
    key: PRNG key for sampling (and the expert's imperfections).
    max_len: L, the sequence buffer length (static). Episodes that do not fit end
      TRUNCATED.
    group: [B] int32 GRPO group of each episode (defaults to arange(B)).
    graphdef, params, model_config: the policy (see above).
    temperature: sampling temperature (python float or traced scalar); 0 is
      greedy.
    tool_free: optional [B] bool; rows where it is True are sampled with tool
      calls disabled (`mask_logits` on `tool_call_tokens(env)` at every
      sampled token; dual-path groups) and it is returned as the extra fact
      `facts['tool_free']` [B] bool. Policy rollouts only.
    init: optional initial carry, `initial_state(env, tasks, ...)` of the same
      tasks, max_len and policy (None: built here, the same computation).
      Several passes over one task set (evaluation's greedy and sampled
      passes) share one prompt prefill this way.
    shared_prefix: optional `transformer.SharedPrefix` (policy rollouts;
      ignored with `init`, whose prefill is done): the tasks come in groups
      of `group` equal prompts whose first `length` tokens are prefilled
      once per group (`init_state`), and which the decode reads once per
      group where that pays (`transformer.CachePrefix`).

  Returns:
    Trajectory with B rows and L tokens; facts from `env.facts`.

  Raises:
    ValueError: the stop ids do not fit the model's vocabulary
      (`check_stop_tokens`).
  """
  b = jax.tree.leaves(tasks)[0].shape[0]
  use_model = graphdef is not None
  banned_tokens = tool_call_tokens(env) if tool_free is not None else ()
  stop_tokens = env_stop_tokens(env)
  if use_model:
    check_stop_tokens(stop_tokens, env, model_config)
  cache_prefix = None
  if init is None:
    state = initial_state(
        env,
        tasks,
        max_len=max_len,
        graphdef=graphdef,
        params=params,
        model_config=model_config,
        shared_prefix=shared_prefix,
    )
    if use_model and shared_prefix is not None:
      prompt_width = jax.eval_shape(jax.vmap(env.reset), tasks)[1].shape[1]
      cache_prefix = _cache_prefix(state, shared_prefix, prompt_width)
  else:
    state = init

  def turn_body(carry):
    state, key = carry
    key, sub = jax.random.split(key)
    active = ~state.done
    if use_model:
      state, action, action_len = generate_turn(
          graphdef,
          params,
          state,
          sub,
          max_action_len=env.max_action_len,
          temperature=temperature,
          stop_tokens=stop_tokens,
          banned_b=tool_free,
          banned_tokens=banned_tokens,
          cache_prefix=cache_prefix,
      )
    else:
      state, action, action_len = _expert_turn(env, state, sub)
    new_env_state, obs, obs_len, env_done = jax.vmap(env.step)(
        state.env_state, action, action_len
    )
    env_state = _tree_where(active, new_env_state, state.env_state)
    facts = jax.vmap(env.facts)(env_state)
    state = end_turn(
        state,
        active,
        env_done,
        facts["answered"],
        facts["format_error"],
        obs,
        obs_len,
        graphdef=graphdef,
        params=params,
        cache_prefix=cache_prefix,
    )
    return state.replace(env_state=env_state), key

  def turn_cond(carry):
    state, _ = carry
    return jnp.any(~state.done)

  state, _ = jax.lax.while_loop(turn_cond, turn_body, (state, key))
  facts = jax.vmap(env.facts)(state.env_state)
  if tool_free is not None:
    # Dual-path groups: which episodes were sampled without tools.
    facts = {**facts, "tool_free": jnp.asarray(tool_free, bool)}
  return types.Trajectory(
      tokens=state.tokens,
      role=state.role,
      logprob=state.logprob,
      turn=state.turn,
      length=state.length,
      num_turns=state.num_turns,
      finish=state.finish,
      group=jnp.arange(b, dtype=jnp.int32) if group is None else group,
      facts=facts,
  )


@functools.partial(
    jax.jit, static_argnames=("env", "max_len", "graphdef", "model_config")
)
def rollout_jit(
    env,
    tasks,
    key,
    *,
    max_len,
    group=None,
    graphdef=None,
    params=None,
    model_config=None,
    temperature=1.0,
    init=None,
):
  """`rollout` under `jax.jit` (env, shapes and graphdef static; temperature is
  traced, so greedy and sampled evaluation share one compiled program; `init`,
  an `initial_state_jit` of the same tasks, is traced as well)."""
  return rollout(
      env,
      tasks,
      key,
      max_len=max_len,
      group=group,
      graphdef=graphdef,
      params=params,
      model_config=model_config,
      temperature=temperature,
      init=init,
  )


initial_state_jit = jax.jit(
    initial_state,
    static_argnames=("env", "max_len", "graphdef", "model_config"),
)
