"""Dense vs chunked training attention: compiled memory and fwd+bwd time.

    python experiments/bench_attention.py                  # everything below
    python experiments/bench_attention.py --lengths=512,1024 --batches=1 --reps=2
    python experiments/bench_attention.py --skip_model     # attention op only

Three tables, every program a jitted gradient (forward + backward):

  attention op  one attention call of the SmolLM2-135M shape (9 query heads on
                3 kv heads, head_dim 64), float32, causal, loss = sum(out * w):
                XLA's compiled temporaries (`memory_analysis().temp_size_in_bytes`),
                whether the HLO holds an [.., L, L] array, and the time of one
                call (forward + backward).
  model         the whole SmolLM2-135M shape (30 layers, 135M parameters,
                random weights) with remat as configs/smollm2_common.py sets
                it: temp bytes of the gradient of the mean token log-prob of a
                [B, L] batch (compiled only; `--model_time` also times it).
  small L       the `tiny` preset's attention shape (4 heads, head_dim 24) at
                the default config's lengths, batch 64: whether the chunked
                path costs more where the dense one is small.

Times: the fastest of `--reps` calls after a warm-up call (compilation
excluded), wall seconds and the process's CPU seconds (all threads; less
disturbed by other processes on a shared machine than wall time). The load
average at start and end is printed: on a busy machine only the CPU seconds
and the memory numbers are comparable between rows.
"""

from __future__ import annotations

import os
import re
import sys
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
from flax import nnx

# Runnable as a script from anywhere (`python experiments/bench_attention.py`).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from agentic_rl import sampling  # pylint: disable=g-import-not-at-top
from agentic_rl.models import attention
from agentic_rl.models import transformer
from configs import common

_LENGTHS = flags.DEFINE_list(
    "lengths", ["512", "1024", "2048"], "Sequence lengths L."
)
_BATCHES = flags.DEFINE_list(
    "batches", ["1", "2"], "Batch sizes of the op table."
)
_BLOCK = flags.DEFINE_integer(
    "block", 256, "attention_block of the chunked path."
)
_REPS = flags.DEFINE_integer(
    "reps", 3, "Timed calls per measurement (fastest)."
)
_SKIP_MODEL = flags.DEFINE_bool(
    "skip_model", False, "Skip the whole-model table."
)
_MODEL_TIME = flags.DEFINE_bool(
    "model_time", False, "Also time the whole-model gradient (slow)."
)
_SMALL_LENGTHS = flags.DEFINE_list(
    "small_lengths", ["64", "128", "256"], "Lengths of the small-L table."
)

MIB = 2.0**20


def _best(fn, reps: int) -> tuple[float, float]:
  """(fastest wall s, fastest CPU s) of `fn()` over `reps` calls after a warm-up."""
  jax.block_until_ready(fn())
  walls, cpus = [], []
  for _ in range(reps):
    w0, c0 = time.perf_counter(), time.process_time()
    jax.block_until_ready(fn())
    walls.append(time.perf_counter() - w0)
    cpus.append(time.process_time() - c0)
  return min(walls), min(cpus)


def _square(text: str, length: int) -> bool:
  """Whether the HLO text has an array with two trailing-ish axes of `length`."""
  return re.search(rf"\[[0-9,]*\b{length},{length}\b", text) is not None


def _op_grad(impl: str, block: int, mask):
  def loss(q, k, v, w):
    out = attention.self_attention(
        q, k, v, mask, impl=impl, block=block, dtype=jnp.float32
    )
    return jnp.sum(out * w)

  return jax.jit(jax.grad(loss, (0, 1, 2)))


