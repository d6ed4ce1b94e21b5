"""Step cost of configs/smollm2_calc.py: one GRPO iteration on both rollout paths.

Workload: SmolLM2-135M-Instruct with LoRA rank 8 (configs/smollm2_calc.py),
the calculator task; `--batch` episodes = `--batch / --group` tasks x
`--group` samples, the update in micro-batches of the config's size (4
rows: a larger `--batch` runs more of them, `make_config`). For each path
(`native`: environments/chat_arithmetic.py, the whole iteration one jitted
XLA program, `learner.make_rl_step`; `host`:
environments/host/chat_arithmetic.py, the Python tool driven turn by turn,
then one jitted program for the rest of the iteration) it builds the RL state
and the step main.py builds, runs one iteration (compilation included), then
`--iters` timed ones, and reports:

  seconds per stage   native: the one-program iteration, then its pieces
                      compiled and timed separately on the state after the
                      timed iterations: rollout (`stages.sample.rollout_round`
                      with the iteration's keys), the rest of collect
                      (`learner.make_collect_fn` given that rollout: rewards,
                      reference forward, advantages, packing) and the update
                      (`learner.make_update_fn`: forward + backward + AdamW).
                      host: the rollout (`host_rollout.rollout`, timed inside
                      the real iteration) and the rest of the iteration
                      ("learn": trim, reference forward, advantages, update).
  tokens by kind      of the [B, L] buffer (`token_kinds`): prompt (before
                      each row's first sampled token), sampled (POLICY),
                      observation (other tokens before the row's end: tool
                      messages and chat scaffolding), padding.
  FLOPs               counted from the shapes (`step_flops`) and the share of
                      the bound: FLOPs / (the f32 [n]^3 matmul rate measured in
                      this process, `peers.common.matmul_rate`) / seconds.
  memory              peak RSS of the process (getrusage ru_maxrss), and per
                      path the RSS with its state built (heap trimmed), the
                      peak from there through its iterations (VmHWM, reset
                      through /proc/self/clear_refs) and the RSS after it.

The report is printed, and with `--out` written after each path (a later
path's failure keeps the earlier ones; its traceback goes in the report).

Usage:
  python experiments/bench_smollm2_calc.py --batch=32 --group=4 \\
      [--init_from=runs/smollm2_calc/sft_<hash>_s0] [--paths=native,host] \\
      [--iters=2] [--out=experiments/bench_smollm2_calc.md] \\
      [--set=model.remat=True --set=rl.behaviour_logprobs=trainer]

`--init_from DIR`: start from the latest checkpoint of a finished SFT workdir
of `python -m experiments.smollm2_calc` (agentic_rl/seeds.py layout; the
state is restored as an RL arm resumes it, first seed of the workdir), so
that episodes call the tool; without it, fresh adapters on the imported
weights (no SFT: the model answers in prose, no tool call). `--set KEY=VALUE`
overrides a config field (repeatable), to measure one change at a time.

Run it on an otherwise idle machine: the load average is in the report.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import shlex
import statistics
import sys
import time
import traceback
from typing import Any, Callable, Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from agentic_rl import checkpoint as checkpoint_lib  # noqa: E402
from agentic_rl import host_memory  # noqa: E402
from agentic_rl import host_rollout  # noqa: E402
from agentic_rl import learner  # noqa: E402
from agentic_rl import loop  # noqa: E402
from agentic_rl import padding  # noqa: E402
from agentic_rl import seeds as seeds_lib  # noqa: E402
from agentic_rl import train  # noqa: E402
from agentic_rl import types  # noqa: E402
from agentic_rl.learner import common as learner_common  # noqa: E402
from agentic_rl.learner.rl_step import update_is_bucketed  # noqa: E402
from agentic_rl.learner.stages import sample as sample_stages  # noqa: E402
from configs import schema  # noqa: E402
from configs import smollm2_calc  # noqa: E402
from experiments import harness  # noqa: E402
from experiments import proc_memory  # noqa: E402
from experiments.peers import common  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET_S = 45.0  # a 32-episode GRPO step on 2 cores
TARGET_GB = 6.0  # peak RSS


# ------------------------------------------------------------ pure helpers


def token_kinds(role: Any, length: Any) -> dict[str, int]:
  """Counts of a [B, L] buffer's tokens by kind.

  Args:
    role: [B, L] token roles (types.PROMPT, POLICY, TOOL, TEMPLATE, PAD).
    length: [B] non-padding tokens of each row.

  Returns:
    prompt (positions before each row's first POLICY token: the prompt with
    its chat scaffolding; the whole row when it has none), sampled (POLICY
    tokens), observation (the other tokens before the row's end: tool
    messages and chat scaffolding between turns), padding (from the row's
    end), buffer (B * L) and tool_episodes (rows with a TOOL token after the
    prompt).
  """
  role = np.asarray(role)
  length = np.asarray(length)
  b, l = role.shape
  pos = np.arange(l)[None, :]
  inside = pos < length[:, None]
  policy = (role == types.POLICY) & inside
  prompt_end = np.where(policy.any(axis=1), policy.argmax(axis=1), length)
  prompt = pos < prompt_end[:, None]
  observation = inside & ~prompt & ~policy
  return {
      "prompt": int(prompt.sum()),
      "sampled": int(policy.sum()),
      "observation": int(observation.sum()),
      "padding": int((~inside).sum()),
      "buffer": int(b * l),
      "tool_episodes": int((observation & (role == types.TOOL)).any(1).sum()),
  }


def step_flops(
    m: dict,
    role: Any,
    length: Any,
    update_len: int,
    *,
    lora: bool = True,
    remat: bool = False,
    trainer_behaviour: bool = False,
    epochs: int = 1,
    prefix: int = 0,
    prefix_group: int = 1,
    sample_group: int = 1,
) -> dict[str, int]:
  """Model FLOPs of one GRPO iteration, counted from the shapes.

  With `common.forward_flops` (per token: 2 per projection weight, 2 * d * V
  where logits are computed, attention 4 * layers * heads * head_dim per
  unit of causal context):

    sample      a forward over every non-padding token of the buffer (the
                prompt and observations prefilled, the sampled tokens
                decoded from the KV cache), logits at the sampled ones,
                context position + 1.
    reference   a forward over [B, update_len], logits everywhere.
    behaviour   the same, with `trainer_behaviour` (else 0).
    update      `epochs` x (forward + backward) over [B, update_len]: the
                backward counts as one forward with `lora` (activation
                gradients only; the base is frozen, the adapters' matmuls
                are left out), two without; `remat` adds one forward.

  Args:
    m: the decoder's dims (common.MODEL's keys).
    role: [B, L] token roles of the iteration's rollout.
    length: [B] its rows' lengths.
    update_len: columns of the reference and update passes (L, or the
      trimmed length of a host batch).
    lora, remat, trainer_behaviour, epochs: as above.
    prefix, prefix_group, sample_group: the shared prompt
      (`rl.shared_prefix_len` = prefix > 0) as executed: the rollout's
      prefill computes the first `prefix` positions once per `sample_group`
      rows (`learner.common.rollout_shared_prefix`), the reference,
      behaviour and update forwards (and the backward) compute them, their
      logits included, once per `prefix_group` rows
      (`learner.common.shared_prefix`). 0 counts the unshared workload.

  Returns:
    {'sample', 'reference', 'behaviour', 'update', 'total'} in FLOPs.
  """
  role = np.asarray(role)
  length = np.asarray(length)
  b, l = role.shape
  pos = np.arange(l)[None, :]
  inside = pos < length[:, None]
  sampled = int(((role == types.POLICY) & inside).sum())
  context = int(((pos + 1) * inside).sum())
  sample = common.forward_flops(m, int(inside.sum()), sampled, context)
  t = int(update_len)
  forward = common.forward_flops(m, b * t, b * t, b * (t * (t + 1) // 2))
  if prefix:
    # Rows beyond the first of each group skip the prefix positions.
    skipped = lambda g: b - b // g
    s = min(prefix, t)
    sample -= skipped(sample_group) * common.forward_flops(
        m, s, 0, s * (s + 1) // 2
    )
    forward -= skipped(prefix_group) * common.forward_flops(
        m, s, s, s * (s + 1) // 2
    )
  out = dict(
      sample=sample,
      reference=forward,
      behaviour=forward if trainer_behaviour else 0,
      update=epochs * (2 + (0 if lora else 1) + (1 if remat else 0)) * forward,
  )
  out["total"] = sum(out.values())
  return out


def model_dims(model_cfg) -> dict:
  """common.MODEL-style dims of a TransformerConfig."""
  return dict(
      vocab_size=model_cfg.vocab_size,
      d_model=model_cfg.d_model,
      num_layers=model_cfg.num_layers,
      num_heads=model_cfg.num_heads,
      num_kv_heads=model_cfg.num_kv_heads or model_cfg.num_heads,
      head_dim=model_cfg.head_dim,
      ffn_dim=model_cfg.ffn_dim,
  )


# ------------------------------------------------------------ measurement


def gb(n_bytes: float) -> float:
  return n_bytes / 1e9


# The largest VmHWM read before a reset (`reset_hwm`): the kernel keeps one
# high-water mark, which ru_maxrss reads too, so a reset also lowers it.
_PEAK_BEFORE_RESETS = [0.0]


def peak_rss_gb() -> float:
  """Peak RSS of this process, GB = 1e9 bytes: the largest of ru_maxrss
  (KiB on Linux), the current VmHWM and every VmHWM read before a reset."""
  return max(
      gb(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024),
      _PEAK_BEFORE_RESETS[0],
      proc_status_gb("VmHWM") if os.path.exists("/proc/self/status") else 0,
  )


def proc_status_gb(field: str) -> float:
  """A /proc/self/status field in kB ('VmRSS', 'VmHWM') as GB, or NaN."""
  return gb(proc_memory.proc_status_kb(field) * 1024)


def reset_hwm() -> bool:
  """Resets VmHWM (the peak RSS /proc reports) to the current RSS (Linux
  >= 4.0: '5' to /proc/self/clear_refs); False where refused."""
  hwm = proc_status_gb("VmHWM")
  if hwm == hwm:  # not NaN
    _PEAK_BEFORE_RESETS[0] = max(_PEAK_BEFORE_RESETS[0], hwm)
  return proc_memory.reset_hwm()


def built_state_memory() -> dict:
  """With the path's state built: the heap trimmed (what building it freed,
  e.g. the restore's copies, returned), the RSS, and VmHWM reset so that it
  reads the peak of the iterations from here."""
  gc.collect()
  host_memory.release()
  return dict(rss_start=proc_status_gb("VmRSS"), hwm_reset=reset_hwm())


def matmul_gflops(n: int) -> float:
  """f32 [n]^3 jnp.matmul rate of this process (common.matmul_rate)."""
  a = jnp.asarray(np.random.default_rng(0).standard_normal((n, n)), jnp.float32)
  mm = jax.jit(jnp.matmul)
  return common.matmul_rate(lambda: mm(a, a).block_until_ready(), n) / 1e9


def timed(fn: Callable, *args) -> tuple[Any, float]:
  """(fn(*args) blocked until ready, its wall seconds)."""
  t0 = time.perf_counter()
  out = fn(*args)
  jax.block_until_ready(out)
  return out, time.perf_counter() - t0


def cpu_info() -> dict:
  model, avx512 = "unknown", False
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name") and model == "unknown":
          model = line.split(":", 1)[1].strip()
        if line.startswith("flags"):
          avx512 = avx512 or "avx512f" in line.split(":", 1)[1].split()
  except OSError:
    pass
  return dict(model=model, avx512f=avx512, cpus=os.cpu_count())


# ------------------------------------------------------------ state, steps


def sft_start(workdir: str) -> dict:
  """What `--init_from` needs from an SFT workdir's config.json."""
  with open(os.path.join(workdir, "config.json")) as f:
    saved = json.load(f)
  return dict(
      seeds=[int(s) for s in saved.get("seeds") or [saved.get("seed", 0)]],
      sft_steps=int(saved["sft"]["steps"]),
      model=saved.get("model", {}),
  )


