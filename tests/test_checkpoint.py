"""Tests for agentic_rl.checkpoint."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentic_rl.checkpoint import Checkpointer


def _state(seed: int):
  rng = np.random.default_rng(seed)
  return {
      "params": {
          "dense": {
              "w": jnp.asarray(rng.standard_normal((3, 4)), jnp.float32),
              "b": jnp.asarray(rng.standard_normal((4,)), jnp.float32),
          },
          "embed": jnp.asarray(rng.integers(-5, 5, (5, 2)), jnp.int32),
      },
      "rng": jax.random.key_data(jax.random.PRNGKey(seed)),  # uint32 [2]
      "host": np.arange(seed, seed + 3, dtype=np.int32),
      "step": seed,
  }


def _assert_bitwise_equal(a, b):
  la, ta = jax.tree.flatten(a)
  lb, tb = jax.tree.flatten(b)
  assert ta == tb
  for x, y in zip(la, lb):
    if isinstance(x, int):
      assert x == y and isinstance(y, int)
      continue
    x, y = np.asarray(x), np.asarray(y)
    assert x.dtype == y.dtype and x.shape == y.shape
    np.testing.assert_array_equal(
        np.atleast_1d(x).view(np.uint8), np.atleast_1d(y).view(np.uint8)
    )


def test_round_trip_bitwise(tmp_path):
  state = _state(7)
  with Checkpointer(str(tmp_path / "ckpt")) as ck:
    assert ck.latest_step() is None
    assert ck.save(7, state)
    ck.wait()
    assert ck.latest_step() == 7
    restored = ck.restore(_state(0))
  _assert_bitwise_equal(restored, state)
  assert restored["rng"].dtype == jnp.uint32
  assert isinstance(restored["params"]["dense"]["w"], jax.Array)


def test_restore_from_shape_dtype_struct(tmp_path):
  state = _state(3)
  ck = Checkpointer(str(tmp_path))
  ck.save(3, state)
  ck.close()
  abstract = jax.tree.map(
      lambda x: x
      if isinstance(x, int)
      else jax.ShapeDtypeStruct(x.shape, x.dtype),
      state,
  )
  ck = Checkpointer(str(tmp_path))  # Fresh manager, as after a restart.
  assert ck.latest_step() == 3
  _assert_bitwise_equal(ck.restore(abstract), state)
  ck.close()


def test_max_to_keep_and_restore_by_step(tmp_path):
  with Checkpointer(str(tmp_path), max_to_keep=2) as ck:
    for s in range(1, 5):
      assert ck.save(s, _state(s))
    ck.wait()
    assert ck.all_steps() == [3, 4]
    assert ck.latest_step() == 4
    _assert_bitwise_equal(ck.restore(_state(0), step=3), _state(3))
    _assert_bitwise_equal(ck.restore(_state(0)), _state(4))
    with pytest.raises(FileNotFoundError):
      ck.restore(_state(0), step=1)


def test_save_interval_and_force(tmp_path):
  with Checkpointer(str(tmp_path), max_to_keep=5, save_interval_steps=3) as ck:
    saved = [s for s in range(1, 8) if ck.save(s, _state(s))]
    assert saved == [3, 6]
    assert ck.save(7, _state(7), force=True)
    assert not ck.save(7, _state(7), force=True)  # Step already exists.
    ck.wait()
    assert ck.all_steps() == [3, 6, 7]
    assert ck.latest_step() == 7


def test_restore_without_checkpoint_raises(tmp_path):
  with Checkpointer(str(tmp_path)) as ck:
    with pytest.raises(FileNotFoundError):
      ck.restore(_state(0))


def test_invalid_options(tmp_path):
  with pytest.raises(ValueError):
    Checkpointer(str(tmp_path), max_to_keep=0)
  with pytest.raises(ValueError):
    Checkpointer(str(tmp_path), save_interval_steps=0)


# --- Corruption, fallback and full disk ------------------------------------

import errno  # noqa: E402
import glob  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402

from agentic_rl import checkpoint as checkpoint_lib  # noqa: E402
from agentic_rl.checkpoint import CheckpointError  # noqa: E402


def _big_state(seed: int):
  """_state plus a 64x64 float32 leaf, so data files exceed 256 bytes."""
  s = _state(seed)
  s["params"]["big"] = jnp.asarray(
      np.random.default_rng(100 + seed).standard_normal((64, 64)), jnp.float32
  )
  return s


def _two_checkpoints(root):
  """Checkpoints 1 and 2 of _big_state in root/ckpt; returns the directory."""
  d = str(root / "ckpt")
  with Checkpointer(d, max_to_keep=5) as ck:
    assert ck.save(1, _big_state(1), data_position={"pos": 1})
    assert ck.save(2, _big_state(2), data_position={"pos": 2})
  return d


def _largest_data_file(step_dir):
  files = [
      f
      for f in glob.glob(
          os.path.join(step_dir, "default", "**", "d", "*"), recursive=True
      )
      if os.path.isfile(f)
  ]
  return max(files, key=os.path.getsize)


def _warnings(caplog):
  return [
      r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
  ]


def test_save_writes_a_manifest_of_every_file(tmp_path):
  d = _two_checkpoints(tmp_path)
  step_dir = os.path.join(d, "2")
  with open(os.path.join(step_dir, checkpoint_lib.MANIFEST)) as f:
    manifest = json.load(f)
  on_disk = sorted(
      os.path.relpath(os.path.join(r, n), step_dir)
      for r, _, names in os.walk(step_dir)
      for n in names
      if n != checkpoint_lib.MANIFEST
  )
  assert sorted(manifest["files"]) == on_disk
  assert "_CHECKPOINT_METADATA" in on_disk and "default/_METADATA" in on_disk
  # Independent reference: coreutils sha256sum of one data file.
  data = _largest_data_file(step_dir)
  rel = os.path.relpath(data, step_dir)
  ref = subprocess.run(
      ["sha256sum", data], capture_output=True, text=True, check=True
  ).stdout.split()[0]
  assert manifest["files"][rel]["sha256"] == ref
  assert manifest["files"][rel]["size"] == os.path.getsize(data)
  assert checkpoint_lib.verify_step_dir(step_dir) == ("ok", "")


def _truncate(step_dir):
  path = _largest_data_file(step_dir)
  with open(path, "r+b") as f:
    f.truncate(os.path.getsize(path) // 2)


def _zero(step_dir):
  path = _largest_data_file(step_dir)
  size = os.path.getsize(path)
  with open(path, "wb") as f:
    f.write(b"\0" * size)


def _flip_256(step_dir):
  path = _largest_data_file(step_dir)
  with open(path, "r+b") as f:
    raw = bytearray(f.read())
    assert len(raw) >= 512
    start = len(raw) // 2 - 128
    raw[start : start + 256] = bytes(b ^ 0xFF for b in raw[start : start + 256])
    f.seek(0)
    f.write(raw)


def _rm(rel):
  def fn(step_dir):
    path = os.path.join(step_dir, rel)
    subprocess.run(["rm", "-r", path], check=True)

  return fn


def _bad_manifest(step_dir):
  with open(os.path.join(step_dir, checkpoint_lib.MANIFEST), "w") as f:
    f.write('{"format": 1, "files": {"_CHECKPOINT_METADATA": {"si')


def _empty_manifest(step_dir):
  with open(os.path.join(step_dir, checkpoint_lib.MANIFEST), "w") as f:
    json.dump({"format": 1, "files": {}}, f)


# (damage to step 2, reason expected in the warning)
DAMAGE = [
    ("truncate_data_file", _truncate, "bytes, "),
    ("zero_data_file", _zero, "fails its SHA-256 checksum"),
    ("flip_256_bytes", _flip_256, "fails its SHA-256 checksum"),
    (
        "delete_item_METADATA",
        _rm("default/_METADATA"),
        "default/_METADATA is missing",
    ),
    (
        "delete_CHECKPOINT_METADATA",
        _rm("_CHECKPOINT_METADATA"),
        "_CHECKPOINT_METADATA is missing",
    ),
    ("delete_state_item_dir", _rm("default"), "is missing"),
    ("delete_data_item_dir", _rm("data"), "data/"),
    ("corrupt_manifest", _bad_manifest, "unreadable checksum manifest"),
    ("empty_manifest", _empty_manifest, "lists no file"),
    (
        "empty_step_dir",
        lambda d: (subprocess.run(["rm", "-r", d], check=True), os.makedirs(d)),
        "empty directory",
    ),
    (
        "no_manifest_no_metadata",
        lambda d: (
            _rm(checkpoint_lib.MANIFEST)(d),
            _rm("default/_METADATA")(d),
        ),
        "no checksum manifest and default/_METADATA is missing",
    ),
]


@pytest.mark.parametrize(
    "name,damage,reason", DAMAGE, ids=[d[0] for d in DAMAGE]
)
def test_damaged_latest_falls_back_with_one_warning(
    tmp_path, caplog, name, damage, reason
):
  del name
  d = _two_checkpoints(tmp_path)
  damage(os.path.join(d, "2"))
  caplog.set_level(logging.WARNING)
  with Checkpointer(d, max_to_keep=5) as ck:
    assert ck.latest_step() == 2  # Orbax alone would pick the damaged one
    assert ck.latest_intact_step() == 1
    _assert_bitwise_equal(ck.restore(_big_state(0)), _big_state(1))
    assert ck.restore_data_position() == {"pos": 1}
    assert ck.all_steps() == [1]
  warns = _warnings(caplog)
  assert len(warns) == 1, warns
  assert (
      "step 2:" in warns[0]
      and reason in warns[0]
      and "resuming from step 1" in warns[0]
  )
  # Kept, not deleted, and out of the way of the resumed run's next saves.
  moved = os.path.join(d + "-damaged", "2")
  assert os.path.isdir(moved) and not os.path.exists(os.path.join(d, "2"))
  with Checkpointer(d, max_to_keep=5) as ck:
    assert ck.save(2, _big_state(3))  # the step number is free again
    _assert_bitwise_equal(ck.restore(_big_state(0)), _big_state(3))


def test_flipped_bytes_would_restore_silently_without_checksums(tmp_path):
  """Why the checksum matters: Orbax alone reads the flipped file without an
  error into different values; verification refuses it."""
  d = _two_checkpoints(tmp_path)
  _flip_256(os.path.join(d, "2"))
  ck = Checkpointer(d, max_to_keep=5)
  raw = ck._manager.restore(
      2,
      args=checkpoint_lib.ocp.args.Composite(
          default=checkpoint_lib.ocp.args.StandardRestore(_big_state(0))
      ),
  )["default"]
  big = np.asarray(raw["params"]["big"])
  ref = np.asarray(_big_state(2)["params"]["big"])
  assert big.tobytes() != ref.tobytes()  # read without any error, wrong values
  with pytest.raises(CheckpointError, match="step 2 .* is damaged: .*SHA-256"):
    ck.restore(_big_state(0), step=2)
  ck.close()


def test_leftover_tmp_dirs_are_removed_at_startup(tmp_path, caplog):
  d = _two_checkpoints(tmp_path)
  # What a process killed mid-save leaves: an uncommitted Orbax directory and
  # a half-written manifest.
  os.makedirs(os.path.join(d, "3.orbax-checkpoint-tmp-1234", "default"))
  with open(
      os.path.join(d, "3.orbax-checkpoint-tmp-1234", "default", "x"), "w"
  ) as f:
    f.write("partial")
  with open(os.path.join(d, "2", checkpoint_lib.MANIFEST + ".tmp"), "w") as f:
    f.write("{")
  caplog.set_level(logging.WARNING)
  with Checkpointer(d, max_to_keep=5) as ck:
    assert sorted(os.listdir(d)) == ["1", "2"]
    assert not os.path.exists(
        os.path.join(d, "2", checkpoint_lib.MANIFEST + ".tmp")
    )
    assert ck.latest_intact_step() == 2
    _assert_bitwise_equal(ck.restore(_big_state(0)), _big_state(2))
  assert _warnings(caplog) == []


def test_checkpoint_without_manifest_is_restored_with_a_warning(
    tmp_path, caplog
):
  """Checkpoints written before checksums existed still resume (documented)."""
  d = _two_checkpoints(tmp_path)
  os.remove(os.path.join(d, "2", checkpoint_lib.MANIFEST))
  caplog.set_level(logging.WARNING)
  with Checkpointer(d, max_to_keep=5) as ck:
    assert ck.latest_intact_step() == 2
    _assert_bitwise_equal(ck.restore(_big_state(0)), _big_state(2))
  warns = _warnings(caplog)
  assert len(warns) == 1 and "step 2" in warns[0] and "unverified" in warns[0]
  assert os.path.isdir(os.path.join(d, "2"))


def test_unverified_checkpoint_that_orbax_cannot_read_is_one_line(tmp_path):
  d = _two_checkpoints(tmp_path)
  os.remove(os.path.join(d, "2", checkpoint_lib.MANIFEST))
  _truncate(os.path.join(d, "2"))
  with Checkpointer(d, max_to_keep=5) as ck:
    with pytest.raises(CheckpointError) as info:
      ck.restore(_big_state(0), step=2)
  msg = str(info.value)
  assert "\n" not in msg and "step 2" in msg and "no checksum manifest" in msg
  assert f"move {d}/2 aside" in msg


def test_all_checkpoints_damaged_is_a_clear_error_and_nothing_moves(tmp_path):
  d = _two_checkpoints(tmp_path)
  _zero(os.path.join(d, "1"))
  _truncate(os.path.join(d, "2"))
  with Checkpointer(d, max_to_keep=5) as ck:
    with pytest.raises(CheckpointError) as info:
      ck.latest_intact_step()
    with pytest.raises(CheckpointError):
      ck.restore(_big_state(0))
  msg = str(info.value)
  assert "\n" not in msg
  assert "no intact checkpoint" in msg and "step 2:" in msg and "step 1:" in msg
  assert "move that directory aside" in msg
  assert sorted(os.listdir(d)) == ["1", "2"] and not os.path.exists(
      d + "-damaged"
  )


def test_explicit_damaged_step_is_refused(tmp_path):
  d = _two_checkpoints(tmp_path)
  _zero(os.path.join(d, "1"))
  with Checkpointer(d, max_to_keep=5) as ck:
    with pytest.raises(CheckpointError, match=r"step 1 .* is damaged"):
      ck.restore(_big_state(0), step=1)
    _assert_bitwise_equal(ck.restore(_big_state(0), step=2), _big_state(2))


def _partial_dirs(d):
  return [n for n in os.listdir(d) if "orbax-checkpoint-tmp" in n]


def test_full_disk_while_writing_manifest_leaves_nothing_partial(
    tmp_path, monkeypatch
):
  d = str(tmp_path / "ckpt")
  ck = Checkpointer(d, max_to_keep=5)
  assert ck.save(1, _big_state(1))

  def full(step_dir):
    raise OSError(errno.ENOSPC, "No space left on device", step_dir)

  monkeypatch.setattr(checkpoint_lib, "write_manifest", full)
  with pytest.raises(CheckpointError) as info:
    ck.save(2, _big_state(2))
  msg = str(info.value)
  assert "\n" not in msg
  assert f"no space left on device in {d} (" in msg and " free of " in msg
  # Array bytes of _big_state(2): 48 + 16 + 40 + 8 + 12 + 64*64*4 = 16508.
  assert "the checkpoint needs about 16.1 KiB" in msg
  assert sorted(os.listdir(d)) == ["1"] and not _partial_dirs(d)
  ck.close()  # no second error from the abandoned save
  with Checkpointer(d) as ck:
    _assert_bitwise_equal(ck.restore(_big_state(0)), _big_state(1))


def test_full_disk_reported_by_orbax_leaves_nothing_partial(
    tmp_path, monkeypatch
):
  """Orbax reports a full disk from its writer thread as a ValueError carrying
  tensorstore's text; the error is one line at the failing step."""
  d = str(tmp_path / "ckpt")
  ck = Checkpointer(d, max_to_keep=5)
  assert ck.save(1, _big_state(1))
  real_wait = ck._manager.wait_until_finished

  def wait_then_fail():
    real_wait()
    # Leave a partial tmp dir as a real failure does, then fail like Orbax.
    os.makedirs(
        os.path.join(
            d, "2.orbax-checkpoint-tmp", "default.orbax-checkpoint-tmp"
        )
    )
    raise ValueError(
        'RESOURCE_EXHAUSTED: Error writing "w/0": Failed to write 2681263 '
        "bytes to file 4: No space left on device [os_error_code='28']"
    )

  monkeypatch.setattr(ck._manager, "wait_until_finished", wait_then_fail)
  with pytest.raises(
      CheckpointError, match=r"checkpoint step 2: no space left"
  ):
    ck.save(2, _big_state(2))
  assert sorted(os.listdir(d)) == ["1"]
  with pytest.raises(CheckpointError, match="earlier save .* failed"):
    ck.save(3, _big_state(3))
  ck.close()


