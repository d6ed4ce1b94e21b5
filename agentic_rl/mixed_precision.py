"""Float32 master weights for low-precision (bfloat16) parameters.

With `model.param_dtype='bfloat16'` the policy's parameters are stored in
bfloat16 (8 significant bits): an Adam step of size lr ~ 1e-6 is far below
half a unit in the last place of a weight of magnitude ~0.05 (2^-13 ~ 1.2e-4),
so `optax.apply_updates` on the bfloat16 parameters rounds most updates away.
`with_float32_master` keeps a float32 copy of the parameters (the master
weights) and the wrapped optimizer's state (Adam moments) in float32 inside the
optimizer state; every step updates the master in float32 and sets the
parameters to the master rounded to their dtype (the scheme of Micikevicius et
al., "Mixed Precision Training", arXiv:1710.03740, section 3.1).

The parameters stay what the forward passes use (bfloat16: half the memory for
the sampler, the reference model and the activations); the float32 master
lives in the optimizer state, so it is checkpointed and sharded (its leaves
keep the parameter names, agentic_rl/sharding.py) with the rest of the train
state. For float32 parameters the wrapper is the wrapped optimizer itself: same
state structure, so float32 checkpoints are unchanged.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax


class MasterWeightsState(NamedTuple):
  """Optimizer state of `with_float32_master` for low-precision params.

  Attributes:
    master: float32 copy of the parameters (same pytree structure).
    inner: the wrapped optimizer's state, built on (and updated with) the
      master, so its moments are float32.
  """

  master: Any
  inner: optax.OptState


def _is_low_float(x) -> bool:
  dtype = x.dtype if hasattr(x, "dtype") else jnp.result_type(x)
  return jnp.issubdtype(dtype, jnp.floating) and jnp.finfo(dtype).bits < 32


def needs_master(params: Any) -> bool:
  """True when any floating leaf of `params` is narrower than float32."""
  return any(_is_low_float(x) for x in jax.tree.leaves(params))


def _to_f32(x):
  return x.astype(jnp.float32) if _is_low_float(x) else x


def with_float32_master(
    inner: optax.GradientTransformation,
) -> optax.GradientTransformation:
  """Wraps `inner` so that low-precision parameters get float32 master weights.

  init(params): float32 params -> `inner.init(params)` unchanged; otherwise
  `MasterWeightsState(master=params cast to float32, inner=inner.init(master))`.

  update(grads, state, params): with a `MasterWeightsState`, the gradients are
  cast to float32, `inner` updates the master (weight decay and moments in
  float32), and the returned updates are `round(master') - params` in float32,
  so `optax.apply_updates(params, updates)` gives the new master rounded to
  the parameter dtype (round to nearest even). The difference of two bfloat16
  numbers is exact in float32 unless their exponents differ by more than 16,
  so that sum is the rounded master exactly except in that case (a weight
  crossing to a value 2^16 times smaller, within one step), where it may be
  one bfloat16 unit off; the next step starts from the master again, so such
  an error never accumulates.

  Args:
    inner: any optax transformation (e.g. the learner's clipped AdamW).

  Returns:
    An optax.GradientTransformation.

  Raises:
    ValueError: update() without `params` when the state holds a master copy.
  """

  def init(params):
    if not needs_master(params):
      return inner.init(params)
    master = jax.tree.map(_to_f32, params)
    return MasterWeightsState(master=master, inner=inner.init(master))

  def update(grads, state, params=None):
    if not isinstance(state, MasterWeightsState):
      return inner.update(grads, state, params)
    if params is None:
      raise ValueError(
          "with_float32_master: update() needs params (the "
          "low-precision parameters the updates apply to)"
      )
    grads32 = jax.tree.map(_to_f32, grads)
    updates, inner_state = inner.update(grads32, state.inner, state.master)
    master = optax.apply_updates(state.master, updates)
    out = jax.tree.map(
        lambda m, p: (
            m.astype(jnp.result_type(p)).astype(jnp.float32)
            - p.astype(jnp.float32)
        )
        if _is_low_float(p)
        else m - p,
        master,
        params,
    )
    return out, MasterWeightsState(master=master, inner=inner_state)

  return optax.GradientTransformation(init, update)


def accumulation_zeros(tree: Any) -> Any:
  """Zero gradient accumulators shaped like `tree` (arrays or
  ShapeDtypeStructs): float32 for low-precision floating leaves, the leaf's
  dtype otherwise, so that micro-batch gradients of bf16 parameters are summed
  in float32 (`accumulate`)."""

  def zeros(x):
    dtype = jnp.float32 if _is_low_float(x) else x.dtype
    return jnp.zeros(x.shape, dtype)

  return jax.tree.map(zeros, tree)


def accumulate(acc: Any, grads: Any) -> Any:
  """acc + grads leaf by leaf, in the accumulator's dtype (`accumulation_zeros`)."""
  return jax.tree.map(lambda a, g: a + g.astype(a.dtype), acc, grads)
