"""Preference pairs and per-turn labels for reward models, from environment ground truth.

Every episode here is a real episode of the environment: the gold trajectory is the
environment's expert with its imperfections switched off; negatives are (a) the same
expert under an imperfect setting (e.g. `expert_wrong_arg_prob=1`: a wrong value in
the call) and (b) token-level edits of the gold actions (answer changed, calls
dropped, a call repeated), which are then *replayed through the environment*
(`ScriptedEnv`), so observations, correctness and progress facts stay verified.

A pair (chosen, rejected) is kept only if the ground truth prefers chosen: chosen
correct and rejected not, or both correct and chosen made fewer tool calls.

Negative types:
  wrong_value   imperfect expert (expert_wrong_arg_prob = 1): a wrong argument
  extra_call    a gold call repeated (redundant), or the over-calling expert
                (tool used on an item that does not need it): equal correctness,
                more calls
  missing_call  every call turn dropped and the answer perturbed (a guess)
  ignored_obs   the answer after a tool call differs from what the tool returned
  wrong_answer  direct answer perturbed (items answered without a tool)

Per-turn labels (process supervision, from the env's `progress` fact): a tool-call
turn is good iff it advanced progress (progress[k+1] > progress[k]) on an item whose
`tool_necessary` fact holds; any other turn is good iff it is the episode's last
turn and the episode is correct.

Files: JSONL, one pair per line (`write_jsonl` / `read_jsonl`), with a `split`
field ('train' or 'test'; held-out tasks are drawn from another seed and tasks
also present in train are removed).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Iterable, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from agentic_rl.reward_models import model as rm_model
from agentic_rl.reward_models import training as rm_training
from agentic_rl import rollout
from agentic_text import tokenizers as tok
from agentic_rl import types

NEGATIVE_TYPES = (
    "wrong_value",
    "extra_call",
    "missing_call",
    "ignored_obs",
    "wrong_answer",
)


# ---------------------------------------------------------------------------
# Replaying scripted actions through an environment.
# ---------------------------------------------------------------------------


@flax.struct.dataclass
class ScriptState:
  inner: Any
  actions_ka: jax.Array  # int32 [K, A]
  lens_k: jax.Array  # int32 [K]
  k: jax.Array  # int32 [], turns taken


@dataclasses.dataclass(frozen=True)
class ScriptedEnv:
  """Wraps a JAX-native env so that its 'expert' plays a fixed script.

  Tasks are dicts {'task': inner task, 'actions': int32 [K, A], 'lens': int32 [K]};
  turn k plays actions[k, :lens[k]] (an empty turn, lens 0, is a format error).
  Everything else (observations, facts, done) is the wrapped env's.
  """

  env: Any

  def __getattr__(self, name):  # max_turns, max_action_len, ...
    if name == "env":
      raise AttributeError(name)
    return getattr(self.env, name)

  def reset(self, task):
    s, prompt, plen = self.env.reset(task["task"])
    return (
        ScriptState(s, task["actions"], task["lens"], jnp.zeros((), jnp.int32)),
        prompt,
        plen,
    )

  def step(self, state, action_tokens, action_len):
    s, obs, obs_len, done = self.env.step(
        state.inner, action_tokens, action_len
    )
    return state.replace(inner=s, k=state.k + 1), obs, obs_len, done

  def facts(self, state):
    return self.env.facts(state.inner)

  def expert_action(self, state, key):
    del key
    k = jnp.clip(state.k, 0, state.lens_k.shape[0] - 1)
    return state.actions_ka[k], state.lens_k[k]


def replay(
    env, tasks, actions: Sequence[Sequence[Sequence[int]]], max_len: int
):
  """Plays per-episode action scripts through `env`; returns a host Trajectory.

  Args:
    env: JAX-native environment.
    tasks: task pytree with leading dim B.
    actions: B scripts, each a list of up to K = env.max_turns turns (token lists,
      each <= env.max_action_len tokens).
    max_len: L.

  Returns:
    types.Trajectory (numpy leaves).

  Raises:
    ValueError: a script with more than K turns or a turn longer than A.
  """
  k, a = env.max_turns, env.max_action_len
  b = len(actions)
  acts = np.full((b, k, a), tok.PAD, np.int32)
  lens = np.zeros((b, k), np.int32)
  for i, script in enumerate(actions):
    if len(script) > k:
      raise ValueError(f"script {i} has {len(script)} turns > max_turns={k}")
    for j, turn in enumerate(script):
      if len(turn) > a:
        raise ValueError(f"script {i} turn {j} has {len(turn)} tokens > {a}")
      acts[i, j, : len(turn)] = turn
      lens[i, j] = len(turn)
  wrapped = {
      "task": tasks,
      "actions": jnp.asarray(acts),
      "lens": jnp.asarray(lens),
  }
  traj = rollout.rollout_jit(
      ScriptedEnv(env), wrapped, jax.random.key(0), max_len=max_len
  )
  return jax.device_get(traj)


def expert_trajectories(env, tasks, key, max_len: int):
  """Episodes of `env`'s own expert (its imperfection settings apply); host Trajectory."""
  return jax.device_get(rollout.rollout_jit(env, tasks, key, max_len=max_len))


