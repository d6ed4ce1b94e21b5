"""Mesh construction, partition rules, and sharded training / sampling equal to
one device (agentic_rl/sharding.py).

The multi-device checks run in a subprocess with 8 simulated CPU devices
(`--xla_force_host_platform_device_count=8` must be set before JAX starts).
"""

import textwrap
import types

import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from agentic_rl import sharding
from agentic_rl import train
from agentic_rl import validation
from agentic_rl.models import transformer
from configs import default
from tests import fakes

MESH_222 = {"data": 2, "fsdp": 2, "tensor": 2}


# ---------------------------------------------------------------- mesh config


@pytest.mark.parametrize(
    "cfg,n,want",
    [
        (None, 8, (8, 1, 1)),
        (dict(data=-1, fsdp=1, tensor=1), 1, (1, 1, 1)),
        (dict(data=2, fsdp=2, tensor=2), 8, (2, 2, 2)),
        (dict(data=1, fsdp=-1, tensor=2), 8, (1, 4, 2)),
        (dict(data=2, fsdp=1, tensor=-1), 8, (2, 1, 4)),
    ],
)
def test_mesh_shape_resolves_fill(cfg, n, want):
  assert sharding.mesh_shape(cfg, n) == want


@pytest.mark.parametrize(
    "cfg,n,match",
    [
        (
            dict(data=2, fsdp=2, tensor=1),
            8,
            r"config.mesh=\(data=2, fsdp=2, tensor=1\): data\*fsdp\*tensor = 4 must "
            r"equal the number of devices \(8\)",
        ),
        (dict(data=-1, fsdp=-1, tensor=1), 8, r"config.mesh.fsdp=-1: only one"),
        (
            dict(data=-1, fsdp=3, tensor=1),
            8,
            r"config.mesh.data=-1: cannot fill 8",
        ),
        (
            dict(data=0, fsdp=1, tensor=1),
            8,
            r"config.mesh.data=0: must be >= 1",
        ),
        (
            dict(data=1, fsdp=1, tensor=True),
            1,
            r"config.mesh.tensor=True: must be an",
        ),
        (
            dict(data=1, fsdp=1.5, tensor=1),
            1,
            r"config.mesh.fsdp=1.5: must be an",
        ),
    ],
)
def test_mesh_shape_rejects_bad_sizes(cfg, n, match):
  with pytest.raises(ValueError, match=match):
    sharding.mesh_shape(cfg, n)


def test_validation_rejects_mesh_not_covering_devices():
  config = default.get_config("smoke")
  config.mesh.data = 2  # this process has one CPU device
  with pytest.raises(validation.ConfigError, match=r"config.mesh=\(data=2"):
    validation.validate_config(config)


def test_validation_rejects_batch_not_divisible_by_batch_axes(monkeypatch):
  config = default.get_config("smoke")
  config.mesh.update(data=-1, fsdp=2)
  config.sft.batch_size = 6
  monkeypatch.setattr(jax, "device_count", lambda: 4)
  with pytest.raises(
      validation.ConfigError,
      match=r"config.sft.batch_size=6: must be divisible by mesh "
      r"data\*fsdp = 2\*2",
  ):
    validation.validate_config(config)


def test_default_config_is_one_device_here():
  mesh = sharding.make_mesh(default.get_config().mesh)
  assert dict(mesh.shape) == {"data": 1, "fsdp": 1, "tensor": 1}
  assert all(t == jax.sharding.AxisType.Auto for t in mesh.axis_types)


def _schema_config(**changes):
  from configs import schema  # pylint: disable=g-import-not-at-top

  config = schema.with_defaults(default.get_config())
  for path, value in changes.items():
    block, name = path.split(".")
    config[block][name] = value
  return config


def test_cpu_device_count_automatic_two_on_two_cores_or_more():
  # The default config: rl 64 rows in 2 minibatches of 32, sft 64 rows.
  config = _schema_config()
  assert sharding.cpu_device_count(config, cores=2)[0] == 2
  assert sharding.cpu_device_count(config, cores=64)[0] == 2  # at most 2
  assert sharding.cpu_device_count(config, cores=1) == (
      1,
      "automatic: 1 CPU core",
  )


