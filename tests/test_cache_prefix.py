"""A group's shared prompt read once per group by the decode
(`attention.cache_prefix_attention`, `transformer.CachePrefix`).

The attention is checked against `dense_attention` on the same cache; the
decode and observation steps of a rollout against the per-row read of the
same prefilled state; the compiled decode step for the grouped products.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from agentic_rl import rollout
from agentic_rl.models import attention
from agentic_rl.models import transformer


def _cache(b, g_kv, dh, s, prefix, group, seed=0):
  """Keys [B, G, Dh, S] and values [B, G, S, Dh] whose first `prefix`
  entries are equal within each group of `group` rows."""
  rng = np.random.default_rng(seed)
  k = rng.standard_normal((b, g_kv, dh, s))
  v = rng.standard_normal((b, g_kv, s, dh))
  first = np.arange(b) // group * group
  k[..., :prefix] = k[first][..., :prefix]
  v[:, :, :prefix] = v[first][:, :, :prefix]
  return jnp.asarray(k, jnp.float32), jnp.asarray(v, jnp.float32)


@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (2, 2)])
@pytest.mark.parametrize("t", [1, 3])
def test_equals_dense_attention_on_the_same_cache(heads, kv_heads, t):
  b, dh, s, prefix, group = 8, 16, 24, 10, 4
  k, v = _cache(b, kv_heads, dh, s, prefix, group)
  rng = np.random.default_rng(1)
  q = jnp.asarray(rng.standard_normal((b, heads, t, dh)), jnp.float32)
  # Each row's chunk starts at its own position >= prefix; the chunk's
  # queries are causal among themselves (a decode step or an observation).
  start = rng.integers(prefix, s - t + 1, (b,))
  pos = start[:, None] + np.arange(t)[None, :]
  mask = jnp.asarray(np.arange(s)[None, None, :] <= pos[:, :, None])
  want = attention.dense_attention(
      q, k, v, mask, jnp.float32, keys_transposed=True
  )
  got = attention.cache_prefix_attention(
      q, k, v, mask, jnp.float32, prefix, group
  )
  assert got.shape == (b, heads, t, dh) and got.dtype == jnp.float32
  np.testing.assert_allclose(got, want, rtol=0, atol=2e-6)


def test_masked_prefix_entries_are_hidden_as_in_dense_attention():
  # A query that may not see some prefix entries (mask False there) gets
  # probability 0 on them in both forms.
  b, g_kv, dh, s, prefix, group = 4, 2, 8, 12, 6, 2
  k, v = _cache(b, g_kv, dh, s, prefix, group, seed=3)
  q = jax.random.normal(jax.random.key(0), (b, 4, 1, dh))
  mask = jnp.ones((b, 1, s), bool).at[1, 0, 2:9].set(False)
  want = attention.dense_attention(q, k, v, mask, jnp.float32, True)
  got = attention.cache_prefix_attention(
      q, k, v, mask, jnp.float32, prefix, group
  )
  np.testing.assert_allclose(got, want, rtol=0, atol=2e-6)


def test_a_differing_row_reads_its_groups_first_row():
  b, g_kv, dh, s, prefix, group = 4, 1, 8, 10, 4, 2
  k, v = _cache(b, g_kv, dh, s, prefix, group, seed=4)
  # Row 1 holds other prefix entries than row 0, its group's first row.
  k2 = k.at[1, :, :, :prefix].add(1.0)
  v2 = v.at[1, :, :prefix].add(1.0)
  q = jax.random.normal(jax.random.key(1), (b, 2, 1, dh))
  mask = jnp.ones((b, 1, s), bool)
  got = attention.cache_prefix_attention(
      q, k2, v2, mask, jnp.float32, prefix, group
  )
  want = attention.dense_attention(q, k, v, mask, jnp.float32, True)
  np.testing.assert_allclose(got, want, rtol=0, atol=2e-6)


def test_bad_arguments_raise():
  k, v = _cache(6, 1, 4, 8, 3, 3)
  q = jnp.zeros((6, 1, 1, 4))
  mask = jnp.ones((6, 1, 8), bool)
  with pytest.raises(ValueError, match="group 4 must divide"):
    attention.cache_prefix_attention(q, k, v, mask, jnp.float32, 3, 4)
  for prefix in (0, 8):
    with pytest.raises(ValueError, match="prefix_len"):
      attention.cache_prefix_attention(q, k, v, mask, jnp.float32, prefix, 3)


def test_the_rule_by_hand():
  # saving prefix (1 - 1/group) against the row part n - prefix.
  assert not attention.cache_prefix_pays(32, 4, 96)  # 24 < 64
  assert not attention.cache_prefix_pays(64, 8, 128)  # 56 < 64
  assert attention.cache_prefix_pays(128, 4, 192)  # 96 >= 64
  assert attention.cache_prefix_pays(256, 8, 320)  # 224 >= 64
  assert attention.cache_prefix_pays(48, 4, 84)  # 36 >= 36
  assert not attention.cache_prefix_pays(48, 4, 85)  # 36 < 37
  assert not attention.cache_prefix_pays(256, 1, 320)  # no group
  assert not attention.cache_prefix_pays(320, 8, 320)  # no row part
  assert not attention.cache_prefix_pays(0, 8, 320)


PREFIX, GROUP, GROUPS, LEN, ACTION = 24, 4, 2, 40, 6
STOP = (49,)


def _model():
  cfg = transformer.TransformerConfig(
      vocab_size=50,
      d_model=32,
      num_layers=2,
      num_heads=4,
      num_kv_heads=2,
      head_dim=8,
      ffn_dim=64,
      qkv_bias=True,
      tie_embeddings=True,
      max_positions=64,
      # Length buckets (16, 32, 40): the decode and the observation read
      # through the 32 and 40 buckets, where the grouped read is taken, and
      # the 16 one is a per-row branch of the same switch.
      decode_bucket=16,
  )
  return cfg, nnx.split(transformer.Transformer(cfg, nnx.Rngs(params=0)))


def _prefilled(prompt_len, groups=GROUPS, length=PREFIX):
  """`init_state` with the shared prefill: groups of GROUP rows whose
  prompts (PREFIX + 2 wide) agree on their first PREFIX tokens."""
  cfg, (graphdef, params) = _model()
  b = GROUP * groups
  prompt = jax.random.randint(jax.random.key(5), (b, PREFIX + 2), 0, 49)
  prompt = prompt.at[:, :PREFIX].set(
      jnp.repeat(prompt[::GROUP, :PREFIX], GROUP, axis=0)
  )
  shared = transformer.SharedPrefix(length, GROUP)
  state = rollout.init_state(
      prompt,
      jnp.asarray(prompt_len, jnp.int32),
      None,
      max_len=LEN,
      graphdef=graphdef,
      params=params,
      model_config=cfg,
      shared_prefix=shared,
  )
  return (
      graphdef,
      params,
      state,
      rollout._cache_prefix(state, shared, prompt.shape[1]),
  )


def _turn_and_observation(graphdef, params, state, cache_prefix, temperature):
  """One sampled turn, then a 3-token observation through the cache."""
  state, action, action_len = rollout.generate_turn(
      graphdef,
      params,
      state,
      jax.random.key(7),
      max_action_len=ACTION,
      temperature=temperature,
      stop_tokens=STOP,
      cache_prefix=cache_prefix,
  )
  b = state.tokens.shape[0]
  obs = jax.random.randint(jax.random.key(8), (b, 3), 0, 49)
  active = jnp.ones((b,), bool)
  no = jnp.zeros((b,), bool)
  state = rollout.end_turn(
      state,
      active,
      no,
      no,
      no,
      obs,
      jnp.full((b,), 3, jnp.int32),
      graphdef=graphdef,
      params=params,
      cache_prefix=cache_prefix,
  )
  return state, action, action_len


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_turn_and_an_observation_equal_the_per_row_read(temperature):
  graphdef, params, state, cache_prefix = _prefilled([PREFIX + 1] * 8)
  assert cache_prefix.length == PREFIX and cache_prefix.group == GROUP
  assert bool(cache_prefix.shared)
  assert attention.cache_prefix_pays(PREFIX, GROUP, LEN)
  plain = _turn_and_observation(graphdef, params, state, None, temperature)
  shared = _turn_and_observation(
      graphdef, params, state, cache_prefix, temperature
  )
  np.testing.assert_array_equal(shared[1], plain[1])  # sampled tokens
  np.testing.assert_array_equal(shared[2], plain[2])
  np.testing.assert_array_equal(shared[0].tokens, plain[0].tokens)
  np.testing.assert_allclose(
      shared[0].logprob, plain[0].logprob, rtol=0, atol=1e-5
  )
  # The observation's prefill (a 3-token chunk) through the grouped read.
  np.testing.assert_allclose(
      shared[0].next_logits, plain[0].next_logits, rtol=0, atol=1e-5
  )


def test_the_grouped_read_runs_when_the_flag_says_so():
  # Row 1's prompt entries are changed after the prefill: with the flag set
  # its queries read row 0's (its group's first row), so the turn equals the
  # per-row read of a cache where row 1 holds row 0's entries again, and
  # differs from the per-row read of the changed cache.
  graphdef, params, state, cache_prefix = _prefilled([PREFIX + 1] * 8)
  assert attention.cache_prefix_pays(PREFIX, GROUP, 32)
  assert attention.cache_prefix_pays(PREFIX, GROUP, LEN)

  def with_row1(entries):
    cache = [
        {"k": c["k"].at[1, :, :, :PREFIX].set(e["k"]),
         "v": c["v"].at[1, :, :PREFIX].set(e["v"])}
        for c, e in zip(state.cache, entries)
    ]  # fmt: skip
    return state.replace(cache=cache)

  changed = with_row1(
      [{"k": c["k"][1, :, :, :PREFIX] + 0.5, "v": c["v"][1, :, :PREFIX] - 0.5}
       for c in state.cache]
  )  # fmt: skip
  grouped = _turn_and_observation(graphdef, params, changed, cache_prefix, 0.0)
  plain_changed = _turn_and_observation(graphdef, params, changed, None, 0.0)
  plain_kept = _turn_and_observation(graphdef, params, state, None, 0.0)
  np.testing.assert_allclose(
      grouped[0].next_logits, plain_kept[0].next_logits, rtol=0, atol=1e-5
  )
  assert not np.allclose(
      grouped[0].next_logits[1], plain_changed[0].next_logits[1], atol=1e-3
  )


def test_the_shared_length_is_the_prefills():
  # init_state shares min(length, prompt width, L) positions; a longer
  # configured length does not turn the grouped read off.
  *_, cache_prefix = _prefilled([PREFIX + 2] * 8, length=PREFIX + 10)
  assert cache_prefix.length == PREFIX + 2 and bool(cache_prefix.shared)
  *_, cache_prefix = _prefilled([PREFIX + 2] * 8, length=LEN + 5)
  assert cache_prefix.length == PREFIX + 2
  # A pytree with one leaf: length and group stay static under jit.
  assert jax.tree.leaves(cache_prefix) == [cache_prefix.shared]
  assert jax.jit(lambda c: c.length * c.group)(cache_prefix) == 104


def test_a_shorter_prompt_turns_the_grouped_read_off():
  # One row's prompt is shorter than the shared prefix: its own tokens sit
  # below it, so every row reads its own cache (the same program's plain
  # branch): the results are the per-row read's, bit for bit.
  lens = [PREFIX + 1] * 8
  lens[5] = PREFIX - 3
  graphdef, params, state, cache_prefix = _prefilled(lens)
  assert not bool(cache_prefix.shared)
  plain = _turn_and_observation(graphdef, params, state, None, 1.0)
  shared = _turn_and_observation(graphdef, params, state, cache_prefix, 1.0)
  for a, b in zip(jax.tree.leaves(shared), jax.tree.leaves(plain)):
    np.testing.assert_array_equal(a, b)


def _score_shapes(graphdef, params, state, cache_prefix):
  """Output shapes of the compiled decode turn's dot products."""
  fn = jax.jit(
      lambda p, s: rollout.generate_turn(
          graphdef,
          p,
          s,
          jax.random.key(0),
          max_action_len=ACTION,
          temperature=1.0,
          stop_tokens=STOP,
          cache_prefix=cache_prefix,
      )
  )
  text = fn.lower(params, state).compile().as_text()
  # Dots appear as `dot(` or as fusions whose root is a dot; take the
  # shapes of instructions named in either form.
  shapes = re.findall(r"= (f32\[[\d,]+\])\{[\d,]*\} (?:dot|fusion)\(", text)
  assert shapes
  return set(shapes)


