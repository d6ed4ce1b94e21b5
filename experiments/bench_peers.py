"""One GRPO iteration: our engine, TRL and tunix side by side on one tiny model.

    python experiments/bench_peers.py                  # 3 rounds x 16 iterations
    python experiments/bench_peers.py --rounds=5 --iters=16 --allocator=keep \
        --out=experiments/bench_peers.md
    python experiments/bench_peers.py --tiny --rounds=1 --iters=1 --engines=trl

The peers are optional, benchmark-only tools, each in a virtualenv of its own
(install commands and versions: experiments/peers/README.md); an engine whose
interpreter is absent is skipped with one line.

Model (the same weights for all three): a Qwen2-architecture decoder of
4,059,392 parameters built from a config, nothing downloaded: vocabulary 480,
d_model 256, 4 layers, 4 query / 2 key-value heads of 64, SwiGLU 1024,
q/k/v biases, tied embeddings, RoPE theta 1e4, RMSNorm eps 1e-6, float32
(experiments/peers/common.py MODEL). Our initialiser draws it once (seed 0)
and writes it as a Hugging Face folder (agentic_rl.models.hf.save_pretrained:
config.json + model.safetensors) with a word-level tokenizer ("t0" .. "t479"
for the model's ids; <pad>, <eos> and <unk> are ids 480-482, outside the
model's vocabulary, so no engine can sample a stop or padding token). Ours
imports the folder through config.model.hf_path, TRL through
AutoModelForCausalLM.from_pretrained, tunix through
tunix.models.qwen2.params.create_model_from_safe_tensors.

Workload of one iteration (every engine): 16 fixed prompts of 32 token ids
(random.Random(0)) x group 4 = 64 episodes, each sampled at temperature 1
(no top-k / top-p) to exactly 64 new tokens; reward = the share of the
completion's tokens with an even id (negligible cost; it almost surely
varies within each group, so every update is non-zero); GRPO group-normalised
advantages; a KL penalty to the frozen reference (the initial weights) with
the k3 estimator, beta 0.04; one AdamW step (learning rate 1e-3, gradient
clipped to norm 1) on the whole batch; float32 throughout. Model FLOPs of
the iteration, counted from the config (common.iteration_flops: sampling
prefill + KV-cache decode, the reference forward, the policy forward +
backward): 252.2 GFLOP.

Each engine's iteration, through its own GRPO trainer:

  ours   configs/default.py with the overrides of
         experiments/peers/ours_worker.py `ours_config`:
         learner.make_rl_step (rollout with the KV cache, rewards,
         advantages, reference log-probs, update: one jitted XLA program) on
         a one-turn environment (ours_worker.BenchEnv: the fixed prompts, no stop
         tokens, reward fact call_score), behaviour log-probs from the sampler
         (rl.behaviour_logprobs='sampler': no second policy forward, as the
         peers with one update per batch), loss 'ppo' token-mean. Timed per
         call, each call blocked on its metrics.
  trl    trl.GRPOTrainer (GRPOConfig: per_device_train_batch_size 64,
         num_generations 4, gradient_accumulation_steps 1, max_completion_length
         64, beta 0.04, use_vllm False, use_cpu, float32): generation with
         transformers `generate` (KV cache), the reference model's log-probs,
         the loss forward + backward and the optimizer step of one training
         step; its default loss and its default AdamW (torch). Timed by a
         TrainerCallback: the time between consecutive on_step_end events.
  tunix  tunix.GRPOLearner on an RLCluster (rollout engine 'vanilla': tunix's
         jitted sampler with a KV cache of exactly 32 + 64 positions; actor,
         reference and rollout on one CPU mesh; GRPOConfig num_generations 4,
         num_iterations 1, beta 0.04, kl_loss_mode 'low_var_kl' = k3); optax
         AdamW after global-norm clipping; one global step = the iteration.
         Timed between the ends of consecutive global steps, each ended by
         blocking on the actor's parameters.

Micro-batches (`--micro_batches=N`, default 1: the same offer to every
engine; or per engine, `--micro_batches=ours=2,trl=1,tunix=1`, e.g. each
engine at its own faster setting on the 2-core machine (ours 2 at its two
XLA CPU devices, 4 at one), still paired by round): the update's batch
is cut into N micro-batches whose gradients are accumulated into the one
optimizer step (the same loss and gradient up to float summation order), and
the reference log-probs are computed in chunks of the same size; sampling
always runs on the whole batch. ours: rl.num_microbatches = N. TRL:
per_device_train_batch_size = 64 / N with gradient_accumulation_steps = N (one
`generate` call still samples all 64: its generation batch is the product).
tunix: mini_batch_size = 16 prompts, train_micro_batch_size and
compute_logps_micro_batch_size = 16 / N prompts, rollout_micro_batch_size = 16
prompts. On a CPU the point is the cache: at N = 1 the update's largest
activations ([64 x 96, 2 x 1024] float32 for the fused gate/up product, 50 MB)
exceed the 32 MB L3 of the benchmark machine.

Shared prefix (`--shared_prefix`, ours only): `rl.shared_prefix_len` = 32,
so our prefill, reference forward and update compute each group's 32-token
prompt once instead of four times (arXiv:2506.05433; same log-probs and
gradient up to float summation order). The workload and the bound are
unchanged; the report adds the FLOPs ours then executes and its share of the
bound on those. TRL and tunix have no such setting.

Protocol: each (round, engine) is a fresh process, the engines interleaved and
their order rotated every round (ours, trl, tunix; trl, tunix, ours; ...).
A process builds its trainer, runs `warmup_iters` (2) untimed iterations
(compilation and first-call costs), measures its own float32 [1024]^3 matmul
rate (fastest of 5 wall-clock calls, all threads as the engine has them:
jax.numpy for ours and tunix, torch.matmul for TRL), then runs `--iters`
timed iterations (wall clock). Reported per engine: the median over rounds of
each process's median s/iteration with [min, max], the paired per-round ratio
engine / ours (same round, so the same machine state), the model FLOP rate
(the 252.2 GFLOP / s per iteration) as a share of the engine's own matmul
rate and of the best matmul rate of the run. Threads: every engine uses the
machine's cores as it finds them (nothing pinned; the table gives torch's
thread count and XLA's CPU and device counts).

XLA CPU devices (`--cpu_devices`; by default ours gets the count `python
main.py` picks for its config on this machine, 2 on 2+ cores here
(`sharding.cpu_device_count`), and tunix 1, its faster setting on the 2-core
machine; N for both JAX engines or per engine, 'ours=2,tunix=1'; TRL runs
torch's threads and has no such setting):
the engine's process gets XLA_FLAGS=--xla_force_host_platform_device_count=N
(common.cpu_devices_env). XLA's CPU client runs each device's share of a
sharded program on its own thread: ours runs its rows over a (data N) mesh
(train.py's default mesh, ambient as in a `main.py` run), tunix its 'fsdp'
axis (its data-parallel axis, parameters split over it) over the N devices.
With one device only XLA's intra-op threads use a second core, and they split
only large operations: the decode steps of this small batch run on one core.

Allocator (`--allocator`, the same offer to every engine; what each process
actually ran with is printed: jemalloc is detected in /proc/self/maps):
  default   as shipped: ours its package default (agentic_rl/host_memory.py
            'keep', mallopt at import), the peers glibc as it comes;
  system    glibc as it comes for all;
  keep      ours AGENTIC_RL_HOST_MEMORY=keep, the peers MALLOC_ARENA_MAX=1,
            MALLOC_MMAP_MAX_=0, MALLOC_TRIM_THRESHOLD_=2147483647 (the same
            three settings through glibc's environment);
  jemalloc  all preloaded with libjemalloc.so.2, MALLOC_CONF=retain:true,
            dirty_decay_ms:-1,muzzy_decay_ms:-1 (Debian package libjemalloc2).

Departures (what the trainers cannot be made to do identically):
  - The ratio's old log-probs: TRL and tunix, with one update per batch, use
    the detached log-probs of the loss's own forward (ratio exactly 1); ours
    uses the sampler's recorded log-probs (equal up to float rounding).
    None of the three runs an extra forward for them.
  - Loss and optimizer constants are each trainer's default: TRL loss_type
    'dapo', torch AdamW 'adamw_torch_fused' (betas 0.9/0.999), linear
    schedule made constant; tunix 'sequence-mean-token-mean', optax.adamw
    (0.9/0.999); ours 'token-mean', betas 0.9/0.99. Same FLOPs.
  - Work beyond the counted model FLOPs is in each engine's time, not in the
    count: tunix's prefill computes logits at every prompt position (TRL's
    `generate` and ours only at the last); TRL and tunix compute the policy's
    entropy in the loss forward; ours reads its KV cache in 128-position
    buckets (decode_bucket) and extends the cache once more after the last
    sampled token.
  - Host work: TRL tokenizes the prompts and decodes the completions to text
    for the reward in Python every step, tunix does both on the host between
    its jitted sampler, reference and train programs; ours stays in one XLA
    program. Each engine's real cost, kept in.
  - tunix samples every step from PRNGKey(0) (its RolloutConfig.seed
    default); the policy changes each step, so the samples differ anyway.

--tiny: a 2-layer d_model 32 model, 2 prompts x 4 = 8 episodes of 8 + 8
tokens, [256]^3 matmul, one warm-up iteration: seconds per engine, for
checking the pipeline, not for numbers.
"""