def microbatch_rows(config) -> int:
  """Rows per update micro-batch of `config` (rl.batch_size /
  (rl.num_minibatches * rl.num_microbatches)); raises ValueError where they
  do not divide."""
  rl = config.rl
  blocks = rl.num_minibatches * rl.num_microbatches
  if rl.batch_size % blocks:
    raise ValueError(
        f"rl.batch_size={rl.batch_size} is not a multiple of "
        f"num_minibatches * num_microbatches = {blocks}"
    )
  return rl.batch_size // blocks


def make_config(path, batch, group, overrides, sft_steps=0, seed=None):
  """The config main.py runs, at `batch` episodes of `group` samples.

  The update's micro-batches keep the config's rows (`microbatch_rows`:
  16 episodes in 4 micro-batches = 4 rows), so a larger `--batch` runs more
  micro-batches of the same size, as a run at that batch size would: the
  update's activation memory is that of one micro-batch. A
  `--set rl.num_microbatches=N` override comes after and wins.
  """
  config = smollm2_calc.get_config("host" if path == "host" else None)
  rows = microbatch_rows(config)
  if batch % (rows * config.rl.num_minibatches):
    raise SystemExit(
        f"--batch={batch}: not a multiple of the config's {rows} rows per "
        "micro-batch"
    )
  config.rl.num_microbatches = batch // (rows * config.rl.num_minibatches)
  config.rl.batch_size, config.rl.group_size = batch, group
  # The RL phase begins after `sft_steps` (0: no SFT), as in the real run.
  config.sft.steps = sft_steps
  if seed is not None:
    config.seed = seed
  for item in overrides:  # 'model.remat=False', 'rl.behaviour_logprobs=sampler'
    key, _, value = item.partition("=")
    *parents, leaf = key.split(".")
    node = config
    for name in parents:
      node = node[name]
    node[leaf] = type(node[leaf])(
        value not in ("False", "false", "0")
        if isinstance(node[leaf], bool)
        else value
    )
  return schema.with_defaults(config)