def test_the_compiled_step_reads_the_prefix_once_per_group():
  graphdef, params, state, cache_prefix = _prefilled([PREFIX + 1] * 8)
  # [groups, kv heads, group * (heads / kv heads) queries, prefix entries]:
  # each group's queries against its prompt's keys, once.
  grouped = f"f32[{GROUPS},2,{GROUP * 2},{PREFIX}]"
  assert grouped in _score_shapes(graphdef, params, state, cache_prefix)
  assert grouped not in _score_shapes(graphdef, params, state, None)
  # A prefix too short for the rule adds no branch: no grouped product.
  short = transformer.CachePrefix(4, GROUP, cache_prefix.shared)
  assert not attention.cache_prefix_pays(4, GROUP, LEN)
  shapes = _score_shapes(graphdef, params, state, short)
  assert not any(
      re.fullmatch(rf"f32\[{GROUPS},2,{GROUP * 2},\d+\]", x) for x in shapes
  )


def test_the_benchmark_script_runs_and_checks_its_points():
  import os  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top

  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  script = os.path.join(repo, "experiments", "bench_prefix_decode.py")
  run = lambda *a: subprocess.run(
      [sys.executable, script, *a], capture_output=True, text=True, check=False
  )
  out = run(
      "--tiny", "--points=24:4,4:4", "--rows=8", "--new_tokens=8", "--pairs=2"
  )
  assert out.returncode == 0, out.stderr[-2000:]
  rows = [l for l in out.stdout.splitlines() if l.startswith("| 24 |")]
  rows += [l for l in out.stdout.splitlines() if l.startswith("| 4 |")]
  # (24, 4) over 32 entries: the rule takes it; (4, 4) over 12: it does not;
  # both variants sample the same tokens.
  assert rows[0].endswith("| yes | yes |"), out.stdout
  assert rows[1].endswith("| no | yes |"), out.stdout
  bad = run("--points=8:3", "--rows=8")
  assert bad.returncode == 2
  assert bad.stderr.strip().endswith(
      "--points: '8:3' needs prompt >= 1 and a group dividing --rows (8)"
  )


