"""The host (Python tool) twin of environments/chat_arithmetic.py.

Same tasks (drawn by `chat_arithmetic.make_tasks`, so the held-out sets are
the same items), same ChatML conversation, same facts; but the policy's turn
reaches `step` as decoded text (agentic_rl/host_rollout.py), is parsed with a
regular expression and evaluated in Python, and the observation is rendered
by agentic_text.chat.ChatFormat. Rules (on the text, trailing stop ids
dropped by the driver):

  1. text starts with 'calc(': a tool call, well-formed iff the whole text is
     `calc(<1..6 digits><+ - *><1..6 digits>)` and |result| < 10**7, else the
     observation is 'error' (a tool error). Not done unless the turn budget is
     spent;
  2. text starts with 'Answer: ': the final answer, well-formed iff the whole
     text is `Answer: <1..7 digits>`; done;
  3. anything else: format error, done.

The JAX-native environment applies the same rules to token ids; both agree
on every turn whose ids are the tokenizer's encoding of its text and whose
text encodes 'calc(' / 'Answer: ' as their own ids (tests/test_chat_arithmetic.py).
A cut turn (no stop id) is judged by its text in both.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any

import jax
import numpy as np

from agentic_text import chat
from environments import chat_arithmetic as native
from environments import common

_CALL_RE = re.compile(
    r"calc\(([0-9]{1,%d})([+*-])([0-9]{1,%d})\)"
    % (native.MAX_CALL_DIGITS, native.MAX_CALL_DIGITS)
)
_ANSWER_RE = re.compile(r"Answer: ([0-9]{1,%d})" % native.MAX_ANSWER_DIGITS)


@dataclasses.dataclass(frozen=True)
class CalcTask:
  """One task: `a op b` (op: arithmetic.ADD / SUB / MUL), its answer, hard."""

  a: int
  b: int
  op: int
  answer: int
  hard: bool


@dataclasses.dataclass(frozen=True)
class _State:
  task: CalcTask
  turn: int = 0
  done: bool = False
  answered: bool = False
  correct: bool = False
  format_error: bool = False
  num_tool_calls: int = 0
  num_tool_errors: int = 0
  tool_call_turn: tuple[bool, ...] = ()
  last_tool_result: int = 0


def _to_list(tasks) -> list[CalcTask]:
  a, b, op, answer, hard = (
      np.asarray(x)
      for x in (tasks.a, tasks.b, tasks.op, tasks.answer, tasks.hard)
  )
  return [
      CalcTask(int(a[i]), int(b[i]), int(op[i]), int(answer[i]), bool(hard[i]))
      for i in range(len(a))
  ]


@dataclasses.dataclass
class HostChatArithmeticEnv:
  """Calculator arithmetic in ChatML, tool and parser in Python.

  Attributes: as chat_arithmetic.ChatArithmeticEnv (the same defaults), plus
    tokenizer: the checkpoint's HFTokenizer (required).
  """

  max_prompt_len: int = 96
  max_action_len: int = 32
  max_obs_len: int = 20
  max_turns: int = 2
  hard_fraction: float = 0.5
  expert_imperfect_prob: float = 0.5
  expert_undercall_prob: float = -1.0
  expert_overcall_prob: float = -1.0
  system_prompt: str = native.SYSTEM_PROMPT
  tokenizer: Any = None
  is_host = True

  def __post_init__(self):
    if self.tokenizer is None:
      raise ValueError(
          "tokenizer=None: chat_arithmetic_host needs the checkpoint's "
          "tokenizer; set config.tokenizer='hf' and config.model.hf_path"
      )
    if self.max_turns < 2:
      raise ValueError(f"max_turns={self.max_turns}: needs >= 2")

  @functools.cached_property
  def chat_format(self) -> chat.ChatFormat:
    return chat.ChatFormat(self.tokenizer, tool_role=native.TOOL_ROLE)

  # --------------------------------------------------------------- tasks

  def sample_tasks(self, rng: np.random.Generator, n: int) -> list[CalcTask]:
    key = jax.random.key(int(rng.integers(0, 2**31 - 1)))
    return _to_list(native.make_tasks(key, n, self.hard_fraction))

  def eval_tasks(self, n: int, seed: int) -> list[CalcTask]:
    """The JAX-native environment's held-out set (the same items)."""
    return _to_list(
        native.make_tasks(
            jax.random.key(seed),
            n,
            self.hard_fraction,
            int(round(n * self.hard_fraction)),
        )
    )

  # -------------------------------------------------------------- episode

  def reset(self, task: CalcTask):
    prompt = self.chat_format.prompt(
        self.system_prompt,
        native.question_text(task.a, task.op, task.b),
        self.max_prompt_len,
    )
    return _State(task, tool_call_turn=(False,) * self.max_turns), prompt

  def _observation(self, content: str):
    return self.chat_format.observation(content, self.max_obs_len)

  def step(self, state: _State, action_text: str):
    """One turn on its decoded text (rules in the module docstring).

    Returns:
      (state, observation (ids, roles) or empty ids, done).
    """
    if state.done:
      return state, np.zeros((0,), np.int32), True
    text = action_text
    turn = state.turn + 1
    empty = np.zeros((0,), np.int32)
    if text.startswith(native.CALL_OPEN):
      m = _CALL_RE.fullmatch(text)
      result = None
      if m:
        op = native.OP_CHARS.index(m.group(2))
        value = native.apply_op(int(m.group(1)), op, int(m.group(3)))
        if abs(value) < native.MAX_RESULT:
          result = value
      calls = list(state.tool_call_turn)
      calls[state.turn] = True
      done = turn >= self.max_turns
      new = dataclasses.replace(
          state,
          turn=turn,
          done=done,
          num_tool_calls=state.num_tool_calls + 1,
          num_tool_errors=state.num_tool_errors + (result is None),
          tool_call_turn=tuple(calls),
          last_tool_result=0 if result is None else result,
      )
      content = native.ERROR_TEXT if result is None else str(result)
      return new, self._observation(content), done
    if text.startswith(native.ANSWER_OPEN):
      m = _ANSWER_RE.fullmatch(text)
      ok = m is not None
      return (
          dataclasses.replace(
              state,
              turn=turn,
              done=True,
              answered=ok,
              correct=ok and int(m.group(1)) == state.task.answer,
              format_error=not ok,
          ),
          empty,
          True,
      )
    return (
        dataclasses.replace(state, turn=turn, done=True, format_error=True),
        empty,
        True,
    )

  def facts(self, state: _State) -> dict[str, np.ndarray]:
    """The JAX-native environment's facts except 'progress'."""
    return {
        "correct": np.bool_(state.correct),
        "answered": np.bool_(state.answered),
        "format_error": np.bool_(state.format_error),
        "num_tool_calls": np.int32(state.num_tool_calls),
        "num_tool_errors": np.int32(state.num_tool_errors),
        "hard": np.bool_(state.task.hard),
        "tool_necessary": np.bool_(state.task.hard),
        "tool_call_turn": np.asarray(state.tool_call_turn, bool),
    }

  def expert_action(self, state: _State, rng: np.random.Generator):
    """The native environment's demonstrator, drawn with numpy."""
    task = state.task
    under, over = common.expert_error_probs(self)
    imperfect = rng.uniform() < (under if task.hard else over)
    if state.turn == 0 and (task.hard != imperfect):
      text = native.call_text(task.a, task.op, task.b)
    else:
      text = native.answer_text(
          task.answer if state.turn == 0 else state.last_tool_result
      )
    return self.chat_format.assistant(text, self.max_action_len)
