"""TFDS builder: BFCL single-turn categories from the installed bfcl-eval wheel.

Source: `bfcl_eval/data/BFCL_v4_<category>.json` and its `possible_answer/` file
(Patil et al., "The Berkeley Function Calling Leaderboard", ICML 2025), read
through `environments.host.bfcl.data.load_category`; nothing is downloaded.

Configs: `simple`, `multiple`, `parallel`, `parallel_multiple` (every entry), and
`<category>_first<N>` (the first N entries of the file; tiny subsets for tests).
Splits: entry i (file order) is in `test` if i % 5 == 0, else in `train` (the
same held-out rule as `environments.host.bfcl.single_turn.BFCLEnv`, eval_every=5). Each split
keeps file order.

Record (after `agentic_rl.data` decoding): id (str), category (str), questions
(list[str], one per user turn), functions (list of BFCL function documents),
ground_truth (list of {function: {param: [possible values]}}).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re

import tensorflow_datasets as tfds

CATEGORIES = ("simple", "multiple", "parallel", "parallel_multiple")
EVAL_EVERY = 5
_NAME_RE = re.compile(r"^(?P<cat>[a-z_]+?)(?:_first(?P<n>\d+))?$")


@dataclasses.dataclass(eq=False)
class BfclConfig(tfds.core.BuilderConfig):
  """One BFCL category; max_examples > 0 keeps only the first entries."""

  category: str = "simple"
  max_examples: int = 0


def source_records(
    category: str, max_examples: int = 0
) -> dict[str, list[dict]]:
  """{split: records} straight from the bfcl-eval files (the builder's ground truth).

  Raises:
    ValueError: unknown category. ImportError: bfcl-eval not installed.
  """
  from environments.host.bfcl import data as bfcl_data

  if category not in CATEGORIES:
    raise ValueError(f"BFCL category {category!r}: must be one of {CATEGORIES}")
  tasks = bfcl_data.load_category(category)
  if max_examples > 0:
    tasks = tasks[:max_examples]
  out = {"train": [], "test": []}
  for i, t in enumerate(tasks):
    out["test" if i % EVAL_EVERY == 0 else "train"].append(
        dict(
            id=t.id,
            category=t.category,
            questions=list(t.questions),
            functions=list(t.functions),
            ground_truth=t.ground_truth,
        )
    )
  return out


class BfclSingleTurn(tfds.core.GeneratorBasedBuilder):
  """BFCL single-turn function-calling tasks (see module docstring)."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "BFCL v4 data of bfcl-eval 2026.3.23."}
  BUILDER_CONFIGS = [BfclConfig(name=c, category=c) for c in CATEGORIES]

  @classmethod
  @functools.lru_cache(maxsize=None)
  def get_builder_config(cls, name: str, version=None):
    """Also resolves `<category>_first<N>` names (tiny subsets)."""
    m = _NAME_RE.match(name)
    if m is None or m.group("cat") not in CATEGORIES:
      return None
    n = int(m.group("n") or 0)
    if n == 0:
      return super().get_builder_config(name, version)
    return BfclConfig(name=name, category=m.group("cat"), max_examples=n)

  def _info(self) -> tfds.core.DatasetInfo:
    text = tfds.features.Text()
    return tfds.core.DatasetInfo(
        builder=self,
        description=__doc__,
        features=tfds.features.FeaturesDict(
            dict(
                id=text,
                category=text,
                questions_json=text,
                functions_json=text,
                ground_truth_json=text,
            )
        ),
        disable_shuffling=True,
        homepage="https://gorilla.cs.berkeley.edu/leaderboard.html",
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # local package files only
    splits = source_records(
        self.builder_config.category, self.builder_config.max_examples
    )
    return {s: self._generate_examples(r) for s, r in splits.items()}

  def _generate_examples(self, records):
    for i, r in enumerate(records):
      yield i, dict(
          id=r["id"],
          category=r["category"],
          questions_json=json.dumps(r["questions"]),
          functions_json=json.dumps(r["functions"]),
          ground_truth_json=json.dumps(r["ground_truth"]),
      )