def initial_state(config, model_cfg, init_from: str, start: dict | None):
  """(graphdef, the RL state, the restored checkpoint's step or None).

  Without `init_from`: fresh adapters, `train.start_rl`. With it: the
  workdir's latest intact checkpoint restored as agentic_rl/seeds.py resumes
  its runs (`loop.resume` with seeds.make_phases: a checkpoint at or after
  the SFT/RL boundary holds start_rl's structure), first seed taken.
  """
  if not init_from:
    graphdef, state = train.init_state(config, model_cfg)
    return graphdef, train.start_rl(config, state), None
  seeds = start["seeds"]
  graphdef, state = seeds_lib.init_states(config, seeds, model_cfg)
  phases = seeds_lib.make_phases(config, None, None)
  ckpt = checkpoint_lib.Checkpointer(os.path.join(init_from, "checkpoints"))
  checkpoints = loop.Checkpoints(
      ckpt,
      lambda like, step: learner.restore_train_state(ckpt, like, step=step),
  )
  state, step = loop.resume(state, phases, checkpoints)
  ckpt.close()
  if step is None:
    raise SystemExit(f"--init_from: no checkpoint in {ckpt.directory}")
  state = seeds_lib.unstack(state, len(seeds))[0]
  if step < config.sft.steps:  # an SFT-phase checkpoint: enter RL here
    state = train.start_rl(config, state)
  return graphdef, state, step


