"""A mesh path without waste (agentic_rl/sharding.py, learner/, transformer.py).

* Minibatch / micro-batch / behaviour-forward / SFT splits are strided
  (`sharding.split_rows`): on a data-sharded batch every part keeps each
  device's share of the rows, read off the per-device shapes of the compiled
  programs; the split equals sequential single-minibatch updates and a mesh run
  equals one device.
* Fused q/k/v and gate/up projections concatenate along unsharded axes only:
  a tensor=4 forward + backward compiles to all-reduces only, exactly as many
  as Megatron-style tensor parallelism needs.
* Head counts the tensor axis does not divide are a config error.
* Real presets' per-device parameter / optimizer / KV-cache bytes on a
  (2, 2, 2) mesh (experiments/bench_mesh.py).

The multi-device checks run in a subprocess with 8 simulated CPU devices.
"""

import dataclasses
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentic_rl import learner
from agentic_rl import sharding
from agentic_rl import validation
from configs import default
from tests import fakes

_run_8_devices = fakes.run_on_8_devices


# ------------------------------------------------------------ strided split


def test_split_rows_is_strided_and_merge_inverts_it():
  x = jnp.arange(12 * 2).reshape(12, 2)
  parts = sharding.split_rows({"x": x, "y": jnp.arange(12)}, 3)
  np.testing.assert_array_equal(
      parts["y"], [[0, 3, 6, 9], [1, 4, 7, 10], [2, 5, 8, 11]]
  )
  np.testing.assert_array_equal(parts["x"][1, 2], x[7])  # row t*n + j = 2*3 + 1
  np.testing.assert_array_equal(sharding.merge_rows(parts)["x"], x)
  with pytest.raises(ValueError, match="n=5 must be >= 1 and divide the batch"):
    sharding.split_rows(x, 5)


def _rl_batch(graphdef, params, b=8, l=10, seed=0):
  k = jax.random.split(jax.random.PRNGKey(seed), 4)
  tokens = jax.random.randint(k[0], (b, l), 0, 200)
  mask = jax.random.bernoulli(k[1], 0.7, (b, l)).at[:, 0].set(False)
  from agentic_rl import sampling

  # One compiled forward (op by op it was hundreds of small compiles).
  logp, _ = jax.jit(sampling.token_logprobs, static_argnums=0)(
      graphdef, params, tokens, 1.0
  )
  return learner.LearnerBatch(
      tokens=tokens,
      mask=mask,
      behaviour_logp=jnp.where(
          mask, logp + 0.2 * jax.random.normal(k[2], (b, l)), 0.0
      ),
      ref_logp=jnp.where(mask, logp - 0.1, 0.0),
      advantage=jnp.where(mask, jax.random.normal(k[3], (b,))[:, None], 0.0),
  )


def test_minibatch_j_is_rows_j_mod_m_in_sequence():
  """Two strided minibatches (one AdamW step each) = two single-minibatch
  updates, on rows 0, 2, 4, 6 and then on rows 1, 3, 5, 7, the optimizer state
  carried over. Behaviour log-probs from the batch ('sampler'), so the first
  step of each call does not substitute its own log-probs. A one-layer policy:
  the equality holds at any depth, and the three compiled programs (the
  forward, the two updates) unroll every block."""
  graphdef, params, _ = fakes.tiny_policy(
      3, dataclasses.replace(fakes.TINY, num_layers=1)
  )
  batch = _rl_batch(graphdef, params)

  def cfg(num_mb):
    config = default.get_config("smoke")
    config.rl.update(
        num_minibatches=num_mb,
        num_microbatches=1,
        ppo_epochs=1,
        behaviour_logprobs="sampler",
        kl_coef=0.1,
        loss_agg_mode="token-mean",
        learning_rate=1e-2,
        warmup_steps=1,
    )
    return config

  tx = learner.make_optimizer(cfg(2).rl)
  two = jax.jit(learner.make_update_fn(cfg(2), graphdef, tx))
  one = jax.jit(learner.make_update_fn(cfg(1), graphdef, tx))
  p2, _, m2 = two(params, tx.init(params), batch, jnp.float32(0.1))
  p, opt, m_even = one(
      params,
      tx.init(params),
      jax.tree.map(lambda x: x[0::2], batch),
      jnp.float32(0.1),
  )
  p, _, m_odd = one(
      p, opt, jax.tree.map(lambda x: x[1::2], batch), jnp.float32(0.1)
  )
  for k in ("loss", "pg_loss", "kl", "grad_norm"):
    np.testing.assert_allclose(
        m2[k], (m_even[k] + m_odd[k]) / 2, rtol=1e-5, err_msg=k
    )
  for a, b in zip(jax.tree.leaves(p2), jax.tree.leaves(p)):
    np.testing.assert_allclose(a, b, atol=1e-6)
  # The contiguous split (rows 0-3, then 4-7) is a different update.
  q, opt, _ = one(
      params,
      tx.init(params),
      jax.tree.map(lambda x: x[:4], batch),
      jnp.float32(0.1),
  )
  q, _, _ = one(q, opt, jax.tree.map(lambda x: x[4:], batch), jnp.float32(0.1))
  assert (
      max(
          float(jnp.max(jnp.abs(a - b)))
          for a, b in zip(jax.tree.leaves(p2), jax.tree.leaves(q))
      )
      > 1e-4
  )


