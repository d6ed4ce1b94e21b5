"""The shared-prefix forward (`rl.shared_prefix_len`, arXiv:2506.05433).

Every check compares against the unshared computation of the same inputs:
hidden states and gradients of the model, the rollout's prefill (cache and
next-token logits), and whole RL iterations of bench_peers' tiny workload.
"""

import json
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from agentic_rl import learner
from agentic_rl import loop
from agentic_rl import rollout
from agentic_rl import sampling
from agentic_rl import sharding
from agentic_rl import train
from agentic_rl import validation
from agentic_rl.learner import common as learner_common
from agentic_rl.models import lora as lora_lib
from agentic_rl.models import transformer
from configs import default as default_config
from configs import schema
from experiments.peers import common as peers_common
from experiments.peers import ours_worker

G, N, S, L = 3, 2, 5, 12  # group, groups, shared positions, tokens


def _model(remat=False, lora=None, value_head=False):
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
      remat=remat,
      lora=lora,
      value_head=value_head,
  )
  model = transformer.Transformer(cfg, nnx.Rngs(params=0))
  if lora is not None:
    # Non-zero adapters, so they take part in the comparison.
    adapters = [
        v for _, v in nnx.iter_graph(model) if isinstance(v, nnx.LoRAParam)
    ]
    assert adapters
    for i, var in enumerate(adapters):
      var[...] = 0.1 * jax.random.normal(jax.random.key(i), var[...].shape)
  return cfg, nnx.split(model)


def _tokens(seed=1):
  prefix = jax.random.randint(jax.random.key(seed), (N, S), 0, 50)
  suffix = jax.random.randint(jax.random.key(seed + 1), (N * G, L - S), 0, 50)
  return jnp.concatenate([jnp.repeat(prefix, G, axis=0), suffix], axis=1)


def _hidden(graphdef, params, tokens, prefix):
  hidden, cache = nnx.merge(graphdef, params).hidden_states(
      tokens, shared_prefix=prefix
  )
  assert cache is None
  return hidden


@pytest.mark.parametrize("remat", [False, True])
@pytest.mark.parametrize("with_lora", [False, True])
def test_hidden_states_and_gradients_equal_the_unshared_forward(
    remat, with_lora
):
  lora = lora_lib.LoRAConfig(rank=2) if with_lora else None
  _, (graphdef, params) = _model(remat, lora)
  tokens = _tokens()
  shared = transformer.SharedPrefix(S, G)
  a = _hidden(graphdef, params, tokens, None)
  b = _hidden(graphdef, params, tokens, shared)
  np.testing.assert_allclose(b, a, rtol=0, atol=1e-5)

  def loss(p, prefix):
    return jnp.sum(jnp.sin(_hidden(graphdef, p, tokens, prefix)))

  ga = jax.tree.leaves(jax.grad(loss)(params, None))
  gb = jax.tree.leaves(jax.grad(loss)(params, shared))
  scale = max(float(jnp.max(jnp.abs(x))) for x in ga)
  assert scale > 1.0  # a real gradient
  for x, y in zip(ga, gb):
    np.testing.assert_allclose(y, x, rtol=0, atol=1e-5 * scale)


def test_every_position_shared_and_nothing_shared():
  _, (graphdef, params) = _model()
  base = jax.random.randint(jax.random.key(3), (N, L), 0, 50)
  tokens = jnp.repeat(base, G, axis=0)  # whole rows equal within a group
  ref = _hidden(graphdef, params, tokens, None)
  for length in (L, L + 4, 0):
    out = _hidden(graphdef, params, tokens, transformer.SharedPrefix(length, G))
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-5)


