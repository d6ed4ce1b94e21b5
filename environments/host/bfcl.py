"""Berkeley Function Calling Leaderboard (BFCL) tasks as host environments.

Data: the JSONL files shipped inside the installed `bfcl-eval` wheel
(`bfcl_eval/data/BFCL_v4_*.json` and `data/possible_answer/`); nothing is
downloaded. `bfcl-eval` is a test/optional dependency (requirements-test.txt,
installed with --no-deps plus mpmath); this module imports it lazily.

Single-turn categories ('simple' = simple_python, 'multiple', 'parallel',
'parallel_multiple'): one assistant turn holding the call(s), in any format the
parser accepts (environments/host/parsers.py). It is scored by `check_calls`, our
re-implementation of BFCL's AST checker for Python (Patil et al., "The Berkeley
Function Calling Leaderboard", ICML 2025; bfcl_eval/eval_checker/ast_eval/
ast_checker.py): same verdict rules (function name; required parameters present;
no unexpected parameter; per-type value checks against the possible-answer lists,
with BFCL's string standardisation, int->float promotion, tuple->list, dict and
list-of-dict checks; omitted optional parameters must allow ""), plus a
fine-grained partial credit per field. experiments/bfcl_checker_agreement.py
measures agreement with BFCL's own checker.

Multi-turn base category ('multi_turn_base'): the episode spans every user
question; the policy's calls are executed against BFCL's executable API classes
(GorillaFileSystem, TwitterAPI, ...) by name with literal arguments (never
`eval`); a turn without a call ends the current user question and the next one
arrives as the observation. `correct` is BFCL's state check: after the episode,
every API instance's public attributes equal those after executing the gold calls.

Token format (byte tokenizer): prompt `BOS <task text>`; a call turn `<call>
f(a=1) </call>` (or `<tool_call>{json}</tool_call>` text); observations
`<obs> ... </obs>`.

Chat format (an `HFTokenizer`, e.g. an imported checkpoint's; `chat_format` is
an agentic_text.chat.ChatFormat): the prompt is the checkpoint's chat template
with a system message (`SYSTEM_PROMPT`: the tools as JSON schemas in
`<tools>` tags and the call format) and the user question, then the generation
prompt; the policy calls tools as `<tool_call>[{"name": ..., "arguments":
{...}}]</tool_call>` (Hermes JSON) or in Python-call syntax `[f(a=1)]`, both
parsed by environments/host/parsers.py; a turn ends at the checkpoint's stop
ids. Multi-turn: tool results come back as `tool` messages and the next user
question as a `user` message, each followed by the next generation prompt.
"""

from __future__ import annotations

import copy
import dataclasses
import decimal
import functools
import importlib
import inspect
import json
import math
import os
import re
import threading
import time
from typing import Any, Sequence

import numpy as np

from agentic_text import chat
from agentic_text import tokenizers as tok
from environments.host import base as host_base
from environments.host import parsers

CATEGORY_FILES = {
    "simple": "BFCL_v4_simple_python.json",
    "multiple": "BFCL_v4_multiple.json",
    "parallel": "BFCL_v4_parallel.json",
    "parallel_multiple": "BFCL_v4_parallel_multiple.json",
    "multi_turn_base": "BFCL_v4_multi_turn_base.json",
}
SINGLE_TURN = ("simple", "multiple", "parallel", "parallel_multiple")


def data_dir() -> str:
  """The `data/` folder of the installed bfcl_eval package.

  Raises:
    ImportError: bfcl-eval is not installed (see requirements-test.txt).
  """
  spec = importlib.util.find_spec("bfcl_eval")
  if spec is None or not spec.submodule_search_locations:
    raise ImportError(
        "bfcl-eval is not installed: pip install --no-deps "
        "bfcl-eval==<pinned> mpmath (requirements-test.txt)"
    )
  return os.path.join(list(spec.submodule_search_locations)[0], "data")


@dataclasses.dataclass(frozen=True)
class BFCLTask:
  """One BFCL entry.

  Attributes:
    id: BFCL id, e.g. 'simple_python_0'.
    category: a key of CATEGORY_FILES.
    questions: user messages, one string per user turn.
    functions: the function documents (BFCL JSON schema dicts).
    ground_truth: single-turn: list of {name: {param: [possible values]}};
      multi-turn: one list of gold call strings per user turn.
    initial_config: multi-turn API classes' initial state (else empty).
    involved_classes: multi-turn API class names (else empty).
  """

  id: str
  category: str
  questions: tuple[str, ...]
  functions: tuple[dict, ...]
  ground_truth: Any
  initial_config: Any = None
  involved_classes: tuple[str, ...] = ()


