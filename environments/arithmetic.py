"""Arithmetic with a calculator tool: a JAX-native environment (see `base.py`).

Tasks are `a op b`. Easy items (single digits, + - *; narrower with
`easy_max_operand` / `easy_operators`) can be answered directly; hard
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

Free-length filler (`filler_max` = K > 0; off by default): a turn may open with
any number of filler tokens FILLER ('.', as in "Let's think dot by dot",
arXiv:2404.15758), e.g.

  filler:  "..." ANSWER "13041" ANSWER_END   -> as ANSWER "13041" ANSWER_END

`step` drops that leading run and classifies the rest by the rules above, so
the outcome (correct, format error, tool call and its result) never depends on
the fillers, only the turn's length does; fillers elsewhere in a turn are not
dropped (e.g. inside a number they make it malformed). A turn of fillers only
is an empty turn (format error). The expert opens each of its turns with a
number of fillers drawn uniformly from 0..K; the policy may emit more, up to
what max_action_len leaves. With K = 0 nothing changes: a turn that opens with
'.' is a format error (rule 4), and the episodes are those of the environment
before the option (the off branch runs the code from before the option).

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

from agentic_text import tokenizers as tok
from environments import common

# Operator codes and their bytes.
ADD = 0
SUB = 1
MUL = 2
OP_CHARS = ("+", "-", "*")
_OP_BYTES = tuple(ord(c) for c in OP_CHARS)

_ZERO = common.ZERO
_MINUS = common.MINUS
_INT32_MAX = 2**31 - 1

_MAX_CALL_DIGITS = 6  # digits per tool-call operand
_MAX_ANSWER_DIGITS = 7  # digits of a final answer

# The free-length filler token (`filler_max`): a neutral byte that may open a
# turn any number of times.
FILLER = ord(".")

_PROMPT_HEAD = tuple(b"Compute ")
_PROMPT_TAIL = tuple(b".\n")
_ERROR_BYTES = common.ERROR_BYTES


@flax.struct.dataclass
class ArithmeticTask:
  """One task (or a batch with a leading dim n).

  Attributes:
    a: int32; left operand (0..easy_max_operand easy, 100..999 hard).
    b: int32; right operand (0..easy_max_operand easy, 10..99 hard).
    op: int32; ADD, SUB or MUL (always MUL for hard items).
    answer: int32; the value of the whole expression (negative possible).
    hard: bool; whether the item is a hard (multi-digit product) item.
    xs: None for single-operation tasks, else int32 [M + 1], the operands of the
      left-associated chain ((x0 o1 x1) o2 x2) ... oM xM (xs[0] = a, xs[1] = b).
    ops: None, or int32 [M], the chain's operators (ops[0] = op).
    noise_u: None (noiseless tool), or float32 [K]; the tool's answer to the i-th
      call is wrong iff noise_u[i] < tool_noise_prob.
    noise_delta: None, or int32 [K] in {-9..-1, 1..9}; the error added to the i-th
      call's result when it is wrong.
  Fields a, b, op, answer, hard have the same shape (a leading dim n or none).
  """

  a: jax.Array
  b: jax.Array
  op: jax.Array
  answer: jax.Array
  hard: jax.Array
  xs: jax.Array | None = None
  ops: jax.Array | None = None
  noise_u: jax.Array | None = None
  noise_delta: jax.Array | None = None


def _chain(task: ArithmeticTask) -> tuple[jax.Array, jax.Array]:
  """(xs int32 [M + 1], ops int32 [M]) of an unbatched task (M = 1 if no chain)."""
  if task.xs is None:
    return (
        jnp.stack([task.a, task.b]).astype(jnp.int32),
        jnp.asarray(task.op, jnp.int32).reshape(1),
    )
  return jnp.asarray(task.xs, jnp.int32), jnp.asarray(task.ops, jnp.int32)


def _intermediates(xs: jax.Array, ops: jax.Array) -> jax.Array:
  """Prefix values r_j = (..(x0 o1 x1)..) oj xj for j = 1..M, int32 [M]."""

  def body(acc, xo):
    x, o = xo
    r = _apply_op(acc, o, x)
    return r, r

  _, r = jax.lax.scan(body, xs[0], (xs[1:], ops))
  return r.astype(jnp.int32)


@flax.struct.dataclass
class ArithmeticState:
  """Unbatched episode state (the rollout vmaps it; K = max_turns, M = num_ops).

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
    last_tool_result: int32 []; value returned by the last successful tool call (0
      if none or if the last call was an error; possibly a noisy value).
    progress: float32 [K + 1]; progress[k] = (number of the chain's prefix values
      r_1..r_M, in order, that a tool observation in the context after k turns
      holds) / M; for single-operation tasks 1 iff an observation holds the answer.
      Entries past the last turn are 0. A potential for PBRS (agentic_rl/credit/).
    resolved: int32 []; the numerator of the last progress entry.
    num_redundant_calls: int32 []; well-formed calls identical (a, op, b) to an
      earlier well-formed call.
    num_noisy_results: int32 []; calls whose returned result was corrupted.
    calls_abo: int32 [K, 3]; (a, op, b) of each well-formed call (-1 otherwise).
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
  resolved: jax.Array
  num_redundant_calls: jax.Array
  num_noisy_results: jax.Array
  calls_abo: jax.Array


