"""RoPE tables of a decode turn computed once, before its loop.

`rollout.generate_turn` computes the turn's (sin, cos) tables before its
decode loop (`sampling.turn_rope_tables`) and each step slices its own
(`sampling.extend(..., rope_sc=...)`). Checked here: the slices are the
per-step tables bit for bit, a step given them is the step that computes
them bit for bit, and, on the compiled rollout, no sine or cosine is left
inside the decode loop (computed there, XLA fused them into every layer's
and head's rotation; the fix this tests).
"""

import re

import jax
import jax.numpy as jnp
import numpy as np

from agentic_rl import rollout
from agentic_rl import sampling
from agentic_rl.models import transformer
from tests import fakes
from tests.test_rollout import assert_bitwise_equal

_CALLEE = re.compile(
    r"(?:calls|body|condition|to_apply|true_computation|false_computation)"
    r"=%?([\w.\-]+)"
)
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")


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


def _callees(line: str) -> list[str]:
  names = _CALLEE.findall(line)
  for group in _BRANCHES.findall(line):
    names += [n.strip().lstrip("%") for n in group.split(",")]
  return names


def _reachable(comps: dict[str, list[str]], root: str) -> set[str]:
  seen, todo = set(), [root]
  while todo:
    c = todo.pop()
    if c in seen or c not in comps:
      continue
    seen.add(c)
    for line in comps[c]:
      todo += _callees(line)
  return seen


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


def test_turn_tables_are_each_steps_tables():
  graphdef, params, cfg = fakes.tiny_policy(0)
  start_b = jnp.array([3, 7, 0, 12], jnp.int32)
  steps = 5
  turn = jax.jit(lambda p, s: sampling.turn_rope_tables(graphdef, p, s, steps))(
      params, start_b
  )
  assert turn[0].shape == (4, 1, steps, cfg.head_dim // 2)
  inv_freq = transformer.rope_inv_freq(cfg)
  for t in range(steps):
    want = jax.jit(transformer.rope_tables)((start_b + t)[:, None], inv_freq)
    got = tuple(x[:, :, t : t + 1] for x in turn)
    assert_bitwise_equal(got, want)


def test_a_step_given_its_tables_is_the_step_that_computes_them():
  graphdef, params, cfg = fakes.tiny_policy(1)
  b, length = 3, 16
  cache = transformer.init_cache(cfg, b, length)
  prompt = jax.random.randint(jax.random.PRNGKey(0), (b, 4), 3, 200)
  prompt_len = jnp.array([4, 2, 3], jnp.int32)
  prefill = jax.jit(
      lambda p, c: sampling.extend(
          graphdef, p, c, prompt, jnp.zeros(b, jnp.int32), prompt_len
      )
  )
  _, cache = prefill(params, cache)
  tok = jnp.array([[5], [9], [11]], jnp.int32)
  one = jnp.ones(b, jnp.int32)
  turn = sampling.turn_rope_tables(graphdef, params, prompt_len, 4)

  @jax.jit
  def step(p, c, t, given):
    rope_sc = (
        tuple(jax.lax.dynamic_slice_in_dim(x, t, 1, axis=2) for x in turn)
        if given
        else None
    )
    return sampling.extend(
        graphdef, p, c, tok, prompt_len + t, one, rope_sc=rope_sc
    )

  step = jax.jit(step.__wrapped__, static_argnums=3)
  for t in range(3):
    got = step(params, cache, jnp.int32(t), True)
    want = step(params, cache, jnp.int32(t), False)
    assert_bitwise_equal(got, want)
    cache = want[1]
  # Not vacuous: the tables differ from step to step.
  assert not np.array_equal(np.asarray(turn[0][:, :, 0]), turn[0][:, :, 1])


def test_no_sine_or_cosine_inside_the_decode_loop():
  graphdef, params, cfg = fakes.tiny_policy(0)
  env, tasks = fakes.EchoEnv(), jnp.array([3, 6, 1])
  hlo = (
      jax.jit(
          lambda p, key: rollout.rollout(
              env,
              tasks,
              key,
              max_len=32,
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
  comps = _computations(hlo)
  trig = lambda names: sorted(
      n
      for n in names
      for line in comps[n]
      if re.search(r" (sine|cosine)\(", line)
  )
  loops = _decode_loop_bodies(hlo)
  assert len(loops) == 1, len(loops)
  assert trig(loops[0]) == []
  # Not vacuous: the rollout computes rotations (the prefill's, the
  # observations' and the turn tables), just not in the decode steps.
  assert trig(comps)