def _read_jsonl(path: str) -> list[dict]:
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]


@functools.lru_cache(maxsize=None)
def load_category(category: str) -> tuple[BFCLTask, ...]:
  """All tasks of one category, in file order.

  Raises:
    ValueError: unknown category.
  """
  if category not in CATEGORY_FILES:
    raise ValueError(
        f"BFCL category {category!r}: unknown; known {tuple(CATEGORY_FILES)}"
    )
  d = data_dir()
  fname = CATEGORY_FILES[category]
  entries = _read_jsonl(os.path.join(d, fname))
  answers = {
      a["id"]: a["ground_truth"]
      for a in _read_jsonl(os.path.join(d, "possible_answer", fname))
  }
  tasks = []
  for e in entries:
    questions = tuple(
        " ".join(m["content"] for m in turn if m["role"] == "user")
        for turn in e["question"]
    )
    if category == "multi_turn_base":
      functions = tuple(
          _multi_turn_docs(
              tuple(e["involved_classes"]),
              tuple(e.get("excluded_function", ())),
          )
      )
    else:
      functions = tuple(e["function"])
    tasks.append(
        BFCLTask(
            id=e["id"],
            category=category,
            questions=questions,
            functions=functions,
            ground_truth=answers[e["id"]],
            initial_config=e.get("initial_config"),
            involved_classes=tuple(e.get("involved_classes", ())),
        )
    )
  return tuple(tasks)


# ---------------------------------------------------------------------------
# The call checker (BFCL AST rules for Python, plus partial credit).

_PY_TYPES = {
    "string": str,
    "integer": int,
    "float": float,
    "boolean": bool,
    "array": list,
    "tuple": list,
    "dict": dict,
    "any": str,
}


def standardize_string(s: str) -> str:
  """BFCL's string normalisation: drop ` ,./-_*^`, lowercase, ' -> "."""
  return re.sub(r"[ \,\.\/\-\_\*\^]", "", s).lower().replace("'", '"')


def _answer_type(possible: list):
  for a in possible:
    if a != "":
      return type(a)
  return None


def _type_ok(value, possible, expected, nested) -> tuple[bool, bool]:
  """(type check passed, value is a 'variable'): BFCL's type_checker."""
  pa_type = _answer_type(possible)
  is_variable = pa_type is not None and pa_type != expected
  if type(value) == expected:  # noqa: E721 -- exact type, as BFCL (bool is not int)
    if nested is None:
      return True, is_variable
    for item in possible:
      ok = True
      if type(item) == list:  # noqa: E721
        for v in value:
          if not _type_ok(v, item, nested, None)[0]:
            ok = False
            break
      if ok:
        return True, is_variable
    return False, is_variable
  if pa_type is not None and type(value) == pa_type:  # noqa: E721
    return True, True
  return False, is_variable


def _std_list(xs):
  return [standardize_string(x) if type(x) == str else x for x in xs]  # noqa: E721


def _dict_ok(value: dict, possibles: list) -> bool:
  for possible in possibles:
    if possible == "":
      continue
    ok = True
    for k, v in value.items():
      if k not in possible:
        ok = False
        break
      sv = standardize_string(v) if type(v) == str else v  # noqa: E721
      if sv not in _std_list(possible[k]):
        ok = False
        break
    if ok:
      for k, v in possible.items():
        if k not in value and "" not in v:
          ok = False
          break
    if ok:
      return True
  return False


def _list_dict_ok(value: list, possibles: list) -> bool:
  for possible in possibles:
    if len(value) != len(possible):
      continue
    if all(_dict_ok(v, [p]) for v, p in zip(value, possible)):
      return True
  return False


