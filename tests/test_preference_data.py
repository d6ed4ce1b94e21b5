"""Preference data: per-turn labels, token edits, env replay, JSONL round trip."""

import jax.numpy as jnp
import numpy as np
import pytest

from agentic_rl import preference_data as pd
from agentic_text import tokenizers as tok
from agentic_rl import types
from environments import arithmetic

C, CE, A, AE = tok.CALL, tok.CALL_END, tok.ANSWER, tok.ANSWER_END


def _b(s):
  return list(s.encode())


def test_turn_labels_from_progress_facts():
  facts = {
      # Episode 0: call that resolves the item, then a correct answer.
      # Episode 1: call that does not advance progress (wrong value), wrong answer.
      # Episode 2: easy item (tool not necessary): a resolving call, correct answer.
      "progress": np.array(
          [[0, 1, 1, 0], [0, 0, 0, 0], [0, 1, 1, 0]], np.float32
      ),
      "tool_call_turn": np.array([[1, 0, 0], [1, 0, 0], [1, 0, 0]], bool),
      "correct": np.array([True, False, True]),
      "tool_necessary": np.array([True, True, False]),
  }
  got = pd.turn_labels(facts, np.array([2, 2, 2]))
  np.testing.assert_array_equal(got, [[1, 1, 0], [0, 0, 0], [0, 1, 0]])


def test_perturb_answer_changes_exactly_the_last_digit_or_letter():
  rng = np.random.default_rng(0)
  for _ in range(20):
    got = pd.perturb_answer([A] + _b("13041") + [AE], rng)
    assert got[:5] == [A] + _b("1304") and got[6] == AE
    assert got[5] != ord("1") and chr(got[5]).isdigit()
  got = pd.perturb_answer([A, ord("q"), AE], rng)
  assert got[1] != ord("q") and chr(got[1]).islower()
  assert pd.perturb_answer([A, AE], rng) == [A, AE]


def test_edits_of_a_gold_script():
  call, ans = [C] + _b("483*27") + [CE], [A] + _b("13041") + [AE]
  rng = np.random.default_rng(1)
  got = dict(pd.edits([call, ans], max_turns=3, rng=rng))
  assert set(got) == {"ignored_obs", "missing_call", "extra_call"}
  assert got["extra_call"] == [call, call, ans]
  assert got["ignored_obs"][0] == call and got["ignored_obs"][1] != ans
  assert got["missing_call"] == [got["ignored_obs"][1]]
  # No spare turn: no extra call; a direct answer only gets a wrong answer.
  assert "extra_call" not in dict(pd.edits([call, ans], max_turns=2, rng=rng))
  assert [k for k, _ in pd.edits([ans], max_turns=3, rng=rng)] == [
      "wrong_answer"
  ]
  assert (
      pd.edits([call], max_turns=3, rng=rng) == []
  )  # no answer: nothing to edit


def _task(a, op, b, hard):
  ans = {arithmetic.MUL: a * b, arithmetic.ADD: a + b, arithmetic.SUB: a - b}[
      op
  ]
  return arithmetic.ArithmeticTask(
      a=jnp.array(a),
      b=jnp.array(b),
      op=jnp.array(op),
      answer=jnp.array(ans),
      hard=jnp.array(hard),
  )


def test_replay_through_the_env_gives_verified_facts_and_jsonl_round_trip(
    tmp_path,
):
  env = arithmetic.ArithmeticEnv(max_turns=3)
  t = _task(483, arithmetic.MUL, 27, True)
  tasks = arithmetic.ArithmeticTask(
      *[jnp.stack([x, x]) for x in (t.a, t.b, t.op, t.answer, t.hard)]
  )
  call, ans = [C] + _b("483*27") + [CE], [A] + _b("13041") + [AE]
  bad = [A] + _b("13047") + [AE]
  traj = pd.replay(env, tasks, [[call, ans], [call, call, bad]], max_len=64)
  text = tok.ByteTokenizer().decode(traj.tokens[0])
  assert text == (
      "<bos>Compute 483*27.\n<call>483*27</call><obs>13041</obs>"
      "<answer>13041</answer>"
  )
  np.testing.assert_array_equal(traj.facts["correct"], [True, False])
  np.testing.assert_array_equal(traj.facts["num_tool_calls"], [1, 2])
  np.testing.assert_array_equal(traj.num_turns, [2, 3])
  np.testing.assert_array_equal(traj.finish, [types.ANSWERED, types.ANSWERED])
  labels = pd.turn_labels(traj.facts, traj.num_turns)
  # The repeated call does not advance progress; the wrong answer is bad.
  np.testing.assert_array_equal(labels, [[1, 1, 0], [1, 0, 0]])
  assert pd.actions_of(traj, 1) == [call, call, bad]
  # Records -> JSONL -> batch.
  recs = [pd.episode_record(traj, labels, i) for i in range(2)]
  pair = {
      "split": "test",
      "type": "extra_call",
      "task_index": 0,
      "chosen": recs[0],
      "rejected": recs[1],
  }
  path = str(tmp_path / "p.jsonl")
  pd.write_jsonl(path, [pair])
  assert pd.read_jsonl(path) == [pair]
  batch = pd.pairs_to_batch([pair], max_len=64, num_turns_k=3, margin=0.5)
  n0 = int(traj.length[0])
  assert (
      batch.chosen.mask[0].sum() == n0 and not batch.chosen.mask[0, n0:].any()
  )
  # Boundaries: the last token of turn 0 (observation end) and of turn 1.
  np.testing.assert_array_equal(
      batch.chosen.boundary[0], [17 + 8 + 7 - 1, n0 - 1, 0]
  )
  np.testing.assert_array_equal(batch.chosen.turn_mask[0], [True, True, False])
  np.testing.assert_array_equal(batch.rejected.score, [0.0])
  np.testing.assert_array_equal(batch.margin, [0.5])
  with pytest.raises(ValueError, match="max_len"):
    pd.pairs_to_batch([pair], max_len=10, num_turns_k=3)
  with pytest.raises(ValueError, match="max_turns"):
    pd.replay(env, tasks, [[ans] * 4, [ans]], max_len=64)


@pytest.mark.slow
def test_build_pairs_ground_truth_prefers_every_chosen_episode():
  env = arithmetic.ArithmeticEnv(max_turns=3, expert_imperfect_prob=0.65)
  tasks = env.sample_tasks(__import__("jax").random.key(0), 8)
  pairs = pd.build_pairs(
      env,
      tasks,
      __import__("jax").random.key(1),
      max_len=64,
      imperfect={
          "wrong_value": {"expert_wrong_arg_prob": 1.0},
          "extra_call": {"expert_overcall_prob": 1.0},
      },
  )
  assert {p["type"] for p in pairs} <= set(pd.NEGATIVE_TYPES)
  for p in pairs:
    c, r = p["chosen"], p["rejected"]
    assert c["correct"] and (
        not r["correct"] or c["num_tool_calls"] < r["num_tool_calls"]
    )
