"""Tests of environments/host/bfcl/: the call checker (hand cases and agreement
with BFCL's own AST checker on a sample), and both BFCL host environments."""

import os
import sys

import hypothesis
import numpy as np
import pytest
from hypothesis import strategies as st

pytest.importorskip("bfcl_eval")

from agentic_text import tokenizers as tok  # noqa: E402
from environments.host.bfcl import checker as bfcl_checker  # noqa: E402
from environments.host.bfcl import data as bfcl_data  # noqa: E402
from environments.host.bfcl import multi_turn as bfcl_multi_turn  # noqa: E402
from environments.host.bfcl import single_turn as bfcl_single_turn  # noqa: E402
from environments.host.parsers import ToolCall  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "experiments"))
import bfcl_checker_agreement as agreement  # noqa: E402

TRI = bfcl_data.load_category("simple")[
    0
]  # calculate_triangle_area(base, height, unit?)
BYTES = tok.ByteTokenizer()


def test_data_is_read_from_the_installed_wheel():
  assert os.path.isdir(bfcl_data.data_dir())
  assert [
      len(bfcl_data.load_category(c)) for c in bfcl_data.CATEGORY_FILES
  ] == [
      400,
      200,
      200,
      200,
      200,
  ]
  assert TRI.id == "simple_python_0"
  assert TRI.ground_truth == [
      {
          "calculate_triangle_area": {
              "base": [10],
              "height": [5],
              "unit": ["units", ""],
          }
      }
  ]


def test_checker_hand_cases():
  f, gt = TRI.functions, TRI.ground_truth
  ok = bfcl_checker.check_calls(
      f,
      [ToolCall("calculate_triangle_area", {"base": 10, "height": 5})],
      gt,
      "simple",
  )
  assert ok.valid and ok.score == 1.0 and ok.error is None
  # BFCL string standardisation: case, spaces and punctuation are ignored.
  ok2 = bfcl_checker.check_calls(
      f,
      [
          ToolCall(
              "calculate_triangle_area",
              {"base": 10, "height": 5, "unit": "U n-its."},
          )
      ],
      gt,
      "simple",
  )
  assert ok2.valid
  # One wrong value of 3 parameter fields (unit omitted, allowed): (1 + 2) / (1 + 3).
  bad = bfcl_checker.check_calls(
      f,
      [ToolCall("calculate_triangle_area", {"base": 10, "height": 6})],
      gt,
      "simple",
  )
  assert not bad.valid and bad.score == pytest.approx(0.75)
  assert bad.error == "wrong value for 'height'"
  # bool is not an integer (exact types, as BFCL).
  assert not bfcl_checker.check_calls(
      f,
      [ToolCall("calculate_triangle_area", {"base": True, "height": 5})],
      gt,
      "simple",
  ).valid
  # Unexpected parameter: 4 fields, 3 right -> (1 + 3) / (1 + 4).
  extra = bfcl_checker.check_calls(
      f,
      [
          ToolCall(
              "calculate_triangle_area",
              {"base": 10, "height": 5, "color": "red"},
          )
      ],
      gt,
      "simple",
  )
  assert not extra.valid and extra.score == pytest.approx(0.8)
  # Wrong function: 0; two calls for one gold: verdict False, score halved.
  assert (
      bfcl_checker.check_calls(
          f, [ToolCall("area", {"base": 10})], gt, "simple"
      ).score
      == 0.0
  )
  two = bfcl_checker.check_calls(
      f,
      [ToolCall("calculate_triangle_area", {"base": 10, "height": 5})] * 2,
      gt,
      "simple",
  )
  assert not two.valid and two.score == pytest.approx(0.5)
  assert not bfcl_checker.check_calls(f, [], gt, "simple").valid


def test_value_rules():
  # int -> float promotion
  assert bfcl_checker.value_ok({"type": "float"}, 3, [3.0])
  assert not bfcl_checker.value_ok({"type": "integer"}, 3.0, [3])
  assert bfcl_checker.value_ok(
      {"type": "tuple", "items": {"type": "integer"}}, (1, 2), [[1, 2]]
  )
  assert bfcl_checker.value_ok(
      {"type": "array", "items": {"type": "string"}},
      ["New York"],
      [["new york"]],
  )
  assert bfcl_checker.value_ok(
      {"type": "dict"}, {"a": 1}, [{"a": [1], "b": ["", 2]}]
  )
  assert not bfcl_checker.value_ok(
      {"type": "dict"}, {"a": 1}, [{"a": [1], "b": [2]}]
  )


def test_parallel_calls_match_in_any_order():
  task = bfcl_data.load_category("parallel")[0]
  gold = bfcl_checker.gold_calls(task.ground_truth, task.functions)
  assert len(gold) >= 2
  assert bfcl_checker.check_calls(
      task.functions, gold[::-1], task.ground_truth, "parallel"
  ).valid
  assert not bfcl_checker.check_calls(
      task.functions, gold[:1], task.ground_truth, "parallel"
  ).valid


def test_agreement_with_bfcl_ast_checker_on_a_sample():
  report = agreement.run(limit=15)
  for cat, stats in report.items():
    for kind, s in stats.items():
      assert s["agree"] == s["n"], (cat, kind, s)
      expected = s["n"] if kind == "gold" else 0
      assert s["bfcl_accept"] == expected and s["ours_accept"] == expected, (
          cat,
          kind,
      )
    assert set(stats) == {
        "gold",
        "wrong_function",
        "wrong_parameter",
        "wrong_value",
        "missing_call",
    }


