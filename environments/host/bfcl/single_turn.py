"""BFCL single-turn categories as a host environment (`BFCLEnv`).

'simple' = simple_python, 'multiple', 'parallel', 'parallel_multiple': one
assistant turn holding the call(s), in any format the parser accepts
(environments/host/parsers.py), scored by `checker.check_calls`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from typing import Any

import numpy as np

from agentic_text import chat
from agentic_text import tokenizers as tok
from environments.host import parsers
from environments.host.bfcl.checker import check_calls, gold_calls
from environments.host.bfcl.data import BFCLTask, SINGLE_TURN, load_category
from environments.host.bfcl.prompts import chat_prompt, encode, render_prompt


@dataclasses.dataclass
class _SingleState:
  task: BFCLTask
  turns: int = 0
  valid: bool = False
  score: float = 0.0
  name_ok: float = 0.0
  parsed: bool = False
  num_calls: int = 0
  num_errors: int = 0
  done: bool = False


@dataclasses.dataclass(frozen=True, eq=False)
class BFCLEnv:
  """BFCL single-turn categories as a host environment (see bfcl/__init__.py).

  Facts (per episode): correct (BFCL verdict), call_score (partial credit in
  [0, 1]), name_ok (fraction of gold functions called), answered (a call
  parsed), format_error (no parseable call), num_tool_calls, num_tool_errors,
  hard (parallel categories).

  Call accounting follows the environment family's definition (calls,
  well-formed or not; calls that failed): the episode's one turn is its call
  turn, so a turn that parses counts its calls (none executed, so 0 errors)
  and a turn that does not parse counts as one malformed call (1 call, 1
  error). Hence num_tool_errors <= num_tool_calls always.
  """

  categories: tuple[str, ...] = ("simple",)
  # Held-out split: every task whose index % eval_every == 0 is eval-only.
  eval_every: int = 5
  max_prompt_len: int = 512
  max_action_len: int = 96
  max_obs_len: int = 8
  max_turns: int = 1
  descriptions: bool = False
  tokenizer: Any = dataclasses.field(default_factory=tok.ByteTokenizer)
  is_host = True

  @functools.cached_property
  def chat_format(self):
    """agentic_text.chat.ChatFormat for an HF tokenizer, else None (byte format)."""
    return chat.make_format(self.tokenizer)

  def __post_init__(self):
    for c in self.categories:
      if c not in SINGLE_TURN:
        raise ValueError(
            f"BFCLEnv.categories: {c!r} is not a single-turn category "
            f"{SINGLE_TURN}"
        )
    if self.max_turns != 1:
      raise ValueError(
          f"BFCLEnv.max_turns={self.max_turns}: single-turn tasks take 1"
      )

  @functools.cached_property
  def _splits(self) -> tuple[list[BFCLTask], list[BFCLTask]]:
    train, held = [], []
    for c in self.categories:
      for i, t in enumerate(load_category(c)):
        (held if i % self.eval_every == 0 else train).append(t)
    return train, held

  def sample_tasks(self, rng: np.random.Generator, n: int) -> list[BFCLTask]:
    train = self._splits[0]
    return [train[i] for i in rng.integers(0, len(train), size=n)]

  def eval_tasks(self, n: int, seed: int) -> list[BFCLTask]:
    held = self._splits[1]
    order = np.random.default_rng(seed).permutation(len(held))
    return [held[i] for i in order[:n]]

  def reset(self, task: BFCLTask):
    if self.chat_format is not None:
      return _SingleState(task), chat_prompt(
          self.chat_format, task, self.descriptions, self.max_prompt_len
      )
    ids = encode(
        self.tokenizer,
        render_prompt(task, self.descriptions),
        self.max_prompt_len,
        prefix=(self.tokenizer.bos_id,),
    )
    return _SingleState(task), ids

  def step(self, state: _SingleState, action_text: str):
    if state.done:
      return state, np.zeros((0,), np.int32), True
    s = dataclasses.replace(state, turns=state.turns + 1, done=True)
    calls = parsers.parse_tool_calls(action_text)
    if isinstance(calls, parsers.ParseError):
      # One malformed call (see the class docstring).
      s = dataclasses.replace(s, num_calls=1, num_errors=1)
      return s, np.zeros((0,), np.int32), True
    check = check_calls(
        state.task.functions,
        calls,
        state.task.ground_truth,
        state.task.category,
    )
    s = dataclasses.replace(
        s,
        parsed=True,
        valid=check.valid,
        score=check.score,
        name_ok=check.name_ok,
        num_calls=len(calls),
    )
    return s, np.zeros((0,), np.int32), True

  def facts(self, state: _SingleState) -> dict[str, np.ndarray]:
    return {
        "correct": np.bool_(state.valid),
        "call_score": np.float32(state.score),
        "name_ok": np.float32(state.name_ok),
        "answered": np.bool_(state.parsed),
        "format_error": np.bool_(state.done and not state.parsed),
        "num_tool_calls": np.int32(state.num_calls),
        "num_tool_errors": np.int32(state.num_errors),
        "hard": np.bool_("parallel" in state.task.category),
    }

  def expert_action(self, state: _SingleState, rng: np.random.Generator):
    calls = gold_calls(state.task.ground_truth, state.task.functions)
    if self.chat_format is not None:
      payload = json.dumps(
          [{"name": c.name, "arguments": c.arguments} for c in calls]
      )
      return self.chat_format.assistant(
          f"<tool_call>{payload}</tool_call>", self.max_action_len
      )
    text = "[" + ", ".join(parsers.format_call_python(c) for c in calls) + "]"
    return encode(
        self.tokenizer,
        text,
        self.max_action_len,
        prefix=(tok.CALL,),
        suffix=(tok.CALL_END,),
    )
