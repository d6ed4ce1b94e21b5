"""Token-level helpers shared by the JAX-native environments (pure jnp, static shapes).

Pieces are (tokens int32 [n], keep bool [n]) pairs; `assemble` concatenates the kept
tokens of several pieces into a front-compacted, PAD-filled buffer of static length.
Parsers return a value plus an `ok` flag and never raise on malformed input.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from agentic_text import tokenizers as tok

ZERO = ord("0")
MINUS = ord("-")
# Decimal positions used to render an int32 (|x| < 10**10).
NUM_DIGITS = 10
POW10 = np.array([10**i for i in range(NUM_DIGITS)], dtype=np.int32)
ERROR_BYTES = tuple(b"error")


def int_piece(x: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Decimal rendering of an int32 scalar as a masked piece.

  Args:
    x: int32 []; |x| < 10**10.

  Returns:
    tokens: int32 [11]; '-' then 10 digit bytes, most significant first.
    keep: bool [11]; '-' kept iff x < 0; digits kept from the first nonzero one (the
      last digit is always kept, so 0 renders as "0").
  """
  x = jnp.asarray(x, jnp.int32)
  mag = jnp.abs(x)
  pows = jnp.asarray(POW10[::-1].copy())  # 10**9 ... 10**0
  digits = jax.lax.rem(
      jax.lax.div(mag, pows), 10
  )  # mag >= 0: truncating ops suffice
  seen = jnp.cumsum(digits != 0) > 0
  keep_digits = seen.at[-1].set(True)
  tokens = jnp.concatenate([jnp.array([MINUS], jnp.int32), ZERO + digits])
  keep = jnp.concatenate([(x < 0)[None], keep_digits])
  return tokens.astype(jnp.int32), keep


def const_piece(ids) -> tuple[jax.Array, jax.Array]:
  """A fixed token sequence as an always-kept piece."""
  t = jnp.asarray(ids, jnp.int32).reshape(-1)
  return t, jnp.ones(t.shape, bool)


def assemble(pieces, out_len: int) -> tuple[jax.Array, jax.Array]:
  """Concatenates the kept tokens of masked pieces, front-compacted.

  Args:
    pieces: sequence of (tokens int32 [n_i], keep bool [n_i]).
    out_len: static output length; kept tokens past it are dropped.

  Returns:
    tokens: int32 [out_len]; kept tokens in order, then PAD.
    length: int32 []; number of kept tokens (capped at out_len).
  """
  tokens = jnp.concatenate([p[0] for p in pieces]).astype(jnp.int32)
  keep = jnp.concatenate([p[1] for p in pieces])
  pos = jnp.where(keep, jnp.cumsum(keep) - 1, -1)  # destination of each token
  # One-hot placement [out_len, n] (a scatter, written as a reduction).
  place = pos[None, :] == jnp.arange(out_len)[:, None]
  out = jnp.sum(jnp.where(place, tokens[None, :], 0), axis=1)
  out = jnp.where(jnp.any(place, axis=1), out, tok.PAD).astype(jnp.int32)
  length = jnp.minimum(jnp.sum(keep), out_len).astype(jnp.int32)
  return out, length


def parse_uint(
    tokens: jax.Array, start: jax.Array, end: jax.Array, max_digits: int
) -> tuple[jax.Array, jax.Array]:
  """Parses tokens[start:end] as an unsigned decimal integer.

  Args:
    tokens: int32 [A].
    start: int32 []; first position of the span.
    end: int32 []; one past the last position.
    max_digits: static maximum number of digits (<= 9).

  Returns:
    value: int32 []; the integer (meaningless when not ok).
    ok: bool []; 1..max_digits tokens, all of them digit bytes.
  """
  pos = jnp.arange(tokens.shape[0])
  in_span = (pos >= start) & (pos < end)
  digit = tokens - ZERO
  is_digit = (digit >= 0) & (digit <= 9)
  n = end - start
  ok = (n >= 1) & (n <= max_digits) & jnp.all(is_digit | ~in_span)
  power = jnp.clip(end - 1 - pos, 0, NUM_DIGITS - 1)
  term = jnp.where(in_span & is_digit, digit, 0) * jnp.asarray(POW10)[power]
  value = jnp.sum(jnp.where(in_span, term, 0)).astype(jnp.int32)
  return value, ok


