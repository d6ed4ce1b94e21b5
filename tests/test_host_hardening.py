"""Host tools cannot kill or stall a run.

- base.call_with_deadline / guarded_step_batch: a step that raises or passes its
  time limit becomes a tool-error result and is counted; rows keep their order;
  rows may step concurrently (env.step_workers).
- host_rollout: such a step no longer propagates; the trajectory's facts count
  it ('num_tool_exceptions', 'num_tool_timeouts').
- BFCL multi-turn: the reproductions `power(base=10, exponent=5000)` (raised out
  of env.step: int-to-str digit limit) and `square_root(number=2,
  precision=1000000)` (ran 131 s) are tool errors returned within seconds; a
  call with precision=50 leaves this thread's decimal context and mpmath's
  precision as they were; BFCL's call accounting has errors <= calls.
"""

import dataclasses
import decimal
import threading
import time

import jax
import numpy as np
import pytest

from agentic_rl import host_rollout
from agentic_text import tokenizers
from environments.host import base
from environments.host import parsers

BYTES = tokenizers.ByteTokenizer()


# ---------------------------------------------------------------------------
# call_with_deadline / guarded_step_batch.


def test_call_with_deadline_ok_exception_timeout():
  assert base.call_with_deadline(
      lambda a, b=0: a + b, 2, b=3, timeout_s=5
  ) == base.Outcome("ok", value=5)
  out = base.call_with_deadline(lambda: 1 // 0, timeout_s=5)
  assert out.status == "exception" and isinstance(out.error, ZeroDivisionError)
  out = base.call_with_deadline(
      lambda: (_ for _ in ()).throw(SystemExit(3)), timeout_s=5
  )
  assert out.status == "exception" and isinstance(out.error, SystemExit)
  release = threading.Event()
  t0 = time.perf_counter()
  out = base.call_with_deadline(release.wait, 30, timeout_s=0.2)
  waited = time.perf_counter() - t0
  assert out.status == "timeout" and 0.2 <= waited < 2.0
  assert base.abandoned_threads() >= 1
  release.set()  # let the abandoned thread finish
  with pytest.raises(ValueError, match="timeout_s"):
    base.call_with_deadline(print, timeout_s=0)


@dataclasses.dataclass(frozen=True, eq=False)
class FlakyEnv:
  """Byte-format host env; a turn's text picks the behaviour of its step:
  'boom' raises, 'slow' sleeps 5 s, 'none' returns None, anything else
  returns ('<text>', observation b'ok', done after 2 turns)."""

  max_prompt_len: int = 4
  max_action_len: int = 8
  max_obs_len: int = 12
  max_turns: int = 2
  tokenizer: object = BYTES
  step_timeout_s: float = 0.3
  step_workers: int = 1
  is_host = True

  def reset(self, task):
    return {"task": task, "turns": 0}, np.array([tokenizers.BOS], np.int32)

  def step(self, state, text):
    if text == "boom":
      raise RuntimeError("tool exploded")
    if text == "slow":
      time.sleep(5.0)
    if text == "none":
      return None
    new = dict(state, turns=state["turns"] + 1)
    return (
        new,
        np.array([tokenizers.OBS, 111, 107, tokenizers.OBS_END], np.int32),
        (new["turns"] >= 2),
    )

  def facts(self, state):
    return {
        "correct": np.bool_(False),
        "answered": np.bool_(False),
        "format_error": np.bool_(False),
        "num_tool_calls": np.int32(state["turns"]),
        "num_tool_errors": np.int32(0),
    }

  def expert_action(self, state, rng):
    return np.asarray(BYTES.encode(state["task"]), np.int32)


def test_guarded_step_batch_turns_failures_into_counted_error_observations():
  env = FlakyEnv()
  states = [{"task": t, "turns": 0} for t in ("a", "boom", "slow", "none", "b")]
  t0 = time.perf_counter()
  results, exc, tmo = base.guarded_step_batch(
      env, states, [s["task"] for s in states]
  )
  assert time.perf_counter() - t0 < 3.0  # the 5 s step was abandoned at 0.3 s
  np.testing.assert_array_equal(exc, [0, 1, 0, 1, 0])
  np.testing.assert_array_equal(tmo, [0, 0, 1, 0, 0])
  assert [r[0]["turns"] for r in results] == [1, 0, 0, 0, 1]  # rows in order
  # Done after a timeout only; after an exception the episode goes on.
  assert [bool(r[2]) for r in results] == [False, False, True, False, False]
  obs = [BYTES.decode(r[1]) for r in results]
  assert obs[0] == "<obs>ok</obs>"
  # The generic error observation: <obs> + the message cut to max_obs_len.
  assert (
      obs[1] == "<obs>Error: the</obs>"
      and len(results[1][1]) == env.max_obs_len
  )
  assert len(results[2][1]) == env.max_obs_len


def test_unprintable_exception_still_gives_an_observation():
  @dataclasses.dataclass(frozen=True, eq=False)
  class BadEnv(FlakyEnv):
    max_obs_len: int = 64

    def step(self, state, text):
      raise ValueError(10**5000)  # str() of it raises (int digit limit)

  results, exc, _ = base.guarded_step_batch(BadEnv(), [{}], ["x"])
  assert exc.tolist() == [1]
  assert BYTES.decode(results[0][1]) == (
      "<obs>Error: the tool call failed (ValueError: (unprintable))</obs>"
  )


def test_step_workers_run_rows_concurrently_in_order():
  @dataclasses.dataclass(frozen=True, eq=False)
  class SleepEnv(FlakyEnv):
    step_timeout_s: float = 5.0
    step_workers: int = 4

    def step(self, state, text):
      time.sleep(0.4)
      return dict(state, turns=1), np.array([int(text)], np.int32), True

  env = SleepEnv()
  t0 = time.perf_counter()
  results, exc, tmo = base.guarded_step_batch(
      env, [{}] * 4, ["7", "5", "3", "1"]
  )
  wall = time.perf_counter() - t0
  assert [int(r[1][0]) for r in results] == [7, 5, 3, 1]
  assert wall < 1.2, wall  # 4 x 0.4 s one after the other would take 1.6 s
  assert exc.sum() == 0 and tmo.sum() == 0


def test_env_step_batch_that_raises_is_retried_row_by_row():
  @dataclasses.dataclass(frozen=True, eq=False)
  class BatchEnv(FlakyEnv):

    def step_batch(self, states, texts):
      raise RuntimeError("batch failed")

  env = BatchEnv()
  states = [{"task": "a", "turns": 0}, {"task": "boom", "turns": 0}]
  results, exc, tmo = base.guarded_step_batch(env, states, ["a", "boom"])
  np.testing.assert_array_equal(exc, [0, 1])
  assert results[0][0]["turns"] == 1 and not results[1][2]
  assert BYTES.decode(results[1][1]).startswith("<obs>Error")


def test_env_step_batch_past_its_deadline_fails_every_row():
  @dataclasses.dataclass(frozen=True, eq=False)
  class SlowBatchEnv(FlakyEnv):

    def step_batch_timeout_s(self, n):
      return 0.1 * n

    def step_batch(self, states, texts):
      time.sleep(5.0)

  t0 = time.perf_counter()
  results, exc, tmo = base.guarded_step_batch(
      SlowBatchEnv(), [{}, {}], ["a", "b"]
  )
  assert time.perf_counter() - t0 < 2.0
  np.testing.assert_array_equal(tmo, [1, 1])
  np.testing.assert_array_equal(exc, [0, 0])
  assert all(r[2] for r in results)
  assert BYTES.decode(results[0][1]) == "<obs>Error: the</obs>"


def test_host_rollout_survives_raising_and_hanging_steps():
  env = FlakyEnv()
  traj = host_rollout.rollout(
      env, ["ok", "boom", "slow"], jax.random.PRNGKey(0), max_len=40
  )
  # Row 1 raised on both turns (the episode goes on after an exception, with
  # the error as its observation); row 2 timed out and ended at turn 1.
  np.testing.assert_array_equal(traj.facts["num_tool_exceptions"], [0, 2, 0])
  np.testing.assert_array_equal(traj.facts["num_tool_timeouts"], [0, 0, 1])
  np.testing.assert_array_equal(np.asarray(traj.num_turns), [2, 2, 1])
  tokens = np.asarray(traj.tokens)
  assert BYTES.decode(tokens[1, : int(traj.length[1])]).startswith(
      "<bos>boom<obs>Error: th"
  )


def test_driver_adds_to_the_environments_own_counts():
  @dataclasses.dataclass(frozen=True, eq=False)
  class CountingEnv(FlakyEnv):

    def facts(self, state):
      return dict(
          super().facts(state),
          num_tool_exceptions=np.int32(2),
          num_tool_timeouts=np.int32(0),
      )

  traj = host_rollout.rollout(
      CountingEnv(), ["ok", "boom"], jax.random.PRNGKey(0), max_len=40
  )
  np.testing.assert_array_equal(traj.facts["num_tool_exceptions"], [2, 4])
  assert traj.facts["num_tool_exceptions"].dtype == np.int32


# ---------------------------------------------------------------------------
# BFCL multi-turn tools.

bfcl_eval = pytest.importorskip("bfcl_eval")
mpmath = pytest.importorskip("mpmath")
from environments.host.bfcl import checker as bfcl_checker  # noqa: E402
from environments.host.bfcl import data as bfcl_data  # noqa: E402
from environments.host.bfcl import execution as bfcl_execution  # noqa: E402
from environments.host.bfcl import multi_turn as bfcl_multi_turn  # noqa: E402
from environments.host.bfcl import single_turn as bfcl_single_turn  # noqa: E402


@pytest.fixture(scope="module")
def math_task():
  return next(
      t
      for t in bfcl_data.load_category("multi_turn_base")
      if "MathAPI" in t.involved_classes
  )


def _step(env, task, text):
  s, _ = env.reset(task)
  t0 = time.perf_counter()
  s, obs, done = env.step(s, text)
  return s, BYTES.decode(obs), done, time.perf_counter() - t0


def test_power_over_the_digit_limit_is_a_tool_error(math_task):
  env = bfcl_multi_turn.BFCLMultiTurnEnv(max_obs_len=128)
  s, obs, done, _ = _step(
      env, math_task, "<call>power(base=10, exponent=5000)</call>"
  )
  f = env.facts(s)
  assert (
      obs.startswith("<obs>Error during execution: Exceeds the limit")
      and not done
  )
  assert (
      f["num_tool_calls"],
      f["num_tool_errors"],
      f["num_tool_exceptions"],
  ) == (1, 1, 1)
  # Within the digit limit the result is rendered: 10**1000 has 1001 digits.
  s, obs, _, _ = _step(
      env, math_task, "<call>power(base=10, exponent=1000)</call>"
  )
  assert (
      obs.startswith('<obs>{"result": 1000')
      and env.facts(s)["num_tool_errors"] == 0
  )
  # Results whose size has no bound in the arguments are refused unrun.
  assert isinstance(
      parsers.parse_tool_calls("power(base=2, exponent=10**9)"),
      parsers.ParseError,
  )  # not a literal: never executed
  s, obs, _, secs = _step(
      env, math_task, "<call>power(base=2, exponent=1000000000)</call>"
  )
  assert "is above 2**65536" in obs and secs < 2.0
  big = "9" * 4000  # an exponent too large for a float
  call = parsers.ToolCall("power", {"base": 3, "exponent": int(big)})
  assert "is above 2**65536" in bfcl_execution.check_call_arguments(call)
  # The bound is |result| <= 2**65536: 2**65537 and 3**41349 (log2 = 41349 *
  # 1.58496 = 65536.6) are refused; 2**65536, (-2)**65536 and 3**41348
  # (log2 = 65535.03) are computed.
  check = bfcl_execution.check_call_arguments
  assert check(parsers.ToolCall("power", {"base": 2, "exponent": 65537}))
  assert (
      check(parsers.ToolCall("power", {"base": 2, "exponent": 65536})) is None
  )
  assert (
      check(parsers.ToolCall("power", {"base": -2, "exponent": 65536})) is None
  )
  assert check(parsers.ToolCall("power", {"base": 3, "exponent": 41349}))
  assert (
      check(parsers.ToolCall("power", {"base": 3, "exponent": 41348})) is None
  )


def test_huge_precision_is_refused_within_seconds(math_task):
  env = bfcl_multi_turn.BFCLMultiTurnEnv(max_obs_len=64)
  for text in (
      "<call>square_root(number=2, precision=1000000)</call>",
      "<call>logarithm(value=2, base=10, precision=3000000)</call>",
      "<call>round_number(number=5, decimal_places=-10000000000)</call>",
  ):
    s, obs, done, secs = _step(env, math_task, text)
    assert secs < 2.0 and obs.startswith("<obs>Error: ") and not done, (
        text,
        obs,
    )
    assert env.facts(s)["num_tool_errors"] == 1


def test_precision_50_leaves_this_threads_numeric_state_alone(math_task):
  env = bfcl_multi_turn.BFCLMultiTurnEnv(max_obs_len=128)
  ctx_prec, dps = decimal.getcontext().prec, mpmath.mp.dps
  s, obs, _, _ = _step(
      env, math_task, "<call>square_root(number=2, precision=50)</call>"
  )
  assert (
      "1.4142135623730950488016887242096980785696718753769" in obs
  )  # 50 digits
  s, obs, _, _ = _step(
      env, math_task, "<call>logarithm(value=100, base=10, precision=50)</call>"
  )
  assert "mpf('2.0')" in obs
  assert decimal.getcontext().prec == ctx_prec and mpmath.mp.dps == dps
  # Also when run on this very thread (no worker): the isolation is the
  # save/restore itself, not the thread.
  api = bfcl_execution.make_instances(math_task)["MathAPI"]
  call = parsers.ToolCall("square_root", {"number": 2, "precision": 50})
  text, ok = bfcl_execution._run_isolated(api.square_root, call, 1.0)  # noqa: SLF001
  assert ok and "1.41421356237309504880168872420969807856967187537" in text
  call = parsers.ToolCall(
      "logarithm", {"value": 2, "base": 10, "precision": 60}
  )
  assert bfcl_execution._run_isolated(api.logarithm, call, 1.0)[1]  # noqa: SLF001
  assert decimal.getcontext().prec == ctx_prec and mpmath.mp.dps == dps


def test_a_hanging_tool_times_out_and_ends_the_episode(math_task, monkeypatch):
  release = threading.Event()
  cls = type(bfcl_execution.make_instances(math_task)["MathAPI"])
  monkeypatch.setattr(
      cls, "mean", lambda self, numbers: release.wait(30), raising=True
  )
  env = bfcl_multi_turn.BFCLMultiTurnEnv(max_obs_len=128, tool_timeout_s=0.3)
  s, obs, done, secs = _step(
      env, math_task, "<call>[mean(numbers=[1]), add(a=1, b=2)]</call>"
  )
  release.set()
  f = env.facts(s)
  assert done and secs < 2.0 and "did not finish within 0.3 s" in obs
  assert "not run" in obs
  assert (
      f["num_tool_calls"],
      f["num_tool_errors"],
      f["num_tool_timeouts"],
  ) == (2, 2, 1)


def test_tool_results_are_cut_to_max_result_chars(math_task):
  env = bfcl_multi_turn.BFCLMultiTurnEnv(max_obs_len=4096, max_result_chars=40)
  s, obs, _, _ = _step(
      env, math_task, "<call>power(base=10, exponent=1000)</call>"
  )
  assert obs == "<obs>" + '{"result": 1' + "0" * 28 + "</obs>"


def test_bad_limits_are_refused():
  with pytest.raises(ValueError, match="tool_timeout_s"):
    bfcl_multi_turn.BFCLMultiTurnEnv(tool_timeout_s=0)
  with pytest.raises(ValueError, match="max_result_chars"):
    bfcl_multi_turn.BFCLMultiTurnEnv(max_result_chars=0)


# ---------------------------------------------------------------------------
# BFCL call accounting: calls (well-formed or not) >= calls that failed.


def test_single_turn_accounting_on_hand_built_episodes():
  env = bfcl_single_turn.BFCLEnv(categories=("parallel",))
  task = bfcl_data.load_category("parallel")[0]
  n_gold = len(task.ground_truth)
  state, _ = env.reset(task)
  gold = bfcl_checker.gold_calls(task.ground_truth, task.functions)
  text = "[" + ", ".join(parsers.format_call_python(c) for c in gold) + "]"
  f = env.facts(env.step(state, text)[0])
  assert (f["num_tool_calls"], f["num_tool_errors"]) == (n_gold, 0) and f[
      "correct"
  ]
  # A wrong but parseable call: 1 call, not executed, so no error.
  f = env.facts(env.step(state, "[nope(a=1)]")[0])
  assert (f["num_tool_calls"], f["num_tool_errors"]) == (1, 0) and not f[
      "correct"
  ]
  # An unparseable turn: one malformed call (1 call, 1 error), format error.
  for text in ("<call>f(a=</call>", "no call here", ""):
    f = env.facts(env.step(state, text)[0])
    assert (f["num_tool_calls"], f["num_tool_errors"]) == (1, 1) and f[
        "format_error"
    ]


def test_multi_turn_accounting_on_a_hand_built_episode():
  env = bfcl_multi_turn.BFCLMultiTurnEnv(max_turns=10)
  task = bfcl_data.load_category("multi_turn_base")[0]
  s, _ = env.reset(task)
  for text in (
      "<call>cd(folder=</call>",  # malformed: 1 call, 1 error
      "<call>[ls(), cd(folder='no_such_dir')]</call>",  # 2 calls, 1 error
      "<call>rm_rf(path='/')</call>",
  ):  # unknown function: 1 call, 1 error
    s, _, _ = env.step(s, text)
  f = env.facts(s)
  assert (f["num_tool_calls"], f["num_tool_errors"]) == (4, 3)
  assert (f["num_tool_exceptions"], f["num_tool_timeouts"]) == (0, 0)


def test_random_episodes_never_have_more_errors_than_calls():
  rng = np.random.default_rng(0)
  single = bfcl_single_turn.BFCLEnv()
  multi = bfcl_multi_turn.BFCLMultiTurnEnv(max_turns=3, max_obs_len=32)
  st_task = bfcl_data.load_category("simple")[0]
  mt_task = bfcl_data.load_category("multi_turn_base")[0]
  pieces = [
      "<call>",
      "</call>",
      "ls()",
      "cd(",
      "folder='x')",
      "[",
      "]",
      "{",
      '"',
      "pwd()",
      "a",
      " ",
      "<tool_call>",
      "=",
      "1",
  ]
  for _ in range(100):
    texts = [
        "".join(rng.choice(pieces, size=rng.integers(0, 8))) for _ in range(3)
    ]
    f = single.facts(single.step(single.reset(st_task)[0], texts[0])[0])
    assert f["num_tool_errors"] <= f["num_tool_calls"]
    s, _ = multi.reset(mt_task)
    for t in texts:
      s, _, _ = multi.step(s, t)
    f = multi.facts(s)
    assert f["num_tool_errors"] <= f["num_tool_calls"]