def test_a_differing_row_gets_its_groups_prefix():
  # Documented behaviour (not checked by the model): the update's mismatch
  # metric is what catches it.
  _, (graphdef, params) = _model()
  tokens = _tokens()
  odd = tokens.at[1, 0].set((tokens[1, 0] + 1) % 50)
  shared = transformer.SharedPrefix(S, G)
  np.testing.assert_allclose(
      _hidden(graphdef, params, odd, shared),
      _hidden(graphdef, params, tokens, None),
      rtol=0,
      atol=1e-5,
  )
  assert float(learner_common.shared_prefix_mismatch(tokens, shared)) == 0.0
  assert float(learner_common.shared_prefix_mismatch(odd, shared)) == 1.0
  # A difference after the shared positions is not a mismatch.
  late = tokens.at[1, S].set((tokens[1, S] + 1) % 50)
  assert float(learner_common.shared_prefix_mismatch(late, shared)) == 0.0
  assert float(learner_common.shared_prefix_mismatch(odd, None)) == 0.0


def test_bad_uses_raise():
  _, (graphdef, params) = _model()
  model = nnx.merge(graphdef, params)
  tokens = _tokens()
  shared = transformer.SharedPrefix(S, G)
  with pytest.raises(ValueError, match="group 4 must divide the batch"):
    model.hidden_states(tokens, shared_prefix=transformer.SharedPrefix(S, 4))
  positions = jnp.broadcast_to(jnp.arange(L), tokens.shape)
  with pytest.raises(ValueError, match="default positions"):
    model.hidden_states(tokens, positions, shared_prefix=shared)
  with pytest.raises(ValueError, match="length must be >= 0"):
    transformer.SharedPrefix(-1, 2)
  cfg, (graphdef_c, params_c) = _model()
  chunked = transformer.Transformer(
      transformer.TransformerConfig(
          **{
              **{f: getattr(cfg, f) for f in ("vocab_size", "d_model")},
              "num_layers": 1,
              "num_heads": 4,
              "num_kv_heads": 2,
              "head_dim": 8,
              "ffn_dim": 64,
              "max_positions": 64,
              "attention_impl": "chunked",
              "attention_block": 4,
          }
      ),
      nnx.Rngs(params=0),
  )
  with pytest.raises(ValueError, match="dense only"):
    chunked.hidden_states(tokens, shared_prefix=shared)


def test_split_blocks_are_the_updates_micro_batches():
  x = jnp.arange(48).reshape(24, 2)
  for m, n, unit in ((1, 2, 4), (2, 2, 2), (2, 3, 2), (3, 2, 1)):
    blocks = sharding.split_blocks(x, m, n, unit)
    # The update: minibatches by rows, then micro-batches by units.
    minibatches = sharding.split_rows(x, m)
    want = np.concatenate(
        [sharding.split_rows(minibatches[j], n, unit) for j in range(m)]
    )
    np.testing.assert_array_equal(blocks, want)
    np.testing.assert_array_equal(sharding.merge_blocks(blocks, m, n, unit), x)
  # By hand: 8 rows, 2 minibatches (even / odd rows), units of 2 rows of a
  # minibatch, 1 micro-batch: block 0 = rows 0, 2, 4, 6.
  np.testing.assert_array_equal(
      sharding.split_blocks(jnp.arange(8), 2, 1, 2),
      [[0, 2, 4, 6], [1, 3, 5, 7]],
  )
  np.testing.assert_array_equal(
      sharding.split_blocks(jnp.arange(8), 1, 2, 2),
      [[0, 1, 4, 5], [2, 3, 6, 7]],
  )
  with pytest.raises(ValueError, match="product dividing the batch"):
    sharding.split_blocks(x, 2, 2, 4)


def test_split_rows_by_unit_keeps_groups_together():
  x = jnp.arange(8)
  parts = sharding.split_rows(x, 2, unit=2)
  np.testing.assert_array_equal(parts, [[0, 1, 4, 5], [2, 3, 6, 7]])
  np.testing.assert_array_equal(sharding.merge_rows(parts, unit=2), x)
  # unit 1 is the row split.
  np.testing.assert_array_equal(
      sharding.split_rows(x, 2, unit=1), sharding.split_rows(x, 2)
  )
  np.testing.assert_array_equal(
      sharding.split_rows(x, 2), [[0, 2, 4, 6], [1, 3, 5, 7]]
  )
  with pytest.raises(ValueError, match="with unit=2, n \\* unit divide"):
    sharding.split_rows(x, 3, unit=2)


