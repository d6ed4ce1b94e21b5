"""TFDS builders (agentic_rl/datasets) built on tiny subsets into a tmp data_dir, read
back through the grain loader (agentic_rl/data.make_loader) and compared with the
source files; the loader position inside an orbax checkpoint; the host-env adapter.
"""

import json
import os

import numpy as np
import pytest

pytest.importorskip("grain")
tfds = pytest.importorskip("tensorflow_datasets")
pytest.importorskip("bfcl_eval")
reasoning_gym = pytest.importorskip("reasoning_gym")

from agentic_rl import checkpoint as checkpoint_lib  # noqa: E402
from agentic_rl import data  # noqa: E402
from agentic_rl.datasets import reasoning_gym_tasks  # noqa: E402
from agentic_rl.datasets import tasks as data_tasks  # noqa: E402
from environments.host.bfcl import data as bfcl_data  # noqa: E402
from environments.host.bfcl import single_turn as bfcl_single_turn  # noqa: E402
from environments.host import reasoning_gym_env  # noqa: E402

BFCL = "bfcl_single_turn/simple_first12"
GSM = "reasoning_gym_tasks/gsm_symbolic_train5_test3"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  """Builds both tiny datasets once (download_and_prepare from local packages)."""
  tfds.disable_progress_bar()
  d = str(tmp_path_factory.mktemp("tfds"))
  for name in (BFCL, GSM):
    data.tfds_source(name, "train", d, prepare=True)
  return d


def _raw_bfcl(n):
  """The first n entries of the bfcl-eval files, read directly (independent of the builder)."""
  root = bfcl_data.data_dir()
  with open(os.path.join(root, "BFCL_v4_simple_python.json")) as f:
    entries = [json.loads(line) for line in f][:n]
  with open(
      os.path.join(root, "possible_answer", "BFCL_v4_simple_python.json")
  ) as f:
    answers = {a["id"]: a["ground_truth"] for a in map(json.loads, f)}
  return [
      dict(
          id=e["id"],
          category="simple",
          questions=[
              " ".join(m["content"] for m in turn if m["role"] == "user")
              for turn in e["question"]
          ],
          functions=e["function"],
          ground_truth=answers[e["id"]],
      )
      for e in entries
  ]


def test_prepared_as_array_record_files(data_dir):
  files = os.listdir(
      os.path.join(data_dir, "bfcl_single_turn", "simple_first12", "1.0.0")
  )
  assert any(f.startswith("bfcl_single_turn-train.array_record") for f in files)
  assert any(f.startswith("bfcl_single_turn-test.array_record") for f in files)


def test_bfcl_splits_equal_the_source_files_in_order(data_dir):
  raw = _raw_bfcl(12)
  for split, want in (
      ("test", raw[0::5]),
      ("train", [r for i, r in enumerate(raw) if i % 5]),
  ):
    got = data.read_all(
        dict(source="tfds", name=BFCL, split=split, data_dir=data_dir)
    )
    assert got == want
  assert [r["id"] for r in raw[0::5]] == [
      "simple_python_0",
      "simple_python_5",
      "simple_python_10",
  ]


def test_gsm_symbolic_splits_equal_the_generator(data_dir):
  for split, seed, n in (
      ("train", reasoning_gym_tasks.TRAIN_SEED, 5),
      ("test", reasoning_gym_tasks.EVAL_SEED, 3),
  ):
    gen = reasoning_gym.create_dataset("gsm_symbolic", size=n, seed=seed)
    got = data.read_all(
        dict(source="tfds", name=GSM, split=split, data_dir=data_dir)
    )
    assert len(got) == n
    for i, r in enumerate(got):
      assert (
          r["question"] == gen[i]["question"]
          and r["answer"] == gen[i]["answer"]
      )
      assert (r["seed"], r["index"]) == (seed, i)
      assert (
          r["entry"]["metadata"]["answer_value"]
          == gen[i]["metadata"]["answer_value"]
      )
      # The stored entry still scores with the generator's own verifier.
      assert gen.score_answer(answer=r["answer"], entry=r["entry"]) == 1.0


def test_shuffled_stream_is_a_permutation_per_epoch(data_dir):
  cfg = dict(
      source="tfds", name=BFCL, split="train", data_dir=data_dir, shuffle_seed=3
  )
  it = data.make_loader(cfg)
  ids = [next(it)["id"] for _ in range(18)]  # two epochs of 9
  want = sorted(r["id"] for i, r in enumerate(_raw_bfcl(12)) if i % 5)
  assert sorted(ids[:9]) == sorted(ids[9:]) == want
  assert ids[:9] != ids[9:]
  it2 = data.make_loader(cfg)
  assert [next(it2)["id"] for _ in range(18)] == ids  # the seed fixes the order


