"""reasoning-gym tasks with a sandboxed Python tool, as a host environment.

Tasks come from any named reasoning-gym generator (PyPI `reasoning-gym`,
Apache-2.0; e.g. 'gsm_symbolic', 'basic_arithmetic'); answers are scored by the
generator's own `score_answer` (a float in [0, 1]). Training tasks are drawn by
index from the generator seeded with `train_seed`; the held-out set is the first
n items of the generator seeded with `eval_seed` (a different procedural stream).

Episode format (byte tokenizer specials; an HF chat template's text works too):

  prompt:  BOS "<question>\\nUse <call>python code</call> to run Python, and give
           the final answer as <answer>...</answer>.\\n"
  call:    <call> print(17 * 23) </call>   -> <obs> 391 </obs>
           (or a parsed tool call named 'python' with a 'code' argument, e.g.
            <tool_call>{"name": "python", "arguments": {"code": "..."}}</tool_call>)
  answer:  <answer> 391 </answer>          -> done, scored by score_answer

The code runs in environments/host/sandbox.py (one process per call, CPU/wall/
memory/output limits, no network, no writes outside its temp dir); calls of one
batch run concurrently (`step_batch`). A failing call (exception, limit) returns
an error observation and counts a tool error; the episode goes on. A turn that is
neither a call nor an answer is a format error and ends the episode.

Chat format (an `HFTokenizer`; `chat_format` is an agentic_text.chat.ChatFormat):
the prompt is the checkpoint's chat template with `CHAT_SYSTEM_PROMPT` and the
question as the user message. A turn is a Python call if it holds a
`<tool_call>{"name": "python", "arguments": {"code": ...}}</tool_call>` (parsed
by environments/host/parsers.py) or a ```python fenced block, and no
`<answer>` tag; the output comes back as a `tool` message. Any other turn is
the answer: the text in
`<answer>...</answer>`, else in `\boxed{...}`, else the last number in the
reply, scored by score_answer; a reply with none of these is a format error.

Facts (per episode): correct (score >= correct_threshold), score (float32),
answered, format_error, num_tool_calls, num_tool_errors, hard (the item's
generator is in `hard_datasets`).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any, Sequence

import numpy as np

from agentic_text import chat
from agentic_text import tokenizers as tok
from environments.host import parsers
from environments.host import sandbox as sandbox_lib

# Turn parsing scans with str.find (linear time in the text); the backtracking
# regexes these replace, e.g. r"<answer>(.*?)</answer>", took quadratic time on
# adversarial text such as many unclosed "<answer>" tags. The two regexes
# below have no nested or overlapping quantifiers (linear).
_WS_RE = re.compile(r"\s*")
_BOXED_RE = re.compile(r"\\boxed\{([^{}]*)\}")
_NUMBER_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
CHAT_SYSTEM_PROMPT = (
    "You are a helpful assistant that solves math problems. You can run Python: "
    "write the code in a ```python block and print what you need; the output "
    "will be shown to you. When you know the result, give the final answer as "
    "<answer>NUMBER</answer>."
)
_INSTRUCTION = (
    "\nUse <call>python code</call> to run Python (print what you need), "
    "and give the final answer as <answer>...</answer>.\n"
)


def answer_block(text: str) -> str | None:
  """The text of the first closed `<answer>...</answer>` block, or None.

  Same result as `re.search(r"<answer>(.*?)</answer>", text, re.DOTALL)
  .group(1)` in O(len(text)) time: if the first `<answer>` has no closing tag
  after it, no later one has.
  """
  i = text.find("<answer>")
  if i < 0:
    return None
  end = text.find("</answer>", i + 8)
  return None if end < 0 else text[i + 8 : end]


def call_block(text: str) -> str | None:
  """The payload of a turn that is exactly `<call>...</call>` up to
  surrounding whitespace, or None.

  Same result as `re.match(r"^\\s*<call>(.*?)</call>\\s*$", text, re.DOTALL)
  .group(1)` in O(len(text)) time: only the last `</call>` can be followed by
  nothing but whitespace.
  """
  p = _WS_RE.match(text).end()
  if not text.startswith("<call>", p):
    return None
  start = p + 6
  end = text.rfind("</call>", start)
  if end < 0 or text[end + 7 :].strip():
    return None
  return text[start:end]


def python_fence(text: str) -> str | None:
  """The code of the first ```python (or ```py) fence whose tag is followed
  by whitespace holding a newline; the code starts after the last newline of
  that whitespace and runs to the next ``` (or the end of the text, less one
  final newline). None if there is no such fence.

  Same result as `re.search(r"```(?:python|py)\\s*\\n(.*?)(?:```|$)", text,
  re.DOTALL).group(1)` in O(len(text)) time.
  """
  i = text.find("```")
  while i >= 0:
    p = i + 3
    if text.startswith("python", p):
      p += 6
    elif text.startswith("py", p):
      p += 2
    else:
      i = text.find("```", i + 1)
      continue
    nl = text.rfind("\n", p, _WS_RE.match(text, p).end())
    if nl < 0:
      i = text.find("```", i + 1)
      continue
    start = nl + 1
    end = text.find("```", start)
    if end < 0:
      end = (
          len(text) - 1
          if text.endswith("\n") and len(text) - 1 >= start
          else len(text)
      )
    return text[start:end]
  return None


