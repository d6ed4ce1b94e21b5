"""The HF-tokenizer (chat template) path of the host rollout and host envs.

A tiny random Llama with a locally trained BPE and a ChatML template
(tests/chat_fixtures.py). Checks: ChatFormat renders prompts and observations
exactly as the template's whole render tokenised at once, with per-token roles;
stop ids come from the checkpoint; the host driver stops turns on them, keeps
sampled ids verbatim, closes cut turns with a TEMPLATE `<|im_end|>` and writes
the template's roles; BFCL and reasoning-gym environments parse decoded text
(Hermes `<tool_call>` JSON, Python-call syntax, ```python blocks); an expert
episode's buffer equals the template's render of the conversation; and (slow)
configs/bfcl_grpo.py:smoke and configs/gsm_tool.py:smoke run RL end to end from
the tiny checkpoint with `--config.tokenizer=hf`.
"""

import dataclasses
import json
import os

import jax
import numpy as np
import pytest
from flax import nnx

pytest.importorskip("tokenizers")
pytest.importorskip("torch")
pytest.importorskip("transformers")

from agentic_text import chat  # noqa: E402
from agentic_rl import host_rollout  # noqa: E402
from agentic_text import tokenizers  # noqa: E402
from agentic_rl import types  # noqa: E402
from agentic_rl.models import hf  # noqa: E402
from tests import chat_fixtures  # noqa: E402


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
  return chat_fixtures.write_chat_checkpoint(
      str(tmp_path_factory.mktemp("tinychat"))
  )


@pytest.fixture(scope="module")
def tok(ckpt):
  return tokenizers.HFTokenizer.from_folder(ckpt)


@pytest.fixture(scope="module")
def fmt(tok):
  return chat.ChatFormat(tok)


@pytest.fixture(scope="module")
def policy(ckpt):
  cfg, graphdef, params = hf.load_pretrained(ckpt)
  return graphdef, params, cfg


def _render_ids(tok, messages, gen):
  return tok.encode(
      chat.render_chatml(messages, add_generation_prompt=gen),
      allow_special=True,
  )


def test_stop_ids_and_template_from_the_folder(tok, fmt):
  # generation_config eos 2 (<|im_end|>), then <|endoftext|> (0) from the vocab.
  assert tok.eos_ids == (2, 0)
  assert fmt.stop_tokens == (2, 0) and fmt.end_id == 2
  assert tok.chat_template == chat_fixtures.CHATML


def test_prompt_and_observation_equal_the_whole_render(tok, fmt):
  system, user = (
      "You are an expert in composing functions.",
      "What is 483 times 27?",
  )
  ids, roles = fmt.prompt(system, user, 200)
  msgs = [
      {"role": "system", "content": system},
      {"role": "user", "content": user},
  ]
  assert ids.tolist() == _render_ids(tok, msgs, True)
  # Roles: content tokens PROMPT, everything else TEMPLATE.
  content = "".join(
      tok.decode([i]) for i, r in zip(ids, roles) if r == types.PROMPT
  )
  assert content == system + user
  assert set(roles.tolist()) == {types.PROMPT, types.TEMPLATE}
  # A sampled turn that ended with <|im_end|>, then a tool result.
  sampled = tok.encode("The result is 13041.") + [fmt.end_id]
  close, close_roles = fmt.close_turn(sampled)
  obs, obs_roles = fmt.observation("13041", 64)
  full = ids.tolist() + sampled + close.tolist() + obs.tolist()
  msgs += [
      {"role": "assistant", "content": "The result is 13041."},
      {"role": "tool", "content": "13041"},
  ]
  assert full == _render_ids(tok, msgs, True)
  assert (close_roles == types.TEMPLATE).all() and close.tolist() == tok.encode(
      "\n"
  )
  assert (
      "".join(
          tok.decode([i]) for i, r in zip(obs, obs_roles) if r == types.TOOL
      )
      == "13041"
  )
  # A cut sample (no <|im_end|>): the template closes it.
  assert fmt.close_turn(tok.encode("The"))[0].tolist() == [2] + tok.encode("\n")
  # Length caps shorten content, never the scaffolding.
  short, _ = fmt.prompt(system, user * 30, 60)
  gen = fmt.generation_prompt()[0].tolist()
  assert len(short) <= 60 and short[-len(gen) :].tolist() == gen
  obs, _ = fmt.observation("1234567890" * 20, 24)
  assert len(obs) + fmt.close_reserve <= 24
  # A long system message is cut too, keeping the start of the user message.
  ids, roles = fmt.prompt(system * 20, user, 48)
  assert len(ids) <= 48 and tok.decode(ids[roles == types.PROMPT]).endswith(
      user
  )
  with pytest.raises(ValueError, match="max_prompt_len=10"):
    fmt.prompt(system, user, 10)


