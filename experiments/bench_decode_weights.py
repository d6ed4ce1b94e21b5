"""What reading the weights costs the small-batch decode on a CPU.

    python -m experiments.bench_decode_weights              # 2 XLA CPU devices
    python -m experiments.bench_decode_weights --cpu_devices=1
    python -m experiments.bench_decode_weights --tiny --pairs=2   # seconds

bench_peers' sampling phase, alone: our rollout (agentic_rl/rollout.py, KV
cache, temperature 1, no stop tokens) of 64 rows (16 prompts of 32 tokens x
group 4, each group's prompt computed once) to 64 new tokens, with the
benchmark's float32 model (experiments/peers/common.py MODEL: 4 layers,
~4 MB of weights each, 16.2 MB in all), its rows split over a (data N) mesh
of N XLA CPU devices as `python main.py` runs it. Two programs of the same
shapes and FLOPs, timed alternately in one process:

  model   the model as it is: every decode step reads each layer's own
          weights, 16.2 MB per device per step;
  shared  every layer is layer 0 (one module in every position, so one
          copy of its weights in the program): 4.4 MB per device per
          step, which the caches hold (32 MB L3 on the benchmark machine).

Their paired difference is what reading the other layers' weights from
memory costs at every step. The samples differ (other weights), the work
does not: both decode exactly 64 tokens per row (no stop tokens). Also
printed: the float32 [1024]^3 matmul rate of this process (one device,
every core), the model FLOPs of the decode and each program's rate per
device.

Measured (2026-12-07, 2-core AMD EPYC, jemalloc preloaded, 20 pairs; the
prompts as now, bench_peers' own; from commit edcb0c0): two devices, model
0.381 s, shared 0.332 s per rollout, paired median 51.1 ms (13%; every pair
positive); one device 0.490 against 0.451 s, 29.0 ms (6%; pairs of both
signs, -33 to +97 ms). Other runs the same day: 61.1 ms (17%) and 1.2 ms
(0%) just before (the same code, not yet committed); 52.8 ms (14%) and 25.7
ms (6%) with prompts of another draw.
Each device holds its own copy of the weights, so two
devices read twice as many bytes through the same L3. The rest of the
decode's time is elsewhere: its [32, 256] x [256, 1024] products take
~220-250 us each in the rollout (docs/models.md, "Two micro-batches on two
devices, and what reading the weights costs the decode").
"""

from __future__ import annotations

import functools
import time

from absl import app
from absl import flags

_DEVICES = flags.DEFINE_integer(
    "cpu_devices",
    2,
    "XLA CPU devices the rows are split over (must leave each device whole "
    "groups).",
    lower_bound=1,
)
_PAIRS = flags.DEFINE_integer(
    "pairs",
    15,
    "Timed calls of each program, alternated (order flipped every pair).",
    lower_bound=1,
)
_TINY = flags.DEFINE_bool(
    "tiny",
    False,
    "common.TINY_MODEL with the same workload (rows, prompt and new tokens):"
    " a quick check.",
)


def decode_flops(model: dict, rows: int, prompt_len: int, new: int) -> int:
  """Model FLOPs the rollout's decode executes (`common.forward_flops`'
  count): `new` one-token forwards per row with the KV cache, at positions
  prompt_len + 1 .. prompt_len + new (contexts prompt_len + 1 .. prompt_len
  + new), logits at each; the rollout runs the last step too, whose logits
  go unused (bench_peers' `common.iteration_flops` counts the new - 1 that
  sample). The prefill is not counted (the same in both programs and small
  at this size)."""
  from experiments.peers import common  # pylint: disable=g-import-not-at-top

  context = sum(prompt_len + i + 1 for i in range(new))
  return rows * common.forward_flops(model, new, new, context)


def share_layers(model):
  """`model` (a `transformer.Transformer`), changed in place and returned,
  with every layer made its layer 0: one Block module in every position, so
  `nnx.split` keeps one copy of its weights and every layer of a merged
  model reads the same arrays, inside a compiled loop too (a state holding
  four references to one array would not do: XLA gives each element of a
  while loop's state its own buffer)."""
  from flax import nnx  # pylint: disable=g-import-not-at-top

  model.blocks = nnx.List([model.blocks[0]] * len(model.blocks))
  return model


