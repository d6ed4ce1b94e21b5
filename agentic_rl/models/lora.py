"""Low-rank adapters (LoRA) on the projections of `transformer.Transformer`.

LoRA (Hu et al. 2021, arXiv:2106.09685) freezes a pretrained weight W and
learns a low-rank update: a projection y = x W becomes

  y = x W + (alpha / r) (x A) B,   A: [in, r], B: [r, out],

with A drawn at random and B = 0, so the adapted model starts equal to the
base. Only A and B (and the scalar value / reward heads, which a base
checkpoint does not have) are trained; the optimizer holds state for them
alone (`optimizer`), and gradients are taken with respect to them alone
(`value_and_grad`), so the base's weight gradients are never computed.

Why not qwix (Google's JAX quantisation / LoRA library): qwix adds adapters by
intercepting `jnp.einsum` / `lax.dot_general` calls and identifying the weight
operand among the calling module's parameters. Our attention and SwiGLU
concatenate the q/k/v and gate/up weights at run time (training path) and read
them one by one (decoding path), so the intercepted operand is a concatenation
that matches no parameter on one path and a single weight on the other; the
sampler and the trainer would then see different models. qwix also adapts only
one method of an nnx model (`__call__`), while the learner calls
`hidden_states`, `logits` and `value`. Here the adapters are explicit
parameters added to the projection outputs on both paths.

Adapters are `nnx.LoRAParam`s (a subclass of `nnx.Param`) named after the
weight they adapt, with the model's axis-suffix convention (`r` = rank), so
the partition rules of agentic_rl/sharding.py shard them like their weights:

  target  weight           A                  B
  q       attn.q_dhk       q_lora_a_dr        q_lora_b_rhk
  k       attn.k_dgk       k_lora_a_dr        k_lora_b_rgk
  v       attn.v_dgk       v_lora_a_dr        v_lora_b_rgk
  o       attn.o_hkd       o_lora_a_hkr       o_lora_b_rd
  gate    ffn.gate_df      gate_lora_a_dr     gate_lora_b_rf
  up      ffn.up_df        up_lora_a_dr       up_lora_b_rf
  down    ffn.down_fd      down_lora_a_fr     down_lora_b_rd

Adapters are stored in float32 whatever the base's param_dtype (they are
small, and bf16 storage would round away small Adam updates); they are cast to
the compute dtype at use.

The reference model of the KL penalty is the base plus the reference's
adapters: `TrainState.ref_params` holds only the trainable subtree
(`trainable`), and `reference_params` rebuilds the full parameter tree from
the policy's (shared, frozen) base leaves. Before any training the adapters
have B = 0, so the reference is exactly the base (`adapters_off`); no second
copy of the base weights exists.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

# target -> (sub-module of a Block, base weight name, einsum of the base
# projection "input,weight->output" in the layouts transformer.py uses).
TARGETS = {
    "q": ("attn", "q_dhk", "btd,dhk->bhtk"),
    "k": ("attn", "k_dgk", "btd,dgk->bgtk"),
    "v": ("attn", "v_dgk", "btd,dgk->bgtk"),
    "o": ("attn", "o_hkd", "bhtk,hkd->btd"),
    "gate": ("ffn", "gate_df", "btd,df->btf"),
    "up": ("ffn", "up_df", "btd,df->btf"),
    "down": ("ffn", "down_fd", "btf,fd->btd"),
}
ALL_TARGETS = tuple(TARGETS)
# Parameters a base checkpoint lacks (zero-initialised scalar heads): trained
# together with the adapters.
HEADS = ("value_head_d", "reward_head_d")
_RANK = "r"


@dataclasses.dataclass(frozen=True)
class LoRAConfig:
  """Which projections get adapters, and their size.

  Attributes:
    rank: r >= 1 (rank 0 means no adapters; `from_config` returns None then).
    alpha: > 0; the update is scaled by alpha / rank (arXiv:2106.09685, 4.1).
    targets: non-empty tuple of names from ALL_TARGETS.
    dropout: probability in [0, 1) of dropping an input feature of the
      adapter branch (x in (x A) B, inverted dropout); 0 = none. Applied only
      while a key is set (`set_dropout_key`): the SFT and RL loss forwards
      set one per micro-batch; sampling, reference and behaviour forwards
      run without.
  """

  rank: int = 8
  alpha: float = 16.0
  targets: tuple[str, ...] = ALL_TARGETS
  dropout: float = 0.0

  def __post_init__(self):
    def fail(field, why):
      raise ValueError(f"model.lora.{field}={getattr(self, field)!r}: {why}")

    if (
        isinstance(self.rank, bool)
        or not isinstance(self.rank, (int, np.integer))
        or self.rank < 1
    ):
      fail("rank", "must be an integer >= 1 (0 turns LoRA off)")
    if (
        isinstance(self.alpha, bool)
        or not isinstance(self.alpha, (int, float))
        or not self.alpha > 0
        or not np.isfinite(self.alpha)
    ):
      fail("alpha", "must be a finite number > 0")
    if (
        isinstance(self.targets, str)
        or not isinstance(self.targets, (tuple, list))
        or not self.targets
    ):
      fail("targets", f"must be a non-empty tuple of names from {ALL_TARGETS}")
    unknown = [t for t in self.targets if t not in TARGETS]
    if unknown:
      fail("targets", f"unknown {unknown}; known: {ALL_TARGETS}")
    if len(set(self.targets)) != len(self.targets):
      fail("targets", "names a projection twice")
    if (
        isinstance(self.dropout, bool)
        or not isinstance(self.dropout, (int, float))
        or not 0 <= self.dropout < 1
    ):
      fail("dropout", "must be a number in [0, 1)")
    object.__setattr__(self, "rank", int(self.rank))
    object.__setattr__(self, "alpha", float(self.alpha))
    object.__setattr__(self, "targets", tuple(self.targets))
    object.__setattr__(self, "dropout", float(self.dropout))

  @property
  def scale(self) -> float:
    """alpha / rank, the factor on (x A) B."""
    return self.alpha / self.rank


def from_config(block: Any) -> LoRAConfig | None:
  """LoRAConfig of a `model.lora` config block, or None when LoRA is off.

  Args:
    block: ConfigDict / dict with rank, alpha, targets, dropout, or None.

  Returns:
    None if the block is absent or rank == 0, else a validated LoRAConfig.

  Raises:
    ValueError: a bad field, naming it and its value (e.g. `model.lora.rank=-1`).
  """
  if block is None:
    return None
  get = (
      block.get
      if hasattr(block, "get")
      else lambda k, d=None: getattr(block, k, d)
  )
  rank = get("rank", 0)
  if (
      isinstance(rank, (int, np.integer))
      and not isinstance(rank, bool)
      and rank == 0
  ):
    return None
  targets = get("targets", ALL_TARGETS)
  if isinstance(targets, list):
    targets = tuple(targets)
  return LoRAConfig(
      rank=rank,
      alpha=get("alpha", 16.0),
      targets=targets,
      dropout=get("dropout", 0.0),
  )


def _split_spec(spec: str) -> tuple[str, str, str]:
  lhs, rest = spec.split(",")
  w, out = rest.split("->")
  return lhs, w, out


def adapter_names(target: str) -> tuple[str, str]:
  """(A name, B name) of a target, e.g. 'q' -> ('q_lora_a_dr', 'q_lora_b_rhk')."""
  lhs, w, _ = _split_spec(TARGETS[target][2])
  w_in = "".join(c for c in w if c in lhs)
  w_out = "".join(c for c in w if c not in lhs)
  return f"{target}_lora_a_{w_in}{_RANK}", f"{target}_lora_b_{_RANK}{w_out}"


def attach(model: nnx.Module, cfg: LoRAConfig, key: jax.Array) -> None:
  """Adds A and B adapters for `cfg.targets` to every block of `model`.

  A ~ N(0, 1 / fan_in) (fan_in = product of the weight's input dims; Hu et al.
  use a random Gaussian A), B = 0, both float32. Called by the Transformer
  after the base parameters are drawn, with its own key, so the base weights
  equal those of a model without adapters at the same seed.

  Args:
    model: a transformer.Transformer (has `.blocks`, each with `.attn`, `.ffn`).
    cfg: the adapters' config.
    key: PRNG key for the A matrices.
  """
  for i, block in enumerate(model.blocks):
    for j, target in enumerate(cfg.targets):
      sub, wname, spec = TARGETS[target]
      module = getattr(block, sub)
      w_shape = getattr(module, wname).shape
      lhs, w, _ = _split_spec(spec)
      in_shape = tuple(s for c, s in zip(w, w_shape) if c in lhs)
      out_shape = tuple(s for c, s in zip(w, w_shape) if c not in lhs)
      fan_in = int(np.prod(in_shape))
      a_name, b_name = adapter_names(target)
      k = jax.random.fold_in(jax.random.fold_in(key, i), j)
      a = (
          jax.random.normal(k, in_shape + (cfg.rank,), jnp.float32)
          * fan_in**-0.5
      )
      setattr(module, a_name, nnx.LoRAParam(a))
      setattr(
          module,
          b_name,
          nnx.LoRAParam(jnp.zeros((cfg.rank,) + out_shape, jnp.float32)),
      )
    block.attn.lora = cfg
    block.ffn.lora = cfg


def delta(
    target: str,
    x: jax.Array,
    a: jax.Array,
    b: jax.Array,
    scale: float,
    dropout_mask: jax.Array | None = None,
) -> jax.Array:
  """scale * (x A) B in the output layout of the target's base einsum.

  Args:
    target: a TARGETS name (fixes the einsum layouts).
    x: the projection's input, e.g. [B, T, D] for q, [B, H, T, Dh] for o, in
      the compute dtype.
    a: [in..., r] adapter A; b: [r, out...] adapter B (cast to x.dtype).
    scale: alpha / rank.
    dropout_mask: optional array broadcastable to x, already divided by the
      keep probability (inverted dropout), applied to the branch's input.

  Returns:
    The update, shaped like the base projection's output (e.g. [B, H, T, Dh]
    for q), dtype of x.
  """
  lhs, w, out = _split_spec(TARGETS[target][2])
  w_in = "".join(c for c in w if c in lhs)
  w_out = "".join(c for c in w if c not in lhs)
  keep = "".join(c for c in lhs if c not in w)
  if dropout_mask is not None:
    x = x * dropout_mask.astype(x.dtype)
  xa = jnp.einsum(f"{lhs},{w_in}{_RANK}->{keep}{_RANK}", x, a.astype(x.dtype))
  y = jnp.einsum(f"{keep}{_RANK},{_RANK}{w_out}->{out}", xa, b.astype(x.dtype))
  return y * jnp.asarray(scale, x.dtype)


def apply(
    module: nnx.Module, target: str, x: jax.Array, y: jax.Array
) -> jax.Array:
  """y + the target's adapter update if `module` has one, else y unchanged.

  Args:
    module: an Attention or SwiGLU module (adapters attached by `attach`).
    target: TARGETS name.
    x: the projection's input (layout of TARGETS[target]'s einsum).
    y: the base projection's output.

  Returns:
    y (+ scale (x A) B), same shape and dtype as y.
  """
  cfg = getattr(module, "lora", None)
  if cfg is None or target not in cfg.targets:
    return y
  a_name, b_name = adapter_names(target)
  mask = None
  rng = getattr(module, "lora_dropout_key", None)
  if cfg.dropout > 0 and rng is not None:
    keep = 1.0 - cfg.dropout
    k = jax.random.fold_in(rng, ALL_TARGETS.index(target))
    mask = jax.random.bernoulli(k, keep, x.shape).astype(x.dtype) / keep
  d = delta(
      target,
      x,
      getattr(module, a_name)[...],
      getattr(module, b_name)[...],
      cfg.scale,
      mask,
  )
  return y + d.astype(y.dtype)


def set_dropout_key(model: nnx.Module, key: jax.Array | None) -> None:
  """Turns adapter dropout on (a PRNG key) or off (None) for `model`'s next calls.

  Each block and target draws its own mask from fold_in(key, block index) and
  the target's index. Only a forward that should be stochastic (the training
  loss) sets a key; sampling, reference and behaviour forwards run without.
  """
  for i, block in enumerate(model.blocks):
    for sub in (block.attn, block.ffn):
      sub.lora_dropout_key = None if key is None else jax.random.fold_in(key, i)


def fold_adapters(model: nnx.Module) -> None:
  """Folds every adapter into its weight in place: W <- W + scale * A B.

  The einsum of A and B is done in float32 and the sum cast to the weight's
  dtype; the adapters are then removed and `lora` unset, so the model is a
  plain Transformer (use `merge` for a (config, graphdef, params) result).
  """
  for block in model.blocks:
    for sub in (block.attn, block.ffn):
      cfg = getattr(sub, "lora", None)
      if cfg is None:
        continue
      for target in cfg.targets:
        _, wname, spec = TARGETS[target]
        if not hasattr(sub, wname):  # a target of the other sub-module
          continue
        a_name, b_name = adapter_names(target)
        lhs, w, _ = _split_spec(spec)
        w_in = "".join(c for c in w if c in lhs)
        w_out = "".join(c for c in w if c not in lhs)
        ab = jnp.einsum(
            f"{w_in}{_RANK},{_RANK}{w_out}->{w}",
            getattr(sub, a_name)[...].astype(jnp.float32),
            getattr(sub, b_name)[...].astype(jnp.float32),
        )
        var = getattr(sub, wname)
        var.set_value(
            (var[...].astype(jnp.float32) + cfg.scale * ab).astype(var.dtype)
        )
        delattr(sub, a_name)
        delattr(sub, b_name)
      sub.lora = None


def merge(model_cfg, graphdef: nnx.GraphDef, params: nnx.State):
  """Base-architecture model with the adapters folded into the weights.

  Args:
    model_cfg: the TransformerConfig with `lora` set.
    graphdef, params: the adapted model (nnx.split).

  Returns:
    (config with lora=None, graphdef, params) of a plain Transformer whose
    projections are W + (alpha / r) A B (the export agentic_rl/models/hf.py
    `save_pretrained` writes; `transformers` then gives the adapted logits).
  """
  model = nnx.merge(graphdef, params)
  fold_adapters(model)
  base_cfg = dataclasses.replace(model_cfg, lora=None)
  model.cfg = base_cfg
  for block in model.blocks:
    block.attn.cfg = base_cfg
  graphdef, params = nnx.split(model)
  return base_cfg, graphdef, params


# ----------------------------------------------------------------- pytrees --


def _key_name(entry) -> str | None:
  if isinstance(entry, str):  # nnx filter paths are plain keys
    return entry
  if isinstance(entry, jax.tree_util.DictKey) and isinstance(entry.key, str):
    return entry.key
  if isinstance(entry, jax.tree_util.GetAttrKey) and entry.name != "value":
    return entry.name
  return None


def _leaf_name(path) -> str | None:
  for entry in reversed(path):
    name = _key_name(entry)
    if name is not None:
      return name
  return None


def is_adapter_name(name: str | None) -> bool:
  """True for an adapter parameter name such as 'q_lora_a_dr'."""
  return name is not None and ("_lora_a_" in name or "_lora_b_" in name)


def is_trainable_path(path) -> bool:
  """True for the leaves a LoRA run trains: adapters and the scalar heads."""
  name = _leaf_name(path)
  return is_adapter_name(name) or name in HEADS


def has_adapters(tree: Any) -> bool:
  """True when a parameter pytree holds LoRA adapters."""
  return any(
      is_adapter_name(_leaf_name(p))
      for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]
  )


def trainable(params: Any) -> Any:
  """The trainable subtree (adapters + scalar heads) of a LoRA model's params.

  Returns an nnx.State (for an nnx.State input) with only those leaves; the
  leaves are the same arrays (no copy).
  """
  return nnx.filter_state(params, lambda path, _: is_trainable_path(path))


def with_trainable(params: Any, sub: Any) -> Any:
  """`params` with its trainable leaves replaced by those of `sub` (by path).

  The frozen base leaves are the same arrays as in `params` (no copy).

  Raises:
    ValueError: `sub` lacks a trainable leaf of `params` (names the path).
  """
  by_path = {
      jax.tree_util.keystr(p): x
      for p, x in jax.tree_util.tree_flatten_with_path(sub)[0]
  }
  flat, treedef = jax.tree_util.tree_flatten_with_path(params)
  leaves = []
  for path, x in flat:
    if is_trainable_path(path):
      key = jax.tree_util.keystr(path)
      if key not in by_path:
        raise ValueError(f"adapter tree lacks {key}")
      x = by_path[key]
    leaves.append(x)
  return jax.tree_util.tree_unflatten(treedef, leaves)


def adapters_off(sub: Any) -> Any:
  """Copy of an adapter subtree with every B set to zero: the base model."""
  return jax.tree_util.tree_map_with_path(
      lambda p, x: jnp.zeros_like(x)
      if "_lora_b_" in (_leaf_name(p) or "")
      else x,
      sub,
  )


def reference_state(params: Any) -> Any:
  """`TrainState.ref_params` for a policy `params`.

  Without adapters: a copy of the whole tree (the reference is a frozen copy
  of the policy). With adapters: a copy of the trainable subtree only; the
  base is shared with the policy (`reference_params`).
  """
  if has_adapters(params):
    return jax.tree.map(jnp.copy, trainable(params))
  return jax.tree.map(jnp.copy, params)


def reference_params(params: Any, ref: Any) -> Any:
  """Full parameters of the reference model for a forward pass.

  Args:
    params: the policy's parameters.
    ref: `TrainState.ref_params` (see `reference_state`).

  Returns:
    `ref` itself without adapters; with adapters, `params`' frozen base leaves
    with `ref`'s adapters.
  """
  if has_adapters(params) and not has_frozen(ref):
    return with_trainable(params, ref)
  return ref


def has_frozen(tree: Any) -> bool:
  """True when the pytree holds any non-trainable (base) leaf."""
  return any(
      not is_trainable_path(p)
      for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]
  )


def value_and_grad(
    fn: Callable, argnums: int | Sequence[int] = 0, has_aux: bool = False
) -> Callable:
  """`jax.value_and_grad` that differentiates only the adapters of LoRA params.

  For each differentiated argument that holds adapters (`has_adapters`), the
  gradient is taken with respect to its trainable leaves only (adapters and
  scalar heads); its frozen leaves are closed over as constants, so their
  weight gradients are never computed, and come back as zeros of their
  shape (so the gradient tree still matches the parameter tree). Arguments
  without adapters are differentiated as by `jax.value_and_grad`, which this
  is exactly when no argument holds adapters.

  Returns:
    A function with `jax.value_and_grad(fn, argnums, has_aux)`'s signature and
    outputs.
  """
  nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)

  def wrapped(*args, **kwargs):
    split = {}
    for i in nums:
      if args[i] is not None and has_adapters(args[i]):
        flat, treedef = jax.tree_util.tree_flatten_with_path(args[i])
        mask = [is_trainable_path(p) for p, _ in flat]
        split[i] = (treedef, mask, [x for _, x in flat])
    if not split:
      return jax.value_and_grad(fn, argnums, has_aux)(*args, **kwargs)

    def rebuild(i, train_leaves):
      treedef, mask, leaves = split[i]
      it = iter(train_leaves)
      return jax.tree_util.tree_unflatten(
          treedef, [next(it) if m else x for m, x in zip(mask, leaves)]
      )

    def inner(*inner_args):
      full = list(args)
      for i in nums:
        full[i] = rebuild(i, inner_args[i]) if i in split else inner_args[i]
      return fn(*full, **kwargs)

    diff_args = list(args)
    for i, (_, mask, leaves) in split.items():
      diff_args[i] = [x for m, x in zip(mask, leaves) if m]
    value, grads = jax.value_and_grad(inner, argnums, has_aux)(*diff_args)
    grads_t = (grads,) if isinstance(argnums, int) else tuple(grads)
    out = []
    for i, g in zip(nums, grads_t):
      if i in split:
        treedef, mask, leaves = split[i]
        it = iter(g)
        g = jax.tree_util.tree_unflatten(
            treedef,
            [
                next(it) if m else jnp.zeros_like(x)
                for m, x in zip(mask, leaves)
            ],
        )
      out.append(g)
    return value, (out[0] if isinstance(argnums, int) else tuple(out))

  return wrapped


def optimizer(tx: optax.GradientTransformation) -> optax.GradientTransformation:
  """`tx` on the trainable leaves of LoRA params; `tx` itself otherwise.

  For a parameter tree with adapters (`has_adapters`, decided from the tree
  at `init` / `update`), optax.multi_transform labels each leaf by its path
  (`is_trainable_path`): gradient clipping, Adam moments and weight decay see
  only the adapters (and scalar heads); the frozen base gets zero updates
  (optax.set_to_zero) and holds no optimizer state. For a tree without
  adapters the state and updates are exactly `tx`'s, so wrapping every
  optimizer is safe (learner.make_optimizer does).
  """

  def labels(tree):
    return jax.tree_util.tree_map_with_path(
        lambda p, _: "train" if is_trainable_path(p) else "frozen", tree
    )

  multi = optax.multi_transform(
      {"train": tx, "frozen": optax.set_to_zero()}, labels
  )

  def init(params):
    return (multi if has_adapters(params) else tx).init(params)

  def update(updates, state, params=None):
    return (multi if has_adapters(updates) else tx).update(
        updates, state, params
    )

  return optax.GradientTransformation(init, update)


def base_fingerprint(params: Any) -> str:
  """sha256 (hex) of the frozen base leaves: their paths, dtypes, shapes, bytes.

  Written next to adapter checkpoints to name the base they belong to; a
  resumed run checks that its base has the same fingerprint.
  """
  h = hashlib.sha256()
  for path, x in jax.tree_util.tree_flatten_with_path(params)[0]:
    if is_trainable_path(path):
      continue
    arr = np.asarray(jax.device_get(x))
    h.update(jax.tree_util.keystr(path).encode())
    h.update(str(arr.dtype).encode() + str(arr.shape).encode())
    h.update(np.ascontiguousarray(arr).tobytes())
  return h.hexdigest()


def count(params: Any) -> tuple[int, int]:
  """(trainable, total) number of scalar parameters of a LoRA model's params."""
  flat = jax.tree_util.tree_flatten_with_path(params)[0]
  train = sum(int(np.prod(x.shape)) for p, x in flat if is_trainable_path(p))
  return train, sum(int(np.prod(x.shape)) for _, x in flat)


