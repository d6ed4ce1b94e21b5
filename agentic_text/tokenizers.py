"""Byte-level tokenizer with special tokens for tool calls, observations and answers.

`HFTokenizer` wraps a Hugging Face tokenizer.json for imported checkpoints
(agentic_text/chat.py renders multi-turn chats with it).

Ids 0..255 are raw UTF-8 bytes; ids 256.. are special tokens. Encoding is lossless for
any string; special tokens are never produced by `encode` (they are inserted explicitly
by environments and the rollout engine), so user text can never forge a tool call.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Sequence

import numpy as np

NUM_BYTES = 256

# Special token ids (fixed; checkpoints depend on them).
PAD = 256
BOS = 257
EOS = 258
CALL = 259  # <call>   opens a tool call
CALL_END = 260  # </call>  closes a tool call (a turn stop token)
OBS = 261  # <obs>    opens a tool observation
OBS_END = 262  # </obs>   closes a tool observation
ANSWER = 263  # <answer> opens the final answer
ANSWER_END = 264  # </answer> closes the final answer (a turn stop token)

SPECIAL_TOKENS = {
    PAD: "<pad>",
    BOS: "<bos>",
    EOS: "<eos>",
    CALL: "<call>",
    CALL_END: "</call>",
    OBS: "<obs>",
    OBS_END: "</obs>",
    ANSWER: "<answer>",
    ANSWER_END: "</answer>",
}
VOCAB_SIZE = NUM_BYTES + len(SPECIAL_TOKENS)  # 265

# Tokens that end an assistant turn.
STOP_TOKENS = (CALL_END, ANSWER_END, EOS)


@dataclasses.dataclass(frozen=True)
class ByteTokenizer:
  """Byte-level tokenizer: `encode(str) -> list[int]`, `decode(ids) -> str`."""

  vocab_size: int = VOCAB_SIZE
  pad_id: int = PAD
  bos_id: int = BOS
  eos_id: int = EOS

  def encode(self, text: str) -> list[int]:
    """UTF-8 bytes of `text` as ids in [0, 256). Never emits special tokens."""
    return list(text.encode("utf-8"))

  def decode(
      self, ids: Sequence[int] | np.ndarray, skip_pad: bool = True
  ) -> str:
    """Renders ids as text; specials appear as their names (e.g. `<call>`).

    Invalid UTF-8 byte runs are replaced (U+FFFD) rather than raising, since sampled
    byte sequences need not be valid UTF-8. Ids outside the vocabulary render as
    `<unk:ID>`.
    """
    out: list[str] = []
    buf = bytearray()
    for i in np.asarray(ids).reshape(-1).tolist():
      if 0 <= i < NUM_BYTES:
        buf.append(i)
        continue
      if buf:
        out.append(buf.decode("utf-8", errors="replace"))
        buf = bytearray()
      if i == PAD and skip_pad:
        continue
      out.append(SPECIAL_TOKENS.get(i, f"<unk:{i}>"))
    if buf:
      out.append(buf.decode("utf-8", errors="replace"))
    return "".join(out)


class HFTokenizer:
  """A Hugging Face `tokenizers.Tokenizer` loaded from a local tokenizer.json.

  `encode` never produces special (added) tokens unless asked: text that
  spells `<|im_start|>` is tokenised as ordinary text, so user or tool content
  cannot forge chat scaffolding (the same guarantee as ByteTokenizer).
  """

  def __init__(
      self,
      tokenizer: Any,
      eos_ids: Sequence[int] = (),
      chat_template: str | None = None,
  ):
    """Args:
    tokenizer: a `tokenizers.Tokenizer`.
    eos_ids: ids that end generation (the checkpoint's eos / end-of-turn ids,
      e.g. `<|im_end|>`); `from_folder` reads them from the checkpoint.
    chat_template: the checkpoint's Jinja chat template, if known.
    """
    self.tokenizer = tokenizer
    self.eos_ids = tuple(int(i) for i in eos_ids)
    self.chat_template = chat_template
    # Ids the rollout may pad with (never read: masks come from roles).
    self.pad_id = self.eos_ids[0] if self.eos_ids else 0
    self.bos_id = None

  @classmethod
  def from_folder(cls, path: str) -> "HFTokenizer":
    """Loads a checkpoint folder's tokenizer.json plus its stop ids and chat
    template (tokenizer_config.json, generation_config.json), all local.

    Stop ids: `generation_config.json`'s eos_token_id (int or list), the
    tokenizer config's eos_token, and `<|im_end|>` / `<|endoftext|>` /
    `<|eot_id|>` where the vocabulary has them (end-of-turn markers of ChatML
    and Llama 3 templates).

    Raises:
      FileNotFoundError: no tokenizer.json in `path`.
    """
    import json

    tok = cls.from_file(os.path.join(path, "tokenizer.json")).tokenizer

    def read(name):
      f = os.path.join(path, name)
      if not os.path.isfile(f):
        return {}
      with open(f, encoding="utf-8") as fh:
        return json.load(fh)

    tcfg, gcfg = read("tokenizer_config.json"), read("generation_config.json")
    ids: list[int] = []
    eos = gcfg.get("eos_token_id")
    for i in (eos if isinstance(eos, list) else [eos]):
      if isinstance(i, int):
        ids.append(i)
    names = [tcfg.get("eos_token"), "<|im_end|>", "<|endoftext|>", "<|eot_id|>"]
    for name in names:
      if isinstance(name, dict):  # AddedToken serialisation
        name = name.get("content")
      if isinstance(name, str):
        i = tok.token_to_id(name)
        if i is not None:
          ids.append(i)
    eos_ids = tuple(dict.fromkeys(ids))  # unique, in order
    return cls(tok, eos_ids=eos_ids, chat_template=tcfg.get("chat_template"))

  @classmethod
  def from_file(cls, path: str) -> "HFTokenizer":
    """Loads a local tokenizer.json (nothing is downloaded).

    Raises:
      FileNotFoundError: no such file.
    """
    import tokenizers as hf_tokenizers  # the Hugging Face package

    if not os.path.isfile(path):
      raise FileNotFoundError(path)
    return cls(hf_tokenizers.Tokenizer.from_file(path))

  @property
  def vocab_size(self) -> int:
    """Number of ids, added/special tokens included."""
    return self.tokenizer.get_vocab_size(with_added_tokens=True)

  def token_id(self, token: str) -> int:
    """Id of a vocabulary entry (e.g. '<|im_end|>').

    Raises:
      ValueError: the token is not in the vocabulary.
    """
    i = self.tokenizer.token_to_id(token)
    if i is None:
      raise ValueError(f"token {token!r} is not in the tokenizer's vocabulary")
    return i

  def encode_with_offsets(
      self, text: str, allow_special: bool = False
  ) -> tuple[list[int], list[tuple[int, int]]]:
    """(ids, character offsets [start, end) of each id in `text`).

    No BOS/EOS or other post-processor tokens are added.
    """
    tok = self.tokenizer
    previous = tok.encode_special_tokens
    tok.encode_special_tokens = not allow_special
    try:
      enc = tok.encode(text, add_special_tokens=False)
    finally:
      tok.encode_special_tokens = previous
    return list(enc.ids), [tuple(o) for o in enc.offsets]

  def encode(self, text: str, allow_special: bool = False) -> list[int]:
    """Token ids of `text` (special tokens only if allow_special)."""
    return self.encode_with_offsets(text, allow_special)[0]

  def decode(
      self, ids: Sequence[int] | np.ndarray, skip_special_tokens: bool = False
  ) -> str:
    """Text of `ids` (for display; sampled ids are never re-encoded)."""
    return self.tokenizer.decode(
        [int(i) for i in np.asarray(ids).reshape(-1)],
        skip_special_tokens=skip_special_tokens,
    )