# Per-device rows of every [rows, L - 1, D] activation (the trunk's hidden
# states: embedding, attention / FFN inputs and outputs, their gradients) in the
# compiled programs, on 8 data devices with B = 64: each minibatch of a
# 4-way split has 16 rows, 2 per device. The contiguous reshape compiled to 8
# rows per device (4x the share). D = 40 and L - 1 = 11 appear in no other
# shape.
_ROWS = textwrap.dedent("""
    import collections, re
    import jax, jax.numpy as jnp, numpy as np
    from agentic_rl import learner, sharding, train, types
    from configs import default
    assert jax.device_count() == 8
    cfg = default.get_config("smoke")
    cfg.model.update(d_model=40, num_layers=1, num_heads=4, head_dim=8, ffn_dim=64)
    model_cfg = train.make_model_config(cfg)
    GRAPHDEF, STATE = train.init_state(cfg, model_cfg)
    B, L = 64, 12
    mesh = sharding.make_mesh(dict(data=8, fsdp=1, tensor=1))
    params = jax.device_put(jax.device_get(STATE.params),
                            sharding.tree_shardings(STATE.params, mesh))

    def rows(compiled):
      return dict(collections.Counter(int(m.group(1)) for m in re.finditer(
          r"\\[(\\d+),%d,40\\]" % (L - 1), compiled.as_text())))

    # split_rows keeps each device's rows: part shards are [4 parts, 2 rows].
    x = sharding.put_batch(jnp.arange(B * 3).reshape(B, 3), mesh)
    with jax.set_mesh(mesh):
      parts = jax.jit(lambda x: sharding.split_rows(x, 4))(x)
    assert {s.data.shape for s in parts.addressable_shards} == {(4, 2, 3)}
    np.testing.assert_array_equal(parts[1, :3], [[3, 4, 5], [15, 16, 17], [27, 28, 29]])

    batch = sharding.put_batch(learner.LearnerBatch(
        tokens=jnp.zeros((B, L), jnp.int32), mask=jnp.ones((B, L), bool),
        behaviour_logp=jnp.zeros((B, L)), ref_logp=jnp.zeros((B, L)),
        advantage=jnp.zeros((B, L))), mesh)
    for mb, micro in ((4, 1), (2, 2)):
      cfg.rl.update(num_minibatches=mb, num_microbatches=micro, ppo_epochs=1)
      tx = learner.make_optimizer(cfg.rl)
      opt = jax.jit(tx.init)(params)
      with jax.set_mesh(mesh):
        got = rows(jax.jit(learner.make_update_fn(cfg, GRAPHDEF, tx)).lower(
            params, opt, batch, jnp.float32(0.0)).compile())
        beh = rows(jax.jit(lambda p, t: learner.behaviour_forward(
            cfg, GRAPHDEF, p, t)).lower(params, batch.tokens).compile())
      assert set(got) == {2} and got[2] > 20, (mb, micro, got)
      assert set(beh) == {2} and beh[2] > 5, (mb, micro, beh)
      print("OK rows update", mb, micro, got, beh)
    role = jnp.full((B, L), types.POLICY, jnp.int8)
    traj = types.Trajectory(tokens=batch.tokens, role=sharding.put_batch(role, mesh),
                            logprob=None, turn=None, length=None, num_turns=None,
                            finish=None, group=None, facts=None)
    with jax.set_mesh(mesh):
      sft = rows(jax.jit(lambda p, t: learner.sft_grad(GRAPHDEF, p, t, 4)[2]).lower(
          params, traj).compile())
    assert set(sft) == {2}, sft
    print("OK rows sft", sft)
""")

