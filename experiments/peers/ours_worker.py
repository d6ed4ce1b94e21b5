"""Our engine's process of experiments/bench_peers.py (our pinned environment).

Reads the spec (JSON) on stdin, builds the GRPO iteration from
configs/default.py with the overrides of `ours_config`
(`learner.make_rl_step`: rollout with the KV cache, rewards, advantages,
reference log-probs and the AdamW update, one jitted XLA program) on the
one-turn `BenchEnv`, with the policy and reference imported from the
benchmark's HF folder (config.model.hf_path), runs warmup_iters untimed
iterations, measures the float32 matmul rate (jax.numpy), runs `iters` timed
iterations (each blocked on its metrics) and prints one `RESULT {json}` line.
`write_model_folder` draws the benchmark model for all engines.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time

sys.path.insert(
    0,
    os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ),
)
import agentic_rl  # pylint: disable=g-import-not-at-top
from flax import nnx  # pylint: disable=g-import-not-at-top
import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top

from agentic_rl import learner  # pylint: disable=g-import-not-at-top
from agentic_rl import sharding  # pylint: disable=g-import-not-at-top
from agentic_rl import train  # pylint: disable=g-import-not-at-top
from agentic_rl.models import hf  # pylint: disable=g-import-not-at-top
from agentic_rl.models import transformer  # pylint: disable=g-import-not-at-top
from configs import default  # pylint: disable=g-import-not-at-top
from configs import schema  # pylint: disable=g-import-not-at-top
from experiments.peers import common  # pylint: disable=g-import-not-at-top


@dataclasses.dataclass(frozen=True)
class BenchEnv:
  """One-turn JAX-native environment of the benchmark (environments/base.py).

  A task is an index into `prompts` (fixed token ids); the policy writes one
  turn of exactly `max_action_len` tokens (no stop tokens: `stop_tokens` is
  empty); the turn ends the episode. Facts: 'call_score' = the share of the
  turn's tokens with an even id (common.text_reward's count; the reward,
  rewards.components.call_score_reward), 'correct' = any such token, and the protocol's required facts (answered,
  no format error, no tool calls).
  """

  prompts: tuple  # [num_prompts][P] token ids
  max_action_len: int
  max_obs_len: int = 1
  max_turns: int = 1
  stop_tokens: tuple = ()

  @property
  def max_prompt_len(self) -> int:
    return len(self.prompts[0])

  def _table(self):
    return jnp.asarray(self.prompts, jnp.int32)

  def sample_tasks(self, key, n):
    del key
    return jnp.arange(n, dtype=jnp.int32) % len(self.prompts)

  def eval_tasks(self, n, seed):
    del seed
    return self.sample_tasks(None, n)

  def reset(self, task):
    state = dict(count=jnp.int32(0), done=jnp.bool_(False))
    return state, self._table()[task], jnp.int32(self.max_prompt_len)

  def step(self, state, action_tokens, action_len):
    del state
    pos = jnp.arange(action_tokens.shape[0])
    even = action_tokens % common.REWARD_MODULUS == 0
    count = jnp.sum(even & (pos < action_len))
    obs = jnp.zeros((self.max_obs_len,), jnp.int32)
    done = jnp.bool_(True)
    return (
        dict(count=count.astype(jnp.int32), done=done),
        obs,
        jnp.int32(0),
        done,
    )

  def facts(self, state):
    return dict(
        correct=state["count"] > 0,
        answered=state["done"],
        format_error=jnp.bool_(False),
        num_tool_calls=jnp.int32(0),
        num_tool_errors=jnp.int32(0),
        call_score=state["count"].astype(jnp.float32) / self.max_action_len,
    )

  def expert_action(self, state, key):
    del state, key
    return jnp.zeros((self.max_action_len,), jnp.int32), jnp.int32(0)


def ours_config(spec: dict, folder: str):
  """configs/default.py with the benchmark's overrides (schema-complete)."""

  config = schema.with_defaults(default.get_config())
  config.name = "bench_peers"
  config.max_len = spec["prompt_len"] + spec["new_tokens"]
  config.model.hf_path = folder
  config.sft.steps = 0
  rl = config.rl
  rl.batch_size = spec["episodes"]
  rl.group_size = spec["group_size"]
  rl.num_minibatches = 1
  rl.num_microbatches = spec.get("micro_batches", 1)
  # The whole prompt once per group (bench_peers --shared_prefix).
  rl.shared_prefix_len = spec["prompt_len"] if spec.get("shared_prefix") else 0
  rl.ppo_epochs = 1
  rl.learning_rate = spec["learning_rate"]
  rl.warmup_steps = 0
  rl.temperature = 1.0
  rl.kl_estimator = "k3"
  rl.kl_coef = spec["beta"]
  rl.behaviour_logprobs = "sampler"
  rl.rewards = dict(call_score=1.0)
  return config


