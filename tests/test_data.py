"""Tests of agentic_rl/data.py: splits on disk, grain pipelines, resumable position."""

import json

import pytest

pytest.importorskip("grain")

from agentic_rl import data  # noqa: E402

RECORDS = [{"question": f"q{i}", "answer": i} for i in range(20)]


@pytest.mark.parametrize("fmt", ["jsonl", "array_record"])
def test_read_five_save_restore_next_is_equal(tmp_path, fmt):
  paths = data.write_splits(
      str(tmp_path), "toy", {"train": RECORDS, "test": RECORDS[:3]}, fmt=fmt
  )
  assert data.split_path(str(tmp_path), "toy", "train") == paths["train"]
  it = data.make_iterator(paths["train"], seed=7)
  first = [next(it) for _ in range(5)]
  data.save_position(str(tmp_path / "pos.json"), it)
  expected = [next(it) for _ in range(3)]
  fresh = data.make_iterator(paths["train"], seed=7)
  data.restore_position(str(tmp_path / "pos.json"), fresh)
  assert [next(fresh) for _ in range(3)] == expected
  # The shuffle is a permutation of the file, fixed by the seed.
  assert all(r in RECORDS for r in first)
  assert [
      next(data.make_iterator(paths["train"], seed=7)) for _ in range(1)
  ] == first[:1]


def test_one_epoch_in_file_order_covers_every_record(tmp_path):
  paths = data.write_splits(str(tmp_path), "toy", {"test": RECORDS})
  it = data.make_iterator(paths["test"], shuffle=False, num_epochs=1)
  assert list(it) == RECORDS


def test_epochs_reshuffle_and_repeat(tmp_path):
  paths = data.write_splits(str(tmp_path), "toy", {"train": RECORDS})
  it = data.make_iterator(paths["train"], seed=1)
  e1 = [next(it)["answer"] for _ in range(20)]
  e2 = [next(it)["answer"] for _ in range(20)]
  assert sorted(e1) == sorted(e2) == list(range(20))
  assert e1 != e2  # each epoch is a new permutation


def test_jsonl_blank_lines_and_bad_names(tmp_path):
  p = tmp_path / "x-train.jsonl"
  p.write_text('{"a": 1}\n\n{"a": 2}\n')
  assert [json.loads(data.make_source(str(p))[i]) for i in range(2)] == [
      {"a": 1},
      {"a": 2},
  ]
  with pytest.raises(ValueError, match="split"):
    data.write_splits(str(tmp_path), "x", {"dev": []})
  with pytest.raises(ValueError, match=".jsonl or .array_record"):
    data.make_source(str(tmp_path / "x.csv"))
  with pytest.raises(FileNotFoundError):
    data.split_path(str(tmp_path), "nope", "train")


# ---------------------------------------------------------------------------
# The loader API (config.data blocks) on JSONL / array_record files.


@pytest.mark.parametrize("fmt", ["jsonl", "array_record"])
def test_make_loader_batches_and_position(tmp_path, fmt):
  data.write_splits(
      str(tmp_path), "toy", {"train": RECORDS, "test": RECORDS[:3]}, fmt=fmt
  )
  cfg = dict(
      source=fmt,
      name="toy",
      split="train",
      data_dir=str(tmp_path),
      shuffle_seed=4,
      batch_size=3,
  )
  it = data.make_loader(cfg)
  first = [next(it) for _ in range(4)]
  pos = data.get_position(it)
  expected = [next(it) for _ in range(5)]  # 27 records: crosses into epoch 2
  assert all(len(b) == 3 for b in first + expected)
  flat = [r for b in first + expected for r in b]
  assert sorted(flat[:20], key=lambda r: r["answer"]) == RECORDS
  again = data.make_loader(cfg)
  data.set_position(again, pos)
  assert [next(again) for _ in range(5)] == expected
  assert data.read_all({**cfg, "split": "test"}) == RECORDS[:3]  # file order


def test_validate_data_config_names_field_and_value(tmp_path):
  ok = data.validate_data_config(
      dict(source="jsonl", name="toy", data_dir="/d")
  )
  assert (
      ok["split"] == "train"
      and ok["shuffle_seed"] == 0
      and ok["eval_split"] == "test"
  )
  bad = [
      (dict(source="csv", name="x", data_dir="/d"), "config.data.source='csv'"),
      (dict(source="jsonl", name="", data_dir="/d"), "config.data.name=''"),
      (dict(source="jsonl", name="x"), "config.data.data_dir=''"),
      (
          dict(source="tfds", name="x", shuffle_seed=-2),
          "config.data.shuffle_seed=-2",
      ),
      (
          dict(source="tfds", name="x", batch_size=1.5),
          "config.data.batch_size=1.5",
      ),
      (
          dict(source="tfds", name="x", num_epochs=True),
          "config.data.num_epochs=True",
      ),
      (dict(source="tfds", name="x", split=""), "config.data.split=''"),
      (dict(source="tfds", name="x", shufle_seed=1), "config.data.shufle_seed"),
  ]
  for cfg, msg in bad:
    with pytest.raises(
        ValueError, match=msg.replace("(", r"\(").replace(".", r"\.")
    ):
      data.validate_data_config(cfg)
  with pytest.raises(FileNotFoundError, match="toy-test.jsonl"):
    data.make_loader(
        dict(source="jsonl", name="toy", split="test", data_dir=str(tmp_path))
    )


def test_to_python_decodes_tfds_numpy_records():
  import numpy as np

  rec = {
      "id": b"a\xc3\xa9",
      "n": np.int64(3),
      "xs": np.array([b"p", b"q"], dtype=object),
      "v": np.array([1.5, 2.0], np.float32),
      "calls_json": b'[{"f": {"a": [1]}}]',
  }
  assert data.to_python(rec) == {
      "id": "a\u00e9",
      "n": 3,
      "xs": ["p", "q"],
      "v": [1.5, 2.0],
      "calls": [{"f": {"a": [1]}}],
  }