# The RL update (2 minibatches x 2 micro-batches, 2 PPO epochs) on 8 data
# devices equals one device: float32, summed in a different order; tolerances
# as in tests/test_sharding.py: metrics rtol 1e-5, parameters after the 4 AdamW
# steps atol 1e-5 (they move by more than 1e-4, checked).
_EQUAL = textwrap.dedent("""
    from agentic_rl import sampling
    cfg.rl.update(num_minibatches=2, num_microbatches=2, ppo_epochs=2,
                  kl_coef=0.05, loss_agg_mode="token-mean")
    B, L = 32, 12
    ks = jax.random.split(jax.random.PRNGKey(4), 4)
    tokens = jax.random.randint(ks[0], (B, L), 0, 265)
    mask = jax.random.bernoulli(ks[1], 0.6, (B, L)).at[:, 0].set(False)
    logp0, _ = jax.jit(lambda p, t: sampling.token_logprobs(GRAPHDEF, p, t, 1.0))(
        STATE.params, tokens)
    host = jax.device_get(learner.LearnerBatch(
        tokens=tokens, mask=mask, behaviour_logp=logp0, ref_logp=logp0 - 0.1,
        advantage=jax.random.normal(ks[2], (B, L))))
    tx = learner.make_optimizer(cfg.rl)
    update = learner.make_update_fn(cfg, GRAPHDEF, tx)

    def run(mesh):
      p = jax.device_get(STATE.params)
      b = host
      if mesh is not None:
        p = jax.device_put(p, sharding.tree_shardings(STATE.params, mesh))
        b = sharding.put_batch(host, mesh)
      opt = jax.jit(tx.init)(p)
      if mesh is None:
        p, opt, m = jax.jit(update)(p, opt, b, jnp.float32(0.05))
      else:
        with jax.set_mesh(mesh):
          p, opt, m = jax.jit(update)(p, opt, b, jnp.float32(0.05))
      return jax.device_get(p), {k: float(v) for k, v in m.items()}

    p1, m1 = run(None)
    p8, m8 = run(mesh)
    for k in m1:
      np.testing.assert_allclose(m8[k], m1[k], rtol=1e-5, atol=1e-7, err_msg=k)
    diff = max(float(np.max(np.abs(a - b))) for a, b in
               zip(jax.tree.leaves(p1), jax.tree.leaves(p8)))
    moved = max(float(np.max(np.abs(a - b))) for a, b in
                zip(jax.tree.leaves(p1), jax.tree.leaves(jax.device_get(STATE.params))))
    assert diff < 1e-5 and moved > 1e-4, (diff, moved)
    print("OK equal", diff, moved)
""")


@pytest.mark.slow
def test_splits_keep_each_device_share_and_equal_one_device():
  # Five compiled programs on 8 devices: ~80 s of CPU.
  out = _run_8_devices(_ROWS + _EQUAL)
  assert out.count("OK rows update") == 2 and "OK rows sft" in out, out
  assert "OK equal" in out, out


# --------------------------------------------------- tensor-parallel collectives