def run_ours(spec: dict) -> dict:
  """Our engine's process: build, warm up, matmul rate, timed iterations."""

  config = ours_config(spec, spec["folder"])
  # Built and run under the ambient mesh of every device, as train.py runs
  # (rows over 'data'); the matmul rate is measured outside it, on one
  # device (under the mesh its product ran replicated on every device).
  mesh = sharding.make_mesh(config.mesh)
  env = BenchEnv(
      prompts=tuple(tuple(p) for p in spec["prompts"]),
      max_action_len=spec["new_tokens"],
  )
  model_cfg = train.make_model_config(config)
  with jax.set_mesh(mesh):
    graphdef, state = train.init_state(config, model_cfg, mesh)
    state = train.start_rl(config, state)
    params = transformer.count_params(state.params)
    step = learner.make_rl_step(
        config, env, graphdef, learner.make_optimizer(config.rl), model_cfg
    )
    t0 = time.perf_counter()
    for _ in range(spec["warmup_iters"]):
      state, m = step(state)
      jax.block_until_ready(m)
    warmup_s = time.perf_counter() - t0
  n = spec["matmul_n"]
  a = jnp.asarray(np.random.default_rng(0).standard_normal((n, n)), jnp.float32)
  mm = jax.jit(jnp.matmul)
  rate = common.matmul_rate(lambda: mm(a, a).block_until_ready(), n)
  r0 = common.rusage()
  times = []
  with jax.set_mesh(mesh):
    for _ in range(spec["iters"]):
      t0 = time.perf_counter()
      state, m = step(state)
      jax.block_until_ready(m)
      times.append(time.perf_counter() - t0)
  r1 = common.rusage()
  m = {k: float(v) for k, v in jax.device_get(m).items()}
  return dict(
      engine="ours",
      version=f"jax {jax.__version__}",
      threads=common.xla_threads(os.cpu_count(), jax.device_count()),
      allocator=f"{common.allocator_in_use()}; agentic_rl {agentic_rl.HOST_MEMORY}",
      params=params,
      warmup_s=warmup_s,
      matmul_flops=rate,
      completion_tokens=f"mean {m['policy_tokens']:.1f}",
      reward=m["reward"],
      kl=m["kl"],
      user_s_per_iter=(r1["user_s"] - r0["user_s"]) / len(times),
      sys_s_per_iter=(r1["sys_s"] - r0["sys_s"]) / len(times),
      peak_rss_gb=r1["peak_rss_gb"],
      accumulation=(
          f"{config.rl.num_microbatches} x "
          f"{config.rl.batch_size // config.rl.num_microbatches} episodes"
          + (
              f"; shared prefix {config.rl.shared_prefix_len} tokens"
              if config.rl.shared_prefix_len
              else ""
          )
      ),
      **common.summary(times),
  )


def write_model_folder(folder: str, model: dict, max_positions: int) -> int:
  """Draws the benchmark model with our initialiser (seed 0) and writes it
  as an HF Qwen2ForCausalLM folder with the benchmark tokenizer; returns its
  parameter count."""

  cfg = transformer.TransformerConfig(
      qkv_bias=True,
      tie_embeddings=True,
      max_positions=max_positions,
      **model,
  )
  params = nnx.state(transformer.Transformer(cfg, nnx.Rngs(params=0)))
  hf.save_pretrained(folder, cfg, params)
  common.write_tokenizer(folder, model["vocab_size"])
  return transformer.count_params(params)


def main() -> None:
  common.emit(run_ours(common.read_spec()))


if __name__ == "__main__":
  main()
