"""Parsers and answer extractors of the host environments run in linear time.

Each adversarial input is one short unit repeated (unclosed tags and fences,
whitespace runs, deep nesting); parsing 100,000 characters of it must take less
than RATIO = 1000 times as long as parsing 1,000 characters, and under
ABS_SECONDS. For a 100x longer input a linear parser gives about 100 (measured
up to ~400 on a loaded machine: the 100 KB string no longer fits the CPU's
fast caches), a quadratic one about 10,000 and the regexes these scanners
replaced far more. Times are the minimum of 3 runs (time.perf_counter,
garbage collection off while timing).

The str.find-based block scanners replace backtracking regexes; they are also
checked against those regexes (the reference, fast on short text) on random
short strings built from the delimiters, so behaviour on normal text is unchanged.
"""

import gc
import random
import re
import time

import pytest

from environments.host.bfcl import multi_turn as bfcl_multi_turn
from environments.host import parsers
from environments.host import reasoning_gym_env as rg

RATIO = 1000.0
ABS_SECONDS = 2.0
SMALL, LARGE = 1_000, 100_000

_P = parsers.parse_tool_calls
# name -> (function, unit); the input is the unit repeated to SMALL / LARGE chars.
ADVERSARIAL = {
    "parse: one ```json then spaces": (_P, "```json" + " " * 10**6),
    "parse: ```json + spaces": (_P, "```json" + " " * 8),
    "parse: unclosed <tool_call>": (_P, "<tool_call>"),
    "parse: unclosed <call>": (_P, "<call> "),
    "parse: ``` + newline": (_P, "```\n"),
    "parse: f(a= nesting": (_P, "f(a="),
    "parse: json key nesting": (_P, '{"name": '),
    "parse: long literal list": (_P, "1, "),
    "rg answer: unclosed <answer>": (rg.chat_answer_of, "<answer>"),
    "rg answer: \\boxed{": (rg.chat_answer_of, "\\boxed{"),
    "rg answer: 1,1,1 digits": (rg.chat_answer_of, "1,"),
    "rg answer: 1.1.1 digits": (rg.chat_answer_of, "1."),
    "rg code: <call> then </call> x": (rg._code_of, "<call> </call> x"),  # noqa: SLF001
    "rg chat code: ```python + spaces": (rg._chat_code_of, "```python  "),  # noqa: SLF001
    "rg chat code: ```py + newline": (rg._chat_code_of, "```py\n"),  # noqa: SLF001
    "bfcl: unclosed <tool_call> + </call": (
        bfcl_multi_turn.first_call_payload,
        "<tool_call></call",
    ),
}


def _make(unit: str, n: int) -> str:
  return (unit * (n // len(unit) + 1))[:n]


def _time(fn, text: str, reps: int) -> float:
  """Min over 3 runs of the mean time of `reps` calls, garbage collection off
  while timing (as `timeit` does: a collection's cost depends on the whole
  heap, not on the input)."""
  best = float("inf")
  was_enabled = gc.isenabled()
  gc.disable()
  try:
    for _ in range(3):
      t0 = time.perf_counter()
      for _ in range(reps):
        fn(text)
      best = min(best, (time.perf_counter() - t0) / reps)
  finally:
    if was_enabled:
      gc.enable()
  return best


@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_adversarial_100kb_is_near_linear(name):
  fn, unit = ADVERSARIAL[name]
  small, large = _make(unit, SMALL), _make(unit, LARGE)
  assert len(large) == LARGE
  t_small = _time(fn, small, reps=20)
  t_large = _time(fn, large, reps=1)
  assert t_large < ABS_SECONDS, (name, t_large)
  # Floor the small time at 1 microsecond so timer granularity cannot inflate
  # the ratio of two very fast calls.
  assert t_large / max(t_small, 1e-6) < RATIO, (name, t_small, t_large)


def test_parse_still_refuses_text_over_the_cap():
  out = parsers.parse_tool_calls("x" * (parsers.MAX_TEXT_CHARS + 1))
  assert isinstance(out, parsers.ParseError) and "too long" in out.reason


_OLD = {
    "tag": re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL),
    "call": re.compile(r"<call>(.*?)(?:</call>|$)", re.DOTALL),
    "fence": re.compile(r"```(?:json|python|tool_code)?\s*(.*?)```", re.DOTALL),
    "rg_call": re.compile(r"^\s*<call>(.*?)</call>\s*$", re.DOTALL),
    "answer": re.compile(r"<answer>(.*?)</answer>", re.DOTALL),
    "py_fence": re.compile(r"```(?:python|py)\s*\n(.*?)(?:```|$)", re.DOTALL),
    "first": re.compile(
        r"<(?:tool_)?call>(.*?)(?:</(?:tool_)?call>|$)", re.DOTALL
    ),
}
_FRAGMENTS = [
    "<tool_call>",
    "</tool_call>",
    "<call>",
    "</call>",
    "<answer>",
    "</answer>",
    "```",
    "json",
    "python",
    "py",
    "tool_code",
    "thon",
    " ",
    "\n",
    "\t",
    "\u2003",
    "x",
    "`",
    "<",
    "/",
    ">",
    "ca",
    "ll>",
]


def _group(m):
  return m.group(1) if m else None


def test_scanners_equal_the_regexes_they_replace_on_random_text():
  rng = random.Random(0)
  for _ in range(20_000):
    t = "".join(rng.choice(_FRAGMENTS) for _ in range(rng.randint(0, 10)))
    assert parsers.tag_blocks(t, "<tool_call>", "</tool_call>") == _OLD[
        "tag"
    ].findall(t)
    assert parsers.tag_blocks(t, "<call>", "</call>") == _OLD["call"].findall(t)
    assert parsers.fence_blocks(t) == _OLD["fence"].findall(t), repr(t)
    assert rg.call_block(t) == _group(_OLD["rg_call"].match(t)), repr(t)
    assert rg.answer_block(t) == _group(_OLD["answer"].search(t)), repr(t)
    assert rg.python_fence(t) == _group(_OLD["py_fence"].search(t)), repr(t)
    assert bfcl_multi_turn.first_call_payload(t) == _group(
        _OLD["first"].search(t)
    ), repr(t)


def test_scanners_on_hand_written_cases():
  assert parsers.fence_blocks(
      'a ```json\n {"x": 1}\n``` b ```tool_code f()```'
  ) == ['{"x": 1}\n', "f()"]
  assert parsers.fence_blocks("```json   ") == []  # unclosed: nothing
  assert parsers.tag_blocks("<call>a</call><call>b\n", "<call>", "</call>") == [
      "a",
      "b",
  ]
  assert rg.answer_block("x <answer> 42 </answer> <answer>7</answer>") == " 42 "
  assert rg.answer_block("<answer> 42") is None
  assert rg.call_block("  <call>print(1)</call>\n") == "print(1)"
  assert rg.call_block("<call>a</call> b") is None
  assert rg.python_fence("```python \n  print(2)\n```") == "  print(2)\n"
  assert (
      rg.python_fence("```python print(2)```") is None
  )  # no newline after the tag
  assert (
      bfcl_multi_turn.first_call_payload("x <tool_call>[f(1)]</call> <call>g()")
      == "[f(1)]"
  )
