"""TFDS builder: items of a reasoning-gym generator, drawn from fixed seeds.

Source: the installed `reasoning-gym` package (Apache-2.0); its generators are
deterministic given (name, seed, index), so the data is generated locally,
nothing is downloaded. `train` is items 0..N-1 of the generator seeded with
TRAIN_SEED, `test` items 0..M-1 of the generator seeded with EVAL_SEED (the
defaults of `environments.host.reasoning_gym_env.ReasoningGymEnv`, so the test
split is that environment's held-out stream at eval seed 0).

Configs: `<generator>` (train 1000, test 200), `<generator>_train<N>_test<M>`,
for the generators in GENERATORS (others can be added to that tuple).

Record (after `agentic_rl.data` decoding): question (str), answer (str), entry
(the generator's full item dict, with the metadata its `score_answer` needs),
seed (int), index (int).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re

import numpy as np
import tensorflow_datasets as tfds

TRAIN_SEED = 0
EVAL_SEED = 1_000_003
GENERATORS = ("gsm_symbolic", "basic_arithmetic", "chain_sum")
_NAME_RE = re.compile(
    r"^(?P<gen>[a-z_]+?)(?:_train(?P<tr>\d+)_test(?P<te>\d+))?$"
)


@dataclasses.dataclass(eq=False)
class RgConfig(tfds.core.BuilderConfig):
  """One reasoning-gym generator and the split sizes."""

  generator: str = "gsm_symbolic"
  num_train: int = 1000
  num_test: int = 200


def source_records(
    generator: str, num_train: int, num_test: int
) -> dict[str, list[dict]]:
  """{split: records} generated from reasoning-gym (the builder's ground truth).

  Raises:
    ValueError: unknown generator (from reasoning_gym).
  """
  import reasoning_gym

  out = {}
  for split, seed, n in (
      ("train", TRAIN_SEED, num_train),
      ("test", EVAL_SEED, num_test),
  ):
    ds = reasoning_gym.create_dataset(generator, size=max(n, 1), seed=seed)
    # JSON round trip: the stored entry is exactly what a reader gets back.
    out[split] = [
        dict(
            question=e["question"],
            answer=str(e["answer"]),
            entry=json.loads(json.dumps(e)),
            seed=seed,
            index=i,
        )
        for i, e in ((i, ds[i]) for i in range(n))
    ]
  return out


class ReasoningGymTasks(tfds.core.GeneratorBasedBuilder):
  """reasoning-gym items with fixed-seed train/test splits (see module docstring)."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "reasoning-gym 0.1.25."}
  BUILDER_CONFIGS = [RgConfig(name=g, generator=g) for g in GENERATORS]

  @classmethod
  @functools.lru_cache(maxsize=None)
  def get_builder_config(cls, name: str, version=None):
    """Also resolves `<generator>_train<N>_test<M>` names."""
    m = _NAME_RE.match(name)
    if m is None or m.group("gen") not in GENERATORS:
      return None
    if m.group("tr") is None:
      return super().get_builder_config(name, version)
    return RgConfig(
        name=name,
        generator=m.group("gen"),
        num_train=int(m.group("tr")),
        num_test=int(m.group("te")),
    )

  def _info(self) -> tfds.core.DatasetInfo:
    text = tfds.features.Text()
    return tfds.core.DatasetInfo(
        builder=self,
        description=__doc__,
        features=tfds.features.FeaturesDict(
            dict(
                question=text,
                answer=text,
                entry_json=text,
                seed=np.int64,
                index=np.int64,
            )
        ),
        disable_shuffling=True,
        homepage="https://github.com/open-thought/reasoning-gym",
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # generated locally
    c = self.builder_config
    splits = source_records(c.generator, c.num_train, c.num_test)
    return {s: self._generate_examples(r) for s, r in splits.items()}

  def _generate_examples(self, records):
    for r in records:
      yield r["index"], dict(
          question=r["question"],
          answer=r["answer"],
          entry_json=json.dumps(r["entry"]),
          seed=r["seed"],
          index=r["index"],
      )
