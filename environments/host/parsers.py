"""Function-call parsers for host environments: model text -> structured calls.

Accepted formats (tried in this order; the first that yields calls wins):

  1. Hermes-style tags: one or more `<tool_call>{"name": ..., "arguments": {...}}
     </tool_call>` blocks (the closing tag may be missing at the end of the text);
     the payload may also be a JSON list of such objects.
  2. Our byte tokenizer's specials: `<call>...</call>` with a JSON or Python-call
     payload (agentic_text/tokenizers.py renders CALL / CALL_END this way).
  3. A bare JSON object or list of objects (optionally inside a ```json fence):
     `{"name": f, "arguments": {...}}`, also with the keys `parameters` / `args`,
     or the BFCL style `{"f": {...}}` (one key whose value is a dict).
  4. Python-call syntax: `f(a=1, b="x")`, `[f(a=1), g(b=[1, 2])]`, dotted names
     `math.hypot(x=3, y=4)`. Parsed with `ast.parse`; only literal argument values
     are accepted (`ast.literal_eval` on each keyword value, plus lists, tuples,
     dicts and unary minus on constants). Nothing is ever evaluated or executed.

`parse_tool_calls(text)` never raises on any input string: a text with no parseable
call returns a `ParseError` value that says why. Tags and fences are found by
left-to-right `str.find` scans (`tag_blocks`, `fence_blocks`), linear in the
text; texts over MAX_TEXT_CHARS are refused before parsing.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from typing import Any

# Inputs longer than this are refused before parsing (ast/json on megabytes of
# model output would stall the rollout loop).
MAX_TEXT_CHARS = 100_000


@dataclasses.dataclass(frozen=True)
class ToolCall:
  """One parsed call.

  Attributes:
    name: the function name as written (dotted names kept, e.g. 'math.hypot').
    arguments: keyword arguments; values are JSON-like python objects
      (None, bool, int, float, str, list, dict).
    positional: positional literal arguments; always empty from
      `parse_tool_calls` (which refuses them), filled only by
      `parse_python_calls(..., allow_positional=True)` (BFCL's multi-turn gold
      answers use them, e.g. `sort('final_report.pdf')`).
  """

  name: str
  arguments: dict[str, Any]
  positional: tuple[Any, ...] = ()


@dataclasses.dataclass(frozen=True)
class ParseError:
  """The text held no call in any accepted format; `reason` says what failed."""

  reason: str


# Block extraction scans the text left to right with str.find (linear time in
# the text). The equivalent backtracking regexes, e.g. r"```(?:json)?\s*(.*?)```",
# take quadratic or worse time on adversarial text such as "```json" plus
# spaces repeated without a closing fence.
_WS_RE = re.compile(r"\s*")  # one run of whitespace: linear, no backtracking
_FENCE_LANGS = ("json", "python", "tool_code")


def tag_blocks(text: str, open_tag: str, close_tag: str) -> list[str]:
  """Contents of the `open_tag ... close_tag` blocks of `text`, in order.

  Each block runs from its opening tag to the next closing tag; the last one may
  be unclosed and then runs to the end of the text (less one final newline).
  Same result as `re.findall(open + "(.*?)(?:" + close + "|$)", text, re.DOTALL)`,
  in one left-to-right scan: O(len(text)) time.
  """
  out = []
  i = text.find(open_tag)
  while i >= 0:
    start = i + len(open_tag)
    end = text.find(close_tag, start)
    if end < 0:
      end = (
          len(text) - 1
          if text.endswith("\n") and len(text) - 1 >= start
          else len(text)
      )
      out.append(text[start:end])
      break
    out.append(text[start:end])
    i = text.find(open_tag, end + len(close_tag))
  return out


def fence_blocks(text: str) -> list[str]:
  r"""Contents of the closed ``` fences of `text`, in order, without an opening
  `json` / `python` / `tool_code` tag and the whitespace after it.

  Same result as `re.findall(r"```(?:json|python|tool_code)?\s*(.*?)```", text,
  re.DOTALL)` in O(len(text)) time. An opening fence without a closing one ends
  the scan (no later fence can close either).
  """
  out = []
  i = text.find("```")
  while i >= 0:
    p = i + 3
    for lang in _FENCE_LANGS:
      if text.startswith(lang, p):
        p += len(lang)
        break
    p = _WS_RE.match(text, p).end()
    end = text.find("```", p)
    if end < 0:
      break
    out.append(text[p:end])
    i = text.find("```", end + 3)
  return out


def _call_from_obj(obj: Any) -> ToolCall | None:
  """A ToolCall from one JSON object, or None if it does not look like a call."""
  if not isinstance(obj, dict):
    return None
  name = obj.get("name")
  if isinstance(name, str) and name:
    for key in ("arguments", "parameters", "args"):
      if key in obj:
        args = obj[key]
        if isinstance(args, str):  # OpenAI style: arguments as a JSON string
          try:
            args = json.loads(args)
          except (ValueError, RecursionError):
            return None
        if isinstance(args, dict) and all(isinstance(k, str) for k in args):
          return ToolCall(name, dict(args))
        return None
    if set(obj) == {"name"}:
      return ToolCall(name, {})
    return None
  if len(obj) == 1:
    ((name, args),) = obj.items()
    if isinstance(name, str) and name and isinstance(args, dict):
      return ToolCall(name, dict(args))
  return None