def actions_of(traj, i: int) -> list[list[int]]:
  """The POLICY tokens of episode i, one list per turn."""
  role, turn, tokens = traj.role[i], traj.turn[i], traj.tokens[i]
  out = []
  for k in range(int(traj.num_turns[i])):
    sel = (role == types.POLICY) & (turn == k)
    out.append([int(t) for t in tokens[sel]])
  return out


# ---------------------------------------------------------------------------
# Labels and token edits.
# ---------------------------------------------------------------------------


def turn_labels(
    facts: dict[str, np.ndarray], num_turns: np.ndarray
) -> np.ndarray:
  """Per-turn labels float32 [B, K] from progress facts (module docstring).

  Args:
    facts: host facts with 'progress' [B, K+1], 'tool_call_turn' [B, K],
      'correct' [B] and optionally 'tool_necessary' [B] (default True).
    num_turns: int [B].
  """
  prog = np.asarray(facts["progress"], np.float32)
  call = np.asarray(facts["tool_call_turn"], bool)
  b, k = call.shape
  need = np.asarray(facts.get("tool_necessary", np.ones((b,), bool)), bool)
  advanced = prog[:, 1:] > prog[:, :-1]
  last = np.arange(k)[None, :] == (np.asarray(num_turns)[:, None] - 1)
  correct = np.asarray(facts["correct"], bool)[:, None]
  lab = np.where(call, advanced & need[:, None], last & correct)
  lab &= np.arange(k)[None, :] < np.asarray(num_turns)[:, None]
  return lab.astype(np.float32)


_DIGITS = set(range(ord("0"), ord("9") + 1))
_LETTERS = set(range(ord("a"), ord("z") + 1))


def perturb_answer(
    action: Sequence[int], rng: np.random.Generator
) -> list[int]:
  """Changes the last digit (or lowercase letter) of an answer turn to another one.

  Returns the edited copy; the action unchanged if it has no digit or letter.
  """
  out = list(action)
  for j in range(len(out) - 1, -1, -1):
    t = out[j]
    if t in _DIGITS:
      out[j] = ord("0") + (t - ord("0") + int(rng.integers(1, 10))) % 10
      return out
    if t in _LETTERS:
      out[j] = ord("a") + (t - ord("a") + int(rng.integers(1, 26))) % 26
      return out
  return out


def _is_call(action: Sequence[int]) -> bool:
  return len(action) > 0 and action[0] == tok.CALL


def edits(
    gold: list[list[int]], max_turns: int, rng: np.random.Generator
) -> list[tuple[str, list[list[int]]]]:
  """Token-level negatives of a gold script (list of (type, script)).

  ignored_obs / wrong_answer: last turn's answer perturbed (after calls / without);
  missing_call: calls dropped and the answer perturbed (only if there were calls);
  extra_call: the last call repeated (if a turn is left).
  """
  out = []
  if not gold or _is_call(gold[-1]):
    return out
  calls = [t for t in gold if _is_call(t)]
  ans = perturb_answer(gold[-1], rng)
  if ans != gold[-1]:
    out.append(("ignored_obs" if calls else "wrong_answer", gold[:-1] + [ans]))
    if calls:
      out.append(
          ("missing_call", [t for t in gold[:-1] if not _is_call(t)] + [ans])
      )
  if calls and len(gold) + 1 <= max_turns:
    i = max(j for j, t in enumerate(gold) if _is_call(t))
    out.append(("extra_call", gold[: i + 1] + [gold[i]] + gold[i + 1 :]))
  return out


# ---------------------------------------------------------------------------
# Episode records and pairs.
# ---------------------------------------------------------------------------