def value_ok(param_doc: dict, value: Any, possible: list) -> bool:
  """Whether one parameter value is accepted (BFCL's per-parameter rules).

  Args:
    param_doc: the parameter's schema, e.g. {'type': 'integer'}.
    value: the model's value (JSON-like python object).
    possible: BFCL's possible-answer list ("" marks an omissible parameter).
  """
  t = param_doc.get("type")
  if t not in _PY_TYPES:
    return value in possible
  expected = _PY_TYPES[t]
  nested = None
  if t in ("array", "tuple"):
    nested = _PY_TYPES.get(param_doc.get("items", {}).get("type"), None)
  if t == "tuple" and type(value) == tuple:  # noqa: E721
    value = list(value)
  if t == "float" and type(value) == int:  # noqa: E721
    value = float(value)
  type_ok, is_variable = _type_ok(value, possible, expected, nested)
  if not type_ok:
    return False
  if not is_variable:
    if expected == dict:
      return _dict_ok(value, possible)
    if expected == list and nested == dict:
      return _list_dict_ok(value, possible)
    if expected == str:
      return standardize_string(value) in [
          standardize_string(p) for p in possible if type(p) == str
      ]  # noqa: E721
    if expected == list:
      return _std_list(value) in [_std_list(p) for p in possible]
  return value in possible


@dataclasses.dataclass(frozen=True)
class CallCheck:
  """Verdict and partial credit of a set of calls against one gold answer.

  Attributes:
    valid: BFCL's verdict (every rule passes).
    score: partial credit in [0, 1]: the mean over gold calls (matched to the
      model's calls) of the per-call field score, times min(1, n_gold / n_model)
      (extra calls dilute it). Per call, fields are the function name, then each
      parameter of the gold answer or the call: a field is right if its value is
      accepted, or it is omitted and omissible. A wrong name scores 0.
    name_ok: fraction of gold calls whose function was called.
    error: None, or the first rule that failed.
  """

  valid: bool
  score: float
  name_ok: float
  error: str | None


def _check_one(
    doc: dict | None, call: parsers.ToolCall, gold: dict
) -> tuple[bool, float, str | None]:
  """(valid, field score, error) of one call against one gold {name: params}."""
  ((name, possible),) = gold.items()
  if doc is None or call.name != name:
    return False, 0.0, "wrong function name"
  props = doc.get("parameters", {}).get("properties", {})
  required = doc.get("parameters", {}).get("required", [])
  error = None
  if call.positional:
    error = "positional arguments"
  for p in required:
    if p not in call.arguments and error is None:
      error = f"missing required parameter {p!r}"
  fields = sorted(set(possible) | set(call.arguments))
  right = 0
  for p in fields:
    if p in call.arguments:
      if p not in props or p not in possible:
        error = error or f"unexpected parameter {p!r}"
        continue
      if value_ok(props[p], call.arguments[p], possible[p]):
        right += 1
      else:
        error = error or f"wrong value for {p!r}"
    elif "" in possible.get(p, []):
      right += 1
    else:
      error = error or f"missing parameter {p!r}"
  score = (1 + right) / (1 + len(fields))
  return error is None, score, error


def _find_doc(functions: Sequence[dict], name: str) -> dict | None:
  for f in functions:
    if f["name"] == name:
      return f
  return None


def check_calls(
    functions: Sequence[dict],
    calls: Sequence[parsers.ToolCall],
    ground_truth: Sequence[dict],
    category: str,
) -> CallCheck:
  """Checks model calls against a BFCL single-turn gold answer.

  Args:
    functions: the task's function documents.
    calls: parsed model calls.
    ground_truth: BFCL possible answers, a list of {name: {param: [values]}}.
    category: 'simple', 'multiple', 'parallel' or 'parallel_multiple' (parallel
      categories match calls to gold in any order, as BFCL does).

  Returns:
    CallCheck. Never raises on any parsed calls.
  """
  n_gold, n_out = len(ground_truth), len(calls)
  used: set[int] = set()
  valid = n_out == n_gold
  error = None if valid else "wrong number of calls"
  total, names = 0.0, 0.0
  for gold in ground_truth:
    doc = _find_doc(functions, next(iter(gold)))
    # BFCL's verdict: the first unused call that passes; for partial credit the
    # best-scoring unused call.
    results = [
        (i, *_check_one(doc, c, gold))
        for i, c in enumerate(calls)
        if i not in used
    ]
    passing = [r for r in results if r[1]]
    if "parallel" not in category:
      # simple / multiple: BFCL compares calls and gold in order.
      results = [r for r in results if r[0] == len(used)]
      passing = [r for r in results if r[1]]
    if passing:
      pick = passing[0]
    elif results:
      pick = max(results, key=lambda r: r[2])
      valid = False
      error = error or pick[3]
    else:
      valid = False
      error = error or "missing call"
      continue
    used.add(pick[0])
    total += pick[2]
    names += float(pick[2] > 0)
  dilution = min(1.0, n_gold / max(n_out, 1))
  score = total / max(n_gold, 1) * dilution
  return CallCheck(valid, float(score), names / max(n_gold, 1), error)


