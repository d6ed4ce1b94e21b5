"""The host-environment protocol (docs/design.md, host half).

A host environment runs its tools in Python, so its `step` works on decoded text and
the rollout is driven turn by turn from the host (agentic_rl/host_rollout.py), which
calls the same jitted `generate_turn` and observation-append functions as the
JAX-native rollout. It declares `is_host = True`; the train loop dispatches on it.

Shapes are static, as for JAX-native environments:

  P = max_prompt_len, A = max_action_len, O = max_obs_len, K = max_turns.

Methods (plain Python/numpy; none may raise on malformed model output):

  sample_tasks(rng: np.random.Generator, n) -> list of n tasks (infinite stream).
  eval_tasks(n, seed) -> list of n tasks, a fixed held-out set.
  reset(task) -> (state, prompt_ids: int32 [<= P] array). Longer prompts are cut
      to their first P tokens by the rollout.
  step(state, action_text: str) -> (state, obs_ids: int32 [<= O] array, done: bool)
      `action_text` is the tokenizer's decoding of the sampled turn (for parsing
      only; the trajectory keeps the sampled ids). An observation longer than O
      is cut by the rollout; environments should keep theirs within O.
  step_batch(states, action_texts) -> list of step results; optional, for
      environments whose tools run concurrently (e.g. the sandbox pool).
  facts(state) -> dict[str, np.ndarray] with fixed keys, shapes and dtypes:
      per-episode scalars and per-turn [K] arrays; must include 'correct',
      'answered', 'format_error' (bool), 'num_tool_calls', 'num_tool_errors'
      (int32) and 'hard' (bool; False where the notion does not apply).
  expert_action(state, rng) -> int32 token ids of the demonstrator's next turn.

Optional attributes read by the host rollout driver:

  step_timeout_s: float, the time limit of one `step`; default
      DEFAULT_STEP_TIMEOUT_S.
  step_batch_timeout_s(n) -> float: the time limit of one `step_batch` call
      over n rows; default n * step_timeout_s.
  step_workers: int, how many rows' `step` calls may run at once in threads
      (default 1: one after the other). Only for environments whose `step` is
      safe to run concurrently for different states (an HF tokenizer's encode
      toggles a shared flag, so steps that tokenise text are not).
  tool_failure(state, message) -> step result: records a step that raised or
      ran out of time as a failed tool call and returns its error observation.
      Without it the driver keeps the state from before the step, returns
      `message` as the observation and ends the episode only after a timeout.

Failures (`guarded_step_batch`): a step that raises, or does not return within
its time limit, becomes a tool-error observation and is counted (driver facts
'num_tool_exceptions' / 'num_tool_timeouts'); it never propagates. A Python
thread cannot be killed: a step past its deadline is abandoned in its daemon
thread and keeps running (and holding the GIL for long C-level operations, such
as arithmetic on huge integers) until it returns on its own. The time limit
stops the rollout from waiting; only bounds on the tools' arguments (e.g. BFCL's
`bfcl.check_call_arguments`) stop the work itself. An abandoned step may also
still touch objects shared with later steps (its state, the tokenizer), which
is why its episode ends; environments bound their own tools' time more tightly
than the driver's step limit, so the driver's limit is a last resort.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
from typing import Any, Callable, Protocol, Sequence

from absl import logging
import numpy as np

from agentic_text import tokenizers as tok

DEFAULT_STEP_TIMEOUT_S = 60.0
# Longest turn text handed to an environment's step (characters); longer
# decoded turns are cut. parsers.MAX_TEXT_CHARS refuses longer text anyway.
MAX_TURN_CHARS = 100_000


class HostEnvironment(Protocol):
  """Structural type of a host environment (see module docstring)."""

  is_host: bool
  max_prompt_len: int
  max_action_len: int
  max_obs_len: int
  max_turns: int
  tokenizer: Any

  def sample_tasks(self, rng: np.random.Generator, n: int) -> list[Any]:
    ...

  def eval_tasks(self, n: int, seed: int) -> list[Any]:
    ...

  def reset(self, task: Any) -> tuple[Any, np.ndarray]:
    ...

  def step(self, state: Any, action_text: str) -> tuple[Any, np.ndarray, bool]:
    ...

  def facts(self, state: Any) -> dict[str, np.ndarray]:
    ...

  def expert_action(self, state: Any, rng: np.random.Generator) -> np.ndarray:
    ...


def is_host(env: Any) -> bool:
  """Whether `env` is a host environment (declares `is_host = True`)."""
  return bool(getattr(env, "is_host", False))


def step_batch(env: Any, states: Sequence[Any], texts: Sequence[str]) -> list:
  """`env.step_batch` if the environment has one, else `env.step` row by row."""
  if hasattr(env, "step_batch"):
    return list(env.step_batch(states, texts))
  return [env.step(s, t) for s, t in zip(states, texts)]


@dataclasses.dataclass(frozen=True)
class Outcome:
  """Result of `call_with_deadline`.

  Attributes:
    status: 'ok', 'exception' (the call raised) or 'timeout' (abandoned).
    value: the return value ('ok'), else None.
    error: the exception ('exception'), else None.
  """

  status: str
  value: Any = None
  error: BaseException | None = None


_abandoned_lock = threading.Lock()
_abandoned: list[threading.Thread] = []


def abandoned_threads() -> int:
  """How many calls abandoned by `call_with_deadline` are still running."""
  with _abandoned_lock:
    _abandoned[:] = [t for t in _abandoned if t.is_alive()]
    return len(_abandoned)


def call_with_deadline(
    fn: Callable[..., Any], *args, timeout_s: float, **kwargs
) -> Outcome:
  """Runs `fn(*args, **kwargs)` in a fresh daemon thread and waits at most
  `timeout_s` seconds for it.

  Never raises for the call's own errors: an exception (any BaseException,
  e.g. SystemExit or RecursionError) comes back as Outcome('exception'), a call
  still running at the deadline as Outcome('timeout'). Such a call is
  abandoned, not stopped (Python threads cannot be killed): it keeps running
  in its daemon thread (counted by `abandoned_threads`) and whatever it
  returns later is dropped. The caller must not reuse objects the abandoned
  call may still modify.

  Args:
    fn: the callable.
    timeout_s: > 0, seconds.

  Raises:
    ValueError: timeout_s <= 0.
  """
  if not timeout_s > 0:
    raise ValueError(f"call_with_deadline: timeout_s={timeout_s!r} must be > 0")
  box: dict[str, Any] = {}
  done = threading.Event()

  def target():
    try:
      box["outcome"] = Outcome("ok", value=fn(*args, **kwargs))
    except BaseException as e:  # noqa: BLE001 -- reported to the caller
      box["outcome"] = Outcome("exception", error=e)
    finally:
      done.set()

  thread = threading.Thread(target=target, daemon=True, name="host-tool-call")
  thread.start()
  if not done.wait(timeout_s):
    with _abandoned_lock:
      _abandoned.append(thread)
    return Outcome("timeout")
  return box["outcome"]


def error_observation(env: Any, message: str):
  """`message` as an observation in the environment's format: a tool message
  (chat format) or `<obs> message </obs>` (byte tokenizer), within max_obs_len.
  """
  fmt = getattr(env, "chat_format", None)
  limit = int(env.max_obs_len)
  if fmt is not None:
    return fmt.observation(message, limit)
  body = list(env.tokenizer.encode(message))[: max(limit - 2, 0)]
  return np.asarray([tok.OBS] + body + [tok.OBS_END], np.int32)


def _describe(outcome: Outcome, timeout_s: float) -> str:
  if outcome.status == "timeout":
    return f"Error: the tool call did not finish within {timeout_s:g} s"
  e = outcome.error
  try:
    detail = str(e)[:200]
  except Exception:  # noqa: BLE001 -- e.g. an int argument over the digit limit
    detail = "(unprintable)"
  return f"Error: the tool call failed ({type(e).__name__}: {detail})"


def _warn_timeouts(count: int, timeout_s: float) -> None:
  logging.warning(
      "host environment: %d step(s) abandoned after %g s; %d abandoned "
      "call(s) still running",
      count,
      timeout_s,
      abandoned_threads(),
  )


def _failure(env: Any, state: Any, message: str, timed_out: bool):
  """Step result of a failed step: `env.tool_failure`, else the generic one:
  the state from before the step, `message` as the observation, and done
  after a timeout only (the abandoned step may still be changing the state;
  after an exception the episode goes on, so the policy sees the error)."""
  if hasattr(env, "tool_failure"):
    try:
      return env.tool_failure(state, message)
    except Exception:  # noqa: BLE001 -- fall through to the generic result
      pass
  return state, error_observation(env, message), timed_out


def guarded_step_batch(
    env: Any,
    states: Sequence[Any],
    texts: Sequence[str],
    timeout_s: float | None = None,
) -> tuple[list, np.ndarray, np.ndarray]:
  """Steps many rows like `step_batch`, with a time limit and no exceptions.

  Each row's `env.step` runs under `call_with_deadline` (up to
  `env.step_workers` rows at once, results in row order whatever the finish
  order); an environment with its own `step_batch` gets one call with the
  deadline `env.step_batch_timeout_s(n)` for the whole batch (a timeout fails
  every row), and if that raises, each row is retried with `env.step`. A row
  whose step raised or timed out gets `_failure`'s result
  (the environment's `tool_failure`; else the state from before the step,
  the error message as the observation, and done only after a timeout).

  Args:
    env: a host environment.
    states, texts: one state and decoded turn per row.
    timeout_s: per call; default env.step_timeout_s or DEFAULT_STEP_TIMEOUT_S.

  Returns:
    (results, exceptions [N] int32, timeouts [N] int32): one step result per
    row, and which rows' steps raised / timed out.
  """
  n = len(states)
  if timeout_s is None:
    timeout_s = float(getattr(env, "step_timeout_s", DEFAULT_STEP_TIMEOUT_S))
  exceptions = np.zeros((n,), np.int32)
  timeouts = np.zeros((n,), np.int32)
  if n == 0:
    return [], exceptions, timeouts
  if hasattr(env, "step_batch"):
    batch_timeout_s = (
        float(env.step_batch_timeout_s(n))
        if hasattr(env, "step_batch_timeout_s")
        else timeout_s * n
    )
    out = call_with_deadline(
        env.step_batch, list(states), list(texts), timeout_s=batch_timeout_s
    )
    if out.status == "ok":
      results = list(out.value)
      if len(results) == n:
        return results, exceptions, timeouts
      out = Outcome(
          "exception",
          error=ValueError(
              f"step_batch returned {len(results)} results for {n} rows"
          ),
      )
    if out.status == "timeout":
      message = _describe(out, batch_timeout_s)
      timeouts[:] = 1
      _warn_timeouts(n, batch_timeout_s)
      return (
          [_failure(env, s, message, True) for s in states],
          exceptions,
          timeouts,
      )

  def one(i: int):
    return call_with_deadline(
        env.step, states[i], texts[i], timeout_s=timeout_s
    )

  workers = max(1, min(int(getattr(env, "step_workers", 1)), n))
  if workers == 1:
    outcomes = [one(i) for i in range(n)]
  else:
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
      outcomes = list(pool.map(one, range(n)))
  results = []
  for i, out in enumerate(outcomes):
    if out.status == "ok" and not (
        isinstance(out.value, tuple) and len(out.value) == 3
    ):
      out = Outcome(
          "exception",
          error=TypeError(
              f"step returned {type(out.value).__name__}, not (state, obs, done)"
          ),
      )
    if out.status == "ok":
      results.append(out.value)
      continue
    exceptions[i] = out.status == "exception"
    timeouts[i] = out.status == "timeout"
    results.append(
        _failure(
            env, states[i], _describe(out, timeout_s), out.status == "timeout"
        )
    )
  if timeouts.any():
    _warn_timeouts(int(timeouts.sum()), timeout_s)
  return results, exceptions, timeouts
