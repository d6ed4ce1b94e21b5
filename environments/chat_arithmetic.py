"""Arithmetic with a calculator tool in a chat checkpoint's own ChatML format,
JAX-native on the checkpoint's real token ids (see `base.py`).

The task of `arithmetic.py` (hard items: 3-digit x 2-digit products, which need
the tool; easy items: single-digit sums and products, which do not), written in
the checkpoint's chat template and tokenizer instead of the byte tokenizer.
SmolLM2's tokenizer writes every digit as its own token, so a call, its
operands and the observation's digits are fixed token ids: the environment
parses and writes them with jnp, and a whole GRPO iteration of a pretrained
checkpoint (rollout included) is one XLA program. `ChatTokenTable` holds every
id the environment reads or writes; it is built from the tokenizer at config
time and checked there: the assembled ids of probe prompts, calls, answers and
observations must equal the tokenizer's own encoding of the same text.

Conversation (ChatML; `<s>` = <|im_start|>, `</s>` = <|im_end|>):

  <s>system\\n{SYSTEM_PROMPT}</s>\\n<s>user\\nWhat is 483*27?</s>\\n<s>assistant\\n
  calc(483*27)</s>                         (a tool call: the policy's turn)
  \\n<s>tool\\n13041</s>\\n<s>assistant\\n   (the observation, then a new turn)
  Answer: 13041</s>                        (the final answer: the episode ends)

Turn classification (the body is the turn without its one trailing stop id,
<|im_end|> or <|endoftext|>; a turn cut by max_action_len has no stop id):

  1. body starts with the ids of `calc(`: a tool call. Well-formed iff the
     body is exactly `calc(` <1..6 digits> <+ - *> <1..6 digits> `)`; the
     result must satisfy |result| < 10**7, else (malformed, or too large) the
     observation is `error` and a tool error is counted. Not done (unless the
     turn budget is spent).
  2. body starts with the ids of `Answer: `: the final answer, well-formed iff
     the body is exactly `Answer: ` <1..7 digits>; done either way (a malformed
     answer is a format error).
  3. anything else (including an empty turn): format error, done.

Only the canonical tokenisation of a text counts (e.g. `calc(` must be the
ids `calc`, `(`); the host twin (environments/host/chat_arithmetic.py) parses
the decoded text with a regular expression, and both score a turn the same
whenever its ids are the tokenizer's encoding of its text (tested).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from agentic_text import tokenizers as tok
from environments import arithmetic
from environments import common

ADD, SUB, MUL = arithmetic.ADD, arithmetic.SUB, arithmetic.MUL
OP_CHARS = arithmetic.OP_CHARS

# Short on purpose: the whole prompt (scaffolding, this text, the question)
# stays under 96 SmolLM2 tokens.
SYSTEM_PROMPT = (
    "You are a helpful assistant with a calculator tool. To use it, reply "
    "with only calc(A*B), for example calc(12*34); the tool replies with the "
    "result. Otherwise reply with only Answer: followed by the number."
)
QUESTION = "What is {expr}?"
CALL_OPEN = "calc("
CALL_CLOSE = ")"
ANSWER_OPEN = "Answer: "
ERROR_TEXT = "error"
TOOL_ROLE = "tool"

MAX_CALL_DIGITS = 6  # digits per call operand
MAX_ANSWER_DIGITS = 7  # digits of a final answer
MAX_RESULT = 10**7  # |tool result| must be below this
_INT32_MAX = 2**31 - 1
_NUM_DIGITS = 8  # rendered digit positions (results < 10**7, answers)
_POW10 = np.array([10**i for i in range(_NUM_DIGITS)], np.int32)


def apply_op(a: int, op: int, b: int) -> int:
  """`a op b` on Python ints (the host tool)."""
  return a + b if op == ADD else a - b if op == SUB else a * b


def question_text(a: int, op: int, b: int) -> str:
  """The user message, e.g. 'What is 483*27?'."""
  return QUESTION.format(expr=f"{a}{OP_CHARS[op]}{b}")


def call_text(a: int, op: int, b: int) -> str:
  """A tool call, e.g. 'calc(483*27)'."""
  return f"{CALL_OPEN}{a}{OP_CHARS[op]}{b}{CALL_CLOSE}"


def answer_text(value: int) -> str:
  """A final answer, e.g. 'Answer: 13041'."""
  return f"{ANSWER_OPEN}{value}"


@dataclasses.dataclass(frozen=True)
class ChatTokenTable:
  """Every token id the JAX-native environment reads or writes (hashable).

  Attributes:
    digits: ids of '0'..'9' (each digit one token), 10 ints.
    ops: ids of '+', '-', '*' after a digit.
    minus: id of '-' opening a negative tool result.
    prompt_head: ids of the prompt up to the question's first digit.
    prompt_tail: ids after the question's last digit ('?', end of the user
      message, the generation prompt).
    call_open, call_close: ids of 'calc(' (a turn's start) and ')'.
    answer_open: ids of 'Answer: ' (a turn's start).
    obs_head: ids between the turn's <|im_end|> and the tool result
      ('\\n<|im_start|>tool\\n').
    obs_tail: ids after the result ('<|im_end|>\\n<|im_start|>assistant\\n').
    error: ids of the error result 'error'.
    end: id of <|im_end|>, which ends an assistant turn.
    stops: ids that end a turn (<|im_end|> first, then the tokenizer's eos).
  """

  digits: tuple[int, ...]
  ops: tuple[int, ...]
  minus: int
  prompt_head: tuple[int, ...]
  prompt_tail: tuple[int, ...]
  call_open: tuple[int, ...]
  call_close: tuple[int, ...]
  answer_open: tuple[int, ...]
  obs_head: tuple[int, ...]
  obs_tail: tuple[int, ...]
  error: tuple[int, ...]
  end: int
  stops: tuple[int, ...]

  @classmethod
  def from_tokenizer(
      cls, tokenizer, system_prompt: str = SYSTEM_PROMPT
  ) -> "ChatTokenTable":
    """Reads the ids from an HF chat tokenizer and checks them (see `check`).

    Raises:
      ValueError: the tokenizer does not write digits, operators or the
        markers as the fixed ids this environment needs (the message names
        the text whose encoding differs).
    """
    from agentic_text import chat  # pylint: disable=g-import-not-at-top

    fmt = chat.ChatFormat(tokenizer, tool_role=TOOL_ROLE)

    def enc(text: str) -> tuple[int, ...]:
      return tuple(int(i) for i in tokenizer.encode(text))

    digits = tuple(_single(tokenizer, str(d)) for d in range(10))
    ops = tuple(enc("1" + c + "1")[1] for c in OP_CHARS)
    # The question "0+0" is the ids (0, +, 0): the last zero ends it.
    prompt, _ = fmt.prompt(system_prompt, question_text(0, ADD, 0), 10**6)
    zero = digits[0]
    last = len(prompt) - 1 - list(prompt)[::-1].index(zero)
    first = last - 2
    close = [int(i) for i in fmt.close_turn([fmt.end_id])[0]]
    obs_ok = close + [int(i) for i in fmt.observation("0", 10**6)[0]]
    zpos = len(obs_ok) - 1 - obs_ok[::-1].index(zero)
    obs_err = [int(i) for i in fmt.observation(ERROR_TEXT, 10**6)[0]]
    tail = tuple(obs_ok[zpos + 1 :])
    table = cls(
        digits=digits,
        ops=ops,
        minus=enc("\n-1")[1],
        prompt_head=tuple(int(i) for i in prompt[:first]),
        prompt_tail=tuple(int(i) for i in prompt[last + 1 :]),
        call_open=enc(CALL_OPEN),
        call_close=enc(CALL_CLOSE),
        answer_open=enc(ANSWER_OPEN),
        obs_head=tuple(obs_ok[:zpos]),
        obs_tail=tail,
        error=tuple(obs_err[zpos - len(close) : len(obs_err) - len(tail)]),
        end=int(fmt.end_id),
        stops=tuple(int(t) for t in fmt.stop_tokens),
    )
    table.check(tokenizer, system_prompt)
    return table

  # ------------------------------------------------------------ host renders

  def prompt_ids(self, a: int, op: int, b: int) -> list[int]:
    return [
        *self.prompt_head,
        *self.number_ids(a),
        self.ops[op],
        *self.number_ids(b),
        *self.prompt_tail,
    ]

  def number_ids(self, x: int) -> list[int]:
    return ([self.minus] if x < 0 else []) + [
        self.digits[int(c)] for c in str(abs(int(x)))
    ]

  def call_ids(self, a: int, op: int, b: int) -> list[int]:
    return [
        *self.call_open,
        *self.number_ids(a),
        self.ops[op],
        *self.number_ids(b),
        *self.call_close,
        self.end,
    ]

  def answer_ids(self, value: int) -> list[int]:
    return [*self.answer_open, *self.number_ids(value), self.end]

  def check(self, tokenizer, system_prompt: str = SYSTEM_PROMPT) -> None:
    """Checks the table against the tokenizer on probe texts.

    Raises:
      ValueError: an assembled prompt, call, answer or observation differs
        from the chat template's render tokenised by the tokenizer.
    """
    from agentic_text import chat  # pylint: disable=g-import-not-at-top

    fmt = chat.ChatFormat(tokenizer, tool_role=TOOL_ROLE)
    probes = [(483, MUL, 27), (7, ADD, 0), (9, SUB, 12), (100, MUL, 99)]
    probes += [(5, MUL, 8), (123456, SUB, 654321)]
    for a, op, b in probes:
      want, _ = fmt.prompt(system_prompt, question_text(a, op, b), 10**6)
      _expect(self.prompt_ids(a, op, b), want, question_text(a, op, b))
      _expect(
          self.call_ids(a, op, b),
          fmt.assistant(call_text(a, op, b)),
          call_text(a, op, b),
      )
    for v in (0, 7, 13041, 9999999, -6):
      if v >= 0:
        _expect(self.answer_ids(v), fmt.assistant(answer_text(v)), str(v))
      close = [int(i) for i in fmt.close_turn([self.end])[0]]
      obs, _ = fmt.observation(str(v), 10**6)
      _expect(
          [*self.obs_head, *self.number_ids(v), *self.obs_tail],
          close + list(obs),
          f"tool result {v}",
      )
    close = [int(i) for i in fmt.close_turn([self.end])[0]]
    obs, _ = fmt.observation(ERROR_TEXT, 10**6)
    _expect(
        [*self.obs_head, *self.error, *self.obs_tail],
        close + list(obs),
        "tool result 'error'",
    )


def _single(tokenizer, text: str) -> int:
  ids = list(tokenizer.encode(text))
  if len(ids) != 1:
    raise ValueError(
        f"the tokenizer writes {text!r} as {ids}, not one token: the "
        "JAX-native chat arithmetic needs one token per digit"
    )
  return int(ids[0])


def _expect(got, want, what: str) -> None:
  got = [int(i) for i in got]
  want = [int(i) for i in np.asarray(want).reshape(-1)]
  if got != want:
    raise ValueError(
        f"token table: {what!r} assembles to {got}, the tokenizer encodes "
        f"{want}"
    )


@flax.struct.dataclass
class ChatArithmeticState:
  """Unbatched episode state (K = max_turns).

  Attributes:
    task: the episode's arithmetic.ArithmeticTask (scalar fields).
    turn: int32 []; turns taken.
    done, answered, correct, format_error: bool [].
    num_tool_calls, num_tool_errors: int32 [].
    tool_call_turn: bool [K]; which turns were tool calls.
    last_tool_result: int32 []; the last well-formed call's result (0 if none).
    progress: float32 [K + 1]; progress[k] = 1 iff an observation after k
      turns holds the answer (0 past the last turn).
  """

  task: arithmetic.ArithmeticTask
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


def make_tasks(
    key: jax.Array, n: int, hard_fraction: float, num_hard: int = -1
) -> arithmetic.ArithmeticTask:
  """n tasks: hard `a*b` (a in 100..999, b in 10..99) or easy `a+b` / `a*b`
  (a, b in 0..9, + or * with probability 1/2 each; answers are >= 0).

  Args:
    key: PRNG key.
    n: static number of tasks.
    hard_fraction: probability that a task is hard (if num_hard < 0).
    num_hard: if >= 0, exactly the first num_hard tasks are hard.

  Returns:
    ArithmeticTask with fields of shape [n].
  """
  u = jax.random.uniform(key, (6, n))
  hard = jnp.where(
      num_hard >= 0, jnp.arange(n) < num_hard, u[0] < hard_fraction
  )

  def draw(x, lo, hi):
    return jnp.minimum(lo + jnp.floor(x * (hi - lo)), hi - 1).astype(jnp.int32)

  a = jnp.where(hard, draw(u[1], 100, 1000), draw(u[2], 0, 10))
  b = jnp.where(hard, draw(u[3], 10, 100), draw(u[4], 0, 10))
  op = jnp.where(hard | (u[5] < 0.5), MUL, ADD).astype(jnp.int32)
  answer = jnp.where(op == MUL, a * b, a + b).astype(jnp.int32)
  return arithmetic.ArithmeticTask(a=a, b=b, op=op, answer=answer, hard=hard)


def _digits_piece(x: jax.Array, table: ChatTokenTable):
  """Decimal ids of an int32 scalar (|x| < 10**8) as a masked piece [9]."""
  x = jnp.asarray(x, jnp.int32)
  mag = jnp.abs(x)
  pows = jnp.asarray(_POW10[::-1].copy())
  d = jax.lax.rem(jax.lax.div(mag, pows), 10)
  keep = (jnp.cumsum(d != 0) > 0).at[-1].set(True)
  ids = jnp.asarray(table.digits, jnp.int32)[d]
  tokens = jnp.concatenate([jnp.array([table.minus], jnp.int32), ids])
  return tokens, jnp.concatenate([(x < 0)[None], keep])


def _parse_digits(
    tokens: jax.Array,
    start: jax.Array,
    end: jax.Array,
    max_digits: int,
    table: ChatTokenTable,
) -> tuple[jax.Array, jax.Array]:
  """tokens[start:end] as an unsigned decimal of 1..max_digits digit ids.

  Returns:
    value: int32 [] (meaningless when not ok); ok: bool [].
  """
  pos = jnp.arange(tokens.shape[0])
  in_span = (pos >= start) & (pos < end)
  match = tokens[:, None] == jnp.asarray(table.digits, jnp.int32)[None, :]
  is_digit = jnp.any(match, axis=1)
  digit = jnp.argmax(match, axis=1).astype(jnp.int32)
  n = end - start
  ok = (n >= 1) & (n <= max_digits) & jnp.all(is_digit | ~in_span)
  power = jnp.clip(end - 1 - pos, 0, _NUM_DIGITS - 1)
  term = digit * jnp.asarray(_POW10)[power]
  return jnp.sum(jnp.where(in_span, term, 0)).astype(jnp.int32), ok


def _starts_with(tokens, body_len, prefix: tuple[int, ...]) -> jax.Array:
  n = len(prefix)
  return (body_len >= n) & jnp.all(tokens[:n] == jnp.asarray(prefix, jnp.int32))


@dataclasses.dataclass(frozen=True)
class ChatArithmeticEnv:
  """Calculator arithmetic in ChatML on a chat checkpoint's token ids.

  Attributes:
    max_prompt_len: P, prompt ids (the longest prompt must fit; checked).
    max_action_len: A, ids of one assistant turn (>= 16: the longest expert
      call; the smollm2_calc config uses 32).
    max_obs_len: O, observation ids (>= the longest observation; checked).
    max_turns: K, assistant turns per episode (>= 2: a call, then the answer).
    hard_fraction: probability that a sampled task is hard.
    expert_imperfect_prob: probability that the demonstrator does the wrong
      thing in an episode: answers a hard item directly (with the true value,
      which a small model cannot compute, so imitating it leaves hard items
      mostly wrong) or calls the tool on an easy one.
    expert_undercall_prob, expert_overcall_prob: if >= 0, override
      expert_imperfect_prob on hard / easy items.
    system_prompt: the system message (the tool's description).
    tokenizer: the checkpoint's agentic_text.tokenizers.HFTokenizer (given by
      train.make_env with config.tokenizer = 'hf'); read once into `table`.
    table: the ChatTokenTable (built from `tokenizer` when not given).
  """

  max_prompt_len: int = 96
  max_action_len: int = 32
  max_obs_len: int = 20
  max_turns: int = 2
  hard_fraction: float = 0.5
  expert_imperfect_prob: float = 0.5
  expert_undercall_prob: float = -1.0
  expert_overcall_prob: float = -1.0
  system_prompt: str = SYSTEM_PROMPT
  tokenizer: Any = dataclasses.field(default=None, compare=False, repr=False)
  table: ChatTokenTable | None = None

  # train.make_env / validation hand this environment the checkpoint's
  # tokenizer (config.tokenizer = 'hf') although it is JAX-native.
  takes_hf_tokenizer = True

  def __post_init__(self):
    if self.table is None:
      if self.tokenizer is None:
        raise ValueError(
            "tokenizer=None: chat_arithmetic reads its token ids from the "
            "checkpoint's tokenizer; set config.tokenizer='hf' and "
            "config.model.hf_path"
        )
      object.__setattr__(
          self,
          "table",
          ChatTokenTable.from_tokenizer(self.tokenizer, self.system_prompt),
      )
    common.check_probabilities(self, ("hard_fraction", "expert_imperfect_prob"))
    for f in ("expert_undercall_prob", "expert_overcall_prob"):
      v = getattr(self, f)
      if not (v == -1.0 or 0.0 <= v <= 1.0):
        raise ValueError(f"{f} must be a probability in [0, 1] or -1, got {v}")
    t = self.table
    longest = len(t.prompt_ids(999, MUL, 99))
    if self.max_prompt_len < longest:
      raise ValueError(
          f"max_prompt_len={self.max_prompt_len}: the longest prompt has "
          f"{longest} ids"
      )
    obs = 1 + len(t.obs_head) + 1 + _NUM_DIGITS - 1 + len(t.obs_tail)
    if self.max_obs_len < obs:
      raise ValueError(
          f"max_obs_len={self.max_obs_len}: the longest observation has "
          f"{obs} ids"
      )
    expert = len(t.call_ids(999, MUL, 99))
    if self.max_action_len < expert:
      raise ValueError(
          f"max_action_len={self.max_action_len}: the expert's call has "
          f"{expert} ids"
      )
    if self.max_turns < 2:
      raise ValueError(f"max_turns={self.max_turns}: needs >= 2")

  @property
  def stop_tokens(self) -> tuple[int, ...]:
    """Ids that end a turn (rollout.env_stop_tokens)."""
    return self.table.stops

  @property
  def tool_call_tokens(self) -> tuple[int, ...]:
    """The id opening a call (banned on dual-path tool-free rows)."""
    return self.table.call_open[:1]

  def prompt_length(self, task) -> int:
    """Host-side prompt length in ids of one unbatched task."""
    return len(self.table.prompt_ids(int(task.a), int(task.op), int(task.b)))

  # --------------------------------------------------------------- tasks

  def sample_tasks(self, key: jax.Array, n: int) -> arithmetic.ArithmeticTask:
    """n i.i.d. tasks, each hard with probability hard_fraction ([n] fields)."""
    return make_tasks(key, n, self.hard_fraction)

  def eval_tasks(self, n: int, seed: int) -> arithmetic.ArithmeticTask:
    """A fixed held-out set: the first round(n * hard_fraction) are hard."""
    return make_tasks(
        jax.random.key(seed),
        n,
        self.hard_fraction,
        int(round(n * self.hard_fraction)),
    )

  # -------------------------------------------------------------- episode

  def reset(self, task: arithmetic.ArithmeticTask):
    """Starts an episode.

    Returns:
      state: ChatArithmeticState; prompt_tokens: int32 [P] (then PAD);
      prompt_len: int32 [].
    """
    t = self.table
    prompt, prompt_len = common.assemble(
        [
            common.const_piece(t.prompt_head),
            _digits_piece(task.a, t),
            common.const_piece(jnp.asarray(t.ops, jnp.int32)[task.op]),
            _digits_piece(task.b, t),
            common.const_piece(t.prompt_tail),
        ],
        self.max_prompt_len,
    )
    k = self.max_turns
    state = ChatArithmeticState(
        task=task,
        turn=jnp.zeros((), jnp.int32),
        done=jnp.zeros((), bool),
        answered=jnp.zeros((), bool),
        correct=jnp.zeros((), bool),
        format_error=jnp.zeros((), bool),
        num_tool_calls=jnp.zeros((), jnp.int32),
        num_tool_errors=jnp.zeros((), jnp.int32),
        tool_call_turn=jnp.zeros((k,), bool),
        last_tool_result=jnp.zeros((), jnp.int32),
        progress=jnp.zeros((k + 1,), jnp.float32),
    )
    return state, prompt, prompt_len

  def _parse_call(self, tokens, body_len):
    """(result int32 [], ok bool []) of `calc(<a><op><b>)` (body only)."""
    t = self.table
    n_open, n_close = len(t.call_open), len(t.call_close)
    pos = jnp.arange(tokens.shape[0])
    inner = (pos >= n_open) & (pos < body_len - n_close)
    ops = jnp.asarray(t.ops, jnp.int32)
    op_match = tokens[:, None] == ops[None, :]
    op_mask = inner & jnp.any(op_match, axis=1)
    p = jnp.argmax(op_mask).astype(jnp.int32)
    op = jnp.argmax(op_match[p]).astype(jnp.int32)
    a, ok_a = _parse_digits(tokens, n_open, p, MAX_CALL_DIGITS, t)
    b, ok_b = _parse_digits(
        tokens, p + 1, body_len - n_close, MAX_CALL_DIGITS, t
    )
    close = jnp.ones((), bool)
    for i, c in enumerate(t.call_close):
      idx = jnp.clip(body_len - n_close + i, 0, tokens.shape[0] - 1)
      close = close & (tokens[idx] == c)
    well_formed = (
        _starts_with(tokens, body_len, t.call_open)
        & (body_len >= n_open + n_close + 3)
        & close
        & (jnp.sum(op_mask) == 1)
        & ok_a
        & ok_b
    )
    overflow = (op == MUL) & (
        a > jax.lax.div(jnp.int32(_INT32_MAX), jnp.maximum(b, 1))
    )
    result = arithmetic._apply_op(a, op, b)  # pylint: disable=protected-access
    ok = well_formed & ~overflow & (jnp.abs(result) < MAX_RESULT)
    return jnp.where(ok, result, 0).astype(jnp.int32), ok

  def _parse_answer(self, tokens, body_len):
    """(value int32 [], ok bool []) of `Answer: <digits>` (body only)."""
    t = self.table
    n = len(t.answer_open)
    value, ok = _parse_digits(tokens, n, body_len, MAX_ANSWER_DIGITS, t)
    return value, ok & _starts_with(tokens, body_len, t.answer_open)

  def step(self, state: ChatArithmeticState, action_tokens, action_len):
    """Applies one assistant turn (rules in the module docstring).

    Args:
      state: unbatched ChatArithmeticState.
      action_tokens: int32 [A]; the turn is action_tokens[:action_len].
      action_len: int32 []; clipped to [0, A].

    Returns:
      (state, obs_tokens int32 [O] then PAD, obs_len int32 [], done bool []).
    """
    t = self.table
    tokens = jnp.asarray(action_tokens, jnp.int32).reshape(-1)
    num_a = tokens.shape[0]
    length = jnp.clip(jnp.asarray(action_len, jnp.int32), 0, num_a)
    last = tokens[jnp.clip(length - 1, 0, num_a - 1)]
    stopped = (length >= 1) & jnp.any(last == jnp.asarray(t.stops, jnp.int32))
    body_len = length - stopped.astype(jnp.int32)
    active = ~state.done
    is_call = active & _starts_with(tokens, body_len, t.call_open)
    is_answer = active & _starts_with(tokens, body_len, t.answer_open)
    is_other = active & ~is_call & ~is_answer
    result, call_ok = self._parse_call(tokens, body_len)
    answer, answer_ok = self._parse_answer(tokens, body_len)

    # The observation: <|im_end|> unless the turn ended with it, then the tool
    # message and the next generation prompt.
    close = common.const_piece([t.end])
    close = (close[0], jnp.reshape(last != t.end, (1,)) | ~stopped)
    head = common.const_piece(t.obs_head)
    tail = common.const_piece(t.obs_tail)
    obs_ok, len_ok = common.assemble(
        [close, head, _digits_piece(result, t), tail], self.max_obs_len
    )
    obs_err, len_err = common.assemble(
        [close, head, common.const_piece(t.error), tail], self.max_obs_len
    )
    obs = jnp.where(call_ok, obs_ok, obs_err)
    obs = jnp.where(is_call, obs, jnp.full_like(obs, tok.PAD))
    obs_len = jnp.where(is_call, jnp.where(call_ok, len_ok, len_err), 0)

    answered = is_answer & answer_ok
    turn = state.turn + active.astype(jnp.int32)
    done = state.done | is_answer | is_other | (turn >= self.max_turns)
    at_turn = jnp.arange(self.max_turns) == state.turn
    holds = is_call & call_ok & (result == state.task.answer)
    progress = common.progress_update(
        state.progress,
        turn,
        active,
        jnp.maximum(holds, state.progress[state.turn] > 0),
    )
    new_state = state.replace(
        turn=turn,
        done=done,
        answered=state.answered | answered,
        correct=state.correct | (answered & (answer == state.task.answer)),
        format_error=state.format_error | is_other | (is_answer & ~answer_ok),
        num_tool_calls=state.num_tool_calls + is_call.astype(jnp.int32),
        num_tool_errors=state.num_tool_errors
        + (is_call & ~call_ok).astype(jnp.int32),
        tool_call_turn=state.tool_call_turn | (is_call & at_turn),
        last_tool_result=jnp.where(
            is_call, result, state.last_tool_result
        ).astype(jnp.int32),
        progress=progress,
    )
    return new_state, obs.astype(jnp.int32), obs_len.astype(jnp.int32), done

  def facts(self, state: ChatArithmeticState) -> dict[str, jax.Array]:
    """'correct', 'answered', 'format_error', 'hard', 'tool_necessary' bool [];
    'num_tool_calls', 'num_tool_errors' int32 []; 'tool_call_turn' bool [K];
    'progress' float32 [K + 1]."""
    hard = jnp.asarray(state.task.hard, bool)
    return {
        "correct": state.correct,
        "answered": state.answered,
        "format_error": state.format_error,
        "num_tool_calls": state.num_tool_calls,
        "num_tool_errors": state.num_tool_errors,
        "hard": hard,
        "tool_necessary": hard,
        "tool_call_turn": state.tool_call_turn,
        "progress": state.progress,
    }

  def expert_action(self, state: ChatArithmeticState, key: jax.Array):
    """The demonstrator's next turn: at turn 0 it calls the tool iff
    `hard XOR (uniform(key) < p)` (p: the under-call probability on hard
    items, the over-call one on easy items), else answers the true value at
    once; after a call it answers the tool's result.

    Returns:
      (action_tokens int32 [A] then PAD, action_len int32 []).
    """
    t = self.table
    task = state.task
    under, over = common.expert_error_probs(self)
    imperfect = jax.random.uniform(key) < jnp.where(task.hard, under, over)
    use_tool = (state.turn == 0) & jnp.logical_xor(task.hard, imperfect)
    value = jnp.where(state.turn == 0, task.answer, state.last_tool_result)
    end = common.const_piece([t.end])
    call, call_len = common.assemble(
        [
            common.const_piece(t.call_open),
            _digits_piece(task.a, t),
            common.const_piece(jnp.asarray(t.ops, jnp.int32)[task.op]),
            _digits_piece(task.b, t),
            common.const_piece(t.call_close),
            end,
        ],
        self.max_action_len,
    )
    ans, ans_len = common.assemble(
        [common.const_piece(t.answer_open), _digits_piece(value, t), end],
        self.max_action_len,
    )
    return (
        jnp.where(use_tool, call, ans).astype(jnp.int32),
        jnp.where(use_tool, call_len, ans_len).astype(jnp.int32),
    )