def test_shared_prefill_equals_the_unshared_prefill():
  cfg, (graphdef, params) = _model()
  p = 8
  prompt = jax.random.randint(jax.random.key(5), (N * G, p), 0, 50)
  # Rows of a group share their first S tokens; their lengths differ (S to
  # p), and one group's prompts are exactly S long.
  prompt = prompt.at[:, :S].set(jnp.repeat(prompt[::G, :S], G, axis=0))
  prompt_len = jnp.array([S, 6, 8, S, S, S], jnp.int32)
  kw = dict(max_len=L, graphdef=graphdef, params=params, model_config=cfg)
  a = rollout.init_state(prompt, prompt_len, None, **kw)
  b = rollout.init_state(
      prompt,
      prompt_len,
      None,
      shared_prefix=transformer.SharedPrefix(S, G),
      **kw,
  )
  np.testing.assert_allclose(b.next_logits, a.next_logits, rtol=0, atol=1e-5)
  for la, lb in zip(a.cache, b.cache):
    # Entries at each row's written positions (the rest are never read); keys
    # are stored [B, G, Dh, S], values [B, G, S, Dh].
    pos = jnp.arange(L)
    written = {
        "k": pos[None, None, None, :] < prompt_len[:, None, None, None],
        "v": pos[None, None, :, None] < prompt_len[:, None, None, None],
    }
    for k in ("k", "v"):
      np.testing.assert_allclose(
          jnp.where(written[k], lb[k], 0),
          jnp.where(written[k], la[k], 0),
          atol=1e-5,
      )
  np.testing.assert_array_equal(b.tokens, a.tokens)


def _config(**rl):
  config = schema.with_defaults(default_config.get_config())
  config.rl.num_minibatches = 1
  for k, v in rl.items():
    config.rl[k] = v
  return config


def test_the_config_checks_name_the_field():
  validation.validate_config(_config(shared_prefix_len=4))
  validation.validate_config(_config(shared_prefix_len=4, num_minibatches=2))
  for rl, match in (
      (dict(shared_prefix_len=-1), "must be an int >= 0"),
      (dict(shared_prefix_len=True), "must be an int"),
      (dict(shared_prefix_len=10_000), "must be below max_len"),
      (dict(shared_prefix_len=30), "exceeds the environment's longest prompt"),
      (
          dict(shared_prefix_len=4, batch_size=128, num_minibatches=16),
          "num_minibatches=16 to divide rl.group_size=8",
      ),
      (dict(shared_prefix_len=4, num_microbatches=16), "whole row groups"),
  ):
    with pytest.raises(validation.ConfigError, match="rl.shared_prefix_len"):
      validation.validate_config(_config(**rl))
    with pytest.raises(validation.ConfigError, match=match):
      validation.validate_config(_config(**rl))
  dropout = _config(shared_prefix_len=4)
  dropout.model.lora.rank = 4
  dropout.model.lora.dropout = 0.1
  with pytest.raises(validation.ConfigError, match="lora.dropout=0.1"):
    validation.validate_config(dropout)
  chunked = _config(shared_prefix_len=4)
  chunked.model.attention_impl = "chunked"
  with pytest.raises(validation.ConfigError, match="dense only"):
    validation.validate_config(chunked)