def turn_frame(action_tokens: jax.Array, action_len: jax.Array):
  """Normalises one assistant turn.

  Args:
    action_tokens: int array [A] (any int dtype; reshaped to 1-D).
    action_len: int []; clipped to [0, A].

  Returns:
    tokens: int32 [A]; length: int32 [] in [0, A]; first, last: int32 [] (the
    first and the last token of the turn; tokens[0] when the turn is empty);
    stopped: bool [], the turn is non-empty and ends in a stop token
    (tokenizers.STOP_TOKENS).
  """
  tokens = jnp.asarray(action_tokens, jnp.int32).reshape(-1)
  num_a = tokens.shape[0]
  length = jnp.clip(jnp.asarray(action_len, jnp.int32), 0, num_a)
  first = tokens[0]
  last = tokens[jnp.clip(length - 1, 0, num_a - 1)]
  stopped = (length >= 1) & (
      (last == tok.CALL_END) | (last == tok.ANSWER_END) | (last == tok.EOS)
  )
  return tokens, length, first, last, stopped


def wrapped(open_id: int, close_id: int, pieces, out_len: int):
  """`open_id` + pieces + `close_id`, assembled into [out_len] (see `assemble`)."""
  return assemble(
      [const_piece([open_id]), *pieces, const_piece([close_id])], out_len
  )


def error_obs(out_len: int) -> tuple[jax.Array, jax.Array]:
  """The error observation `OBS "error" OBS_END`, int32 [out_len] and its length."""
  return assemble([const_piece([tok.OBS, *ERROR_BYTES, tok.OBS_END])], out_len)


def empty_obs(out_len: int) -> tuple[jax.Array, jax.Array]:
  """An all-PAD observation of length 0."""
  return jnp.full((out_len,), tok.PAD, jnp.int32), jnp.zeros((), jnp.int32)


def span_matches(
    tokens: jax.Array,
    start: jax.Array,
    end: jax.Array,
    pattern: jax.Array,
    pattern_len: jax.Array,
) -> jax.Array:
  """Whether tokens[start:end] equals pattern[:pattern_len] exactly.

  Args:
    tokens: int32 [A].
    start, end: int32 []; the span (end exclusive).
    pattern: int32 [M]; pattern_len: int32 [] <= M.

  Returns:
    bool [].
  """
  pos = jnp.arange(tokens.shape[0])
  idx = jnp.clip(pos - start, 0, pattern.shape[0] - 1)
  in_span = (pos >= start) & (pos < end)
  eq = jnp.where(in_span, tokens == pattern[idx], True)
  return (end - start == pattern_len) & jnp.all(eq)


def progress_update(
    progress: jax.Array, turn: jax.Array, active: jax.Array, value: jax.Array
) -> jax.Array:
  """Writes progress[turn] = value when active (progress float32 [K + 1])."""
  k1 = progress.shape[0]
  return jnp.where(
      active & (jnp.arange(k1) == turn),
      jnp.asarray(value, jnp.float32),
      progress,
  )


def expert_error_probs(env) -> tuple[float, float]:
  """(under-call, over-call) probabilities of an environment's SFT expert:
  `env.expert_undercall_prob` (answers a hard item directly) and
  `env.expert_overcall_prob` (calls the tool on an easy item), each replaced
  by `env.expert_imperfect_prob` where it is negative (unset)."""
  under, over = env.expert_undercall_prob, env.expert_overcall_prob
  return (
      under if under >= 0 else env.expert_imperfect_prob,
      over if over >= 0 else env.expert_imperfect_prob,
  )


def check_probabilities(obj, fields) -> None:
  """Raises ValueError naming the first of `fields` (attributes of `obj`) that is
  not a probability in [0, 1] (the environments' __post_init__ checks)."""
  for f in fields:
    if not 0.0 <= getattr(obj, f) <= 1.0:
      raise ValueError(
          f"{f} must be a probability in [0, 1], got " f"{getattr(obj, f)}"
      )