@pytest.mark.parametrize(
    "changes,reason",
    [
        # 64 rows / (2 minibatches * 32 micro-batches) = 1 row per micro-batch.
        ({"rl.num_microbatches": 32}, "rl.batch_size / (rl.num_minibatches"),
        ({"rl.batch_size": 6, "rl.group_size": 3}, "rl.batch_size / ("),
        ({"sft.batch_size": 9}, "sft.batch_size does not split"),
        # Without SFT steps its batch size still counts (validation).
        ({"sft.batch_size": 9, "sft.steps": 0}, "sft.batch_size does not"),
        ({"sft.num_microbatches": 64}, "sft.batch_size / sft.num_microbatches"),
        # 8 groups of 8: 8 groups in 8 micro-batches is one group each.
        (
            {"rl.shared_prefix_len": 4, "rl.num_microbatches": 8},
            "the groups of each micro-batch",
        ),
        ({"mesh.fsdp": 2, "mesh.data": 1}, "the mesh block sets"),
        ({"mesh.data": 1}, "the mesh block sets"),
    ],
)
def test_cpu_device_count_automatic_one_when_a_split_is_uneven(changes, reason):
  count, why = sharding.cpu_device_count(_schema_config(**changes), cores=2)
  assert count == 1
  assert why.startswith("automatic: 1, " + reason), why


def test_cpu_device_count_skips_micro_batches_of_a_phase_without_steps():
  # 64 SFT rows in 64 micro-batches would be one row each, but no SFT runs.
  config = _schema_config(**{"sft.num_microbatches": 64, "sft.steps": 0})
  assert sharding.cpu_device_count(config, cores=2)[0] == 2


def test_cpu_device_count_explicit_environment_and_distributed():
  assert sharding.cpu_device_count(
      _schema_config(**{"mesh.cpu_devices": 4}), cores=1
  ) == (4, "set by mesh.cpu_devices")
  # An explicit count must divide the batches (64 RL, 64 SFT rows).
  with pytest.raises(ValueError, match=r"cpu_devices=3: must divide rl\."):
    sharding.cpu_device_count(_schema_config(**{"mesh.cpu_devices": 3}), 2)
  # A count the environment sets is left alone unless the config names one.
  flags = {
      "XLA_FLAGS": (
          "--xla_backend_optimization_level=0 "
          "--xla_force_host_platform_device_count=8"
      )
  }
  count, why = sharding.cpu_device_count(_schema_config(), 2, flags)
  assert count is None and "XLA_FLAGS" in why
  count, why = sharding.cpu_device_count(
      _schema_config(), 2, {"JAX_NUM_CPU_DEVICES": "4"}
  )
  assert count is None and "JAX_NUM_CPU_DEVICES" in why
  assert (
      sharding.cpu_device_count(
          _schema_config(**{"mesh.cpu_devices": 1}), 2, flags
      )[0]
      == 1
  )
  # Counts the environment sets must be integers >= 1.
  for env, name in (
      ({"JAX_NUM_CPU_DEVICES": "abc"}, "JAX_NUM_CPU_DEVICES"),
      ({"JAX_NUM_CPU_DEVICES": "0"}, "JAX_NUM_CPU_DEVICES"),
      ({"JAX_NUM_CPU_DEVICES": " "}, "JAX_NUM_CPU_DEVICES"),
      (
          {"XLA_FLAGS": "--xla_force_host_platform_device_count=0"},
          "XLA_FLAGS",
      ),
      ({"XLA_FLAGS": "--xla_force_host_platform_device_count"}, "XLA_FLAGS"),
  ):
    with pytest.raises(ValueError, match=f"^{name}.*integer >= 1"):
      sharding.cpu_device_count(_schema_config(), 2, env)
  # Other XLA flags do not count.
  other = {"XLA_FLAGS": "--xla_backend_optimization_level=0"}
  assert sharding.cpu_device_count(_schema_config(), 2, other)[0] == 2
  # A multi-process run: its launcher sets each process's devices.
  count, _ = sharding.cpu_device_count(
      _schema_config(**{"mesh.distributed": True}), 2
  )
  assert count is None
  with pytest.raises(ValueError, match="not with mesh.distributed"):
    sharding.cpu_device_count(
        _schema_config(**{"mesh.distributed": True, "mesh.cpu_devices": 2}),
        2,
    )


@pytest.mark.parametrize("value", [-1, 1.5, True, "2"])
def test_cpu_device_count_rejects_bad_values(value):
  # The field is read before any other (a dict mesh block, as _mesh_field
  # accepts, carries the types a ConfigDict would refuse).
  config = types.SimpleNamespace(mesh=dict(cpu_devices=value))
  with pytest.raises(ValueError, match=r"config\.mesh\.cpu_devices="):
    sharding.cpu_device_count(config, cores=2)


