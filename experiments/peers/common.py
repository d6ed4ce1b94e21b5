"""Shared, dependency-free pieces of experiments/bench_peers.py.

Standard library only: this module is imported by the driver (our pinned
environment), by the tests, and by the peers' workers, which run in their own
virtualenvs (experiments/peers/README.md) where none of our packages exist.

It holds the workload (the model config, the prompts, the reward), the
analytic FLOP and parameter counts, the allocator environments, the
interleaving order, the statistics and the Markdown table, and the worker
protocol (a JSON spec on stdin, one `RESULT {json}` line on stdout).
"""

from __future__ import annotations

import json
import os
import random
import statistics
import sys
import time
from typing import Any, Callable, Sequence

# ----------------------------------------------------------------- workload

# The benchmark's model: a Qwen2-architecture decoder (q/k/v biases, GQA,
# SwiGLU, RMSNorm, RoPE, tied embeddings) of 4,059,392 parameters.
MODEL = dict(
    vocab_size=480,
    d_model=256,
    num_layers=4,
    num_heads=4,
    num_kv_heads=2,
    head_dim=64,
    ffn_dim=1024,
    rope_theta=10_000.0,
    norm_eps=1e-6,
)
# --tiny: a seconds-long check of the whole pipeline.
TINY_MODEL = dict(
    vocab_size=64,
    d_model=32,
    num_layers=2,
    num_heads=2,
    num_kv_heads=1,
    head_dim=16,
    ffn_dim=64,
    rope_theta=10_000.0,
    norm_eps=1e-6,
)

WORKLOAD = dict(
    num_prompts=16,  # x group_size = 64 episodes
    group_size=4,
    prompt_len=32,
    new_tokens=64,
    beta=0.04,  # KL coefficient (k3 estimator)
    learning_rate=1e-3,
    warmup_iters=2,  # untimed (compilation) iterations per process
    matmul_n=1024,
)
TINY_WORKLOAD = dict(
    num_prompts=2,
    group_size=4,
    prompt_len=8,
    new_tokens=8,
    beta=0.04,
    learning_rate=1e-3,
    warmup_iters=1,
    matmul_n=256,
)

# Token strings of the benchmark tokenizer: "t<id>" for the model's ids, then
# specials that lie outside the model's vocabulary, so that no engine can
# ever sample them: every completion is exactly `new_tokens` long and no
# buffer holds a padding token.
PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
# Reward: the share of the completion's tokens whose id is even (a token
# count: negligible cost, and it varies within every group, so every
# iteration's advantages and update are non-zero).
REWARD_MODULUS = 2


def token(i: int) -> str:
  return f"t{i}"


def prompts(num_prompts: int, prompt_len: int, vocab_size: int) -> list:
  """Fixed prompt token ids: `num_prompts` rows of `prompt_len` ids drawn
  from random.Random(0) (the same in every interpreter)."""
  rng = random.Random(0)
  return [
      [rng.randrange(vocab_size) for _ in range(prompt_len)]
      for _ in range(num_prompts)
  ]


def prompt_text(ids: Sequence[int]) -> str:
  """The prompt as the peers' trainers take it (text; the benchmark
  tokenizer maps it back to exactly `ids`)."""
  return " ".join(token(i) for i in ids)


def text_reward(completion: str, new_tokens: int) -> float:
  """Share of a decoded completion's `new_tokens` tokens with an even id."""
  ids = (int(w[1:]) for w in completion.split() if w[:1] == "t")
  return sum(i % REWARD_MODULUS == 0 for i in ids) / new_tokens


def spec(tiny: bool) -> dict:
  """The workload every engine runs: model, prompts, batch, KL, optimizer."""
  model = dict(TINY_MODEL if tiny else MODEL)
  w = dict(TINY_WORKLOAD if tiny else WORKLOAD)
  w["episodes"] = w["num_prompts"] * w["group_size"]
  w["prompts"] = prompts(w["num_prompts"], w["prompt_len"], model["vocab_size"])
  w["model"] = model
  w["params"] = param_count(model)
  w["flops"] = iteration_flops(
      model, w["episodes"], w["prompt_len"], w["new_tokens"]
  )
  return w


