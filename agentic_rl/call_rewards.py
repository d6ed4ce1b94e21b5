"""Fine-grained tool-call reward components over per-call environment facts.

Two families, as functions `fn(traj, **params) -> [B] float32` registered in
`rewards.REWARD_COMPONENTS` (so `rl.rewards.<name>` and `rl.reward_params.<name>`
work as for every other component). They read the per-turn call facts of
environments/schema_calls.py (all [B, K]; a turn that is not a tool call has all
of them False / 0 and tool_call_turn False):

  call_format_ok, call_schema_ok, call_name_ok, call_param_names_frac,
  call_param_values_frac, call_exec_ok, tool_call_turn,
  plus the episode facts 'answered', 'correct'.

Valid call paths: the environment scores each call against the best-matching
*ready* node of the task (any equivalent tool, any order of commutative values, any
order of independent sub-expressions), so every valid path has name, names and
values credit 1 per call, and these rewards give it full credit.

Means over calls: mean_calls(x) = sum_k x_k c_k / max(sum_k c_k, 1), c_k =
tool_call_turn; an episode without calls has mean 0.

ToolRL (Qian et al., "ToolRL: Reward is All Tool Learning Needs",
arXiv:2504.13958). Recalled from the paper (the catalogue marks it "inferred",
verify against the paper): R = R_format + R_correct, R_format in {0, 1};
for predicted calls P and gold calls G,
  r_name  = |N_G & N_P| / |N_G | N_P|                       (tool-name Jaccard)
  r_param = sum_j |keys(P_Gj) & keys(P_Pj)| / |keys(P_Gj) | keys(P_Pj)|
  r_value = sum_j sum_{k in keys(P_Gj)} 1[P_Gj[k] = P_Pj[k]]
  R_correct = 6 (r_name + r_param + r_value) / S_max - 3,  S_max = 1 + |G| + sum_j |keys(G_j)|.
Here every turn has one gold call with two parameters (|G| = 1, S_max = 4), so a
call's score is 6 (name + names_frac + 2 values_frac) / 4 - 3 in [-3, 3]; the
episode's R_correct is the mean over its calls, and -3 when it made none. R_format
= 1 iff the episode answered and every call parsed.

TIER-style trajectory-invariant scoring (TIER; the paper catalogue marks the
composition as inferred from the abstract): R = w_f F + w_s S + w_e E + w_a A with
F = format validity (answered and every call parsed), S = mean over calls of schema
adherence (call_schema_ok), E = mean over calls of execution success
(call_exec_ok), A = answer correctness. No reference trajectory enters, so any
valid execution path scores the same. Episodes without calls get S = E = 0.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from agentic_rl import types


def mean_over_calls(x_bk: jax.Array, call_bk: jax.Array) -> jax.Array:
  """sum_k x c / max(sum_k c, 1) per episode.

  Args:
    x_bk: [B, K] per-turn values (bool or float).
    call_bk: [B, K] bool, which turns were tool calls.

  Returns:
    [B] float32 (0 for episodes without calls).
  """
  c = call_bk.astype(jnp.float32)
  n = jnp.sum(c, axis=-1)
  return jnp.sum(x_bk.astype(jnp.float32) * c, axis=-1) / jnp.maximum(n, 1.0)


def _calls(traj: types.Trajectory) -> jax.Array:
  return traj.facts["tool_call_turn"].astype(bool)


def _has_calls(traj: types.Trajectory) -> jax.Array:
  return jnp.any(_calls(traj), axis=-1)


def format_validity(traj: types.Trajectory) -> jax.Array:
  """1[answered and every tool call parsed], [B] float32."""
  f = traj.facts
  bad = jnp.any(_calls(traj) & ~f["call_format_ok"].astype(bool), axis=-1)
  return (f["answered"].astype(bool) & ~bad).astype(jnp.float32)


def call_name_reward(traj: types.Trajectory) -> jax.Array:
  """Mean over calls of 1[tool name valid for a ready node], [B] in [0, 1]."""
  return mean_over_calls(traj.facts["call_name_ok"], _calls(traj))


def call_param_names_reward(traj: types.Trajectory) -> jax.Array:
  """Mean over calls of the parameter-name Jaccard index, [B] in [0, 1]."""
  return mean_over_calls(traj.facts["call_param_names_frac"], _calls(traj))


def call_param_values_reward(traj: types.Trajectory) -> jax.Array:
  """Mean over calls of the fraction of parameters with the right value, [B]."""
  return mean_over_calls(traj.facts["call_param_values_frac"], _calls(traj))


def toolrl_correct(traj: types.Trajectory) -> jax.Array:
  """ToolRL R_correct (module docstring), [B] float32 in [-3, 3]."""
  f = traj.facts
  per_call = (6.0 * (f["call_name_ok"].astype(jnp.float32)
                     + f["call_param_names_frac"].astype(jnp.float32)
                     + 2.0 * f["call_param_values_frac"].astype(jnp.float32)) / 4.0
              - 3.0)
  return jnp.where(_has_calls(traj), mean_over_calls(per_call, _calls(traj)), -3.0)


def toolrl_reward(traj: types.Trajectory, *, format_weight: float = 1.0,
                  correct_scale: float = 1.0) -> jax.Array:
  """ToolRL R = format_weight R_format + correct_scale R_correct, [B] float32.

  Qian et al., arXiv:2504.13958 (form recalled from the paper; see module
  docstring). Defaults give the paper's range [-3, 4].
  """
  return (format_weight * format_validity(traj)
          + correct_scale * toolrl_correct(traj)).astype(jnp.float32)


def tier_reward(traj: types.Trajectory, *, w_format: float = 1.0,
                w_schema: float = 1.0, w_exec: float = 1.0,
                w_answer: float = 1.0) -> jax.Array:
  """TIER-style trajectory-invariant reward (module docstring), [B] float32.

  R = w_format F + w_schema S + w_exec E + w_answer A.
  """
  calls = _calls(traj)
  f = traj.facts
  return (w_format * format_validity(traj)
          + w_schema * mean_over_calls(f["call_schema_ok"], calls)
          + w_exec * mean_over_calls(f["call_exec_ok"], calls)
          + w_answer * f["correct"].astype(jnp.float32)).astype(jnp.float32)


CALL_REWARD_COMPONENTS: dict[str, Callable[..., jax.Array]] = {
    "toolrl": toolrl_reward,
    "tier": tier_reward,
    "call_name": call_name_reward,
    "call_param_names": call_param_names_reward,
    "call_param_values": call_param_values_reward,
}