def test_the_loop_stops_on_a_mismatch_before_logging():
  logged = []
  phases = (
      loop.Phase(
          "rl",
          2,
          lambda s: (s, {"loss": 1.0, "shared_prefix_mismatch_max": 1.0}),
      ),
  )
  with pytest.raises(ValueError, match="rl.shared_prefix_len: at rl step 1"):
    loop.run({}, phases, start=0, log=lambda *a: logged.append(a))
  assert logged == []
  ok = (
      loop.Phase(
          "rl",
          1,
          lambda s: (s, {"loss": 1.0, "shared_prefix_mismatch_max": 0.0}),
      ),
  )
  loop.run({}, ok, start=0, log=lambda *a: logged.append(a))
  assert len(logged) == 1


def _tiny_steps(iters=3, **rl):
  """Metrics of `iters` RL iterations of bench_peers' tiny workload (2
  prompts x 4, prompts of 8 tokens; by default one minibatch of two
  micro-batches of whole groups), with `rl` fields set; returns (initial
  params, final params, metrics)."""
  spec = dict(peers_common.spec(True), micro_batches=2)
  folder = tempfile.mkdtemp()
  ours_worker.write_model_folder(
      folder, spec["model"], spec["prompt_len"] + spec["new_tokens"]
  )
  env = ours_worker.BenchEnv(
      prompts=tuple(tuple(p) for p in spec["prompts"]),
      max_action_len=spec["new_tokens"],
  )
  config = ours_worker.ours_config(spec, folder)
  for k, v in rl.items():
    config.rl[k] = v
  model_cfg = train.make_model_config(config)
  graphdef, state = train.init_state(config, model_cfg)
  state = train.start_rl(config, state)
  start = [np.asarray(x) for x in jax.tree.leaves(state.params)]
  step = learner.make_rl_step(
      config, env, graphdef, learner.make_optimizer(config.rl), model_cfg
  )
  metrics = []
  for _ in range(iters):
    state, m = step(state)
    metrics.append(jax.device_get(m))
  end = [np.asarray(x) for x in jax.tree.leaves(state.params)]
  return start, end, metrics


@pytest.mark.parametrize("minibatches", [1, 2])
def test_rl_iterations_match_the_unshared_ones(minibatches):
  # The shared run's parameters stay within float summation order of the
  # unshared run's, iteration after iteration; so do loss, KL and reward.
  # Two minibatches: each takes every other row, 2 of each group of 4, which
  # share the prompt (micro-batches of one such pair each).
  prompt_len = peers_common.spec(True)["prompt_len"]
  mb = dict(num_minibatches=minibatches)
  start, pa, ma = _tiny_steps(shared_prefix_len=0, **mb)
  _, pb, mb = _tiny_steps(shared_prefix_len=prompt_len, **mb)
  assert "shared_prefix_mismatch_max" not in ma[-1]
  assert all(float(m["shared_prefix_mismatch_max"]) == 0.0 for m in mb)
  for a, b in zip(ma, mb):
    for k in ("loss", "kl", "reward"):
      np.testing.assert_allclose(float(b[k]), float(a[k]), rtol=1e-4, atol=1e-6)
  moved = max(float(np.max(np.abs(x - y))) for x, y in zip(start, pa))
  assert moved > 1e-3  # three real updates
  for x, y in zip(pa, pb):
    np.testing.assert_allclose(y, x, rtol=0, atol=1e-4)


@pytest.mark.parametrize("minibatches", [1, 2])
def test_trainer_behaviour_blocks_line_up_with_the_micro_batches(minibatches):
  # rl.behaviour_logprobs='trainer' recomputes the behaviour log-probs on
  # the update's blocks (whole prompt groups here): the loss forward of the
  # first optimizer step reproduces them, row for row (a misaligned block
  # would compare different episodes' log-probs).
  prompt_len = peers_common.spec(True)["prompt_len"]
  _, _, metrics = _tiny_steps(
      iters=2,
      shared_prefix_len=prompt_len,
      behaviour_logprobs="trainer",
      num_minibatches=minibatches,
  )
  for m in metrics:
    assert float(m["behaviour_gap_max_first"]) < 1e-5
    assert float(m["shared_prefix_mismatch_max"]) == 0.0