def _mount_tmpfs(path, size):
  os.makedirs(path, exist_ok=True)
  r = subprocess.run(
      ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path],
      capture_output=True,
  )
  return r.returncode == 0


def test_real_full_disk_one_error_no_partial_dirs(tmp_path, caplog):
  """A 1 MiB tmpfs (needs root): a 4 MiB state does not fit."""
  mnt = str(tmp_path / "small_disk")
  if os.geteuid() != 0 or not _mount_tmpfs(mnt, "1m"):
    pytest.skip("mounting a tmpfs needs root")
  try:
    d = os.path.join(mnt, "ckpt")
    caplog.set_level(logging.INFO)
    ck = Checkpointer(d, max_to_keep=5)
    assert ck.save(1, _state(1))
    big = {
        "w": jnp.asarray(
            np.random.default_rng(0).standard_normal(1 << 20), jnp.float32
        )
    }
    with pytest.raises(CheckpointError) as info:
      ck.save(2, big)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(
        "checkpoint step 2: no space left"
    )
    assert d in msg and "free of 1.0 MiB when the write failed" in msg
    assert "needs about 4.0 MiB" in msg  # 2**20 float32
    assert sorted(os.listdir(d)) == ["1"]  # no partial directory
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    ck.close()
    with Checkpointer(d) as ck2:
      assert ck2.latest_intact_step() == 1
      _assert_bitwise_equal(ck2.restore(_state(0)), _state(1))
  finally:
    subprocess.run(["umount", mnt], check=False)


