"""BFCL multi_turn_base as a host environment (`BFCLMultiTurnEnv`).

The episode spans every user question; the policy's calls are executed against
BFCL's executable API classes (execution.py); a turn without a call ends the
current user question and the next one arrives as the observation. `correct`
is BFCL's state check: after the episode, every API instance's public
attributes equal those after executing the gold calls. Chat format: tool
results come back as `tool` messages and the next user question as a `user`
message, each followed by the next generation prompt.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any

import numpy as np

from agentic_text import chat
from agentic_text import tokenizers as tok
from environments.host import parsers
from environments.host.bfcl.data import BFCLTask, load_category
from environments.host.bfcl.execution import (
    CallResult,
    MAX_RESULT_CHARS,
    TOOL_TIMEOUT_S,
    gold_instances,
    make_instances,
    public_state,
    run_call,
)
from environments.host.bfcl.prompts import chat_prompt, encode, render_prompt


def first_call_payload(text: str) -> str | None:
  """The payload of the first `<call>` or `<tool_call>` block: up to the next
  `</call>` or `</tool_call>`, else to the end of the text (less one final
  newline); None without an opening tag.

  Same result as `re.search(r"<(?:tool_)?call>(.*?)(?:</(?:tool_)?call>|$)",
  text, re.DOTALL).group(1)`, in O(len(text)) time.
  """
  found = [
      (i, len(tag))
      for tag in ("<call>", "<tool_call>")
      for i in (text.find(tag),)
      if i >= 0
  ]
  if not found:
    return None
  i, n = min(found)
  start = i + n
  ends = [
      e
      for e in (text.find("</call>", start), text.find("</tool_call>", start))
      if e >= 0
  ]
  if ends:
    return text[start : min(ends)]
  end = (
      len(text) - 1
      if text.endswith("\n") and len(text) - 1 >= start
      else len(text)
  )
  return text[start:end]


@dataclasses.dataclass
class _MultiState:
  task: BFCLTask
  instances: dict
  question: int = 0
  turns: int = 0
  calls: int = 0
  errors: int = 0
  exceptions: int = 0
  timeouts: int = 0
  format_errors: int = 0
  done: bool = False
  correct: bool = False
  expert_called: int = -1  # question whose gold calls the expert has sent


@dataclasses.dataclass(frozen=True, eq=False)
class BFCLMultiTurnEnv:
  """BFCL multi_turn_base as a host environment (see bfcl/__init__.py).

  Facts: correct (BFCL state check at the end), answered (every user question
  reached its end), format_error (False: a turn without a call is a reply),
  num_tool_calls, num_tool_errors (failed executions and unparseable calls
  count; an unparseable call turn is 1 call and 1 error, so errors <= calls),
  num_tool_exceptions / num_tool_timeouts (calls that raised / passed their
  time limit; also counted as errors), questions_done (user questions
  finished), hard (True).

  Tool limits (`run_call`): each call runs in a worker thread with
  `tool_timeout_s`, the calls of one turn share `turn_timeout_s`, arguments
  over `check_call_arguments`' bounds are refused, results are cut to
  `max_result_chars`. A call that times out may still be running, so the
  episode ends there (its API state can no longer be trusted).
  """

  eval_every: int = 5
  max_prompt_len: int = 2048
  max_action_len: int = 128
  max_obs_len: int = 256
  max_turns: int = 16
  descriptions: bool = False
  tokenizer: Any = dataclasses.field(default_factory=tok.ByteTokenizer)
  tool_timeout_s: float = TOOL_TIMEOUT_S
  turn_timeout_s: float = 20.0
  max_result_chars: int = MAX_RESULT_CHARS
  is_host = True

  @property
  def step_timeout_s(self) -> float:
    """The host driver's limit on one step: the turn's calls plus the gold
    replay of the state check at the episode's end."""
    return self.turn_timeout_s + 40.0

  @functools.cached_property
  def chat_format(self):
    """agentic_text.chat.ChatFormat for an HF tokenizer, else None (byte format)."""
    return chat.make_format(self.tokenizer)

  def __post_init__(self):
    for name in ("tool_timeout_s", "turn_timeout_s"):
      if not getattr(self, name) > 0:
        raise ValueError(
            f"BFCLMultiTurnEnv.{name}={getattr(self, name)!r}: must be > 0"
        )
    if not self.max_result_chars > 0:
      raise ValueError(
          f"BFCLMultiTurnEnv.max_result_chars={self.max_result_chars!r}: "
          "must be > 0"
      )

  def tool_failure(self, state: _MultiState, message: str):
    """The host driver's result for a step that raised or timed out: one
    failed call, `message` as the observation, and the episode ends (the API
    state may be half-updated or still changing)."""
    state.calls += 1
    state.errors += 1
    state.done = True
    return state, self._obs(message), True

  @functools.cached_property
  def _splits(self):
    tasks = load_category("multi_turn_base")
    return (
        [t for i, t in enumerate(tasks) if i % self.eval_every],
        [t for i, t in enumerate(tasks) if i % self.eval_every == 0],
    )

  def sample_tasks(self, rng: np.random.Generator, n: int):
    train = self._splits[0]
    return [train[i] for i in rng.integers(0, len(train), size=n)]

  def eval_tasks(self, n: int, seed: int):
    held = self._splits[1]
    order = np.random.default_rng(seed).permutation(len(held))
    return [held[i] for i in order[:n]]

  def reset(self, task: BFCLTask):
    if self.chat_format is not None:
      return (
          _MultiState(task, make_instances(task)),
          chat_prompt(
              self.chat_format, task, self.descriptions, self.max_prompt_len
          ),
      )
    ids = encode(
        self.tokenizer,
        render_prompt(task, self.descriptions),
        self.max_prompt_len,
        prefix=(self.tokenizer.bos_id,),
    )
    return _MultiState(task, make_instances(task)), ids

  def _obs(self, text: str, role: str | None = None):
    if self.chat_format is not None:
      return self.chat_format.observation(text, self.max_obs_len, role=role)
    return encode(
        self.tokenizer,
        text,
        self.max_obs_len,
        prefix=(tok.OBS,),
        suffix=(tok.OBS_END,),
    )

  def step(self, state: _MultiState, action_text: str):
    if state.done:
      return state, np.zeros((0,), np.int32), True
    state.turns += 1
    has_call = "<call>" in action_text or "<tool_call>" in action_text
    calls = parsers.parse_tool_calls(action_text) if has_call else None
    if calls is None and self.chat_format is not None:
      # Chat format: a bare Python-call / JSON call list is a call too.
      bare = parsers.parse_tool_calls(action_text)
      calls = bare if isinstance(bare, list) else None
    if isinstance(calls, parsers.ParseError):
      # BFCL's own multi-turn calls use positional arguments (`sort('a.txt')`).
      payload = first_call_payload(action_text)
      alt = (
          parsers.parse_python_calls(payload, True)
          if payload is not None
          else calls
      )
      calls = alt if isinstance(alt, list) else calls
    if isinstance(calls, parsers.ParseError):
      state.errors += 1
      state.calls += 1
      obs = self._obs(f"Error: {calls.reason}")
    elif calls:
      results = []
      deadline = time.monotonic() + self.turn_timeout_s
      timed_out = False
      for c in calls:
        state.calls += 1
        left = min(self.tool_timeout_s, deadline - time.monotonic())
        if timed_out:
          r = CallResult(
              "Error: not run (an earlier call of this turn timed out)",
              False,
              "error",
          )
        elif left <= 0:
          r = CallResult(
              "Error: not run (the turn's time limit was reached)",
              False,
              "timeout",
          )
        else:
          r = run_call(
              state.instances,
              c,
              timeout_s=left,
              max_chars=self.max_result_chars,
          )
        state.errors += int(not r.ok)
        state.exceptions += int(r.status == "exception")
        state.timeouts += int(r.status == "timeout")
        timed_out = timed_out or r.status == "timeout"
        results.append(r.text)
      obs = self._obs("\n".join(results)[: self.max_result_chars])
      if timed_out:
        # An abandoned call may still be changing the API instances.
        state.done = True
        return state, obs, True
    else:
      # A reply without a call ends the current user question.
      state.question += 1
      if state.question >= len(state.task.questions):
        state.done = True
        gold = public_state(gold_instances(state.task))
        state.correct = public_state(state.instances) == gold
        return state, np.zeros((0,), np.int32), True
      q = state.task.questions[state.question]
      obs = (
          self._obs(q, role="user")
          if self.chat_format is not None
          else self._obs(f"User: {q}")
      )
    if state.turns >= self.max_turns:
      state.done = True
    return state, obs, state.done

  def facts(self, state: _MultiState) -> dict[str, np.ndarray]:
    return {
        "correct": np.bool_(state.correct),
        "answered": np.bool_(state.question >= len(state.task.questions)),
        "format_error": np.bool_(False),
        "num_tool_calls": np.int32(state.calls),
        "num_tool_errors": np.int32(state.errors),
        "num_tool_exceptions": np.int32(state.exceptions),
        "num_tool_timeouts": np.int32(state.timeouts),
        "questions_done": np.int32(state.question),
        "hard": np.bool_(True),
    }

  def expert_action(self, state: _MultiState, rng: np.random.Generator):
    """Gold calls of the current question in one turn, then a plain reply."""
    gold = state.task.ground_truth[
        min(state.question, len(state.task.ground_truth) - 1)
    ]
    fmt = self.chat_format
    if state.expert_called != state.question and gold:
      state.expert_called = state.question
      text = "[" + ", ".join(gold) + "]"
      if fmt is not None:
        return fmt.assistant(
            f"<tool_call>{text}</tool_call>", self.max_action_len
        )
      return encode(
          self.tokenizer,
          text,
          self.max_action_len,
          prefix=(tok.CALL,),
          suffix=(tok.CALL_END,),
      )
    if fmt is not None:
      return fmt.assistant("Done.", self.max_action_len)
    return encode(
        self.tokenizer, "Done.", self.max_action_len, suffix=(tok.ANSWER_END,)
    )