def op_table(
    h: int,
    g: int,
    dh: int,
    lengths,
    batches,
    block: int,
    reps: int,
    check_square: bool = True,
) -> list[str]:
  rows = [
      "| B | L | impl | temp MiB | [L, L] in HLO | wall s | CPU s |",
      "|---|---|---|---|---|---|---|",
  ]
  print("\n".join(rows), flush=True)
  for b in batches:
    for t in lengths:
      keys = jax.random.split(jax.random.PRNGKey(t), 4)
      q = jax.random.normal(keys[0], (b, h, t, dh))
      k = jax.random.normal(keys[1], (b, g, t, dh))
      v = jax.random.normal(keys[2], (b, g, t, dh))
      w = jax.random.normal(keys[3], (b, h, t, dh))
      mask = attention.SelfMask(
          jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
      )
      for impl in ("dense", "chunked"):
        f = _op_grad(impl, block, mask)
        compiled = f.lower(q, k, v, w).compile()
        temp = compiled.memory_analysis().temp_size_in_bytes / MIB
        sq = _square(compiled.as_text(), t) if check_square else None
        wall, cpu = _best(lambda f=f: f(q, k, v, w), reps)
        rows.append(
            f"| {b} | {t} | {impl} | {temp:.1f} | "
            f"{'-' if sq is None else ('yes' if sq else 'no')} | "
            f"{wall:.3f} | {cpu:.3f} |"
        )
        print(rows[-1], flush=True)
  return rows


def model_table(lengths, block: int, reps: int, timed: bool) -> list[str]:
  rows = [
      "| B | L | impl | temp MiB | [L, L] in HLO | wall s | CPU s |",
      "|---|---|---|---|---|---|---|",
  ]
  print("\n".join(rows), flush=True)
  fields = {
      k: v
      for k, v in dict(common.model("smollm2-135m")).items()
      if k not in ("hf_path", "lora")
  }
  fields.update(remat=True, attention_block=block)
  for t in lengths:
    tokens = jax.random.randint(jax.random.PRNGKey(0), (1, t + 1), 0, 49_152)
    for impl in ("dense", "chunked"):
      cfg = transformer.TransformerConfig(**{**fields, "attention_impl": impl})
      graphdef, params = nnx.split(
          nnx.eval_shape(
              lambda cfg=cfg: transformer.Transformer(cfg, nnx.Rngs(0))
          )
      )

      def loss(params, graphdef=graphdef):
        logp, _ = sampling.token_logprobs(graphdef, params, tokens, 1.0)
        return jnp.mean(logp)

      f = jax.jit(jax.grad(loss))
      compiled = f.lower(params).compile()
      temp = compiled.memory_analysis().temp_size_in_bytes / MIB
      sq = _square(compiled.as_text(), t)
      wall = cpu = float("nan")
      if timed:
        real = nnx.state(transformer.Transformer(cfg, nnx.Rngs(0)))
        wall, cpu = _best(lambda f=f, real=real: f(real), reps)
      rows.append(
          f"| 1 | {t} | {impl} | {temp:.1f} | {'yes' if sq else 'no'} | "
          f"{wall:.2f} | {cpu:.2f} |"
      )
      print(rows[-1], flush=True)
  return rows


def main(argv):
  del argv
  lengths = [int(x) for x in _LENGTHS.value]
  batches = [int(x) for x in _BATCHES.value]
  print(
      f"jax {jax.__version__}, {os.cpu_count()} CPUs, load average at start "
      f"{os.getloadavg()}, attention_block {_BLOCK.value}",
      flush=True,
  )
  print(
      "\n## Attention op, SmolLM2-135M shape (H 9, G 3, Dh 64), float32, "
      "grad of sum(out * w)\n",
      flush=True,
  )
  op_table(9, 3, 64, lengths, batches, _BLOCK.value, _REPS.value)
  if not _SKIP_MODEL.value:
    print(
        "\n## Whole SmolLM2-135M shape (30 layers, remat), grad of mean "
        "log-prob, B = 1\n",
        flush=True,
    )
    model_table(lengths, _BLOCK.value, _REPS.value, _MODEL_TIME.value)
  small = [int(x) for x in _SMALL_LENGTHS.value]
  print(
      "\n## Small L: tiny preset attention shape (H 4, G 4, Dh 24), B = 64\n",
      flush=True,
  )
  op_table(4, 4, 24, small, [64], _BLOCK.value, max(_REPS.value, 5))
  # 'auto' uses dense up to one block; chunked forced at small L, one block:
  print(
      f"\n(small-L rows with L <= block run 'chunked' as a single block; "
      f"'auto' picks dense there)\nload average at end {os.getloadavg()}",
      flush=True,
  )


if __name__ == "__main__":
  app.run(main)
