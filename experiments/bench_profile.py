"""Where the one-jit RL iteration spends its time: per-op self time from a trace.

    python experiments/bench_profile.py                        # configs/default.py
    python experiments/bench_profile.py --config=kv_chain --iters=3 --top=40
    python experiments/bench_profile.py --workload=peers   # bench_peers' iteration

Builds the config's RL iteration (`learner.make_rl_step`, JAX-native
environments: one XLA program), runs it `--warmup` times, then traces `--iters`
iterations with `jax.profiler.trace`. XLA:CPU records one event per executed
thunk (a fusion, a dot, a while loop, ...) on the thread that ran it; events
nest (a while loop's body thunks run inside its event), so each event's self
time is its duration less that of the events directly inside it on the same
thread. Self times are summed per HLO instruction over all threads and divided
by `--iters`; each instruction is joined with its `op_name` metadata from the
compiled program's HLO text (the jax function and primitive it came from). The
rows are also summed by pass (`transpose(...)`: the update's backward;
`jvp(...)`: its forward; neither: rollout, reference and behaviour forwards,
rewards, advantages, optimizer) and primitive, and the [1024]^3 float32 matmul
rate is measured in the same process for scale.

Run it on an otherwise idle machine: self times on a shared CPU include time
the thread waited for a core.
"""

from __future__ import annotations

import collections
import glob
import importlib
import os
import re
import shutil
import sys
import tempfile
import time

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiments import bench_args  # pylint: disable=g-import-not-at-top

_CONFIG = flags.DEFINE_string("config", "default", "Config module in configs/.")
_ARG = flags.DEFINE_string("config_arg", "", "get_config(arg), e.g. smoke.")
_WARMUP = flags.DEFINE_integer("warmup", 2, "Untraced iterations first.", 1)
_ITERS = flags.DEFINE_integer("iters", 3, "Traced iterations.", 1)
_TOP = flags.DEFINE_integer("top", 30, "Instructions listed.", 1)
_WORKLOAD = flags.DEFINE_enum(
    "workload",
    "config",
    ["config", "peers"],
    "config: --config's RL iteration; peers: experiments/bench_peers.py's "
    "iteration of our engine (its 4.06M-parameter Qwen2 and one-turn "
    "environment, experiments/peers/ours_worker.py), --config ignored.",
)
_MICRO = flags.DEFINE_integer(
    "micro_batches",
    1,
    "--workload=peers: the update's gradient-accumulation micro-batches "
    "(bench_peers.py --micro_batches).",
    lower_bound=1,
)
_SHARED = flags.DEFINE_bool(
    "shared_prefix",
    False,
    "--workload=peers: the prompt once per group (rl.shared_prefix_len = the "
    "prompt length; bench_peers.py --shared_prefix).",
)

_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_OP_NAME = re.compile(r'op_name="([^"]*)"')


def self_times(events: list[tuple[int, int, str]]) -> dict[str, int]:
  """Self time per event name on one thread, in the events' time unit.

  Args:
    events: (start, duration, name) of one thread's events, any order.

  Returns:
    {name: summed duration less that of the events directly nested in it}
    (an event is nested in the innermost open event that contains it).
  """
  out = collections.Counter()
  stack: list[list] = []  # [end, name, child_total]
  for start, dur, name in sorted(events, key=lambda e: (e[0], -e[1])):
    while stack and stack[-1][0] <= start:
      end, n, child = stack.pop()
      out[n] -= child
    if stack:
      stack[-1][2] += dur
    out[name] += dur
    stack.append([start + dur, name, 0])
  while stack:
    _, n, child = stack.pop()
    out[n] -= child
  return dict(out)


def op_names(hlo_text: str) -> dict[str, str]:
  """{instruction name: op_name metadata} of a compiled program's HLO text."""
  out = {}
  for line in hlo_text.splitlines():
    m = _INSTR.match(line)
    if not m:
      continue
    meta = _OP_NAME.search(m.group(2))
    out[m.group(1)] = meta.group(1) if meta else ""
  return out


def op_class(op_name: str) -> str:
  """'<pass> <primitive>' of an op_name: pass 'backward' (under a
  transpose(...)), 'update forward' (under a jvp(...)), 'no gradient'
  otherwise; primitive is the path's last component ('dot_general',
  'reduce_sum', ...), '(none)' for an empty op_name."""
  if not op_name:
    return "(no op_name)"
  last = op_name.rsplit("/", 1)[-1]
  if "transpose(" in op_name:
    kind = "backward"
  elif "jvp(" in op_name:
    kind = "update forward"
  else:
    kind = "no gradient"
  return f"{kind} {last}"