def test_distributed_initialize_called_with_config_arguments(monkeypatch):
  calls = []
  monkeypatch.setattr(
      jax.distributed, "initialize", lambda **kw: calls.append(kw)
  )
  config = default.get_config("smoke")
  assert not sharding.maybe_initialize_distributed(config)  # off by default
  assert calls == []
  config.mesh.update(
      distributed=True,
      coordinator_address="10.0.0.1:1234",
      num_processes=4,
      process_id=2,
  )
  assert sharding.maybe_initialize_distributed(config)
  assert calls == [
      dict(coordinator_address="10.0.0.1:1234", num_processes=4, process_id=2)
  ]
  config.mesh.update(coordinator_address="", num_processes=-1, process_id=-1)
  sharding.maybe_initialize_distributed(config)
  assert calls[-1] == dict(
      coordinator_address=None, num_processes=None, process_id=None
  )


class _RemoteRows:
  """Stands in for a batch-sharded jax.Array of a multi-process run: this
  process does not hold every row (is_fully_addressable False)."""

  is_fully_addressable = False


def test_to_host_gathers_only_arrays_other_processes_hold(monkeypatch):
  import numpy as np
  from jax.experimental import multihost_utils

  calls = []

  def fake_allgather(x, tiled=False):
    calls.append((x, tiled))
    return np.arange(6).reshape(3, 2)  # the global array every process gets

  monkeypatch.setattr(
      sharding.multihost_utils, "process_allgather", fake_allgather
  )
  remote = _RemoteRows()
  local = jnp.arange(4.0)
  out = sharding.to_host({"facts": {"correct": remote, "calls": local}, "n": 3})
  assert calls == [(remote, True)]
  np.testing.assert_array_equal(
      out["facts"]["correct"], np.arange(6).reshape(3, 2)
  )
  assert isinstance(out["facts"]["calls"], np.ndarray)
  np.testing.assert_array_equal(out["facts"]["calls"], [0.0, 1.0, 2.0, 3.0])
  assert out["n"] == 3
  monkeypatch.undo()
  # The real gather on one process returns the array itself (what to_host
  # asks of it: tiled, so a global array comes back whole).
  np.testing.assert_array_equal(
      multihost_utils.process_allgather(jnp.arange(4), tiled=True), np.arange(4)
  )


# ------------------------------------------------------------ partition rules


@pytest.mark.parametrize(
    "name,shape,want",
    [
        ("q_dhk", (32, 4, 8), P("fsdp", "tensor", None)),
        ("k_dgk", (32, 2, 8), P("fsdp", "tensor", None)),
        ("o_hkd", (4, 8, 32), P("tensor", None, "fsdp")),
        ("gate_df", (32, 64), P("fsdp", "tensor")),
        ("down_fd", (64, 32), P("tensor", "fsdp")),
        ("lm_head_dv", (32, 256), P("fsdp", "tensor")),
        ("q_bias_hk", (4, 8), P("tensor", None)),
        ("value_head_d", (32,), P("fsdp")),
        # Not divisible: that dimension falls back to replicated.
        ("embed_vd", (265, 32), P(None, "fsdp")),
        ("k_dgk", (32, 1, 8), P("fsdp", None, None)),
        ("gate_df", (33, 64), P(None, "tensor")),
        # A mesh axis is used once: the first letter asking for it wins.
        ("mix_hf", (4, 64), P("tensor", None)),
    ],
)
def test_param_spec_from_name_suffix(name, shape, want):
  assert sharding.param_spec(name, shape, MESH_222) == want


@pytest.mark.parametrize(
    "name,shape",
    [
        ("scale", (32,)),  # no axis suffix
        ("q_dhk", (32, 4)),  # suffix letters do not match the rank
        ("kl_coef", ()),  # 'c', 'o', 'e' are not axis letters; scalar
        ("count", ()),
    ],
)
def test_param_spec_unmatched_is_none(name, shape):
  assert sharding.param_spec(name, shape, MESH_222) is None


@pytest.fixture(scope="module")
def small_state():
  config = default.get_config("smoke")
  config.model.update(
      d_model=32, num_layers=2, num_heads=4, head_dim=8, ffn_dim=64
  )
  graphdef, state = train.init_state(config, train.make_model_config(config))
  return config, graphdef, state


