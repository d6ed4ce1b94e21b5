"""Shared test helpers: tiny models and environments, one trajectory builder
(`trajectory`), one environment driver (`EnvDriver` / `env_driver`), one config
shrinker (`shrink`), the 8-device subprocess runner and the RL state+step builder.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import subprocess
import sys

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from agentic_text import tokenizers
from agentic_rl import types
from agentic_rl.models import transformer

TINY = transformer.TransformerConfig(
    vocab_size=tokenizers.VOCAB_SIZE,
    d_model=32,
    num_layers=2,
    num_heads=2,
    head_dim=16,
    ffn_dim=64,
)


def tiny_policy(seed: int = 0, cfg: transformer.TransformerConfig = TINY):
  """(graphdef, params, cfg) of a randomly initialised tiny transformer."""
  model = transformer.Transformer(cfg, nnx.Rngs(params=seed))
  graphdef, params = nnx.split(model)
  return graphdef, params, cfg


@flax.struct.dataclass
class EchoState:
  turn: jax.Array
  calls: jax.Array


@dataclasses.dataclass(frozen=True)
class EchoEnv:
  """Accepts any action; answers every turn with an observation of 1 + turn % 3
  tokens; the episode ends after `max_turns` turns (never 'answered').

  Exercises multi-turn cache appends of ragged observations with any policy,
  including a random one.
  """

  max_prompt_len: int = 6
  max_action_len: int = 5
  max_obs_len: int = 3
  max_turns: int = 3

  def sample_tasks(self, key, n):
    return jax.random.randint(key, (n,), 1, self.max_prompt_len + 1)

  def eval_tasks(self, n, seed):
    return self.sample_tasks(jax.random.PRNGKey(seed), n)

  def reset(self, task):
    prompt = jnp.full((self.max_prompt_len,), tokenizers.PAD, jnp.int32)
    prompt = jnp.where(jnp.arange(self.max_prompt_len) < task, 65, prompt)
    prompt = prompt.at[0].set(tokenizers.BOS)
    return EchoState(jnp.int32(0), jnp.int32(0)), prompt, task.astype(jnp.int32)

  def step(self, state, action_tokens, action_len):
    del action_tokens, action_len
    obs_len = 1 + state.turn % 3
    obs = jnp.where(
        jnp.arange(self.max_obs_len) < obs_len, 48 + state.turn, tokenizers.PAD
    )
    turn = state.turn + 1
    return (
        EchoState(turn, state.calls + 1),
        obs.astype(jnp.int32),
        obs_len,
        (turn >= self.max_turns),
    )

  def facts(self, state):
    return {
        "correct": jnp.bool_(False),
        "answered": jnp.bool_(False),
        "format_error": jnp.bool_(False),
        "num_tool_calls": state.calls,
        "num_tool_errors": jnp.int32(0),
    }

  def expert_action(self, state, key):
    del state, key
    a = jnp.full((self.max_action_len,), tokenizers.PAD, jnp.int32)
    return a.at[0].set(66).at[1].set(tokenizers.CALL_END), jnp.int32(2)


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_on_8_devices(script: str, *args: str) -> str:
  """Runs `script` (argv `args`) in a fresh Python with 8 simulated CPU
  devices; returns its stdout.

  A subprocess, because the device count is fixed when JAX starts. Fails the
  calling test with the tail of stderr when the script exits non-zero.
  """
  # The device count replaces the parent's XLA_FLAGS; the backend
  # optimisation level the default tier sets (tests/conftest.py) is kept.
  keep = [
      f
      for f in os.environ.get("XLA_FLAGS", "").split()
      if f.startswith("--xla_backend_optimization_level=")
  ]
  env = dict(
      os.environ,
      XLA_FLAGS=" ".join(["--xla_force_host_platform_device_count=8"] + keep),
      JAX_PLATFORMS="cpu",
      PYTHONPATH=REPO,
  )
  proc = subprocess.run(
      [sys.executable, "-c", script, *args],
      env=env,
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=1800,
  )
  assert proc.returncode == 0, proc.stderr[-4000:]
  return proc.stdout


def rl_state_and_step(config):
  """Validated config -> (RL-phase TrainState at step 0, jitted GRPO step)."""
  from agentic_rl import learner  # pylint: disable=g-import-not-at-top
  from agentic_rl import train  # pylint: disable=g-import-not-at-top
  from configs import schema  # pylint: disable=g-import-not-at-top

  config = schema.with_defaults(config)
  train.validation.validate_config(config)
  env = train.make_env(config)
  model_cfg = train.make_model_config(config)
  graphdef, state = train.init_state(config, model_cfg)
  state = train.start_rl(config, state)
  step = learner.make_rl_step(
      config, env, graphdef, learner.make_optimizer(config.rl), model_cfg
  )
  return state, step


# -- One trajectory builder ------------------------------------------------------


def _segments_to_rows(segments, width):
  """(role, turn) rows of `width` from [(role, turn, count)], padded PAD / -1."""
  role, turn = [], []
  for r, k, n in segments:
    role += [r] * n
    turn += [k] * n
  assert len(role) <= width, (len(role), width)
  return role + [types.PAD] * (width - len(role)), turn + [-1] * (
      width - len(turn)
  )


def trajectory(
    facts=None,
    *,
    segments=None,
    batch=None,
    width=1,
    tokens=0,
    role=types.PAD,
    turn=0,
    logprob=0.0,
    length=None,
    num_turns=1,
    finish=types.ANSWERED,
    group=0,
) -> types.Trajectory:
  """A types.Trajectory from a short spec; every field may be a scalar.

  Args:
    facts: name -> array with a leading batch axis (stored as jnp arrays).
    segments: per episode a list of (role, turn, count) runs, e.g.
      [(PROMPT, -1, 2), (POLICY, 0, 3)]; sets `role` and `turn` (PAD and -1 after
      the runs) and overrides those arguments.
    batch: episodes B; default from `segments`, else the leading axis of the
      first fact, else of the first array among the other arguments.
    width: tokens per row L, when no [B, L] array fixes it.
    tokens, role, turn, logprob: [B, L] arrays or scalars broadcast to [B, L].
    length, num_turns, finish, group: [B] arrays or scalars broadcast to [B];
      length defaults to L (every row full).

  Returns:
    A Trajectory with int32 tokens / turn / per-episode fields, int8 role and
    float32 logprob.
  """
  facts = {} if facts is None else dict(facts)
  if segments is not None:
    width = max([width, *(sum(n for _, _, n in s) for s in segments)])
    role, turn = zip(*[_segments_to_rows(s, width) for s in segments])
  arrays = [
      a
      for a in (tokens, role, turn, logprob, length, num_turns, finish, group)
      if a is not None and jnp.ndim(jnp.asarray(a)) > 0
  ]
  if batch is None:
    if segments is not None:
      batch = len(segments)
    elif facts:
      batch = jnp.shape(jnp.asarray(next(iter(facts.values()))))[0]
    else:
      batch = jnp.shape(jnp.asarray(arrays[0]))[0]
  for a in (tokens, role, turn, logprob):
    if jnp.ndim(jnp.asarray(a)) == 2:
      width = jnp.shape(jnp.asarray(a))[1]

  def rows(x, dtype):
    return jnp.broadcast_to(jnp.asarray(x, dtype), (batch, width))

  def per_episode(x, dtype):
    return jnp.broadcast_to(jnp.asarray(x, dtype), (batch,))

  return types.Trajectory(
      tokens=rows(tokens, jnp.int32),
      role=rows(role, jnp.int8),
      turn=rows(turn, jnp.int32),
      logprob=rows(logprob, jnp.float32),
      length=per_episode(width if length is None else length, jnp.int32),
      num_turns=per_episode(num_turns, jnp.int32),
      finish=per_episode(finish, jnp.int32),
      group=per_episode(group, jnp.int32),
      facts={k: jnp.asarray(v) for k, v in facts.items()},
  )


# -- One environment driver ------------------------------------------------------


@dataclasses.dataclass
class Episode:
  """What EnvDriver.run saw: final facts (host arrays), per step the decoded
  observation and the done flag, and the decoded prompt (ids and length too)."""

  facts: dict
  obs: list
  dones: list
  prompt: str
  prompt_ids: jax.Array
  prompt_len: jax.Array

  @property
  def done(self) -> bool:
    """The last step's done flag (False before any step)."""
    return self.dones[-1] if self.dones else False