def flops_of(
    config, model_cfg, traj, update_len, executed=True, shared_prefill=True
) -> dict:
  """`step_flops` of the config's iteration: as executed (the shared prompt
  once per group, `rl.shared_prefix_len`; the rollout's prefill shares it
  with `shared_prefill`, the native path's, not the host rollout's), or the
  unshared workload."""
  shared = learner_common.shared_prefix(config.rl) if executed else None
  sample = learner_common.rollout_shared_prefix(config.rl)
  sample_group = sample.group if shared is not None and shared_prefill else 1
  return step_flops(
      model_dims(model_cfg),
      traj.role,
      traj.length,
      update_len,
      lora=model_cfg.lora is not None,
      remat=bool(config.model.remat),
      trainer_behaviour=config.rl.behaviour_logprobs == "trainer",
      epochs=int(config.rl.ppo_epochs),
      prefix=0 if shared is None else shared.length,
      prefix_group=1 if shared is None else shared.group,
      sample_group=sample_group,
  )


def stage(name, first, times, flops=None) -> dict:
  return dict(name=name, first_s=first, times=times, flops=flops)


def bench_native(config, env, model_cfg, args, start) -> dict:
  graphdef, state, step0 = initial_state(
      config, model_cfg, args.init_from, start
  )
  rl_step = learner.make_rl_step(
      config, env, graphdef, learner.make_optimizer(config.rl), model_cfg
  )
  out = dict(path="native", restored_step=step0, **built_state_memory())
  (state, m), out["first_s"] = timed(rl_step, state)
  out["times"] = []
  for _ in range(args.iters):
    (state, m), t = timed(rl_step, state)
    out["times"].append(t)
  out["metrics"] = {
      k: float(m[k]) for k in ("reward", "accuracy", "tool_calls") if k in m
  }
  out["hwm_iterations"] = proc_status_gb("VmHWM")
  out["rss_iterations"] = proc_status_gb("VmRSS")

  # The iteration's pieces, compiled and timed one by one on this state.
  rl = config.rl

  def rollout_stage(state):
    key = jax.random.fold_in(state.rng, state.step)  # as make_collect_fn
    return sample_stages.rollout_round(
        jax.random.fold_in(key, 1),  # as the sample stage's first round
        state.params,
        env=env,
        graphdef=graphdef,
        model_config=model_cfg,
        num_groups=rl.batch_size
        // rl.group_size
        * rl.dynamic_sampling_oversample,
        group_size=rl.group_size,
        max_len=config.max_len,
        temperature=rl.temperature,
        tree_branching=tuple(rl.tree_branching),
        num_tool_free=rl.dual_path_tool_free,
        shared_prefix=learner_common.rollout_shared_prefix(rl),
    )

  collect = learner.make_collect_fn(config, env, graphdef, model_cfg)
  update = learner.make_update_fn(
      config, graphdef, learner.make_optimizer(config.rl)
  )

  def update_stage(state, batch):
    return update(
        state.params,
        state.opt_state,
        batch,
        state.features["kl"],
        state.features.get("flowrl"),
        dropout_key=learner_common.adapter_dropout_key(config, state),
    )[:3]

  def run_stage(fn, *a):
    res, first = timed(fn, *a)
    return res, first, [timed(fn, *a)[1] for _ in range(args.iters)]

  traj, f1, t1 = run_stage(jax.jit(rollout_stage), state)
  (batch, _), f2, t2 = run_stage(jax.jit(collect), state, traj)
  _, f3, t3 = run_stage(jax.jit(update_stage), state, batch)
  bucketed = update_is_bucketed(config, env)
  out["update_len"] = config.max_len
  out["update_len_note"] = (
      "upper bound (rl.update_length_buckets: the update runs on a bucket)"
      if bucketed
      else ""
  )
  fl = flops_of(config, model_cfg, traj, config.max_len)
  out["flops"] = fl
  out["flops_workload"] = flops_of(
      config, model_cfg, traj, config.max_len, executed=False
  )
  out["tokens"] = token_kinds(traj.role, traj.length)
  out["stages"] = [
      stage("rollout (sampling, tool, KV cache)", f1, t1, fl["sample"]),
      stage(
          "rest of collect (rewards, reference forward, advantages)",
          f2,
          t2,
          fl["reference"] + fl["behaviour"],
      ),
      stage("update (forward + backward + AdamW)", f3, t3, fl["update"]),
  ]
  out["hwm_stages"] = proc_status_gb("VmHWM")
  out["rss_end"] = proc_status_gb("VmRSS")
  return out


