"""Tests for environments/clarification.py (hand-written tasks and expected facts)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentic_rl import rollout
from agentic_text import tokenizers as tk
from environments import arithmetic
from environments import clarification as cl
from tests import fakes

TOK = tk.ByteTokenizer()
ENV = cl.ClarificationEnv()
A = ENV.max_action_len


def _task(a, op, b, answer, hard, missing):
  return cl.ClarificationTask(
      arith=arithmetic.ArithmeticTask(
          a=jnp.int32(a),
          b=jnp.int32(b),
          op=jnp.int32(op),
          answer=jnp.int32(answer),
          hard=jnp.bool_(hard),
      ),
      missing=jnp.int32(missing),
  )


HARD_B = _task(483, arithmetic.MUL, 27, 13041, True, cl.MISSING_B)
EASY_NONE = _task(7, arithmetic.ADD, 2, 9, False, cl.NONE)

DRIVE = fakes.env_driver(ENV)
_act, call, answer = DRIVE.action, DRIVE.call, DRIVE.answer


def _run(task, actions):
  """(final facts, observation text per step, last done, prompt text)."""
  ep = DRIVE.run(task, actions)
  return ep.facts, ep.obs, ep.done, ep.prompt


def test_prompt_hides_the_missing_operand():
  assert _run(HARD_B, [])[3] == "<bos>Compute 483*b.\n"
  assert _run(EASY_NONE, [])[3] == "<bos>Compute 7+2.\n"
  a_task = _task(483, arithmetic.MUL, 27, 13041, True, cl.MISSING_A)
  assert _run(a_task, [])[3] == "<bos>Compute a*27.\n"


def test_ask_calc_answer():
  f, obs, done, _ = _run(HARD_B, [call("?b"), call("483*27"), answer("13041")])
  assert obs == ["<obs>b=27</obs>", "<obs>13041</obs>", ""]
  assert done and f["correct"] and f["asked"] and f["missing"]
  assert int(f["num_tool_calls"]) == 2 and int(f["num_asks"]) == 1
  assert int(f["num_tool_errors"]) == 0 and int(f["num_redundant_calls"]) == 0
  np.testing.assert_allclose(f["progress"], [0, 0.5, 1, 1, 0])
  np.testing.assert_array_equal(f["tool_call_turn"], [1, 1, 0, 0])
  assert f["tool_necessary"]


def test_unneeded_repeated_and_malformed_asks():
  f, obs, done, _ = _run(
      HARD_B, [call("?a"), call("?b"), call("?b"), call("?c")]
  )
  assert obs == [
      "<obs>known</obs>",
      "<obs>b=27</obs>",
      "<obs>b=27</obs>",
      "<obs>error</obs>",
  ]
  assert int(f["num_redundant_calls"]) == 2  # asking for a; asking for b again
  assert int(f["num_tool_errors"]) == 1 and int(f["num_asks"]) == 4
  assert done and not f["answered"]  # max_turns reached


def test_calc_with_a_variable_is_a_tool_error_and_guess_is_wrong():
  f, obs, done, _ = _run(HARD_B, [call("483*b"), answer("0")])
  assert obs == ["<obs>error</obs>", ""]
  assert int(f["num_tool_errors"]) == 1 and f["answered"] and not f["correct"]


def test_easy_needs_nothing():
  f, _, _, _ = _run(EASY_NONE, [answer("9")])
  assert (
      f["correct"] and not f["tool_necessary"] and int(f["num_tool_calls"]) == 0
  )
  np.testing.assert_allclose(f["progress"], [0] * 5)


@pytest.mark.parametrize("action", [_act([]), _act([tk.EOS]), answer("b")])
def test_format_errors(action):
  f, _, done, _ = _run(HARD_B, [action])
  assert done and f["format_error"]


def test_expert_perfect_is_correct():
  tasks = ENV.eval_tasks(32, 0)
  f = jax.device_get(
      rollout.rollout_jit(ENV, tasks, jax.random.key(0), max_len=80).facts
  )
  assert f["correct"].all()
  np.testing.assert_array_equal(f["asked"], f["missing"])
  np.testing.assert_array_equal(
      f["num_tool_calls"], f["missing"].astype(int) + f["hard"].astype(int)
  )
  assert (f["num_redundant_calls"] == 0).all() and (
      f["num_tool_errors"] == 0
  ).all()