def episode_record(traj, labels_bk: np.ndarray, i: int) -> dict[str, Any]:
  """JSON-able record of episode i of a host Trajectory."""
  n = int(traj.length[i])
  f = traj.facts
  return {
      "tokens": [int(x) for x in traj.tokens[i, :n]],
      "role": [int(x) for x in traj.role[i, :n]],
      "turn": [int(x) for x in traj.turn[i, :n]],
      "num_turns": int(traj.num_turns[i]),
      "finish": int(traj.finish[i]),
      "correct": bool(f["correct"][i]),
      "num_tool_calls": int(f["num_tool_calls"][i]),
      "turn_labels": [float(x) for x in labels_bk[i]],
  }


def _prefers(c: dict, r: dict) -> bool:
  """Ground truth prefers c over r."""
  if c["correct"] != r["correct"]:
    return c["correct"]
  return c["correct"] and c["num_tool_calls"] < r["num_tool_calls"]


def _task_keys(tasks) -> list[tuple]:
  leaves = [
      np.asarray(x).reshape(np.asarray(x).shape[0], -1)
      for x in jax.tree.leaves(tasks)
  ]
  return [
      tuple(np.concatenate([l[i] for l in leaves]).tolist())
      for i in range(leaves[0].shape[0])
  ]


def build_pairs(
    env,
    tasks,
    key,
    *,
    max_len: int,
    imperfect: dict[str, dict[str, Any]],
    seed: int = 0,
    split: str = "train",
) -> list[dict[str, Any]]:
  """Preference pairs for a batch of tasks.

  Args:
    env: the environment (a dataclass; its expert is made perfect for the gold
      episodes by setting every `expert_*_prob` field to 0).
    tasks: task pytree [B].
    key: PRNG key for the imperfect experts.
    max_len: L.
    imperfect: {negative type: env field overrides} for imperfect experts, e.g.
      {'wrong_value': {'expert_wrong_arg_prob': 1.0}} (applied on top of the
      perfect expert).
    seed: numpy seed of the token edits.
    split: stored in every record.

  Returns:
    list of {'split', 'type', 'task_index', 'chosen', 'rejected'} records.
  """
  probs = {
      f.name: 0.0
      for f in dataclasses.fields(env)
      if f.name.startswith("expert_") and f.name.endswith("_prob")
  }
  for name in ("expert_undercall_prob", "expert_overcall_prob"):
    if (
        name in probs and getattr(env, name) < 0
    ):  # arithmetic: -1 = use imperfect_prob
      probs[name] = -1.0
  perfect = dataclasses.replace(env, **probs)
  rng = np.random.default_rng(seed)
  gold = expert_trajectories(perfect, tasks, key, max_len)
  gold_lab = turn_labels(gold.facts, gold.num_turns)
  b = gold.tokens.shape[0]
  gold_rec = [episode_record(gold, gold_lab, i) for i in range(b)]
  pairs = []

  def add(kind, traj, idx):
    lab = turn_labels(traj.facts, traj.num_turns)
    for j, i in enumerate(idx):
      r = episode_record(traj, lab, j)
      if r["tokens"] != gold_rec[i]["tokens"] and _prefers(gold_rec[i], r):
        pairs.append(
            {
                "split": split,
                "type": kind,
                "task_index": int(i),
                "chosen": gold_rec[i],
                "rejected": r,
            }
        )

  for j, (kind, overrides) in enumerate(sorted(imperfect.items())):
    env_j = dataclasses.replace(perfect, **overrides)
    traj = expert_trajectories(
        env_j, tasks, jax.random.fold_in(key, j + 1), max_len
    )
    add(kind, traj, range(b))
  scripts, owners, kinds = [], [], []
  for i in range(b):
    for kind, script in edits(actions_of(gold, i), env.max_turns, rng):
      scripts.append(script)
      owners.append(i)
      kinds.append(kind)
  for kind in sorted(set(kinds)):
    idx = [o for o, k in zip(owners, kinds) if k == kind]
    sc = [s for s, k in zip(scripts, kinds) if k == kind]
    sub = jax.tree.map(lambda x: x[np.asarray(idx)], tasks)
    # Pad to B rows so every replay shares one compiled program.
    pad = b - len(idx)
    if pad > 0:
      sub = jax.tree.map(
          lambda x: np.concatenate([x, np.repeat(x[:1], pad, 0)]), sub
      )
      sc = sc + [sc[0]] * pad
    traj = replay(env, sub, sc, max_len)
    traj = jax.tree.map(lambda x: x[: len(idx)], traj)
    add(kind, traj, idx)
  return pairs


