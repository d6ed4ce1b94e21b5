"""Multi-turn chat rendering to token ids, turn by turn, with a role per token.

A ChatML-style template renders each message as

    <|im_start|>{role}\\n{content}<|im_end|>\\n

and a generation prompt as `<|im_start|>assistant\\n`. `ChatBuilder` appends
messages one at a time to a growing id list and never re-tokenises what is
already there: sampled assistant tokens are appended verbatim (docs/design.md,
invariants: sampled tokens are never decoded and re-encoded).

Each id gets a role from agentic_text.roles: TEMPLATE for scaffolding (the start
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

from agentic_text import roles as roles_lib
from agentic_text.tokenizers import HFTokenizer

CONTENT_ROLES = {
    "system": roles_lib.PROMPT,
    "user": roles_lib.PROMPT,
    "tool": roles_lib.TOOL,
    "assistant": roles_lib.POLICY,
}


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

  def __init__(
      self, tokenizer: HFTokenizer, template: ChatTemplate = ChatTemplate()
  ):
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
    """[N] int8 role of each id (agentic_text.roles PROMPT / POLICY / TOOL / TEMPLATE)."""
    return np.asarray(self._roles, np.int8)

  def _append(self, ids: Sequence[int], role: int) -> None:
    self._ids.extend(int(i) for i in ids)
    self._roles.extend([role] * len(ids))

  def _header_and_content(
      self, role: str, content: str, content_role: int
  ) -> None:
    header = role + self.template.newline
    ids, offsets = self.tokenizer.encode_with_offsets(header + content)
    for i, (_, end) in zip(ids, offsets):
      self._append(
          [i], roles_lib.TEMPLATE if end <= len(header) else content_role
      )

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
      raise ValueError(
          f"role={role!r}: unknown; known: {sorted(CONTENT_ROLES)}"
      )
    if self._open_assistant:
      raise ValueError("an assistant turn is open: add_sampled() first")
    content_role = CONTENT_ROLES[role]
    self._append([self.start_id], roles_lib.TEMPLATE)
    self._header_and_content(role, content, content_role)
    self._append(
        [self.end_id],
        roles_lib.POLICY if role == "assistant" else roles_lib.TEMPLATE,
    )
    self._append(self.newline_ids, roles_lib.TEMPLATE)

  def add_generation_prompt(self) -> np.ndarray:
    """Appends `<|im_start|>assistant\\n` (TEMPLATE) and returns all ids so far,
    the prompt to sample the next assistant turn from.

    Raises:
      ValueError: an assistant turn is already open.
    """
    if self._open_assistant:
      raise ValueError("an assistant turn is already open")
    self._append([self.start_id], roles_lib.TEMPLATE)
    self._header_and_content(self.template.assistant, "", roles_lib.POLICY)
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
      raise ValueError(
          "no assistant turn is open: add_generation_prompt() first"
      )
    sampled = [int(i) for i in np.asarray(sampled_ids).reshape(-1)]
    self._append(sampled, roles_lib.POLICY)
    if not sampled or sampled[-1] != self.end_id:
      self._append([self.end_id], roles_lib.TEMPLATE)
    self._append(self.newline_ids, roles_lib.TEMPLATE)
    self._open_assistant = False


def render_chatml(
    messages: Sequence[dict[str, str]],
    add_generation_prompt: bool = False,
    template: ChatTemplate = ChatTemplate(),
) -> str:
  """The ChatML text of a conversation (what the Jinja template renders)."""
  t = template
  text = "".join(
      f"{t.start}{m['role']}{t.newline}{m['content']}{t.end}{t.newline}"
      for m in messages
  )
  if add_generation_prompt:
    text += f"{t.start}{t.assistant}{t.newline}"
  return text


# ---------------------------------------------------------------------------
# Host-environment dialogue format for an HF chat checkpoint.

_PROBE = [
    {"role": "system", "content": "S"},
    {"role": "user", "content": "U"},
    {"role": "assistant", "content": "A"},
    {"role": "tool", "content": "T"},
]


def check_chatml_template(
    template_source: str, tool_role: str = "tool"
) -> None:
  """Renders a probe conversation (system, user, assistant, tool + generation
  prompt) with the checkpoint's Jinja template and checks it equals our ChatML
  render (`render_chatml`), so prompts built turn by turn are what the model
  was trained on.

  Raises:
    ValueError: the template renders something else (quoted in the message).
  """
  import jinja2  # a dependency of transformers' chat templates

  env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
  probe = [
      dict(m, role=tool_role if m["role"] == "tool" else m["role"])
      for m in _PROBE
  ]
  got = env.from_string(template_source).render(
      messages=probe, add_generation_prompt=True, bos_token="", eos_token=""
  )
  want = render_chatml(probe, add_generation_prompt=True)
  if got != want:
    raise ValueError(
        f"chat template is not ChatML with a {tool_role!r} role: it renders "
        f"{got!r}, expected {want!r}"
    )


class ChatFormat:
  """How a host environment talks to an HF chat checkpoint (ChatML).

  Prompts are rendered as the checkpoint's chat template renders them
  (`<|im_start|>system\\n...<|im_end|>\\n<|im_start|>user\\n...<|im_end|>\\n
  <|im_start|>assistant\\n`), tool results as a `tool_role` message followed by
  the next generation prompt, and an assistant turn ends at one of the
  checkpoint's stop ids (`HFTokenizer.eos_ids`, `<|im_end|>` first). Every
  method returns (ids [N] int32, roles [N] int8) with the roles of
  `ChatBuilder`: TEMPLATE scaffolding, PROMPT system/user content, TOOL tool
  content, POLICY assistant content.

  Lengths are capped by shortening the message content (its first tokens are
  kept), never the scaffolding, so a prompt always ends with the generation
  prompt.
  """

  def __init__(
      self,
      tokenizer: HFTokenizer,
      template: ChatTemplate = ChatTemplate(),
      tool_role: str = "tool",
  ):
    self.tokenizer = tokenizer
    self.template = template
    self.tool_role = tool_role
    self._builder = ChatBuilder(tokenizer, template)  # validates the markers
    self.end_id = self._builder.end_id
    self.newline_ids = tuple(self._builder.newline_ids)
    stops = [self.end_id] + [
        i for i in getattr(tokenizer, "eos_ids", ()) if i != self.end_id
    ]
    self.stop_tokens = tuple(stops)
    # Tokens `close_turn` may add before an observation.
    self.close_reserve = 1 + len(self.newline_ids)
    if getattr(tokenizer, "chat_template", None):
      check_chatml_template(tokenizer.chat_template, tool_role)

  def _fit(
      self, role: str, content: str, limit: int | None
  ) -> tuple[np.ndarray, np.ndarray]:
    """One message, content shortened until the message fits `limit` ids."""
    b = ChatBuilder(self.tokenizer, self.template)
    b.add_message(role, content)
    if limit is None or len(b.ids) <= limit:
      return b.ids, b.roles
    scaffold = len(b.ids) - len(self.tokenizer.encode(content))
    budget = max(limit - scaffold, 0)
    _, offsets = self.tokenizer.encode_with_offsets(content)
    keep = offsets[budget - 1][1] if budget > 0 else 0
    while True:
      b = ChatBuilder(self.tokenizer, self.template)
      b.add_message(role, content[:keep])
      if len(b.ids) <= limit or keep == 0:
        return b.ids, b.roles
      keep = max(keep - max(1, keep // 32), 0)

  def generation_prompt(self) -> tuple[np.ndarray, np.ndarray]:
    """`<|im_start|>assistant\\n` (TEMPLATE)."""
    b = ChatBuilder(self.tokenizer, self.template)
    b.add_generation_prompt()
    return b.ids, b.roles

  def prompt(
      self, system: str, user: str, limit: int
  ) -> tuple[np.ndarray, np.ndarray]:
    """System + user message + generation prompt, at most `limit` ids.

    Content is shortened where needed, never the scaffolding: first the user
    message (down to its first `min(32, its length)` ids), then the system
    message's content, so a prompt always ends with the generation prompt.

    Raises:
      ValueError: `limit` cannot hold the empty messages' scaffolding.
    """
    gen_ids, gen_roles = self.generation_prompt()
    empty = len(self._fit("system", "", None)[0]) + len(
        self._fit("user", "", None)[0]
    )
    if limit < empty + len(gen_ids):
      raise ValueError(
          f"max_prompt_len={limit}: the chat scaffolding alone takes "
          f"{empty + len(gen_ids)} tokens"
      )
    user_full = len(self._fit("user", user, None)[0])
    user_min = min(user_full, len(self._fit("user", "", None)[0]) + 32)
    sys_ids, sys_roles = self._fit(
        "system", system, limit - len(gen_ids) - user_min
    )
    user_ids, user_roles = self._fit(
        "user", user, limit - len(gen_ids) - len(sys_ids)
    )
    return (
        np.concatenate([sys_ids, user_ids, gen_ids]).astype(np.int32),
        np.concatenate([sys_roles, user_roles, gen_roles]).astype(np.int8),
    )

  def observation(
      self, content: str, limit: int, role: str | None = None
  ) -> tuple[np.ndarray, np.ndarray]:
    """A `role` message (default the tool role) + the next generation prompt, at
    most `limit - close_reserve` ids (room for `close_turn`, which the rollout
    puts first)."""
    gen_ids, gen_roles = self.generation_prompt()
    room = max(limit - self.close_reserve - len(gen_ids), 0)
    ids, roles = self._fit(role or self.tool_role, content, room)
    return (
        np.concatenate([ids, gen_ids]).astype(np.int32),
        np.concatenate([roles, gen_roles]).astype(np.int8),
    )

  def close_turn(
      self, sampled_ids: Sequence[int]
  ) -> tuple[np.ndarray, np.ndarray]:
    """What follows a sampled turn before the next message: the newline after
    `<|im_end|>`, preceded by a TEMPLATE `<|im_end|>` if the sample did not end
    with it (it hit the length limit or another stop id)."""
    sampled = [int(i) for i in np.asarray(sampled_ids).reshape(-1)]
    ids = [] if sampled and sampled[-1] == self.end_id else [self.end_id]
    ids += list(self.newline_ids)
    return np.asarray(ids, np.int32), np.full(
        (len(ids),), roles_lib.TEMPLATE, np.int8
    )

  def assistant(self, content: str, limit: int | None = None) -> np.ndarray:
    """An assistant turn as the policy would emit it (demonstrations): content
    ids + `<|im_end|>`, at most `limit` ids."""
    ids = list(self.tokenizer.encode(content))
    if limit is not None:
      ids = ids[: max(limit - 1, 0)]
    return np.asarray(ids + [self.end_id], np.int32)

  def decode(self, ids: Sequence[int] | np.ndarray) -> str:
    """Text of a sampled turn for the environment's parser: trailing stop ids
    dropped, other special/added tokens kept as text (e.g. a `<tool_call>`
    added token). Never raises."""
    ids = [int(i) for i in np.asarray(ids).reshape(-1)]
    while ids and ids[-1] in self.stop_tokens:
      ids.pop()
    try:
      return self.tokenizer.decode(ids)
    except Exception:  # noqa: BLE001 -- out-of-vocabulary ids from a bad sample
      return ""


def make_format(tokenizer) -> ChatFormat | None:
  """ChatFormat for an HFTokenizer; None for the byte tokenizer (environments
  keep their byte-special format)."""
  return ChatFormat(tokenizer) if isinstance(tokenizer, HFTokenizer) else None
