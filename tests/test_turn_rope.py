"""RoPE tables of a decode turn computed once, before its loop.

`rollout.generate_turn` computes the (sin, cos) tables of every buffer
position before its decode loop (`sampling.position_rope_tables`) and each
step gathers its rows' own (`sampling.rope_rows`, passed to
`sampling.extend(..., rope_sc=...)`). Checked here: the gathered rows are
`transformer.rope_tables` of the rows' positions bit for bit, a step given
them is the step that computes them bit for bit (and one given other rows
differs, so they are used), and, on the compiled rollout, no sine or cosine
is left inside the decode loop (computed there, XLA:CPU fused them into
every layer's and head's rotation; the fix this tests). The program checks
are of XLA:CPU's compiled text; other backends fuse differently.
"""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from agentic_rl import rollout
from agentic_rl import sampling
from agentic_rl.models import transformer
from tests import fakes
from tests.test_rollout import assert_bitwise_equal

_NAME = re.compile(r"%([\w.\-]+)")


def _computations(hlo: str) -> dict[str, list[str]]:
  """{computation name: its instruction lines} of an HLO module's text."""
  out, name = {}, None
  for line in hlo.splitlines():
    if line and not line[0].isspace() and line.rstrip().endswith("{"):
      head = line.split()
      name = (head[1] if head[0] == "ENTRY" else head[0]).lstrip("%")
      out[name] = []
    elif name is not None and line.startswith("  "):
      out[name].append(line.strip())
  return out


def _reachable(comps: dict[str, list[str]], root: str) -> set[str]:
  """`root` and every computation its instructions name, transitively (any
  %name on a line that is a computation: calls=, body=, to_apply=,
  branch_computations={...}, ...)."""
  seen, todo = set(), [root]
  while todo:
    c = todo.pop()
    if c in seen or c not in comps:
      continue
    seen.add(c)
    for line in comps[c]:
      todo += [n for n in _NAME.findall(line) if n in comps]
  return seen


def _trig(comps: dict[str, list[str]], names) -> list[str]:
  """The computations among `names` that evaluate a sine or cosine."""
  return sorted(
      n
      for n in names
      for line in comps[n]
      if re.search(r" (sine|cosine)\(", line)
  )


def _decode_loop_bodies(hlo: str) -> list[set[str]]:
  """For each innermost while loop that runs the model (its body reaches a
  dot, and no while loop inside it does), the computations its body
  reaches: the decode loops of a rollout (the sampler's own small loops
  hold no dot; the turn loop holds the decode loop)."""
  comps = _computations(hlo)
  has_dot = lambda names: any(
      " dot(" in line for n in names for line in comps[n]
  )
  loops = []
  for lines in comps.values():
    for line in lines:
      m = re.search(r" while\(.*body=%?([\w.\-]+)", line)
      if m:
        loops.append(_reachable(comps, m.group(1)))
  model_loops = [body for body in loops if has_dot(body)]
  return [
      body
      for body in model_loops
      if not any(other < body for other in model_loops)
  ]