def test_decode_drops_stop_ids_and_never_raises(tok, fmt):
  ids = tok.encode("<tool_call>[]</tool_call>") + [2]
  assert fmt.decode(ids) == "<tool_call>[]</tool_call>"
  assert fmt.decode([10**6]) == ""


def test_non_chatml_template_is_refused(ckpt):
  llama3 = (
      "{% for m in messages %}<|start_header_id|>{{ m['role'] }}"
      "<|end_header_id|>\n\n{{ m['content'] }}<|eot_id|>{% endfor %}"
  )
  tok = tokenizers.HFTokenizer.from_folder(ckpt)
  tok.chat_template = llama3
  with pytest.raises(ValueError, match="not ChatML"):
    chat.ChatFormat(tok)
  # A template that renders tool results under another role is refused too.
  tok.chat_template = chat_fixtures.CHATML.replace(
      "message['role']",
      "(message['role'] if message['role'] != 'tool' else 'user')",
  )
  with pytest.raises(ValueError, match="'tool' role"):
    chat.ChatFormat(tok)


@dataclasses.dataclass(frozen=True, eq=False)
class ChatEcho:
  """Chat-format host env: every turn gets the tool message 'turn {t}'."""

  tokenizer: object
  max_prompt_len: int = 40
  max_action_len: int = 12
  max_obs_len: int = 16
  max_turns: int = 3
  is_host = True
  seen: list = dataclasses.field(default_factory=list)

  @property
  def chat_format(self):
    return chat.make_format(self.tokenizer)

  def reset(self, task):
    return {"t": 0}, self.chat_format.prompt(
        "Be brief.", "x" * task, self.max_prompt_len
    )

  def step(self, state, text):
    self.seen.append(text)
    t = state["t"] + 1
    return (
        {"t": t},
        self.chat_format.observation(f"turn {t}", self.max_obs_len),
        (t >= self.max_turns),
    )

  def facts(self, state):
    return {
        "correct": np.bool_(False),
        "answered": np.bool_(False),
        "format_error": np.bool_(False),
        "num_tool_calls": np.int32(state["t"]),
        "num_tool_errors": np.int32(0),
        "hard": np.bool_(False),
    }


def test_host_rollout_chat_buffer_stops_and_roles(tok, fmt, policy):
  graphdef, params, cfg = policy
  # Uniform next-token distribution (final norm scale 0 -> all logits 0), so
  # that turns stop on a stop id (2 of 400 ids) as well as being cut.
  model = nnx.merge(graphdef, params)
  model.final_norm.scale[...] = 0.0
  params = nnx.state(model)

  def check(seed):
    """One rollout; asserts its buffer, returns (stopped, cut) turns."""
    env = ChatEcho(tok)
    tasks = [1, 3, 5, 2, 4, 6, 1, 2]
    traj = host_rollout.rollout(
        env,
        tasks,
        jax.random.PRNGKey(seed),
        max_len=128,
        graphdef=graphdef,
        params=params,
        model_config=cfg,
        temperature=1.0,
    )
    tokens, role, turn = (
        np.asarray(traj.tokens),
        np.asarray(traj.role),
        np.asarray(traj.turn),
    )
    length = np.asarray(traj.length)
    stopped = cut = 0
    seen = iter(env.seen)
    for b, task in enumerate(tasks):
      prompt, prompt_roles = fmt.prompt(
          "Be brief.", "x" * task, env.max_prompt_len
      )
      want, want_roles = list(prompt), list(prompt_roles)
      for k in range(int(traj.num_turns[b])):
        sampled = tokens[b][(role[b] == types.POLICY) & (turn[b] == k)].tolist()
        # A turn ends at its first stop id, or is cut at max_action_len.
        stops = [i for i, t in enumerate(sampled) if t in fmt.stop_tokens]
        if stops:
          assert stops == [len(sampled) - 1]
          stopped += 1
        else:
          assert len(sampled) == env.max_action_len
          cut += 1
        want += sampled
        want_roles += [types.POLICY] * len(sampled)
        if k + 1 < env.max_turns:
          c, cr = fmt.close_turn(sampled)
          o, orr = fmt.observation(f"turn {k + 1}", env.max_obs_len)
          want += c.tolist() + o.tolist()
          want_roles += cr.tolist() + orr.tolist()
      n = int(length[b])
      assert tokens[b, :n].tolist() == want[:n]
      assert role[b, :n].tolist() == want_roles[:n]
    # Turn-major order of the env's calls: row b's turn-k text is its decoding.
    for k in range(env.max_turns):
      for b in range(len(tasks)):
        if k < int(traj.num_turns[b]):
          ids = tokens[b][(role[b] == types.POLICY) & (turn[b] == k)]
          assert next(seen) == fmt.decode(ids)
    return stopped, cut

  # A stop id has probability 2/400 per token, so one rollout ends no turn
  # on a stop id with probability ~0.4: roll out more seeds (each fully
  # checked) until both endings have been seen.
  stopped = cut = 0
  for seed in range(4, 12):
    s, c = check(seed)
    stopped, cut = stopped + s, cut + c
    if stopped and cut:
      break
  assert stopped > 0 and cut > 0, (stopped, cut)


