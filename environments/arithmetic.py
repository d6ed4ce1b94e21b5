"""Arithmetic with a calculator tool: a JAX-native environment (see `base.py`).

Tasks are `a op b`. Easy items (single digits, + - *) can be answered directly; hard
items (3-digit times 2-digit) are meant to be delegated to the calculator tool.

Episode format (byte ids plus tokenizer specials):

  prompt:  BOS "Compute 483*27.\n" PAD...
  call:    CALL "483*27" CALL_END       -> OBS "13041" OBS_END   (or OBS "error" OBS_END)
  answer:  ANSWER "13041" ANSWER_END    -> episode done

Turn classification in `step`, in order:

  1. empty turn, or a last token that is not a stop token (the turn ran out of
     tokens): format error, done, empty observation;
  2. first token CALL: a tool call. `CALL <int><op><int> CALL_END` (op in + - *,
     operands of 1..6 digits, no sign) is evaluated; anything else (a wrong stop token,
     bad characters, empty operand, extra tokens, too many digits, int32 overflow or a
     result too long for the observation) gives the observation `OBS "error" OBS_END`
     and counts a tool error. Not done (unless the turn budget is spent);
  3. first token ANSWER: a final answer `ANSWER [-]<1..7 digits> ANSWER_END`; done.
     Anything else starting with ANSWER is a format error (done, not answered);
  4. anything else (EOS, bytes, other specials first): format error, done.

After `max_turns` turns without an answer the episode is done without a format error
(the rollout records MAX_TURNS). Stepping a finished episode is a no-op.

Every method is unbatched, pure jnp, jittable and vmappable; none raises on malformed
model output.
"""

from __future__ import annotations

import dataclasses
import functools

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from agentic_rl import tokenizers as tok

# Operator codes and their bytes.
ADD = 0
SUB = 1
MUL = 2
OP_CHARS = ("+", "-", "*")
_OP_BYTES = tuple(ord(c) for c in OP_CHARS)

_ZERO = ord("0")
_MINUS = ord("-")
_INT32_MAX = 2**31 - 1
# Decimal positions used to render an int32 (|x| < 10**10).
_NUM_DIGITS = 10
_POW10 = np.array([10**i for i in range(_NUM_DIGITS)], dtype=np.int32)

_MAX_CALL_DIGITS = 6  # digits per tool-call operand
_MAX_ANSWER_DIGITS = 7  # digits of a final answer

_PROMPT_HEAD = tuple(b"Compute ")
_PROMPT_TAIL = tuple(b".\n")
_ERROR_BYTES = tuple(b"error")


@flax.struct.dataclass
class ArithmeticTask:
  """One task (or a batch with a leading dim n). All fields have the same shape.

  Attributes:
    a: int32; left operand (0..9 easy, 100..999 hard).
    b: int32; right operand (0..9 easy, 10..99 hard).
    op: int32; ADD, SUB or MUL (always MUL for hard items).
    answer: int32; `a op b` (negative possible for SUB).
    hard: bool; whether the item is a hard (multi-digit product) item.
  """

  a: jax.Array
  b: jax.Array
  op: jax.Array
  answer: jax.Array
  hard: jax.Array


@flax.struct.dataclass
class ArithmeticState:
  """Unbatched episode state (the rollout vmaps it; K = max_turns).

  Attributes:
    task: the episode's ArithmeticTask (scalar fields).
    turn: int32 []; number of turns taken so far.
    done: bool []; the episode has ended.
    answered: bool []; a well-formed final answer was given.
    correct: bool []; the final answer equals task.answer.
    format_error: bool []; the episode ended on a malformed turn.
    num_tool_calls: int32 []; tool calls made (well-formed or not).
    num_tool_errors: int32 []; malformed tool calls.
    tool_call_turn: bool [K]; which turns were tool calls.
    last_tool_result: int32 []; value of the last successful tool call (0 if none or
      if the last call was an error).
    progress: float32 [K + 1]; progress[k] = 1 if after k turns a tool observation
      in the context holds the task's answer, else 0 (entries past the last turn
      are 0). A potential for PBRS (agentic_rl/credit.py).
  """

  task: ArithmeticTask
  turn: jax.Array
  done: jax.Array
  answered: jax.Array
  correct: jax.Array
  format_error: jax.Array
  num_tool_calls: jax.Array
  num_tool_errors: jax.Array
  tool_call_turn: jax.Array
  last_tool_result: jax.Array
  progress: jax.Array