def test_tree_specs_cover_params_and_mirror_into_optimizer_state(small_state):
  _, _, state = small_state
  specs = sharding.tree_specs(state, MESH_222)
  attn = specs.params["blocks"][1]["attn"]
  assert attn["q_dhk"].get_value() == P("fsdp", "tensor", None)
  assert attn["o_hkd"].get_value() == P("tensor", None, "fsdp")
  # V = 265 is odd.
  assert specs.params["embed_vd"].get_value() == P(None, "fsdp")
  assert specs.params["blocks"][0]["ffn"]["down_fd"].get_value() == P(
      "tensor", "fsdp"
  )
  assert specs.params["final_norm"]["scale"].get_value() == P()
  # Adam's mu and nu mirror the parameters; the step count is replicated.
  adam = specs.opt_state[1][0]
  assert adam.mu["blocks"][1]["attn"]["q_dhk"].get_value() == P(
      "fsdp", "tensor", None
  )
  assert adam.nu["lm_head_dv"].get_value() == P("fsdp", None)
  assert adam.count == P()
  assert specs.ref_params["blocks"][0]["ffn"]["gate_df"].get_value() == P(
      "fsdp", "tensor"
  )
  assert specs.rng == P() and specs.step == P()


def test_unmatched_leaves_lists_only_unsuffixed_arrays(small_state):
  _, _, state = small_state
  got = sharding.unmatched_leaves(state.params)
  want = [
      f"['blocks'][{i}]['{n}']['scale'].value"
      for i in range(2)
      for n in ("attn_norm", "ffn_norm")
  ]
  assert sorted(got) == sorted(want + ["['final_norm']['scale'].value"])
  # Whole state: the 5 norm scales in params, ref_params, Adam mu and nu, and
  # the PRNG key; scalars (step, kl_coef, Adam count) are not listed.
  everything = sharding.unmatched_leaves(state)
  assert len(everything) == 4 * 5 + 1 and ".rng" in everything


def test_batch_and_cache_specs():
  assert sharding.batch_spec((8, 64), MESH_222) == P(("data", "fsdp"))
  assert sharding.batch_spec((6, 64), MESH_222) == P()  # 6 % 4 != 0
  assert sharding.batch_spec((), MESH_222) == P()
  assert sharding.cache_spec((8, 4, 64, 8), MESH_222) == P(
      ("data", "fsdp"), "tensor", None, None
  )
  assert sharding.cache_spec((8, 1, 64, 8), MESH_222) == P(
      ("data", "fsdp"), None, None, None
  )
  assert sharding.cache_spec((2, 4, 64, 8), MESH_222) == P(
      None, "tensor", None, None
  )


def test_init_state_on_one_device_equals_eager_init(small_state):
  config, graphdef, state = small_state
  q = state.params["blocks"][0]["attn"]["q_dhk"][...]
  assert isinstance(q.sharding, jax.sharding.NamedSharding)
  assert q.sharding.spec == P("fsdp", "tensor", None)
  # Same values as building the model eagerly (the pre-sharding code path).
  model = transformer.Transformer(
      train.make_model_config(config),
      nnx.Rngs(params=jax.random.fold_in(jax.random.PRNGKey(config.seed), 0)),
  )
  eager = nnx.state(model)
  for a, b in zip(jax.tree.leaves(eager), jax.tree.leaves(state.params)):
    assert jnp.array_equal(a, b)
  assert nnx.graphdef(model) == graphdef


def test_constrain_is_a_noop_without_mesh():
  x = {"a": jnp.ones((4, 3))}
  assert sharding.constrain_batch(x) is x
  assert sharding.constrain_cache(None) is None


# ------------------------------------------------------ 8 simulated devices

_COMMON = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np, optax
    from agentic_rl import learner, rollout, sharding, train, types
    from configs import default
    assert jax.device_count() == 8, jax.devices()
    DEVS = jax.devices()
    cfg = default.get_config("smoke")
    # d_model, heads, FFN divisible by fsdp (<= 4) and tensor (<= 2); the
    # vocabulary (265) is not, so embeddings exercise the replicated fallback.
    cfg.model.update(d_model=32, num_layers=1, num_heads=4, head_dim=8,
                     ffn_dim=64)
    cfg.sft.batch_size = 8
    model_cfg = train.make_model_config(cfg)
    env = train.make_env(cfg)

    def mesh_of(d, f, t):
      return sharding.make_mesh(dict(data=d, fsdp=f, tensor=t),
                                devices=DEVS[:d * f * t])

    def maxdiff(a, b):
      return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
                 for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