def test_a_prefix_longer_than_the_prompt_is_caught_by_the_update():
  # Positions past the 8-token prompt hold sampled tokens, which differ
  # between a group's episodes.
  prompt_len = peers_common.spec(True)["prompt_len"]
  _, _, metrics = _tiny_steps(iters=1, shared_prefix_len=prompt_len + 2)
  assert float(metrics[0]["shared_prefix_mismatch_max"]) == 1.0


# The update with a shared prefix (8 groups of 4) on 8 data devices equals
# one device and the unshared update (tolerances as tests/test_mesh_waste.py's
# _EQUAL), with 1 and with 2 micro-batches of whole groups, and with 2
# minibatches (each 2 of every group's 4 rows). With one
# micro-batch the prefix stream's activations are split over the devices,
# [1, S, D] per device (one group each), never the whole [8, S, D] nor the
# prefix repeated over its group (a device's 4 rows, [4, S, D]: the log-probs
# project the prefix once per group, sampling.shared_prefix_logprob_and_
# entropy); with two, a micro-batch's 4 prefix rows do not
# divide over 8 devices and are replicated ([4, S, D] prefix rows: the
# documented cost of fewer groups per micro-batch than devices).
_MESH = """
import re
import jax, jax.numpy as jnp, numpy as np
from agentic_rl import learner, sampling, sharding, train
from configs import default
assert jax.device_count() == 8
cfg = default.get_config("smoke")
cfg.model.update(d_model=40, num_layers=1, num_heads=4, head_dim=8, ffn_dim=64)
cfg.rl.update(ppo_epochs=1, warmup_steps=0,
              group_size=4, kl_coef=0.05, loss_agg_mode="token-mean")
GRAPHDEF, STATE = train.init_state(cfg, train.make_model_config(cfg))
B, L, S = 32, 12, 5
ks = jax.random.split(jax.random.PRNGKey(4), 4)
tokens = jax.random.randint(ks[0], (B, L), 0, 265)
tokens = tokens.at[:, :S].set(jnp.repeat(tokens[::4, :S], 4, axis=0))
mask = jax.random.bernoulli(ks[1], 0.6, (B, L)).at[:, :S].set(False)
logp0, _ = jax.jit(lambda p, t: sampling.token_logprobs(GRAPHDEF, p, t, 1.0))(
    STATE.params, tokens)
host = jax.device_get(learner.LearnerBatch(
    tokens=tokens, mask=mask, behaviour_logp=logp0, ref_logp=logp0 - 0.1,
    advantage=jax.random.normal(ks[2], (B, L))))
mesh = sharding.make_mesh(dict(data=8, fsdp=1, tensor=1))

def run(shared, on_mesh, minibatches, micro):
  cfg.rl.shared_prefix_len = S if shared else 0
  cfg.rl.num_minibatches = minibatches
  cfg.rl.num_microbatches = micro
  tx = learner.make_optimizer(cfg.rl)
  update = jax.jit(learner.make_update_fn(cfg, GRAPHDEF, tx))
  p, b = jax.device_get(STATE.params), host
  if not on_mesh:
    p, opt, m = update(p, jax.jit(tx.init)(p), b, jnp.float32(0.05))
    return jax.device_get(p), {k: float(v) for k, v in m.items()}, None
  p = jax.device_put(p, sharding.tree_shardings(STATE.params, mesh))
  b = sharding.put_batch(b, mesh)
  with jax.set_mesh(mesh):
    opt = jax.jit(tx.init)(p)
    hlo = update.lower(p, opt, b, jnp.float32(0.05)).compile().as_text()
    p, opt, m = update(p, opt, b, jnp.float32(0.05))
  return jax.device_get(p), {k: float(v) for k, v in m.items()}, hlo

prefix_rows = {}
for minibatches, micro in ((1, 1), (1, 2), (2, 1)):
  p0, m0, _ = run(False, False, minibatches, micro)
  moved = max(float(np.max(np.abs(a - b))) for a, b in
              zip(jax.tree.leaves(p0), jax.tree.leaves(jax.device_get(STATE.params))))
  assert moved > 1e-4, moved
  for on_mesh in (False, True):
    p, m, hlo = run(True, on_mesh, minibatches, micro)
    for k in ("loss", "pg_loss", "kl", "grad_norm"):
      np.testing.assert_allclose(m[k], m0[k], rtol=1e-5, atol=1e-7, err_msg=k)
    diff = max(float(np.max(np.abs(a - b))) for a, b in
               zip(jax.tree.leaves(p0), jax.tree.leaves(p)))
    assert diff < 1e-5, diff
    assert m["shared_prefix_mismatch_max"] == 0.0
    if on_mesh and minibatches == 1:
      prefix_rows[micro] = {
          int(r) for r in re.findall(r"\\[(\\d+),%d,40\\]" % S, hlo)}
assert prefix_rows[1] == {1}, prefix_rows
assert 4 in prefix_rows[2], prefix_rows
print("OK shared mesh", prefix_rows)
"""


