"""A process of a real multi-process JAX run, for tests/test_multiprocess.py.

Started by `python -m agentic_rl.launch --program=tests/multiprocess_probe.py`,
which appends the --config.mesh.* flags of each process. Joins the run
(`sharding.maybe_initialize_distributed`), then runs two collectives and
prints what they gave:

  probe process=I of N: devices=G local=L gathered=[...] sum=S
      from_primary=F bytes=[...]

gathered: every process's index (`process_allgather`); sum: a psum-style
reduction, the sum of a global [G] array with element j = j + 1 whose rows
live on the processes that own them (jit over the global mesh); F: process
0's 10 * 0 + 7 (`sharding.from_primary`); bytes: b'p<i>' repeated i + 1
times from each process i (`sharding.allgather_bytes`).
"""

import re
import sys

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.experimental import multihost_utils

from agentic_rl import sharding


def _mesh_flags(argv):
  cfg = ml_collections.ConfigDict(dict(sharding.MESH_DEFAULTS))
  for arg in argv:
    m = re.match(r"^--config\.mesh\.(\w+)=(.*)$", arg)
    if m:
      name, value = m.groups()
      cfg[name] = (
          value == "True" if name == "distributed" else type(cfg[name])(value)
      )
  return ml_collections.ConfigDict({"mesh": cfg})


def main():
  config = _mesh_flags(sys.argv[1:])
  sharding.maybe_initialize_distributed(config)
  gathered = np.asarray(
      multihost_utils.process_allgather(np.int32(jax.process_index()))
  ).reshape(-1)
  mesh = sharding.make_mesh()  # all devices of all processes on 'data'
  n = jax.device_count()
  x = jax.make_array_from_callback(
      (n,),
      jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data")),
      lambda idx: np.arange(1, n + 1, dtype=np.float32)[idx],
  )
  total = jax.jit(
      jnp.sum,
      out_shardings=sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()),
  )(x)
  pid = jax.process_index()
  # The project's helpers over the same runtime: process 0's value on all
  # processes, and ragged bytes from every process.
  first = int(sharding.from_primary(np.int32(10 * pid + 7)))
  blobs = sharding.allgather_bytes(b"p%d" % pid * (pid + 1))
  print(
      f"probe process={pid} of {jax.process_count()}: "
      f"devices={n} local={jax.local_device_count()} "
      f"gathered={gathered.tolist()} sum={float(total):g} "
      f"from_primary={first} bytes={blobs}",
      flush=True,
  )


if __name__ == "__main__":
  main()