def _chat_code_of(text: str) -> str | None:
  """Chat format: the code of a Python call (Hermes tag or ```python block)."""
  if "<tool_call>" in text:
    calls = parsers.parse_tool_calls(text)
    if (
        isinstance(calls, list)
        and len(calls) == 1
        and isinstance(calls[0].arguments.get("code"), str)
    ):
      return calls[0].arguments["code"]
  code = python_fence(text)
  if code is not None and code.strip():
    return code
  return None


def chat_answer_of(text: str) -> str | None:
  """Chat format: the answer in a reply (<answer> tag, then \\boxed{}, then
  the last number), or None."""
  m = answer_block(text)
  if m is not None:
    return m.strip()
  m = _BOXED_RE.findall(text)
  if m:
    return m[-1].strip()
  m = _NUMBER_RE.findall(text)
  if m:
    return m[-1].replace(",", "")
  return None


@dataclasses.dataclass(frozen=True)
class RGTask:
  """One reasoning-gym item: its dataset entry and where it came from."""

  entry: dict
  seed: int
  index: int


@dataclasses.dataclass
class _State:
  task: RGTask
  turns: int = 0
  calls: int = 0
  errors: int = 0
  answered: bool = False
  format_error: bool = False
  score: float = 0.0
  done: bool = False


def _code_of(text: str) -> str | None:
  """The Python code of a tool-call turn, or None if the turn is not a call."""
  payload = call_block(text)
  if payload is not None:
    calls = parsers.parse_tool_calls(payload)
    if (
        isinstance(calls, list)
        and len(calls) == 1
        and "code" in calls[0].arguments
    ):
      return str(calls[0].arguments["code"])
    return payload
  if "<tool_call>" in text:
    calls = parsers.parse_tool_calls(text)
    if (
        isinstance(calls, list)
        and len(calls) == 1
        and isinstance(calls[0].arguments.get("code"), str)
    ):
      return calls[0].arguments["code"]
  return None


