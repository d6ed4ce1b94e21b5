"""Agreement of our BFCL call checker with BFCL's own AST checker.

For every task of the shipped single-turn Python categories (simple, multiple,
parallel, parallel_multiple), builds the gold answer (first accepted value of each
parameter, omissible ones left out) and four perturbations of it:

  wrong_function:  the first call's function renamed (name + '_x');
  wrong_parameter: one parameter of the first call renamed (param + '_x');
  wrong_value:     one parameter of the first call given a value outside its
                   possible-answer list (type-preserving where possible);
  missing_call:    the last call dropped.

Each answer is judged by environments/host/bfcl/checker.py check_calls and by
bfcl_eval.eval_checker.ast_eval.ast_checker.ast_checker (imported from the
installed wheel; its import of the model registry, which needs every API
client, is replaced by a stub that maps our model name to a config without
underscore-to-dot renaming). Reports, per category and kind: the number of
cases, BFCL's acceptance rate, ours, and the agreement rate.

Run:  python experiments/bfcl_checker_agreement.py [--limit N] [--json out.json]
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import types as pytypes

from environments.host.bfcl import checker as bfcl_checker
from environments.host.bfcl import data as bfcl_data
from environments.host import parsers

MODEL = "agentic-rl-checker"


def load_bfcl_ast_checker():
  """BFCL's `ast_checker` and `Language`, with the model registry stubbed."""
  if "bfcl_eval.constants.model_config" not in sys.modules:
    stub = pytypes.ModuleType("bfcl_eval.constants.model_config")

    class _Cfg:
      underscore_to_dot = False

    class _Mapping(dict):

      def __missing__(self, key):
        return _Cfg()

    stub.MODEL_CONFIG_MAPPING = _Mapping()
    sys.modules["bfcl_eval.constants.model_config"] = stub
  from bfcl_eval.constants.enums import Language
  from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker

  return ast_checker, Language


def bfcl_category(cat: str) -> str:
  return {"simple": "simple_python"}.get(cat, cat)


def _bad_value(value, possible):
  """A value of the same type as `value` that BFCL rejects."""
  if isinstance(value, bool):
    cand = not value
    return cand if cand not in possible else "zzz_not_a_value"
  if isinstance(value, int):
    return (
        max(
            [
                v
                for v in possible
                if isinstance(v, int) and not isinstance(v, bool)
            ]
            + [value]
        )
        + 1009
    )
  if isinstance(value, float):
    return max([v for v in possible if isinstance(v, float)] + [value]) + 1009.5
  if isinstance(value, str):
    return value + " qqq zzz"
  if isinstance(value, list):
    return list(value) + [value[0] if value else 12345, 98765]
  if isinstance(value, dict):
    return {**value, "zzz_extra_key": 1}
  return "zzz_not_a_value"


def perturbations(gt, functions=()):
  """(kind, calls) pairs: the gold answer and its four perturbations."""
  gold = bfcl_checker.gold_calls(gt, functions)
  out = [("gold", gold)]
  first = gold[0]
  out.append(
      (
          "wrong_function",
          [parsers.ToolCall(first.name + "_x", first.arguments)] + gold[1:],
      )
  )
  if first.arguments:
    p = sorted(first.arguments)[0]
    args = dict(first.arguments)
    args[p + "_x"] = args.pop(p)
    out.append(
        ("wrong_parameter", [parsers.ToolCall(first.name, args)] + gold[1:])
    )
    args = dict(first.arguments)
    ((_, possible),) = gt[0].items()
    args[p] = _bad_value(args[p], possible[p])
    out.append(("wrong_value", [parsers.ToolCall(first.name, args)] + gold[1:]))
  out.append(("missing_call", gold[:-1]))
  return out


def to_bfcl_output(calls):
  return [{c.name: copy.deepcopy(c.arguments)} for c in calls]


def run(limit: int | None = None, categories=bfcl_data.SINGLE_TURN) -> dict:
  ast_checker, language = load_bfcl_ast_checker()
  report = {}
  for cat in categories:
    tasks = bfcl_data.load_category(cat)[:limit]
    stats = {}
    for task in tasks:
      for kind, calls in perturbations(task.ground_truth, task.functions):
        try:
          theirs = ast_checker(
              list(task.functions),
              to_bfcl_output(calls),
              task.ground_truth,
              language.PYTHON,
              bfcl_category(cat),
              MODEL,
          )["valid"]
        except Exception:  # noqa: BLE001 -- BFCL's checker crashing is a reject
          theirs = False
        ours = bfcl_checker.check_calls(
            task.functions, calls, task.ground_truth, cat
        ).valid
        s = stats.setdefault(
            kind,
            {
                "n": 0,
                "bfcl_accept": 0,
                "ours_accept": 0,
                "agree": 0,
                "disagreements": [],
            },
        )
        s["n"] += 1
        s["bfcl_accept"] += int(theirs)
        s["ours_accept"] += int(ours)
        s["agree"] += int(theirs == ours)
        if theirs != ours and len(s["disagreements"]) < 5:
          s["disagreements"].append(task.id)
    report[cat] = stats
  return report


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--limit", type=int, default=None)
  ap.add_argument("--json", default=None)
  args = ap.parse_args()
  report = run(args.limit)
  total_n = total_agree = 0
  print(
      f"{'category':18s} {'kind':16s} {'n':>5s} {'bfcl acc':>9s} "
      f"{'ours acc':>9s} {'agree':>7s}"
  )
  for cat, stats in report.items():
    for kind, s in stats.items():
      total_n += s["n"]
      total_agree += s["agree"]
      print(
          f"{cat:18s} {kind:16s} {s['n']:5d} {s['bfcl_accept'] / s['n']:9.3f} "
          f"{s['ours_accept'] / s['n']:9.3f} {s['agree'] / s['n']:7.3f}"
          + (f"  e.g. {s['disagreements']}" if s["disagreements"] else "")
      )
  print(
      f"overall agreement: {total_agree}/{total_n} = {total_agree / total_n:.4f}"
  )
  if args.json:
    with open(args.json, "w") as f:
      json.dump(report, f, indent=2)


if __name__ == "__main__":
  main()