def main(argv):
  del argv
  import jax  # pylint: disable=g-import-not-at-top

  jax.config.update("jax_num_cpu_devices", _DEVICES.value)
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from flax import nnx  # pylint: disable=g-import-not-at-top
  from jax.sharding import NamedSharding  # pylint: disable=g-import-not-at-top
  from jax.sharding import PartitionSpec as P  # pylint: disable=g-import-not-at-top

  from agentic_rl import host_memory  # pylint: disable=g-import-not-at-top
  from agentic_rl import rollout  # pylint: disable=g-import-not-at-top
  from agentic_rl import sharding  # pylint: disable=g-import-not-at-top
  from agentic_rl.models import transformer  # pylint: disable=g-import-not-at-top
  from experiments.peers import common  # pylint: disable=g-import-not-at-top
  from experiments.peers import ours_worker  # pylint: disable=g-import-not-at-top

  model = common.TINY_MODEL if _TINY.value else common.MODEL
  work = common.WORKLOAD
  group, prompt_len, new = (
      work["group_size"],
      work["prompt_len"],
      work["new_tokens"],
  )
  rows = work["num_prompts"] * group
  length = prompt_len + new
  cfg = transformer.TransformerConfig(
      qkv_bias=True, tie_embeddings=True, max_positions=length, **model
  )
  models = {
      "model": nnx.split(transformer.Transformer(cfg, nnx.Rngs(0))),
      "shared": nnx.split(
          share_layers(transformer.Transformer(cfg, nnx.Rngs(0)))
      ),
  }
  # bench_peers' own prompts (the same ids every engine samples from).
  prompts = common.prompts(work["num_prompts"], prompt_len, cfg.vocab_size)
  env = ours_worker.BenchEnv(
      prompts=tuple(tuple(p) for p in prompts), max_action_len=new
  )
  mesh = sharding.make_mesh()
  n = mesh.devices.size
  if rows % (n * group):
    raise ValueError(
        f"--cpu_devices={n}: each device needs whole groups of {group} of the "
        f"{rows} rows"
    )
  shared_prefix = transformer.SharedPrefix(prompt_len, group)

  def run(graphdef, params, tasks, key):
    traj = rollout.rollout(
        env,
        tasks,
        key,
        max_len=length,
        graphdef=graphdef,
        params=params,
        model_config=cfg,
        temperature=1.0,
        shared_prefix=shared_prefix,
    )
    return traj.tokens

  with jax.set_mesh(mesh):
    tasks = jax.device_put(
        jnp.repeat(jnp.arange(rows // group, dtype=jnp.int32), group),
        NamedSharding(mesh, P("data")),
    )
    params = {
        name: jax.device_put(p, NamedSharding(mesh, P()))
        for name, (_, p) in models.items()
    }
    key = jax.random.key(1)
    programs = {
        name: jax.jit(functools.partial(run, gd))
        .lower(params[name], tasks, key)
        .compile()
        for name, (gd, _) in models.items()
    }
    for name, f in programs.items():
      out = jax.block_until_ready(f(params[name], tasks, key))
      assert out.shape == (rows, length), out.shape
    times = {name: [] for name in programs}
    for i in range(_PAIRS.value):
      order = list(programs) if i % 2 == 0 else list(programs)[::-1]
      for name in order:
        t0 = time.perf_counter()
        jax.block_until_ready(programs[name](params[name], tasks, key))
        times[name].append(time.perf_counter() - t0)

  # Outside the mesh, on one device (its intra-op threads use every core);
  # under the mesh the product would run replicated on every device.
  m = work["matmul_n"]
  a = jnp.asarray(np.random.default_rng(0).standard_normal((m, m)), jnp.float32)
  mm = jax.jit(jnp.matmul)
  matmul_rate = common.matmul_rate(lambda: mm(a, a).block_until_ready(), m)
  flops = decode_flops(model, rows, prompt_len, new)
  nbytes = lambda tree: sum(x.nbytes for x in jax.tree.leaves(tree))
  all_bytes, shared_bytes = nbytes(params["model"]), nbytes(params["shared"])
  layer_bytes = (all_bytes - shared_bytes) / (cfg.num_layers - 1)
  print(
      f"rollout of {rows} rows x {new} new tokens (prompt {prompt_len}, "
      f"shared per group of {group}) over {n} XLA CPU device(s), "
      f"{rows // n} rows each; {cfg.num_layers} layers of "
      f"{layer_bytes / 1e6:.2f} MB, {all_bytes / 1e6:.2f} MB of weights in "
      f"all ({shared_bytes / 1e6:.2f} MB shared); decode model FLOPs "
      f"{flops / 1e9:.2f} G; allocator "
      f"{host_memory.preloaded_allocator() or 'as shipped'}"
  )
  print(
      f"matmul float32 [{work['matmul_n']}]^3: {matmul_rate / 1e9:.1f} GFLOP/s"
      f" (this process, one device, every core)"
  )
  med = {name: float(np.median(t)) for name, t in times.items()}
  for name, t in med.items():
    print(
        f"{name:7s} {t:.4f} s per rollout (median of {len(times[name])}; "
        f"[{min(times[name]):.4f}, {max(times[name]):.4f}]), "
        f"{t / new * 1e3:.2f} ms per step, decode "
        f"{flops / n / t / 1e9:.1f} GFLOP/s per device"
    )
  diff = np.array(times["model"]) - np.array(times["shared"])
  print(
      f"model - shared, paired: median {np.median(diff) * 1e3:.1f} ms "
      f"[{diff.min() * 1e3:.1f}, {diff.max() * 1e3:.1f}] per rollout "
      f"({np.median(diff) / med['model']:.0%} of the model's rollout)"
  )


if __name__ == "__main__":
  app.run(main)
