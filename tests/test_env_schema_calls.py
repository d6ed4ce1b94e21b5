"""Tests for environments/schema_calls.py on hand-written expression trees."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentic_rl import rollout
from agentic_text import tokenizers as tk
from environments import schema_calls as sc
from environments.schema_calls import SchemaCallsEnv, SchemaTask
from tests import fakes

TOK = tk.ByteTokenizer()
ENV = SchemaCallsEnv()
A = ENV.max_action_len
D = ENV.max_depth


def _task(
    op,
    left_ref,
    right_ref,
    left_const,
    right_const,
    leaf,
    depth,
    branch,
    forbidden=-1,
):
  op = np.asarray(op + [0] * (D - len(op)), np.int32)
  pad = lambda x, v: np.asarray(list(x) + [v] * (D - len(x)), np.int32)
  lr, rr = pad(left_ref, -1), pad(right_ref, -1)
  lc, rc = pad(left_const, 0), pad(right_const, 0)
  val = np.zeros((D,), np.int32)
  f = {0: lambda a, b: a + b, 1: lambda a, b: a * b, 2: lambda a, b: a - b}
  for i in range(depth):
    a = val[lr[i]] if lr[i] >= 0 else lc[i]
    b = val[rr[i]] if rr[i] >= 0 else rc[i]
    val[i] = f[int(op[i])](a, b)
  return SchemaTask(
      depth=jnp.int32(depth),
      branch=jnp.bool_(branch),
      op=jnp.asarray(op),
      leaf=jnp.asarray(leaf + [0] * (D + 1 - len(leaf)), jnp.int32),
      left_ref=jnp.asarray(lr),
      right_ref=jnp.asarray(rr),
      left_const=jnp.asarray(lc),
      right_const=jnp.asarray(rc),
      value=jnp.asarray(val),
      answer=jnp.int32(val[depth - 1]),
      forbidden=jnp.int32(forbidden),
  )


# (3+4)*5 - chain: node0 = 3+4 = 7, node1 = node0*5 = 35.
CHAIN = _task(
    [sc.OP_ADD, sc.OP_MUL],
    [-1, 0],
    [-1, -1],
    [3, 0],
    [4, 5],
    [3, 4, 5],
    2,
    False,
)
# (2+3)*(6-1): node0 = 5, node1 = 5, node2 = node0*node1 = 25.
BRANCH = _task(
    [sc.OP_ADD, sc.OP_SUB, sc.OP_MUL],
    [-1, -1, 0],
    [-1, -1, 1],
    [2, 6, 0],
    [3, 1, 0],
    [2, 3, 6, 1],
    3,
    True,
)
FORBID = _task([sc.OP_ADD], [-1], [-1], [3], [4], [3, 4], 1, False, forbidden=1)

DRIVE = fakes.env_driver(ENV)
_act, call, answer = DRIVE.action, DRIVE.call, DRIVE.answer


def _run(task, actions):
  """(final facts, observation text per step, last done, prompt text)."""
  ep = DRIVE.run(task, actions)
  return ep.facts, ep.obs, ep.done, ep.prompt


def test_prompts():
  _, _, _, p = _run(CHAIN, [])
  assert p == (
      "<bos>add(a:int,b:int)\nsum(x:int,y:int)\nmul(a:int,b:int)\n"
      "sub(a:int,b:int)\nQ: (3+4)*5\n"
  )
  _, _, _, p = _run(BRANCH, [])
  assert p.endswith("Q: (2+3)*(6-1)\n") and "Never" not in p
  _, _, _, p = _run(FORBID, [])
  assert p.endswith("Never call sum.\nQ: 3+4\n")


FULL = [1, 1, 0, 0, 0]  # the two calls of a 2-node task, then no calls


@pytest.mark.parametrize(
    "first",
    [
        "add(a=3,b=4)",
        "add(a=4,b=3)",
        "sum(x=3,y=4)",
        "sum(y=4,x=3)",
        "add(b=4,a=3)",
    ],
)
@pytest.mark.parametrize(
    "second", ["mul(a=7,b=5)", "mul(a=5,b=7)", "mul(b=7,a=5)"]
)
def test_every_valid_path_gets_full_per_call_facts(first, second):
  f, obs, done, _ = _run(CHAIN, [call(first), call(second), answer("35")])
  assert obs == ["<obs>7</obs>", "<obs>35</obs>", ""]
  assert done and f["correct"] and not f["format_error"]
  for k in (
      "call_format_ok",
      "call_schema_ok",
      "call_name_ok",
      "call_param_names_ok",
      "call_param_values_ok",
      "call_exec_ok",
      "call_resolves",
  ):
    np.testing.assert_array_equal(f[k], FULL, err_msg=k)
  for k in ("call_param_names_frac", "call_param_values_frac"):
    np.testing.assert_allclose(f[k], FULL, err_msg=k)
  np.testing.assert_array_equal(f["call_forbidden"], [0] * 5)
  np.testing.assert_allclose(f["progress"], [0, 0.5, 1, 1, 0, 0])
  assert int(f["num_redundant_calls"]) == 0 and int(f["nodes_resolved"]) == 2


@pytest.mark.parametrize(
    "order",
    [("add(a=2,b=3)", "sub(a=6,b=1)"), ("sub(a=6,b=1)", "add(a=2,b=3)")],
)
def test_independent_subexpressions_in_either_order(order):
  f, obs, _, _ = _run(
      BRANCH,
      [call(order[0]), call(order[1]), call("mul(a=5,b=5)"), answer("25")],
  )
  assert obs[:3] == ["<obs>5</obs>", "<obs>5</obs>", "<obs>25</obs>"]
  assert f["correct"] and int(f["nodes_resolved"]) == 3
  np.testing.assert_array_equal(f["call_resolves"], [1, 1, 1, 0, 0])
  np.testing.assert_allclose(
      f["progress"], [0, 1 / 3, 2 / 3, 1, 1, 0], rtol=1e-6
  )


def test_sub_is_not_commutative():
  f, obs, _, _ = _run(BRANCH, [call("sub(a=1,b=6)")])
  assert obs == ["<obs>-5</obs>"]  # executes, but resolves nothing
  assert (
      f["call_exec_ok"][0]
      and f["call_name_ok"][0]
      and not f["call_resolves"][0]
  )
  assert not f["call_param_values_ok"][0]
  assert (
      f["call_param_values_frac"][0] == 0.0
  )  # a=1 is b's value and b=6 is a's


def test_partial_credit_wrong_name_names_and_values():
  # mul for the + node: wrong name; names a,b are the canonical add's; values right.
  f, obs, _, _ = _run(CHAIN, [call("mul(a=3,b=4)")])
  assert obs == ["<obs>12</obs>"]
  assert not f["call_name_ok"][0] and f["call_param_names_ok"][0]
  assert f["call_param_values_frac"][0] == 1.0 and not f["call_resolves"][0]
  # sum with a's names: the gold is sum(x, y); names Jaccard {a,b} vs {x,y} = 0;
  # the call does not execute (not sum's schema).
  f, obs, _, _ = _run(CHAIN, [call("sum(a=3,b=4)")])
  assert obs == ["<obs>error</obs>"]
  assert f["call_name_ok"][0] and f["call_format_ok"][0]
  assert not f["call_schema_ok"][0] and not f["call_exec_ok"][0]
  assert f["call_param_names_frac"][0] == 0.0
  assert int(f["num_tool_errors"]) == 1
  # One name right, one extra parameter: given {a, c, b}... here {a, c}: Jaccard
  # |{a}| / |{a, b, c}| = 1/3; value of a right: 1/2.
  f, _, _, _ = _run(CHAIN, [call("add(a=3,c=4)")])
  np.testing.assert_allclose(f["call_param_names_frac"][0], 1 / 3, rtol=1e-6)
  np.testing.assert_allclose(f["call_param_values_frac"][0], 0.5)
  # Right names, one wrong value.
  f, _, _, _ = _run(CHAIN, [call("add(a=3,b=5)")])
  assert f["call_param_names_ok"][0] and f["call_exec_ok"][0]
  np.testing.assert_allclose(f["call_param_values_frac"][0], 0.5)


def test_forbidden_tool_and_redundant_call():
  f, obs, _, _ = _run(
      FORBID,
      [
          call("sum(x=3,y=4)"),
          call("add(a=3,b=4)"),
          call("add(a=4,b=3)"),
          answer("7"),
      ],
  )
  assert obs[:3] == ["<obs>error</obs>", "<obs>7</obs>", "<obs>7</obs>"]
  np.testing.assert_array_equal(f["call_forbidden"], [1, 0, 0, 0, 0])
  np.testing.assert_array_equal(f["call_exec_ok"], [0, 1, 1, 0, 0])
  np.testing.assert_array_equal(f["call_resolves"], [0, 1, 0, 0, 0])
  assert (
      int(f["num_forbidden_calls"]) == 1 and int(f["num_redundant_calls"]) == 1
  )
  assert int(f["num_tool_errors"]) == 1 and f["correct"]


@pytest.mark.parametrize(
    "text",
    [
        "add(a=3,b=4",
        "add a=3,b=4)",
        "foo(a=3,b=4)",
        "add(a=3,a=4)",
        "add(a=x,b=4)",
        "add(a3,b=4)",
        "add(a=3,b=4,c=1,d=2)",
        "add()",
        "",
    ],
)
def test_malformed_calls(text):
  f, obs, done, _ = _run(CHAIN, [call(text)])
  assert obs == ["<obs>error</obs>"] and not done
  assert not f["call_format_ok"][0] and not f["call_exec_ok"][0]
  assert f["tool_call_turn"][0] and int(f["num_tool_errors"]) == 1


@pytest.mark.parametrize(
    "action",
    [answer("x"), _act([]), _act([tk.EOS]), call("add(a=3,b=4)", end=None)],
)
def test_format_errors(action):
  f, obs, done, _ = _run(CHAIN, [action])
  assert done and f["format_error"] and not f["correct"] and obs == [""]


def test_expert_perfect_is_correct_and_uses_several_paths():
  tasks = ENV.eval_tasks(48, 0)
  traj = rollout.rollout_jit(ENV, tasks, jax.random.key(0), max_len=224)
  f = jax.device_get(traj.facts)
  assert f["correct"].all()
  np.testing.assert_array_equal(f["nodes_resolved"], f["num_nodes"])
  np.testing.assert_array_equal(f["num_tool_calls"], f["num_nodes"])
  calls = f["tool_call_turn"]
  assert (f["call_resolves"] == calls).all() and (
      f["call_exec_ok"] == calls
  ).all()
  text = " ".join(TOK.decode(np.asarray(t)) for t in traj.tokens)
  assert (
      "sum(x=" in text and "add(a=" in text
  )  # both equivalent tools demonstrated
  assert f["num_forbidden_calls"].sum() == 0


def test_config_errors_name_the_field():
  with pytest.raises(ValueError, match="max_prompt_len"):
    SchemaCallsEnv(max_prompt_len=50)
  with pytest.raises(ValueError, match="max_turns"):
    SchemaCallsEnv(max_depth=6, max_turns=5, max_prompt_len=200)
  with pytest.raises(ValueError, match="forbid_prob"):
    SchemaCallsEnv(forbid_prob=-0.1)


def test_overflowing_product_is_an_error_not_a_wrapped_value():
  f, obs, _, _ = _run(CHAIN, [call("mul(a=9999999,b=9999999)")])
  assert obs == ["<obs>error</obs>"] and not f["call_exec_ok"][0]
  assert f["call_format_ok"][0] and f["call_schema_ok"][0]
