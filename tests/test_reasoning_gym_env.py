"""Tests of environments/host/reasoning_gym_env.py on hand-written turns."""

import hypothesis
import numpy as np
import pytest
from hypothesis import strategies as st

pytest.importorskip("reasoning_gym")

from agentic_text import tokenizers as tok  # noqa: E402
from environments.host import reasoning_gym_env as rge  # noqa: E402

BYTES = tok.ByteTokenizer()


@pytest.fixture(scope="module")
def env():
  e = rge.ReasoningGymEnv(
      dataset="basic_arithmetic",
      dataset_config={"min_terms": 2, "max_terms": 2},
      max_turns=3,
      wall_seconds=30,
      max_obs_len=64,
  )
  yield e
  e.sandbox.close()


def _task(env):
  return env.eval_tasks(1, 0)[0]


def test_answer_is_scored_by_the_generators_verifier(env):
  task = _task(env)
  state, prompt = env.reset(task)
  assert prompt[0] == tok.BOS
  assert BYTES.decode(prompt[1:]).startswith(task.entry["question"])
  s, obs, done = env.step(state, f"<answer>{task.entry['answer']}</answer>")
  f = env.facts(s)
  assert done and f["correct"] and f["score"] == 1.0 and f["answered"]
  s, _, done = env.step(state, "<answer>not a number</answer>")
  assert done and not env.facts(s)["correct"] and env.facts(s)["answered"]


def test_python_tool_call_then_answer(env):
  task = _task(env)
  expr = task.entry["metadata"]["expression"]
  state, _ = env.reset(task)
  s, obs, done = env.step(state, f"<call>print({expr})</call>")
  assert not done
  assert BYTES.decode(obs) == f"<obs>{task.entry['answer']}\n</obs>"
  s, _, done = env.step(s, f"<answer>{BYTES.decode(obs)[5:-7]}</answer>")
  f = env.facts(s)
  assert (
      done
      and f["correct"]
      and f["num_tool_calls"] == 1
      and f["num_tool_errors"] == 0
  )


def test_failing_and_hermes_calls(env):
  state, _ = env.reset(_task(env))
  s, obs, done = env.step(state, "<call>1/0</call>")
  assert not done and "ZeroDivisionError" in BYTES.decode(obs)
  s, obs, done = env.step(
      s,
      '<tool_call>{"name": "python", "arguments": {"code": "print(6*7)"}}</tool_call>',
  )
  assert not done and BYTES.decode(obs) == "<obs>42\n</obs>"
  s, obs, done = env.step(s, "<call>print(1)</call>")
  f = env.facts(s)
  assert done  # turn budget of 3 spent
  assert (
      f["num_tool_calls"] == 3
      and f["num_tool_errors"] == 1
      and not f["answered"]
  )


def test_batch_of_calls_runs_concurrently(env):
  states = [env.reset(t)[0] for t in env.eval_tasks(3, 0)]
  out = env.step_batch(
      states, ["<call>print(2+2)</call>", "<answer>1</answer>", "garbage"]
  )
  assert BYTES.decode(out[0][1]) == "<obs>4\n</obs>" and not out[0][2]
  assert out[1][2] and env.facts(out[1][0])["answered"]
  assert out[2][2] and env.facts(out[2][0])["format_error"]


def test_expert_is_correct(env):
  rng = np.random.default_rng(0)
  for task in env.eval_tasks(4, 1):
    s, _ = env.reset(task)
    done = False
    while not done:
      s, _, done = env.step(s, BYTES.decode(env.expert_action(s, rng)))
    assert env.facts(s)["correct"]


def test_bad_config_is_rejected():
  with pytest.raises(ValueError, match="not registered"):
    rge.ReasoningGymEnv(dataset="no_such_generator")
  with pytest.raises(TypeError):
    rge.ReasoningGymEnv(dataset="basic_arithmetic", dataset_config={"bogus": 1})


@hypothesis.settings(max_examples=40, deadline=None)
@hypothesis.given(
    st.text(max_size=60).filter(
        lambda t: "<call>" not in t and "<tool_call>" not in t
    )
)
def test_random_text_never_raises(env, text):
  state, _ = env.reset(_task(env))
  s, obs, done = env.step(state, text)
  f = env.facts(s)
  assert done and obs.dtype == np.int32
  assert f["answered"] != f["format_error"]
  assert {k: v.dtype for k, v in f.items()} == {
      "correct": np.bool_,
      "score": np.float32,
      "answered": np.bool_,
      "format_error": np.bool_,
      "num_tool_calls": np.int32,
      "num_tool_errors": np.int32,
      "hard": np.bool_,
  }


def test_gsm_tool_configs_validate():
  from agentic_rl import validation
  from configs import gsm_tool

  validation.validate_config(gsm_tool.get_config())
  validation.validate_config(gsm_tool.get_config("smoke"))


@pytest.mark.slow
def test_gsm_tool_smoke_runs_end_to_end(tmp_path):
  from agentic_rl import train
  from configs import gsm_tool

  reports = train.train_and_evaluate(
      gsm_tool.get_config("smoke"), str(tmp_path)
  )
  assert set(reports) == {"sft", "rl"}
  assert all(0.0 <= r["accuracy"] <= 1.0 for r in reports.values())