def bench_host(config, env, model_cfg, args, start) -> dict:
  graphdef, state, step0 = initial_state(
      config, model_cfg, args.init_from, start
  )
  rl_step = learner.make_rl_step(
      config, env, graphdef, learner.make_optimizer(config.rl), model_cfg
  )
  out = dict(path="host", restored_step=step0, **built_state_memory())
  # The rollout inside the real iteration, timed (make_host_rollout_fn calls
  # host_rollout.rollout through the module).
  rollouts = []  # (trajectory, seconds) per iteration
  original = host_rollout.rollout

  def timed_rollout(*a, **k):
    traj, t = timed(lambda: original(*a, **k))
    rollouts.append((traj, t))
    return traj

  host_rollout.rollout = timed_rollout
  try:
    (state, m), out["first_s"] = timed(rl_step, state)
    out["times"] = []
    for _ in range(args.iters):
      (state, m), t = timed(rl_step, state)
      out["times"].append(t)
  finally:
    host_rollout.rollout = original
  if len(rollouts) != args.iters + 1:
    raise RuntimeError(
        f"{len(rollouts)} host rollouts in {args.iters + 1} iterations"
    )
  out["metrics"] = {
      k: float(m[k]) for k in ("reward", "accuracy", "tool_calls") if k in m
  }
  out["hwm_iterations"] = proc_status_gb("VmHWM")
  out["rss_iterations"] = proc_status_gb("VmRSS")
  lens = [
      padding.host_trim_length(config, np.asarray(traj.length))
      for traj, _ in rollouts
  ]
  out["update_lens"] = lens
  # Iterations whose trimmed length is new compile the learn program.
  out["new_bucket"] = [lens[i] not in lens[:i] for i in range(len(lens))]
  traj = rollouts[-1][0]  # the last timed iteration's batch
  out["update_len"] = lens[-1]
  out["update_len_note"] = "trimmed (padding.host_trim_length)"
  fl = flops_of(config, model_cfg, traj, lens[-1], shared_prefill=False)
  out["flops"] = fl
  out["flops_workload"] = flops_of(
      config, model_cfg, traj, lens[-1], executed=False
  )
  out["tokens"] = token_kinds(traj.role, traj.length)
  roll = [t for _, t in rollouts]
  total = [out["first_s"]] + out["times"]
  learn = [a - b for a, b in zip(total, roll)]
  out["stages"] = [
      stage(
          "rollout (host: Python tool, jitted turns)",
          roll[0],
          roll[1:],
          fl["sample"],
      ),
      stage(
          "learn (trim, rewards, reference forward, advantages, update)",
          learn[0],
          learn[1:],
          fl["total"] - fl["sample"],
      ),
  ]
  out["hwm_stages"] = out["hwm_iterations"]
  out["rss_end"] = proc_status_gb("VmRSS")
  return out


