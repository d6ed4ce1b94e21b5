"""Invalid configs raise ValueError naming the field and the value, before any work."""

import json
import os
import shutil

import pytest

from agentic_rl import train
from agentic_rl import validation
from configs import default


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("rl.group_size", 1, r"config\.rl\.group_size=1"),
        (
            "rl.batch_size",
            30,
            r"config\.rl\.batch_size=30: must be divisible by rl\.group_size=8",
        ),
        ("rl.num_minibatches", 3, r"config\.rl\.num_minibatches=3"),
        ("rl.temperature", 0.0, r"config\.rl\.temperature=0\.0"),
        ("rl.clip_low", 1.5, r"config\.rl\.clip_low=1\.5"),
        ("sft.steps", -1, r"config\.sft\.steps=-1"),
        ("sft.num_microbatches", 3, r"config\.sft\.num_microbatches=3"),
        ("model.head_dim", 7, r"config\.model\.head_dim=7"),
        ("env.hard_fraction", 1.5, r"config\.env\.hard_fraction=1\.5"),
        ("env.name", "chess", r"config\.env\.name='chess'"),
        (
            "env.easy_operators",
            5,
            r"config\.env\.easy_operators must be in 1\.\.3.*got 5",
        ),
        (
            "env.filler_max",
            -1,
            r"config\.env\.filler_max must be an integer >= 0 \(0 = off\), "
            r"got -1",
        ),
        ("eval.pass_k", (1, 16), r"config\.eval\.pass_k=\(1, 16\)"),
        ("rl.pbrs_cutoff", "drop", r"config\.rl\.pbrs_cutoff='drop'"),
    ],
)
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
  with pytest.raises(
      ValueError,
      match=r"rl\.rewards\.corect=1\.0.*unknown reward name 'corect'",
  ):
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


def _zero_step_config():
  """The smoke config without training, evaluated greedily on 4 tasks."""
  config = default.get_config("smoke")
  config.sft.steps = 0
  config.rl.steps = 0
  config.eval.num_samples = 0
  config.eval.pass_k = ()
  config.eval.num_tasks = 4
  return config


@pytest.fixture(scope="module")
def zero_step_workdir(tmp_path_factory):
  """The workdir of a finished zero-step run, run once for the module (each
  run traces, compiles or loads and runs its evaluation again)."""
  workdir = str(tmp_path_factory.mktemp("zero_step") / "run")
  train.train_and_evaluate(_zero_step_config(), workdir)
  return workdir


def _finished_zero_step_run(tmp_path, zero_step_workdir):
  """A finished run (no training, 4 eval tasks): its config and this test's
  own copy of its workdir (to resume, or to edit)."""
  workdir = str(tmp_path / "run")
  shutil.copytree(zero_step_workdir, workdir)
  return _zero_step_config(), workdir


def test_resume_with_a_different_model_is_rejected(tmp_path, zero_step_workdir):
  config, workdir = _finished_zero_step_run(tmp_path, zero_step_workdir)
  config.model.d_model = 64
  with pytest.raises(ValueError, match=r"config\.model\.d_model=64 \(was 96\)"):
    train.train_and_evaluate(config, workdir)


def test_max_len_must_fit_prompt_and_one_turn():
  config = default.get_config("smoke")
  config.max_len = 8
  with pytest.raises(
      ValueError, match=r"config\.max_len=8: must be >= env max_prompt_len"
  ):
    validation.validate_config(config)


def test_resume_with_changed_training_settings_lists_every_field(
    tmp_path, zero_step_workdir
):
  config, workdir = _finished_zero_step_run(tmp_path, zero_step_workdir)
  # Allowed: more RL steps or a different evaluation.
  config.eval.num_tasks = 6
  train.train_and_evaluate(config, workdir)
  config.rl.loss_type = "cispo"
  config.rl.kl_coef = 0.0
  with pytest.raises(
      validation.ConfigError,
      match=r"config\.rl\.kl_coef=0\.0 \(was 0\.01\).*"
      r"config\.rl\.loss_type='cispo' \(was 'ppo'\)",
  ):
    train.train_and_evaluate(config, workdir)


def test_resume_accepts_a_new_gradient_accumulation_split(
    tmp_path, zero_step_workdir
):
  config, workdir = _finished_zero_step_run(tmp_path, zero_step_workdir)
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
  with pytest.raises(
      validation.ConfigError, match=r"config\.sft\.batch_size=32"
  ):
    train.train_and_evaluate(config, workdir)


# --- Fields no code reads, negative warmup, a vocabulary smaller than the tokenizer

import glob  # noqa: E402
import importlib  # noqa: E402
import re  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("rl.warmup_steps", -5, r"^config\.rl\.warmup_steps=-5: must be >= 0$"),
        (
            "sft.warmup_steps",
            -1,
            r"^config\.sft\.warmup_steps=-1: must be >= 0$",
        ),
        (
            "sft.weight_decay",
            -0.1,
            r"^config\.sft\.weight_decay=-0\.1: must be >= 0$",
        ),
        (
            "model.vocab_size",
            200,
            r"^config\.model\.vocab_size=200: smaller than the byte tokenizer's 265 ids",
        ),
        ("model.vocab_size", 264, r"^config\.model\.vocab_size=264: smaller"),
    ],
)
def test_more_bad_values(field, value, match):
  config = default.get_config("smoke")
  phase, name = field.split(".")
  config[phase][name] = value
  with pytest.raises(validation.ConfigError, match=match):
    validation.validate_config(config)