class EnvDriver:
  """Steps one JAX environment through a scripted action sequence.

  reset / step / facts are jitted once per driver: make one driver per
  environment (module level, or `env_driver(env)`, which caches one per
  environment so test modules share the compiled programs).
  """

  def __init__(self, env, tokenizer=None):
    self.env = env
    self.tok = tokenizer or tokenizers.ByteTokenizer()
    self.reset = jax.jit(env.reset)
    self.step = jax.jit(env.step)
    self.facts = jax.jit(env.facts)

  def action(self, ids, width=None):
    """(tokens [A] int32 PAD-padded to the env's max_action_len, length)."""
    ids = list(ids)
    width = self.env.max_action_len if width is None else width
    assert len(ids) <= width, (len(ids), width)
    return (
        jnp.array(ids + [tokenizers.PAD] * (width - len(ids)), jnp.int32),
        jnp.int32(len(ids)),
    )

  def call(self, text, end=tokenizers.CALL_END):
    """A tool call `<call>text<end>` (end=None: no closing token)."""
    return self.action(
        [tokenizers.CALL, *self.tok.encode(text)]
        + ([end] if end is not None else [])
    )

  def answer(self, text, end=tokenizers.ANSWER_END):
    """A final answer `<answer>text<end>` (end=None: no closing token)."""
    return self.action(
        [tokenizers.ANSWER, *self.tok.encode(text)]
        + ([end] if end is not None else [])
    )

  def run(self, task, actions) -> Episode:
    """Resets on `task`, then steps every (tokens, length) action in order."""
    state, prompt, plen = self.reset(task)
    obs, dones = [], []
    for act in actions:
      state, o, olen, done = self.step(state, *act)
      obs.append(self.tok.decode(np.asarray(o)[: int(olen)]))
      dones.append(bool(done))
    return Episode(
        jax.device_get(self.facts(state)),
        obs,
        dones,
        self.tok.decode(np.asarray(prompt)[: int(plen)]),
        prompt,
        plen,
    )