# ------------------------------------------------------------------- counts


def param_count(m: dict) -> int:
  """Parameters of the Qwen2 decoder `m` with tied embeddings: per layer the
  q/k/v projections and biases, o, gate/up/down and two RMSNorm scales; the
  embedding table (also the output layer) and the final norm."""
  d, h, g, k = m["d_model"], m["num_heads"], m["num_kv_heads"], m["head_dim"]
  per_layer = (
      (d * h * k + h * k)  # q + bias
      + 2 * (d * g * k + g * k)  # k, v + biases
      + h * k * d  # o
      + 3 * d * m["ffn_dim"]  # gate, up, down
      + 2 * d  # two norms
  )
  return m["num_layers"] * per_layer + m["vocab_size"] * d + d


def forward_flops(m: dict, positions: int, logits: int, context: int) -> int:
  """Model FLOPs of a forward of the decoder `m` over `positions` tokens.

  2 FLOPs per weight of every projection per token (`body` = layers x (q, k,
  v, o, gate, up, down)), plus 2 * d * V for the output layer at each of the
  `logits` positions whose logits are computed, plus attention 4 * layers *
  heads * head_dim per unit of `context` (the sum over the positions of
  each one's causal context length: q.k and the weighted sum of v).
  """
  d, v = m["d_model"], m["vocab_size"]
  h, g, k, f = m["num_heads"], m["num_kv_heads"], m["head_dim"], m["ffn_dim"]
  body = m["num_layers"] * (2 * d * h * k + 2 * d * g * k + 3 * d * f)
  attn = 4 * m["num_layers"] * h * k  # per unit of context
  return 2 * body * positions + 2 * d * v * logits + attn * context


