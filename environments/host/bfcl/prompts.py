"""BFCL prompts and token encoding.

Token format (byte tokenizer): prompt `BOS <task text>`; a call turn `<call>
f(a=1) </call>` (or `<tool_call>{json}</tool_call>` text); observations
`<obs> ... </obs>`.

Chat format (an `HFTokenizer`): the checkpoint's chat template with a system
message (`SYSTEM_PROMPT`: the tools as JSON schemas in `<tools>` tags and the
call format) and the user question, then the generation prompt.
"""

from __future__ import annotations

import json

import numpy as np

from environments.host.bfcl.data import BFCLTask


def render_function(doc: dict, descriptions: bool = False) -> str:
  """A compact signature line, e.g. `math.hypot(x: integer, y: integer, z?: integer)`."""
  props = doc.get("parameters", {}).get("properties", {})
  required = set(doc.get("parameters", {}).get("required", []))
  params = ", ".join(
      f"{p}{'' if p in required else '?'}: {d.get('type', 'any')}"
      for p, d in props.items()
  )
  line = f"{doc['name']}({params})"
  if descriptions and doc.get("description"):
    line += f"  # {doc['description']}"
  return line


def render_prompt(task: BFCLTask, descriptions: bool = False) -> str:
  funcs = "\n".join(render_function(f, descriptions) for f in task.functions)
  return f"Tools:\n{funcs}\nUser: {task.questions[0]}\n"


# System prompt of the chat format (SmolLM2-Instruct's documented function-
# calling prompt, shortened): tools as JSON in <tools> tags, calls as a JSON list
# in <tool_call> tags.
SYSTEM_PROMPT = (
    "You are an expert in composing functions. You are given a question and a set "
    "of possible functions. Based on the question, you will need to make one or "
    "more function calls to achieve the purpose.\n\nYou have access to the "
    "following tools:\n<tools>{tools}</tools>\n\nThe output MUST strictly adhere "
    "to the following format, and NO other text MUST be included.\n<tool_call>["
    '{{"name": "func_name1", "arguments": {{"argument1": "value1"}}}}'
    "]</tool_call>"
)


def tool_schema(doc: dict, descriptions: bool = True) -> dict:
  """A BFCL function document as a compact JSON tool schema (name,
  description, parameters with types, required); BFCL's `dict` type is
  written `object` as in JSON Schema."""

  def fix(p):
    p = dict(p)
    if p.get("type") == "dict":
      p["type"] = "object"
    if not descriptions:
      p.pop("description", None)
    if isinstance(p.get("properties"), dict):
      p["properties"] = {k: fix(v) for k, v in p["properties"].items()}
    if isinstance(p.get("items"), dict):
      p["items"] = fix(p["items"])
    return p

  out = {"name": doc["name"]}
  if descriptions and doc.get("description"):
    out["description"] = doc["description"]
  out["parameters"] = fix(doc.get("parameters", {}))
  return out


def render_system(task: BFCLTask, descriptions: bool = True) -> str:
  """The chat-format system message: SYSTEM_PROMPT with the task's tools."""
  tools = json.dumps(
      [tool_schema(f, descriptions) for f in task.functions],
      separators=(",", ":"),
  )
  return SYSTEM_PROMPT.format(tools=tools)


def chat_prompt(fmt, task: BFCLTask, descriptions: bool, limit: int):
  """(ids, roles) of the chat-format prompt. If the prompt would not fit
  `limit`, function descriptions are dropped; if it still does not fit, the
  content is cut (ChatFormat.prompt; the task then may be unsolvable)."""
  ids_roles = fmt.prompt(
      render_system(task, descriptions), task.questions[0], limit
  )
  if descriptions and len(ids_roles[0]) >= limit:
    return fmt.prompt(render_system(task, False), task.questions[0], limit)
  return ids_roles


def encode(
    tokenizer, text: str, limit: int, prefix=(), suffix=()
) -> np.ndarray:
  body = list(tokenizer.encode(text))[
      : max(limit - len(prefix) - len(suffix), 0)
  ]
  return np.asarray(list(prefix) + body + list(suffix), np.int32)