_MESH = """
import re
import jax, numpy as np
from agentic_rl import sharding
from tests import test_cache_prefix as t
assert jax.device_count() == 8
mesh = sharding.make_mesh(dict(data=8, fsdp=1, tensor=1))
COLL = r"= [^=]*? (all-gather|all-to-all|collective-permute|all-reduce)(-start)?\\("

def turn(gd, prefix):
  return jax.jit(lambda p, s: t._turn_and_observation(gd, p, s, prefix, 1.0))

# 8 rows (groups of 4 span 4 devices) and 32 rows (one group per device).
for groups in (2, 8):
  gd, params, state, cp = t._prefilled([t.PREFIX + 1] * (4 * groups), groups)
  ref = turn(gd, None)(params, state)  # one device, per-row read
  counts = {}
  with jax.set_mesh(mesh):
    for name, prefix in (("per-row", None), ("grouped", cp)):
      fn = turn(gd, prefix)
      hlo = fn.lower(params, state).compile().as_text()
      counts[name] = len(re.findall(COLL, hlo))
      out = jax.device_get(fn(params, state))
      np.testing.assert_array_equal(out[1], ref[1])
      np.testing.assert_array_equal(out[0].tokens, ref[0].tokens)
      np.testing.assert_allclose(out[0].logprob, ref[0].logprob, atol=1e-5)
      np.testing.assert_allclose(
          out[0].next_logits, ref[0].next_logits, atol=1e-5)
  print("collectives", 4 * groups, "rows", counts)
  if groups == 8:
    # Each device holds one whole group: the grouped read moves nothing
    # between devices.
    assert counts["grouped"] == counts["per-row"], counts
print("OK cache prefix mesh")
"""


@pytest.mark.slow
def test_on_8_devices_equals_one_device_and_a_whole_group_moves_nothing():
  from tests import fakes  # pylint: disable=g-import-not-at-top

  out = fakes.run_on_8_devices(_MESH)
  assert "OK cache prefix mesh" in out, out