def _apply_op(a: jax.Array, op: jax.Array, b: jax.Array) -> jax.Array:
  """`a op b` elementwise (int32; no overflow check)."""
  return jnp.where(op == ADD, a + b, jnp.where(op == SUB, a - b, a * b))


def _op_byte(op: jax.Array) -> jax.Array:
  """Byte id of an operator code, int32, same shape as `op`."""
  return jnp.asarray(_OP_BYTES, jnp.int32)[jnp.clip(op, 0, 2)]


def _int_piece(x: jax.Array) -> tuple[jax.Array, jax.Array]:
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
  pows = jnp.asarray(_POW10[::-1].copy())  # 10**9 ... 10**0
  digits = jax.lax.rem(jax.lax.div(mag, pows), 10)  # mag >= 0: truncating ops suffice
  seen = jnp.cumsum(digits != 0) > 0
  keep_digits = seen.at[-1].set(True)
  tokens = jnp.concatenate([jnp.array([_MINUS], jnp.int32), _ZERO + digits])
  keep = jnp.concatenate([(x < 0)[None], keep_digits])
  return tokens.astype(jnp.int32), keep


def _const_piece(ids) -> tuple[jax.Array, jax.Array]:
  """A fixed token sequence as an always-kept piece."""
  t = jnp.asarray(ids, jnp.int32).reshape(-1)
  return t, jnp.ones(t.shape, bool)


def _assemble(pieces, out_len: int) -> tuple[jax.Array, jax.Array]:
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