def _apply_op(a: jax.Array, op: jax.Array, b: jax.Array) -> jax.Array:
  """`a op b` elementwise (int32; no overflow check)."""
  return jnp.where(op == ADD, a + b, jnp.where(op == SUB, a - b, a * b))


def _op_byte(op: jax.Array) -> jax.Array:
  """Byte id of an operator code, int32, same shape as `op`."""
  return jnp.asarray(_OP_BYTES, jnp.int32)[jnp.clip(op, 0, 2)]


int_piece = common.int_piece
const_piece = common.const_piece
assemble = common.assemble
parse_uint = common.parse_uint
_int_piece, _const_piece, _assemble, _parse_uint = (
    int_piece,
    const_piece,
    assemble,
    parse_uint,
)


# Lower bounds of easy a, easy b, easy op, hard a, hard b; the upper bounds
# (exclusive) are the easy range of `_make_tasks` and 1000, 100 for hard items.
_TASK_LO = np.array([0, 0, 0, 100, 10], np.int32)


def _noise(key: jax.Array, n: int, k: int) -> tuple[jax.Array, jax.Array]:
  """Per-call noise draws [n, k]: uniforms and nonzero deltas in -9..9."""
  ku, kd, ks = jax.random.split(jax.random.fold_in(key, 0x6E6F), 3)
  u = jax.random.uniform(ku, (n, k))
  mag = jax.random.randint(kd, (n, k), 1, 10)
  sign = jnp.where(jax.random.bernoulli(ks, 0.5, (n, k)), 1, -1)
  return u, (mag * sign).astype(jnp.int32)