""")

# Each mesh builds its own sharded state with train.init_state (jit with
# out_shardings); it must equal the one-device state up to float rounding (the
# one-device path initialises eagerly, and XLA's fusion of the jitted
# initialiser moves some weights by one ulp: atol 1e-6). Training then starts
# from the one-device initial values, placed with the mesh's shardings, so the
# comparison isolates the sharded computation. Tolerances (float32, the sharded
# programs sum in a different order): loss rtol 1e-5; gradients atol 1e-6
# (measured ~5e-8); parameters after 5 AdamW steps atol 1e-5, i.e. under 1% of
# the largest possible move (sum of the 5 warmup learning rates = 1.5e-3):
# Adam divides by sqrt(v), so a near-zero gradient entry that differs by
# rounding moves its parameter by a visibly different fraction of the
# learning rate (measured up to ~1e-6).
_INIT = textwrap.dedent("""
    def sharded_start(shape, ref_state):
      mesh = mesh_of(*shape)
      graphdef, state = train.init_state(cfg, model_cfg, mesh)
      assert maxdiff(state, ref_state) < 1e-6, (shape, maxdiff(state, ref_state))
      q = state.params["blocks"][0]["attn"]["q_dhk"][...]
      d, f, t = shape
      assert q.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor", None)
      assert q.addressable_shards[0].data.shape == (32 // f, 4 // t, 8), shape
      state_sh = sharding.tree_shardings(state, mesh)
      return mesh, graphdef, jax.device_put(jax.device_get(ref_state), state_sh)

    GRAPHDEF, REF_STATE = train.init_state(cfg, model_cfg, mesh_of(1, 1, 1))
""")

# Slow tier: every mesh, the real learner.make_sft_step (expert demonstrations
# generated inside the step, batch constrained to ('data', 'fsdp')).
_TRAIN = _COMMON + _INIT + textwrap.dedent("""
    MESHES = {MESHES}
    tasks = env.sample_tasks(jax.random.PRNGKey(7), 8)
    demo = jax.device_get(jax.jit(lambda t: rollout.rollout(
        env, t, jax.random.PRNGKey(8), max_len=cfg.max_len))(tasks))

    def run(shape):
      if shape is None:
        # A copy: the SFT step donates its input state.
        mesh, graphdef = mesh_of(1, 1, 1), GRAPHDEF
        state = jax.tree.map(jnp.copy, REF_STATE)
      else:
        mesh, graphdef, state = sharded_start(shape, REF_STATE)
      traj = sharding.put_batch(demo, mesh)
      loss, grads = jax.jit(jax.value_and_grad(
          lambda p, b: learner.sft_loss(graphdef, p, b)[0]))(state.params, traj)
      with jax.set_mesh(mesh):
        step = learner.make_sft_step(cfg, env, graphdef,
                                     learner.make_optimizer(cfg.sft),
                                     state_sharding=sharding.tree_shardings(
                                         state, mesh))
        step_losses = []
        for _ in range(5):
          state, m = step(state)
          step_losses.append(float(m["loss"]))
      return float(loss), jax.device_get(grads), step_losses, jax.device_get(
          state.params)

    ref = run(None)
    assert maxdiff(ref[3], REF_STATE.params) > 1e-4  # it trained
    for shape in MESHES:
      loss, grads, step_losses, params = run(shape)
      np.testing.assert_allclose(loss, ref[0], rtol=1e-5, err_msg=str(shape))
      np.testing.assert_allclose(step_losses, ref[2], rtol=1e-5, err_msg=str(shape))
      assert maxdiff(grads, ref[1]) < 1e-6, (shape, maxdiff(grads, ref[1]))
      assert maxdiff(params, ref[3]) < 1e-5, (shape, maxdiff(params, ref[3]))
      print("OK", shape, maxdiff(grads, ref[1]), maxdiff(params, ref[3]))
""")

# Fast tier: the (2, 2, 2) mesh only, with a fixed random batch and the SFT
# loss of agentic_rl/learner/ in a jitted AdamW step with in/out shardings (no rollout
# to compile). Tolerances as above.
_FAST_TRAIN = _COMMON + _INIT + textwrap.dedent("""
    k1, k2 = jax.random.split(jax.random.PRNGKey(5))
    demo = dict(tokens=jax.random.randint(k1, (8, 24), 0, 265),
                role=jnp.where(jax.random.bernoulli(k2, 0.6, (8, 24)), 2, 1
                               ).astype(jnp.int8))
    tx = learner.make_optimizer(cfg.sft)
    grad_fn = jax.value_and_grad(lambda p, b: learner.sft_loss(GRAPHDEF, p, b)[0])

    def run(shape):
      if shape is None:
        mesh, state = mesh_of(1, 1, 1), REF_STATE
      else:
        mesh, _, state = sharded_start(shape, REF_STATE)
      batch = sharding.put_batch(demo, mesh)
      traj = types.Trajectory(
          tokens=batch["tokens"], role=batch["role"], logprob=None, turn=None,
          length=None, num_turns=None, finish=None, group=None, facts=None)
      sh = sharding.tree_shardings((state.params, state.opt_state), mesh)

      def step(carry, traj):
        params, opt_state = carry
        loss, g = grad_fn(params, traj)
        updates, opt_state = tx.update(g, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), (loss, g)

      step = jax.jit(step, in_shardings=(sh, None), out_shardings=(sh, None))
      carry, step_losses = (state.params, state.opt_state), []
      for i in range(5):
        carry, (l, g) = step(carry, traj)
        step_losses.append(float(l))
        grads = jax.device_get(g) if i == 0 else grads  # at the initial params
      return step_losses[0], grads, step_losses, jax.device_get(carry[0])

    ref = run(None)
    loss, grads, step_losses, params = run((2, 2, 2))
    np.testing.assert_allclose(loss, ref[0], rtol=1e-5)
    np.testing.assert_allclose(step_losses, ref[2], rtol=1e-5)
    assert maxdiff(grads, ref[1]) < 1e-6, maxdiff(grads, ref[1])
    assert maxdiff(params, ref[3]) < 1e-5, maxdiff(params, ref[3])
    assert maxdiff(params, REF_STATE.params) > 1e-4  # it trained
    print("OK train", maxdiff(grads, ref[1]), maxdiff(params, ref[3]))
""")

# The loss normaliser counts POLICY tokens over the whole batch, across data
# shards: shard A (rows 0-1) has 5 tokens with per-token loss 1, shard B (rows
# 2-3) one token with loss 3; token-mean = (5 * 1 + 1 * 3) / 6 = 8/6, not the
# mean of the two shard means (1 + 3) / 2 = 2. Runs after _FAST_TRAIN (same
# process, its REF_STATE).
_NORMALISER = textwrap.dedent("""
    from agentic_rl import sampling
    mesh, graphdef = mesh_of(2, 1, 1), GRAPHDEF
    state = train.start_rl(cfg, jax.device_put(
        REF_STATE, sharding.tree_shardings(REF_STATE, mesh)))
    cfg.rl.update(num_minibatches=1, num_microbatches=1, ppo_epochs=1,
                  kl_coef=0.0, loss_agg_mode="token-mean")
    tokens = jax.random.randint(jax.random.PRNGKey(0), (4, 8), 0, 265)
    mask = np.zeros((4, 8), bool)
    mask[0, 2:7] = True   # shard A: 5 tokens
    mask[2, 3] = True     # shard B: 1 token
    adv = np.where(mask, 0.0, 0.0).astype(np.float32)
    adv[0, 2:7] = -1.0    # PPO loss per token = -A * ratio = 1 at ratio 1
    adv[2, 3] = -3.0
    beh, _ = jax.jit(lambda p, t: sampling.token_logprobs(graphdef, p, t, 1.0))(
        state.params, tokens)
    batch = learner.LearnerBatch(
        tokens=tokens, mask=jnp.asarray(mask), behaviour_logp=beh,
        ref_logp=beh, advantage=jnp.asarray(adv))
    batch = sharding.put_batch(jax.device_get(batch), mesh)
    shard_rows = [s.index[0] for s in batch.mask.addressable_shards]
    assert shard_rows == [slice(0, 2), slice(2, 4)], shard_rows
    update = jax.jit(learner.make_update_fn(cfg, graphdef,
                                            learner.make_optimizer(cfg.rl)))
    with jax.set_mesh(mesh):
      _, _, m = update(state.params, state.opt_state, batch, jnp.float32(0.0))
    np.testing.assert_allclose(float(m["loss"]), 8 / 6, rtol=1e-5)
    print("OK normaliser", float(m["loss"]))
""")

# Greedy decoding with the KV cache on the (2, 2, 2) mesh (params over fsdp and
# tensor, rows over data x fsdp, cache heads over tensor) picks the same tokens
# as on one device.
_SAMPLING = _COMMON + textwrap.dedent("""
    graphdef, state = train.init_state(cfg, model_cfg, mesh_of(1, 1, 1))
    tasks = env.eval_tasks(16, 3)

    def greedy(params, tasks):
      return rollout.rollout_jit(
          env, tasks, jax.random.PRNGKey(0), max_len=cfg.max_len,
          graphdef=graphdef, params=params, model_config=model_cfg,
          temperature=jnp.float32(0.0))

    single = greedy(state.params, tasks)
    mesh = mesh_of(2, 2, 2)
    params = jax.device_put(jax.device_get(state.params),
                            sharding.tree_shardings(state.params, mesh))
    with jax.set_mesh(mesh):
      multi = greedy(params, sharding.put_batch(tasks, mesh))
    assert len(multi.tokens.sharding.device_set) == 8
    policy = int(np.sum(np.asarray(single.role) == 2))
    assert policy > 16, policy  # the policy did sample tokens
    np.testing.assert_array_equal(np.asarray(multi.tokens), np.asarray(single.tokens))
    np.testing.assert_array_equal(np.asarray(multi.role), np.asarray(single.role))
    np.testing.assert_allclose(np.asarray(multi.logprob), np.asarray(single.logprob),
                               atol=1e-5)
    print("OK", policy)
""")


# Greedy decoding through the rollout's own building blocks (init_state:
# prompt prefill; generate_turn: the decode loop) on the (2, 2, 2) mesh picks
# the same tokens as on one device, and the KV cache the loop carries is
# sharded as sharding.cache_spec says: rows over ('data', 'fsdp'), kv heads
# over 'tensor'.
# Without the constraint (e.g. sharding.constrain_cache replaced by the
# identity) the cache comes out as P(None, 'tensor'): rows replicated.
_CACHE = textwrap.dedent("""
    GRAPHDEF, REF_STATE = train.init_state(cfg, model_cfg, mesh_of(1, 1, 1))
    from jax.sharding import NamedSharding, PartitionSpec as P
    B, LEN = 8, 24
    prompt = jax.random.randint(jax.random.PRNGKey(11), (B, 6), 0, 265)
    prompt_len = jnp.array([6, 3, 5, 1, 6, 2, 4, 6], jnp.int32)

    def greedy_turn(params, prompt, prompt_len):
      st = rollout.init_state(prompt, prompt_len, None, max_len=LEN,
                              graphdef=GRAPHDEF, params=params,
                              model_config=model_cfg)
      st, action, action_len = rollout.generate_turn(
          GRAPHDEF, params, st, jax.random.PRNGKey(0), max_action_len=10,
          temperature=jnp.float32(0.0), stop_tokens=(-1,))
      return st.tokens, st.logprob, st.cache

    single = jax.jit(greedy_turn)(REF_STATE.params, prompt, prompt_len)
    mesh = mesh_of(2, 2, 2)
    params = jax.device_put(jax.device_get(REF_STATE.params),
                            sharding.tree_shardings(REF_STATE.params, mesh))
    with jax.set_mesh(mesh):
      # Prompts left unsharded: the rows of the cache are split by the constraint
      # in rollout.init_state / sampling.extend, not by propagation from the inputs.
      multi = jax.jit(greedy_turn)(params, prompt, prompt_len)
    np.testing.assert_array_equal(np.asarray(multi[0]), np.asarray(single[0]))
    np.testing.assert_allclose(np.asarray(multi[1]), np.asarray(single[1]), atol=1e-5)
    assert int(np.sum(np.asarray(single[1]) != 0)) > B * 5  # it decoded
    want = NamedSharding(mesh, P(("data", "fsdp"), "tensor", None, None))
    # Keys are stored [B, G, Dh, S], values [B, G, S, Dh].
    for layer in multi[2]:
      for name, x in layer.items():
        full, shard = {"k": ((B, 4, 8, LEN), (2, 2, 8, LEN)),
                       "v": ((B, 4, LEN, 8), (2, 2, LEN, 8))}[name]
        assert x.shape == full, x.shape
        assert x.sharding.is_equivalent_to(want, 4), x.sharding
        assert x.addressable_shards[0].data.shape == shard
    print("OK cache", multi[2][0]["k"].sharding.spec)
""")

# The RL update (learner.make_update_fn: PPO clipped surrogate + k3 KL, two
# minibatches of two micro-batches each, i.e. two AdamW steps per call) on a
# fixed pre-rolled batch gives on the (2, 2, 2) mesh the loss, gradient and
# parameters of one device. Tolerances (float32; the sharded program sums in a
# different order), as for the SFT step above: per-call loss, gradient norm and
# clip fraction rtol 1e-5; gradient of the loss at the initial parameters atol
# 1e-6; parameters after 3 calls (6 AdamW steps) atol 1e-5. Runs after _INIT
# (its GRAPHDEF, REF_STATE).
_RL_UPDATE = textwrap.dedent("""
    from agentic_rl import sampling
    cfg.rl.update(num_minibatches=2, num_microbatches=2, ppo_epochs=1,
                  kl_coef=0.05, loss_agg_mode="token-mean", clip_low=0.2,
                  clip_high=0.2)
    B, LEN = 16, 20
    ks = jax.random.split(jax.random.PRNGKey(21), 5)
    tokens = jax.random.randint(ks[0], (B, LEN), 0, 265)
    mask = jax.random.bernoulli(ks[1], 0.6, (B, LEN)).at[:, 0].set(False)
    logp0, _ = jax.jit(lambda p, t: sampling.token_logprobs(GRAPHDEF, p, t, 1.0))(
        REF_STATE.params, tokens)
    RL_BATCH = jax.device_get(learner.LearnerBatch(
        tokens=tokens, mask=mask,
        # Behaviour log-probs off the current policy, so ratios leave the clip range.
        behaviour_logp=logp0 + 0.3 * jax.random.normal(ks[2], (B, LEN)),
        ref_logp=logp0 + 0.1 * jax.random.normal(ks[3], (B, LEN)),
        advantage=jax.random.normal(ks[4], (B, LEN))))
    tx = learner.make_optimizer(cfg.rl)

    def rl_run(shape):
      mesh = mesh_of(*shape)
      params = jax.device_put(jax.device_get(REF_STATE.params),
                              sharding.tree_shardings(REF_STATE.params, mesh))
      opt_state = jax.jit(tx.init)(params)
      batch = sharding.put_batch(RL_BATCH, mesh)
      den = jnp.float32(np.sum(RL_BATCH.mask))
      grad = jax.jit(jax.grad(lambda p, b: learner._rl_loss(
          GRAPHDEF, p, b, cfg.rl, kl_coef=0.05, denominator=den)[0]))(params, batch)
      update = jax.jit(learner.make_update_fn(cfg, GRAPHDEF, tx))
      out = []
      with jax.set_mesh(mesh):
        for _ in range(3):
          params, opt_state, m = update(params, opt_state, batch, jnp.float32(0.05))
          out.append([float(m["loss"]), float(m["grad_norm"]),
                      float(m["clip_frac_low"] + m["clip_frac_high"])])
      return jax.device_get(grad), np.array(out), jax.device_get(params)

    ref = rl_run((1, 1, 1))
    assert ref[1][:, 2].min() > 0.05, ref[1]  # the clip is active
    got = rl_run((2, 2, 2))
    np.testing.assert_allclose(got[1], ref[1], rtol=1e-5, atol=1e-7)
    assert maxdiff(got[0], ref[0]) < 1e-6, maxdiff(got[0], ref[0])
    assert maxdiff(got[2], ref[2]) < 1e-5, maxdiff(got[2], ref[2])
    assert maxdiff(ref[2], REF_STATE.params) > 1e-4  # it trained (6 AdamW steps)
    print("OK rl", ref[1][:, 0], maxdiff(got[0], ref[0]), maxdiff(got[2], ref[2]))
""")


_run_8_devices = fakes.run_on_8_devices


@pytest.mark.slow  # 20-60 s of training: slow tier keeps the default tier short
def test_2x2x2_mesh_equals_one_device_and_normaliser_spans_shards():
  # One subprocess (one JAX start-up) for both fast-tier checks.
  out = _run_8_devices(_FAST_TRAIN + _NORMALISER)
  assert "OK train" in out and "OK normaliser" in out, out


@pytest.mark.slow
def test_train_on_all_meshes_equals_one_device():
  out = _run_8_devices(
      _TRAIN.replace("{MESHES}", "[(8, 1, 1), (2, 2, 2), (1, 4, 2)]")
  )
  assert out.count("OK") == 3


@pytest.mark.slow
def test_greedy_sampling_on_2x2x2_mesh_equals_one_device():
  out = _run_8_devices(_SAMPLING)
  assert out.strip().startswith("OK")


def test_rollout_kv_cache_is_sharded_and_greedy_tokens_match_on_2x2x2_mesh():
  out = _run_8_devices(_COMMON + _CACHE)
  assert "OK cache" in out, out


@pytest.mark.slow
def test_rl_update_on_2x2x2_mesh_equals_one_device():
  # ~2 min of CPU (two meshes x the jitted update and gradient): slow tier.
  out = _run_8_devices(_COMMON + _INIT + _RL_UPDATE)
  assert "OK rl" in out, out


def test_process_share_helpers_on_one_process():
  """On one process a host-side batch is all this process's: process_rows is
  every row, global_batch leaves the rows alone, local_rows slices, and
  any_process is the flag (tests/test_multiprocess.py runs them on 2)."""
  import numpy as np  # noqa: PLC0415

  mesh = sharding.make_mesh()
  assert sharding.process_rows(6, mesh) == (0, 6)
  assert sharding.process_rows(6) == (0, 6)  # no ambient mesh
  rows = {"x": np.arange(12).reshape(6, 2)}
  assert sharding.global_batch(rows, 6, mesh) is rows
  placed = sharding.put_batch(jnp.arange(6), mesh)
  np.testing.assert_array_equal(sharding.local_rows(placed, 2, 5), [2, 3, 4])
  assert sharding.any_process(True) and not sharding.any_process(False)
