"""TFDS builders (array_record format) for the task data the host environments use.

Every builder here is a `tfds.core.GeneratorBasedBuilder` whose
`download_and_prepare` reads only local files or installed packages (nothing is
downloaded), writes array_record shards, and keeps the source order
(`disable_shuffling`), so record i of a split is the i-th source item of it.

  bfcl_single_turn/<category>[_first<N>]   BFCL single-turn categories from the
      installed bfcl-eval wheel (bfcl_single_turn.py); test = every 5th entry.
  reasoning_gym_tasks/<generator>[_train<N>_test<M>]   items of a reasoning-gym
      generator (e.g. gsm_symbolic) drawn from fixed seeds (reasoning_gym_tasks.py).

Importing a builder module registers its name with TFDS, so `tfds.data_source(
"bfcl_single_turn/simple", data_dir=...)` and `agentic_rl.data.make_loader(
dict(source="tfds", name=...))` find it exactly like a catalogue dataset such as
"gsm8k". `register()` imports them all. Nested values (lists of dicts) are stored
as JSON text in features named `<field>_json`; `agentic_rl.data` decodes them back
into `<field>`.

tensorflow-datasets (requirements.txt) works here without TensorFlow: array_record
writing and `tfds.data_source` reading are numpy-only.
"""

from __future__ import annotations

import importlib

BUILDER_MODULES = (
    "agentic_rl.datasets.bfcl_single_turn",
    "agentic_rl.datasets.reasoning_gym_tasks",
)


def register() -> None:
  """Imports every builder module (registers their TFDS names). Idempotent."""
  for m in BUILDER_MODULES:
    importlib.import_module(m)