from __future__ import annotations

import json
import os
import subprocess
import statistics
import sys
import tempfile

from absl import app
from absl import flags

# Runnable as a script from anywhere (`python experiments/bench_peers.py`).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from agentic_rl import sharding  # pylint: disable=g-import-not-at-top
from experiments import bench_args  # pylint: disable=g-import-not-at-top
from experiments.peers import common  # pylint: disable=g-import-not-at-top
from experiments.peers import ours_worker  # pylint: disable=g-import-not-at-top

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ENGINES = ("ours", "trl", "tunix")
# The engines on XLA, whose CPU device count --cpu_devices sets.
JAX_ENGINES = ("ours", "tunix")
WORKERS = {
    "ours": os.path.join(REPO, "experiments", "peers", "ours_worker.py"),
    "trl": os.path.join(REPO, "experiments", "peers", "trl_worker.py"),
    "tunix": os.path.join(REPO, "experiments", "peers", "tunix_worker.py"),
}

_ROUNDS = flags.DEFINE_integer("rounds", 3, "Processes per engine.", 1)
_ITERS = flags.DEFINE_integer(
    "iters", 16, "Timed iterations per process.", lower_bound=1
)
_ENGINES = flags.DEFINE_list("engines", list(ENGINES), f"Subset of {ENGINES}.")
_ALLOCATOR = flags.DEFINE_enum(
    "allocator",
    "default",
    list(common.ALLOCATORS),
    "Allocator offered to every engine (see the module docstring).",
)
_MICRO = flags.DEFINE_string(
    "micro_batches",
    "1",
    "Gradient-accumulation micro-batches per optimizer step: N for every "
    "engine, or per engine as 'ours=4,trl=1,tunix=1' (engines not named: 1); "
    "each must divide the number of prompts (see the module docstring).",
)
_SHARED = flags.DEFINE_bool(
    "shared_prefix",
    False,
    "ours only: rl.shared_prefix_len = the prompt length, so the prefill, "
    "the reference forward and the update compute each group's prompt once "
    "(see the module docstring); TRL and tunix have no such setting.",
)
_DEVICES = flags.DEFINE_string(
    "cpu_devices",
    "",
    "XLA CPU devices of the JAX engines (ours, tunix): N for both, or per "
    "engine as 'ours=2,tunix=1' (engines not named: 1); each must divide the "
    "number of prompts (see the module docstring). TRL: not applicable. "
    "'' (default): ours the count `python main.py` picks for its config "
    "(sharding.cpu_device_count), tunix 1 (its faster setting here).",
)
_OUT = flags.DEFINE_string("out", "", "Also write the Markdown report here.")
_TINY = flags.DEFINE_bool("tiny", False, "Shrunk shapes: a seconds-long check.")
_TRL_PYTHON = flags.DEFINE_string(
    "trl_python", "/opt/peers/trl/bin/python", "Interpreter of the TRL venv."
)
_TUNIX_PYTHON = flags.DEFINE_string(
    "tunix_python",
    "/opt/peers/tunix/bin/python",
    "Interpreter of the tunix venv.",
)
_MODEL_DIR = flags.DEFINE_string(
    "model_dir",
    "",
    "Where the shared HF folder is written (default: a folder in the temp dir).",
)


