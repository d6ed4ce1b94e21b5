"""RoPE tables stored once per forward, not recomputed in every rotation.

`transformer.rope_tables` materialises the step's (sin, cos) tables once per
forward (a product with the identity); left as elementwise values, XLA:CPU
fused the sines and cosines into every layer's query and key rotation and
evaluated them again for every head, forward and backward, and in every
decode step. Checked here on the compiled programs (XLA:CPU's text; other
backends fuse differently): the computations that evaluate a sine or cosine
are as many for three layers as for one, in a rollout's decode loop and in a
training forward and backward.
"""

import dataclasses
import re

import jax
import jax.numpy as jnp
from flax import nnx

from agentic_rl import rollout
from tests import fakes

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


def _rollout_hlo(env, tasks, max_len: int, num_layers: int) -> str:
  cfg = dataclasses.replace(fakes.TINY, num_layers=num_layers)
  graphdef, params, cfg = fakes.tiny_policy(0, cfg)
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


def test_a_decode_loop_evaluates_its_sines_once_whatever_the_depth():
  # Each decode step computes its rows' tables once (`rope_tables` in the
  # step's forward), not in each layer's rotation: the loop body's
  # computations that evaluate a sine or cosine are as many for three
  # layers as for one (fused into the rotations, they grew with the depth).
  counts = {}
  for layers in (1, 3):
    hlo = _rollout_hlo(fakes.EchoEnv(), jnp.array([3, 6, 1]), 32, layers)
    comps = _computations(hlo)
    loops = _decode_loop_bodies(hlo)
    assert len(loops) == 1, len(loops)
    counts[layers] = len(_trig(comps, loops[0]))
  assert counts[3] == counts[1], counts
  assert 1 <= counts[1] <= 2, counts


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