def _first(values: list) -> tuple[bool, Any]:
  vals = [v for v in values if v != ""]
  return (True, vals[0]) if vals else (False, None)


def _unwrap_dict(d: dict) -> dict:
  """A dict-typed gold value {key: [candidates]} -> {key: first candidate}."""
  out = {}
  for k, v in d.items():
    ok, first = _first(v) if isinstance(v, list) else (True, v)
    if ok:
      out[k] = first
  return out


def gold_calls(
    ground_truth: Sequence[dict], functions: Sequence[dict] = ()
) -> list[parsers.ToolCall]:
  """A canonical correct answer: each gold call with the first non-"" candidate
  of every parameter (omissible parameters left out). Dict-typed parameters (and
  arrays of dicts) hold candidate lists per key, which are unwrapped the same way;
  `functions` gives the types (without it, every dict value is unwrapped)."""
  out = []
  for gold in ground_truth:
    ((name, possible),) = gold.items()
    doc = _find_doc(functions, name) if functions else None
    props = (doc or {}).get("parameters", {}).get("properties", {})
    args = {}
    for p, values in possible.items():
      ok, v = _first(values)
      if not ok or (doc is not None and p not in props and "" in values):
        continue  # omissible (some BFCL answers list a parameter the doc lacks)
      t = props.get(p, {}).get("type")
      if isinstance(v, dict) and t in ("dict", None):
        v = _unwrap_dict(v)
      elif (
          isinstance(v, list)
          and v
          and all(isinstance(x, dict) for x in v)
          and t in ("array", None)
          and props.get(p, {}).get("items", {}).get("type", "dict") == "dict"
      ):
        v = [_unwrap_dict(x) for x in v]
      args[p] = v
    out.append(parsers.ToolCall(name, args))
  return out


# ---------------------------------------------------------------------------
# Prompts.


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


def _chat_prompt(fmt, task: BFCLTask, descriptions: bool, limit: int):
  """(ids, roles) of the chat-format prompt. If the prompt would not fit
  `limit`, function descriptions are dropped; if it still does not fit, the
  content is cut (ChatFormat.prompt; the task then may be unsolvable)."""
  ids_roles = fmt.prompt(
      render_system(task, descriptions), task.questions[0], limit
  )
  if descriptions and len(ids_roles[0]) >= limit:
    return fmt.prompt(render_system(task, False), task.questions[0], limit)
  return ids_roles


# ---------------------------------------------------------------------------
# Environments.


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


def _encode(
    tokenizer, text: str, limit: int, prefix=(), suffix=()
) -> np.ndarray:
  body = list(tokenizer.encode(text))[
      : max(limit - len(prefix) - len(suffix), 0)
  ]
  return np.asarray(list(prefix) + body + list(suffix), np.int32)


@dataclasses.dataclass(frozen=True, eq=False)
class BFCLEnv:
  """BFCL single-turn categories as a host environment (see module docstring).

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
      return _SingleState(task), _chat_prompt(
          self.chat_format, task, self.descriptions, self.max_prompt_len
      )
    ids = _encode(
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
    return _encode(
        self.tokenizer,
        text,
        self.max_action_len,
        prefix=(tok.CALL,),
        suffix=(tok.CALL_END,),
    )


# --- multi-turn -------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _multi_turn_docs(
    classes: tuple[str, ...], excluded: tuple[str, ...]
) -> list[dict]:
  from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING

  docs_dir = os.path.join(data_dir(), "multi_turn_func_doc")
  file_of = {}
  for fname in os.listdir(docs_dir):
    file_of[fname[:-5]] = os.path.join(docs_dir, fname)
  out = []
  for c in classes:
    module = CLASS_FILE_PATH_MAPPING[c].rsplit(".", 1)[1]
    for doc in _read_jsonl(file_of[module]):
      if doc["name"] not in excluded and f"{c}.{doc['name']}" not in excluded:
        out.append(doc)
  return out


def make_instances(task: BFCLTask) -> dict[str, Any]:
  """Fresh API class instances loaded with the task's initial state."""
  from bfcl_eval.constants.executable_backend_config import (
      CLASS_FILE_PATH_MAPPING,
      STATELESS_CLASSES,
  )

  out = {}
  for c in task.involved_classes:
    cls = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[c]), c)
    inst = cls()
    if c not in STATELESS_CLASSES:
      inst._load_scenario(
          copy.deepcopy((task.initial_config or {}).get(c, {})),
          long_context=False,
      )
    out[c] = inst
  return out


