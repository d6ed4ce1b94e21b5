"""Tests for environments/kv_chain.py on hand-written maps (expected values by hand)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentic_rl import rollout
from agentic_text import tokenizers as tk
from environments.kv_chain import KVChainEnv, KVChainTask
from tests import fakes

TOK = tk.ByteTokenizer()
ENV = KVChainEnv()
A = ENV.max_action_len
L = lambda c: ord(c) - ord("a")


def _task(
    path: str,
    hops: int,
    extra: dict[str, str] | None = None,
    distractor: str = "z",
):
  """A map with path[0] -> path[1] -> ... plus `extra` key -> value entries."""
  nxt = np.full((26,), -1, np.int32)
  for x, y in zip(path, path[1:]):
    nxt[L(x)] = L(y)
  for x, y in (extra or {}).items():
    nxt[L(x)] = L(y)
  full = [L(c) for c in path] + [L(path[-1])] * (ENV.max_hops + 1 - len(path))
  return KVChainTask(
      next_key=jnp.asarray(nxt),
      path=jnp.asarray(full[: ENV.max_hops + 1], jnp.int32),
      hops=jnp.int32(hops),
      answer=jnp.int32(L(path[hops])),
      distractor=jnp.int32(L(distractor)),
  )


# s -> a -> k -> q, 3 hops; q -> m and z -> s are distractor entries.
T3 = _task("sakq", 3, {"q": "m", "z": "s"})

DRIVE = fakes.env_driver(ENV)
_act, call, answer = DRIVE.action, DRIVE.call, DRIVE.answer


def _run(task, actions):
  """(final facts, observation text per step, last done, (prompt ids, length))."""
  ep = DRIVE.run(task, actions)
  return ep.facts, ep.obs, ep.done, (ep.prompt_ids, ep.prompt_len)


def test_prompt():
  _, _, _, (prompt, plen) = _run(T3, [])
  assert TOK.decode(np.asarray(prompt)[: int(plen)]) == "<bos>From s hop 3.\n"


def test_correct_episode_facts_and_progress():
  f, obs, done, _ = _run(T3, [call("s"), call("a"), call("k"), answer("q")])
  assert obs == ["<obs>a</obs>", "<obs>k</obs>", "<obs>q</obs>", ""]
  assert done and f["correct"] and f["answered"] and not f["format_error"]
  assert int(f["num_tool_calls"]) == 3 and int(f["num_tool_errors"]) == 0
  assert int(f["num_redundant_calls"]) == 0 and int(f["num_offpath_calls"]) == 0
  np.testing.assert_allclose(
      f["progress"], [0, 1 / 3, 2 / 3, 1, 1, 0], rtol=1e-6
  )
  np.testing.assert_array_equal(f["tool_call_turn"], [1, 1, 1, 0, 0])
  assert bool(f["hard"]) and bool(f["tool_necessary"]) and int(f["hops"]) == 3
  assert (
      TOK.decode(f["gold_answer"][: int(f["gold_answer_len"])])
      == "<answer>q</answer>"
  )


def test_redundant_offpath_and_unknown_key():
  # z is a distractor (off path), s re-queried is redundant, b is not in the map.
  f, obs, done, _ = _run(T3, [call("z"), call("s"), call("s"), call("b")])
  assert obs == [
      "<obs>s</obs>",
      "<obs>a</obs>",
      "<obs>a</obs>",
      "<obs>error</obs>",
  ]
  assert int(f["num_offpath_calls"]) == 1 and int(f["num_redundant_calls"]) == 1
  assert int(f["num_tool_errors"]) == 1 and int(f["num_tool_calls"]) == 4
  np.testing.assert_allclose(
      f["progress"], [0, 0, 1 / 3, 1 / 3, 1 / 3, 0], rtol=1e-6
  )
  assert not done


def test_early_answer_is_wrong_not_format_error():
  f, _, done, _ = _run(T3, [call("s"), answer("a")])
  assert done and f["answered"] and not f["correct"] and not f["format_error"]


@pytest.mark.parametrize(
    "action",
    [
        call("sa"),  # two letters
        call("S"),  # not lowercase
        call(""),  # empty key
        call("s", end=tk.ANSWER_END),  # wrong stop token
    ],
)
def test_malformed_calls_are_tool_errors(action):
  f, obs, done, _ = _run(T3, [action])
  assert obs == ["<obs>error</obs>"] and not done
  assert int(f["num_tool_errors"]) == 1 and not f["format_error"]


@pytest.mark.parametrize(
    "action",
    [
        answer("qq"),
        answer("1"),
        _act([]),
        _act([tk.EOS]),
        _act(TOK.encode("q")),
        call("s", end=None),  # no stop token: ran out of tokens
    ],
)
def test_malformed_turns_are_format_errors(action):
  f, obs, done, _ = _run(T3, [action])
  assert done and bool(f["format_error"]) and not f["correct"] and obs == [""]


def test_max_turns_and_finished_episode_is_noop():
  f, _, done, _ = _run(T3, [call("s")] * 5 + [answer("q")])
  assert (
      done
      and int(f["num_tool_calls"]) == 5
      and int(f["num_redundant_calls"]) == 4
  )
  assert not f["answered"]


def _expert_rollout(env, n=32, seed=0):
  tasks = env.eval_tasks(n, seed)
  traj = rollout.rollout_jit(env, tasks, jax.random.key(1), max_len=64)
  return jax.device_get(traj.facts), tasks


def test_expert_perfect_is_always_correct_with_d_calls():
  f, tasks = _expert_rollout(ENV)
  assert f["correct"].all()
  np.testing.assert_array_equal(f["num_tool_calls"], np.asarray(tasks.hops))
  assert (f["num_redundant_calls"] == 0).all() and (
      f["num_offpath_calls"] == 0
  ).all()
  np.testing.assert_allclose(f["progress"].max(-1), 1.0)


@pytest.mark.slow
def test_expert_imperfections():
  under = KVChainEnv(expert_undercall_prob=1.0)
  f, _ = _expert_rollout(under)
  assert (f["num_tool_calls"] == 0).all() and not f["correct"].any()
  over = KVChainEnv(expert_overcall_prob=1.0, max_turns=7)
  f, tasks = _expert_rollout(over)
  hops = np.asarray(tasks.hops)
  # Every call after the first is preceded by a repeat of the previous key.
  assert (f["num_redundant_calls"][hops >= 2] >= 1).all()
  wrong = KVChainEnv(expert_wrong_arg_prob=1.0)
  f, _ = _expert_rollout(wrong)
  assert (f["num_offpath_calls"] >= 1).all() and not f["correct"].any()


def test_tasks_are_consistent_and_eval_is_fixed():
  tasks = ENV.sample_tasks(jax.random.key(3), 64)
  nxt, path, hops = map(np.asarray, (tasks.next_key, tasks.path, tasks.hops))
  assert ((hops >= ENV.min_hops) & (hops <= ENV.max_hops)).all()
  for i in range(64):
    for j in range(hops[i]):
      assert nxt[i, path[i, j]] == path[i, j + 1]
    assert tasks.answer[i] == path[i, hops[i]]
    assert len(set(path[i, : hops[i] + 1].tolist())) == hops[i] + 1
    assert (nxt[i] >= 0).sum() == ENV.max_hops + 1 + ENV.num_distractors
  a, b = ENV.eval_tasks(16, 7), ENV.eval_tasks(16, 7)
  np.testing.assert_array_equal(a.next_key, b.next_key)


def test_config_errors_name_the_field():
  with pytest.raises(ValueError, match="max_turns"):
    KVChainEnv(max_hops=6, max_turns=5)
  with pytest.raises(ValueError, match="min_hops"):
    KVChainEnv(min_hops=0)
  with pytest.raises(ValueError, match="expert_overcall_prob"):
    KVChainEnv(expert_overcall_prob=1.5)
