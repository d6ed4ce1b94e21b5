"""Each environment family's config validates, builds its environment, and (slow
tier) trains for a couple of RL steps through the main job's loop."""

from __future__ import annotations

import importlib

import jax
import numpy as np
import pytest

import environments
from agentic_rl import rollout
from agentic_rl import train
from agentic_rl import validation
from tests import fakes

FAMILIES = (
    "kv_chain",
    "schema_calls",
    "clarification",
    "budget",
    "arithmetic_chain",
)


def _config(name, arg=None):
  return importlib.import_module(f"configs.{name}").get_config(arg)


@pytest.mark.parametrize("name", FAMILIES)
def test_config_validates_and_builds_its_env(name):
  for arg in (None, "smoke"):
    validation.validate_config(_config(name, arg))
  config = _config(name, "smoke")
  env = environments.make(config.env)
  assert type(env) is environments.REGISTRY[config.env.name]


@pytest.mark.slow
@pytest.mark.parametrize("name", FAMILIES)
def test_expert_episodes_fit_the_buffer_and_emit_all_facts(name):
  config = _config(name, "smoke")
  env = environments.make(config.env)
  traj = rollout.rollout_jit(
      env, env.eval_tasks(8, 0), jax.random.key(0), max_len=config.max_len
  )
  assert int(np.max(np.asarray(traj.length))) <= config.max_len
  facts = jax.device_get(traj.facts)
  for k in (
      "correct",
      "answered",
      "format_error",
      "num_tool_calls",
      "num_tool_errors",
      "num_redundant_calls",
      "hard",
      "tool_necessary",
      "tool_call_turn",
      "progress",
      "gold_answer",
      "gold_answer_len",
  ):
    assert k in facts, k
  assert facts["progress"].shape == (8, env.max_turns + 1)


def test_bad_env_field_is_a_config_error_naming_it():
  config = _config("kv_chain")
  config.env.max_hops = 9
  with pytest.raises(ValueError, match=r"config\.env\.min_hops/max_hops"):
    validation.validate_config(config)
  config = _config("schema_calls")
  config.env.forbid_prob = 1.5
  with pytest.raises(validation.ConfigError, match=r"config\.env\.forbid_prob"):
    validation.validate_config(config)
  config = _config("budget")
  config.env.budget = -2
  with pytest.raises(validation.ConfigError, match=r"config\.env\.budget"):
    validation.validate_config(config)


def _tiny(config):
  return fakes.shrink(
      config,
      sft_steps=2,
      sft_batch=8,
      rl_steps=2,
      rl_batch=8,
      group_size=4,
      num_minibatches=1,
      eval_tasks=8,
      eval_samples=0,
      pass_k=(),
      checkpoint_every=100,
      log_every_steps=1,
  )


@pytest.mark.slow
@pytest.mark.parametrize("name", FAMILIES)
def test_config_trains_two_rl_steps(name, tmp_path):
  reports = train.train_and_evaluate(
      _tiny(_config(name, "smoke")), str(tmp_path)
  )
  for phase in ("sft", "rl"):
    assert 0.0 <= reports[phase]["accuracy"] <= 1.0
    assert np.isfinite(reports[phase]["tool_calls"])