# Forward + backward of the token log-prob loss of a 2-layer GQA model (H = 8,
# G = 4, vocabulary 256: every tensor-sharded axis divisible by 4) on a
# tensor = 4 mesh (no data / fsdp splitting). Megatron-style tensor parallelism
# (arXiv:1909.08053) needs exactly these all-reduces over 'tensor', each of an
# activation [B, T, D] or [B, T]:
#   forward: the embedding lookup (table split over the vocabulary: each device
#     contributes its rows) 1; per layer the row-parallel o and down
#     projections 2 x num_layers; the vocabulary-parallel log-softmax: max,
#     sum of exp, and the target logit 3;
#   backward: the input gradient of the LM head 1; per layer the input
#     gradients of the column-parallel q/k/v and gate/up projections
#     2 x num_layers (o, down and the embedding need none);
#   total 5 + 4 * num_layers = 13.
# XLA may merge independent all-reduces into one tuple all-reduce, so operands
# are counted. Nothing else: no collective-permute / all-to-all / all-gather.
# (Concatenating q/k/v along the sharded head axis compiled to 66
# collective-permutes and 4 all-gathers here.) With fsdp = 2 as well, the
# weights are all-gathered (ZeRO-3) and activations move only once, after the
# embedding lookup.
_COLLECTIVES = textwrap.dedent("""
    import collections, re
    import jax, jax.numpy as jnp
    from flax import nnx
    from agentic_rl import sampling, sharding
    from agentic_rl.models import transformer as T
    L_LAYERS = 2
    cfg = T.TransformerConfig(vocab_size=256, d_model=64, num_layers=L_LAYERS,
                              num_heads=8, num_kv_heads=4, head_dim=16,
                              ffn_dim=128, qkv_bias=True)
    graphdef, params0 = nnx.split(T.Transformer(cfg, nnx.Rngs(0)))
    B, L = 8, 32
    OPS = ("all-reduce", "all-gather", "collective-permute", "all-to-all",
           "reduce-scatter")

    def collectives(shape):
      d, f, t = shape
      mesh = sharding.make_mesh(dict(data=d, fsdp=f, tensor=t),
                                devices=jax.devices()[:d * f * t])
      params = jax.device_put(params0, sharding.tree_shardings(params0, mesh))
      tokens = sharding.put_batch(jnp.zeros((B, L), jnp.int32), mesh)
      loss = lambda p, t: sampling.token_logprobs(graphdef, p, t, 1.0)[0].sum()
      with jax.set_mesh(mesh):
        hlo = jax.jit(jax.grad(loss)).lower(params, tokens).compile().as_text()
      found = []
      for line in hlo.splitlines():
        m = re.search(r"= (.*?) (%s)(-start)?\\(" % "|".join(OPS), line)
        if m:
          types_ = re.findall(r"(\\w+)\\[([\\d,]*)\\]", m.group(1))
          name = re.search(r'op_name="([^"]*)"', line)
          found += [(m.group(2), dt, dims, name and name.group(1))
                    for dt, dims in types_]
      return found

    got = collectives((1, 1, 4))
    count = collections.Counter(x[0] for x in got)
    assert count == {"all-reduce": 5 + 4 * L_LAYERS}, got
    shapes = {x[2] for x in got}
    assert shapes == {"%d,%d,64" % (B, L - 1), "%d,%d" % (B, L - 1)}, shapes
    print("OK tensor4", dict(count))
    got = collectives((1, 2, 4))
    moved = [x for x in got if x[0] in ("collective-permute", "all-to-all")
             and x[1].startswith(("f", "bf"))]
    # The one exception: the embedding lookup's rows come out split over
    # d_model (the table's 'fsdp' axis) and move to the batch split once per
    # forward, one all-to-all of activations [B / fsdp, T, D / fsdp] pieces.
    assert all("_take" in x[3] for x in moved) and len(moved) <= 2, moved
    gathered = {x[2] for x in got if x[0] == "all-gather" and x[1] == "f32"}
    # ZeRO-3: only weights are all-gathered (fused q/k/v per tensor shard
    # [D, G / 4, r + 2, Dh], gate/up [D, 2, F / 4], down, o, LM head).
    assert gathered == {"64,1,4,16", "64,2,32", "32,64", "2,16,64", "64,64"}, got
    print("OK fsdp2 tensor4", dict(collections.Counter(x[0] for x in got)))
""")


@pytest.mark.slow
def test_tensor_parallel_forward_backward_is_all_reduces_only():
  # Two compiled forward + backward programs: ~30 s of CPU.
  out = _run_8_devices(_COLLECTIVES)
  assert "OK tensor4" in out and "OK fsdp2 tensor4" in out, out


# ------------------------------------------------------------ head counts


@pytest.mark.parametrize(
    "heads,kv,tensor,field",
    [
        (14, 2, 4, "num_heads=14"),  # Qwen2.5-0.5B at tensor = 4
        (9, 3, 2, "num_heads=9"),  # SmolLM2-135M at tensor = 2
        (32, 8, 16, "num_kv_heads=8"),  # Llama-3.2-1B at tensor = 16
        (8, 0, 16, "num_heads=8"),
    ],
)
def test_heads_not_divisible_by_tensor_are_refused(heads, kv, tensor, field):
  with pytest.raises(
      ValueError,
      match=rf"config\.model\.{field}: not divisible "
      rf"by mesh\.tensor={tensor}",
  ):
    sharding.check_heads_divide_tensor(heads, kv, tensor)