# ------------------------------------------------------------ report


def fmt_times(ts: Sequence[float]) -> str:
  return ", ".join(f"{t:.1f}" for t in ts) if ts else "-"


def med(ts: Sequence[float]) -> float:
  return statistics.median(ts) if ts else float("nan")


def share(flops: float | None, rate_gflops: float, seconds: float) -> str:
  if flops is None or not seconds or seconds != seconds:
    return "-"
  return f"{100 * flops / (rate_gflops * 1e9) / seconds:.0f}%"


def report(
    args, info: dict, results: list[dict], failures: list[str]
) -> list[str]:
  rate = max(info["matmul_start"], info.get("matmul_end", 0.0))
  dims = info["dims"]
  lines = [
      "# Step cost: SmolLM2-135M-Instruct + LoRA, configs/smollm2_calc.py",
      "",
      f"command: `{info['command']}`",
      "",
      f"- date {info['date']}; commit {info['commit']}; jax {jax.__version__}",
      f"- CPU: {info['cpu']['model']}, {info['cpu']['cpus']} cpus, avx512f "
      f"{'yes' if info['cpu']['avx512f'] else 'no'}; load average (1/5/15 min) "
      f"at start {info['load_start']}, at end {info.get('load_end', '-')}",
      f"- start: {info['start']}",
      f"- workload: {args.batch} episodes per iteration = "
      f"{args.batch // args.group} tasks x {args.group}; buffer L = "
      f"{info['max_len']}; update in {info['microbatches']} micro-batches "
      f"of {args.batch // info['microbatches']} rows (the config's rows per "
      f"micro-batch; `make_config`); overrides {args.set or 'none'}",
      f"- f32 [{args.matmul_n}]^3 matmul (jnp.matmul, this process): "
      f"{info['matmul_start']:.1f} GFLOP/s at start, "
      f"{info.get('matmul_end', float('nan')):.1f} at end; the bound uses the "
      f"faster, {rate:.1f} GFLOP/s",
      f"- targets: a {args.batch}-episode step <= {TARGET_S:.0f} s wall, peak "
      f"RSS <= {TARGET_GB:.0f} GB (GB = 1e9 bytes throughout)",
      "",
      "## Iteration",
      "",
      "| path | compile + 1st iteration (s) | timed iterations (s) | median (s) "
      f"| <= {TARGET_S:.0f} s | GFLOP / iteration | share of bound | peak RSS of "
      "the path's iterations (GB) | RSS after (GB) | reward / accuracy / tool "
      "calls (last iteration) |",
      "|---|---|---|---|---|---|---|---|---|---|",
  ]
  for r in results:
    s = med(r["times"])
    mt = r["metrics"]
    lines.append(
        f"| {r['path']} | {r['first_s']:.1f} | {fmt_times(r['times'])} | "
        f"{s:.1f} | {'yes' if s <= TARGET_S else 'no'} | "
        f"{r['flops']['total'] / 1e9:.0f} | {share(r['flops']['total'], rate, s)}"
        f" | {r['hwm_iterations']:.2f} | {r['rss_iterations']:.2f} | "
        f"{mt.get('reward', float('nan')):.3f} / "
        f"{mt.get('accuracy', float('nan')):.3f} / "
        f"{mt.get('tool_calls', float('nan')):.3f} |"
    )
  lines += [
      "",
      "## Seconds per stage",
      "",
      "| path | stage | compile + 1st (s) | timed (s) | median (s) | GFLOP | "
      "share of bound |",
      "|---|---|---|---|---|---|---|",
  ]
  for r in results:
    total = 0.0
    for st in r["stages"]:
      s = med(st["times"])
      total += s
      fl = st["flops"]
      lines.append(
          f"| {r['path']} | {st['name']} | {st['first_s']:.1f} | "
          f"{fmt_times(st['times'])} | {s:.1f} | "
          f"{'-' if fl is None else f'{fl / 1e9:.0f}'} | {share(fl, rate, s)} |"
      )
    lines.append(
        f"| {r['path']} | sum of the stages' medians (iteration median "
        f"{med(r['times']):.1f}) | | | {total:.1f} | "
        f"{r['flops']['total'] / 1e9:.0f} | {share(r['flops']['total'], rate, total)} |"
    )
  lines += [
      "",
      "## Tokens per iteration by kind",
      "",
      "| path | prompt | sampled | observation | padding | buffer [B, L] | "
      "episodes with a tool message | reference / update columns |",
      "|---|---|---|---|---|---|---|---|",
  ]
  for r in results:
    k = r["tokens"]
    lines.append(
        f"| {r['path']} | {k['prompt']} | {k['sampled']} | {k['observation']} "
        f"| {k['padding']} | {k['buffer']} | {k['tool_episodes']} | "
        f"{r['update_len']} {r['update_len_note']} |"
    )
  lines += [
      "",
      "## Memory",
      "",
      "- peak RSS of the whole process (ru_maxrss, model import and state "
      f"restore included): {peak_rss_gb():.2f} GB",
  ]
  for r in results:
    lines.append(
        f"- {r['path']}: RSS with its state built (heap trimmed) "
        f"{r['rss_start']:.2f} GB; peak from there through its iterations "
        f"{r['hwm_iterations']:.2f} GB, through its stage programs "
        f"{r['hwm_stages']:.2f} GB; RSS after {r['rss_end']:.2f} GB"
        + (
            ""
            if r["hwm_reset"]
            else " (VmHWM reset refused: these peaks are the process's so far)"
        )
    )
  body = common.forward_flops(dims, 1, 0, 0)
  vocab = common.forward_flops(dims, 0, 1, 0)
  attn = common.forward_flops(dims, 0, 0, 1)
  lines += [
      "",
      "## How the numbers are made",
      "",
      "- Timings are wall clock, each call blocked on its outputs. native: "
      "the iteration is one XLA program (`learner.make_rl_step`); its stages "
      "are the same pieces (`stages.sample.rollout_round` with the "
      "iteration's keys, `learner.make_collect_fn` given that rollout, "
      "`learner.make_update_fn`) jitted and timed separately on the state "
      "after the timed iterations, so their sum differs from the one "
      "program by what XLA does across the pieces. host: the rollout is "
      "timed inside the real iteration (`host_rollout.rollout`), learn = "
      "iteration - rollout; the learn program compiles once per trimmed "
      "length (`config.trim_bucket`-column buckets)"
      + "".join(
          f": update columns of the iterations {r['update_lens']}, a new "
          f"length (compiled in that iteration) {r['new_bucket']}"
          for r in results
          if r["path"] == "host"
      )
      + ".",
      "- Tokens (and the FLOPs) are of one batch: native, the rollout of "
      "the state after the timed iterations (the next iteration's batch); "
      "host, the last timed iteration's. prompt = positions before a row's "
      "first sampled token; observation = the other non-padding tokens "
      "after it (tool messages, chat scaffolding).",
      "- FLOPs per iteration, counted from the shapes (`step_flops`, with "
      "`experiments/peers/common.py` `forward_flops`): per token "
      f"{body / 1e6:.1f} MFLOP for the projections (2 per weight), "
      f"{vocab / 1e6:.1f} MFLOP for the vocabulary projection where logits "
      f"are computed, {attn:,} FLOP of attention per unit of causal context "
      "(about 276 MFLOP per token at ~100 context with logits: "
      "experiments/smollm2_calc/README.md). sample = a forward over every "
      "non-padding token of the buffer (prompt and observations prefilled, "
      "sampled tokens decoded), logits at the sampled tokens; reference = a "
      "forward over [B, T] with logits everywhere (T = the reference / "
      "update columns above); update = forward + backward over [B, T], the "
      "backward counted as one forward (activation gradients only: the base "
      "is frozen; LoRA's own matmuls, ~1%, left out); + one forward with "
      "remat, + one with trainer behaviour log-probs, x ppo_epochs. "
      "Embeddings, norms, softmaxes and the optimizer are left out; work the "
      "programs do beyond the count (decode steps of finished rows, "
      "128-position KV-cache buckets) is in the time, not in the count. "
      "Share of bound = FLOPs / matmul rate / seconds.",
  ]
  for r in results:
    work = r["flops_workload"]["total"]
    if work != r["flops"]["total"]:
      lines.append(
          f"- {r['path']}: the shared prompt (`rl.shared_prefix_len`) "
          "computes each group's first positions once (the prefill once per "
          "group on the native path; the reference and update forwards, "
          "their logits included, once per group / num_minibatches rows), so "
          "the FLOPs and shares above are of what runs: "
          f"{r['flops']['total'] / 1e9:.0f} GFLOP of the unshared workload's "
          f"{work / 1e9:.0f} (its share of the bound at the iteration median "
          f"would read {share(work, rate, med(r['times']))})."
      )
  if info.get("notes"):
    lines += [""] + [f"- {n}" for n in info["notes"]]
  if failures:
    lines += ["", "## Failures", ""] + [
        f"    {ln}" for f in failures for ln in f.splitlines()
    ]
  return lines


