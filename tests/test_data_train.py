"""config.data in the training loop: validation, and a host-environment run whose tasks
come through the loader resumes at the saved data position (configs/bfcl_grpo.py:smoke
with a tiny bfcl_single_turn TFDS build)."""

import pytest

pytest.importorskip("grain")
pytest.importorskip("tensorflow_datasets")
pytest.importorskip("bfcl_eval")

import ml_collections  # noqa: E402

from agentic_rl import data  # noqa: E402
from agentic_rl import train  # noqa: E402
from agentic_rl import validation  # noqa: E402
from agentic_rl.datasets import tasks as data_tasks  # noqa: E402
from configs import bfcl_grpo  # noqa: E402
from configs import default  # noqa: E402

NAME = "bfcl_single_turn/simple_first20"


def test_validation_of_config_data():
  config = bfcl_grpo.get_config("smoke")
  config.data = ml_collections.ConfigDict(dict(source="tfds", name=NAME))
  validation.validate_config(config)
  config.data.source = "csv"
  with pytest.raises(validation.ConfigError, match="config.data.source='csv'"):
    validation.validate_config(config)
  jax_native = default.get_config("smoke")
  jax_native.data = ml_collections.ConfigDict(dict(source="tfds", name=NAME))
  with pytest.raises(validation.ConfigError, match="only host environments"):
    validation.validate_config(jax_native)


@pytest.mark.slow
def test_resumed_run_reads_the_tasks_an_uninterrupted_run_reads(
    tmp_path, monkeypatch
):
  import tensorflow_datasets as tfds

  tfds.disable_progress_bar()
  data_dir = str(tmp_path / "tfds")
  seen = []
  original = data_tasks.LoaderTasks.sample_tasks

  def recording(self, rng, n):
    out = original(self, rng, n)
    seen.append([t.id for t in out])
    return out

  monkeypatch.setattr(data_tasks.LoaderTasks, "sample_tasks", recording)

  def config(halt):
    c = bfcl_grpo.get_config("smoke")
    c.env.categories = ("simple",)
    c.rl.steps = 3
    c.data = ml_collections.ConfigDict(
        dict(source="tfds", name=NAME, data_dir=data_dir, shuffle_seed=11)
    )
    c.halt_after_step = halt
    return c

  full = train.train_and_evaluate(config(-1), str(tmp_path / "a"))
  uninterrupted = list(seen)
  assert len(uninterrupted) == 4  # 1 SFT step + 3 RL steps
  seen.clear()
  assert train.train_and_evaluate(config(2), str(tmp_path / "b")) is None
  assert seen == uninterrupted[:2]
  seen.clear()
  resumed = train.train_and_evaluate(config(-1), str(tmp_path / "b"))
  assert seen == uninterrupted[2:]
  # A fresh stream would have started over: the saved position is what differs.
  fresh = data.make_loader(dict(config(-1).data))
  first = [next(fresh)["id"] for _ in range(len(uninterrupted[2]))]
  assert first != uninterrupted[2]
  assert resumed["rl"]["accuracy"] == full["rl"]["accuracy"]
