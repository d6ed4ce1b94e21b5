"""BFCL data: the JSONL files shipped inside the installed `bfcl-eval` wheel
(`bfcl_eval/data/BFCL_v4_*.json` and `data/possible_answer/`); nothing is
downloaded. `bfcl-eval` is a test/optional dependency (requirements-test.txt,
installed with --no-deps plus mpmath); this module imports it lazily.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import os
from typing import Any

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
