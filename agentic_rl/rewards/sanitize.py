"""Non-finite facts: the composed reward never is NaN or inf because of a fact.

`factory.make_reward_fn`'s reward reads every floating fact with its NaN /
+-inf entries replaced by 0 (`sanitize_facts`; for 'call_score' and the
call_*_frac facts: no credit, their minimum; for 'rm_score': the RM's neutral
logit 0), and `composition.compose` treats a non-finite component value as 0
('sum', 'product') or leaves it out of its group's statistics with z = 0
('gdpo'). The learner logs how many fact entries were replaced
(`nonfinite_fact_counts`, summed over the batch: metric
'reward_nonfinite_inputs') and reads the PBRS potentials ('progress',
'rm_potential') through `finite_or_zero` too.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp


def finite_or_zero(x: jax.Array) -> jax.Array:
  """`x` with its NaN / +-inf entries replaced by 0 (same shape and dtype)."""
  x = jnp.asarray(x)
  return jnp.where(jnp.isfinite(x), x, jnp.zeros((), x.dtype))


def nonfinite_fact_counts(facts: Mapping[str, Any]) -> jax.Array:
  """Per-episode number of NaN / +-inf entries over the floating facts.

  Args:
    facts: name -> [B, ...] array (numpy or jax); non-floating facts are
      skipped.

  Returns:
    [B] int32 (zeros when no fact is floating).
  """
  b = None
  total = None
  for v in facts.values():
    v = jnp.asarray(v)
    if v.ndim == 0:
      continue
    b = v.shape[0] if b is None else b
    if not jnp.issubdtype(v.dtype, jnp.floating):
      continue
    bad = jnp.sum(
        ~jnp.isfinite(v).reshape(v.shape[0], -1), axis=1, dtype=jnp.int32
    )
    total = bad if total is None else total + bad
  if total is None:
    return jnp.zeros((b or 0,), jnp.int32)
  return total


def sanitize_facts(facts: Mapping[str, Any]) -> dict[str, Any]:
  """`facts` with the NaN / +-inf entries of every floating fact replaced by 0.

  The documented value 0 is: no credit for 'call_score' and the call_*_frac
  facts (their minimum), the neutral logit for 'rm_score' (sigma(0 - ref)
  under the 'sigmoid' transform). Non-floating facts are returned unchanged.

  Args:
    facts: name -> [B, ...] array.

  Returns:
    A new dict with the same keys, shapes and dtypes.
  """
  out = {}
  for k, v in facts.items():
    if jnp.issubdtype(jnp.asarray(v).dtype, jnp.floating):
      out[k] = finite_or_zero(v)
    else:
      out[k] = v
  return out
