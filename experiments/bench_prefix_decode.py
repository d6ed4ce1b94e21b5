"""Rollouts with a group's prompt read once per group vs once per row.

    python experiments/bench_prefix_decode.py [--points=32:4,64:4,128:4,256:8]
        [--rows=64] [--new_tokens=64] [--pairs=8] [--force] [--tiny]

With `rl.shared_prefix_len` the rollout prefills each group's prompt once
and its decode steps may read the prompt's cache entries once per group
(`attention.cache_prefix_attention`), in the length buckets where
`attention.cache_prefix_pays` says the saving exceeds the copy of each row's
own part. This script measures both reads of the same rollout on bench_peers'
model (Qwen2 layout, 4 layers, d_model 256, random weights): for each point
`prompt:group` it builds `rows` episodes (rows / group prompts of `prompt`
random tokens, each repeated for its group, `new_tokens` sampled tokens
each), compiles the whole rollout twice in one process (the per-row read is
`rollout._cache_prefix` returning None while its variant is traced), checks
that both sample the same tokens, and times `pairs` interleaved pairs. Prints
per point the medians, the paired difference (grouped - per-row: mean, sd),
and whether the rule takes the grouped read in any length bucket. Where it
does not, both variants are the same program (their difference is the
noise) unless `--force` makes the grouped one read the prompt once per group
in every bucket longer than it: the runs that set the rule.

Nothing else should run beside it (experiments/bench_ab.md: the machine's
spread between processes hides a few percent; pairs in one process do not).
"""

from __future__ import annotations

import os
import sys
import time

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_POINTS = flags.DEFINE_list(
    "points", ["32:4", "64:4", "128:4", "256:8"], "prompt:group pairs."
)
_ROWS = flags.DEFINE_integer("rows", 64, "Episodes per rollout.", lower_bound=1)
_NEW = flags.DEFINE_integer(
    "new_tokens", 64, "Sampled tokens per episode.", lower_bound=1
)
_PAIRS = flags.DEFINE_integer(
    "pairs", 8, "Timed pairs per point.", lower_bound=1
)
_FORCE = flags.DEFINE_bool(
    "force",
    False,
    "Take the grouped read in every bucket it can serve, whatever "
    "`cache_prefix_pays` says (how the rule was calibrated).",
)
_TINY = flags.DEFINE_bool(
    "tiny", False, "A 2-layer d_model-32 model: a seconds-long check."
)


def _points(values: list[str], rows: int) -> list[tuple[int, int]]:
  """[(prompt, group)] from 'prompt:group' strings; UsageError on bad ones."""
  out = []
  for v in values:
    try:
      prompt, group = (int(x) for x in v.split(":"))
    except ValueError:
      raise app.UsageError(f"--points: {v!r} is not prompt:group") from None
    if prompt < 1 or group < 1 or rows % group:
      raise app.UsageError(
          f"--points: {v!r} needs prompt >= 1 and a group dividing --rows"
          f" ({rows})"
      )
    out.append((prompt, group))
  return out


def main(argv):
  del argv
  points = _points(_POINTS.value, _ROWS.value)
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from flax import nnx  # pylint: disable=g-import-not-at-top

  from agentic_rl import rollout  # pylint: disable=g-import-not-at-top
  from agentic_rl.models import attention  # pylint: disable=g-import-not-at-top
  from agentic_rl.models import transformer  # pylint: disable=g-import-not-at-top
  from experiments.peers import ours_worker  # pylint: disable=g-import-not-at-top

  rows, new = _ROWS.value, _NEW.value
  dims = (
      dict(d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
           ffn_dim=64)
      if _TINY.value
      else dict(d_model=256, num_layers=4, num_heads=4, num_kv_heads=2,
                head_dim=64, ffn_dim=1024)
  )  # fmt: skip
  print(
      f"model: Qwen2 layout {dims}, vocab 480, random weights; {rows} rows,"
      f" {new} sampled tokens each, {_PAIRS.value} interleaved pairs a point;"
      f" cpus {len(os.sched_getaffinity(0))}; load average at start"
      f" {os.getloadavg()[0]:.2f}"
  )
  print(
      "| prompt | group | per-row read (s) | grouped read (s) | paired"
      " grouped - per-row: mean (sd) ms | rule takes it | same tokens |"
  )
  print("|---|---|---|---|---|---|---|")
  for prompt_len, group in points:
    length = prompt_len + new
    cfg = transformer.TransformerConfig(
        vocab_size=480,
        qkv_bias=True,
        max_positions=length,
        **dims,
    )
    graphdef, params = nnx.split(transformer.Transformer(cfg, nnx.Rngs(0)))
    rng = np.random.default_rng(0)
    env = ours_worker.BenchEnv(
        prompts=tuple(
            tuple(int(x) for x in rng.integers(3, 400, prompt_len))
            for _ in range(rows // group)
        ),
        max_action_len=new,
    )
    tasks = jnp.repeat(jnp.arange(rows // group, dtype=jnp.int32), group)
    shared = transformer.SharedPrefix(prompt_len, group)

    def build(grouped: bool):
      def run(params, key):
        return rollout.rollout(
            env,
            tasks,
            key,
            max_len=length,
            graphdef=graphdef,
            params=params,
            model_config=cfg,
            temperature=1.0,
            shared_prefix=shared,
        )

      original = rollout._cache_prefix  # pylint: disable=protected-access
      rule = attention.cache_prefix_pays
      if not grouped:
        rollout._cache_prefix = lambda *a: None  # pylint: disable=protected-access
      elif _FORCE.value:
        attention.cache_prefix_pays = lambda p, g, n: g > 1 and 0 < p < n
      try:
        return jax.jit(run).lower(params, jax.random.key(0)).compile()
      finally:
        rollout._cache_prefix = original  # pylint: disable=protected-access
        attention.cache_prefix_pays = rule

    variants = [build(False), build(True)]
    key = jax.random.key(1)
    out = [v(params, key) for v in variants]
    same = bool(jnp.all(out[0].tokens == out[1].tokens))
    times = [[], []]
    for i in range(_PAIRS.value):
      for j in (0, 1) if i % 2 == 0 else (1, 0):
        t0 = time.perf_counter()
        jax.block_until_ready(variants[j](params, key))
        times[j].append(time.perf_counter() - t0)
    a, b = np.asarray(times[0]), np.asarray(times[1])
    d = (b - a) * 1e3
    sd = d.std(ddof=1) if len(d) > 1 else float("nan")
    pays = any(
        attention.cache_prefix_pays(prompt_len, group, n)
        for n in transformer.decode_buckets(cfg, length)
    )
    taken = "yes" if pays else ("forced" if _FORCE.value else "no")
    print(
        f"| {prompt_len} | {group} | {np.median(a):.3f} | {np.median(b):.3f}"
        f" | {d.mean():+.1f} ({sd:.1f}) | {taken} |"
        f" {'yes' if same else 'no'} |",
        flush=True,
    )
  print(f"load average at end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
  from experiments import bench_args  # pylint: disable=g-import-not-at-top

  app.run(bench_args.one_line_usage_errors(main))