def test_position_tables_are_each_positions_rope_tables():
  graphdef, params, cfg = fakes.tiny_policy(0)
  length = 12
  tables = jax.jit(
      lambda p: sampling.position_rope_tables(graphdef, p, length)
  )(params)
  assert tables[0].shape == tables[1].shape == (length, cfg.head_dim // 2)
  positions_b = jnp.array([3, 7, 0, 11, 12, 40], jnp.int32)
  got = jax.jit(sampling.rope_rows)(tables, positions_b)
  inv_freq = transformer.rope_inv_freq(cfg)
  # Positions at or past the buffer's end take its last row (their chunk
  # writes nothing to the cache).
  clipped = jnp.minimum(positions_b, length - 1)
  want = jax.jit(transformer.rope_tables)(clipped[:, None], inv_freq)
  assert_bitwise_equal(got, want)


def test_a_step_given_its_rows_is_the_step_that_computes_them():
  graphdef, params, cfg = fakes.tiny_policy(1)
  b, length = 3, 16
  cache = transformer.init_cache(cfg, b, length)
  prompt = jax.random.randint(jax.random.PRNGKey(0), (b, 4), 3, 200)
  prompt_len = jnp.array([4, 2, 3], jnp.int32)
  _, cache = jax.jit(
      lambda p, c: sampling.extend(
          graphdef, p, c, prompt, jnp.zeros(b, jnp.int32), prompt_len
      )
  )(params, cache)
  tok = jnp.array([[5], [9], [11]], jnp.int32)
  one = jnp.ones(b, jnp.int32)
  tables = sampling.position_rope_tables(graphdef, params, length)

  def step(p, c, positions_b, rope_positions_b):
    rope_sc = (
        None
        if rope_positions_b is None
        else sampling.rope_rows(tables, rope_positions_b)
    )
    return sampling.extend(
        graphdef, p, c, tok, positions_b, one, rope_sc=rope_sc
    )

  given = jax.jit(step)
  computed = jax.jit(lambda p, c, pos: step(p, c, pos, None))
  for t in range(3):
    pos = prompt_len + t
    want = computed(params, cache, pos)
    assert_bitwise_equal(given(params, cache, pos, pos), want)
    # The rows are used: another position's rows give other logits.
    other = given(params, cache, pos, pos + 1)
    assert not np.allclose(np.asarray(other[0]), np.asarray(want[0]))
    cache = want[1]


def _rollout_hlo(env, tasks, max_len: int) -> str:
  graphdef, params, cfg = fakes.tiny_policy(0)
  return (
      jax.jit(
          lambda p, key: rollout.rollout(
              env,
              tasks,
              key,
              max_len=max_len,
              graphdef=graphdef,
              params=p,
              model_config=cfg,
              temperature=1.0,
          )
      )
      .lower(params, jax.random.PRNGKey(0))
      .compile()
      .as_text()
  )


def test_no_sine_or_cosine_inside_the_decode_loop():
  hlo = _rollout_hlo(fakes.EchoEnv(), jnp.array([3, 6, 1]), 32)
  comps = _computations(hlo)
  loops = _decode_loop_bodies(hlo)
  assert len(loops) == 1, len(loops)
  assert _trig(comps, loops[0]) == []
  # Not vacuous: the rollout computes rotations (the prefill's, the
  # observations' and the tables), just not in the decode steps.
  assert _trig(comps, comps)


def test_the_check_sees_sines_computed_in_a_decode_loop():
  # The same detector on a decode loop whose steps compute their own tables
  # (`extend` without rope_sc, as generate_turn did before): it finds them.
  graphdef, params, cfg = fakes.tiny_policy(0)
  b, length = 3, 16

  def decode(p, tok):
    cache = transformer.init_cache(cfg, b, length)

    def body(t, carry):
      tok, cache = carry
      logits, cache = sampling.extend(
          graphdef,
          p,
          cache,
          tok[:, None],
          jnp.full((b,), t, jnp.int32),
          jnp.ones((b,), jnp.int32),
      )
      return jnp.argmax(logits, -1).astype(jnp.int32), cache

    return jax.lax.fori_loop(0, 8, body, (tok, cache))[0]

  hlo = (
      jax.jit(decode)
      .lower(params, jnp.array([5, 9, 11], jnp.int32))
      .compile()
      .as_text()
  )
  comps = _computations(hlo)
  loops = _decode_loop_bodies(hlo)
  assert len(loops) == 1, len(loops)
  assert _trig(comps, loops[0])


def _training_hlo(num_layers: int) -> str:
  """Compiled value-and-gradient of a cache-free forward of a tiny model."""
  cfg = dataclasses.replace(fakes.TINY, num_layers=num_layers)
  graphdef, params, _ = fakes.tiny_policy(0, cfg)
  tokens = jax.random.randint(jax.random.PRNGKey(0), (4, 24), 3, 200)

  def loss(p):
    model = nnx.merge(graphdef, p)
    hidden, _ = model.hidden_states(tokens)
    return jnp.sum(hidden**2)

  return jax.jit(jax.value_and_grad(loss)).lower(params).compile().as_text()


def test_a_training_forward_evaluates_its_sines_once_whatever_the_depth():
  # The tables are stored once (`rope_tables`), not fused into each layer's
  # rotation: the computations that evaluate a sine or cosine are as many
  # for three layers as for one, forward and backward.
  counts = {}
  for layers in (1, 3):
    comps = _computations(_training_hlo(layers))
    counts[layers] = len(_trig(comps, comps))
  assert counts[3] == counts[1], counts
  assert 1 <= counts[1] <= 2, counts
