"""The composed reward function from the config: components -> composition
(with weight schedules) -> noise (`make_reward_fn`, `reward_fn_from_config`).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import jax

from agentic_rl.rewards.components import (
    OTC_FORMS,
    REWARD_COMPONENTS,
    REWARD_PARAM_DEFAULTS,
)
from agentic_rl.rewards.composition import COMPOSITIONS, compose
from agentic_rl.rewards.noise import dither_rewards, flip_rewards
from agentic_rl.rewards.sanitize import finite_or_zero, sanitize_facts
from agentic_rl.rewards.schedules import check_schedule, schedule_value
from agentic_rl.rewards.transforms import RM_TRANSFORMS

NOISE_KEYS = ("flip_p", "dither_sigma", "flip_low", "flip_high")


def _check_params(name: str, given: Mapping[str, Any]) -> None:
  known = REWARD_PARAM_DEFAULTS[name]
  for p in given:
    if p not in known:
      raise ValueError(
          f"rl.reward_params.{name}: unknown param {p!r} of reward component "
          f"{name!r}; known: {sorted(known)}"
      )
  value = {**known, **given}  # the defaults live in REWARD_PARAM_DEFAULTS
  if name == "rm" and value["transform"] not in RM_TRANSFORMS:
    raise ValueError(
        f"rl.reward_params.rm: unknown transform {given['transform']!r}; known: "
        f"{RM_TRANSFORMS}"
    )
  if name == "rm" and not value["temperature"] > 0:
    raise ValueError(
        f"rl.reward_params.rm: temperature must be > 0, got "
        f"{given['temperature']!r}"
    )
  # ref_match (call_rewards.py): `exact` switches fraction/exact match.
  if name == "ref_match" and not isinstance(value["exact"], bool):
    raise ValueError(
        f"rl.reward_params.ref_match: exact must be a bool, got "
        f"{given['exact']!r}"
    )
  if name == "otc" and value["form"] not in OTC_FORMS:
    raise ValueError(
        f"rl.reward_params.otc: unknown form {given['form']!r}; known: "
        f"{OTC_FORMS}"
    )


def make_reward_fn(
    weights: Mapping[str, float],
    *,
    params: Mapping[str, Mapping[str, Any]] | None = None,
    composition: str = "sum",
    schedules: Mapping[str, Mapping[str, Any]] | None = None,
    noise: Mapping[str, float] | None = None,
) -> Callable[..., tuple[jax.Array, dict[str, jax.Array]]]:
  """Composed reward R = compose({r_c}, {w_c}, composition) [+ noise].

  With only `weights` this is the plain weighted sum R = sum_c w_c r_c, exactly
  as before (same ops, same order).

  Args:
    weights: component name -> weight; names must be keys of REWARD_COMPONENTS.
      Insertion order is the summation order.
    params: component name -> {param: value} overriding
      REWARD_PARAM_DEFAULTS[name]; each name must also be in `weights`.
    composition: one of COMPOSITIONS ('sum', 'product', 'gdpo'; see
      `compose`). 'gdpo' groups by `traj.group`.
    schedules: component name -> schedule spec (see `schedule_value`); the
      weight of such a component is schedule_value(spec, step) and
      weights[name] is not used (the entry still enables the component).
    noise: optional {'flip_p': p, 'dither_sigma': s, 'flip_low': 0.,
      'flip_high': 1.} applied to the composed reward: first `flip_rewards`
      (if flip_p given), then `dither_rewards` (if dither_sigma given), with
      keys split from the call's `key`.

  Returns:
    reward_fn(traj, step=0, key=None) -> (reward [B] float32,
    {name: unweighted component [B] float32}). Floating facts are read
    through `sanitize_facts` (NaN / inf -> 0) and a non-finite component value
    counts as 0. `step` may be a traced int32;
    `key` is required when noise is configured.

  Raises:
    ValueError: at construction (before any work) for empty weights, an
      unknown component name, an unknown param of a component (naming both),
      an unknown composition, a schedule for an unknown/unweighted component or
      of unknown kind / bad keys, unknown noise keys or out-of-range noise.
      At call time: noise configured but key is None.
  """
  if not weights:
    raise ValueError(
        "rl.rewards must name at least one reward component, got {}"
    )
  for name in weights:
    if name not in REWARD_COMPONENTS:
      raise ValueError(
          f"rl.rewards: unknown reward name {name!r}; known: "
          f"{sorted(REWARD_COMPONENTS)}"
      )
  if composition not in COMPOSITIONS:
    raise ValueError(
        f"rl.reward_composition: unknown composition {composition!r}; known: "
        f"{COMPOSITIONS}"
    )
  params = {k: dict(v) for k, v in dict(params or {}).items()}
  for name, given in params.items():
    if name not in REWARD_COMPONENTS:
      raise ValueError(
          f"rl.reward_params: unknown reward name {name!r}; known: "
          f"{sorted(REWARD_COMPONENTS)}"
      )
    if name not in weights:
      raise ValueError(
          f"rl.reward_params.{name}: component {name!r} is not in rl.rewards"
      )
    _check_params(name, given)
  schedules = {k: dict(v) for k, v in dict(schedules or {}).items()}
  for name, spec in schedules.items():
    if name not in weights:
      raise ValueError(
          f"rl.reward_schedules.{name}: component {name!r} is not in "
          f"rl.rewards"
      )
    check_schedule(spec, where=f"rl.reward_schedules.{name}")
  noise = dict(noise or {})
  for k in noise:
    if k not in NOISE_KEYS:
      raise ValueError(
          f"rl.reward_noise: unknown key {k!r}; known: {NOISE_KEYS}"
      )
  if "flip_p" in noise and not 0.0 <= noise["flip_p"] <= 1.0:
    raise ValueError(
        f"rl.reward_noise.flip_p must be in [0, 1], got " f"{noise['flip_p']!r}"
    )
  if "dither_sigma" in noise and not noise["dither_sigma"] >= 0.0:
    raise ValueError(
        f"rl.reward_noise.dither_sigma must be >= 0, got "
        f"{noise['dither_sigma']!r}"
    )
  use_flip = "flip_p" in noise
  use_dither = "dither_sigma" in noise

  items = tuple((name, float(w)) for name, w in weights.items())
  plain = composition == "sum" and not schedules and not noise

  def reward_fn(traj, step=0, key=None):
    # Non-finite float facts read as 0 (sanitize_facts); a component that
    # still yields a non-finite value contributes 0.
    traj = traj.replace(facts=sanitize_facts(traj.facts))
    parts = {
        name: finite_or_zero(
            REWARD_COMPONENTS[name](traj, **params.get(name, {}))
        )
        for name, _ in items
    }
    if plain:
      total = sum(w * parts[name] for name, w in items)
      return total, parts
    w_eff = {
        name: schedule_value(schedules[name], step) if name in schedules else w
        for name, w in items
    }
    total = compose(parts, w_eff, composition, group_b=traj.group)
    if use_flip or use_dither:
      if key is None:
        raise ValueError(
            "reward_fn: rl.reward_noise is configured, so a PRNG key is "
            "required (got key=None)"
        )
      flip_key, dither_key = jax.random.split(key)
      if use_flip:
        total = flip_rewards(
            flip_key,
            total,
            noise["flip_p"],
            **{
                arg: noise[k]
                for arg, k in (("low", "flip_low"), ("high", "flip_high"))
                if k in noise
            },
        )
      if use_dither:
        total = dither_rewards(dither_key, total, noise["dither_sigma"])
    return total, parts

  return reward_fn


def reward_fn_from_config(rl_cfg):
  """`make_reward_fn` from the experiment's `rl` block: `rewards` (weights),
  `reward_params`, `reward_composition`, `reward_schedules`, `reward_noise`
  (their defaults: configs/default.py; empty blocks = off).

  Raises:
    ValueError: any unknown name (see `make_reward_fn`).
  """

  def block(name):
    value = rl_cfg[name]
    value = value.to_dict() if hasattr(value, "to_dict") else dict(value)
    return value or None

  return make_reward_fn(
      dict(rl_cfg.rewards),
      params=block("reward_params"),
      composition=rl_cfg.reward_composition,
      schedules=block("reward_schedules"),
      noise=block("reward_noise"),
  )
