"""Execution of BFCL's multi-turn API calls (GorillaFileSystem, TwitterAPI,
...): fresh instances loaded with a task's initial state, one call run by name
with literal arguments (never `eval`) under bounds, a time limit and isolated
numeric state (`run_call`), and the state after the gold calls.
"""

from __future__ import annotations

import copy
import dataclasses
import decimal
import importlib
import inspect
import json
import math
import threading
from typing import Any


from environments.host import base as host_base
from environments.host import parsers
from environments.host.bfcl.data import BFCLTask


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