# Bounds on arguments whose cost in BFCL's tools grows without limit in their
# value (the tools are BFCL's Python code, run in this process: a thread past
# its time limit cannot be stopped, so the work itself must stay small).
MAX_PRECISION = 1000  # MathAPI.square_root / logarithm: digits
MAX_POWER_BITS = (
    1 << 16
)  # MathAPI.power, integer arguments: |result| <= 2**this
MAX_ROUND_DIGITS = 1000  # MathAPI.round_number: |decimal_places|
TOOL_TIMEOUT_S = 5.0  # default time limit of one call
MAX_RESULT_CHARS = 4096  # default cap on one call's result text

# mpmath's precision (mp.prec / mp.dps) is process-wide; calls hold this lock
# while it may differ from its saved value.
_GLOBAL_STATE_LOCK = threading.Lock()


def _number(x) -> bool:
  return isinstance(x, (int, float)) and not isinstance(x, bool)


def check_call_arguments(call: parsers.ToolCall) -> str | None:
  """An error text if a call's arguments exceed the bounds above, else None.

  Checked: precision > MAX_PRECISION (square_root, logarithm), an integer
  power whose result would exceed 2**MAX_POWER_BITS in size, and
  |decimal_places| > MAX_ROUND_DIGITS (round_number), keyword or positional.
  """
  name = call.name.rsplit(".", 1)[-1]

  def arg(i: int, key: str):
    if key in call.arguments:
      return call.arguments[key]
    return call.positional[i] if len(call.positional) > i else None

  if name in ("square_root", "logarithm"):
    prec = arg(1 if name == "square_root" else 2, "precision")
    if _number(prec) and prec > MAX_PRECISION:
      return f"Error: precision={prec!r} is above the limit {MAX_PRECISION}"
  if name == "power":
    base, exp = arg(0, "base"), arg(1, "exponent")
    if (
        all(isinstance(x, int) and not isinstance(x, bool) for x in (base, exp))
        and abs(base) > 1
        and exp > 0
        # |base| >= 2, so the result is >= 2**exp (tested first: exp may be
        # too large for a float).
        and (
            exp > MAX_POWER_BITS or exp * math.log2(abs(base)) > MAX_POWER_BITS
        )
    ):
      return (
          f"Error: power(base={base}, exponent={exp}) is above "
          f"2**{MAX_POWER_BITS}"
      )
  if name == "round_number":
    places = arg(1, "decimal_places")
    if _number(places) and abs(places) > MAX_ROUND_DIGITS:
      return (
          f"Error: decimal_places={places!r} is beyond the limit "
          f"+-{MAX_ROUND_DIGITS}"
      )
  return None


def _render(result: Any) -> tuple[str, bool]:
  """(text, ok) of a tool's return value; may raise (e.g. str() of an int
  over Python's digit limit)."""
  if isinstance(result, dict):
    try:
      return json.dumps(result), "error" not in result
    except (TypeError, ValueError, OverflowError, RecursionError):
      return str(result), "error" not in result
  return str(result), True


def _run_isolated(
    method, call: parsers.ToolCall, lock_timeout_s: float
) -> tuple[str, bool]:
  """Runs and renders one call with process-global numeric state isolated:
  a local `decimal` context (decimal's context is per thread; this one is
  dropped after the call) and mpmath's precision saved and restored under
  _GLOBAL_STATE_LOCK (mpmath's is per process)."""
  import mpmath  # bfcl-eval's MathAPI needs it (requirements-test.txt)

  if not _GLOBAL_STATE_LOCK.acquire(timeout=lock_timeout_s):
    raise TimeoutError("another tool call still holds the numeric-state lock")
  try:
    prec = mpmath.mp.prec
    try:
      with decimal.localcontext():
        return _render(method(*call.positional, **call.arguments))
    finally:
      mpmath.mp.prec = prec
  finally:
    _GLOBAL_STATE_LOCK.release()