def test_resume_from_checkpoint_reads_the_same_batches(data_dir, tmp_path):
  """k batches, checkpoint (with the position), m more; restore and read m: identical."""
  cfg = dict(
      source="tfds",
      name=BFCL,
      split="train",
      data_dir=data_dir,
      shuffle_seed=5,
      batch_size=2,
  )
  k, m = 3, 5  # 16 records: crosses the epoch boundary (9 per epoch)
  it = data.make_loader(cfg)
  before = [next(it) for _ in range(k)]
  state = {"w": np.arange(4, dtype=np.float32), "step": 7}
  with checkpoint_lib.Checkpointer(str(tmp_path / "ckpt")) as ckpt:
    assert ckpt.save(7, state, data_position=data.get_position(it))
  expected = [next(it) for _ in range(m)]
  assert all(len(b) == 2 for b in before + expected)

  with checkpoint_lib.Checkpointer(str(tmp_path / "ckpt")) as ckpt:
    restored = ckpt.restore({"w": np.zeros(4, np.float32), "step": 0})
    position = ckpt.restore_data_position()
  np.testing.assert_array_equal(restored["w"], state["w"])
  resumed = data.make_loader(cfg)
  data.set_position(resumed, position)
  assert [next(resumed) for _ in range(m)] == expected
  # Without the position a fresh loader starts over (the test can fail).
  assert [next(data.make_loader(cfg)) for _ in range(1)] == before[:1]


def test_checkpoint_without_position_and_old_layout(tmp_path):
  import orbax.checkpoint as ocp

  state = {"w": np.arange(3, dtype=np.int32)}
  # A checkpoint written by the single-item layout (before data positions).
  mgr = ocp.CheckpointManager(
      str(tmp_path), options=ocp.CheckpointManagerOptions(create=True)
  )
  mgr.save(1, args=ocp.args.StandardSave(state))
  mgr.wait_until_finished()
  mgr.close()
  with checkpoint_lib.Checkpointer(str(tmp_path)) as ckpt:
    np.testing.assert_array_equal(
        ckpt.restore({"w": np.zeros(3, np.int32)})["w"], state["w"]
    )
    assert ckpt.restore_data_position(1) is None
    ckpt.save(2, state)
    ckpt.wait()
    assert ckpt.restore_data_position(2) is None
    with pytest.raises(FileNotFoundError):
      ckpt.restore_data_position(5)


def test_loader_tasks_adapter_bfcl(data_dir, tmp_path):
  env = bfcl_single_turn.BFCLEnv(categories=("simple",))
  cfg = dict(
      source="tfds", name=BFCL, split="train", data_dir=data_dir, shuffle_seed=1
  )
  wrapped = data_tasks.LoaderTasks(env, cfg, data_tasks.bfcl_task)
  assert wrapped.is_host and wrapped.max_turns == env.max_turns  # delegated
  by_id = {t.id: t for t in bfcl_data.load_category("simple")}
  got = wrapped.sample_tasks(np.random.default_rng(0), 4)
  assert all(
      t == by_id[t.id] for t in got
  )  # same BFCLTask as the env's own loader
  pos = wrapped.get_position()
  nxt = [t.id for t in wrapped.sample_tasks(None, 6)]
  again = data_tasks.LoaderTasks(env, cfg, data_tasks.bfcl_task)
  again.set_position(pos)
  assert [t.id for t in again.sample_tasks(None, 6)] == nxt
  held = wrapped.eval_tasks(10, seed=0)
  assert sorted(t.id for t in held) == [
      "simple_python_0",
      "simple_python_10",
      "simple_python_5",
  ]
  # A loader task renders the same prompt and gets the same verdict as the env's.
  task = by_id["simple_python_5"]
  loaded = next(t for t in held if t.id == "simple_python_5")
  np.testing.assert_array_equal(wrapped.reset(loaded)[1], env.reset(task)[1])


def test_loader_tasks_adapter_reasoning_gym(data_dir):
  env = reasoning_gym_env.ReasoningGymEnv(
      dataset="gsm_symbolic", train_size=100
  )
  cfg = dict(
      source="tfds", name=GSM, split="train", data_dir=data_dir, shuffle_seed=-1
  )
  wrapped = data_tasks.LoaderTasks(env, cfg, data_tasks.reasoning_gym_task)
  tasks = wrapped.sample_tasks(None, 5)
  assert [t.index for t in tasks] == list(range(5))
  held = wrapped.eval_tasks(3, seed=0)
  own = env.eval_tasks(3, seed=0)  # eval_seed + 0 == EVAL_SEED: the same stream
  assert sorted(t.entry["question"] for t in held) == sorted(
      t.entry["question"] for t in own
  )
  state, _ = wrapped.reset(held[0])
  state, _, done = wrapped.step(
      state, f"<answer>{held[0].entry['answer']}</answer>"
  )
  assert done and bool(wrapped.facts(state)["correct"])
  state, _ = wrapped.reset(held[0])
  state, _, _ = wrapped.step(state, "<answer>-1</answer>")
  assert not bool(wrapped.facts(state)["correct"])