def main(argv) -> None:
  del argv
  if (_MICRO.value != 1 or _SHARED.value) and _WORKLOAD.value != "peers":
    raise app.UsageError(
        "--micro_batches and --shared_prefix apply to --workload=peers; for a "
        "config, set its rl.num_microbatches / rl.shared_prefix_len"
    )
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jax.profiler import ProfileData  # pylint: disable=g-import-not-at-top

  from agentic_rl import learner  # pylint: disable=g-import-not-at-top
  from agentic_rl import train  # pylint: disable=g-import-not-at-top
  from configs import schema  # pylint: disable=g-import-not-at-top

  if _WORKLOAD.value == "peers":
    from experiments.peers import common  # pylint: disable=g-import-not-at-top
    from experiments.peers import ours_worker  # pylint: disable=g-import-not-at-top

    spec = dict(
        common.spec(False),
        micro_batches=_MICRO.value,
        shared_prefix=_SHARED.value,
    )
    if spec["episodes"] % _MICRO.value:
      raise app.UsageError(
          f"--micro_batches={_MICRO.value} must divide the "
          f"{spec['episodes']} episodes"
      )
    folder = os.path.join(tempfile.gettempdir(), "bench_peers_model")
    ours_worker.write_model_folder(
        folder, spec["model"], spec["prompt_len"] + spec["new_tokens"]
    )
    config = ours_worker.ours_config(spec, folder)
    env = ours_worker.BenchEnv(
        prompts=tuple(tuple(p) for p in spec["prompts"]),
        max_action_len=spec["new_tokens"],
    )
  else:
    mod = importlib.import_module(f"configs.{_CONFIG.value}")
    config = schema.with_defaults(mod.get_config(_ARG.value or None))
    env = train.make_env(config)
  model_cfg = train.make_model_config(config)
  graphdef, state = train.init_state(config, model_cfg)
  state = train.start_rl(config, state)
  step = learner.make_rl_step(
      config, env, graphdef, learner.make_optimizer(config.rl), model_cfg
  )
  if not hasattr(step, "lower"):
    raise app.UsageError(
        f"configs/{_CONFIG.value}.py has a host (Python-tool) environment: "
        "its iteration is not one XLA program"
    )
  hlo = op_names(step.lower(state).compile().as_text())
  walls = []
  for _ in range(_WARMUP.value):
    t0 = time.perf_counter()
    state, m = step(state)
    jax.block_until_ready(m)
    walls.append(time.perf_counter() - t0)
  n = 1024
  a = jnp.asarray(np.random.default_rng(0).standard_normal((n, n)), jnp.float32)
  mm = jax.jit(jnp.matmul)
  mm(a, a).block_until_ready()
  best = float("inf")
  for _ in range(5):
    t0 = time.perf_counter()
    mm(a, a).block_until_ready()
    best = min(best, time.perf_counter() - t0)
  trace_dir = tempfile.mkdtemp(prefix="bench_profile_")
  t0 = time.perf_counter()
  with jax.profiler.trace(trace_dir):
    for _ in range(_ITERS.value):
      state, m = step(state)
      jax.block_until_ready(m)
  traced = (time.perf_counter() - t0) / _ITERS.value
  path = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)
  data = ProfileData.from_file(path[0])
  shutil.rmtree(trace_dir, ignore_errors=True)
  per_name = collections.Counter()
  counts = collections.Counter()
  for plane in data.planes:
    for line in plane.lines:
      events = [
          (ev.start_ns, ev.duration_ns, ev.name)
          for ev in line.events
          if ev.name in hlo
      ]
      for name, t in self_times(events).items():
        per_name[name] += t
      for _, _, name in events:
        counts[name] += 1
  iters = _ITERS.value
  total = sum(per_name.values()) / iters / 1e6
  print(
      f"workload={_WORKLOAD.value} config={_CONFIG.value} iters={iters} untraced s/iter "
      f"{np.median(walls):.3f}; traced s/iter {traced:.3f}; thunk self time "
      f"{total:.1f} ms/iter summed over threads; XLA f32 [1024]^3 matmul "
      f"{2 * n**3 / best / 1e9:.1f} GFLOP/s; load {os.getloadavg()[0]:.2f}"
  )
  print(f"\ntop {_TOP.value} instructions by self time (ms per iteration):")
  for name, t in per_name.most_common(_TOP.value):
    print(
        f"{t / iters / 1e6:9.2f} ms {100 * t / iters / 1e6 / total:5.1f}% "
        f"{counts[name] / iters:8.0f}x  {name:28s} {hlo[name][:110]}"
    )
  groups = collections.Counter()
  for name, t in per_name.items():
    groups[op_class(hlo[name])] += t
  print(
      "\nby pass and primitive (pass from the op_name: transpose(...) = the "
      "update's backward, jvp(...) = its forward, else no gradient: rollout, "
      "reference and behaviour forwards, rewards, advantages, optimizer):"
  )
  for g, t in groups.most_common(25):
    print(
        f"{t / iters / 1e6:9.2f} ms {100 * t / iters / 1e6 / total:5.1f}%  {g}"
    )


if __name__ == "__main__":
  app.run(bench_args.one_line_usage_errors(main))
