"""Invalid configs raise ValueError naming the field and the value, before any work."""

import json
import os

import pytest

from agentic_rl import train
from agentic_rl import validation
from configs import default


@pytest.mark.parametrize("field,value,match", [
    ("rl.group_size", 1, r"config\.rl\.group_size=1"),
    ("rl.batch_size", 30, r"config\.rl\.batch_size=30: must be divisible by rl\.group_size=8"),
    ("rl.num_minibatches", 3, r"config\.rl\.num_minibatches=3"),
    ("rl.temperature", 0.0, r"config\.rl\.temperature=0\.0"),
    ("rl.clip_low", 1.5, r"config\.rl\.clip_low=1\.5"),
    ("sft.steps", -1, r"config\.sft\.steps=-1"),
    ("sft.num_microbatches", 3, r"config\.sft\.num_microbatches=3"),
    ("model.head_dim", 7, r"config\.model\.head_dim=7"),
    ("env.hard_fraction", 1.5, r"config\.env\.hard_fraction=1\.5"),
    ("env.name", "chess", r"config\.env\.name='chess'"),
    ("eval.pass_k", (1, 16), r"config\.eval\.pass_k=\(1, 16\)"),
    ("rl.pbrs_cutoff", "drop", r"config\.rl\.pbrs_cutoff='drop'"),
])
def test_bad_values_name_field_and_value(field, value, match):
  config = default.get_config()
  node = config
  *parents, leaf = field.split(".")
  for p in parents:
    node = node[p]
  node[leaf] = value
  with pytest.raises(ValueError, match=match):
    validation.validate_config(config)


def test_unknown_reward_name():
  config = default.get_config()
  config.rl.rewards.corect = 1.0
  with pytest.raises(ValueError, match=r"rl\.rewards\.corect=1\.0.*unknown reward name 'corect'"):
    validation.validate_config(config)


def test_default_and_smoke_configs_are_valid():
  validation.validate_config(default.get_config())
  validation.validate_config(default.get_config("smoke"))
  with pytest.raises(ValueError, match="unknown arg 'smok'"):
    default.get_config("smok")


def test_train_rejects_before_any_work(tmp_path):
  config = default.get_config("smoke")
  config.rl.group_size = 1
  with pytest.raises(ValueError, match="rl.group_size=1"):
    train.train_and_evaluate(config, str(tmp_path / "run"))
  assert not (tmp_path / "run").exists()


def _finished_zero_step_run(tmp_path):
  """A finished run (no training, 4 eval tasks) and its workdir."""
  config = default.get_config("smoke")
  config.sft.steps = 0
  config.rl.steps = 0
  config.eval.num_samples = 0
  config.eval.pass_k = ()
  config.eval.num_tasks = 4
  workdir = str(tmp_path / "run")
  train.train_and_evaluate(config, workdir)
  return config, workdir


def test_resume_with_a_different_model_is_rejected(tmp_path):
  config, workdir = _finished_zero_step_run(tmp_path)
  config.model.d_model = 64
  with pytest.raises(ValueError, match=r"config\.model\.d_model=64 \(was 96\)"):
    train.train_and_evaluate(config, workdir)


def test_max_len_must_fit_prompt_and_one_turn():
  config = default.get_config("smoke")
  config.max_len = 8
  with pytest.raises(ValueError, match=r"config\.max_len=8: must be >= env max_prompt_len"):
    validation.validate_config(config)


def test_resume_with_changed_training_settings_lists_every_field(tmp_path):
  config, workdir = _finished_zero_step_run(tmp_path)
  # Allowed: more RL steps or a different evaluation.
  config.eval.num_tasks = 6
  train.train_and_evaluate(config, workdir)
  config.rl.loss_type = "cispo"
  config.rl.kl_coef = 0.0
  with pytest.raises(validation.ConfigError,
                     match=r"config\.rl\.kl_coef=0\.0 \(was 0\.01\).*"
                           r"config\.rl\.loss_type='cispo' \(was 'ppo'\)"):
    train.train_and_evaluate(config, workdir)


def test_resume_accepts_a_new_gradient_accumulation_split(tmp_path):
  config, workdir = _finished_zero_step_run(tmp_path)
  # A workdir written before sft.num_microbatches existed, resumed with it;
  # then more microbatches (same update, less memory).
  saved = os.path.join(workdir, "config.json")
  with open(saved) as f:
    old = json.load(f)
  del old["sft"]["num_microbatches"]
  with open(saved, "w") as f:
    json.dump(old, f)
  config.sft.num_microbatches = 2
  config.rl.num_microbatches = 2
  train.train_and_evaluate(config, workdir)
  config.sft.batch_size = 32
  with pytest.raises(validation.ConfigError, match=r"config\.sft\.batch_size=32"):
    train.train_and_evaluate(config, workdir)
