"""Tests for environments/arithmetic.py (expected values are written by hand)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentic_rl import rollout
from agentic_text import tokenizers as tk
from environments import arithmetic
from environments.arithmetic import ArithmeticEnv, ArithmeticTask
from tests import fakes

TOK = tk.ByteTokenizer()
A = 16  # default max_action_len
ENV = ArithmeticEnv()


def _task(a, op, b, answer, hard):
  return ArithmeticTask(
      a=jnp.int32(a),
      b=jnp.int32(b),
      op=jnp.int32(op),
      answer=jnp.int32(answer),
      hard=jnp.bool_(hard),
  )


HARD = _task(483, arithmetic.MUL, 27, 13041, True)
EASY = _task(7, arithmetic.SUB, 9, -2, False)


# Compiled once and reused. `reset`, `step` and `facts` do not read
# `expert_imperfect_prob`, so envs differing only in it share ENV's compiled versions.
DRIVE = fakes.env_driver(ENV)
_action, _call, _answer = DRIVE.action, DRIVE.call, DRIVE.answer
_RESET, _STEP, _FACTS = DRIVE.reset, DRIVE.step, DRIVE.facts


def _reset(task):
  return _RESET(task)


def _step(state, action):
  return _STEP(state, *action)


def _facts(state):
  return jax.device_get(_FACTS(state))


# Batched versions (the rollout's usage), all at batch size N.
N = 16
_VRESET = jax.jit(jax.vmap(ENV.reset))
_VSTEP = jax.jit(jax.vmap(ENV.step))
_VFACTS = jax.jit(jax.vmap(ENV.facts))
ENV_PERFECT = ArithmeticEnv(expert_imperfect_prob=0.0)
ENV_IMPERFECT = ArithmeticEnv(expert_imperfect_prob=1.0)
_VEXPERT = {
    env.expert_imperfect_prob: jax.jit(jax.vmap(env.expert_action))
    for env in (ENV, ENV_PERFECT, ENV_IMPERFECT)
}


def _text(ids, n=None):
  ids = np.asarray(ids)
  return TOK.decode(ids if n is None else ids[: int(n)])


# ------------------------------------------------------------------------- prompts


def test_prompt():
  _, prompt, prompt_len = _reset(HARD)
  assert prompt.shape == (24,) and prompt.dtype == jnp.int32
  assert _text(prompt) == "<bos>Compute 483*27.\n"
  assert int(prompt_len) == 17
  assert np.all(np.asarray(prompt[17:]) == tk.PAD)
  _, prompt, prompt_len = _reset(EASY)
  assert _text(prompt, prompt_len) == "<bos>Compute 7-9.\n"
  assert int(prompt_len) == 14


def test_render_task():
  assert arithmetic.render_task(HARD) == "Compute 483*27."
  assert (
      arithmetic.render_task(_task(3, arithmetic.ADD, 0, 3, False))
      == "Compute 3+0."
  )


# ------------------------------------------------------------------------ tool calls


@pytest.mark.parametrize(
    "expr, obs",
    [
        ("483*27", "<obs>13041</obs>"),
        ("7-9", "<obs>-2</obs>"),
        ("0*0", "<obs>0</obs>"),
        ("5+5", "<obs>10</obs>"),
        ("007+3", "<obs>10</obs>"),  # leading zeros allowed
        ("999999+999999", "<obs>1999998</obs>"),
        ("9999*99999", "<obs>999890001</obs>"),
        ("1-999999", "<obs>-999998</obs>"),
    ],
)
def test_call(expr, obs):
  state, _, _ = _reset(HARD)
  state, obs_tokens, obs_len, done = _step(state, _call(expr))
  assert obs_tokens.shape == (12,)
  assert _text(obs_tokens) == obs
  assert int(obs_len) == len(obs.replace("<obs>", "O").replace("</obs>", "C"))
  assert np.all(np.asarray(obs_tokens[int(obs_len) :]) == tk.PAD)
  assert not bool(done)
  f = _facts(state)
  assert int(f["num_tool_calls"]) == 1 and int(f["num_tool_errors"]) == 0
  assert list(f["tool_call_turn"]) == [True, False, False]
  assert not f["format_error"] and not f["answered"] and not f["correct"]


@pytest.mark.parametrize(
    "action",
    [
        _call("48a*2"),
        _call("*5"),
        _call("12*"),
        _call("1**2"),
        _call("1+2+3"),
        _call("-5+3"),
        _call(""),
        _call("12 * 3"),
        _call("1234567+1"),  # 7-digit operand
        _call("999999*999999"),  # int32 overflow
        _call("99999*99999"),  # 9999800001 > int32 max
        _call("12*3", end=tk.ANSWER_END),  # missing CALL_END (wrong stop token)
        _call("12*3", end=tk.EOS),  # missing CALL_END (eos)
        _action(
            [tk.CALL, *TOK.encode("12"), tk.CALL, *TOK.encode("3"), tk.CALL_END]
        ),
        _action(
            [
                tk.CALL,
                *TOK.encode("1*2"),
                tk.CALL_END,
                *TOK.encode("3"),
                tk.CALL_END,
            ]
        ),
    ],
)
def test_malformed_call(action):
  state, _, _ = _reset(HARD)
  state, obs_tokens, obs_len, done = _step(state, action)
  assert _text(obs_tokens) == "<obs>error</obs>"
  assert int(obs_len) == 7
  assert not bool(done)
  f = _facts(state)
  assert int(f["num_tool_calls"]) == 1 and int(f["num_tool_errors"]) == 1
  assert list(f["tool_call_turn"]) == [True, False, False]
  assert not f["format_error"]


def test_small_obs_len_reports_long_results_as_error():
  env = ArithmeticEnv(max_obs_len=8)  # room for a sign and 5 digits
  step = jax.jit(env.step)
  state, _, _ = _reset(HARD)
  state, obs, n, _ = step(state, *_call("483*27"))
  assert obs.shape == (8,)
  assert _text(obs, n) == "<obs>13041</obs>"
  state, obs, n, _ = step(state, *_call("999*999"))
  assert _text(obs, n) == "<obs>error</obs>"
  assert int(_facts(state)["num_tool_errors"]) == 1


# -------------------------------------------------------------------------- answers


@pytest.mark.parametrize(
    "task, text, correct",
    [
        (HARD, "13041", True),
        (HARD, "013041", True),
        (HARD, "13040", False),
        (HARD, "-13041", False),
        (EASY, "-2", True),
        (EASY, "2", False),
        (_task(0, arithmetic.MUL, 5, 0, False), "0", True),
        (HARD, "9999999", False),
    ],
)
def test_answer(task, text, correct):
  state, _, _ = _reset(task)
  state, obs, obs_len, done = _step(state, _answer(text))
  assert bool(done) and int(obs_len) == 0
  assert np.all(np.asarray(obs) == tk.PAD)
  f = _facts(state)
  assert bool(f["answered"]) and not f["format_error"]
  assert bool(f["correct"]) == correct
  assert int(f["num_tool_calls"]) == 0


@pytest.mark.parametrize(
    "action",
    [
        _answer("12a"),
        _answer(""),
        _answer("-"),
        _answer("--2"),
        _answer("1-2"),
        _answer("12345678"),  # 8 digits
        _answer("13041", end=tk.CALL_END),  # missing ANSWER_END
        _answer("13041", end=tk.EOS),
        _answer("13041", end=None),  # ran out of tokens
    ],
)
def test_malformed_answer(action):
  state, _, _ = _reset(HARD)
  state, obs, obs_len, done = _step(state, action)
  assert bool(done) and int(obs_len) == 0
  f = _facts(state)
  assert bool(f["format_error"])
  assert not f["answered"] and not f["correct"]


@pytest.mark.parametrize(
    "action",
    [
        _action([]),
        _action([tk.EOS]),
        _action(TOK.encode("13041") + [tk.ANSWER_END]),
        _action([tk.BOS, tk.ANSWER, *TOK.encode("1"), tk.ANSWER_END]),
        _call("483*27", end=None),  # call that ran out of tokens
        _action([tk.CALL] * A),
        _action([tk.PAD] * 3),
    ],
)
def test_other_turns_are_format_errors(action):
  state, _, _ = _reset(HARD)
  state, obs, obs_len, done = _step(state, action)
  assert bool(done) and int(obs_len) == 0
  assert np.all(np.asarray(obs) == tk.PAD)
  f = _facts(state)
  assert bool(f["format_error"]) and not f["answered"]
  assert int(f["num_tool_calls"]) == 0


def test_action_len_out_of_range_does_not_raise():
  state, _, _ = _reset(HARD)
  tokens, _ = _answer("13041")
  for n in (-3, 0, 100):
    s, _, _, done = _step(state, (tokens, jnp.int32(n)))
    assert bool(done) and bool(_facts(s)["format_error"])


def test_random_garbage_never_raises():
  rng = np.random.default_rng(0)
  vocab = np.array(
      [
          *range(tk.NUM_BYTES),
          *tk.SPECIAL_TOKENS,
          *TOK.encode("0123456789+-*" * 10),
      ]
  )
  n = 208  # 13 batches of N
  tokens = rng.choice(vocab, size=(n, A)).astype(np.int32)
  # Half start with CALL / ANSWER to exercise the parsers; lengths 0..A.
  tokens[: n // 2, 0] = rng.choice([tk.CALL, tk.ANSWER], size=n // 2)
  lengths = rng.integers(0, A + 1, size=n).astype(np.int32)
  stop = rng.random(n) < 0.7
  for i in range(n):
    if stop[i] and lengths[i] > 0:
      tokens[i, lengths[i] - 1] = rng.choice(tk.STOP_TOKENS)
  tokens[0] = 10**6  # out-of-vocabulary ids
  tokens[1] = -7
  lengths[2] = -1
  lengths[3] = 1000

  states = _VRESET(ENV.eval_tasks(N, seed=1))[0]
  for i in range(0, n, N):
    # Two turns: the batch, then the batch reversed.
    s = states
    for t, l in (
        (tokens[i : i + N], lengths[i : i + N]),
        (tokens[i : i + N][::-1], lengths[i : i + N][::-1]),
    ):
      s, obs, obs_len, _ = _VSTEP(s, jnp.asarray(t), jnp.asarray(l))
      obs, obs_len = np.asarray(obs), np.asarray(obs_len)
      assert np.all((obs_len >= 0) & (obs_len <= ENV.max_obs_len))
      assert np.all((obs >= 0) & (obs < tk.VOCAB_SIZE))
    f = jax.device_get(_VFACTS(s))
    for k in ("correct", "answered", "format_error", "hard"):
      assert f[k].dtype == bool and f[k].shape == (N,)
    assert np.all(f["num_tool_calls"] >= f["num_tool_errors"])
    assert np.all((f["num_tool_errors"] >= 0) & (f["num_tool_calls"] <= 2))
    assert np.all(f["num_tool_calls"] == f["tool_call_turn"].sum(-1))
    assert not np.any(f["answered"] & f["format_error"])
    assert not np.any(f["correct"] & ~f["answered"])


# ----------------------------------------------------------------------- episodes


def test_max_turns():
  state, _, _ = _reset(HARD)
  for k in range(3):
    state, obs, _, done = _step(state, _call("1+1"))
    assert _text(obs) == "<obs>2</obs>"
    assert bool(done) == (k == 2)
  f = _facts(state)
  assert int(f["num_tool_calls"]) == 3
  assert list(f["tool_call_turn"]) == [True, True, True]
  assert not f["format_error"] and not f["answered"]
  # Stepping a finished episode is a no-op.
  state2, obs, obs_len, done = _step(state, _answer("13041"))
  assert bool(done) and int(obs_len) == 0
  assert not _facts(state2)["answered"]
  assert int(state2.turn) == 3


def test_call_then_answer():
  state, _, _ = _reset(HARD)
  state, _, _, done = _step(state, _call("483*27"))
  assert not bool(done)
  state, _, _, done = _step(state, _answer("13041"))
  f = _facts(state)
  assert bool(done) and bool(f["correct"]) and bool(f["answered"])
  assert list(f["tool_call_turn"]) == [True, False, False]
  assert int(f["num_tool_calls"]) == 1 and bool(f["hard"])


# ------------------------------------------------------------------------- expert


def _batch(*tasks):
  """Stacks unbatched tasks and pads the batch to N with eval tasks."""
  rest = jax.tree.map(lambda x: x[len(tasks) :], ENV.eval_tasks(N, seed=0))
  return jax.tree.map(
      lambda *xs: jnp.concatenate([jnp.stack(xs[:-1]), xs[-1]]), *tasks, rest
  )


def _run_expert(env, tasks, seed=0):
  """Runs the expert on a batch of N tasks; returns per-item turn texts and facts."""
  expert = _VEXPERT[env.expert_imperfect_prob]
  state, _, _ = _VRESET(tasks)
  turns = [[] for _ in range(N)]
  done = np.zeros(N, bool)
  for k in range(env.max_turns):
    keys = jax.random.split(jax.random.key(seed * 100 + k), N)
    tokens, lens = expert(state, keys)
    assert tokens.shape == (N, A) and lens.shape == (N,)
    for i in range(N):
      assert np.all(np.asarray(tokens[i, int(lens[i]) :]) == tk.PAD)
      if not done[i]:
        turns[i].append(_text(tokens[i], lens[i]))
    state, _, _, d = _VSTEP(state, tokens, lens)
    done |= np.asarray(d)
  assert done.all()
  return turns, jax.device_get(_VFACTS(state))


def test_expert_perfect():
  turns, f = _run_expert(ENV_PERFECT, _batch(HARD, EASY))
  assert turns[0] == ["<call>483*27</call>", "<answer>13041</answer>"]
  assert turns[1] == ["<answer>-2</answer>"]
  assert list(f["num_tool_calls"][:2]) == [1, 0]
  assert f["correct"].all() and not f["num_tool_errors"].any()
  assert np.array_equal(f["num_tool_calls"], f["hard"].astype(np.int32))


def test_expert_imperfect():
  turns, f = _run_expert(ENV_IMPERFECT, _batch(HARD, EASY))
  assert turns[0] == ["<answer>13041</answer>"]
  assert turns[1] == ["<call>7-9</call>", "<answer>-2</answer>"]
  assert list(f["num_tool_calls"][:2]) == [0, 1]
  assert f["correct"].all() and not f["num_tool_errors"].any()
  assert np.array_equal(f["num_tool_calls"], (~f["hard"]).astype(np.int32))


def test_expert_mixed_rate():
  tasks = _batch(*([HARD] * N))
  state, _, _ = _VRESET(tasks)
  calls = []
  for seed in range(25):
    tokens, _ = _VEXPERT[0.5](state, jax.random.split(jax.random.key(seed), N))
    calls.append(np.asarray(tokens[:, 0]) == tk.CALL)
  frac_call = float(np.mean(calls))
  assert 0.4 < frac_call < 0.6


# -------------------------------------------------------------------------- tasks


def _check_tasks(tasks, n):
  t = jax.device_get(tasks)
  for name in ("a", "b", "op", "answer"):
    assert getattr(t, name).shape == (n,) and getattr(t, name).dtype == np.int32
  assert t.hard.dtype == bool
  h, e = t.hard, ~t.hard
  assert np.all((t.a[h] >= 100) & (t.a[h] <= 999))
  assert np.all((t.b[h] >= 10) & (t.b[h] <= 99))
  assert np.all(t.op[h] == arithmetic.MUL)
  assert np.all((t.a[e] >= 0) & (t.a[e] <= 9) & (t.b[e] >= 0) & (t.b[e] <= 9))
  assert np.all((t.op >= 0) & (t.op <= 2))
  expected = np.select(
      [t.op == 0, t.op == 1], [t.a + t.b, t.a - t.b], t.a * t.b
  )
  assert np.array_equal(t.answer, expected)
  return t


def test_sample_tasks():
  sample = jax.jit(ENV.sample_tasks, static_argnums=1)
  t = _check_tasks(sample(jax.random.key(0), 1000), 1000)
  assert 0.44 < t.hard.mean() < 0.56
  assert set(np.unique(t.op[~t.hard])) == {0, 1, 2}
  assert set(np.unique(t.a[~t.hard])) == set(range(10))
  t2 = jax.device_get(sample(jax.random.key(0), 1000))
  assert np.array_equal(t.a, t2.a) and np.array_equal(t.hard, t2.hard)
  t3 = jax.device_get(sample(jax.random.key(1), 1000))
  assert not np.array_equal(t.a, t3.a)
  t4 = _check_tasks(
      ArithmeticEnv(hard_fraction=0.0).sample_tasks(jax.random.key(1), 8), 8
  )
  assert not t4.hard.any()


def test_eval_tasks():
  t1 = _check_tasks(ENV.eval_tasks(10, seed=7), 10)
  t2 = jax.device_get(ENV.eval_tasks(10, seed=7))
  for name in ("a", "b", "op", "answer", "hard"):
    assert np.array_equal(getattr(t1, name), getattr(t2, name))
  assert int(t1.hard.sum()) == 5
  t3 = jax.device_get(ENV.eval_tasks(10, seed=8))
  assert not np.array_equal(t1.a, t3.a)
  t4 = _check_tasks(ArithmeticEnv(hard_fraction=0.3).eval_tasks(20, seed=0), 20)
  assert int(t4.hard.sum()) == 6


# --------------------------------------------------------------------- jit / vmap


def test_vmap_episode():
  tasks = ENV.eval_tasks(N, seed=0)
  state, prompts, prompt_lens = _VRESET(tasks)
  assert prompts.shape == (N, 24) and prompt_lens.shape == (N,)
  t = jax.device_get(tasks)
  for i in (0, N - 1):
    op = arithmetic.OP_CHARS[t.op[i]]
    assert _text(prompts[i]) == f"<bos>Compute {t.a[i]}{op}{t.b[i]}.\n"
  done = jnp.zeros((N,), bool)
  for k in range(ENV.max_turns):
    keys = jax.random.split(jax.random.key(k), N)
    tokens, lens = _VEXPERT[0.0](state, keys)
    state, obs, obs_len, d = _VSTEP(state, tokens, lens)
    assert obs.shape == (N, 12) and obs_len.shape == (N,) and d.shape == (N,)
    if k == 0:  # hard items called the tool and got the product back
      for i in np.flatnonzero(t.hard)[:2]:
        assert _text(obs[i], obs_len[i]) == f"<obs>{t.a[i] * t.b[i]}</obs>"
    done = done | d
  f = jax.device_get(_VFACTS(state))
  assert np.all(np.asarray(done))
  assert (
      np.all(f["correct"])
      and np.all(f["answered"])
      and not np.any(f["format_error"])
  )
  assert np.array_equal(f["num_tool_calls"], t.hard.astype(np.int32))
  assert np.array_equal(f["tool_call_turn"][:, 0], t.hard)
  assert f["tool_call_turn"].shape == (N, ENV.max_turns)


def test_expert_over_and_under_call_probabilities_apply_per_difficulty():
  env = arithmetic.ArithmeticEnv(
      expert_imperfect_prob=0.5,
      expert_undercall_prob=0.0,
      expert_overcall_prob=1.0,
  )
  tasks = env.sample_tasks(jax.random.PRNGKey(3), 64)
  # Jitted (as rollouts run them): two programs rather than op-by-op dispatch.
  states, _, _ = jax.jit(jax.vmap(env.reset))(tasks)
  keys = jax.random.split(jax.random.PRNGKey(4), 64)
  action, _ = jax.jit(jax.vmap(env.expert_action))(states, keys)
  # Every episode (hard: never under-calls; easy: always over-calls) calls the tool.
  assert bool(tasks.hard.any()) and bool((~tasks.hard).any())
  np.testing.assert_array_equal(np.asarray(action[:, 0]), tk.CALL)


# ---------------------------------------------------------------- chains, noise, gold

CHAIN_ENV = ArithmeticEnv(
    num_ops=3,
    max_turns=5,
    max_prompt_len=32,
    tool_noise_prob=0.5,
    expert_imperfect_prob=0.0,
)
_CRESET = jax.jit(CHAIN_ENV.reset)
_CSTEP = jax.jit(CHAIN_ENV.step)
_CFACTS = jax.jit(CHAIN_ENV.facts)


def _chain_task(noise_u=(0.9,) * 5, noise_delta=(3,) * 5):
  # ((3+4)*5)-2 = 33.
  return ArithmeticTask(
      a=jnp.int32(3),
      b=jnp.int32(4),
      op=jnp.int32(arithmetic.ADD),
      answer=jnp.int32(33),
      hard=jnp.bool_(True),
      xs=jnp.array([3, 4, 5, 2], jnp.int32),
      ops=jnp.array(
          [arithmetic.ADD, arithmetic.MUL, arithmetic.SUB], jnp.int32
      ),
      noise_u=jnp.array(noise_u, jnp.float32),
      noise_delta=jnp.array(noise_delta, jnp.int32),
  )


def _chain_run(task, actions):
  state, prompt, plen = _CRESET(task)
  obs_texts = []
  for act in actions:
    state, obs, olen, _ = _CSTEP(state, *act)
    obs_texts.append(_text(obs, olen))
  return jax.device_get(_CFACTS(state)), obs_texts, _text(prompt, plen)


def test_chain_needs_k_calls_progress_and_redundant_calls():
  f, obs, prompt = _chain_run(
      _chain_task(),
      [_call("3+4"), _call("3+4"), _call("7*5"), _call("35-2"), _answer("33")],
  )
  assert prompt == "<bos>Compute ((3+4)*5)-2.\n"
  assert obs == [
      "<obs>7</obs>",
      "<obs>7</obs>",
      "<obs>35</obs>",
      "<obs>33</obs>",
      "",
  ]
  assert f["correct"] and int(f["num_tool_calls"]) == 4
  assert int(f["num_redundant_calls"]) == 1 and int(f["num_noisy_results"]) == 0
  np.testing.assert_allclose(
      f["progress"], [0, 1 / 3, 1 / 3, 2 / 3, 1, 1], rtol=1e-6
  )
  assert _text(f["gold_answer"], f["gold_answer_len"]) == "<answer>33</answer>"


def test_noisy_tool_corrupts_drawn_calls_only():
  # Call 0 is corrupted (u = 0.1 < q = 0.5, +3), call 1 exact, call 2 corrupted (-2).
  task = _chain_task(
      noise_u=(0.1, 0.9, 0.2, 0.9, 0.9), noise_delta=(3, 5, -2, 1, 1)
  )
  f, obs, _ = _chain_run(task, [_call("3+4"), _call("3+4"), _call("7*5")])
  assert obs == ["<obs>10</obs>", "<obs>7</obs>", "<obs>33</obs>"]
  assert int(f["num_noisy_results"]) == 2 and int(f["num_tool_errors"]) == 0
  # The corrupted 10 is no progress; the exact 7 is; the corrupted 33 is not 35.
  np.testing.assert_allclose(f["progress"][:4], [0, 0, 1 / 3, 1 / 3], rtol=1e-6)


def test_gold_answer_and_new_facts_on_the_default_env():
  f = _facts(_step(_reset(HARD)[0], _call("483*27"))[0])
  assert (
      _text(f["gold_answer"], f["gold_answer_len"]) == "<answer>13041</answer>"
  )
  assert f["gold_answer"].shape == (ENV.max_answer_len,)
  assert bool(f["tool_necessary"]) and int(f["num_noisy_results"]) == 0
  f = _facts(_reset(EASY)[0])
  assert _text(f["gold_answer"], f["gold_answer_len"]) == "<answer>-2</answer>"
  assert not bool(f["tool_necessary"])


def test_chain_expert_and_tasks():
  env = ArithmeticEnv(
      num_ops=3, max_turns=5, max_prompt_len=32, expert_imperfect_prob=0.0
  )
  tasks = env.eval_tasks(32, 0)
  xs, ops = np.asarray(tasks.xs), np.asarray(tasks.ops)
  f = {0: lambda a, b: a + b, 1: lambda a, b: a - b, 2: lambda a, b: a * b}
  for i in range(32):
    v = xs[i, 0]
    for j in range(3):
      v = f[int(ops[i, j])](v, xs[i, j + 1])
      assert v >= 0  # chains stay non-negative
    assert v == int(tasks.answer[i])
  traj = rollout.rollout_jit(env, tasks, jax.random.key(0), max_len=112)
  facts = jax.device_get(traj.facts)
  assert facts["correct"].all()
  hard = np.asarray(tasks.hard)
  np.testing.assert_array_equal(facts["num_tool_calls"], np.where(hard, 3, 0))
  rendered = arithmetic.render_task(jax.tree.map(lambda x: x[0], tasks))
  assert rendered.startswith("Compute ((") and rendered.count(")") == 2


def test_chain_and_noise_config_errors():
  with pytest.raises(ValueError, match="max_prompt_len"):
    ArithmeticEnv(num_ops=3, max_turns=5)
  with pytest.raises(ValueError, match="max_turns"):
    ArithmeticEnv(num_ops=3, max_prompt_len=32)
  with pytest.raises(ValueError, match="tool_noise_prob"):
    ArithmeticEnv(tool_noise_prob=2.0)
  with pytest.raises(ValueError, match="num_ops"):
    ArithmeticEnv(num_ops=0)


def test_easy_operand_and_operator_ranges():
  # Easy items draw operands from 0..easy_max_operand and the first
  # easy_operators of + - *; hard items keep their ranges; the default draws
  # are unchanged.
  env = ArithmeticEnv(easy_max_operand=4, easy_operators=1)
  t = _check_tasks(env.sample_tasks(jax.random.key(0), 2000), 2000)
  easy = ~t.hard
  assert set(np.unique(t.a[easy])) == set(range(5))
  assert set(np.unique(t.b[easy])) == set(range(5))
  assert set(np.unique(t.op[easy])) == {arithmetic.ADD}
  np.testing.assert_array_equal(t.answer[easy], t.a[easy] + t.b[easy])
  assert t.a[t.hard].min() >= 100 and t.b[t.hard].min() >= 10
  assert set(np.unique(t.op[t.hard])) == {arithmetic.MUL}
  two = _check_tasks(
      ArithmeticEnv(easy_operators=2).eval_tasks(400, seed=3), 400
  )
  assert set(np.unique(two.op[~two.hard])) == {arithmetic.ADD, arithmetic.SUB}
  # Defaults draw the tasks drawn before the options existed (values recorded
  # from that code; hard answers checked by hand, e.g. 542 * 26 = 14092).
  d = jax.device_get(ENV.eval_tasks(8, seed=0))
  assert d.a.tolist() == [542, 590, 471, 575, 6, 5, 8, 9]
  assert d.b.tolist() == [26, 30, 66, 81, 0, 9, 5, 7]
  assert d.op.tolist() == [2, 2, 2, 2, 0, 0, 0, 1]
  assert d.answer.tolist() == [14092, 17700, 31086, 46575, 6, 14, 13, 2]
  c = jax.device_get(
      ArithmeticEnv(num_ops=3, max_turns=5, max_prompt_len=32).eval_tasks(
          4, seed=0
      )
  )
  assert c.xs.tolist() == [
      [850, 12, 97, 71],
      [753, 96, 46, 99],
      [3, 9, 3, 6],
      [6, 0, 6, 3],
  ]
  assert c.ops.tolist() == [[2, 1, 0], [2, 0, 1], [2, 2, 0], [2, 0, 2]]
  # Chains: every easy operand of the chain is in range.
  chain = ArithmeticEnv(
      num_ops=3, max_turns=5, max_prompt_len=32, easy_max_operand=2
  ).eval_tasks(64, 0)
  xs, hard = np.asarray(chain.xs), np.asarray(chain.hard)
  assert xs[~hard].max() <= 2 and xs[~hard].min() >= 0


def test_easy_range_config_errors():
  with pytest.raises(
      ValueError, match="easy_max_operand must be in 0..9, got 10"
  ):
    ArithmeticEnv(easy_max_operand=10)
  with pytest.raises(ValueError, match="easy_operators must be in 1..3"):
    ArithmeticEnv(easy_operators=0)
  with pytest.raises(
      ValueError, match="easy_max_operand must be in 0..9, got 4.5"
  ):
    ArithmeticEnv(easy_max_operand=4.5)


# ------------------------------------------------------- free-length filler option

K_FILL = 3  # 9 + K_FILL <= A: the filler env keeps the default turn width
ENV_FILL = ArithmeticEnv(filler_max=K_FILL)
_VSTEP_FILL = jax.jit(jax.vmap(ENV_FILL.step))
DOT = arithmetic.FILLER


def _filler_rows(rows):
  """[N, A] tokens and [N] lengths of the rows (ids lists), the last row
  repeated up to N."""
  rows = list(rows) + [rows[-1]] * (N - len(rows))
  acts = [_action(r) for r in rows]
  return jnp.stack([a[0] for a in acts]), jnp.stack([a[1] for a in acts])


def test_filler_turns_are_read_without_their_leading_fillers():
  # Hand-checked: the task is 483*27 = 13041 in every row. The filler env drops
  # the leading '.' run and reads the rest; the default env (filler_max = 0,
  # the environment before the option) rejects a turn that opens with '.'.
  assert ArithmeticEnv(filler_max=0) == ENV
  ans, call = tk.ANSWER, tk.CALL
  rows = [
      [DOT] * 3 + [ans, *TOK.encode("13041"), tk.ANSWER_END],  # 0 correct
      [DOT] + [call, *TOK.encode("483*27"), tk.CALL_END],  # 1 a call
      [DOT] * 5,  # 2 fillers only, no stop token
      [DOT] * 2 + [ans, *TOK.encode("13040"), tk.ANSWER_END],  # 3 wrong
      [ans, *TOK.encode("13041"), tk.ANSWER_END],  # 4 no fillers
      [DOT] * 2 + [tk.EOS],  # 5 fillers then EOS
      [ans, *TOK.encode("13.041"), tk.ANSWER_END],  # 6 '.' inside the number
      # 7: A tokens, the most fillers a correct answer of 7 tokens leaves.
      [DOT] * (A - 7) + [ans, *TOK.encode("13041"), tk.ANSWER_END],
  ]
  tokens, lens = _filler_rows(rows)
  assert [int(n) for n in lens[:8]] == [10, 9, 5, 9, 7, 3, 8, 16]
  state, _, _ = _VRESET(_batch(*([HARD] * N)))
  on, obs, obs_len, done = _VSTEP_FILL(state, tokens, lens)
  f = jax.device_get(_VFACTS(on))
  assert f["answered"][:8].tolist() == [1, 0, 0, 1, 1, 0, 0, 1]
  assert f["correct"][:8].tolist() == [1, 0, 0, 0, 1, 0, 0, 1]
  assert f["format_error"][:8].tolist() == [0, 0, 1, 0, 0, 1, 1, 0]
  assert f["num_tool_calls"][:8].tolist() == [0, 1, 0, 0, 0, 0, 0, 0]
  assert f["num_tool_errors"][:8].tolist() == [0] * 8
  assert np.asarray(done)[:8].tolist() == [1, 0, 1, 1, 1, 1, 1, 1]
  assert _text(obs[1], obs_len[1]) == "<obs>13041</obs>"
  assert np.asarray(obs_len)[:8].tolist() == [0, 7, 0, 0, 0, 0, 0, 0]
  off, _, off_obs_len, off_done = _VSTEP(state, tokens, lens)
  g = jax.device_get(_VFACTS(off))
  assert g["format_error"][:8].tolist() == [1, 1, 1, 1, 0, 1, 1, 1]
  assert g["correct"][:8].tolist() == [0, 0, 0, 0, 1, 0, 0, 0]
  assert not g["num_tool_calls"].any() and not np.asarray(off_obs_len).any()
  assert np.asarray(off_done).all()


def test_filler_expert_opens_each_turn_with_0_to_k_fillers():
  # With the same keys the filler expert's turn is n '.' (0 <= n <= K) then
  # the default expert's turn (n more tokens); the episodes' outcomes are the
  # same, every one correct.
  expert = jax.jit(jax.vmap(ENV_FILL.expert_action))
  s_on, _, _ = _VRESET(ENV.eval_tasks(N, seed=0))
  s_off = s_on
  counts = []
  for k in range(ENV.max_turns):
    keys = jax.random.split(jax.random.key(k), N)
    on, on_len = expert(s_on, keys)
    off, off_len = _VEXPERT[0.5](s_off, keys)
    assert on.shape == (N, A) and on_len.shape == (N,)
    on_np, off_np = np.asarray(on), np.asarray(off)
    for i in range(N):
      m, n_off = int(on_len[i]), int(off_len[i])
      n = m - n_off
      assert 0 <= n <= K_FILL
      assert np.all(on_np[i, :n] == DOT)
      np.testing.assert_array_equal(on_np[i, n:m], off_np[i, :n_off])
      assert np.all(on_np[i, m:] == tk.PAD)
      counts.append(n)
    s_on = _VSTEP_FILL(s_on, on, on_len)[0]
    s_off = _VSTEP(s_off, off, off_len)[0]
  f_on = jax.device_get(_VFACTS(s_on))
  f_off = jax.device_get(_VFACTS(s_off))
  for name in (
      "correct",
      "answered",
      "format_error",
      "num_tool_calls",
      "num_tool_errors",
      "tool_call_turn",
      "progress",
  ):
    np.testing.assert_array_equal(f_on[name], f_off[name], err_msg=name)
  assert f_on["correct"].all() and not f_on["format_error"].any()
  assert len(set(counts)) >= 2  # the count varies across turns


def test_filler_config_errors():
  for bad in (-1, 1.5, True):
    with pytest.raises(ValueError, match=r"filler_max must be an integer >= 0"):
      ArithmeticEnv(filler_max=bad)
  with pytest.raises(
      ValueError,
      match=r"max_action_len must be >= 17 \(9 \+ filler_max=8\), got 16",
  ):
    ArithmeticEnv(filler_max=8)
  assert ArithmeticEnv(filler_max=8, max_action_len=17).filler_max == 8
  with pytest.raises(ValueError, match=r"max_action_len must be >= 9, got 8"):
    ArithmeticEnv(max_action_len=8)  # the message from before the option