def _short_config(halt=-1):
  from configs import default  # pylint: disable=g-import-not-at-top
  from tests import fakes  # pylint: disable=g-import-not-at-top

  return fakes.shrink(
      default.get_config("smoke"),
      sft_steps=10,
      rl_steps=2,
      eval_tasks=4,
      eval_samples=0,
      pass_k=(),
      halt_after_step=halt,
  )


@pytest.mark.slow
def test_training_resumes_past_a_damaged_checkpoint_to_the_same_result(
    tmp_path, caplog
):
  """A run halted after step 11 (checkpoints 5 and 10) whose step 10 is then
  zeroed resumes from step 5 with one warning and ends bit-identical to an
  uninterrupted run."""
  from agentic_rl import train  # pylint: disable=g-import-not-at-top

  full = str(tmp_path / "full")
  train.train_and_evaluate(_short_config(), full)
  run = str(tmp_path / "run")
  assert train.train_and_evaluate(_short_config(halt=11), run) is None
  ckdir = os.path.join(run, "checkpoints")
  assert sorted(int(n) for n in os.listdir(ckdir)) == [5, 10]
  _zero(os.path.join(ckdir, "10"))
  caplog.set_level(logging.WARNING)
  train.train_and_evaluate(_short_config(), run)
  warns = [w for w in _warnings(caplog) if "damaged" in w]
  assert (
      len(warns) == 1
      and "step 10:" in warns[0]
      and "resuming from step 5" in warns[0]
  )
  assert os.path.isdir(os.path.join(run, "checkpoints-damaged", "10"))
  config = _short_config()
  _, like = train.init_state(config, train.make_model_config(config))
  like = train.start_rl(config, like)
  with (
      Checkpointer(os.path.join(full, "checkpoints")) as a,
      Checkpointer(ckdir) as b,
  ):
    assert a.latest_intact_step() == b.latest_intact_step() == 12
    _assert_bitwise_equal(b.restore(like), a.restore(like))