def test_adapter_refuses_bad_use():
  with pytest.raises(ValueError, match="only host environments"):
    data_tasks.LoaderTasks(
        object(),
        dict(source="jsonl", name="x", data_dir="/x"),
        data_tasks.bfcl_task,
    )
  env = bfcl_single_turn.BFCLEnv()
  with pytest.raises(ValueError, match="config.data.batch_size=2"):
    data_tasks.LoaderTasks(
        env,
        dict(source="jsonl", name="x", data_dir="/x", batch_size=2),
        data_tasks.bfcl_task,
    )


def test_catalogue_dataset_gsm8k_through_the_same_loader(tmp_path, monkeypatch):
  """TFDS's own gsm8k builder, with its download replaced by local files in the
  upstream JSONL format (no internet here); read through make_loader."""
  rows = {
      "train": [
          {"question": "2+3?", "answer": "2+3=5\n#### 5"},
          {"question": "4*4?", "answer": "4*4=16\n#### 16"},
      ],
      "test": [{"question": "9-1?", "answer": "9-1=8\n#### 8"}],
  }
  local = {}
  for k in ("train", "test", "train_socratic", "test_socratic"):
    local[k] = str(tmp_path / f"{k}.jsonl")
    data.write_jsonl(local[k], rows[k.split("_")[0]])

  def fake_download_and_extract(self, urls):
    assert set(urls) == set(local)  # gsm8k asks for its four upstream files
    return dict(local)

  tfds.disable_progress_bar()
  monkeypatch.setattr(
      tfds.download.DownloadManager,
      "download_and_extract",
      fake_download_and_extract,
  )
  cfg = dict(
      source="tfds", name="gsm8k", split="test", data_dir=str(tmp_path / "d")
  )
  got = data.read_all(cfg)
  assert got == [
      {
          "question": "9-1?",
          "answer": "9-1=8\n#### 8",
          "annotation": "9-1=8\n",
          "short_answer": "8",
      }
  ]
  train = data.read_all({**cfg, "split": "train", "prepare": False})
  assert sorted(r["short_answer"] for r in train) == ["16", "5"]


def test_unprepared_catalogue_dataset_is_not_downloaded_without_prepare(
    tmp_path,
):
  with pytest.raises(
      Exception, match="has not been generated|not found|splits"
  ):
    data.read_all(
        dict(source="tfds", name="gsm8k", data_dir=str(tmp_path), prepare=False)
    )


def test_loader_tasks_are_read_lazily_and_resume_by_index(tmp_path):
  """The training stream's tasks are read when a row needs them (a process of
  a multi-process run reads only its rows' records), in the order of grain's
  iterator over the same pipeline, and the position is its state."""
  from types import SimpleNamespace  # noqa: PLC0415

  from agentic_rl import host_rollout  # noqa: PLC0415

  data.write_jsonl(
      str(tmp_path / "toy-train.jsonl"), [{"i": i} for i in range(10)]
  )
  data.write_jsonl(
      str(tmp_path / "toy-test.jsonl"), [{"i": 100 + i} for i in range(5)]
  )
  cfg = dict(source="jsonl", name="toy", data_dir=str(tmp_path), shuffle_seed=3)
  read = []

  def to_task(record):
    read.append(record["i"])
    return record["i"]

  env = SimpleNamespace(is_host=True)
  stream = data.make_loader(cfg)
  want = [next(stream)["i"] for _ in range(12)]  # two shuffled epochs
  assert sorted(want[:10]) == list(range(10)) and want[:10] != list(range(10))
  wrapped = data_tasks.LoaderTasks(env, cfg, to_task)
  tasks = wrapped.sample_tasks(None, 4)
  assert len(tasks) == 4 and read == []
  # 4 groups of 2 rows; the process holding rows [4, 8) reads 2 records.
  rows = host_rollout.RepeatedTasks(tasks, 2)
  assert len(rows) == 8
  assert rows[4:8] == [want[2], want[2], want[3], want[3]]
  assert read == [want[2], want[3]] and tasks.num_read == 2
  assert list(tasks) == want[:4] and rows[-1] == want[3]
  # The position: records consumed, the same dict as grain's iterator state.
  it = data.make_loader(cfg)
  for _ in range(4):
    next(it)
  assert wrapped.get_position() == data.get_position(it) == {"next_index": 4}
  again = data_tasks.LoaderTasks(env, cfg, to_task)
  again.set_position(wrapped.get_position())
  assert list(again.sample_tasks(None, 8)) == want[4:12]
  assert list(wrapped.sample_tasks(None, 8)) == want[4:12]
  held = wrapped.eval_tasks(3, seed=0)
  order = np.random.default_rng(0).permutation(5)[:3]
  assert list(held) == [100 + int(i) for i in order]
  once = data_tasks.LoaderTasks(env, {**cfg, "num_epochs": 1}, to_task)
  assert sorted(once.sample_tasks(None, 10)) == list(range(10))
  with pytest.raises(StopIteration):
    once.sample_tasks(None, 1)