@functools.lru_cache(maxsize=None)
def env_driver(env) -> EnvDriver:
  """The shared EnvDriver of a (hashable, frozen-dataclass) environment."""
  return EnvDriver(env)


# -- One config shrinker ---------------------------------------------------------


def shrink(
    config,
    *,
    sft_steps=None,
    sft_batch=None,
    rl_steps=None,
    rl_batch=None,
    group_size=None,
    num_minibatches=None,
    eval_tasks=None,
    eval_samples=None,
    pass_k=None,
    checkpoint_every=None,
    model=None,
    **top,
):
  """Shrinks an experiment config in place for a test run; returns it.

  Sets only the fields given: sft.steps / batch_size, rl.steps / batch_size /
  group_size / num_minibatches, eval.num_tasks / num_samples / pass_k,
  checkpoint.every_steps, model
  fields from the `model` dict (e.g. RM_TINY), and top-level fields from `top`
  (e.g. halt_after_step=3, log_every_steps=1).
  """
  for section, field, value in (
      ("sft", "steps", sft_steps),
      ("sft", "batch_size", sft_batch),
      ("rl", "steps", rl_steps),
      ("rl", "batch_size", rl_batch),
      ("rl", "group_size", group_size),
      ("rl", "num_minibatches", num_minibatches),
      ("eval", "num_tasks", eval_tasks),
      ("eval", "num_samples", eval_samples),
      ("eval", "pass_k", pass_k),
      ("checkpoint", "every_steps", checkpoint_every),
  ):
    if value is not None:
      config[section][field] = value
  if model is not None:
    config.model.update(model)
  for field, value in top.items():
    config[field] = value
  return config


def toy_pairs(n=8, l=6, k=2):
  """Separable toy reward-model pairs: n bodies of l random tokens in [0, 50);
  chosen sequences end in token 65, rejected ones in 66.

  Turns are [-1, -1, 0, 0, 1, 1] (l = 6) at horizon k >= 2; turn labels are 1
  for turn 0, the episode's label (chosen 1, rejected 0) for turn 1 and 0 for
  turns >= 2; scores are the labels; margins 0. Returns a reward_models.training.PairBatch
  of numpy arrays.
  """
  from agentic_rl.reward_models import model as rm_model  # pylint: disable=g-import-not-at-top
  from agentic_rl.reward_models import training as rm_training  # pylint: disable=g-import-not-at-top

  rng = np.random.default_rng(0)
  body = rng.integers(0, 50, (n, l)).astype(np.int32)
  chosen, rejected = body.copy(), body.copy()
  chosen[:, -1], rejected[:, -1] = 65, 66
  turn = np.array([[-1, -1, 0, 0, 1, 1]] * n, np.int32)
  boundary, tmask = rm_model.turn_boundaries(jnp.asarray(turn), k)

  def ep(tokens, last_label):
    labels = np.zeros((n, k), np.float32)
    labels[:, 0], labels[:, 1] = 1.0, last_label
    return rm_model.EpisodeBatch(
        tokens=tokens,
        mask=np.ones((n, l), bool),
        boundary=np.asarray(boundary),
        turn_mask=np.asarray(tmask),
        turn_labels=labels,
        score=np.full((n,), last_label, np.float32),
    )

  return rm_training.PairBatch(
      chosen=ep(chosen, 1.0),
      rejected=ep(rejected, 0.0),
      margin=np.zeros((n,), np.float32),
  )
