"""The call checker: BFCL's AST rules for Python, plus partial credit.

`check_calls` is our re-implementation of BFCL's AST checker for Python (Patil
et al., "The Berkeley Function Calling Leaderboard", ICML 2025; bfcl_eval/
eval_checker/ast_eval/ast_checker.py): same verdict rules (function name;
required parameters present; no unexpected parameter; per-type value checks
against the possible-answer lists, with BFCL's string standardisation,
int->float promotion, tuple->list, dict and list-of-dict checks; omitted
optional parameters must allow ""), plus a fine-grained partial credit per
field. experiments/bfcl_checker_agreement.py measures agreement with BFCL's own
checker.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Sequence


from environments.host import parsers

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
