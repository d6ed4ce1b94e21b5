"""The config schema (configs/schema.py): one default and type per field.

Also checks that library code reads config fields as attributes, not with
`.get("field", default)` repeats of the schema's defaults.
"""

import ast
import os

import ml_collections
import pytest

from agentic_rl import validation
from configs import default
from configs import rm_arithmetic
from configs import schema

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TYPES = (bool, int, float, str, tuple, ml_collections.ConfigDict)


@pytest.mark.parametrize("mode", schema.MODES)
def test_every_field_has_a_default_and_a_type(mode):
  fields = schema.fields(mode)
  assert len(fields) > (100 if mode == "rl" else 50)
  for path, field in fields.items():
    assert field.path == path
    assert field.default is not None, path
    assert field.type in TYPES, (path, field.type)
    assert schema.type_error(path, field.default, field.type) is None, path


@pytest.mark.parametrize("mode", schema.MODES)
def test_every_field_has_a_meaning(mode):
  about = schema.meanings(mode)
  assert set(about) == set(schema.fields(mode))
  assert [p for p, text in about.items() if not text] == []
  # Read from the comment above (or beside) the field's own assignment.
  if mode == "rl":
    assert "PPO value clip range" in about["rl.value_clip"]
  assert (
      about["seed"]
      == "Seed of the model initialisation, task sampling and rollouts."
  )
  assert (
      about["mesh.fsdp"]
      == "Fully sharded data parallelism: parameters split on d_model."
  )
  assert (
      about["model.num_heads"] == "query heads H."
  )  # TransformerConfig docstring
  assert about["sft.max_grad_norm"] == (
      "Clip the gradient to this global norm before the update."
  )


def test_defaults_that_had_drifted():
  rl = schema.fields("rl")
  # learner.py read 0.0 where validation.py and configs/default.py said 0.2.
  assert rl["rl.value_clip"].default == 0.2
  assert rl["rl.value_clip"].type is float
  # Fields that were optional (read with .get) now have schema defaults.
  want = {
      "mode": "rl",
      "tokenizer": "byte",
      "rl.reward_model_dir": "",
      "rl.reward_model_kind": "outcome",
      "rl.step_reward": "none",
      "rl.step_reward_transform": "sum",
      "rl.step_reward_coef": 0.0,
      "rl.step_reward_clip_eta": 1.0,
      "rl.step_reward_gate_threshold": 1.0,
      "rl.log_every_steps": 1,
      "mesh.data": -1,
      "mesh.distributed": False,
  }
  assert {k: rl[k].default for k in want} == want
  assert rl["data"].type is ml_collections.ConfigDict
  assert schema.fields("rm")["mode"].default == "rm"


def test_with_defaults_fills_only_what_is_missing():
  config = rm_arithmetic.get_config("smoke")
  del config["mesh"]
  config.lock()
  filled = schema.with_defaults(config)
  assert "mesh" not in config  # the input is not changed
  assert filled.mesh.to_dict() == default.get_config().mesh.to_dict()
  assert filled.rm.steps == 6  # set by the config: kept
  assert "rl" not in filled  # rm mode has no rl block
  assert (
      schema.with_defaults(filled).to_dict() == filled.to_dict()
  )  # idempotent

  rl_config = ml_collections.ConfigDict(
      dict(
          rl=dict(value_clip=0.5, rewards=dict(correct=1.0)),
          env=dict(name="kv_chain"),
      )
  )
  filled = schema.with_defaults(rl_config)
  assert filled.rl.value_clip == 0.5
  assert filled.rl.gae_lambda == 0.95
  assert filled.rl.step_reward_gate_threshold == 1.0
  # Open blocks keep exactly the keys the config gives.
  assert filled.rl.rewards.to_dict() == {"correct": 1.0}
  assert filled.env.to_dict() == {"name": "kv_chain"}
  assert filled.mode == "rl" and filled.sft.steps == 300


def _one_line_error(config) -> str:
  with pytest.raises(validation.ConfigError) as e:
    validation.check_known_fields(config)
  message = str(e.value)
  assert "\n" not in message
  return message


def test_unknown_field_is_one_line_naming_it():
  config = default.get_config()
  config.rl.top_p = 0.9  # a field of other trainers, read by nothing here
  assert _one_line_error(config) == (
      "config.rl.top_p=0.9: unknown field (nothing reads it); the fields of "
      "config.rl are those configs/default.py sets"
  )
  config = default.get_config()
  config.rl.value_clp = 0.1
  assert _one_line_error(config) == (
      "config.rl.value_clp=0.1: unknown field (nothing reads it); did you mean "
      "config.rl.value_clip?"
  )


