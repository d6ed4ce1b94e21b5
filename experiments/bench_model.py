"""Model throughput on this machine: train and sample tokens/s, MFU, memory.

    python experiments/bench_model.py                       # all presets
    python experiments/bench_model.py --presets=small --reps=3

For each preset (tiny ~0.4M, small ~1M, medium ~20M parameters) it measures:

  train tok/s   one jitted optimizer step (teacher-forced forward, backward,
                AdamW; the SFT loss of agentic_rl/learner/) on [B, T] tokens.
  sample tok/s  KV-cache decoding (agentic_rl/sampling.extend + sample_token in
                a lax.fori_loop, temperature 1) at batch 32 and 128: new tokens
                per second after a prefill of the prompt (prefill excluded).
  decode step   seconds per decode step (one new token for every row) against
                its compute bound: the step's model FLOPs (batch x per-token
                FLOPs below) / the matmul peak; "x bound" = step / bound (1.0
                would be the peak; the target for the small preset is <= 2).
  MFU           model FLOPs / s divided by a float32 matmul peak measured in the
                same process (`matmul_peak`: fastest of several jitted
                [N, N] @ [N, N] products, N = 1024 ... 4096, after warm-up). Model
                FLOPs per trained token: 6 * N_matmul + 12 * layers * heads *
                head_dim * T (PaLM, Chowdhery et al. 2022, arXiv:2204.02311,
                appendix B; N_matmul = parameters used in matmuls: all but the
                embedding table, which is a gather). Per sampled token: 2 *
                N_matmul + 4 * layers * heads * head_dim * S_cache.
  memory        XLA's per-program estimate (arguments + outputs + temporaries,
                `compiled.memory_analysis()`) and the process's peak RSS.

Every timing is the fastest of `--reps` timed calls after a warm-up call
(compilation excluded). Results depend on what else runs on the machine: the
peak is measured in the same run so that MFU is a ratio of like with like.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import sys
import time
from typing import Any, Callable

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

# Runnable as a script from anywhere (`python experiments/bench_model.py`).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from agentic_rl import learner  # pylint: disable=g-import-not-at-top
from agentic_rl import sampling
from agentic_rl import types
from agentic_rl.models import transformer
from configs import common

_PRESETS = flags.DEFINE_list(
    "presets",
    ["tiny", "small", "medium"],
    "Presets to run (tiny, small, medium).",
)
_REPS = flags.DEFINE_integer(
    "reps", 5, "Timed calls per measurement (fastest)."
)
_SAMPLE_BATCHES = flags.DEFINE_list(
    "sample_batches", ["32", "128"], "Batch sizes of the sampling benchmark."
)
_DECODE_ONLY = flags.DEFINE_bool(
    "decode_only",
    False,
    "Only the matmul peak and each preset's decode step "
    "vs its compute bound (no training step, no table).",
)
_BUCKETS = flags.DEFINE_bool(
    "buckets",
    False,
    "Only compare decode steps in short and long "
    "buffers with and without length buckets.",
)

# Bench-local presets: tiny and small are configs/common.py's; medium (~20M
# parameters) exists only here.
PRESETS = {
    "tiny": dict(common.MODEL_PRESETS["tiny"]),
    "small": dict(common.MODEL_PRESETS["small"]),
    "medium": dict(
        d_model=512, num_layers=6, num_heads=8, head_dim=64, ffn_dim=1408
    ),
}
# Training shape [B, T] per preset (tokens per step = B * T).
TRAIN_SHAPE = {"tiny": (32, 128), "small": (32, 128), "medium": (16, 128)}
# Sampling: cache length S, prompt length; new tokens = S - prompt.
SAMPLE_CACHE, SAMPLE_PROMPT = 128, 16
VOCAB = 265


def _best_time(
    fn: Callable[[], Any],
    reps: int,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
  """Fastest wall seconds (or `clock` seconds, e.g. time.process_time for
  CPU seconds) of `fn()` over `reps` calls after one warm-up.

  The fastest call is the least disturbed by other processes on a shared
  machine; the peak matmul is timed the same way.
  """
  jax.block_until_ready(fn())
  times = []
  for _ in range(reps):
    t0 = clock()
    jax.block_until_ready(fn())
    times.append(clock() - t0)
  return min(times)


def matmul_peak(
    reps: int,
    sizes=(1024, 2048, 3072, 4096),
    rounds: int = 2,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[float, int, dict[int, float]]:
  """Best float32 matmul FLOP/s of XLA over square sizes.

  For each N, a jitted [N, N] @ [N, N] float32 product (2 N^3 FLOPs) is
  compiled, called once to warm up, then timed `reps` times with
  `jax.block_until_ready`, in `rounds` separate rounds; the rate of the fastest
  call is kept. float32 because the models compute in float32 (bfloat16
  matmuls run ~2x slower than float32 on this AVX2 CPU, which has no native
  bfloat16 arithmetic). XLA uses all cores by default.

  With clock=time.process_time the rates are FLOPs per CPU-second of the
  process (all threads), which other load disturbs far less than wall time.

  Returns:
    (best FLOP/s, the N that gave it, {N: best FLOP/s}).
  """
  best, best_n, per_n = 0.0, 0, {}
  for n in sizes:
    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32)
    b = jax.random.normal(jax.random.PRNGKey(1), (n, n), jnp.float32)
    f = jax.jit(jnp.matmul)
    t = min(_best_time(lambda: f(a, b), reps, clock) for _ in range(rounds))
    per_n[n] = rate = 2 * n**3 / t
    if rate > best:
      best, best_n = rate, n
  return best, best_n, per_n


def numpy_matmul_peak(reps: int, sizes=(2048, 4096)) -> float:
  """Best float32 FLOP/s of numpy's BLAS on [N, N] @ [N, N] (a cross-check of
  the XLA peak, not used for MFU)."""
  best = 0.0
  for n in sizes:
    a = np.random.default_rng(0).standard_normal((n, n), np.float32)
    b = np.random.default_rng(1).standard_normal((n, n), np.float32)
    a @ b
    for _ in range(reps):
      t0 = time.perf_counter()
      a @ b
      best = max(best, 2 * n**3 / (time.perf_counter() - t0))
  return best


def _xla_bytes(compiled) -> int | None:
  """Arguments + outputs + temporaries of a compiled program (None if unknown)."""
  try:
    m = compiled.memory_analysis()
    return int(
        m.argument_size_in_bytes
        + m.output_size_in_bytes
        + m.temp_size_in_bytes
        - m.alias_size_in_bytes
    )
  except Exception:  # pylint: disable=broad-except
    return None


def matmul_params(cfg: transformer.TransformerConfig) -> int:
  """Parameters used in matmuls: everything but the embedding table and norms."""
  d, h, k, f, v = (
      cfg.d_model,
      cfg.num_heads,
      cfg.head_dim,
      cfg.ffn_dim,
      cfg.vocab_size,
  )
  per_layer = 4 * d * h * k + 3 * d * f
  return cfg.num_layers * per_layer + d * v


def train_flops_per_token(cfg, seq_len: int) -> float:
  """6 N + 12 L H Dh T (PaLM appendix B, arXiv:2204.02311)."""
  return (
      6 * matmul_params(cfg)
      + 12 * cfg.num_layers * cfg.num_heads * cfg.head_dim * seq_len
  )


def sample_flops_per_token(cfg, cache_len: int) -> float:
  """Forward only, one token attending to a cache of `cache_len` entries."""
  return (
      2 * matmul_params(cfg)
      + 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * cache_len
  )


def make_model(cfg):
  model = transformer.Transformer(cfg, nnx.Rngs(params=0))
  return nnx.split(model)


def bench_train(cfg, batch: int, seq_len: int, reps: int) -> dict[str, float]:
  """One SFT optimizer step (learner.sft_loss + AdamW) on random tokens."""
  graphdef, params = make_model(cfg)
  tx = optax.adamw(1e-4)
  opt_state = tx.init(params)
  tokens = jax.random.randint(
      jax.random.PRNGKey(2), (batch, seq_len), 0, cfg.vocab_size
  )
  role = jnp.full((batch, seq_len), types.POLICY, jnp.int8)
  traj = types.Trajectory(
      tokens=tokens,
      role=role,
      logprob=None,
      turn=None,
      length=None,
      num_turns=None,
      finish=None,
      group=None,
      facts=None,
  )

  def step(params, opt_state, traj):
    (loss, _), grads = jax.value_and_grad(
        lambda p: learner.sft_loss(graphdef, p, traj), has_aux=True
    )(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  compiled = (
      jax.jit(step, donate_argnums=(0, 1))
      .lower(params, opt_state, traj)
      .compile()
  )
  state = [params, opt_state]

  def call():
    state[0], state[1], loss = compiled(state[0], state[1], traj)
    return loss

  t = _best_time(call, reps)
  tokens_per_s = batch * seq_len / t
  return dict(
      tokens_per_s=tokens_per_s,
      flops_per_s=tokens_per_s * train_flops_per_token(cfg, seq_len),
      step_s=t,
      xla_bytes=_xla_bytes(compiled),
  )


def bench_sample(
    cfg,
    batch: int,
    reps: int,
    cache_len: int = SAMPLE_CACHE,
    prompt_len: int = SAMPLE_PROMPT,
    new: int | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, float]:
  """Decoding `new` tokens per row (default: fill the cache) with the KV cache
  after a `prompt_len`-token prompt, in a buffer of `cache_len` entries."""
  graphdef, params = make_model(cfg)
  prompt = jax.random.randint(
      jax.random.PRNGKey(3), (batch, prompt_len), 0, cfg.vocab_size
  )
  new = cache_len - prompt_len if new is None else new

  def prefill(params, prompt):
    cache = transformer.init_cache(cfg, batch, cache_len)
    zeros = jnp.zeros((batch,), jnp.int32)
    return sampling.extend(
        graphdef,
        params,
        cache,
        prompt,
        zeros,
        jnp.full((batch,), prompt_len, jnp.int32),
    )

  def decode(params, logits, cache, key):
    ones = jnp.ones((batch,), jnp.int32)

    def body(i, carry):
      logits, cache, key, out = carry
      key, sub = jax.random.split(key)
      tok, _ = sampling.sample_token(sub, logits, 1.0)
      pos = jnp.full((batch,), prompt_len, jnp.int32) + i
      logits, cache = sampling.extend(
          graphdef, params, cache, tok[:, None], pos, ones
      )
      return logits, cache, key, out.at[:, i].set(tok)

    out = jnp.zeros((batch, new), jnp.int32)
    return jax.lax.fori_loop(0, new, body, (logits, cache, key, out))[3]

  logits, cache = jax.jit(prefill)(params, prompt)
  compiled = (
      jax.jit(decode)
      .lower(params, logits, cache, jax.random.PRNGKey(4))
      .compile()
  )
  t = _best_time(
      lambda: compiled(params, logits, cache, jax.random.PRNGKey(4)),
      reps,
      clock,
  )
  tokens_per_s = batch * new / t
  # Mean cache length attended to over the decode steps.
  mean_len = prompt_len + new / 2
  return dict(
      tokens_per_s=tokens_per_s,
      step_s=t / new,
      step_flops=batch * sample_flops_per_token(cfg, mean_len),
      flops_per_s=tokens_per_s * sample_flops_per_token(cfg, mean_len),
      xla_bytes=_xla_bytes(compiled),
  )


def bench_buckets(
    reps: int, batch: int = 8, context: int = 48, buffers=(128, 2048)
) -> None:
  """Decode cost vs buffer length for the same short context (length buckets).

  The medium preset decodes `context - 16` tokens after a 16-token prompt
  in buffers of each length, reading the whole cache (decode_bucket 0) and
  with the default length buckets (transformer.decode_buckets). Timed in
  CPU seconds of the process (fastest call), which a shared machine disturbs
  far less than wall time.
  """
  base = transformer.TransformerConfig(vocab_size=VOCAB, **PRESETS["medium"])
  times = {}
  for bucket in (0, base.decode_bucket):
    cfg = dataclasses.replace(base, decode_bucket=bucket)
    for buf in buffers:
      r = bench_sample(
          cfg,
          batch,
          reps,
          cache_len=buf,
          prompt_len=16,
          new=context - 16,
          clock=time.process_time,
      )
      times[bucket, buf] = r["step_s"]
      print(
          f"medium, batch {batch}, context <= {context}, buffer {buf}, "
          f"decode_bucket {bucket}: {1e3 * r['step_s']:.2f} CPU-ms per step",
          flush=True,
      )
  for bucket in (0, base.decode_bucket):
    print(
        f"decode_bucket {bucket}: buffer {buffers[-1]} / buffer {buffers[0]} "
        f"step time = {times[bucket, buffers[-1]] / times[bucket, buffers[0]]:.2f}x"
    )


def _mb(x):
  return "n/a" if x is None else f"{x / 2**20:.0f}"


def main(argv):
  del argv
  reps = _REPS.value
  if _BUCKETS.value:
    print(f"load average at start: {os.getloadavg()}")
    bench_buckets(reps)
    print(f"load average at end: {os.getloadavg()}")
    return
  print(f"jax {jax.__version__}, devices: {jax.devices()}")
  print(f"load average at start: {os.getloadavg()}; cpus: {os.cpu_count()}")
  peak, peak_n, per_n = matmul_peak(reps)
  print(
      f"float32 matmul peak (XLA): {peak / 1e9:.1f} GFLOP/s (best at N={peak_n}; "
      + ", ".join(f"N={n}: {r / 1e9:.1f}" for n, r in per_n.items())
      + ")"
  )
  print(
      f"float32 matmul peak (numpy BLAS, cross-check): "
      f"{numpy_matmul_peak(reps) / 1e9:.1f} GFLOP/s"
  )
  if _DECODE_ONLY.value:
    peak_cpu, n_cpu, _ = matmul_peak(
        reps, sizes=(1024, 2048), clock=time.process_time
    )
    print(
        f"float32 matmul peak (XLA) per CPU-second: {peak_cpu / 1e9:.1f} "
        f"GFLOP (N={n_cpu})"
    )
    for name in _PRESETS.value:
      cfg = transformer.TransformerConfig(vocab_size=VOCAB, **PRESETS[name])
      for sb in map(int, _SAMPLE_BATCHES.value):
        for clock, unit, pk in (
            (time.perf_counter, "wall", peak),
            (time.process_time, "CPU", peak_cpu),
        ):
          sa = bench_sample(cfg, sb, reps, clock=clock)
          bound = sa["step_flops"] / pk
          print(
              f"{name} decode step at batch {sb}: {1e3 * sa['step_s']:.2f} "
              f"{unit}-ms, compute bound {1e3 * bound:.3f} {unit}-ms "
              f"({sa['step_flops'] / 1e6:.1f} MFLOP at {pk / 1e9:.1f} "
              f"GFLOP per {unit}-s): {sa['step_s'] / bound:.1f}x the bound",
              flush=True,
          )
    print(f"load average at end: {os.getloadavg()}")
    return
  rows = []
  for name in _PRESETS.value:
    cfg = transformer.TransformerConfig(vocab_size=VOCAB, **PRESETS[name])
    n = transformer.count_params(
        nnx.split(transformer.Transformer(cfg, nnx.Rngs(0)))[1]
    )
    b, t = TRAIN_SHAPE[name]
    tr = bench_train(cfg, b, t, reps)
    row = dict(
        preset=name,
        params=n,
        train_shape=f"{b}x{t}",
        train_tok_s=tr["tokens_per_s"],
        train_mfu=tr["flops_per_s"] / peak,
        train_mb=tr["xla_bytes"],
    )
    for sb in map(int, _SAMPLE_BATCHES.value):
      sa = bench_sample(cfg, sb, reps)
      row[f"sample{sb}_tok_s"] = sa["tokens_per_s"]
      row[f"sample{sb}_mfu"] = sa["flops_per_s"] / peak
      row[f"sample{sb}_mb"] = sa["xla_bytes"]
      bound = sa["step_flops"] / peak
      row[f"sample{sb}_step_ms"] = 1e3 * sa["step_s"]
      row[f"sample{sb}_bound_ms"] = 1e3 * bound
      print(
          f"{name} decode step at batch {sb}: {1e3 * sa['step_s']:.2f} ms, "
          f"compute bound {1e3 * bound:.3f} ms ({sa['step_flops'] / 1e6:.1f} "
          f"MFLOP at {peak / 1e9:.1f} GFLOP/s): {sa['step_s'] / bound:.1f}x "
          "the bound",
          flush=True,
      )
    rows.append(row)
    print(row, flush=True)
  maxrss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
  sbs = list(map(int, _SAMPLE_BATCHES.value))
  header = (
      "| preset | params | train [BxT] | train tok/s | train MFU | train XLA MB | "
      + " | ".join(
          f"sample B={s} tok/s | sample B={s} MFU | sample B={s} XLA MB"
          for s in sbs
      )
      + " | sample B="
      + str(sbs[-1])
      + " / train |"
  )
  print()
  print(header)
  print("|" + "---|" * (header.count("|") - 1))
  for r in rows:
    cells = [
        r["preset"],
        f"{r['params'] / 1e6:.2f}M",
        r["train_shape"],
        f"{r['train_tok_s']:.0f}",
        f"{100 * r['train_mfu']:.1f}%",
        _mb(r["train_mb"]),
    ]
    for s in sbs:
      cells += [
          f"{r[f'sample{s}_tok_s']:.0f}",
          f"{100 * r[f'sample{s}_mfu']:.1f}%",
          _mb(r[f"sample{s}_mb"]),
      ]
    cells.append(f"{r[f'sample{sbs[-1]}_tok_s'] / r['train_tok_s']:.2f}x")
    print("| " + " | ".join(cells) + " |")
  print(
      f"\nmatmul peak {peak / 1e9:.1f} GFLOP/s; process peak RSS {maxrss_mb:.0f} MB; "
      f"load average at end: {os.getloadavg()}"
  )


if __name__ == "__main__":
  app.run(main)
