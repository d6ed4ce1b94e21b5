"""Real model shapes on a simulated (data, fsdp, tensor) device mesh: per-device
bytes of parameters, AdamW state and KV cache, from shard shapes and from the
compiled programs' memory analysis. No weights are allocated: the parameters,
optimizer state, batch and cache are abstract (`jax.eval_shape`,
`jax.ShapeDtypeStruct` with shardings) and the programs are only lowered and
compiled.

For each model preset (configs/common.py) and mesh:
  * params / adam / kv: bytes per device of the sharded parameters, the
    optimizer state (AdamW mu and nu, learner.make_optimizer) and the KV cache
    (values [B, G, S, Dh] and keys [B, G, Dh, S] per layer, rows over data x
    fsdp, kv heads over tensor), summed
    over the shard shapes of `sharding.tree_shardings` / `cache_shardings`;
    `ideal` is the total divided by fsdp * tensor (parameters and optimizer
    state) or by the device count (cache);
  * train args / temp / coll: `compiled.memory_analysis()` of one jitted
    training step (teacher-forced token log-probs of a [B, L] batch, gradient,
    AdamW update; parameters and optimizer state donated): per-device argument
    bytes (parameters + optimizer state + batch) and temporary bytes, and the
    MiB per device that the program's collectives produce (sum of their
    output shapes in the compiled HLO);
  * decode args / temp / coll: the same for one cached decode step ([B, 1]
    tokens, cache of length S).

`--no_pins` turns off the model's sharding pins (activations split over the
batch axes with d_model whole, fused weights gathered over 'fsdp') to compare
with XLA's own sharding propagation.

A head count that the tensor axis does not divide is refused
(`sharding.check_heads_divide_tensor`); such a preset is reported with the error
and measured on the fallback mesh (data 2, fsdp 4, tensor 1).

This CPU cannot show multi-chip speed: the numbers are the compiled programs'
own per-device memory accounting on 8 simulated CPU devices.

Usage:
  python experiments/bench_mesh.py [--presets smollm2-135m,qwen2.5-0.5b,...]
      [--batch 8] [--seq 256] [--cache_len 2048] [--no_compile] [--no_pins]
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402

from agentic_rl import learner  # noqa: E402
from agentic_rl import sampling  # noqa: E402
from agentic_rl import sharding  # noqa: E402
from agentic_rl.models import lora  # noqa: E402
from agentic_rl.models import transformer  # noqa: E402
from configs import common  # noqa: E402

PRESETS = ("smollm2-135m", "qwen2.5-0.5b", "llama-3.2-1b")
MESH = (2, 2, 2)
FALLBACK_MESH = (2, 4, 1)
MIB = 2.0**20


def model_config(preset: str) -> transformer.TransformerConfig:
  """TransformerConfig of a configs/common.py model preset."""
  return transformer.TransformerConfig(
      **lora.transformer_fields(common.model(preset))
  )


def make_mesh(shape: tuple[int, int, int]) -> jax.sharding.Mesh:
  data, fsdp, tensor = shape
  return sharding.make_mesh(
      dict(data=data, fsdp=fsdp, tensor=tensor),
      devices=jax.devices()[: data * fsdp * tensor],
  )


def _bytes(x) -> int:
  return math.prod(x.shape) * np.dtype(x.dtype).itemsize


def _shard_bytes(tree, shardings) -> int:
  """Bytes one device holds: sum of shard-shape sizes (every device holds the
  same shard shape under these NamedShardings)."""
  return int(
      sum(
          math.prod(s.shard_shape(x.shape)) * np.dtype(x.dtype).itemsize
          for x, s in zip(jax.tree.leaves(tree), jax.tree.leaves(shardings))
      )
  )


def abstract_state(cfg: transformer.TransformerConfig):
  """(graphdef, abstract params, optimizer, abstract optimizer state)."""
  graphdef, params = nnx.split(
      nnx.eval_shape(lambda: transformer.Transformer(cfg, nnx.Rngs(0)))
  )
  tx = learner.make_optimizer(common.optimizer(1e-5, 10))
  opt_state = jax.eval_shape(tx.init, params)
  return graphdef, params, tx, opt_state


def _abstract(tree, shardings):
  return jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
      tree,
      shardings,
  )


def plan(
    preset: str, mesh_shape: tuple[int, int, int], batch: int, cache_len: int
) -> dict:
  """Per-device bytes of parameters, optimizer state and KV cache (shard shapes).

  Raises:
    ValueError: the mesh's tensor axis does not divide the head counts.
  """
  cfg = model_config(preset)
  data, fsdp, tensor = mesh_shape
  sharding.check_heads_divide_tensor(
      cfg.num_heads,
      cfg.num_kv_heads,
      tensor,
      where=f"model preset {preset!r}: model",
  )
  mesh = make_mesh(mesh_shape)
  graphdef, params, tx, opt_state = abstract_state(cfg)
  p_sh = sharding.tree_shardings(params, mesh)
  o_sh = sharding.tree_shardings(opt_state, mesh)
  cache = jax.eval_shape(lambda: transformer.init_cache(cfg, batch, cache_len))
  c_sh = sharding.cache_shardings(cache, mesh)
  total = lambda t: int(sum(_bytes(x) for x in jax.tree.leaves(t)))
  return dict(
      preset=preset,
      mesh=mesh_shape,
      cfg=cfg,
      mesh_obj=mesh,
      graphdef=graphdef,
      tx=tx,
      params=params,
      opt_state=opt_state,
      cache=cache,
      p_sh=p_sh,
      o_sh=o_sh,
      c_sh=c_sh,
      num_params=transformer.count_params(params),
      param_total=total(params),
      param_dev=_shard_bytes(params, p_sh),
      opt_total=total(opt_state),
      opt_dev=_shard_bytes(opt_state, o_sh),
      kv_total=total(cache),
      kv_dev=_shard_bytes(cache, c_sh),
  )


def compile_train(p: dict, batch: int, seq: int):
  """Compiled memory analysis of one training step (log-prob loss + AdamW)."""
  graphdef, tx, mesh = p["graphdef"], p["tx"], p["mesh_obj"]

  def step(params, opt_state, tokens):
    def loss_fn(prm):
      logp, _ = sampling.token_logprobs(graphdef, prm, tokens, 1.0)
      return -jnp.mean(logp)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  tok_sh = NamedSharding(mesh, sharding.batch_spec((batch, seq), mesh))
  args = (
      _abstract(p["params"], p["p_sh"]),
      _abstract(p["opt_state"], p["o_sh"]),
      jax.ShapeDtypeStruct((batch, seq), jnp.int32, sharding=tok_sh),
  )
  with jax.set_mesh(mesh):
    return (
        jax.jit(
            step,
            donate_argnums=(0, 1),
            out_shardings=(p["p_sh"], p["o_sh"], None),
        )
        .lower(*args)
        .compile()
    )


def compile_decode(p: dict, batch: int):
  """Compiled memory analysis of one cached decode step ([B, 1] tokens)."""
  graphdef, mesh = p["graphdef"], p["mesh_obj"]

  def decode(params, cache, tokens, positions):
    model = nnx.merge(graphdef, params)
    logits, cache = model(tokens, positions, sharding.constrain_cache(cache))
    return logits, sharding.constrain_cache(cache)

  row_sh = NamedSharding(mesh, sharding.batch_spec((batch, 1), mesh))
  args = (
      _abstract(p["params"], p["p_sh"]),
      _abstract(p["cache"], p["c_sh"]),
      jax.ShapeDtypeStruct((batch, 1), jnp.int32, sharding=row_sh),
      jax.ShapeDtypeStruct((batch, 1), jnp.int32, sharding=row_sh),
  )
  with jax.set_mesh(mesh):
    return (
        jax.jit(decode, donate_argnums=(1,), out_shardings=(None, p["c_sh"]))
        .lower(*args)
        .compile()
    )


COLLECTIVES = (
    "all-reduce",
    "all-gather",
    "collective-permute",
    "all-to-all",
    "reduce-scatter",
)


_HLO_BYTES = {
    "pred": 1,
    "s8": 1,
    "u8": 1,
    "bf16": 2,
    "f16": 2,
    "s16": 2,
    "u16": 2,
    "f32": 4,
    "s32": 4,
    "u32": 4,
    "f64": 8,
    "s64": 8,
    "u64": 8,
}


def collective_mib(compiled) -> float:
  """MiB per device produced by the collectives of a compiled program (sum of
  their output shapes; operands of tuple collectives counted one by one)."""
  total = 0
  for line in compiled.as_text().splitlines():
    m = re.search(r"= (.*?) (%s)(-start)?\(" % "|".join(COLLECTIVES), line)
    if m:
      for dt, dims in re.findall(r"(\w+)\[([\d,]*)\]", m.group(1)):
        n = math.prod(int(v) for v in dims.split(",") if v)
        total += n * _HLO_BYTES.get(dt, 4)
  return total / MIB


def _mib(x) -> str:
  return f"{x / MIB:,.1f}"


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--presets", default=",".join(PRESETS))
  ap.add_argument("--batch", type=int, default=8)
  ap.add_argument("--seq", type=int, default=256)
  ap.add_argument("--cache_len", type=int, default=2048)
  ap.add_argument("--no_compile", action="store_true")
  ap.add_argument(
      "--no_pins",
      action="store_true",
      help="diagnostic: turn off the model's sharding pins "
      "(sharding.constrain_batch / constrain_gathered become the "
      "identity) to compare with XLA's own propagation",
  )
  args = ap.parse_args(argv)
  if args.no_pins:
    sharding.constrain_batch = lambda tree: tree
    sharding.constrain_gathered = lambda x, letters: x
  print(
      f"devices: {jax.device_count()} x {jax.devices()[0].platform}; "
      f"train batch {args.batch} x {args.seq} tokens; decode batch "
      f"{args.batch}, cache length {args.cache_len}; float32; MiB per device\n"
  )
  print(
      "| preset | params | mesh (d,f,t) | params/dev (ideal) | adam/dev (ideal) "
      "| kv/dev (ideal) | train args / temp / coll | decode args / temp / coll "
      "| compile s |"
  )
  print("|---|---|---|---|---|---|---|---|---|")
  notes = []
  for preset in args.presets.split(","):
    try:
      p = plan(preset, MESH, args.batch, args.cache_len)
    except ValueError as e:
      notes.append(f"- {preset} on mesh {MESH}: refused: {e}")
      p = plan(preset, FALLBACK_MESH, args.batch, args.cache_len)
    data, fsdp, tensor = p["mesh"]
    ideal_p = p["param_total"] / (fsdp * tensor)
    ideal_o = p["opt_total"] / (fsdp * tensor)
    ideal_kv = p["kv_total"] / (data * fsdp * tensor)
    train_col = decode_col = "-"
    secs = "-"
    if not args.no_compile:
      t0 = time.time()
      ct = compile_train(p, args.batch, args.seq)
      cd = compile_decode(p, args.batch)
      secs = f"{time.time() - t0:.0f}"
      cols = []
      for c in (ct, cd):
        m = c.memory_analysis()
        cols.append(
            f"{_mib(m.argument_size_in_bytes)} / "
            f"{_mib(m.temp_size_in_bytes)} / {collective_mib(c):,.1f}"
        )
      train_col, decode_col = cols
    print(
        f"| {preset} | {p['num_params'] / 1e6:.1f}M | {p['mesh']} | "
        f"{_mib(p['param_dev'])} ({_mib(ideal_p)}) | "
        f"{_mib(p['opt_dev'])} ({_mib(ideal_o)}) | "
        f"{_mib(p['kv_dev'])} ({_mib(ideal_kv)}) | {train_col} | {decode_col} | "
        f"{secs} |",
        flush=True,
    )
  if notes:
    print()
    print("\n".join(notes))


if __name__ == "__main__":
  main()
