"""tunix's process of experiments/bench_peers.py (runs in the tunix virtualenv).

Reads the spec (JSON) on stdin, trains with tunix's GRPOLearner on an
RLCluster for warmup_iters + iters global steps, prints one `RESULT {json}`
line. Actor and reference are two Qwen2 models loaded from the benchmark's HF
folder (tunix.models.qwen2.params.create_model_from_safe_tensors); actor,
reference and rollout share one CPU mesh (so the rollout uses the actor's
weights, nothing is synced). One global step is one GRPO iteration: the
'vanilla' rollout (tunix's jitted prefill + decode loop with a KV cache of
prompt_len + new_tokens positions), rewards and advantages on the host, the
reference log-probs, and one optimizer step on the whole batch
(mini-batch = full batch, num_iterations 1; spec["micro_batches"]
micro-batches of the training and reference passes, 1 by default). An iteration is
timed from the end of one global step to the end of the next, each global
step ended by blocking on the actor's parameters; the float32 matmul rate
(jax.numpy) is measured after the last warm-up step.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
from experiments.peers import common  # pylint: disable=g-import-not-at-top


def observed_accumulation(cluster) -> float:
  """Trainer loop iterations per optimizer update of the actor's trainer
  (tunix PeftTrainer's private counters `_iter_steps` / `_train_steps`; NaN
  if they moved)."""
  trainer = getattr(cluster, "actor_trainer", None)
  iters = getattr(trainer, "_iter_steps", None)
  steps = getattr(trainer, "_train_steps", None)
  if not iters or not steps:
    return float("nan")
  return iters / steps


def main() -> None:
  spec = common.read_spec()
  from importlib import metadata  # pylint: disable=g-import-not-at-top

  from flax import nnx  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from tunix.models.qwen2 import model as qwen2_lib  # pylint: disable=g-import-not-at-top
  from tunix.models.qwen2 import params as qwen2_params  # pylint: disable=g-import-not-at-top
  from tunix.rl import rl_cluster as rl_cluster_lib  # pylint: disable=g-import-not-at-top
  from tunix.rl.grpo import grpo_learner  # pylint: disable=g-import-not-at-top
  from tunix.rl.rollout import base_rollout  # pylint: disable=g-import-not-at-top

  folder, n_new = spec["folder"], spec["new_tokens"]
  p_len = spec["prompt_len"]
  micro = spec.get("micro_batches", 1)
  n_prompts = spec["num_prompts"]
  warmup, iters = spec["warmup_iters"], spec["iters"]
  m = spec["model"]
  cfg = qwen2_lib.ModelConfig(
      num_layers=m["num_layers"],
      vocab_size=m["vocab_size"],
      embed_dim=m["d_model"],
      hidden_dim=m["ffn_dim"],
      num_heads=m["num_heads"],
      head_dim=m["head_dim"],
      num_kv_heads=m["num_kv_heads"],
      rope_theta=int(m["rope_theta"]),
      norm_eps=m["norm_eps"],
      use_tied_embedding=True,
  )
  # Auto axes, as tunix's models expect (jax.make_mesh defaults to Explicit).
  # Every XLA CPU device (bench_peers --cpu_devices) on tunix's 'fsdp' axis:
  # its data-parallel axis, parameters split over it (ZeRO-3).
  mesh = jax.make_mesh(
      (jax.device_count(), 1),
      ("fsdp", "tp"),
      axis_types=(jax.sharding.AxisType.Auto,) * 2,
  )
  actor = qwen2_params.create_model_from_safe_tensors(folder, cfg, mesh)
  reference = qwen2_params.create_model_from_safe_tensors(folder, cfg, mesh)
  params = sum(x.size for x in jax.tree.leaves(nnx.state(actor, nnx.Param)))
  tok = transformers.PreTrainedTokenizerFast.from_pretrained(folder)
  texts = [common.prompt_text(p) for p in spec["prompts"]]
  got = tok.encode(texts[0], add_special_tokens=False)
  if got != spec["prompts"][0]:
    raise AssertionError(f"tokenizer: {got[:8]}... != {spec['prompts'][0][:8]}")

  training = rl_cluster_lib.RLTrainingConfig(
      actor_optimizer=optax.chain(
          optax.clip_by_global_norm(1.0),
          optax.adamw(spec["learning_rate"]),
      ),
      eval_every_n_steps=10**9,
      max_steps=warmup + iters,
      # --micro_batches (in prompts, tunix's unit): gradients accumulated over
      # N micro-batches, reference log-probs in chunks of the same size, the
      # rollout on all prompts at once. N = 1 leaves tunix's defaults.
      **(
          dict(
              mini_batch_size=n_prompts,
              train_micro_batch_size=n_prompts // micro,
              rollout_micro_batch_size=n_prompts,
              compute_logps_micro_batch_size=n_prompts // micro,
          )
          if micro > 1
          else {}
      ),
  )
  rollout = base_rollout.RolloutConfig(
      max_tokens_to_generate=n_new,
      max_prompt_length=p_len,
      kv_cache_size=p_len + n_new,
      temperature=1.0,
      top_p=1.0,
      top_k=None,
      eos_tokens=[tok.eos_token_id],  # outside the model's vocabulary
  )
  cluster = rl_cluster_lib.RLCluster(
      actor=actor,
      reference=reference,
      tokenizer=tok,
      cluster_config=rl_cluster_lib.ClusterConfig(
          role_to_mesh={
              rl_cluster_lib.Role.ACTOR: mesh,
              rl_cluster_lib.Role.REFERENCE: mesh,
              rl_cluster_lib.Role.ROLLOUT: mesh,
          },
          rollout_engine="vanilla",
          offload_to_cpu=False,
          training_config=training,
          rollout_config=rollout,
      ),
  )
  lengths, rewards = [], []

  def reward(prompts, completions, **kwargs):
    del prompts, kwargs
    r = [common.text_reward(c, n_new) for c in completions]
    lengths.extend(len(c.split()) for c in completions)
    rewards.extend(r)
    return r

  n = spec["matmul_n"]
  a = jnp.asarray(np.random.default_rng(0).standard_normal((n, n)), jnp.float32)
  mm = jax.jit(jnp.matmul)
  times, marks, info = [], [], {}

  class Timed(grpo_learner.GRPOLearner):
    """GRPOLearner whose global steps end by blocking on the actor's
    parameters and are timed (end to end)."""

    def _run_global_step(self, *args, **kwargs):
      super()._run_global_step(*args, **kwargs)
      jax.block_until_ready(nnx.state(self.rl_cluster.actor_trainer.model))
      now = time.perf_counter()
      marks.append(now)
      if len(marks) == warmup:
        info["warmup_s"] = now - info["start"]
        info["matmul_flops"] = common.matmul_rate(
            lambda: mm(a, a).block_until_ready(), n
        )
        info["r0"] = common.rusage()
        lengths.clear()
        rewards.clear()
        marks[-1] = time.perf_counter()
      elif len(marks) > warmup:
        times.append(now - marks[-2])

  learner = Timed(
      rl_cluster=cluster,
      algo_config=grpo_learner.GRPOConfig(
          num_generations=spec["group_size"],
          num_iterations=1,
          beta=spec["beta"],
          epsilon=0.2,
          kl_loss_mode="low_var_kl",  # k3
      ),
      reward_fns=[reward],
  )
  batch = {"prompts": np.array(texts, dtype=object)}
  info["start"] = time.perf_counter()
  learner.train([batch] * (warmup + iters + 1))
  r1 = common.rusage()
  # The last logged KL (a sanity check that the reference differs), read
  # from the metrics logger's history (a private field: NaN if it moved).
  kl = float("nan")
  history = getattr(cluster, "_rl_metrics_logger", None)
  for modes in getattr(history, "_metrics", {}).values():
    for by_name in modes.values():
      if by_name.get("kl"):
        kl = float(np.asarray(by_name["kl"][-1]))
  common.emit(
      dict(
          engine="tunix",
          version=(
              f"google-tunix {metadata.version('google-tunix')}, jax "
              f"{jax.__version__}, flax {metadata.version('flax')}"
          ),
          threads=common.xla_threads(os.cpu_count(), jax.device_count()),
          allocator=common.allocator_in_use(),
          params=int(params),
          warmup_s=info["warmup_s"],
          matmul_flops=info["matmul_flops"],
          completion_tokens=f"{min(lengths)}-{max(lengths)}",
          reward=float(np.mean(rewards)),
          kl=kl,
          user_s_per_iter=(r1["user_s"] - info["r0"]["user_s"]) / len(times),
          sys_s_per_iter=(r1["sys_s"] - info["r0"]["sys_s"]) / len(times),
          peak_rss_gb=r1["peak_rss_gb"],
          accumulation=(
              f"{training.get_with_default('gradient_accumulation_steps', 1)}"
              f" x {(training.train_micro_batch_size or n_prompts)} prompts "
              f"configured, {observed_accumulation(cluster):g} micro-steps "
              "per optimizer step observed"
          ),
          **common.summary(times),
      )
  )


if __name__ == "__main__":
  main()
