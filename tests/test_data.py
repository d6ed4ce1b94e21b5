"""Tests of agentic_rl/data.py: splits on disk, grain pipelines, resumable position."""

import json

import pytest

pytest.importorskip("grain")

from agentic_rl import data  # noqa: E402

RECORDS = [{"question": f"q{i}", "answer": i} for i in range(20)]


@pytest.mark.parametrize("fmt", ["jsonl", "array_record"])
def test_read_five_save_restore_next_is_equal(tmp_path, fmt):
  paths = data.write_splits(str(tmp_path), "toy", {"train": RECORDS, "test": RECORDS[:3]},
                            fmt=fmt)
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
  assert [next(data.make_iterator(paths["train"], seed=7)) for _ in range(1)] == first[:1]


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
  assert [json.loads(data.make_source(str(p))[i]) for i in range(2)] == [{"a": 1}, {"a": 2}]
  with pytest.raises(ValueError, match="split"):
    data.write_splits(str(tmp_path), "x", {"dev": []})
  with pytest.raises(ValueError, match=".jsonl or .array_record"):
    data.make_source(str(tmp_path / "x.csv"))
  with pytest.raises(FileNotFoundError):
    data.split_path(str(tmp_path), "nope", "train")