@pytest.mark.parametrize(
    "heads,kv,tensor", [(14, 2, 2), (9, 3, 3), (32, 8, 8), (9, 3, 1), (4, 0, 4)]
)
def test_heads_divisible_by_tensor_pass(heads, kv, tensor):
  sharding.check_heads_divide_tensor(heads, kv, tensor)


def test_validation_names_the_head_count(monkeypatch):
  config = default.get_config("smoke")
  config.model.update(num_heads=14, num_kv_heads=2, head_dim=8, d_model=112)
  config.mesh.update(data=1, fsdp=-1, tensor=4)
  config.sft.batch_size = config.rl.batch_size = 8
  monkeypatch.setattr(jax, "device_count", lambda: 8)
  with pytest.raises(
      validation.ConfigError,
      match=r"config\.model\.num_heads=14: not divisible by " r"mesh\.tensor=4",
  ):
    validation.validate_config(config)
  config.mesh.tensor = 2
  validation.validate_config(config)


# ------------------------------------------------------- real preset shapes

# Per-device bytes from the shard shapes of sharding.tree_shardings on a
# (data 2, fsdp 2, tensor 2) mesh, against the partition rules worked by hand:
# every parameter is split over fsdp * tensor = 4 except the RMSNorm scales
# (2 per layer + the final one, [D], replicated) and Qwen's q/k/v biases
# ([heads, Dh], split over tensor only). AdamW holds mu and nu shaped like the
# parameters (plus scalar counts). The KV cache [B, G, ...] splits B over
# data * fsdp and G over tensor: exactly 1/8. SmolLM2-135M (9 heads) is refused
# at tensor = 2 and planned on (2, 4, 1) instead.
_PRESETS = textwrap.dedent("""
    import sys
    sys.argv = ["bench_mesh"]
    from experiments import bench_mesh as bm
    for preset, shape in (("qwen2.5-0.5b", (2, 2, 2)), ("llama-3.2-1b", (2, 2, 2)),
                          ("smollm2-135m", (2, 4, 1))):
      p = bm.plan(preset, shape, batch=8, cache_len=64)
      cfg = p["cfg"]
      d, f, t = shape
      norm = (2 * cfg.num_layers + 1) * cfg.d_model * 4
      bias = (cfg.num_layers * (cfg.num_heads + 2 * cfg.kv_heads) * cfg.head_dim * 4
              if cfg.qkv_bias else 0)
      want = (p["param_total"] - norm - bias) / (f * t) + norm + bias / t
      assert p["param_dev"] == want, (preset, p["param_dev"], want)
      ratio = p["param_dev"] * f * t / p["param_total"]
      assert 1.0 <= ratio < 1.002, (preset, ratio)
      assert 0 <= p["opt_dev"] - 2 * p["param_dev"] <= 64, (preset, p["opt_dev"])
      assert p["kv_dev"] * d * f * t == p["kv_total"], preset
      print("OK", preset, p["param_dev"], ratio)
    try:
      bm.plan("smollm2-135m", (2, 2, 2), batch=8, cache_len=64)
      raise AssertionError("smollm2-135m at tensor=2 was not refused")
    except ValueError as e:
      assert "model.num_heads=9: not divisible by mesh.tensor=2" in str(e), e
    print("OK refused")
""")


def test_real_presets_per_device_bytes_on_2x2x2():
  out = _run_8_devices(_PRESETS)
  assert out.count("OK") == 4, out


# ------------------------------------------------------ trained-token share


@pytest.mark.slow
def test_trained_token_share_is_the_loss_mask_share_of_the_buffer():
  """`trained_token_share` = loss-mask tokens / (B * L): the per-row mean of
  trained tokens (`policy_tokens`) divided by the buffer length L."""
  config = default.get_config("smoke")
  state, step = fakes.rl_state_and_step(config)
  _, m = step(state)
  share = float(m["trained_token_share"])
  assert 0.0 < share < 1.0
  np.testing.assert_allclose(
      share, float(m["policy_tokens"]) / config.max_len, rtol=1e-6
  )