@pytest.fixture(scope="module")
def env():
  return bfcl_single_turn.BFCLEnv(
      categories=("simple", "parallel"), max_action_len=512
  )


def test_single_turn_env_expert_and_malformed(env):
  state, prompt = env.reset(TRI)
  assert prompt[0] == tok.BOS and prompt.dtype == np.int32
  assert BYTES.decode(prompt[1:]).startswith(
      "Tools:\ncalculate_triangle_area(base: integer, height: integer, unit?: string)"
  )
  action = env.expert_action(state, None)
  assert action[0] == tok.CALL and action[-1] == tok.CALL_END
  s, obs, done = env.step(state, BYTES.decode(action))
  f = env.facts(s)
  assert done and obs.shape == (0,) and f["correct"] and f["call_score"] == 1.0
  assert f["num_tool_calls"] == 1 and not f["format_error"]
  s, _, done = env.step(state, "<call>calculate_triangle_area(base=10</call>")
  f = env.facts(s)
  assert (
      done
      and f["format_error"]
      and not f["correct"]
      and f["num_tool_errors"] == 1
  )


def test_splits_are_disjoint_and_fixed(env):
  held = {t.id for t in env.eval_tasks(1000, 0)}
  train = {t.id for t in env.sample_tasks(np.random.default_rng(0), 500)}
  assert held and train and not held & train
  assert [t.id for t in env.eval_tasks(5, 3)] == [
      t.id for t in env.eval_tasks(5, 3)
  ]


@hypothesis.settings(max_examples=60, deadline=None)
@hypothesis.given(st.text(max_size=120))
def test_random_actions_never_raise(env, text):
  state, _ = env.reset(TRI)
  s, obs, done = env.step(state, text)
  f = env.facts(s)
  assert done and obs.dtype == np.int32
  assert {k: (v.dtype, v.shape) for k, v in f.items()} == {
      k: (v.dtype, v.shape)
      for k, v in env.facts(env.step(state, "")[0]).items()
  }


def test_multi_turn_expert_is_correct_and_noop_is_not():
  env = bfcl_multi_turn.BFCLMultiTurnEnv(
      max_turns=20, max_action_len=1024, max_obs_len=512
  )
  task = bfcl_data.load_category("multi_turn_base")[0]
  s, _ = env.reset(task)
  done, turns = False, 0
  while not done:
    s, obs, done = env.step(s, BYTES.decode(env.expert_action(s, None)))
    turns += 1
  f = env.facts(s)
  assert f["correct"] and f["answered"] and f["num_tool_errors"] == 0
  assert turns == 2 * len(task.questions)
  # Replying without calls to every question leaves the file system unchanged.
  s, _ = env.reset(task)
  for i in range(len(task.questions)):
    s, obs, done = env.step(s, "I will not do that.</answer>")
  f = env.facts(s)
  assert (
      done and not f["correct"] and f["answered"] and f["num_tool_calls"] == 0
  )


def test_multi_turn_bad_calls_are_observations():
  env = bfcl_multi_turn.BFCLMultiTurnEnv(max_turns=4)
  task = bfcl_data.load_category("multi_turn_base")[0]
  s, _ = env.reset(task)
  s, obs, done = env.step(s, "<call>rm_rf(path='/')</call>")
  assert not done and "unknown function" in BYTES.decode(obs)
  s, obs, done = env.step(s, "<call>cd(folder=</call>")
  assert not done and BYTES.decode(obs).startswith("<obs>Error")
  s, obs, done = env.step(s, "<call>_load_scenario(scenario={})</call>")
  assert not done and env.facts(s)["num_tool_errors"] == 3
  s, obs, done = env.step(s, "<call>ls()</call>")
  assert done  # turn budget of 4 spent


@hypothesis.settings(max_examples=40, deadline=None)
@hypothesis.given(
    st.lists(
        st.sampled_from(
            [
                "<call>ls()</call>",
                "<call>cd(folder='document')</call>",
                "<call>mkdir(",
                '<tool_call>{"name": "pwd", "arguments": {}}</tool_call>',
                "ok</answer>",
                "<call>touch(file_name=1)</call>",
                "<call>__init__()</call>",
                "",
            ]
        ),
        max_size=6,
    )
)
def test_multi_turn_random_turns_never_raise(texts):
  env = bfcl_multi_turn.BFCLMultiTurnEnv(max_turns=5, max_obs_len=64)
  s, _ = env.reset(bfcl_data.load_category("multi_turn_base")[1])
  for t in texts:
    s, obs, done = env.step(s, t)
    assert obs.dtype == np.int32 and len(obs) <= 64
  f = env.facts(s)
  assert f["num_tool_errors"] <= f["num_tool_calls"]


def test_pbrs_is_refused_for_host_envs():
  from agentic_rl import validation
  from configs import bfcl_grpo

  config = bfcl_grpo.get_config("smoke")
  config.rl.pbrs_coef = 0.5
  with pytest.raises(ValueError, match="rl.pbrs_coef"):
    validation.validate_config(config)