def build_dataset(
    env,
    *,
    num_train_tasks: int,
    num_test_tasks: int,
    seed: int,
    max_len: int,
    imperfect: dict[str, dict[str, Any]],
    chunk: int = 256,
) -> list[dict[str, Any]]:
  """Train and held-out pairs; held-out tasks seen in train are dropped.

  Tasks come from env.sample_tasks with keys fold_in(key(seed), 0 / 1); they are
  processed in chunks of `chunk` tasks (one compiled program per chunk shape).
  """
  root = jax.random.key(seed)
  out = []
  seen = set()
  for split, n, sk in (
      ("train", num_train_tasks, 0),
      ("test", num_test_tasks, 1),
  ):
    tasks = jax.device_get(env.sample_tasks(jax.random.fold_in(root, sk), n))
    keys = _task_keys(tasks)
    if split == "train":
      seen = set(keys)
      keep = np.arange(n)
    else:
      keep = np.asarray([i for i in range(n) if keys[i] not in seen], np.int64)
    for c0 in range(0, len(keep), chunk):
      idx = keep[c0 : c0 + chunk]
      if len(idx) < chunk:  # pad to the chunk shape, drop the padding's pairs
        idx_p = np.concatenate([idx, np.repeat(idx[:1], chunk - len(idx))])
      else:
        idx_p = idx
      sub = jax.tree.map(lambda x: np.asarray(x)[idx_p], tasks)
      pairs = build_pairs(
          env,
          sub,
          jax.random.fold_in(root, 100 + sk * 1000 + c0),
          max_len=max_len,
          imperfect=imperfect,
          seed=seed * 7919 + sk * 1000 + c0,
          split=split,
      )
      out += [p for p in pairs if p["task_index"] < len(idx)]
  return out


def write_jsonl(path: str, records: Iterable[dict[str, Any]]) -> None:
  """Writes one JSON object per line (atomically: temp file then rename)."""
  tmp = path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    for r in records:
      f.write(json.dumps(r, separators=(",", ":")) + "\n")
  os.replace(tmp, path)


def read_jsonl(path: str) -> list[dict[str, Any]]:
  """Reads the records written by `write_jsonl`."""
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]


# ---------------------------------------------------------------------------
# Batches for the reward models (reward_models.model, reward_models.training).
# ---------------------------------------------------------------------------


def episodes_to_batch(records: Sequence[dict], max_len: int, num_turns_k: int):
  """EpisodeBatch (numpy) from episode records; sequences right-padded to L.

  Raises:
    ValueError: a record longer than max_len.
  """
  b = len(records)
  tokens = np.full((b, max_len), tok.PAD, np.int32)
  turn = np.full((b, max_len), -1, np.int32)
  mask = np.zeros((b, max_len), bool)
  labels = np.zeros((b, num_turns_k), np.float32)
  score = np.zeros((b,), np.float32)
  for i, r in enumerate(records):
    n = len(r["tokens"])
    if n > max_len:
      raise ValueError(f"episode of {n} tokens > max_len={max_len}")
    tokens[i, :n] = r["tokens"]
    turn[i, :n] = r["turn"]
    mask[i, :n] = True
    labels[i, : len(r["turn_labels"])] = r["turn_labels"][:num_turns_k]
    score[i] = float(r["correct"])
  boundary, tmask = rm_model.turn_boundaries(jnp.asarray(turn), num_turns_k)
  return rm_model.EpisodeBatch(
      tokens=tokens,
      mask=mask,
      boundary=np.asarray(boundary),
      turn_mask=np.asarray(tmask),
      turn_labels=labels,
      score=score,
  )


def pairs_to_batch(
    pairs: Sequence[dict], max_len: int, num_turns_k: int, margin: float = 0.0
):
  """PairBatch (numpy) from pair records; margin float32 [B] filled with `margin`."""
  return rm_training.PairBatch(
      chosen=episodes_to_batch(
          [p["chosen"] for p in pairs], max_len, num_turns_k
      ),
      rejected=episodes_to_batch(
          [p["rejected"] for p in pairs], max_len, num_turns_k
      ),
      margin=np.full((len(pairs),), margin, np.float32),
  )


def trajectory_to_batch(traj, num_turns_k: int):
  """EpisodeBatch (numpy) of a host Trajectory (e.g. policy samples)."""
  labels = turn_labels(traj.facts, traj.num_turns)
  mask = np.asarray(traj.role) != types.PAD
  boundary, tmask = rm_model.turn_boundaries(
      jnp.asarray(traj.turn), num_turns_k
  )
  return rm_model.EpisodeBatch(
      tokens=np.asarray(traj.tokens, np.int32),
      mask=mask,
      boundary=np.asarray(boundary),
      turn_mask=np.asarray(tmask),
      turn_labels=labels,
      score=np.asarray(traj.facts["correct"], np.float32),
  )
