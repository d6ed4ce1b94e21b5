"""Task datasets with splits, read through grain, with a checkpointable position.

A dataset is a folder of files `{name}-{split}.jsonl` or
`{name}-{split}.array_record` (one JSON object per record; array_record files hold
the UTF-8 JSON bytes of each record). Both are random-access grain data sources,
so a pipeline `source -> shuffle(seed) -> repeat -> map(decode)` is deterministic
and its iterator position is a small dict (`get_position` / `set_position`), saved
next to the model checkpoint with `save_position` / `restore_position`: resuming
at a saved position yields exactly the items that would have come next.

One loader for all of them, `make_loader(config.data)`:

  source='jsonl' | 'array_record': the file `{data_dir}/{name}-{split}.{source}`.
  source='tfds': `tfds.data_source(name, split=..., data_dir=...)`, the array_record
      files of a prepared TFDS dataset, decoded to numpy by TFDS (no TensorFlow).
      Our builders (agentic_rl/datasets/: 'bfcl_single_turn/<category>',
      'reasoning_gym_tasks/<generator>') are prepared from local package files
      when `prepare` is True. A catalogue dataset such as 'gsm8k' takes the same
      path on a machine with internet: with prepare=True, tfds downloads and
      prepares it into data_dir on first use (as array_record, since
      `file_format='array_record'` is passed); afterwards, or on a machine where
      data_dir was copied, it is read offline. Not tested here (no internet).

Every record is converted to plain Python (bytes -> str, numpy scalars and
arrays -> int/float/list), and a feature named `<field>_json` (our builders'
encoding of nested values) is parsed into `<field>`. The iterator position of
the pipeline is saved inside the run's orbax checkpoint
(`checkpoint.Checkpointer.save(..., data_position=get_position(it))`).
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


def write_splits(
    data_dir: str,
    name: str,
    splits: dict[str, Sequence[Any]],
    fmt: str = "jsonl",
) -> dict[str, str]:
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
  raise FileNotFoundError(
      f"no {name}-{split}.jsonl or .array_record in {data_dir}"
  )


def make_source(path: str) -> grain.sources.RandomAccessDataSource:
  """A grain data source of raw JSON bytes for a .jsonl or .array_record file."""
  if path.endswith(".jsonl"):
    return JsonlSource(path)
  if path.endswith(".array_record"):
    return grain.sources.ArrayRecordDataSource(path)
  raise ValueError(f"data file {path!r}: must end in .jsonl or .array_record")


def _decode(raw: bytes) -> Any:
  return json.loads(raw.decode("utf-8") if isinstance(raw, bytes) else raw)


def make_dataset(
    path: str,
    *,
    seed: int = 0,
    shuffle: bool = True,
    num_epochs: int | None = None,
) -> grain.MapDataset:
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


# ---------------------------------------------------------------------------
# One loader API over JSONL, array_record and TFDS (config.data).

SOURCES = ("tfds", "jsonl", "array_record")
LOADER_DEFAULTS = dict(
    source="",
    name="",
    split="train",
    data_dir="",
    shuffle_seed=0,
    num_epochs=0,
    batch_size=0,
    prepare=True,
    eval_split="test",
)


def validate_data_config(data_config) -> dict:
  """The loader config block with defaults filled in, as a plain dict.

  Fields (LOADER_DEFAULTS): source ('tfds' | 'jsonl' | 'array_record'), name (a
  TFDS name such as 'bfcl_single_turn/simple' or 'gsm8k', or the file stem of a
  JSONL / array_record split), split ('train', 'test', ...; TFDS also accepts
  slices such as 'train[:10]'), data_dir ('' = TFDS's default folder; required for
  files), shuffle_seed (int; -1 keeps file order), num_epochs (0 = repeat
  forever), batch_size (0 = one record per `next`, else lists of that many
  records; the last partial batch is dropped), prepare (tfds: build/download the
  dataset if data_dir does not hold it yet), eval_split (the held-out split that
  agentic_rl/datasets/tasks.py reads for env.eval_tasks; make_loader ignores it).

  Raises:
    ValueError: unknown field, or a bad value; the message names
      `config.data.<field>` and the value.
  """
  cfg = dict(data_config)
  unknown = sorted(set(cfg) - set(LOADER_DEFAULTS))
  if unknown:
    raise ValueError(
        f"config.data.{unknown[0]}: unknown field; known "
        f"{sorted(LOADER_DEFAULTS)}"
    )
  cfg = {**LOADER_DEFAULTS, **cfg}
  if cfg["source"] not in SOURCES:
    raise ValueError(
        f"config.data.source={cfg['source']!r}: must be one of {SOURCES}"
    )
  if not isinstance(cfg["name"], str) or not cfg["name"]:
    raise ValueError(
        f"config.data.name={cfg['name']!r}: must be a non-empty string"
    )
  for field in ("split", "eval_split"):
    if not isinstance(cfg[field], str) or not cfg[field]:
      raise ValueError(
          f"config.data.{field}={cfg[field]!r}: must be a non-empty string"
      )
  if cfg["source"] != "tfds" and not cfg["data_dir"]:
    raise ValueError(
        f"config.data.data_dir={cfg['data_dir']!r}: required for "
        f"source={cfg['source']!r}"
    )
  for field, low in (
      ("shuffle_seed", -1),
      ("num_epochs", 0),
      ("batch_size", 0),
  ):
    v = cfg[field]
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
      raise ValueError(f"config.data.{field}={v!r}: must be an int >= {low}")
  return cfg


def to_python(record: Any) -> Any:
  """A decoded TFDS / JSON record as plain Python.

  bytes -> str (UTF-8), numpy scalars -> int/float/bool, numpy arrays -> lists,
  dicts recursively; a key `<field>_json` holding JSON text becomes `<field>`
  with the parsed value.
  """
  import numpy as np

  if isinstance(record, dict):
    out = {}
    for k, v in record.items():
      v = to_python(v)
      if k.endswith("_json") and isinstance(v, str):
        out[k[: -len("_json")]] = json.loads(v)
      else:
        out[k] = v
    return out
  if isinstance(record, bytes):
    return record.decode("utf-8")
  if isinstance(record, np.ndarray):
    return (
        [to_python(x) for x in record.tolist()]
        if record.ndim
        else to_python(record.item())
    )
  if isinstance(record, np.generic):
    return record.item()
  if isinstance(record, (list, tuple)):
    return [to_python(x) for x in record]
  return record


def register_catalogue_builder(name: str) -> bool:
  """Imports the module of a TFDS catalogue dataset (e.g. 'gsm8k'), registering it.

  Without TensorFlow, `import tensorflow_datasets` registers no catalogue
  builder; each one's module (tensorflow_datasets/<group>/<name>/<name>.py or
  tensorflow_datasets/datasets/<name>/<name>_dataset_builder.py) imports fine on
  its own when it needs no TensorFlow. Returns whether such a module was found.
  """
  import glob
  import importlib
  import tensorflow_datasets as tfds

  base = name.split("/")[0].split(":")[0]
  if not base.isidentifier():
    return False
  root = os.path.dirname(tfds.__file__)
  paths = sorted(
      glob.glob(os.path.join(root, "*", base, f"{base}.py"))
      + glob.glob(
          os.path.join(root, "datasets", base, f"{base}_dataset_builder.py")
      )
  )
  for path in paths:
    rel = os.path.relpath(path, os.path.dirname(root))[: -len(".py")]
    importlib.import_module(rel.replace(os.sep, "."))
    return True
  return False


def tfds_source(
    name: str, split: str, data_dir: str = "", prepare: bool = True
):
  """A random-access TFDS data source (numpy records) through `tfds.data_source`.

  Our builders (agentic_rl/datasets) are registered first, so their names resolve
  like catalogue names. With `prepare`, a dataset missing from data_dir is built
  (ours: from local package files; catalogue datasets: downloaded, needs
  internet) in array_record format.

  Raises:
    tfds errors (e.g. DatasetNotFoundError) for unknown names or unprepared data.
  """
  import tensorflow_datasets as tfds
  from agentic_rl import datasets

  datasets.register()
  register_catalogue_builder(name)
  return tfds.data_source(
      name,
      split=split,
      data_dir=data_dir or None,
      download=bool(prepare),
      builder_kwargs=dict(file_format="array_record"),
  )


def make_loader_source(data_config) -> grain.sources.RandomAccessDataSource:
  """The random-access source (undecoded records) of a loader config block."""
  cfg = validate_data_config(data_config)
  if cfg["source"] == "tfds":
    return tfds_source(
        cfg["name"], cfg["split"], cfg["data_dir"], cfg["prepare"]
    )
  path = os.path.join(
      cfg["data_dir"], f"{cfg['name']}-{cfg['split']}.{cfg['source']}"
  )
  if not os.path.exists(path):
    raise FileNotFoundError(f"config.data: no file {path}")
  return make_source(path)


def make_loader_dataset(data_config) -> grain.MapDataset:
  """Deterministic grain pipeline of a loader config block (see validate_data_config).

  source -> shuffle(shuffle_seed; skipped when -1) -> repeat(num_epochs or
  forever; each epoch a new permutation) -> decode to plain Python -> batch.
  """
  cfg = validate_data_config(data_config)
  ds = grain.MapDataset.source(make_loader_source(cfg))
  if cfg["shuffle_seed"] >= 0:
    ds = ds.shuffle(seed=cfg["shuffle_seed"])
  ds = ds.repeat(cfg["num_epochs"] or None)
  ds = ds.map(to_python if cfg["source"] == "tfds" else _decode)
  if cfg["batch_size"]:
    ds = ds.batch(cfg["batch_size"], drop_remainder=True, batch_fn=list)
  return ds


def make_loader(data_config) -> grain.DatasetIterator:
  """A checkpointable grain iterator over a loader config block.

  `next(it)` is one record (a dict), or a list of batch_size records;
  `get_position(it)` / `set_position(it, pos)` save and restore where it is, and
  `checkpoint.Checkpointer.save(step, state, data_position=...)` stores that
  position inside the run's checkpoint.

  Raises:
    ValueError: invalid config (names config.data.<field>).
    FileNotFoundError: a JSONL / array_record split file is missing.
  """
  return iter(make_loader_dataset(data_config).to_iter_dataset())


def read_all(data_config) -> list:
  """Every record of one pass over the split in file order (evaluation sets)."""
  cfg = {
      **validate_data_config(data_config),
      "shuffle_seed": -1,
      "num_epochs": 1,
      "batch_size": 0,
  }
  return list(make_loader(cfg))
