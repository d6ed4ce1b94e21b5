"""Byte-level tokenizer with special tokens for tool calls, observations and answers.

Ids 0..255 are raw UTF-8 bytes; ids 256.. are special tokens. Encoding is lossless for
any string; special tokens are never produced by `encode` (they are inserted explicitly
by environments and the rollout engine), so user text can never forge a tool call.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

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

  def decode(self, ids: Sequence[int] | np.ndarray, skip_pad: bool = True) -> str:
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