@dataclasses.dataclass(frozen=True, eq=False)
class ReasoningGymEnv:
  """A reasoning-gym generator with the Python tool (see module docstring)."""

  dataset: str = "gsm_symbolic"
  # Keyword arguments of the generator's config (e.g. min_terms for
  # basic_arithmetic).
  dataset_config: Any = None
  train_seed: int = 0
  eval_seed: int = 1_000_003
  # Size of the procedural training stream (items are generated on access).
  train_size: int = 1_000_000
  correct_threshold: float = 1.0
  max_prompt_len: int = 512
  max_action_len: int = 128
  max_obs_len: int = 64
  max_turns: int = 4
  # Sandbox limits (environments/host/sandbox.py SandboxConfig).
  cpu_seconds: int = 5
  wall_seconds: float = 10.0
  memory_bytes: int = 1 << 30
  max_workers: int = 4
  # Isolation (SandboxConfig.isolation): 'auto' = bubblewrap if it works here,
  # else refuse to run unless allow_weak_isolation accepts audit hooks only.
  sandbox_isolation: str = "auto"
  allow_weak_isolation: bool = False
  # Probability that the expert computes the answer with one Python call first.
  expert_tool_prob: float = 0.5
  # Generators whose items count as 'hard' (the `hard` fact; the eval report's
  # accuracy_hard / accuracy_easy split): with dataset='composite', the
  # `source_dataset` of an item; otherwise `dataset` itself.
  hard_datasets: tuple[str, ...] = ()
  tokenizer: Any = dataclasses.field(default_factory=tok.ByteTokenizer)
  is_host = True

  @functools.cached_property
  def chat_format(self):
    """agentic_text.chat.ChatFormat for an HF tokenizer, else None (byte format)."""
    return chat.make_format(self.tokenizer)

  def __post_init__(self):
    self._data(self.train_seed)  # fails early on an unknown name or bad config
    if not 0.0 <= self.expert_tool_prob <= 1.0:
      raise ValueError(
          f"ReasoningGymEnv.expert_tool_prob={self.expert_tool_prob!r}: "
          "must be in [0, 1]"
      )

  @functools.lru_cache(maxsize=4)
  def _data(self, seed: int):
    """The generator for `seed`.

    Raises:
      ValueError: unknown dataset name; TypeError: bad dataset_config field.
    """
    import reasoning_gym

    kwargs = dict(self.dataset_config or {})
    if self.dataset == "composite" and "datasets" in kwargs:
      # A mix of generators: dicts (name, weight, config) -> DatasetSpec.
      from reasoning_gym.composite import DatasetSpec

      kwargs["datasets"] = [
          d
          if isinstance(d, DatasetSpec)
          else DatasetSpec(
              name=d["name"],
              weight=float(d.get("weight", 1.0)),
              config=dict(d.get("config", None) or {}),
          )
          for d in kwargs["datasets"]
      ]
    return reasoning_gym.create_dataset(
        self.dataset, size=self.train_size, seed=seed, **kwargs
    )

  @functools.cached_property
  def sandbox(self) -> sandbox_lib.Sandbox:
    return sandbox_lib.Sandbox(
        sandbox_lib.SandboxConfig(
            cpu_seconds=self.cpu_seconds,
            wall_seconds=self.wall_seconds,
            memory_bytes=self.memory_bytes,
            max_output_chars=self.max_obs_len * 4,
            max_workers=self.max_workers,
            isolation=self.sandbox_isolation,
            allow_weak_isolation=self.allow_weak_isolation,
        )
    )

  def sample_tasks(self, rng: np.random.Generator, n: int) -> list[RGTask]:
    data = self._data(self.train_seed)
    return [
        RGTask(data[int(i)], self.train_seed, int(i))
        for i in rng.integers(0, self.train_size, size=n)
    ]

  def eval_tasks(self, n: int, seed: int) -> list[RGTask]:
    data = self._data(self.eval_seed + seed)
    return [RGTask(data[i], self.eval_seed + seed, i) for i in range(n)]

  def _encode(self, text, limit, prefix=(), suffix=()):
    body = list(self.tokenizer.encode(text))[
        : max(limit - len(prefix) - len(suffix), 0)
    ]
    return np.asarray(list(prefix) + body + list(suffix), np.int32)

  def reset(self, task: RGTask):
    if self.chat_format is not None:
      return _State(task), self.chat_format.prompt(
          CHAT_SYSTEM_PROMPT, task.entry["question"], self.max_prompt_len
      )
    return _State(task), self._encode(
        task.entry["question"] + _INSTRUCTION,
        self.max_prompt_len,
        prefix=(tok.BOS,),
    )

  def _score(self, answer: str, task: RGTask) -> float:
    try:
      s = float(
          self._data(task.seed).score_answer(answer=answer, entry=task.entry)
      )
    except Exception:  # noqa: BLE001 -- a verifier crash on odd text scores 0
      return 0.0
    return s if np.isfinite(s) else 0.0

  def _begin(self, state: _State, text: str):
    """Classifies a turn: ('done', step result) or ('code', code)."""
    if state.done:
      return "done", (state, np.zeros((0,), np.int32), True)
    state = dataclasses.replace(state, turns=state.turns + 1)
    if self.chat_format is not None:
      code = None if answer_block(text) is not None else _chat_code_of(text)
      if code is not None:
        return "code", (state, code)
      answer = chat_answer_of(text)
      if answer is None:
        state = dataclasses.replace(state, format_error=True, done=True)
      else:
        state = dataclasses.replace(
            state,
            answered=True,
            done=True,
            score=self._score(answer, state.task),
        )
      return "done", (state, np.zeros((0,), np.int32), True)
    m = answer_block(text)
    if m is not None:
      state = dataclasses.replace(
          state,
          answered=True,
          done=True,
          score=self._score(m.strip(), state.task),
      )
      return "done", (state, np.zeros((0,), np.int32), True)
    code = _code_of(text)
    if code is None:
      state = dataclasses.replace(state, format_error=True, done=True)
      return "done", (state, np.zeros((0,), np.int32), True)
    return "code", (state, code)

  def _finish(self, state: _State, result: sandbox_lib.ExecResult):
    obs_text = result.observation(max_chars=self.max_obs_len * 4)
    state = dataclasses.replace(
        state, calls=state.calls + 1, errors=state.errors + int(not result.ok)
    )
    done = state.turns >= self.max_turns
    state = dataclasses.replace(state, done=done)
    if self.chat_format is not None:
      # print()'s trailing newline is dropped: the template adds its own.
      return (
          state,
          self.chat_format.observation(obs_text.rstrip("\n"), self.max_obs_len),
          done,
      )
    obs = self._encode(
        obs_text, self.max_obs_len, prefix=(tok.OBS,), suffix=(tok.OBS_END,)
    )
    return state, obs, done

  def step_batch_timeout_s(self, n: int) -> float:
    """The host driver's limit on one `step_batch` over n rows: n sandbox
    runs of up to wall_seconds, max_workers at a time, plus 30 s for scoring."""
    return self.wall_seconds * -(-n // max(self.max_workers, 1)) + 30.0

  @property
  def step_timeout_s(self) -> float:
    """The host driver's limit on one `step` (one sandbox run)."""
    return self.step_batch_timeout_s(1)

  def step(self, state: _State, action_text: str):
    return self.step_batch([state], [action_text])[0]

  def step_batch(self, states: Sequence[_State], texts: Sequence[str]) -> list:
    """Steps many episodes; their Python calls run concurrently in the sandbox."""
    begun = [self._begin(s, t) for s, t in zip(states, texts)]
    codes = [b[1][1] for b in begun if b[0] == "code"]
    results = iter(self.sandbox.run_batch(codes)) if codes else iter(())
    out = []
    for kind, payload in begun:
      out.append(
          payload if kind == "done" else self._finish(payload[0], next(results))
      )
    return out

  def facts(self, state: _State) -> dict[str, np.ndarray]:
    return {
        "correct": np.bool_(state.score >= self.correct_threshold),
        "score": np.float32(state.score),
        "answered": np.bool_(state.answered),
        "format_error": np.bool_(state.format_error),
        "num_tool_calls": np.int32(state.calls),
        "num_tool_errors": np.int32(state.errors),
        "hard": np.bool_(self._source(state.task) in self.hard_datasets),
    }

  def _source(self, task: RGTask) -> str:
    meta = task.entry.get("metadata") or {}
    return str(meta.get("source_dataset", self.dataset))

  def expert_action(self, state: _State, rng: np.random.Generator | None):
    answer = str(state.task.entry["answer"])
    use_tool = (
        state.calls == 0
        and rng is not None
        and rng.random() < self.expert_tool_prob
    )
    if self.chat_format is not None:
      text = (
          f"```python\nprint({answer!r})\n```"
          if use_tool
          else f"<answer>{answer}</answer>"
      )
      return self.chat_format.assistant(text, self.max_action_len)
    if use_tool:
      return self._encode(
          f"print({answer!r})",
          self.max_action_len,
          prefix=(tok.CALL,),
          suffix=(tok.CALL_END,),
      )
    return self._encode(
        answer,
        self.max_action_len,
        prefix=(tok.ANSWER,),
        suffix=(tok.ANSWER_END,),
    )