@pytest.mark.slow
def test_the_shared_update_on_8_devices_equals_one_device():
  from tests import fakes  # pylint: disable=g-import-not-at-top

  out = fakes.run_on_8_devices(_MESH)
  assert "OK shared mesh" in out, out


def test_main_stops_with_one_line_and_resumes_with_a_shorter_prefix(tmp_path):
  # The smoke arithmetic prompts are 14 to 24 tokens: 20 positions are not
  # shared by every group, and the first RL step's update finds it. One line
  # naming the field, exit 2, nothing of that step saved; the same command
  # with 14 resumes from the last checkpoint and finishes.
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top
  import re  # pylint: disable=g-import-not-at-top

  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  workdir = str(tmp_path / "run")

  def main(length):
    return subprocess.run(
        [
            sys.executable,
            "main.py",
            "--config=configs/default.py:smoke",
            f"--workdir={workdir}",
            f"--config.rl.shared_prefix_len={length}",
            "--compilation_cache=",
        ],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "JAX_PLATFORMS": "cpu", "AGENTIC_RL_JEMALLOC": "0"},
    )

  bad = main(20)
  assert bad.returncode == 2, bad.stderr[-3000:]
  # The run's log and progress bars come first; the error is one line, the
  # last, and there is no traceback.
  lines = [ln for ln in bad.stderr.splitlines() if ln.strip()]
  assert "Traceback" not in bad.stderr, bad.stderr[-3000:]
  assert [ln for ln in lines if ln.startswith("error: ")] == lines[-1:]
  assert lines[-1].startswith(
      "error: config.rl.shared_prefix_len: at rl step "
  ), bad.stderr[-3000:]
  step = int(re.search(r"at rl step (\d+)", lines[-1]).group(1))
  saved = [int(d) for d in os.listdir(os.path.join(workdir, "checkpoints"))]
  assert saved and max(saved) < step, (saved, step)
  logged = [
      json.loads(ln)["step"]
      for ln in open(os.path.join(workdir, "metrics.jsonl"))
      if ln.strip()
  ]
  assert max(logged) < step
  good = main(14)
  assert good.returncode == 0, good.stderr[-3000:]
  assert "resum" in good.stderr.lower() or "restor" in good.stderr.lower()