@dataclasses.dataclass(frozen=True)
class CallResult:
  """One executed call: result text, ok, and status ('ok', 'error': refused
  or an error result, 'exception': the tool raised or its result could not be
  rendered, 'timeout': abandoned at the time limit)."""

  text: str
  ok: bool
  status: str


def run_call(
    instances: dict[str, Any],
    call: parsers.ToolCall,
    *,
    timeout_s: float = TOOL_TIMEOUT_S,
    max_chars: int = MAX_RESULT_CHARS,
) -> CallResult:
  """Runs one call on the API instances by method name; never raises.

  Unknown or private methods and arguments over the bounds of
  `check_call_arguments` are refused without running. The call runs in a
  worker thread (base.call_with_deadline) with `_run_isolated`'s state
  isolation; past `timeout_s` it is abandoned (it may still modify
  `instances` until it returns, so the caller must stop using them). The text
  is cut to `max_chars` characters.

  Args:
    instances: class name -> API instance (make_instances).
    call: the parsed call.
    timeout_s: > 0, seconds.
    max_chars: cap on the result text.
  """
  name = call.name.rsplit(".", 1)[-1]
  method = None
  if not name.startswith("_"):
    for inst in instances.values():
      m = getattr(inst, name, None)
      if m is not None and inspect.ismethod(m):
        method = m
        break
  if method is None:
    return CallResult(
        f"Error: unknown function {call.name!r}"[:max_chars], False, "error"
    )
  refused = check_call_arguments(call)
  if refused is not None:
    return CallResult(refused[:max_chars], False, "error")
  out = host_base.call_with_deadline(
      _run_isolated, method, call, timeout_s, timeout_s=timeout_s
  )
  if out.status == "timeout":
    return CallResult(
        f"Error: {name} did not finish within {timeout_s:g} s", False, "timeout"
    )
  if out.status == "exception":
    try:
      detail = str(out.error)
    except Exception:  # noqa: BLE001 -- an exception whose str() fails
      detail = type(out.error).__name__
    return CallResult(
        f"Error during execution: {detail}"[:max_chars], False, "exception"
    )
  text, ok = out.value
  return CallResult(text[:max_chars], ok, "ok" if ok else "error")


def execute_call(
    instances: dict[str, Any], call: parsers.ToolCall
) -> tuple[str, bool]:
  """(result text, ok) of `run_call` with its default limits; never raises.

  Unknown or private methods, refused arguments, exceptions and timeouts give
  ok=False and an error text.
  """
  r = run_call(instances, call)
  return r.text, r.ok


def public_state(instances: dict[str, Any]) -> dict[str, dict]:
  return {
      c: {k: v for k, v in vars(i).items() if not k.startswith("_")}
      for c, i in instances.items()
  }


def gold_instances(task: BFCLTask) -> dict[str, Any]:
  """API instances after executing every gold call of the task."""
  inst = make_instances(task)
  for turn in task.ground_truth:
    for s in turn:
      calls = parsers.parse_python_calls(s, allow_positional=True)
      if not isinstance(calls, parsers.ParseError):
        for c in calls:
          execute_call(inst, c)
  return inst


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
  """BFCL multi_turn_base as a host environment (see module docstring).

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
          _chat_prompt(
              self.chat_format, task, self.descriptions, self.max_prompt_len
          ),
      )
    ids = _encode(
        self.tokenizer,
        render_prompt(task, self.descriptions),
        self.max_prompt_len,
        prefix=(self.tokenizer.bos_id,),
    )
    return _MultiState(task, make_instances(task)), ids

  def _obs(self, text: str, role: str | None = None):
    if self.chat_format is not None:
      return self.chat_format.observation(text, self.max_obs_len, role=role)
    return _encode(
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
      return _encode(
          self.tokenizer,
          text,
          self.max_action_len,
          prefix=(tok.CALL,),
          suffix=(tok.CALL_END,),
      )
    if fmt is not None:
      return fmt.assistant("Done.", self.max_action_len)
    return _encode(
        self.tokenizer, "Done.", self.max_action_len, suffix=(tok.ANSWER_END,)
    )