def strip_fillers(
    tokens: jax.Array, length: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Drops the run of FILLER tokens that opens a turn.

  Args:
    tokens: int32 [A]; the turn.
    length: int32 []; its length (already clipped to [0, A]).

  Returns:
    tokens: int32 [A]; the turn without its leading fillers, then PAD.
    length: int32 []; length minus the number of leading fillers (0 for a turn
      of fillers only).
    num_fillers: int32 []; the leading fillers dropped.
  """
  num_a = tokens.shape[0]
  pos = jnp.arange(num_a)
  lead = jnp.cumprod(((tokens == FILLER) & (pos < length)).astype(jnp.int32))
  n = jnp.sum(lead).astype(jnp.int32)
  src = pos + n
  shifted = jnp.where(src < num_a, tokens[jnp.clip(src, 0, num_a - 1)], tok.PAD)
  new_len = (length - n).astype(jnp.int32)
  shifted = jnp.where(pos < new_len, shifted, tok.PAD).astype(jnp.int32)
  return shifted, new_len, n


def _nonnegative_ops(xs: jax.Array, ops: jax.Array) -> jax.Array:
  """ops [M] with each SUB whose running value would drop below 0 made ADD."""

  def body(acc, xo):
    x, o = xo
    o = jnp.where((o == SUB) & (acc < x), ADD, o)
    return _apply_op(acc, o, x), o

  _, out = jax.lax.scan(body, xs[0], (xs[1:], ops))
  return out.astype(jnp.int32)


@functools.partial(jax.jit, static_argnums=(1, 4, 5, 6, 7))
def _make_tasks(
    key: jax.Array,
    n: int,
    hard_fraction: jax.Array,
    num_hard: jax.Array,
    num_ops: int = 1,
    max_turns: int = 0,
    easy_max_operand: int = 9,
    easy_operators: int = 3,
) -> ArithmeticTask:
  """Draws n tasks (one PRNG call for the first operation; keeps compile time low).

  The first operation (a, op, b) is drawn exactly as in the single-operation
  environment; for num_ops > 1, operations 2..M draw from a key folded off the
  first one: easy items use digits 0..easy_max_operand and the first
  easy_operators of + - * (default 0..9 and all three), hard items 10..99 with +
  and - (so the value stays below 10**6).

  Args:
    key: PRNG key.
    n: static number of tasks.
    hard_fraction: float32 []; probability that an item is hard (if num_hard < 0).
    num_hard: int32 []; if >= 0, exactly the first num_hard items are hard.
    num_ops: static M, operations per task.
    max_turns: static K; > 0 adds per-call noise draws (noise_u, noise_delta).
    easy_max_operand: static; easy operands are drawn from 0..this (<= 9).
    easy_operators: static 1..3; easy operators are drawn from the first this
      many of ADD, SUB, MUL.

  Returns:
    ArithmeticTask with fields of shape [n] (xs [n, M + 1], ops [n, M] if M > 1;
    noise_u, noise_delta [n, K] if K > 0).
  """
  u = jax.random.uniform(key, (6, n))
  hard = jnp.where(
      num_hard >= 0, jnp.arange(n) < num_hard, u[0] < hard_fraction
  )
  easy_hi = easy_max_operand + 1
  task_hi = np.array([easy_hi, easy_hi, easy_operators, 1000, 100], np.int32)
  lo, hi = jnp.asarray(_TASK_LO)[:, None], jnp.asarray(task_hi)[:, None]
  vals = jnp.minimum(
      lo + jnp.floor(u[1:] * (hi - lo)).astype(jnp.int32), hi - 1
  )
  a = jnp.where(hard, vals[3], vals[0])
  b = jnp.where(hard, vals[4], vals[1])
  op = jnp.where(hard, MUL, vals[2]).astype(jnp.int32)
  xs = ops = None
  answer = _apply_op(a, op, b).astype(jnp.int32)
  if num_ops > 1:
    kx, ko = jax.random.split(jax.random.fold_in(key, 0x6368), 2)
    easy_x = jax.random.randint(kx, (n, num_ops - 1), 0, easy_hi)
    hard_x = jax.random.randint(kx, (n, num_ops - 1), 10, 100)
    easy_o = jax.random.randint(ko, (n, num_ops - 1), 0, easy_operators)
    hard_o = jax.random.randint(ko, (n, num_ops - 1), 0, 2)
    rest_x = jnp.where(hard[:, None], hard_x, easy_x)
    rest_o = jnp.where(hard[:, None], hard_o, easy_o)
    xs = jnp.concatenate([a[:, None], b[:, None], rest_x], 1).astype(jnp.int32)
    ops = jnp.concatenate([op[:, None], rest_o], 1).astype(jnp.int32)
    # Chains stay non-negative (call operands are unsigned): a subtraction that
    # would go below 0 becomes an addition.
    ops = jax.vmap(_nonnegative_ops)(xs, ops)
    op = ops[:, 0]
    answer = jax.vmap(_intermediates)(xs, ops)[:, -1]
  noise_u = noise_delta = None
  if max_turns > 0:
    noise_u, noise_delta = _noise(key, n, max_turns)
  return ArithmeticTask(
      a=a,
      b=b,
      op=op,
      answer=answer,
      hard=hard,
      xs=xs,
      ops=ops,
      noise_u=noise_u,
      noise_delta=noise_delta,
  )


@dataclasses.dataclass(frozen=True)
class ArithmeticEnv:
  """Arithmetic tasks with a calculator tool (see module docstring).

  Attributes:
    max_prompt_len: P, prompt tokens (>= 17; chains need more, checked).
    max_action_len: A, tokens of one assistant turn (>= 9 for the expert's turns).
    max_obs_len: O, observation tokens (>= 7 for "error"; results that do not fit in
      O - 3 digits plus a sign are reported as "error").
    max_turns: K, assistant turns per episode (>= num_ops + 1 for chains).
    hard_fraction: probability that a sampled task is hard.
    expert_imperfect_prob: probability that the expert deliberately does the wrong
      thing in an episode (answers a hard item directly, or calls the tool on an easy
      one).
    expert_undercall_prob: if >= 0, overrides expert_imperfect_prob on hard items
      (probability of answering a hard item without the tool).
    expert_overcall_prob: if >= 0, overrides expert_imperfect_prob on easy items
      (probability of calling the tool on an easy item).
    num_ops: M, operations per task; M > 1 gives chains ((x0 o1 x1) o2 x2)...
      that need M calls (each call evaluates one binary operation).
    tool_noise_prob: q, probability that a well-formed call returns a wrong result
      (the true result plus a nonzero delta in -9..9); 0 = exact tool.
    expert_wrong_arg_prob: probability, per expert call, that its right operand is
      off by one (a wrong argument).
    easy_max_operand: easy items' operands are drawn from 0..this (0..9; default
      9). A smaller range leaves fewer easy facts, so a small policy can learn to
      answer easy items correctly without the tool.
    easy_operators: easy items' operators are drawn from the first this many of
      + - * (1..3; default 3: all three).
    filler_max: K >= 0, the free-length filler option (module docstring); 0 =
      off (default). K > 0: any turn may open with any number of FILLER ('.')
      tokens, which `step` drops before classifying the turn; the expert opens
      each turn with a uniform 0..K of them. Needs max_action_len >= 9 + K.
  """

  max_prompt_len: int = 24
  max_action_len: int = 16
  max_obs_len: int = 12
  max_turns: int = 3
  hard_fraction: float = 0.5
  expert_imperfect_prob: float = 0.5
  expert_undercall_prob: float = -1.0
  expert_overcall_prob: float = -1.0
  num_ops: int = 1
  tool_noise_prob: float = 0.0
  expert_wrong_arg_prob: float = 0.0
  easy_max_operand: int = 9
  easy_operators: int = 3
  filler_max: int = 0

  def __post_init__(self):
    if not 1 <= self.num_ops <= 6:
      raise ValueError(f"num_ops must be in 1..6, got {self.num_ops}")
    if (
        not isinstance(self.easy_max_operand, int)
        or not 0 <= self.easy_max_operand <= 9
    ):
      raise ValueError(
          f"easy_max_operand must be in 0..9, got {self.easy_max_operand}"
      )
    if (
        not isinstance(self.easy_operators, int)
        or not 1 <= self.easy_operators <= 3
    ):
      raise ValueError(
          f"easy_operators must be in 1..3 (+, + -, + - *), got "
          f"{self.easy_operators}"
      )
    # BOS + "Compute " + (M-1) '(' + 3 digits + op + 2 digits + (M-1) * (")" op
    # 2 digits) + ".\n".
    need = 17 + 5 * (self.num_ops - 1)
    if self.max_prompt_len < need:
      raise ValueError(
          f"max_prompt_len must be >= {need} (num_ops={self.num_ops}), got "
          f"{self.max_prompt_len}"
      )
    if (
        isinstance(self.filler_max, bool)
        or not isinstance(self.filler_max, int)
        or self.filler_max < 0
    ):
      raise ValueError(
          f"filler_max must be an integer >= 0 (0 = off), got "
          f"{self.filler_max!r}"
      )
    # ANSWER + up to 5 digits + ANSWER_END, or CALL + 6 chars + CALL_END (9 with
    # '-'), after the expert's up to filler_max fillers.
    need = 9 + self.filler_max
    if self.max_action_len < need:
      raise ValueError(
          f"max_action_len must be >= {need}"
          + (f" (9 + filler_max={self.filler_max})" if self.filler_max else "")
          + f", got {self.max_action_len}"
      )
    if self.max_obs_len < 7:  # OBS "error" OBS_END
      raise ValueError(f"max_obs_len must be >= 7, got {self.max_obs_len}")
    if self.max_turns < 1:
      raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")
    if self.num_ops > 1 and self.max_turns < self.num_ops + 1:
      raise ValueError(
          f"max_turns must be >= num_ops + 1 = {self.num_ops + 1}, got "
          f"{self.max_turns}"
      )
    common.check_probabilities(
        self, ("tool_noise_prob", "expert_wrong_arg_prob")
    )

  # Tokens of the gold answer turn ANSWER [-] <up to 10 digits> ANSWER_END.
  @property
  def max_answer_len(self) -> int:
    """Ag, the static length of the 'gold_answer' fact."""
    return 13

  # --------------------------------------------------------------------------- tasks

  def sample_tasks(self, key: jax.Array, n: int) -> ArithmeticTask:
    """n i.i.d. tasks, each hard with probability hard_fraction.

    Args:
      key: PRNG key.
      n: static number of tasks.

    Returns:
      ArithmeticTask with fields of shape [n].
    """
    return _make_tasks(
        key,
        n,
        jnp.float32(self.hard_fraction),
        jnp.int32(-1),
        self.num_ops,
        self._noise_turns,
        self.easy_max_operand,
        self.easy_operators,
    )

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
        jax.random.key(seed),
        n,
        jnp.float32(self.hard_fraction),
        jnp.int32(n_hard),
        self.num_ops,
        self._noise_turns,
        self.easy_max_operand,
        self.easy_operators,
    )

  @property
  def _noise_turns(self) -> int:
    return self.max_turns if self.tool_noise_prob > 0 else 0

  # -------------------------------------------------------------------------- episode

  def _prompt_pieces(self, task: ArithmeticTask):
    xs, ops = _chain(task)
    m = xs.shape[0] - 1
    pieces = [_const_piece([tok.BOS, *_PROMPT_HEAD])]
    pieces += [_const_piece([ord("(")])] * (m - 1)
    pieces += [
        _int_piece(xs[0]),
        _const_piece(_op_byte(ops[0])),
        _int_piece(xs[1]),
    ]
    for j in range(1, m):
      pieces += [
          _const_piece([ord(")")]),
          _const_piece(_op_byte(ops[j])),
          _int_piece(xs[j + 1]),
      ]
    pieces.append(_const_piece(_PROMPT_TAIL))
    return pieces

  def reset(
      self, task: ArithmeticTask
  ) -> tuple[ArithmeticState, jax.Array, jax.Array]:
    """Starts an episode.

    Args:
      task: unbatched ArithmeticTask (scalar fields).

    Returns:
      state: the initial ArithmeticState.
      prompt_tokens: int32 [P]; BOS "Compute {a}{op}{b}.\n" (chains:
        "Compute ((x0o1x1)o2x2)o3x3.\n") then PAD.
      prompt_len: int32 [].
    """
    prompt, prompt_len = _assemble(
        self._prompt_pieces(task), self.max_prompt_len
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
        resolved=jnp.zeros((), jnp.int32),
        num_redundant_calls=jnp.zeros((), jnp.int32),
        num_noisy_results=jnp.zeros((), jnp.int32),
        calls_abo=jnp.full((self.max_turns, 3), -1, jnp.int32),
    )
    return state, prompt, prompt_len

  def _parse_call(self, tokens: jax.Array, length: jax.Array):
    """Parses `CALL <int><op><int> CALL_END` and evaluates it.

    Args:
      tokens: int32 [A]; the turn.
      length: int32 []; its length (already clipped to [0, A]).

    Returns:
      result: int32 [] (0 when not ok).
      ok: bool []; well-formed, no overflow, and the result fits the observation.
      abo: int32 [3]; the parsed (a, op, b) (meaningless when not ok).
    """
    pos = jnp.arange(tokens.shape[0])
    body = (pos >= 1) & (pos < length - 1)
    op_mask = body & (
        (tokens == _OP_BYTES[0])
        | (tokens == _OP_BYTES[1])
        | (tokens == _OP_BYTES[2])
    )
    p = jnp.argmax(op_mask).astype(
        jnp.int32
    )  # operator position (if exactly one)
    op = jnp.where(
        tokens[p] == _OP_BYTES[0],
        ADD,
        jnp.where(tokens[p] == _OP_BYTES[1], SUB, MUL),
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
    overflow = (op == MUL) & (
        a > jax.lax.div(jnp.int32(_INT32_MAX), jnp.maximum(b, 1))
    )
    result = _apply_op(a, op, b)
    # The result must fit: OBS, sign, digits, OBS_END.
    fits = jnp.abs(result) < 10**self._max_result_digits
    ok = well_formed & ~overflow & fits
    abo = jnp.stack([a, op, b]).astype(jnp.int32)
    return jnp.where(ok, result, 0).astype(jnp.int32), ok, abo

  @property
  def _max_result_digits(self) -> int:
    return min(self.max_obs_len - 3, 9)

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
        (length >= 3)
        & (tokens[0] == tok.ANSWER)
        & (last == tok.ANSWER_END)
        & ok_digits
    )
    return jnp.where(neg, -mag, mag).astype(jnp.int32), ok

  def step(
      self,
      state: ArithmeticState,
      action_tokens: jax.Array,
      action_len: jax.Array,
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
    if self.filler_max > 0:  # static: off traces the code before the option
      tokens, length, _ = strip_fillers(tokens, length)
    first = tokens[0]
    last = tokens[jnp.clip(length - 1, 0, num_a - 1)]
    stopped = (length >= 1) & (
        (last == tok.CALL_END) | (last == tok.ANSWER_END) | (last == tok.EOS)
    )
    active = ~state.done

    is_call = active & stopped & (first == tok.CALL)
    is_answer = active & stopped & (first == tok.ANSWER)
    is_other = active & ~is_call & ~is_answer

    result, call_ok, abo = self._parse_call(tokens, length)
    answer, answer_ok = self._parse_answer(tokens, length)

    # The noisy tool: the i-th call's result is corrupted iff noise_u[i] < q (only
    # if the corrupted value still fits the observation).
    task = state.task
    noisy = jnp.zeros((), bool)
    if self.tool_noise_prob > 0 and task.noise_u is not None:
      i = jnp.clip(state.num_tool_calls, 0, task.noise_u.shape[-1] - 1)
      wrong = result + task.noise_delta[i]
      noisy = (
          call_ok
          & (task.noise_u[i] < self.tool_noise_prob)
          & (jnp.abs(wrong) < 10**self._max_result_digits)
      )
      result = jnp.where(noisy, wrong, result).astype(jnp.int32)

    # Observation (only for tool calls).
    obs_ok, len_ok = _assemble(
        [
            _const_piece([tok.OBS]),
            _int_piece(result),
            _const_piece([tok.OBS_END]),
        ],
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

    # Progress: prefix values of the chain observed, in order.
    xs, ops = _chain(task)
    inter = _intermediates(xs, ops)
    m = inter.shape[0]
    want = inter[jnp.clip(state.resolved, 0, m - 1)]
    advance = is_call & call_ok & (state.resolved < m) & (result == want)
    resolved = state.resolved + advance.astype(jnp.int32)
    progress = jnp.where(
        active & (jnp.arange(self.max_turns + 1) == turn),
        (resolved.astype(jnp.float32) / m),
        state.progress,
    )
    good_call = is_call & call_ok
    redundant = good_call & jnp.any(
        jnp.all(state.calls_abo == abo[None, :], axis=1)
    )
    at_turn = jnp.arange(self.max_turns) == state.turn
    calls_abo = jnp.where(
        (good_call & at_turn)[:, None], abo[None, :], state.calls_abo
    )
    new_state = state.replace(
        progress=progress,
        resolved=resolved,
        turn=turn,
        done=done,
        answered=state.answered | answered,
        correct=state.correct | (answered & (answer == state.task.answer)),
        format_error=state.format_error | format_error,
        num_tool_calls=state.num_tool_calls + is_call.astype(jnp.int32),
        num_tool_errors=state.num_tool_errors
        + (is_call & ~call_ok).astype(jnp.int32),
        tool_call_turn=state.tool_call_turn | (is_call & at_turn),
        last_tool_result=jnp.where(
            is_call, jnp.where(call_ok, result, 0), state.last_tool_result
        ).astype(jnp.int32),
        num_redundant_calls=state.num_redundant_calls
        + redundant.astype(jnp.int32),
        num_noisy_results=state.num_noisy_results + noisy.astype(jnp.int32),
        calls_abo=calls_abo,
    )
    return new_state, obs.astype(jnp.int32), obs_len.astype(jnp.int32), done

  def gold_answer(self, task: ArithmeticTask) -> tuple[jax.Array, jax.Array]:
    """The reference answer turn `ANSWER <answer> ANSWER_END`.

    Args:
      task: unbatched ArithmeticTask.

    Returns:
      tokens: int32 [Ag] (Ag = max_answer_len), PAD-filled; length: int32 [].
    """
    return _assemble(
        [
            _const_piece([tok.ANSWER]),
            _int_piece(task.answer),
            _const_piece([tok.ANSWER_END]),
        ],
        self.max_answer_len,
    )

  def facts(self, state: ArithmeticState) -> dict[str, jax.Array]:
    """Verifiable episode facts.

    Args:
      state: unbatched ArithmeticState.

    Returns:
      'correct', 'answered', 'format_error', 'hard', 'tool_necessary': bool []
      ('tool_necessary' = 'hard': easy items can be answered without the tool);
      'num_tool_calls', 'num_tool_errors', 'num_redundant_calls',
      'num_noisy_results', 'gold_answer_len': int32 [];
      'tool_call_turn': bool [K]; 'progress': float32 [K + 1] (see
      ArithmeticState); 'gold_answer': int32 [Ag], the reference answer turn
      (ANSWER, digits, ANSWER_END, then PAD), e.g. for a likelihood reward or a
      TRACE-style potential (agentic_rl/credit/).
    """
    gold, gold_len = self.gold_answer(state.task)
    hard = jnp.asarray(state.task.hard, bool)
    return {
        "correct": state.correct,
        "answered": state.answered,
        "format_error": state.format_error,
        "num_tool_calls": state.num_tool_calls,
        "num_tool_errors": state.num_tool_errors,
        "num_redundant_calls": state.num_redundant_calls,
        "num_noisy_results": state.num_noisy_results,
        "hard": hard,
        "tool_necessary": hard,
        "tool_call_turn": state.tool_call_turn,
        "progress": state.progress,
        "gold_answer": gold,
        "gold_answer_len": gold_len,
    }

  def expert_action(
      self, state: ArithmeticState, key: jax.Array
  ) -> tuple[jax.Array, jax.Array]:
    """The demonstrator's next turn.

    At turn 0 the expert decides to use the tool iff `hard XOR (uniform(key) < p)`,
    with p the under-call probability on hard items and the over-call probability
    on easy ones (both default to expert_imperfect_prob); if it does not, it answers
    `ANSWER <true answer> ANSWER_END` at once. If it does, turn t < M calls
    `CALL <left> o_{t+1} x_{t+1} CALL_END` with left = x0 at turn 0 and the last
    tool result afterwards (with probability expert_wrong_arg_prob, per call, the
    right operand is off by one), and after M calls it answers the last tool result.
    With filler_max = K > 0 each turn opens with n FILLER tokens, n uniform in
    0..K (drawn per turn from the key folded with 2; the decisions above use
    the same draws as with K = 0).

    Args:
      state: unbatched ArithmeticState.
      key: PRNG key.

    Returns:
      action_tokens: int32 [A]; the turn then PAD.
      action_len: int32 [].
    """
    task = state.task
    xs, ops = _chain(task)
    m = xs.shape[0] - 1
    under, over = common.expert_error_probs(self)
    imperfect = jax.random.uniform(key) < jnp.where(task.hard, under, over)
    started = (state.turn > 0) & (state.num_tool_calls > 0)
    use_tool = (state.turn < m) & (
        started | ((state.turn == 0) & jnp.logical_xor(task.hard, imperfect))
    )
    answer = jnp.where(state.turn == 0, task.answer, state.last_tool_result)
    j = jnp.clip(state.turn, 0, m - 1)
    left = jnp.where(state.turn == 0, xs[0], state.last_tool_result)
    right = xs[j + 1]
    if self.expert_wrong_arg_prob > 0:
      wrong = (
          jax.random.uniform(jax.random.fold_in(key, 1))
          < self.expert_wrong_arg_prob
      )
      right = right + wrong.astype(jnp.int32)
    fill = []
    if self.filler_max > 0:  # static: off assembles the turns as before
      n_fill = jax.random.randint(
          jax.random.fold_in(key, 2), (), 0, self.filler_max + 1
      )
      fill = [
          (
              jnp.full((self.filler_max,), FILLER, jnp.int32),
              jnp.arange(self.filler_max) < n_fill,
          )
      ]
    call, call_len = _assemble(
        [
            *fill,
            _const_piece([tok.CALL]),
            _int_piece(left),
            _const_piece(_op_byte(ops[j])),
            _int_piece(right),
            _const_piece([tok.CALL_END]),
        ],
        self.max_action_len,
    )
    ans, ans_len = _assemble(
        [
            *fill,
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
  xs, ops = _chain(task)
  xs = [int(v) for v in np.asarray(xs)]
  ops = [OP_CHARS[int(o)] for o in np.asarray(ops)]
  text = "(" * (len(ops) - 1) + f"{xs[0]}{ops[0]}{xs[1]}"
  for j in range(1, len(ops)):
    text += f"){ops[j]}{xs[j + 1]}"
  return f"Compute {text}."