@pytest.mark.parametrize("chunk", [0, 4, 5])
def test_log_probs_project_the_prefix_once_per_group(chunk):
  """token_logprobs with a shared prefix: the prefix positions are projected
  to the vocabulary once per group (each row gathering its own target); the
  log-probs, entropies and their gradients equal the unshared ones."""
  _, (graphdef, params) = _model()
  tokens = _tokens()
  shared = transformer.SharedPrefix(S, G)
  weights = jax.random.normal(jax.random.key(9), (N * G, L))

  def run(p, prefix):
    return sampling.token_logprobs(
        graphdef, p, tokens, 0.7, chunk_size=chunk, shared_prefix=prefix
    )

  (la, ea), (lb, eb) = run(params, None), run(params, shared)
  np.testing.assert_allclose(lb, la, rtol=0, atol=1e-5)
  np.testing.assert_allclose(eb, ea, rtol=0, atol=1e-5)
  assert float(jnp.min(la[:, 1:])) < -1.0  # real log-probs, not zeros

  def loss(p, prefix):
    logp, entropy = run(p, prefix)
    return jnp.sum(weights * logp) + 0.1 * jnp.sum(entropy)

  ga = jax.tree.leaves(jax.grad(loss)(params, None))
  gb = jax.tree.leaves(jax.grad(loss)(params, shared))
  scale = max(float(jnp.max(jnp.abs(x))) for x in ga)
  assert scale > 1.0
  for x, y in zip(ga, gb):
    np.testing.assert_allclose(y, x, rtol=0, atol=1e-5 * scale)


def test_a_zero_length_prefix_is_the_plain_forward():
  """SharedPrefix(0, G) shares nothing: token_logprobs on a batch the group
  does not divide, with remat, equals the unshared call."""
  _, (graphdef, params) = _model(remat=True)
  tokens = _tokens()[:4]  # 4 rows, G = 3
  a = sampling.token_logprobs(graphdef, params, tokens)
  b = sampling.token_logprobs(
      graphdef, params, tokens, shared_prefix=transformer.SharedPrefix(0, G)
  )
  for x, y in zip(a, b):
    np.testing.assert_array_equal(y, x)


def test_the_prefix_vocabulary_projection_is_not_repeated():
  """Compiled cost: against projecting the repeated prefix rows (the
  hidden states of `hidden_states(shared_prefix=...)` then the output
  layer), the shared forward saves at least the output layer's FLOPs of the
  prefix positions of all but one row per group, 2 D V S (B - B / G)."""
  cfg, (graphdef, params) = _model()
  tokens = _tokens()
  shared = transformer.SharedPrefix(S, G)

  def grouped(p):
    return sampling.token_logprobs(graphdef, p, tokens, shared_prefix=shared)

  def repeated(p):  # the prefix streams' hidden states, repeated, projected
    model = nnx.merge(graphdef, p)
    hidden, _ = model.hidden_states(tokens[:, :-1], shared_prefix=shared)
    return sampling.chunked_logprob_and_entropy(
        hidden, model.output_weights_dv(), tokens[:, 1:], 1.0, 0
    )

  flops = lambda f: jax.jit(f).lower(params).compile().cost_analysis()["flops"]
  saved = flops(repeated) - flops(grouped)
  head = 2 * cfg.d_model * cfg.vocab_size * S * (N * G - N)
  print("saved", saved, "output-layer FLOPs of the repeated prefix", head)
  assert saved >= head, (saved, head)
  np.testing.assert_allclose(
      grouped(params)[0][:, 1:], repeated(params)[0], rtol=0, atol=1e-5
  )


def test_policy_forward_values_with_a_shared_prefix():
  """learner.common.policy_forward with values and placebo targets: the
  shared-prefix path (log-probs once per group in the prefix) equals the
  unshared one."""
  _, (graphdef, params) = _model(value_head=True)
  params = jax.tree.map(lambda x: x + 0.05, params)  # a non-zero value head
  tokens = _tokens()
  targets = jnp.roll(tokens, 1, axis=0)  # other rows' tokens as targets
  shared = transformer.SharedPrefix(S, G)
  a, b = (
      learner_common.policy_forward(
          graphdef,
          params,
          tokens,
          0.9,
          with_values=True,
          targets_bl=targets,
          prefix=prefix,
      )
      for prefix in (None, shared)
  )
  assert float(jnp.max(jnp.abs(a[2]))) > 0.01  # real values
  for x, y in zip(a, b):
    np.testing.assert_allclose(y, x, rtol=0, atol=1e-5)