def interpreter(engine: str) -> str:
  if engine == "ours":
    return sys.executable
  return _TRL_PYTHON.value if engine == "trl" else _TUNIX_PYTHON.value


def run_process(engine: str, spec: dict, env: dict) -> tuple:
  """(result dict or None, error text) of one engine's process."""
  cmd = [interpreter(engine), WORKERS[engine]]
  p = subprocess.run(
      cmd,
      input=json.dumps(spec),
      env=env,
      cwd=REPO,
      capture_output=True,
      text=True,
      check=False,
  )
  got = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
  if p.returncode or not got:
    return None, f"exit {p.returncode}\n{p.stderr[-3000:]}"
  return json.loads(got[-1][len("RESULT ") :]), ""


def main(argv) -> None:
  del argv
  engines = [e for e in _ENGINES.value if e]
  bad = [e for e in engines if e not in ENGINES]
  if bad:
    raise app.UsageError(f"--engines: unknown {bad}; choose from {ENGINES}")
  if _ALLOCATOR.value == "jemalloc" and not os.path.exists(common.JEMALLOC):
    raise app.UsageError(
        f"--allocator=jemalloc: {common.JEMALLOC} not found (Debian package "
        "libjemalloc2)"
    )
  lines = []

  def say(s=""):
    print(s, flush=True)
    lines.append(s)

  runnable = []
  for e in engines:
    exe = interpreter(e)
    if e != "ours" and not os.access(exe, os.X_OK):
      say(
          f"{e}: skipped ({exe} not found; install commands in "
          f"experiments/peers/README.md, or pass --{e}_python)"
      )
    else:
      runnable.append(e)
  if not runnable:
    say("no engine to run")
    return
  spec = common.spec(_TINY.value)
  spec["iters"] = _ITERS.value
  micro = bench_args.parse_micro_batches(
      _MICRO.value, spec["num_prompts"], ENGINES
  )
  if _DEVICES.value.strip():
    devices = bench_args.parse_cpu_devices(
        _DEVICES.value, spec["num_prompts"], JAX_ENGINES
    )
  else:
    devices = dict.fromkeys(JAX_ENGINES, 1)
    # What main.py would give ours' config on this machine.
    count, _ = sharding.cpu_device_count(
        ours_worker.ours_config(
            dict(
                spec,
                micro_batches=micro["ours"],
                shared_prefix=_SHARED.value,
            ),
            "",
        ),
        len(os.sched_getaffinity(0)),
        {},  # the bench sets each engine's count itself
    )
    # ... and whole groups on each device (the check below).
    if not count or (spec["num_prompts"] // micro["ours"]) % count:
      count = 1
    devices["ours"] = count
  for e, n in devices.items():
    if (spec["num_prompts"] // micro[e]) % n:
      raise app.UsageError(
          f"--cpu_devices: {e}'s {n} devices must divide the "
          f"{spec['num_prompts'] // micro[e]} prompts of each of its "
          f"{micro[e]} micro-batches (whole groups on every device)"
      )
  folder = _MODEL_DIR.value or os.path.join(
      tempfile.gettempdir(),
      "bench_peers_model" + ("_tiny" if _TINY.value else ""),
  )
  params = ours_worker.write_model_folder(
      folder, spec["model"], spec["prompt_len"] + spec["new_tokens"]
  )
  if params != spec["params"]:
    raise AssertionError(f"params {params} != counted {spec['params']}")
  spec["folder"] = folder
  flops = spec["flops"]
  say(f"command: `python {' '.join(sys.argv)}`")
  say(
      f"model: Qwen2 {params:,} parameters {json.dumps(spec['model'])} "
      f"(HF folder {folder})"
  )
  say(
      f"iteration: {spec['num_prompts']} prompts x {spec['group_size']} = "
      f"{spec['episodes']} episodes of {spec['prompt_len']} + "
      f"{spec['new_tokens']} tokens, KL k3 beta {spec['beta']}, one AdamW "
      f"step; model GFLOP {flops['total'] / 1e9:.4g} (sample "
      f"{flops['sample'] / 1e9:.4g}, reference {flops['reference'] / 1e9:.4g}"
      f", policy fwd+bwd {flops['policy'] / 1e9:.4g})"
  )
  jax_devices = [f"{e} {devices[e]}" for e in runnable if e in devices]
  device_note = (
      "; XLA CPU devices " + ", ".join(jax_devices) if jax_devices else ""
  )
  say(
      f"{_ROUNDS.value} rounds x {_ITERS.value} timed iterations after "
      f"{spec['warmup_iters']} warm-up; micro-batches "
      + ", ".join(
          f"{e} {micro[e]} of {spec['episodes'] // micro[e]} episodes"
          for e in runnable
      )
      + device_note
      + "; allocator offer "
      f"'{_ALLOCATOR.value}'; cpus {os.cpu_count()}; load average at start "
      f"{os.getloadavg()[0]:.2f}"
  )
  results = {e: [] for e in runnable}
  for r in range(_ROUNDS.value):
    for e in common.round_order(runnable, r):
      env = common.allocator_env(_ALLOCATOR.value, e, dict(os.environ))
      if e in devices:
        env = common.cpu_devices_env(devices[e], env)
      out, err = run_process(
          e,
          dict(
              spec,
              micro_batches=micro[e],
              shared_prefix=_SHARED.value and e == "ours",
          ),
          env,
      )
      if out is None:
        say(f"round {r} {e}: failed ({err})")
        continue
      out["round"] = r
      results[e].append(out)
      say(
          f"round {r} {e:5s} {out['s_per_iter']:.3f} s/iter (iterations "
          f"{out['s_iters']}); warm-up {out['warmup_s']:.1f} s; matmul "
          f"{out['matmul_flops'] / 1e9:.1f} GFLOP/s; completion tokens "
          f"{out['completion_tokens']}; reward {out['reward']:.3f} kl "
          f"{out['kl']:.2e}; user {out['user_s_per_iter']:.2f} sys "
          f"{out['sys_s_per_iter']:.2f} s/iter; accumulation "
          f"{out.get('accumulation', '?')}; peak RSS "
          f"{out['peak_rss_gb']:.2f} GB; params {out['params']:,}; "
          f"{out['allocator']}; {out['threads']}; {out['version']}"
      )
  say("")
  for row in common.table(results, flops["total"]):
    say(row)
  if _SHARED.value and results.get("ours"):
    executed = common.shared_prefix_flops(
        spec["model"],
        spec["episodes"],
        spec["group_size"],
        spec["prompt_len"],
        spec["new_tokens"],
    )["total"]
    s_ours = statistics.median(o["s_per_iter"] for o in results["ours"])
    best = max(o["matmul_flops"] for outs in results.values() for o in outs)
    say(
        f"\nours with the shared prefix executes {executed / 1e9:.4g} of the "
        f"workload's {flops['total'] / 1e9:.4g} GFLOP (each group's prompt "
        f"once); on those, {100 * executed / s_ours / best:.0f}% of the best "
        "bound (the table's shares count the workload's FLOPs, as for every "
        "engine)"
    )
  say(f"\nload average at end {os.getloadavg()[0]:.2f}")
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
  app.run(bench_args.one_line_usage_errors(main))