@pytest.mark.parametrize(
    "path,value,why",
    [
        (
            "rl.value_clip",
            "0.2",
            "must be a float, not str (default 0.2, configs/default.py)",
        ),
        (
            "rl.steps",
            True,
            "must be an int, not bool (default 60, configs/default.py)",
        ),
        (
            "rl.steps",
            2.5,
            "must be an int, not float (default 60, configs/default.py)",
        ),
        (
            "rl.scale_by_std",
            1,
            "must be a bool, not int (default True, configs/default.py)",
        ),
        (
            "eval.pass_k",
            4,
            "must be a tuple, not int (default (1, 2, 4, 8), "
            "configs/default.py)",
        ),
        (
            "tokenizer",
            None,
            "must be a str, not NoneType (default 'byte', "
            "configs/default.py)",
        ),
    ],
)
def test_wrong_type_is_one_line_naming_field_and_value(path, value, why):
  tree = default.get_config().to_dict()
  node = tree
  *parents, leaf = path.split(".")
  for p in parents:
    node = node[p]
  node[leaf] = value
  config = ml_collections.ConfigDict(tree)  # a block rebuilt by a forked config
  assert _one_line_error(config) == f"config.{path}={value!r}: {why}"


def test_accepted_types():
  config = default.get_config()
  config.rl.value_clip = 1  # an int for a float
  tree = config.to_dict()
  tree["eval"]["pass_k"] = [1, 2]  # a list for a tuple
  validation.check_known_fields(ml_collections.ConfigDict(tree))


# --- No `.get("field", default)` on config objects in library code. ---------
# Checked: every call `X.get("<literal>", ...)` (any number of arguments) whose
# receiver X is a name, or an attribute chain rooted at a name, in
# CONFIG_NAMES: the names library code gives to a config or one of its blocks.
# `.get` on other mappings (a checkpoint's config.json as read from disk, env
# facts, manifests, os.environ) is not a config read and is not checked.
CONFIG_NAMES = {
    "config",
    "cfg",
    "rl",
    "rl_cfg",
    "sft",
    "model",
    "mesh_cfg",
    "rm_config",
    "lora_block",
    "eval_cfg",
    "ev",
}
CLEANED = (
    "agentic_rl/validation.py",
    "agentic_rl/train.py",
    "agentic_rl/rm_train.py",
    "agentic_rl/rewards/components.py",
    "agentic_rl/rewards/composition.py",
    "agentic_rl/rewards/dual_ascent.py",
    "agentic_rl/rewards/factory.py",
    "agentic_rl/rewards/noise.py",
    "agentic_rl/rewards/sanitize.py",
    "agentic_rl/rewards/schedules.py",
    "agentic_rl/rewards/step_rewards.py",
    "agentic_rl/rewards/transforms.py",
    "agentic_rl/sharding.py",
    "agentic_rl/metrics.py",
    "agentic_rl/checkpoint.py",
    "agentic_text/tokenizers.py",
    "agentic_rl/models/hf.py",
    "agentic_rl/models/gguf.py",
    "agentic_rl/datasets/tasks.py",
    "main.py",
    "configs/schema.py",
    "experiments/seeds.py",
)


def _root_name(node):
  while isinstance(node, ast.Attribute):
    node = node.value
  return node.id if isinstance(node, ast.Name) else None


def config_gets(source: str) -> list[str]:
  """`receiver.get("field"...)` calls on config objects in `source` (see above)."""
  out = []
  for node in ast.walk(ast.parse(source)):
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "get"
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
        and _root_name(node.func.value) in CONFIG_NAMES
    ):
      out.append(f"line {node.lineno}: {ast.unparse(node)}")
  return out


def test_the_checker_finds_config_gets():
  src = (
      'a = config.rl.get("value_clip", 0.0)\nb = rl.get("x")\n'
      'c = facts.get("gold", 1)\nd = config.rl.value_clip\ne = cfg.get(name)\n'
  )
  assert config_gets(src) == [
      "line 1: config.rl.get('value_clip', 0.0)",
      "line 2: rl.get('x')",
  ]


@pytest.mark.parametrize("rel", CLEANED)
def test_no_config_get_in_cleaned_library_modules(rel):
  with open(os.path.join(ROOT, rel)) as f:
    assert config_gets(f.read()) == []
