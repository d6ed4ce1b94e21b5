"""Multi-turn chat rendering to token ids, turn by turn, with a role per token.

A ChatML-style template renders each message as

    <|im_start|>{role}\\n{content}<|im_end|>\\n

and a generation prompt as `<|im_start|>assistant\\n`. `ChatBuilder` appends
messages one at a time to a growing id list and never re-tokenises what is
already there: sampled assistant tokens are appended verbatim (DESIGN.md
section 3: sampled tokens are never decoded and re-encoded).

Each id gets a role from agentic_rl.types: TEMPLATE for scaffolding (the start
and end markers, the role name and the newlines), PROMPT for system/user
content, TOOL for tool observations, POLICY for assistant tokens (including the
`<|im_end|>` that ends an assistant turn, which the policy must emit).

Equality with the template's render tokenised at once: a Hugging Face tokenizer
splits its input at special tokens and tokenises the text between them
independently, so each `{role}\\n{content}` span is encoded as one piece here,
exactly as in the whole-conversation encoding. Assistant turns are the
exception: their ids are whatever was sampled, so they equal the whole render
only where the sampled ids are the canonical tokenisation of their text and
`assistant\\n` ends a pre-tokenisation word (true for ByteLevel BPEs when the
reply does not start with whitespace).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from agentic_rl import types
from agentic_rl.tokenizers import HFTokenizer

CONTENT_ROLES = {"system": types.PROMPT, "user": types.PROMPT,
                 "tool": types.TOOL, "assistant": types.POLICY}


@dataclasses.dataclass(frozen=True)
class ChatTemplate:
  """A ChatML-style template: start + role + newline + content + end + newline."""

  start: str = "<|im_start|>"
  end: str = "<|im_end|>"
  newline: str = "\n"
  assistant: str = "assistant"


class ChatBuilder:
  """Builds a conversation's token ids and per-token roles turn by turn.

  Usage (a rollout):
    chat = ChatBuilder(tok)
    chat.add_message("system", ...); chat.add_message("user", ...)
    chat.add_generation_prompt()           # <|im_start|>assistant\\n
    chat.add_sampled(sampled_ids)          # verbatim, POLICY
    chat.add_message("tool", observation)  # TOOL content
    ...
    chat.ids, chat.roles                   # [N] int32, [N] int8
  """

  def __init__(self, tokenizer: HFTokenizer, template: ChatTemplate = ChatTemplate()):
    self.tokenizer = tokenizer
    self.template = template
    self.start_id = tokenizer.token_id(template.start)
    self.end_id = tokenizer.token_id(template.end)
    self.newline_ids = tokenizer.encode(template.newline)
    self._ids: list[int] = []
    self._roles: list[int] = []
    self._open_assistant = False

  @property
  def ids(self) -> np.ndarray:
    """[N] int32 token ids so far."""
    return np.asarray(self._ids, np.int32)

  @property
  def roles(self) -> np.ndarray:
    """[N] int8 role of each id (types.PROMPT / POLICY / TOOL / TEMPLATE)."""
    return np.asarray(self._roles, np.int8)

  def _append(self, ids: Sequence[int], role: int) -> None:
    self._ids.extend(int(i) for i in ids)
    self._roles.extend([role] * len(ids))

  def _header_and_content(self, role: str, content: str, content_role: int) -> None:
    header = role + self.template.newline
    ids, offsets = self.tokenizer.encode_with_offsets(header + content)
    for i, (_, end) in zip(ids, offsets):
      self._append([i], types.TEMPLATE if end <= len(header) else content_role)

  def add_message(self, role: str, content: str) -> None:
    """Appends a whole text message (system, user, tool, or an assistant
    demonstration).

    Content is encoded with special tokens disabled (text cannot forge
    `<|im_end|>`); an assistant message's content and closing `<|im_end|>` are
    POLICY tokens.

    Raises:
      ValueError: unknown role, or an assistant turn is open (call add_sampled).
    """
    if role not in CONTENT_ROLES:
      raise ValueError(f"role={role!r}: unknown; known: {sorted(CONTENT_ROLES)}")
    if self._open_assistant:
      raise ValueError("an assistant turn is open: add_sampled() first")
    content_role = CONTENT_ROLES[role]
    self._append([self.start_id], types.TEMPLATE)
    self._header_and_content(role, content, content_role)
    self._append([self.end_id],
                 types.POLICY if role == "assistant" else types.TEMPLATE)
    self._append(self.newline_ids, types.TEMPLATE)

  def add_generation_prompt(self) -> np.ndarray:
    """Appends `<|im_start|>assistant\\n` (TEMPLATE) and returns all ids so far,
    the prompt to sample the next assistant turn from.

    Raises:
      ValueError: an assistant turn is already open.
    """
    if self._open_assistant:
      raise ValueError("an assistant turn is already open")
    self._append([self.start_id], types.TEMPLATE)
    self._header_and_content(self.template.assistant, "", types.POLICY)
    self._open_assistant = True
    return self.ids

  def add_sampled(self, sampled_ids: Sequence[int]) -> None:
    """Closes the open assistant turn with the sampled ids, verbatim (POLICY).

    If the sample did not end with `<|im_end|>` (it hit a length limit), the
    template closes the turn with a TEMPLATE `<|im_end|>`; then the newline.

    Raises:
      ValueError: no assistant turn is open (call add_generation_prompt).
    """
    if not self._open_assistant:
      raise ValueError("no assistant turn is open: add_generation_prompt() first")
    sampled = [int(i) for i in np.asarray(sampled_ids).reshape(-1)]
    self._append(sampled, types.POLICY)
    if not sampled or sampled[-1] != self.end_id:
      self._append([self.end_id], types.TEMPLATE)
    self._append(self.newline_ids, types.TEMPLATE)
    self._open_assistant = False


def render_chatml(messages: Sequence[dict[str, str]], add_generation_prompt: bool = False,
                  template: ChatTemplate = ChatTemplate()) -> str:
  """The ChatML text of a conversation (what the Jinja template renders)."""
  t = template
  text = "".join(f"{t.start}{m['role']}{t.newline}{m['content']}{t.end}{t.newline}"
                 for m in messages)
  if add_generation_prompt:
    text += f"{t.start}{t.assistant}{t.newline}"
  return text
