"""Tests for environments/budget.py: budget prompt, cut, pass-through facts."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import environments
from agentic_text import tokenizers as tk
from environments.budget import BudgetEnv
from environments.kv_chain import KVChainTask
from tests import fakes

TOK = tk.ByteTokenizer()
ENV = environments.make(
    dict(name="budget", base="kv_chain", budget=2, base_kwargs=dict(max_hops=3))
)
L = lambda c: ord(c) - ord("a")


def _task():
  nxt = np.full((26,), -1, np.int32)
  for x, y in zip("sakq", "akqm"):
    nxt[L(x)] = L(y)
  return KVChainTask(
      next_key=jnp.asarray(nxt),
      path=jnp.asarray([L(c) for c in "sakq"]),
      hops=jnp.int32(3),
      answer=jnp.int32(L("q")),
      distractor=jnp.int32(0),
  )


DRIVE = fakes.env_driver(ENV)
call, answer = DRIVE.call, DRIVE.answer


def _run(actions):
  """(final facts, [(observation text, done)] per step, prompt text)."""
  ep = DRIVE.run(_task(), actions)
  return ep.facts, list(zip(ep.obs, ep.dones)), ep.prompt


def test_prompt_and_shapes():
  _, _, prompt = _run([])
  assert prompt == "<bos>From s hop 3.\nBudget: 2 calls.\n"
  assert ENV.max_prompt_len == 16 + len("Budget: 2 calls.\n")


def test_cut_when_budget_exhausted():
  f, out, _ = _run([call("s"), call("a"), call("k"), answer("q")])
  assert out[:3] == [
      ("<obs>a</obs>", False),
      ("<obs>k</obs>", False),
      ("", True),
  ]
  assert f["budget_exceeded"] and not f["answered"] and not f["correct"]
  assert int(f["num_tool_calls"]) == 3 and int(f["calls_left"]) == 0
  # The fourth step acts on a finished episode: nothing changes.
  assert out[3] == ("", True)


def test_within_budget_is_the_base_episode():
  f, out, _ = _run([call("s"), call("a"), answer("k")])
  assert not f["budget_exceeded"] and f["answered"] and not f["correct"]
  assert int(f["calls_left"]) == 0 and int(f["budget"]) == 2
  np.testing.assert_allclose(
      f["progress"], [0, 1 / 3, 2 / 3, 2 / 3, 0, 0], rtol=1e-6
  )


def test_budget_zero_cuts_the_first_call_and_bad_fields_raise():
  env0 = BudgetEnv(base="kv_chain", budget=0)
  state, _, _ = env0.reset(_task())
  state, obs, olen, done = env0.step(state, *call("s"))
  assert (
      bool(done)
      and int(olen) == 0
      and bool(env0.facts(state)["budget_exceeded"])
  )
  with pytest.raises(ValueError, match="budget"):
    BudgetEnv(budget=-1)
  with pytest.raises(ValueError, match="base"):
    BudgetEnv(base="nope")
  with pytest.raises(ValueError, match="max_turns"):
    BudgetEnv(base_kwargs=dict(max_hops=6))
  assert hash(BudgetEnv()) == hash(BudgetEnv(base_kwargs={}))
