"""Device mesh from config and partition rules for parameters, optimizer state,
batches and KV caches (docs/design.md).

One `jax.sharding.Mesh` with axes ('data', 'fsdp', 'tensor'), built from the
config's `mesh` block (configs/common.py). The axes have `AxisType.Auto`: arrays
carry `NamedSharding`s and XLA's sharding propagation (GSPMD) partitions the
model code, which needs no sharding annotations of its own. Inside a jitted
function the mesh is ambient (`jax.set_mesh`), so `constrain_batch` can pin the
batch axis of intermediate values without knowing the mesh.

Partition rules come from parameter names. Every parameter name ends in
`_<axes>`, one letter per array dimension (models/transformer.py):

  letter  dimension         mesh axis
  d       d_model           'fsdp'   (ZeRO-3 style: each device holds a slice)
  h       query heads       'tensor' (Megatron: heads split across devices)
  g       key/value heads   'tensor'
  f       FFN hidden        'tensor'
  v       vocabulary        'tensor'
  k       head dim          None     (replicated)
  r       LoRA rank         None     (replicated)

e.g. q_dhk -> P('fsdp', 'tensor', None), down_fd -> P('tensor', 'fsdp'). A
dimension whose size is not divisible by its mesh axis size is replicated along
that dimension, and a mesh axis is used at most once per array (the first letter
that asks for it wins). Head counts are the exception: config validation
refuses a 'tensor' axis that does not divide them
(`check_heads_divide_tensor`), since replicating attention on every tensor
device would be silent waste. Leaves whose name does not match (RMSNorm `scale`,
optimizer step counts, PRNG keys, scalars) are replicated; `unmatched_leaves`
lists the non-scalar ones for debugging. Optax state mirrors the parameter tree
(Adam's mu/nu paths end in the parameter's name), so the same rule shards it.

Batches (Trajectory fields, learner batches, task pytrees) are split on their
leading (batch) axis over ('data', 'fsdp'); KV caches [B, G, ...] over
('data', 'fsdp') on B and 'tensor' on G. Any global reduction inside a jitted
step (e.g. the loss denominator: the number of trainable tokens) is computed
over the whole global batch, across all shards. Minibatches and micro-batches
are strided splits of the batch (`split_rows`), so each keeps every device's
share of the rows.
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import AxisType
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor")
# Mesh axes that split the batch (data parallelism and FSDP both shard examples).
BATCH_AXES = ("data", "fsdp")
# Dimension letter of a parameter-name suffix -> mesh axis (None: replicated).
AXIS_RULES = {
    "d": "fsdp",
    "h": "tensor",
    "g": "tensor",
    "f": "tensor",
    "v": "tensor",
    "k": None,
    "r": None,  # LoRA rank (models/lora.py)
}
_SUFFIX = re.compile(r"_([a-z]+)$")

# Default `mesh` config block (configs/common.mesh() is built from it).
MESH_DEFAULTS = dict(
    # Data-parallel replicas (-1: all devices not used by fsdp and tensor).
    data=-1,
    # Fully sharded data parallelism: parameters split on d_model.
    fsdp=1,
    # Tensor parallelism: heads, FFN hidden and vocabulary split; must divide
    # the query and key/value head counts (validation refuses it otherwise).
    tensor=1,
    # Multi-host: call jax.distributed.initialize before anything else.
    distributed=False,
    # host:port of process 0; '' = auto-detect (SLURM, TPU pods, ...).
    coordinator_address="",
    # Number of processes and this process's index; -1 = auto-detect.
    num_processes=-1,
    process_id=-1,
    # XLA CPU devices a main.py run splits this process into (CPU only):
    # 0 = automatic (2 on a machine with 2+ cores when the batch sizes and
    # micro-batches split evenly, else 1; `cpu_device_count`), N >= 1 =
    # exactly N.
    cpu_devices=0,
)


def _mesh_field(mesh_cfg, name: str):
  if mesh_cfg is None:
    return MESH_DEFAULTS[name]
  getter = getattr(mesh_cfg, "get", None)
  if getter is not None:
    return getter(name, MESH_DEFAULTS[name])
  return getattr(mesh_cfg, name, MESH_DEFAULTS[name])


def mesh_shape(mesh_cfg, num_devices: int) -> tuple[int, int, int]:
  """Resolves the (data, fsdp, tensor) sizes of a `mesh` config block.

  Args:
    mesh_cfg: ConfigDict (or dict / None for the defaults) with integer fields
      `data`, `fsdp`, `tensor`; each >= 1, or -1 for at most one of them, which
      is then set so that the product equals `num_devices`.
    num_devices: number of devices the mesh must cover exactly (all of them).

  Returns:
    (data, fsdp, tensor) with data * fsdp * tensor == num_devices.

  Raises:
    ValueError: naming the field and value: a non-integer or a size < 1 other
      than -1, two -1 fields, a -1 that cannot fill (num_devices not divisible
      by the other sizes), or a product different from `num_devices`.
  """
  sizes = {}
  fill = None
  for name in MESH_AXES:
    value = _mesh_field(mesh_cfg, name)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
      raise ValueError(
          f"config.mesh.{name}={value!r}: must be an integer "
          ">= 1, or -1 (fill with the remaining devices)"
      )
    value = int(value)
    if value == -1:
      if fill is not None:
        raise ValueError(
            f"config.mesh.{name}=-1: only one mesh axis may be -1 "
            f"(mesh.{fill} is -1 already)"
        )
      fill = name
    elif value < 1:
      raise ValueError(
          f"config.mesh.{name}={value!r}: must be >= 1, or -1 "
          "(fill with the remaining devices)"
      )
    sizes[name] = value
  if fill is not None:
    rest = math.prod(v for k, v in sizes.items() if k != fill)
    if num_devices % rest:
      raise ValueError(
          f"config.mesh.{fill}=-1: cannot fill {num_devices} devices, not "
          f"divisible by the product of the other mesh axes ({rest})"
      )
    sizes[fill] = num_devices // rest
  shape = tuple(sizes[n] for n in MESH_AXES)
  if math.prod(shape) != num_devices:
    desc = ", ".join(f"{n}={sizes[n]}" for n in MESH_AXES)
    raise ValueError(
        f"config.mesh=({desc}): data*fsdp*tensor = {math.prod(shape)} must equal "
        f"the number of devices ({num_devices}); set one axis to -1 to fill"
        " (on a CPU, main.py's --config.mesh.cpu_devices=N sets the number)"
    )
  return shape


def check_heads_divide_tensor(
    num_heads: int, num_kv_heads: int, tensor: int, where: str = "config.model"
) -> None:
  """Refuses a tensor-parallel mesh that cannot split the attention heads.

  Tensor parallelism gives each of the `tensor` devices H / tensor query heads
  and G / tensor key/value heads (and the matching KV-cache heads). The
  partition rules would otherwise replicate a non-divisible head axis, i.e.
  every tensor device would compute and store all of attention: silent
  waste rather than parallelism.

  Args:
    num_heads: query heads H.
    num_kv_heads: key/value heads G (0 = H, multi-head attention).
    tensor: size of the 'tensor' mesh axis.
    where: prefix of the field names in the message.

  Raises:
    ValueError: naming the field and value, when tensor > 1 does not divide H
      or G.
  """
  if tensor <= 1:
    return
  for field, value in (
      ("num_heads", num_heads),
      ("num_kv_heads", num_kv_heads or num_heads),
  ):
    if value % tensor:
      raise ValueError(
          f"{where}.{field}={value}: not divisible by mesh.tensor={tensor}; "
          "tensor parallelism splits attention heads across the 'tensor' "
          "devices (query and key/value heads alike), so mesh.tensor must "
          f"divide num_heads={num_heads} and the key/value heads "
          f"({num_kv_heads or num_heads}); use a smaller mesh.tensor (e.g. more "
          "mesh.fsdp)"
      )


def make_mesh(
    mesh_cfg=None, devices: Sequence[jax.Device] | None = None
) -> Mesh:
  """The ('data', 'fsdp', 'tensor') device mesh of a `mesh` config block.

  Args:
    mesh_cfg: the config's `mesh` block (see `mesh_shape`); None = defaults
      (all devices on 'data').
    devices: devices to use (default: all of `jax.devices()`, every host).

  Returns:
    A `Mesh` with `AxisType.Auto` axes (sharding propagated by XLA).

  Raises:
    ValueError: invalid mesh sizes (see `mesh_shape`).
  """
  devices = list(jax.devices() if devices is None else devices)
  shape = mesh_shape(mesh_cfg, len(devices))
  return jax.make_mesh(
      shape, MESH_AXES, axis_types=(AxisType.Auto,) * 3, devices=devices
  )


# Most devices the automatic setting picks (measured on 2 cores: see
# docs/running.md, "Several CPU devices in one process").
AUTO_CPU_DEVICES = 2
_XLA_DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"


def cpu_device_count(
    config, cores: int, environ: Mapping[str, str] | None = None
) -> tuple[int | None, str]:
  """The XLA CPU devices a main.py run of `config` splits its process into.

  XLA's CPU client runs each device's share of a sharded program on its own
  thread, so with the batch split over 'data' the rollout's decode, whose many
  small operations use one core per device, runs on several cores (the
  default job on 2 cores: 37.4-39.8 s with two devices, 42.0-48.3 s with
  one). Every parameter and optimizer state is held once per device.

  `config.mesh.cpu_devices` >= 1 is used as given. 0 (automatic) leaves the
  count as the environment sets it (XLA_FLAGS'
  --xla_force_host_platform_device_count, or JAX_NUM_CPU_DEVICES), else
  gives `min(AUTO_CPU_DEVICES, cores)` devices when all of these hold, and 1
  otherwise: the mesh block is the default (data -1, fsdp 1, tensor 1); each
  micro-batch of the RL batch (rl.batch_size over rl.num_minibatches *
  rl.num_microbatches) and of the SFT batch (sft.batch_size over
  sft.num_microbatches) splits evenly (for a phase of 0 steps only its
  batch size, which validation requires to divide), and with
  rl.shared_prefix_len so do the groups of each micro-batch (rows a device
  cannot hold whole are replicated on every device: no gain). Other batches
  (eval.num_tasks, rl.sil_batch_size, tree roots) are not checked; one that
  does not split is replicated.

  Args:
    config: the run's config (schema defaults applied).
    cores: CPU cores this process may use (`len(os.sched_getaffinity(0))`).
    environ: the process environment (os.environ); None = empty.

  Returns:
    (count, reason): count None means leave the device count as it is (a
    multi-process run, whose launcher sets it per process, or the
    environment setting it); the reason is one phrase for the run's log.

  Raises:
    ValueError: mesh.cpu_devices not an int >= 0, >= 1 in a multi-process
      run, or not dividing rl.batch_size and sft.batch_size (naming the
      field); an XLA_FLAGS or JAX_NUM_CPU_DEVICES count that is not an
      integer >= 1 (naming the variable).
  """
  environ = {} if environ is None else environ
  mesh_cfg = config.mesh
  wanted = _mesh_field(mesh_cfg, "cpu_devices")
  if (
      isinstance(wanted, bool)
      or not isinstance(wanted, (int, np.integer))
      or wanted < 0
  ):
    raise ValueError(
        f"config.mesh.cpu_devices={wanted!r}: must be an integer >= 0 "
        "(0 = automatic)"
    )
  if _mesh_field(mesh_cfg, "distributed"):
    if wanted:
      raise ValueError(
          f"config.mesh.cpu_devices={wanted}: not with mesh.distributed "
          "(each process's launcher sets its devices, e.g. python -m "
          "agentic_rl.launch --devices_per_process=N); leave it 0"
      )
    return None, "left as set: a multi-process run (its launcher sets it)"
  rl, sft = config.rl, config.sft
  if wanted:
    for field, rows in (
        ("rl.batch_size", rl.batch_size),
        ("sft.batch_size", sft.batch_size),
    ):
      if rows % wanted:
        raise ValueError(
            f"config.mesh.cpu_devices={wanted}: must divide {field}={rows} "
            "(each batch is split over the devices)"
        )
    return int(wanted), "set by mesh.cpu_devices"
  flags = environ.get("XLA_FLAGS", "")
  if _XLA_DEVICE_COUNT_FLAG in flags:
    value = flags.rpartition(_XLA_DEVICE_COUNT_FLAG)[2].lstrip("=").split()
    if not value or not value[0].isdigit() or int(value[0]) < 1:
      raise ValueError(
          f"XLA_FLAGS: {_XLA_DEVICE_COUNT_FLAG}="
          f"{value[0] if value else ''} must be an integer >= 1"
      )
    return None, f"left as set: XLA_FLAGS sets {_XLA_DEVICE_COUNT_FLAG}"
  if "JAX_NUM_CPU_DEVICES" in environ:
    value = environ["JAX_NUM_CPU_DEVICES"].strip()
    if not value.isdigit() or int(value) < 1:
      raise ValueError(
          f"JAX_NUM_CPU_DEVICES={environ['JAX_NUM_CPU_DEVICES']!r}: must be "
          "an integer >= 1 (or unset: main.py picks the count)"
      )
    return None, "left as set: JAX_NUM_CPU_DEVICES sets it"
  n = min(AUTO_CPU_DEVICES, cores)
  if n < 2:
    return 1, f"automatic: {cores} CPU core"
  sizes = tuple(_mesh_field(mesh_cfg, a) for a in MESH_AXES)
  if sizes != (-1, 1, 1):
    return (
        1,
        f"automatic: 1, the mesh block sets (data, fsdp, tensor) = {sizes}",
    )
  # The batch sizes whatever the steps (validation refuses them otherwise).
  splits = {
      "rl.batch_size": (rl.batch_size, 1),
      "sft.batch_size": (sft.batch_size, 1),
  }
  if rl.steps:
    splits["rl.batch_size / (rl.num_minibatches * rl.num_microbatches)"] = (
        rl.batch_size,
        rl.num_minibatches * rl.num_microbatches,
    )
    if rl.shared_prefix_len:
      splits["the groups of each micro-batch"] = (
          rl.batch_size // rl.group_size,
          rl.num_microbatches,
      )
  if sft.steps:
    splits["sft.batch_size / sft.num_microbatches"] = (
        sft.batch_size,
        sft.num_microbatches,
    )
  for name, (rows, parts) in splits.items():
    if parts <= 0 or rows % parts or (rows // parts) % n:
      return 1, f"automatic: 1, {name} does not split into {n} equal parts"
  return n, "automatic: one per core for the decode"


def maybe_initialize_distributed(config) -> bool:
  """Calls `jax.distributed.initialize` if `config.mesh.distributed` is set.

  Must run before anything else touches the JAX backend (train.py calls it
  first). `mesh.coordinator_address` ('' = auto-detect from the cluster
  environment, e.g. SLURM / TPU pods), `mesh.num_processes` and
  `mesh.process_id` (-1 = auto-detect) are passed through.

  Returns:
    True if `jax.distributed.initialize` was called.
  """
  mesh_cfg = config.mesh
  if not _mesh_field(mesh_cfg, "distributed"):
    return False
  address = _mesh_field(mesh_cfg, "coordinator_address") or None
  num = int(_mesh_field(mesh_cfg, "num_processes"))
  pid = int(_mesh_field(mesh_cfg, "process_id"))
  jax.distributed.initialize(
      coordinator_address=address,
      num_processes=None if num < 0 else num,
      process_id=None if pid < 0 else pid,
  )
  return True


def is_primary() -> bool:
  """Whether this is process 0 (or the only process): the one that writes the
  run's files and prints its reports (the multi-controller convention: every
  process runs the same program, one reports)."""
  return jax.process_index() == 0


def from_primary(value: Any) -> Any:
  """Process 0's value of a pytree of scalars or small arrays, on every
  process (`multihost_utils.broadcast_one_to_all`; a collective: every
  process must call it at the same point). On one process: `value` itself.

  Use it for decisions taken from files (does eval_sft.json exist? which
  checkpoint is intact?), so that all processes take the same branch, also
  while process 0 is writing or moving those files.
  """
  if jax.process_count() == 1:
    return value
  return jax.tree.map(np.asarray, multihost_utils.broadcast_one_to_all(value))


def allgather_bytes(data: bytes) -> list[bytes]:
  """Every process's `data`, in process order (a collective: all processes
  call it at the same point). On one process: [data].

  Lengths are gathered first, then the bytes padded to the longest.
  """
  if jax.process_count() == 1:
    return [data]
  lengths = np.asarray(
      multihost_utils.process_allgather(np.int32(len(data)))
  ).reshape(-1)
  buf = np.zeros((max(1, int(lengths.max())),), np.uint8)
  buf[: len(data)] = np.frombuffer(data, np.uint8)
  rows = np.asarray(multihost_utils.process_allgather(buf))
  return [bytes(rows[i, : lengths[i]]) for i in range(len(lengths))]


def to_host(tree: Any) -> Any:
  """Host (numpy) copy of a pytree, gathered across processes when needed.

  On several hosts (`jax.distributed.initialize`), a batch-sharded array is
  not fully addressable: `jax.device_get` fails on it, since each process
  holds only its own rows. Such leaves are gathered with
  `multihost_utils.process_allgather` (every process gets the whole global
  array); every other leaf (fully addressable arrays, numpy arrays, python
  scalars) goes through `jax.device_get`. On one process this is
  `jax.device_get`.

  Use it before computing metrics on the host (train.evaluate).
  """

  def get(x):
    if not getattr(x, "is_fully_addressable", True):
      return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return jax.device_get(x)

  return jax.tree.map(get, tree)


def process_rows(num_rows: int, mesh: Mesh | None = None) -> tuple[int, int]:
  """The rows [lo, hi) of a [num_rows] batch that this process's devices hold.

  The batch is laid out by `batch_spec` on `mesh` (default: the ambient mesh,
  `jax.set_mesh`). On one process, without a mesh, or when num_rows does not
  divide over the batch axes (the batch is then replicated): (0, num_rows).
  Of a multi-process run, this process's share of a host-side batch: the rows
  it prepares (tools, data) and hands to `global_batch`.

  Raises:
    ValueError: this process's rows are not one contiguous range (a mesh
      whose batch-axis devices interleave processes).
  """
  mesh = jax.sharding.get_mesh() if mesh is None else mesh
  if jax.process_count() == 1 or mesh.empty:
    return 0, num_rows
  s = NamedSharding(mesh, batch_spec((num_rows,), mesh))
  spans = sorted(
      {
          idx[0].indices(num_rows)[:2]
          for idx in s.addressable_devices_indices_map((num_rows,)).values()
      }
  )
  for (_, end), (begin, _) in zip(spans, spans[1:]):
    if end != begin:
      raise ValueError(
          f"process {jax.process_index()} holds rows {spans} of a batch of "
          f"{num_rows}: not one contiguous range"
      )
  return spans[0][0], spans[-1][1]


def global_batch(tree: Any, num_rows: int, mesh: Mesh | None = None) -> Any:
  """Global [num_rows, ...] arrays from this process's rows of each leaf.

  Every process passes its rows `process_rows(num_rows)` (numpy, [hi - lo,
  ...]); the result is laid out by `batch_spec` over `mesh` (default: the
  ambient mesh) and made with `jax.make_array_from_process_local_data`, so no
  row crosses a process boundary. On one process (or without a mesh) the
  leaves are returned unchanged.
  """
  mesh = jax.sharding.get_mesh() if mesh is None else mesh
  if jax.process_count() == 1 or mesh.empty:
    return tree

  def make(x):
    x = np.asarray(x)
    shape = (num_rows,) + x.shape[1:]
    return jax.make_array_from_process_local_data(
        NamedSharding(mesh, batch_spec(shape, mesh)), x, shape
    )

  return jax.tree.map(make, tree)


def local_rows(tree: Any, lo: int, hi: int) -> Any:
  """Rows [lo, hi) of every [B, ...] leaf, as numpy, read from this process's
  own shards (no collective; `process_rows` gives this process's range).

  Raises:
    ValueError: a leaf's addressable shards do not hold all of those rows.
  """

  def get(x):
    if getattr(x, "is_fully_addressable", True):
      return np.asarray(x)[lo:hi]
    out = np.empty((hi - lo,) + x.shape[1:], x.dtype)
    filled = np.zeros((hi - lo,), bool)
    for shard in x.addressable_shards:
      a, b, _ = shard.index[0].indices(x.shape[0])
      a2, b2 = max(a, lo), min(b, hi)
      if a2 < b2:
        out[a2 - lo : b2 - lo] = np.asarray(shard.data)[a2 - a : b2 - a]
        filled[a2 - lo : b2 - lo] = True
    if not filled.all():
      raise ValueError(
          f"process {jax.process_index()} does not hold rows [{lo}, {hi}) "
          f"of an array of shape {x.shape} sharded as {x.sharding}"
      )
    return out

  return jax.tree.map(get, tree)


def any_process(flag: bool) -> bool:
  """Whether `flag` is true on any process (a collective: every process calls
  it at the same point). On one process: `flag`."""
  if jax.process_count() == 1:
    return bool(flag)
  return bool(np.any(multihost_utils.process_allgather(np.bool_(flag))))


def _sizes(mesh) -> dict[str, int]:
  """Axis sizes of a Mesh, an AbstractMesh or a plain {axis: size} dict."""
  return mesh if isinstance(mesh, dict) else dict(mesh.shape)


def _axis_size(mesh, axis) -> int:
  names = axis if isinstance(axis, tuple) else (axis,)
  return math.prod(_sizes(mesh)[n] for n in names)


def leaf_name(path) -> str | None:
  """The nearest named key of a pytree path (skipping nnx's '.value').

  E.g. ('blocks', 0, 'attn', 'q_dhk', .value) -> 'q_dhk';
  (1, 0, .mu, 'embed_vd', .value) -> 'embed_vd'; (1, 0, .count) -> 'count'.
  """
  for entry in reversed(path):
    if isinstance(entry, jax.tree_util.DictKey) and isinstance(entry.key, str):
      return entry.key
    if isinstance(entry, jax.tree_util.GetAttrKey) and entry.name != "value":
      return entry.name
  return None


def param_spec(name: str | None, shape: Sequence[int], mesh) -> P | None:
  """PartitionSpec of one parameter from its name's axis suffix.

  Args:
    name: parameter name such as 'q_dhk' (see the module docstring).
    shape: the array's shape; the suffix must have one letter per dimension.
    mesh: a Mesh or AbstractMesh with the MESH_AXES names, or a dict of their
      sizes.

  Returns:
    The spec, or None if the name has no matching suffix (the caller
    replicates). Dimensions not divisible by their mesh axis are replicated.
  """
  if name is None or not shape:
    return None
  m = _SUFFIX.search(name)
  if m is None:
    return None
  letters = m.group(1)
  sizes = _sizes(mesh)
  if len(letters) != len(shape) or any(c not in AXIS_RULES for c in letters):
    return None
  used = set()
  spec = []
  for letter, size in zip(letters, shape):
    axis = AXIS_RULES[letter]
    if axis is None or axis in used or size % sizes[axis]:
      spec.append(None)
    else:
      used.add(axis)
      spec.append(axis)
  return P(*spec)


def tree_specs(tree: Any, mesh) -> Any:
  """PartitionSpecs for a pytree of parameters / optimizer state / TrainState.

  Leaves are arrays or `jax.ShapeDtypeStruct`s; matched by `param_spec` on
  their `leaf_name`, everything else replicated (P()).
  """

  def spec(path, x):
    s = param_spec(leaf_name(path), np.shape(x), mesh)
    return P() if s is None else s

  return jax.tree_util.tree_map_with_path(spec, tree)


def tree_shardings(tree: Any, mesh: Mesh) -> Any:
  """`NamedSharding`s of `tree_specs` (same structure as `tree`)."""
  return jax.tree.map(
      lambda s: NamedSharding(mesh, s),
      tree_specs(tree, mesh),
      is_leaf=lambda x: isinstance(x, P),
  )


def unmatched_leaves(tree: Any) -> list[str]:
  """Paths of non-scalar leaves that no partition rule matches (replicated).

  For debugging a new parameter whose name lacks an axis suffix. Uses a mesh
  with every axis of size 1, so divisibility never matters here.
  """
  ones = {n: 1 for n in MESH_AXES}
  out = []
  for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
    if np.ndim(x) and param_spec(leaf_name(path), np.shape(x), ones) is None:
      out.append(jax.tree_util.keystr(path))
  return out


def batch_spec(shape: Sequence[int], mesh) -> P:
  """P(('data', 'fsdp')) on the leading axis if divisible, else replicated.

  `mesh`: a Mesh, AbstractMesh or {axis: size} dict.
  """
  if len(shape) and shape[0] % _axis_size(mesh, BATCH_AXES) == 0:
    return P(BATCH_AXES)
  return P()


def batch_shardings(tree: Any, mesh: Mesh) -> Any:
  """NamedShardings splitting every leaf of a batch pytree on its first axis.

  Applies to Trajectory fields, learner batches and task pytrees ([B, ...]);
  leaves whose B is not divisible by data * fsdp (and scalars) are replicated.
  """
  return jax.tree.map(
      lambda x: NamedSharding(mesh, batch_spec(np.shape(x), mesh)), tree
  )


def put_batch(tree: Any, mesh: Mesh | None = None) -> Any:
  """`jax.device_put` of a batch pytree with `batch_shardings`.

  Args:
    tree: pytree of [B, ...] arrays.
    mesh: defaults to the ambient mesh (`jax.set_mesh`); with none, `tree` is
      returned unchanged.
  """
  mesh = jax.sharding.get_mesh() if mesh is None else mesh
  if mesh.empty:
    return tree
  return jax.device_put(tree, batch_shardings(tree, mesh))


def constrain_batch(tree: Any) -> Any:
  """Inside jit: pins every leaf's leading axis to ('data', 'fsdp').

  Uses the ambient (abstract) mesh; without one (plain single-device use) it
  returns `tree` unchanged, so library code can call it unconditionally.
  """
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return tree
  return jax.tree.map(
      lambda x: jax.lax.with_sharding_constraint(x, batch_spec(x.shape, mesh)),
      tree,
  )


def split_rows(tree: Any, n: int, unit: int = 1) -> Any:
  """Strided split of a batch into `n` parts: row i goes to part i % n.

  With `unit` > 1 the batch is cut into units of `unit` consecutive rows and
  unit u goes to part u % n, keeping each unit's rows together and in order
  (whole GRPO groups per part, for the shared-prefix forward): out[j, t *
  unit + k] = x[(t * n + j) * unit + k]. On a mesh this keeps every device
  on its own rows when N divides B / (n * unit), i.e. each device's block
  holds a whole number of units for every part; otherwise XLA moves rows.
  Unit 1 is the row split described below.

  Every leaf [B, ...] becomes [n, B / n, ...] with out[j, t] = x[t * n + j].
  On a mesh whose ('data', 'fsdp') devices each hold a contiguous block of
  B / N rows, part j takes B / (n N) rows from every device's block (when N
  divides B / n), so scanning or mapping over the parts keeps every device
  busy with its own rows and moves no data. A contiguous split
  (x.reshape(n, B / n, ...)) instead puts each part on N / n devices; slicing
  a part out of that sharded axis makes XLA replicate it, so every device
  computes whole parts (n times its share, and no memory saved by
  accumulating over parts). The parts are
  pinned to P(None, ('data', 'fsdp')) on the ambient mesh (no-op without one).

  Which rows form a part is the same on every mesh (it does not depend on N),
  so a one-device run and a mesh run see the same parts. With rows laid out
  group-major (K episodes per group, n dividing K), each part holds K / n
  episodes of every group.

  Args:
    tree: pytree of [B, ...] arrays.
    n: number of parts, dividing B.
    unit: rows kept together, with n * unit dividing B.

  Returns:
    Pytree of [n, B / n, ...] arrays (inverse: `merge_rows` with the same
    unit).

  Raises:
    ValueError: n < 1, unit < 1 or n * unit does not divide a leaf's leading
      axis.
  """

  def split(x):
    b = x.shape[0]
    if n < 1 or unit < 1 or b % (n * unit):
      what = "divide" if unit == 1 else f"with unit={unit}, n * unit divide"
      raise ValueError(
          f"split_rows: n={n} must be >= 1 and {what} the batch ({b} rows)"
      )
    rest = x.shape[1:]
    parts = x.reshape((b // (n * unit), n, unit) + rest).swapaxes(0, 1)
    return _constrain_parts(parts.reshape((n, b // n) + rest))

  return jax.tree.map(split, tree)


def split_blocks(
    tree: Any, num_minibatches: int, num_microbatches: int, unit: int = 1
) -> Any:
  """The update's micro-batches of every minibatch, as one stack of blocks.

  Block j * N + k (M = num_minibatches, N = num_microbatches) holds exactly
  the rows, in order, of micro-batch k of minibatch j as the update cuts them:
  `split_rows(x, M)` (row i in minibatch i % M), then `split_rows(minibatch,
  N, unit)` (units of `unit` consecutive rows of the minibatch, unit u in
  micro-batch u % N). Row i = ((t * N + k) * unit + c) * M + j goes to block
  j * N + k at position t * unit + c. With unit 1 the blocks are those of
  `split_rows(x, M * N)`, in another order. Parts are pinned as in
  `split_rows`.

  Args:
    tree: pytree of [B, ...] arrays.
    num_minibatches, num_microbatches: M and N, >= 1.
    unit: rows kept together inside a minibatch, with M * N * unit dividing
      B.

  Returns:
    Pytree of [M * N, B / (M N), ...] arrays (inverse: `merge_blocks`).

  Raises:
    ValueError: a count < 1 or M * N * unit not dividing a leaf's leading
      axis.
  """
  m, n = num_minibatches, num_microbatches

  def split(x):
    b = x.shape[0]
    if min(m, n, unit) < 1 or b % (m * n * unit):
      raise ValueError(
          f"split_blocks: minibatches {m}, micro-batches {n} and unit {unit} "
          f"must be >= 1 with their product dividing the batch ({b} rows)"
      )
    rest = x.shape[1:]
    y = x.reshape((b // (m * n * unit), n, unit, m) + rest)
    tail = tuple(range(4, y.ndim))
    y = y.transpose((3, 1, 0, 2) + tail)  # [m, n, t, unit, ...]
    return _constrain_parts(y.reshape((m * n, b // (m * n)) + rest))

  return jax.tree.map(split, tree)


def merge_blocks(
    tree: Any, num_minibatches: int, num_microbatches: int, unit: int = 1
) -> Any:
  """Inverse of `split_blocks`: [M * N, B / (M N), ...] back to [B, ...],
  pinned to `batch_spec` on the ambient mesh."""
  m, n = num_minibatches, num_microbatches

  def merge(x):
    rows = x.shape[0] * x.shape[1]
    rest = x.shape[2:]
    y = x.reshape((m, n, rows // (m * n * unit), unit) + rest)
    tail = tuple(range(4, y.ndim))
    y = y.transpose((2, 1, 3, 0) + tail)  # [t, n, unit, m, ...]
    return constrain_batch(y.reshape((rows,) + rest))

  return jax.tree.map(merge, tree)


def merge_rows(tree: Any, unit: int = 1) -> Any:
  """Inverse of `split_rows(..., unit)`: [n, B / n, ...] leaves back to
  [B, ...].

  With unit 1, x[t * n + j] = parts[j, t]; pinned to `batch_spec` on the
  ambient mesh.
  """

  def merge(x):
    n, m = x.shape[:2]
    rest = x.shape[2:]
    units = x.reshape((n, m // unit, unit) + rest).swapaxes(0, 1)
    return constrain_batch(units.reshape((n * m,) + rest))

  return jax.tree.map(merge, tree)


def _constrain_parts(x: jax.Array) -> jax.Array:
  """Pins [n, B / n, ...] parts to P(None, ('data', 'fsdp')) on the ambient
  mesh (replicated rows when B / n is not divisible by data * fsdp)."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return x
  return jax.lax.with_sharding_constraint(
      x, P(None, *batch_spec(x.shape[1:], mesh))
  )


def constrain_gathered(x: jax.Array, letters: str) -> jax.Array:
  """Inside jit: pins a weight built at run time (e.g. a fused projection) to
  its tensor-parallel layout, gathered over 'fsdp'.

  `letters` names x's dimensions as in the module docstring; 'd' (and any
  letter without a rule, such as the stacking axis of a fused weight) is left
  unsharded, so the weight is all-gathered over 'fsdp' before use (ZeRO-3),
  while 'h' / 'g' / 'f' / 'v' keep 'tensor' when divisible. Without this pin
  XLA may move the 'fsdp' split of d onto the stacking axis and exchange the
  activations with all-to-alls. No-op without an ambient mesh.
  """
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return x
  sizes = _sizes(mesh)
  spec, used = [], set()
  for letter, size in zip(letters, x.shape):
    axis = AXIS_RULES.get(letter)
    if axis in (None, "fsdp") or axis in used or size % sizes[axis]:
      spec.append(None)
    else:
      used.add(axis)
      spec.append(axis)
  return jax.lax.with_sharding_constraint(x, P(*spec))


def cache_spec(shape: Sequence[int], mesh) -> P:
  """KV-cache layout (values [B, G, S, Dh], keys [B, G, Dh, S]): B over
  ('data', 'fsdp'), G over 'tensor'.

  Each axis falls back to replicated when not divisible by its mesh axes.
  """
  b, g = shape[0], shape[1]
  batch = BATCH_AXES if b % _axis_size(mesh, BATCH_AXES) == 0 else None
  heads = "tensor" if g % _sizes(mesh)["tensor"] == 0 else None
  return P(batch, heads, *([None] * (len(shape) - 2)))


def cache_shardings(cache: Any, mesh: Mesh) -> Any:
  """NamedShardings of a KV cache (list of {'k', 'v'} arrays, `cache_spec`)."""
  return jax.tree.map(
      lambda x: NamedSharding(mesh, cache_spec(np.shape(x), mesh)), cache
  )


def constrain_cache(cache: Any) -> Any:
  """Inside jit: pins a KV cache to `cache_spec` on the ambient mesh (no-op
  without one)."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or cache is None:
    return cache
  return jax.tree.map(
      lambda x: jax.lax.with_sharding_constraint(x, cache_spec(x.shape, mesh)),
      cache,
  )


def mesh_of(tree: Any) -> Mesh | None:
  """The Mesh of the first `NamedSharding`-placed array in `tree`, else None."""
  for x in jax.tree.leaves(tree):
    s = getattr(x, "sharding", None)
    if isinstance(s, NamedSharding):
      return s.mesh
  return None


def init_sharded(init_fn: Callable[[], Any], mesh: Mesh) -> tuple[Any, Any]:
  """Creates a pytree directly in its sharded layout.

  `jax.eval_shape(init_fn)` gives shapes without computing anything; the
  shardings follow from `tree_shardings`; `jax.jit(init_fn, out_shardings=...)`
  then materialises each device's shard only (no unsharded copy ever exists).

  Args:
    init_fn: pure function of no arguments returning the pytree (e.g. a
      TrainState; its randomness must come from closed-over keys).
    mesh: the device mesh.

  Returns:
    (tree, shardings) with the same structure.
  """
  shardings = tree_shardings(jax.eval_shape(init_fn), mesh)
  return jax.jit(init_fn, out_shardings=shardings)(), shardings


def step_jit_kwargs(state_sharding: Any) -> dict[str, Any]:
  """jit keyword arguments for `step(state) -> (state, metrics)` functions.

  With a state sharding, the state keeps its layout across steps (inputs and
  outputs share `state_sharding`, so donation reuses the buffers and no step
  recompiles); metrics are left to XLA. With None, no arguments (single
  device, unchanged behaviour).
  """
  if state_sharding is None:
    return {}
  return dict(
      in_shardings=(state_sharding,), out_shardings=(state_sharding, None)
  )