def test_reasoning_gym_chat_expert_episode_equals_the_whole_render(tok, fmt):
  from environments.host import reasoning_gym_env

  env = reasoning_gym_env.ReasoningGymEnv(
      dataset="basic_arithmetic",
      dataset_config=dict(min_terms=2, max_terms=2, min_digits=1, max_digits=1),
      max_prompt_len=320,
      max_action_len=32,
      max_obs_len=24,
      max_turns=3,
      expert_tool_prob=1.0,
      tokenizer=tok,
  )
  tasks = env.eval_tasks(2, 0)
  traj = host_rollout.rollout(env, tasks, jax.random.PRNGKey(0), max_len=512)
  assert np.asarray(traj.facts["correct"]).all()
  np.testing.assert_array_equal(traj.facts["num_tool_calls"], [1, 1])
  np.testing.assert_array_equal(np.asarray(traj.finish), [types.ANSWERED] * 2)
  for b, task in enumerate(tasks):
    answer = str(task.entry["answer"])
    msgs = [
        {"role": "system", "content": reasoning_gym_env.CHAT_SYSTEM_PROMPT},
        {"role": "user", "content": task.entry["question"]},
        {"role": "assistant", "content": f"```python\nprint({answer!r})\n```"},
        {"role": "tool", "content": answer},
        {"role": "assistant", "content": f"<answer>{answer}</answer>"},
    ]
    want = _render_ids(tok, msgs, False)[: -len(tok.encode("\n"))]
    n = int(traj.length[b])
    assert np.asarray(traj.tokens)[b, :n].tolist() == want
    role = np.asarray(traj.role)[b, :n]
    policy_text = tok.decode(
        np.asarray(traj.tokens)[b, :n][role == types.POLICY]
    )
    assert policy_text == (
        f"```python\nprint({answer!r})\n```<|im_end|>"
        f"<answer>{answer}</answer><|im_end|>"
    )
    tool_text = tok.decode(np.asarray(traj.tokens)[b, :n][role == types.TOOL])
    assert tool_text == answer


def test_reasoning_gym_chat_step_parses_calls_and_answers(tok):
  from environments.host import reasoning_gym_env

  env = reasoning_gym_env.ReasoningGymEnv(
      dataset="basic_arithmetic",
      dataset_config=dict(min_terms=2, max_terms=2, min_digits=1, max_digits=1),
      max_prompt_len=320,
      max_obs_len=24,
      max_turns=3,
      tokenizer=tok,
  )
  task = env.eval_tasks(1, 0)[0]
  answer = str(task.entry["answer"])
  state, _ = env.reset(task)
  call = (
      '<tool_call>{"name": "python", "arguments": {"code": "print(6*7)"}}'
      "</tool_call>"
  )
  s, (obs, roles), done = env.step(state, call)
  assert not done and s.calls == 1
  assert tok.decode(obs[roles == types.TOOL]) == "42"
  s2, _, done = env.step(s, f"So the total is {answer}.")
  assert (
      done and env.facts(s2)["correct"] and env.facts(s2)["num_tool_calls"] == 1
  )
  s3, _, _ = env.step(state, r"\boxed{" + answer + "}")
  assert env.facts(s3)["correct"]
  s4, _, _ = env.step(state, "I do not know.")
  assert env.facts(s4)["format_error"] and not env.facts(s4)["answered"]
  s5, _, _ = env.step(state, "\x00<tool_call>{")  # malformed: never raises
  assert env.facts(s5)["format_error"]