def _calls_from_json(payload: str) -> list[ToolCall] | None:
  try:
    obj = json.loads(payload)
  except (ValueError, RecursionError):
    return None
  objs = obj if isinstance(obj, list) else [obj]
  calls = [_call_from_obj(o) for o in objs]
  if not calls or any(c is None for c in calls):
    return None
  return calls


def _literal(node: ast.AST) -> Any:
  """Value of a literal expression node; raises ValueError for anything else."""
  if isinstance(node, ast.Constant) and isinstance(
      node.value, (str, int, float, bool, type(None))
  ):
    return node.value
  if isinstance(node, ast.UnaryOp) and isinstance(
      node.op, (ast.USub, ast.UAdd)
  ):
    v = _literal(node.operand)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
      return -v if isinstance(node.op, ast.USub) else v
  if isinstance(node, (ast.List, ast.Tuple)):
    return [_literal(e) for e in node.elts]
  if isinstance(node, ast.Dict):
    if any(k is None for k in node.keys):
      raise ValueError("dict unpacking")
    return {_literal(k): _literal(v) for k, v in zip(node.keys, node.values)}
  raise ValueError(f"not a literal: {type(node).__name__}")


def _dotted_name(node: ast.AST) -> str:
  if isinstance(node, ast.Name):
    return node.id
  if isinstance(node, ast.Attribute):
    return _dotted_name(node.value) + "." + node.attr
  raise ValueError("not a name")


def _calls_from_python(
    payload: str, allow_positional: bool = False
) -> list[ToolCall] | None:
  """Calls from Python syntax `f(a=1)` or `[f(a=1), g()]`, literals only."""
  try:
    tree = ast.parse(payload.strip(), mode="eval")
  except (SyntaxError, ValueError, RecursionError, MemoryError):
    return None
  body = tree.body
  nodes = body.elts if isinstance(body, (ast.List, ast.Tuple)) else [body]
  calls = []
  try:
    for node in nodes:
      if not isinstance(node, ast.Call) or (node.args and not allow_positional):
        return None
      if any(kw.arg is None for kw in node.keywords):  # **kwargs
        return None
      if any(isinstance(a, ast.Starred) for a in node.args):
        return None
      args = {kw.arg: _literal(kw.value) for kw in node.keywords}
      positional = tuple(_literal(a) for a in node.args)
      calls.append(ToolCall(_dotted_name(node.func), args, positional))
  except (ValueError, TypeError, RecursionError):
    return None
  return calls or None


def _calls_from_payload(payload: str) -> list[ToolCall] | None:
  return _calls_from_json(payload) or _calls_from_python(payload)


def parse_tool_calls(text: Any) -> list[ToolCall] | ParseError:
  """Parses the tool calls in one assistant turn.

  Args:
    text: the decoded turn (any value; non-strings give a ParseError).

  Returns:
    A non-empty list of ToolCall in the order written, or a ParseError. Never
    raises.
  """
  try:
    return _parse(text)
  except Exception as e:  # noqa: BLE001 -- the contract is "never raises"
    return ParseError(f"parser failure: {type(e).__name__}")


def _parse(text: Any) -> list[ToolCall] | ParseError:
  if not isinstance(text, str):
    return ParseError(f"not a string: {type(text).__name__}")
  if len(text) > MAX_TEXT_CHARS:
    return ParseError(f"text too long ({len(text)} > {MAX_TEXT_CHARS} chars)")
  for fmt, close in (("<tool_call>", "</tool_call>"), ("<call>", "</call>")):
    blocks = tag_blocks(text, fmt, close)
    if blocks:
      calls = []
      for block in blocks:
        parsed = _calls_from_payload(block.strip())
        if parsed is None:
          return ParseError(f"malformed {fmt} payload: {block.strip()[:80]!r}")
        calls.extend(parsed)
      return calls
  fences = fence_blocks(text)
  for candidate in fences + [text.strip()]:
    parsed = _calls_from_payload(candidate.strip())
    if parsed:
      return parsed
  return ParseError(
      "no tool call found (tried <tool_call> tags, <call> tags, "
      "JSON and Python-call syntax)"
  )


def parse_python_calls(
    text: str, allow_positional: bool = False
) -> list[ToolCall] | ParseError:
  """Python-call syntax only (e.g. BFCL gold strings); never raises.

  Args:
    text: `f(a=1)` or `[f(a=1), g(2)]`.
    allow_positional: accept positional literal arguments (in `positional`).
  """
  try:
    if not isinstance(text, str) or len(text) > MAX_TEXT_CHARS:
      return ParseError("not a string or too long")
    calls = _calls_from_python(text, allow_positional)
  except Exception as e:  # noqa: BLE001
    return ParseError(f"parser failure: {type(e).__name__}")
  return calls if calls else ParseError(f"not a Python call: {text[:80]!r}")


def format_call_python(call: ToolCall) -> str:
  """Renders a call as Python syntax, e.g. `f(a=1, b='x')` (repr of each value)."""
  args = ", ".join(f"{k}={v!r}" for k, v in call.arguments.items())
  return f"{call.name}({args})"


def format_call_hermes(call: ToolCall) -> str:
  """Renders a call in Hermes tags: `<tool_call>{"name": .., "arguments": ..}</tool_call>`."""
  return (
      "<tool_call>"
      + json.dumps({"name": call.name, "arguments": call.arguments})
      + "</tool_call>"
  )