def transformer_fields(model_block: Any) -> dict[str, Any]:
  """TransformerConfig keyword arguments of a `config.model` block.

  Drops `hf_path` and turns the `lora` sub-block into a LoRAConfig (or None,
  `from_config`).

  Raises:
    ValueError: a bad `model.lora` field (named with its value).
  """
  fields = {
      k: v for k, v in dict(model_block).items() if k not in ("hf_path", "lora")
  }
  get = (
      model_block.get if hasattr(model_block, "get") else dict(model_block).get
  )
  fields["lora"] = from_config(get("lora", None))
  return fields


def init_adapters(
    model_cfg, base_graphdef: nnx.GraphDef, params: Any, key: jax.Array
):
  """Adds fresh adapters (`attach`) to a base model's params, e.g. an import.

  Args:
    model_cfg: TransformerConfig with `lora` set.
    base_graphdef, params: nnx.split of a Transformer with the same config but
      lora=None (e.g. what hf.load_pretrained returns).
    key: PRNG key of the A matrices.

  Returns:
    (graphdef, params) of the adapted model; the base leaves are `params`'.
  """
  model = nnx.merge(base_graphdef, params)
  model.cfg = model_cfg
  for block in model.blocks:
    block.attn.cfg = model_cfg
  attach(model, model_cfg.lora, key)
  return nnx.split(model)
