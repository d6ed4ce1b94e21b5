"""In-process A/B of one setting on bench_peers' GRPO iteration of our engine.

    python experiments/bench_ab.py --target=config:rl.num_microbatches \
        --values='1|4' --iters=12
    python experiments/bench_ab.py \
        --target=agentic_rl.learner.update.SOME_FLAG --values='False|True'

Why in one process: separate processes of the same program differ by up to
~15% on this 2-core machine (1.13-1.30 s per iteration for identical code in
bench_peers' rounds), which hides a 2-5% change. Here every variant is built
and compiled in one process, then their iterations are interleaved (A B, B A,
A B, ...), so the machine state each sees is the same and the paired
per-iteration differences measure the change.

`--target` is either `config:<dotted path>` (a field of bench_peers' config,
experiments/peers/ours_worker.py `ours_config`, set before building the
variant) or `<module>.<ATTRIBUTE>` (a module-level constant read while the
step is traced, set before the variant's first call compiles it; it is left at
the last value, so a constant read again after compilation would see that). `--values`
are Python literals separated by '|'. Each variant runs `warmup` (2) untimed
iterations on its own state first.

Prints per variant the median and [min, max] seconds per iteration, and for
two variants the paired difference (second - first: median, mean, standard
deviation) and the ratio of the medians. `--tiny` uses bench_peers' shrunk
workload (a seconds-long check of the script, not for numbers).
"""

from __future__ import annotations

import importlib
import os
import sys
import tempfile
import time

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiments import bench_args  # pylint: disable=g-import-not-at-top

_TARGET = flags.DEFINE_string(
    "target", None, "config:<path> or <module>.<ATTRIBUTE>.", required=True
)
_VALUES = flags.DEFINE_string(
    "values", None, "Python literals separated by '|'.", required=True
)
_ITERS = flags.DEFINE_integer(
    "iters", 12, "Timed iterations per variant.", lower_bound=1
)
_WARMUP = flags.DEFINE_integer(
    "warmup", 2, "Untimed iterations per variant.", lower_bound=1
)
_MICRO = flags.DEFINE_integer(
    "micro_batches",
    1,
    "bench_peers' --micro_batches for every variant (a config: target "
    "overrides it).",
    lower_bound=1,
)
_TINY = flags.DEFINE_bool("tiny", False, "bench_peers' shrunk workload.")
_SHARED = flags.DEFINE_bool(
    "shared_prefix",
    False,
    "bench_peers' --shared_prefix for every variant (rl.shared_prefix_len = "
    "the prompt length; a config: target overrides it).",
)


def main(argv) -> None:
  del argv
  values = bench_args.parse_values(_VALUES.value)
  target = _TARGET.value
  module = attr = None
  if target.startswith("config:"):
    path = target[len("config:") :]
  else:
    if "." not in target:
      raise app.UsageError(
          f"--target={target}: expected config:<path> or <module>.<ATTRIBUTE>"
      )
    mod_name, attr = target.rsplit(".", 1)
    try:
      module = importlib.import_module(mod_name)
    except ImportError as e:
      raise app.UsageError(f"--target={target}: {e}") from e
    if not hasattr(module, attr):
      raise app.UsageError(f"--target={target}: {mod_name} has no {attr}")

  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  from agentic_rl import learner  # pylint: disable=g-import-not-at-top
  from agentic_rl import train  # pylint: disable=g-import-not-at-top
  from experiments.peers import common  # pylint: disable=g-import-not-at-top
  from experiments.peers import ours_worker  # pylint: disable=g-import-not-at-top

  spec = dict(
      common.spec(_TINY.value),
      micro_batches=_MICRO.value,
      shared_prefix=_SHARED.value,
  )
  folder = os.path.join(
      tempfile.gettempdir(),
      "bench_peers_model" + ("_tiny" if _TINY.value else ""),
  )
  if module is None:  # a bad path or value type fails here, before any work
    for v in values:
      bench_args.set_config_path(ours_worker.ours_config(spec, folder), path, v)
  ours_worker.write_model_folder(
      folder, spec["model"], spec["prompt_len"] + spec["new_tokens"]
  )
  env = ours_worker.BenchEnv(
      prompts=tuple(tuple(p) for p in spec["prompts"]),
      max_action_len=spec["new_tokens"],
  )
  steps, states = [], []
  for v in values:
    config = ours_worker.ours_config(spec, folder)
    if module is None:
      bench_args.set_config_path(config, path, v)
    else:
      setattr(module, attr, v)
    model_cfg = train.make_model_config(config)
    graphdef, state = train.init_state(config, model_cfg)
    state = train.start_rl(config, state)
    step = learner.make_rl_step(
        config, env, graphdef, learner.make_optimizer(config.rl), model_cfg
    )
    try:  # traced, not compiled: a value the program rejects fails here
      jax.eval_shape(step, state)
    except ValueError as e:
      raise app.UsageError(f"--target={target}, value {v!r}: {e}") from e
    steps.append(step)
    states.append(state)
  for j, v in enumerate(values):
    if module is not None:
      setattr(module, attr, v)
    for _ in range(_WARMUP.value):  # the first call compiles this variant
      states[j], m = steps[j](states[j])
      jax.block_until_ready(m)
  times = [[] for _ in values]
  for i in range(_ITERS.value):
    order = range(len(values)) if i % 2 == 0 else reversed(range(len(values)))
    for j in order:
      t0 = time.perf_counter()
      states[j], m = steps[j](states[j])
      jax.block_until_ready(m)
      times[j].append(time.perf_counter() - t0)
  print(
      f"target {target}; {_ITERS.value} interleaved iterations per variant "
      f"after {_WARMUP.value} warm-up; micro-batches "
      f"{'per variant' if target == 'config:rl.num_microbatches' else _MICRO.value}"
      "; load "
      f"{os.getloadavg()[0]:.2f}"
  )
  for v, t in zip(values, times):
    print(f"{v!r}: median {np.median(t):.3f} s [{min(t):.3f}, {max(t):.3f}]")
  if len(values) == 2:
    s = bench_args.paired_summary(times[0], times[1])
    print(
        f"paired (second - first): median {s['median'] * 1e3:+.1f} ms, mean "
        f"{s['mean'] * 1e3:+.1f} ms, sd {s['sd'] * 1e3:.1f} ms; ratio of "
        f"medians {s['ratio']:.3f}"
    )


if __name__ == "__main__":
  app.run(bench_args.one_line_usage_errors(main))
