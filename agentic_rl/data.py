"""Task datasets with splits, read through grain, with a checkpointable position.

A dataset is a folder of files `{name}-{split}.jsonl` or
`{name}-{split}.array_record` (one JSON object per record; array_record files hold
the UTF-8 JSON bytes of each record). Both are random-access grain data sources,
so a pipeline `source -> shuffle(seed) -> repeat -> map(decode)` is deterministic
and its iterator position is a small dict (`get_position` / `set_position`), saved
next to the model checkpoint with `save_position` / `restore_position`: resuming
at a saved position yields exactly the items that would have come next.

What is not here: TFDS builders. tensorflow-datasets 4.9.10 is installed and its
catalogue datasets (e.g. GSM8K, on a machine with internet) can be prepared in
array_record format by tfds and read with `grain.sources.ArrayRecordDataSource`
through `make_dataset(path)` only if their records are JSON; TFDS's own
tf.train.Example encoding would need a decoder here (not written).
"""

from __future__ import annotations

import json
import os
from typing import Any, Iterable, Sequence

import grain

SPLITS = ("train", "validation", "test")


class JsonlSource(grain.sources.RandomAccessDataSource):
  """Random access to the lines of a JSONL file (raw bytes; decode with json).

  The byte offset of every line is indexed once; records are read on access.
  Blank lines are skipped.
  """

  def __init__(self, path: str):
    self._path = path
    offsets = []
    with open(path, "rb") as f:
      pos = 0
      for line in f:
        if line.strip():
          offsets.append((pos, len(line)))
        pos += len(line)
    self._offsets = offsets

  def __len__(self) -> int:
    return len(self._offsets)

  def __getitem__(self, index: int) -> bytes:
    start, size = self._offsets[index]
    with open(self._path, "rb") as f:
      f.seek(start)
      return f.read(size)

  def __repr__(self) -> str:
    return f"JsonlSource({self._path!r}, {len(self)} records)"


def write_jsonl(path: str, records: Iterable[Any]) -> int:
  """Writes records as JSON lines; returns the count."""
  n = 0
  with open(path, "w", encoding="utf-8") as f:
    for r in records:
      f.write(json.dumps(r) + "\n")
      n += 1
  return n


def write_array_record(path: str, records: Iterable[Any]) -> int:
  """Writes records as JSON bytes into an array_record file; returns the count."""
  from array_record.python import array_record_module
  writer = array_record_module.ArrayRecordWriter(path, "group_size:1")
  n = 0
  try:
    for r in records:
      writer.write(json.dumps(r).encode("utf-8"))
      n += 1
  finally:
    writer.close()
  return n


def write_splits(data_dir: str, name: str, splits: dict[str, Sequence[Any]],
                 fmt: str = "jsonl") -> dict[str, str]:
  """Writes `{name}-{split}.{fmt}` files; returns {split: path}.

  Raises:
    ValueError: unknown format or split name.
  """
  if fmt not in ("jsonl", "array_record"):
    raise ValueError(f"format {fmt!r}: must be 'jsonl' or 'array_record'")
  os.makedirs(data_dir, exist_ok=True)
  out = {}
  for split, records in splits.items():
    if split not in SPLITS:
      raise ValueError(f"split {split!r}: must be one of {SPLITS}")
    path = os.path.join(data_dir, f"{name}-{split}.{fmt}")
    (write_jsonl if fmt == "jsonl" else write_array_record)(path, records)
    out[split] = path
  return out


def split_path(data_dir: str, name: str, split: str) -> str:
  """The file of one split (jsonl preferred over array_record).

  Raises:
    FileNotFoundError: neither file exists.
  """
  for fmt in ("jsonl", "array_record"):
    path = os.path.join(data_dir, f"{name}-{split}.{fmt}")
    if os.path.exists(path):
      return path
  raise FileNotFoundError(f"no {name}-{split}.jsonl or .array_record in {data_dir}")


def make_source(path: str) -> grain.sources.RandomAccessDataSource:
  """A grain data source of raw JSON bytes for a .jsonl or .array_record file."""
  if path.endswith(".jsonl"):
    return JsonlSource(path)
  if path.endswith(".array_record"):
    return grain.sources.ArrayRecordDataSource(path)
  raise ValueError(f"data file {path!r}: must end in .jsonl or .array_record")


def _decode(raw: bytes) -> Any:
  return json.loads(raw.decode("utf-8") if isinstance(raw, bytes) else raw)


def make_dataset(path: str, *, seed: int = 0, shuffle: bool = True,
                 num_epochs: int | None = None) -> grain.MapDataset:
  """Deterministic pipeline: source -> shuffle(seed) -> repeat -> JSON decode.

  Args:
    path: a .jsonl or .array_record file.
    seed: shuffle seed (each epoch is a different permutation).
    shuffle: False keeps file order.
    num_epochs: None repeats forever (training streams); 1 for evaluation.
  """
  ds = grain.MapDataset.source(make_source(path))
  if shuffle:
    ds = ds.shuffle(seed=seed)
  ds = ds.repeat(num_epochs)
  return ds.map(_decode)


def make_iterator(path: str, **kwargs) -> grain.DatasetIterator:
  """A checkpointable iterator over `make_dataset(path, **kwargs)`."""
  return iter(make_dataset(path, **kwargs).to_iter_dataset())


def get_position(it: grain.DatasetIterator) -> dict:
  """The iterator's position, a small JSON-serialisable dict."""
  return it.get_state()


def set_position(it: grain.DatasetIterator, position: dict) -> None:
  """Moves an iterator of the same pipeline to a saved position."""
  it.set_state(position)


def save_position(path: str, it: grain.DatasetIterator) -> None:
  """Writes the position atomically as JSON (next to a model checkpoint)."""
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(get_position(it), f)
  os.replace(tmp, path)


def restore_position(path: str, it: grain.DatasetIterator) -> None:
  with open(path) as f:
    set_position(it, json.load(f))