def _parse_uint(
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
  digit = tokens - _ZERO
  is_digit = (digit >= 0) & (digit <= 9)
  n = end - start
  ok = (n >= 1) & (n <= max_digits) & jnp.all(is_digit | ~in_span)
  power = jnp.clip(end - 1 - pos, 0, _NUM_DIGITS - 1)
  term = jnp.where(in_span & is_digit, digit, 0) * jnp.asarray(_POW10)[power]
  value = jnp.sum(jnp.where(in_span, term, 0)).astype(jnp.int32)
  return value, ok


# Ranges [lo, hi) of easy a, easy b, easy op, hard a, hard b.
_TASK_LO = np.array([0, 0, 0, 100, 10], np.int32)
_TASK_HI = np.array([10, 10, 3, 1000, 100], np.int32)


@functools.partial(jax.jit, static_argnums=1)
def _make_tasks(
    key: jax.Array, n: int, hard_fraction: jax.Array, num_hard: jax.Array
) -> ArithmeticTask:
  """Draws n tasks with a single PRNG call (keeps compile time low).

  Args:
    key: PRNG key.
    n: static number of tasks.
    hard_fraction: float32 []; probability that an item is hard (if num_hard < 0).
    num_hard: int32 []; if >= 0, exactly the first num_hard items are hard.

  Returns:
    ArithmeticTask with fields of shape [n].
  """
  u = jax.random.uniform(key, (6, n))
  hard = jnp.where(num_hard >= 0, jnp.arange(n) < num_hard, u[0] < hard_fraction)
  lo, hi = jnp.asarray(_TASK_LO)[:, None], jnp.asarray(_TASK_HI)[:, None]
  vals = jnp.minimum(lo + jnp.floor(u[1:] * (hi - lo)).astype(jnp.int32), hi - 1)
  a = jnp.where(hard, vals[3], vals[0])
  b = jnp.where(hard, vals[4], vals[1])
  op = jnp.where(hard, MUL, vals[2]).astype(jnp.int32)
  return ArithmeticTask(
      a=a, b=b, op=op, answer=_apply_op(a, op, b).astype(jnp.int32), hard=hard
  )


@dataclasses.dataclass(frozen=True)
class ArithmeticEnv:
  """Arithmetic tasks with a calculator tool (see module docstring).

  Attributes:
    max_prompt_len: P, prompt tokens (>= 17).
    max_action_len: A, tokens of one assistant turn (>= 9 for the expert's turns).
    max_obs_len: O, observation tokens (>= 7 for "error"; results that do not fit in
      O - 3 digits plus a sign are reported as "error").
    max_turns: K, assistant turns per episode.
    hard_fraction: probability that a sampled task is hard.
    expert_imperfect_prob: probability that the expert deliberately does the wrong
      thing in an episode (answers a hard item directly, or calls the tool on an easy
      one).
    expert_undercall_prob: if >= 0, overrides expert_imperfect_prob on hard items
      (probability of answering a hard item without the tool).
    expert_overcall_prob: if >= 0, overrides expert_imperfect_prob on easy items
      (probability of calling the tool on an easy item).
  """

  max_prompt_len: int = 24
  max_action_len: int = 16
  max_obs_len: int = 12
  max_turns: int = 3
  hard_fraction: float = 0.5
  expert_imperfect_prob: float = 0.5
  expert_undercall_prob: float = -1.0
  expert_overcall_prob: float = -1.0

  def __post_init__(self):
    # BOS + "Compute " + 3 digits + op + 2 digits + ".\n".
    if self.max_prompt_len < 17:
      raise ValueError(f"max_prompt_len must be >= 17, got {self.max_prompt_len}")
    # ANSWER + up to 5 digits + ANSWER_END, or CALL + 6 chars + CALL_END (9 with '-').
    if self.max_action_len < 9:
      raise ValueError(f"max_action_len must be >= 9, got {self.max_action_len}")
    if self.max_obs_len < 7:  # OBS "error" OBS_END
      raise ValueError(f"max_obs_len must be >= 7, got {self.max_obs_len}")
    if self.max_turns < 1:
      raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")

  # --------------------------------------------------------------------------- tasks

  def sample_tasks(self, key: jax.Array, n: int) -> ArithmeticTask:
    """n i.i.d. tasks, each hard with probability hard_fraction.

    Args:
      key: PRNG key.
      n: static number of tasks.

    Returns:
      ArithmeticTask with fields of shape [n].
    """
    return _make_tasks(key, n, jnp.float32(self.hard_fraction), jnp.int32(-1))

  def eval_tasks(self, n: int, seed: int) -> ArithmeticTask:
    """A fixed held-out set: the first round(n * hard_fraction) items are hard.

    Args:
      n: static number of tasks.
      seed: Python int seed.

    Returns:
      ArithmeticTask with fields of shape [n]; deterministic in (n, seed).
    """
    n_hard = int(round(n * self.hard_fraction))
    return _make_tasks(
        jax.random.key(seed), n, jnp.float32(self.hard_fraction), jnp.int32(n_hard)
    )

  # -------------------------------------------------------------------------- episode

  def reset(self, task: ArithmeticTask) -> tuple[ArithmeticState, jax.Array, jax.Array]:
    """Starts an episode.

    Args:
      task: unbatched ArithmeticTask (scalar fields).

    Returns:
      state: the initial ArithmeticState.
      prompt_tokens: int32 [P]; BOS "Compute {a}{op}{b}.\n" then PAD.
      prompt_len: int32 [].
    """
    prompt, prompt_len = _assemble(
        [
            _const_piece([tok.BOS, *_PROMPT_HEAD]),
            _int_piece(task.a),
            _const_piece(_op_byte(task.op)),
            _int_piece(task.b),
            _const_piece(_PROMPT_TAIL),
        ],
        self.max_prompt_len,
    )
    state = ArithmeticState(
        task=task,
        turn=jnp.zeros((), jnp.int32),
        done=jnp.zeros((), bool),
        answered=jnp.zeros((), bool),
        correct=jnp.zeros((), bool),
        format_error=jnp.zeros((), bool),
        num_tool_calls=jnp.zeros((), jnp.int32),
        num_tool_errors=jnp.zeros((), jnp.int32),
        tool_call_turn=jnp.zeros((self.max_turns,), bool),
        last_tool_result=jnp.zeros((), jnp.int32),
        progress=jnp.zeros((self.max_turns + 1,), jnp.float32),
    )
    return state, prompt, prompt_len

  def _parse_call(
      self, tokens: jax.Array, length: jax.Array
  ) -> tuple[jax.Array, jax.Array]:
    """Parses `CALL <int><op><int> CALL_END` and evaluates it.

    Args:
      tokens: int32 [A]; the turn.
      length: int32 []; its length (already clipped to [0, A]).

    Returns:
      result: int32 [] (0 when not ok).
      ok: bool []; well-formed, no overflow, and the result fits the observation.
    """
    pos = jnp.arange(tokens.shape[0])
    body = (pos >= 1) & (pos < length - 1)
    op_mask = body & (
        (tokens == _OP_BYTES[0]) | (tokens == _OP_BYTES[1]) | (tokens == _OP_BYTES[2])
    )
    p = jnp.argmax(op_mask).astype(jnp.int32)  # operator position (if exactly one)
    op = jnp.where(
        tokens[p] == _OP_BYTES[0], ADD, jnp.where(tokens[p] == _OP_BYTES[1], SUB, MUL)
    )
    a, ok_a = _parse_uint(tokens, 1, p, _MAX_CALL_DIGITS)
    b, ok_b = _parse_uint(tokens, p + 1, length - 1, _MAX_CALL_DIGITS)
    last = tokens[jnp.clip(length - 1, 0, tokens.shape[0] - 1)]
    well_formed = (
        (length >= 5)
        & (tokens[0] == tok.CALL)
        & (last == tok.CALL_END)
        & (jnp.sum(op_mask) == 1)
        & ok_a
        & ok_b
    )
    # Operands are < 10**6, so only MUL can overflow int32.
    overflow = (op == MUL) & (a > jax.lax.div(jnp.int32(_INT32_MAX), jnp.maximum(b, 1)))
    result = _apply_op(a, op, b)
    # The result must fit: OBS, sign, digits, OBS_END.
    max_digits = min(self.max_obs_len - 3, 9)
    fits = jnp.abs(result) < 10**max_digits
    ok = well_formed & ~overflow & fits
    return jnp.where(ok, result, 0).astype(jnp.int32), ok

  def _parse_answer(
      self, tokens: jax.Array, length: jax.Array
  ) -> tuple[jax.Array, jax.Array]:
    """Parses `ANSWER [-]<1..7 digits> ANSWER_END`.

    Args:
      tokens: int32 [A]; the turn.
      length: int32 []; its length (already clipped to [0, A]).

    Returns:
      value: int32 [] (meaningless when not ok).
      ok: bool []; well-formed.
    """
    neg = tokens[1] == _MINUS
    start = 1 + neg.astype(jnp.int32)
    mag, ok_digits = _parse_uint(tokens, start, length - 1, _MAX_ANSWER_DIGITS)
    last = tokens[jnp.clip(length - 1, 0, tokens.shape[0] - 1)]
    ok = (
        (length >= 3) & (tokens[0] == tok.ANSWER) & (last == tok.ANSWER_END)
        & ok_digits
    )
    return jnp.where(neg, -mag, mag).astype(jnp.int32), ok

  def step(
      self, state: ArithmeticState, action_tokens: jax.Array, action_len: jax.Array
  ) -> tuple[ArithmeticState, jax.Array, jax.Array, jax.Array]:
    """Applies one assistant turn (see the module docstring for the rules).

    Args:
      state: unbatched ArithmeticState.
      action_tokens: int32 [A]; the turn is action_tokens[:action_len].
      action_len: int32 []; clipped to [0, A].

    Returns:
      state: the next state.
      obs_tokens: int32 [O]; the tool observation then PAD (all PAD if none).
      obs_len: int32 []; 0 unless the turn was a tool call.
      done: bool []; the episode has ended.
    """
    tokens = jnp.asarray(action_tokens, jnp.int32).reshape(-1)
    num_a = tokens.shape[0]
    length = jnp.clip(jnp.asarray(action_len, jnp.int32), 0, num_a)
    first = tokens[0]
    last = tokens[jnp.clip(length - 1, 0, num_a - 1)]
    stopped = (length >= 1) & (
        (last == tok.CALL_END) | (last == tok.ANSWER_END) | (last == tok.EOS)
    )
    active = ~state.done

    is_call = active & stopped & (first == tok.CALL)
    is_answer = active & stopped & (first == tok.ANSWER)
    is_other = active & ~is_call & ~is_answer

    result, call_ok = self._parse_call(tokens, length)
    answer, answer_ok = self._parse_answer(tokens, length)

    # Observation (only for tool calls).
    obs_ok, len_ok = _assemble(
        [_const_piece([tok.OBS]), _int_piece(result), _const_piece([tok.OBS_END])],
        self.max_obs_len,
    )
    obs_err, len_err = _assemble(
        [_const_piece([tok.OBS, *_ERROR_BYTES, tok.OBS_END])], self.max_obs_len
    )
    obs = jnp.where(call_ok, obs_ok, obs_err)
    obs = jnp.where(is_call, obs, jnp.full_like(obs, tok.PAD))
    obs_len = jnp.where(is_call, jnp.where(call_ok, len_ok, len_err), 0)

    answered = is_answer & answer_ok
    format_error = is_other | (is_answer & ~answer_ok)
    turn = state.turn + active.astype(jnp.int32)
    done = state.done | is_answer | is_other | (turn >= self.max_turns)

    had_answer = state.progress[jnp.clip(state.turn, 0, self.max_turns)] > 0
    has_answer = had_answer | (is_call & call_ok & (result == state.task.answer))
    progress = jnp.where(
        active & (jnp.arange(self.max_turns + 1) == turn),
        has_answer.astype(jnp.float32), state.progress,
    )
    new_state = state.replace(
        progress=progress,
        turn=turn,
        done=done,
        answered=state.answered | answered,
        correct=state.correct | (answered & (answer == state.task.answer)),
        format_error=state.format_error | format_error,
        num_tool_calls=state.num_tool_calls + is_call.astype(jnp.int32),
        num_tool_errors=state.num_tool_errors + (is_call & ~call_ok).astype(jnp.int32),
        tool_call_turn=state.tool_call_turn
        | (is_call & (jnp.arange(self.max_turns) == state.turn)),
        last_tool_result=jnp.where(
            is_call, jnp.where(call_ok, result, 0), state.last_tool_result
        ).astype(jnp.int32),
    )
    return new_state, obs.astype(jnp.int32), obs_len.astype(jnp.int32), done

  def facts(self, state: ArithmeticState) -> dict[str, jax.Array]:
    """Verifiable episode facts.

    Args:
      state: unbatched ArithmeticState.

    Returns:
      'correct', 'answered', 'format_error', 'hard': bool [];
      'num_tool_calls', 'num_tool_errors': int32 [];
      'tool_call_turn': bool [K]; 'progress': float32 [K + 1] (see
      ArithmeticState).
    """
    return {
        "correct": state.correct,
        "answered": state.answered,
        "format_error": state.format_error,
        "num_tool_calls": state.num_tool_calls,
        "num_tool_errors": state.num_tool_errors,
        "hard": jnp.asarray(state.task.hard, bool),
        "tool_call_turn": state.tool_call_turn,
        "progress": state.progress,
    }

  def expert_action(
      self, state: ArithmeticState, key: jax.Array
  ) -> tuple[jax.Array, jax.Array]:
    """The demonstrator's next turn.

    At turn 0 the expert calls the tool iff `hard XOR (uniform(key) < p)`, with
    p the under-call probability on hard items and the over-call probability on
    easy ones (both default to expert_imperfect_prob), emitting `CALL a op b CALL_END`, and otherwise answers
    `ANSWER <true answer> ANSWER_END`. At later turns (after a call) it answers with
    the last tool result.

    Args:
      state: unbatched ArithmeticState.
      key: PRNG key (only used at turn 0).

    Returns:
      action_tokens: int32 [A]; the turn then PAD.
      action_len: int32 [].
    """
    task = state.task
    under = (self.expert_undercall_prob if self.expert_undercall_prob >= 0
             else self.expert_imperfect_prob)
    over = (self.expert_overcall_prob if self.expert_overcall_prob >= 0
            else self.expert_imperfect_prob)
    imperfect = jax.random.uniform(key) < jnp.where(task.hard, under, over)
    use_tool = (state.turn == 0) & jnp.logical_xor(task.hard, imperfect)
    answer = jnp.where(state.turn == 0, task.answer, state.last_tool_result)
    call, call_len = _assemble(
        [
            _const_piece([tok.CALL]),
            _int_piece(task.a),
            _const_piece(_op_byte(task.op)),
            _int_piece(task.b),
            _const_piece([tok.CALL_END]),
        ],
        self.max_action_len,
    )
    ans, ans_len = _assemble(
        [
            _const_piece([tok.ANSWER]),
            _int_piece(answer),
            _const_piece([tok.ANSWER_END]),
        ],
        self.max_action_len,
    )
    return (
        jnp.where(use_tool, call, ans).astype(jnp.int32),
        jnp.where(use_tool, call_len, ans_len).astype(jnp.int32),
    )


def render_task(task: ArithmeticTask) -> str:
  """Host-side text of one unbatched task, e.g. "Compute 483*27."."""
  a = int(np.asarray(task.a))
  b = int(np.asarray(task.b))
  op = OP_CHARS[int(np.asarray(task.op))]
  return f"Compute {a}{op}{b}."