def write(path: str, lines: Sequence[str]) -> None:
  with open(path, "w") as f:
    f.write("\n".join(lines) + "\n")


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--paths", default="native,host")
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--group", type=int, default=4)
  parser.add_argument("--iters", type=int, default=2, help="timed iterations")
  parser.add_argument(
      "--init_from",
      default="",
      help="a finished SFT workdir (runs/smollm2_calc/sft_<hash>_s<seed>)",
  )
  parser.add_argument("--matmul_n", type=int, default=1024)
  parser.add_argument("--out", default="", help="also write the Markdown here")
  parser.add_argument(
      "--set",
      action="append",
      default=[],
      help="config override KEY=VALUE (repeatable), e.g. model.remat=False",
  )
  args = parser.parse_args()
  paths = [p for p in args.paths.split(",") if p]
  if not paths or any(p not in ("native", "host") for p in paths):
    raise SystemExit(f"--paths: native and/or host, got {args.paths!r}")
  if args.batch % args.group:
    raise SystemExit("--batch must be a multiple of --group")
  init_from = os.path.abspath(args.init_from) if args.init_from else ""
  args.init_from = init_from
  start = sft_start(init_from) if init_from else None
  info: dict[str, Any] = dict(
      command="python " + shlex.join(sys.argv),
      date=time.strftime("%Y-%m-%d %H:%M %Z"),
      commit=harness.git_commit(REPO),
      cpu=cpu_info(),
      load_start=" / ".join(f"{x:.2f}" for x in os.getloadavg()),
      notes=[],
  )
  info["matmul_start"] = matmul_gflops(args.matmul_n)
  results, failures = [], []
  for path in paths:
    extra = (
        {}
        if start is None
        else dict(sft_steps=start["sft_steps"], seed=start["seeds"][0])
    )
    config = make_config(path, args.batch, args.group, args.set, **extra)
    env = train.make_env(config)
    model_cfg = train.make_model_config(config)
    info["dims"] = model_dims(model_cfg)
    info["max_len"] = config.max_len
    info["microbatches"] = config.rl.num_minibatches * (
        config.rl.num_microbatches
    )
    if start is None:
      info["start"] = "fresh LoRA adapters on the imported weights (no SFT)"
    else:
      info["start"] = (
          f"SFT workdir {init_from} (seed {start['seeds'][0]} of "
          f"{start['seeds']}, {start['sft_steps']} SFT steps)"
      )
      now = json.loads(config.to_json_best_effort())["model"]
      diff = sorted(
          k
          for k in set(now) | set(start["model"])
          if now.get(k) != start["model"].get(k)
      )
      if diff:
        info["notes"].append(
            f"{path}: config.model differs from the SFT workdir's in {diff}"
        )
    try:
      bench = bench_native if path == "native" else bench_host
      r = bench(config, env, model_cfg, args, start)
      if r["restored_step"] is not None:
        info["start"] += f", restored checkpoint step {r['restored_step']}"
      results.append(r)
      print(json.dumps(r, default=str), flush=True)
    except Exception:  # pylint: disable=broad-except
      failures.append(f"{path}:\n{traceback.format_exc()}")
      print(failures[-1], file=sys.stderr, flush=True)
    # What this path compiled and allocated goes before the next begins.
    jax.clear_caches()
    gc.collect()
    host_memory.release()
    if args.out:  # so far (the next path may take long or fail)
      write(args.out, report(args, info, results, failures))
  info["matmul_end"] = matmul_gflops(args.matmul_n)
  info["load_end"] = " / ".join(f"{x:.2f}" for x in os.getloadavg())
  lines = report(args, info, results, failures)
  print("\n".join(lines), flush=True)
  if args.out:
    write(args.out, lines)
  if failures:
    sys.exit(1)


if __name__ == "__main__":
  main()