def test_vocab_equal_to_the_tokenizer_is_valid():
  config = default.get_config("smoke")
  config.model.vocab_size = 265  # tokenizers.VOCAB_SIZE: 256 bytes + 9 specials
  validation.validate_config(config)


@pytest.mark.parametrize(
    "setter,message",
    [
        (
            lambda c: c.rl.__setattr__("top_p", 0.9),
            "config.rl.top_p=0.9: unknown field (nothing reads it); the fields of config.rl "
            "are those configs/default.py sets",
        ),
        (
            lambda c: c.rl.__setattr__("grup_size", 4),
            "config.rl.grup_size=4: unknown field (nothing reads it); did you mean "
            "config.rl.group_size?",
        ),
        (
            lambda c: c.__setattr__("evl", {"num_tasks": 8, "seed": 1}),
            "config.evl={'num_tasks': 8, 'seed': 1}: unknown field (nothing reads it); did "
            "you mean config.eval?",
        ),
        (
            lambda c: (
                c.rl.__setattr__("top_p", 0.9),
                c.rl.__setattr__("grup_size", 4),
            ),
            "config.rl.grup_size=4: unknown field (nothing reads it); did you mean "
            "config.rl.group_size? (also unknown: config.rl.top_p)",
        ),
        (
            lambda c: c.__setattr__("sed", 1),
            "config.sed=1: unknown field (nothing reads it); did you mean config.seed?",
        ),
        (
            lambda c: c.eval.__setattr__("num_task", 8),
            "config.eval.num_task=8: unknown field (nothing reads it); did you mean "
            "config.eval.num_tasks?",
        ),
        (
            lambda c: c.model.__setattr__("dmodel", 64),
            "config.model.dmodel=64: unknown field (nothing reads it); did you mean "
            "config.model.d_model?",
        ),
        (
            lambda c: c.env.__setattr__("max_turn", 4),
            "config.env.max_turn=4: not a field of environment 'arithmetic'; did you mean "
            "config.env.max_turns?",
        ),
    ],
)
def test_unknown_fields_are_refused_with_the_nearest_name(setter, message):
  config = default.get_config("smoke")
  setter(config)
  with pytest.raises(validation.ConfigError) as info:
    validation.validate_config(config)
  assert str(info.value) == message


def test_optional_fields_and_open_blocks_are_accepted():
  config = default.get_config("smoke")
  config.mode = "rl"
  config.tokenizer = "byte"
  config.rl.step_reward = "none"
  config.rl.rewards.tool_bonus = 0.1  # reward names: rewards/components.py
  validation.validate_config(config)


def _all_config_files():
  """(module, arg) of every config file in configs/ and experiments/*/config.py,
  with each arg its source names (arg == "x") or lists in ARMS / EXTRA_ARMS."""
  out = []
  files = sorted(
      glob.glob(os.path.join(ROOT, "configs", "*.py"))
      + glob.glob(os.path.join(ROOT, "experiments", "*", "config.py"))
  )
  for path in files:
    rel = os.path.relpath(path, ROOT)
    if os.path.basename(path) in (
        "__init__.py",
        "common.py",
        "smollm2_common.py",
        "schema.py",
    ):
      continue
    module = importlib.import_module(rel[:-3].replace(os.sep, "."))
    with open(path) as f:
      args = set(re.findall(r'arg == "([^"]+)"', f.read())) | {None}
    for name in ("ARMS", "EXTRA_ARMS"):
      args |= set(getattr(module, name, ()))
    out += [(rel, module, a) for a in sorted(args, key=str)]
  return out


def test_every_config_file_uses_only_known_fields():
  checked = 0
  for rel, module, arg in _all_config_files():
    try:
      config = module.get_config() if arg is None else module.get_config(arg)
    except (ValueError, TypeError):
      continue  # an arm that needs a suffix, or no default arm
    validation.check_known_fields(config)
    checked += 1
  assert checked >= 40  # 75 when written


def test_workdir_checks(tmp_path):
  f = tmp_path / "file"
  f.write_text("x")
  with pytest.raises(validation.ConfigError, match=r"is a file, not a folder"):
    validation.check_workdir(str(f))
  with pytest.raises(
      validation.ConfigError,
      match=r"is not writable \(a parent of it is a file\)",
  ):
    validation.check_workdir(str(f / "run"), create=False)
  new = tmp_path / "a" / "b"
  assert validation.check_workdir(str(new), create=False) == str(new)
  assert not (tmp_path / "a").exists()  # create=False leaves nothing behind
  validation.check_workdir(str(new))
  assert new.is_dir() and os.listdir(new) == []