def iteration_flops(
    m: dict, episodes: int, prompt_len: int, new_tokens: int
) -> dict:
  """Model FLOPs of one GRPO iteration, counted from the config.

  Per token, a forward costs 2 FLOPs per weight of every projection
  (`body` = layers x (q, k, v, o, gate, up, down)), plus 2 * d * V for the
  output layer where logits are needed, plus attention 4 * layers * heads *
  head_dim * c at context c (q.k and the weighted sum of v); a backward
  costs twice the forward (PaLM, arXiv:2204.02311, appendix B). Counted
  once per episode, with P = prompt_len and N = new_tokens:

    sample     prefill of the P prompt tokens (causal contexts 1..P, logits
               at the last position only), then N - 1 decode steps with the
               KV cache (positions P+1 .. P+N-1, logits each): N sampled
               tokens. Extra forwards an engine runs are not counted.
    reference  one teacher-forced forward of the P + N tokens, logits at the
               N positions that predict the completion.
    policy     the same forward plus its backward (3x).

  Embedding gathers, norms, softmaxes, the optimizer and the KL/advantage
  arithmetic are left out (small next to the matmuls).

  Returns:
    {'sample', 'reference', 'policy', 'total'} in FLOPs for all episodes.
  """
  p, n = prompt_len, new_tokens
  t = p + n
  sample = forward_flops(
      m, p + n - 1, n, p * (p + 1) // 2 + sum(range(p + 1, p + n))
  )
  forward = forward_flops(m, t, n, t * (t + 1) // 2)
  out = dict(
      sample=episodes * sample,
      reference=episodes * forward,
      policy=episodes * 3 * forward,
  )
  out["total"] = sum(out.values())
  return out


def shared_prefix_flops(
    m: dict, episodes: int, group: int, prompt_len: int, new_tokens: int
) -> dict:
  """`iteration_flops` as executed with the prompt computed once per group.

  With a shared prefix (ours `rl.shared_prefix_len` = P) the prefill, the
  reference forward and the policy forward and backward compute the P
  prompt positions for one episode of each group of `group` instead of for
  every episode: each drops (group - 1) / group of a P-position forward
  (projections and causal attention over contexts 1..P; the logit positions
  are counted as in `iteration_flops`). The workload, and so the bound the
  benchmark reports, is unchanged; this is what that engine runs.

  Returns:
    {'sample', 'reference', 'policy', 'total'} in FLOPs for all episodes.
  """
  out = iteration_flops(m, episodes, prompt_len, new_tokens)
  p = prompt_len
  saved = (
      episodes * (group - 1) / group * forward_flops(m, p, 0, p * (p + 1) // 2)
  )
  for key, times in (("sample", 1), ("reference", 1), ("policy", 3)):
    out[key] -= times * saved
  out["total"] = sum(out[k] for k in ("sample", "reference", "policy"))
  return out


# ---------------------------------------------------------------- allocator

JEMALLOC = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
JEMALLOC_CONF = "retain:true,dirty_decay_ms:-1,muzzy_decay_ms:-1"
ALLOCATORS = ("default", "system", "keep", "jemalloc")
# glibc's environment spelling of agentic_rl/host_memory.py's 'keep' policy.
GLIBC_KEEP = dict(
    MALLOC_ARENA_MAX="1",
    MALLOC_MMAP_MAX_="0",
    MALLOC_TRIM_THRESHOLD_=str(2**31 - 1),
)
_ALLOCATOR_VARS = (
    "LD_PRELOAD",
    "MALLOC_CONF",
    "AGENTIC_RL_HOST_MEMORY",
    *GLIBC_KEEP,
)


def allocator_env(allocator: str, engine: str, base: dict) -> dict:
  """The environment of one engine's process under `allocator`.

    default   as each engine ships: ours keeps its package default
              (agentic_rl/host_memory.py 'keep', mallopt at import), the
              peers get glibc as it comes.
    system    glibc as it comes for every engine (ours:
              AGENTIC_RL_HOST_MEMORY=system).
    keep      freed memory kept for reuse by every engine: ours
              AGENTIC_RL_HOST_MEMORY=keep, the peers the same three glibc
              settings through its environment variables (GLIBC_KEEP).
    jemalloc  every engine with jemalloc preloaded (LD_PRELOAD=JEMALLOC,
              MALLOC_CONF=JEMALLOC_CONF; ours leaves a preloaded allocator
              alone).

  Any allocator variable of `base` is dropped first.

  Raises:
    ValueError: unknown allocator.
  """
  if allocator not in ALLOCATORS:
    raise ValueError(f"allocator {allocator!r}: expected one of {ALLOCATORS}")
  env = {k: v for k, v in base.items() if k not in _ALLOCATOR_VARS}
  ours = engine == "ours"
  if allocator == "system" and ours:
    env["AGENTIC_RL_HOST_MEMORY"] = "system"
  elif allocator == "keep":
    if ours:
      env["AGENTIC_RL_HOST_MEMORY"] = "keep"
    else:
      env.update(GLIBC_KEEP)
  elif allocator == "jemalloc":
    env["LD_PRELOAD"] = JEMALLOC
    env["MALLOC_CONF"] = JEMALLOC_CONF
    if ours:
      env["AGENTIC_RL_HOST_MEMORY"] = "system"
  return env


DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"


def cpu_devices_env(n: int, base: dict) -> dict:
  """`base` with XLA_FLAGS giving the process `n` XLA CPU devices (XLA's
  `--xla_force_host_platform_device_count`; any device count already in
  XLA_FLAGS is replaced, other flags kept). XLA's CPU client runs each
  device's share of a sharded program on its own thread, so on a machine
  of several cores a data-parallel program runs its per-row work (the
  decode steps) on all of them; one device leaves that to XLA's intra-op
  threads, which split only large operations.

  Raises:
    ValueError: n < 1.
  """
  if n < 1:
    raise ValueError(f"cpu devices {n}: expected an integer >= 1")
  flags = [
      f
      for f in base.get("XLA_FLAGS", "").split()
      if not f.startswith(DEVICE_COUNT_FLAG + "=")
  ]
  return dict(base, XLA_FLAGS=" ".join(flags + [f"{DEVICE_COUNT_FLAG}={n}"]))


def xla_threads(cpus: int, devices: int) -> str:
  """The report's threads cell of a JAX engine."""
  return f"XLA, {cpus} CPUs, {devices} device" + ("s" if devices != 1 else "")


def allocator_in_use() -> str:
  """What this process's allocator is, for the report: 'jemalloc (<conf>)'
  when libjemalloc is mapped, else 'glibc' plus any malloc tunables set in
  the environment."""
  try:
    with open("/proc/self/maps") as f:
      if "libjemalloc" in f.read():
        return f"jemalloc ({os.environ.get('MALLOC_CONF', 'default conf')})"
  except OSError:
    pass
  tun = [f"{k}={os.environ[k]}" for k in GLIBC_KEEP if k in os.environ]
  return "glibc" + (f" ({', '.join(tun)})" if tun else "")


# -------------------------------------------------------- rounds and stats


def round_order(engines: Sequence[str], r: int) -> list:
  """Engines of round r: `engines` rotated left by r (ours, trl, tunix;
  trl, tunix, ours; tunix, ours, trl; ...)."""
  engines = list(engines)
  if not engines:
    return []
  k = r % len(engines)
  return engines[k:] + engines[:k]


def spread(xs: Sequence[float]) -> tuple:
  """(median, min, max) of xs."""
  return statistics.median(xs), min(xs), max(xs)


def paired_ratios(rounds: Sequence[dict], peer: str, ref: str = "ours"):
  """Per-round ratios s/iteration of `peer` over `ref`, for the rounds in
  which both ran. `rounds`: [{engine: s_per_iteration}, ...]."""
  return [r[peer] / r[ref] for r in rounds if peer in r and ref in r]


def fmt_spread(xs: Sequence[float], digits: int = 3, suffix: str = "") -> str:
  m, lo, hi = spread(xs)
  return (
      f"{m:.{digits}f}{suffix} [{lo:.{digits}f}{suffix}, {hi:.{digits}f}{suffix}]"
      if len(xs) > 1
      else f"{m:.{digits}f}{suffix}"
  )


def table(results: dict, flops_total: float) -> list:
  """Markdown rows: one per engine that has results.

  Args:
    results: {engine: [worker result, one per round]}; each result has
      's_per_iter' (median over its timed iterations), 'round',
      'matmul_flops' (its own [n]^3 float32 matmul rate, FLOP/s), 'version',
      'allocator', 'threads'.
    flops_total: model FLOPs of one iteration (iteration_flops()['total']).

  Columns: s per iteration (median [min, max] over rounds), the paired
  per-round ratio engine / ours, the engine's model FLOP rate, its own
  matmul rate, its share of its own bound (model rate / matmul rate) and
  of the best matmul rate measured in the run (the common bound).
  """
  by_round: dict = {}
  for eng, outs in results.items():
    for o in outs:
      by_round.setdefault(o["round"], {})[eng] = o["s_per_iter"]
  rounds = [by_round[k] for k in sorted(by_round)]
  rates = [o["matmul_flops"] for outs in results.values() for o in outs]
  best = max(rates) if rates else float("nan")
  rows = [
      "| engine | s per iteration, median [min, max] | vs ours (paired, "
      "per round) | model GFLOP/s | own matmul GFLOP/s | share of own bound "
      "| share of best bound | allocator | threads | version |",
      "|---|---|---|---|---|---|---|---|---|---|",
  ]
  for eng, outs in results.items():
    if not outs:
      continue
    s = [o["s_per_iter"] for o in outs]
    mm = statistics.median(o["matmul_flops"] for o in outs)
    model_rate = flops_total / statistics.median(s)
    ratio = "1" if eng == "ours" else "-"
    if eng != "ours":
      pr = paired_ratios(rounds, eng)
      if pr:
        ratio = fmt_spread(pr, 2, "x")
    rows.append(
        f"| {eng} | {fmt_spread(s)} | {ratio} | {model_rate / 1e9:.1f} | "
        f"{mm / 1e9:.1f} | {100 * model_rate / mm:.0f}% | "
        f"{100 * model_rate / best:.0f}% | {outs[0]['allocator']} | "
        f"{outs[0]['threads']} | {outs[0]['version']} |"
    )
  return rows


# ---------------------------------------------------------- worker helpers


def read_spec() -> dict:
  """The worker's spec (JSON on stdin)."""
  return json.loads(sys.stdin.read())


def emit(result: dict) -> None:
  """The worker's one result line (the driver reads the last one)."""
  print("RESULT " + json.dumps(result), flush=True)


def log(*args) -> None:
  print(*args, file=sys.stderr, flush=True)


def matmul_rate(fn: Callable[[], Any], n: int, reps: int = 5) -> float:
  """FLOP/s of the fastest of `reps` wall-clock calls of `fn` (one blocking
  [n, n] @ [n, n] float32 product, after one untimed call)."""
  fn()
  best = float("inf")
  for _ in range(reps):
    t0 = time.perf_counter()
    fn()
    best = min(best, time.perf_counter() - t0)
  return 2 * n**3 / best


def rusage() -> dict:
  """CPU seconds and peak RSS of this process so far."""
  import resource  # pylint: disable=g-import-not-at-top

  r = resource.getrusage(resource.RUSAGE_SELF)
  return dict(
      user_s=r.ru_utime,
      sys_s=r.ru_stime,
      minflt=r.ru_minflt,
      peak_rss_gb=round(r.ru_maxrss / 2**20, 3),
  )


def summary(times: Sequence[float]) -> dict:
  """Per-process timing fields of a worker result."""
  return dict(
      s_per_iter=statistics.median(times),
      s_iters=[round(t, 4) for t in times],
  )


def write_tokenizer(folder: str, vocab_size: int) -> None:
  """tokenizer.json + tokenizer_config.json of the benchmark tokenizer: a
  whitespace word-level vocabulary "t0" .. "t<V-1>" (ids 0 .. V-1, the
  model's) plus <pad> = V, <eos> = V + 1, <unk> = V + 2, outside the model's
  vocabulary (never sampled)."""
  vocab = {token(i): i for i in range(vocab_size)}
  specials = [PAD, EOS, UNK]
  for j, s in enumerate(specials):
    vocab[s] = vocab_size + j
  tok = dict(
      version="1.0",
      truncation=None,
      padding=None,
      added_tokens=[
          dict(
              id=vocab_size + j,
              content=s,
              single_word=False,
              lstrip=False,
              rstrip=False,
              normalized=False,
              special=True,
          )
          for j, s in enumerate(specials)
      ],
      normalizer=None,
      pre_tokenizer=dict(type="WhitespaceSplit"),
      post_processor=None,
      decoder=None,
      model=dict(type="WordLevel", vocab=vocab, unk_token=UNK),
  )
  with open(os.path.join(folder, "tokenizer.json"), "w") as f:
    json.dump(tok, f)
  with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
    json.dump(
        dict(
            tokenizer_class="PreTrainedTokenizerFast",
            pad_token=PAD,
            eos_token=EOS,
            unk_token=UNK,
            bos_token=None,
            model_max_length=4096,
            padding_side="left",
            clean_up_tokenization_spaces=False,
        ),
        f,
        indent=2,
    )