def test_bfcl_chat_prompt_and_call_formats(tok, fmt):
  pytest.importorskip("bfcl_eval")
  from environments.host import parsers
  from environments.host.bfcl import checker as bfcl_checker
  from environments.host.bfcl import single_turn as bfcl_single_turn

  env = bfcl_single_turn.BFCLEnv(
      categories=("simple",),
      max_prompt_len=1024,
      max_action_len=96,
      descriptions=True,
      tokenizer=tok,
  )
  task = env.eval_tasks(1, 0)[0]
  state, (ids, roles) = env.reset(task)
  text = tok.decode(ids)
  assert text.startswith("<|im_start|>system\nYou are an expert in composing")
  assert f'"name":"{task.functions[0]["name"]}"' in text
  assert text.endswith(
      f"<|im_start|>user\n{task.questions[0]}<|im_end|>\n"
      "<|im_start|>assistant\n"
  )
  gold = bfcl_checker.gold_calls(task.ground_truth, task.functions)
  hermes = (
      "<tool_call>"
      + json.dumps([{"name": c.name, "arguments": c.arguments} for c in gold])
      + "</tool_call>"
  )
  python = "[" + ", ".join(map(parsers.format_call_python, gold)) + "]"
  for action in (hermes, python):
    s, _, done = env.step(state, action)
    assert done and env.facts(s)["correct"] and not env.facts(s)["format_error"]
  s, _, _ = env.step(state, "Sure! The answer is 5.")
  assert env.facts(s)["format_error"] and not env.facts(s)["correct"]
  # The expert's demonstration: Hermes JSON + <|im_end|>, which the env accepts.
  demo = env.expert_action(state, None)
  assert demo[-1] == fmt.end_id
  s, _, _ = env.step(state, fmt.decode(demo))
  assert env.facts(s)["correct"]


def test_bfcl_multi_turn_chat_observations(tok, fmt):
  pytest.importorskip("bfcl_eval")
  from environments.host.bfcl import multi_turn as bfcl_multi_turn

  env = bfcl_multi_turn.BFCLMultiTurnEnv(
      max_prompt_len=4096, max_action_len=512, max_obs_len=64, tokenizer=tok
  )
  task = env.eval_tasks(1, 0)[0]
  state, (ids, _) = env.reset(task)
  assert tok.decode(ids).endswith("<|im_start|>assistant\n")
  # The expert's gold calls (BFCL syntax, positional arguments allowed).
  demo = env.expert_action(state, None)
  s, (obs, roles), _ = env.step(state, fmt.decode(demo))
  assert s.calls == len(task.ground_truth[0]) and s.errors == 0
  assert tok.decode(obs).startswith("<|im_start|>tool\n")
  # A plain reply ends the question: the next one arrives as a user message.
  s, (obs, roles), done = env.step(s, "Done.")
  if len(task.questions) > 1:
    assert not done and tok.decode(obs).startswith("<|im_start|>user\n")
    assert (
        tok.decode(obs[roles == types.PROMPT])
        == task.questions[1][: len(tok.decode(obs[roles == types.PROMPT]))]
    )


def test_config_validation_of_the_tokenizer(ckpt, tmp_path):
  from agentic_rl import validation
  from configs import default
  from configs import gsm_tool

  config = gsm_tool.get_config("smoke")
  config.model.hf_path = ckpt
  config.tokenizer = "hf"
  validation.validate_config(config)
  config.tokenizer = "sentencepiece"
  with pytest.raises(
      validation.ConfigError, match="config.tokenizer='sentencepiece'"
  ):
    validation.validate_config(config)
  config.tokenizer = "hf"
  config.model.hf_path = ""
  with pytest.raises(
      validation.ConfigError, match="needs config.model.hf_path"
  ):
    validation.validate_config(config)
  native = default.get_config("smoke")
  native.model.hf_path = ckpt
  native.tokenizer = "hf"
  with pytest.raises(validation.ConfigError, match="JAX-native"):
    validation.validate_config(native)


def _run_smoke(module, ckpt, workdir):
  from agentic_rl import train

  config = module.get_config("smoke")
  config.model.hf_path = ckpt
  config.tokenizer = "hf"
  reports = train.train_and_evaluate(config, str(workdir))
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  return reports, rows


@pytest.mark.slow
def test_bfcl_grpo_smoke_from_the_tiny_chat_checkpoint(ckpt, tmp_path):
  """configs/bfcl_grpo.py:smoke --config.model.hf_path=DIR --config.tokenizer=hf:
  SFT on the chat-format expert, 2 RL steps, evaluation."""
  pytest.importorskip("bfcl_eval")
  from configs import bfcl_grpo

  reports, rows = _run_smoke(bfcl_grpo, ckpt, tmp_path)
  rl = [r for r in rows if "rl/loss" in r]
  assert [r["step"] for r in rl] == [2, 3]
  assert all(np.isfinite(r["rl/loss"]) for r in rl)
  for r in reports.values():
    assert 0.0 <= r["accuracy"] <= 1.0 and np.isfinite(r["format_error_rate"])


@pytest.mark.slow
def test_gsm_tool_smoke_from_the_tiny_chat_checkpoint(ckpt, tmp_path):
  from configs import gsm_tool

  reports, rows = _run_smoke(gsm_tool, ckpt, tmp_path)
  rl = [r for r in rows if "rl/loss" in r]
  assert [r["step"] for r in rl] == [2, 3]
  assert all(np.isfinite(r["rl/loss"]) for r in rl)
  assert set(reports) == {"sft", "rl"}
