"""Weight schedules over training steps (`rl.reward_schedules`)."""

from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp

# kind -> required keys of the spec.
SCHEDULE_KINDS: dict[str, tuple[str, ...]] = {
    "constant": ("value",),
    "linear": ("start", "end", "steps"),
    "cosine": ("start", "end", "steps"),
}


def check_schedule(spec: Mapping[str, Any], where: str = "schedule") -> None:
  """Validates a schedule spec (see `schedule_value`) on the host.

  Raises:
    ValueError: missing/unknown 'kind', missing or extra keys, steps <= 0.
  """
  spec = dict(spec)
  kind = spec.get("kind")
  if kind not in SCHEDULE_KINDS:
    raise ValueError(
        f"{where}: unknown schedule kind {kind!r}; known: "
        f"{sorted(SCHEDULE_KINDS)}"
    )
  need = set(SCHEDULE_KINDS[kind])
  got = set(spec) - {"kind"}
  if got != need:
    raise ValueError(
        f"{where}: schedule kind {kind!r} takes keys {sorted(need)}, got "
        f"{sorted(got)}"
    )
  if "steps" in need and not spec["steps"] > 0:
    raise ValueError(
        f"{where}: schedule steps must be > 0, got {spec['steps']!r}"
    )


def schedule_value(spec: Mapping[str, Any], step: int | jax.Array) -> jax.Array:
  """Value of a weight schedule at training step `step` (pure jnp).

  t = clip(step / steps, 0, 1):
  - {'kind': 'constant', 'value': v}: v.
  - {'kind': 'linear', 'start': a, 'end': e, 'steps': S}: a + (e - a) t.
  - {'kind': 'cosine', 'start': a, 'end': e, 'steps': S}:
    e + (a - e) (1 + cos(pi t)) / 2  (half-cosine, a at 0, e at S).
  Constant at `end` for step >= S.

  Args:
    spec: schedule dict (host values).
    step: int or traced int32 scalar step.

  Returns:
    float32 scalar.

  Raises:
    ValueError: invalid spec (see `check_schedule`).
  """
  check_schedule(spec)
  kind = spec["kind"]
  if kind == "constant":
    return jnp.asarray(spec["value"], jnp.float32)
  start = jnp.asarray(spec["start"], jnp.float32)
  end = jnp.asarray(spec["end"], jnp.float32)
  t = jnp.clip(jnp.asarray(step, jnp.float32) / float(spec["steps"]), 0.0, 1.0)
  if kind == "linear":
    return (start + (end - start) * t).astype(jnp.float32)
  return (end + (start - end) * 0.5 * (1.0 + jnp.cos(jnp.pi * t))).astype(
      jnp.float32
  )
