"""The KV-cache rollout on a mesh that splits rows moves no rows between devices.

Every decode step writes each row's new keys and values into the cache, and
each turn writes its tokens into the row's buffer. Written with one index
array naming (row, position) pairs, XLA's SPMD partitioner cannot see the row
as a batch dimension and all-gathers every row's indices and new values onto
every device, at every decode step (4 all-gathers per layer-step here, 20 a
step in the 4-layer benchmark model, each a synchronisation of all devices).
Written as one scatter per row (vmapped), each device writes its own rows.

Checked on a (data 8) mesh of simulated CPU devices, against the same
rollout on one device: the compiled program holds no collective but the
decode loops' "are all rows done" reductions (a scalar all-reduce per loop),
and the tokens, roles, lengths, finishes and log-probs are the one-device
ones. Greedy decoding: at temperature 1 the inverse-CDF draw can flip a
token where float rounding (8 devices' fusions against one's) moves a
category boundary past the uniform (9 of 1024 tokens here).
"""

from tests import fakes

_SCRIPT = """
import collections, re
import jax, numpy as np
from agentic_rl import rollout, sharding, train
from configs import default
assert jax.device_count() == 8
cfg = default.get_config("smoke")
cfg.model.update(d_model=32, num_layers=2, num_heads=4, head_dim=8,
                 ffn_dim=64)
env = train.make_env(cfg)
tasks = env.sample_tasks(jax.random.PRNGKey(3), 16)
COLL = (r"= (\\S+) (all-gather|all-to-all|collective-permute|all-reduce|"
        r"reduce-scatter)(-start)?\\(")
out = {}
for n in (1, 8):
  mesh = sharding.make_mesh(dict(data=n, fsdp=1, tensor=1),
                            devices=jax.devices()[:n])
  model_cfg = train.make_model_config(cfg)
  graphdef, state = train.init_state(cfg, model_cfg, mesh)
  def run(params, tasks):
    return rollout.rollout(env, sharding.constrain_batch(tasks),
                           jax.random.PRNGKey(4), max_len=cfg.max_len,
                           graphdef=graphdef, params=params,
                           model_config=model_cfg, temperature=0.0)
  with jax.set_mesh(mesh):
    compiled = jax.jit(run).lower(state.params, tasks).compile()
    hlo = compiled.as_text()
    out[n] = jax.device_get(compiled(state.params, tasks))
  counts = collections.Counter(
      (m[1], m[0].split("{")[0]) for m in re.findall(COLL, hlo))
  print("collectives", n, sorted(counts.items()))
for f in ("tokens", "role", "length", "finish"):
  np.testing.assert_array_equal(getattr(out[8], f), getattr(out[1], f),
                                err_msg=f)
np.testing.assert_allclose(out[8].logprob, out[1].logprob, atol=2e-5, rtol=0)
assert int(np.max(out[1].length)) > 24  # several turns were written
print("OK")
"""


def test_rollout_on_a_data_mesh_moves_no_rows_and_equals_one_device():
  out = fakes.run_on_8_devices(_SCRIPT)
  assert out.strip().endswith("OK"), out
  lines = {
      l.split()[1]: l for l in out.splitlines() if l.startswith("collectives")
  }
  assert lines["1"] == "collectives 1 []", lines
  # On 8 devices: only the loop conditions' scalar reductions (the rollout's
  # turn loop and the decode loop), no all-gather of rows.
  assert lines["8"] == "collectives 8 [(('all-reduce', 'pred[]'), 2)]", lines
