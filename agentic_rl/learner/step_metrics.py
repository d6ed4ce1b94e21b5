"""The RL step's metrics after the update: top-level functions, chosen once.

Each metric function takes arrays of the iteration (the fresh `Rollout`'s
trajectory, reward, reward parts, advantages; the `LearnerBatch`'s mask)
positionally and its settings as keywords, and returns {name: float32 []}.
`build_step_metrics(config, env, reward_model)` reads the config once and
returns the functions that apply, in order, each bound to a named
`metric(r, batch) -> dict`; `make_rl_step` runs them after the features'
updates and adds their results to the iteration's metrics. A feature that is
off has no function, so no config branch is left in the step.

  name           runs when                   function, metrics
  dual_path      rl.dual_path_tool_free > 0  `dual_path_metrics`: dual_path_*
  batch          always                      `batch_metrics`: reward,
                                             shaped_reward, reward_<part>,
                                             accuracy, tool counts, token
                                             shares, adv_abs_mean,
                                             zero_variance_groups
  host_failures  a host environment          `host_tool_failures`:
                                             tool_exceptions, tool_timeouts
  episode_facts  always                      `episode_fact_metrics`:
                                             reward_nonfinite_inputs, turns,
                                             redundant_calls
  rm_monitor     a frozen reward model       `rm_monitor`: rm_reward,
                                             verified_reward, rm_gap,
                                             rm_verified_corr,
                                             rm_false_positive_rate, rm_score

The order is the traced program's (the ops of the metrics are emitted in
it): keep it when adding one.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp

from agentic_rl import padding
from agentic_rl import types
from agentic_rl.learner.batch import LearnerBatch, Rollout
from agentic_rl.reward_models import frozen as rm_frozen
from agentic_rl.rewards import components
from agentic_rl.rewards import sanitize
from environments.host import base as host_base

StepMetric = Callable[[Rollout, LearnerBatch], dict[str, jax.Array]]


def _mean_f32(x: jax.Array) -> jax.Array:
  """Mean of x as float32."""
  return jnp.mean(x.astype(jnp.float32))


def dual_path_metrics(traj: types.Trajectory) -> dict[str, jax.Array]:
  """Tool-necessity metrics of a dual-path batch (facts['tool_free'] set).

  Per group (`components.tool_necessity_stats`): acc_t (tool-enabled accuracy),
  acc_n (tool-free accuracy), necessity = acc_t - acc_n. Logged: the two
  accuracies over their episodes, the mean necessity over groups, the share
  of groups where tools are needed (acc_n = 0 < acc_t) or unneeded
  (acc_n > 0), and tool calls per tool-enabled episode in each kind of group
  (overuse shows as calls where tools are unneeded), and, when the env has a
  'tool_necessary' label, the mean necessity on labelled-necessary and
  labelled-unnecessary tasks. Means over rows equal
  means over groups (equal-size groups); an empty selection gives 0.
  Dual-path groups: AKBE / EAPO (docs/papers.md).

  Args:
    traj: the fresh batch; facts 'tool_free' [B] bool, 'correct' [B],
      'num_tool_calls' [B] and optionally 'tool_necessary' [B] bool; group
      [B] int32.

  Returns:
    float32 [] metrics named 'dual_path_*'.

  Raises:
    KeyError: a required fact is missing.
  """
  facts = traj.facts
  free = facts["tool_free"]
  correct = facts["correct"].astype(bool)
  calls = facts["num_tool_calls"].astype(jnp.float32)
  st = components.tool_necessity_stats(
      correct, calls.astype(jnp.int32), free, traj.group
  )
  f32 = lambda x: x.astype(jnp.float32)

  def mean_where(x, w):
    w = f32(w)
    return jnp.sum(x * w) / jnp.maximum(jnp.sum(w), 1.0)

  needed = (st["acc_no_tool"] == 0) & (st["acc_tool"] > 0)
  unneeded = st["acc_no_tool"] > 0
  extra = {}
  if "tool_necessary" in facts:
    # Measured necessity against the environment's ground-truth label.
    label = facts["tool_necessary"].astype(bool)
    extra = {
        "dual_path_necessity_labelled_necessary": mean_where(
            st["necessity"], label
        ),
        "dual_path_necessity_labelled_unnecessary": mean_where(
            st["necessity"], ~label
        ),
    }
  return {
      **extra,
      "dual_path_acc_tool": mean_where(f32(correct), ~free),
      "dual_path_acc_no_tool": mean_where(f32(correct), free),
      "dual_path_necessity": jnp.mean(st["necessity"]),
      "dual_path_needed_frac": jnp.mean(f32(needed)),
      "dual_path_unneeded_frac": jnp.mean(f32(unneeded)),
      "dual_path_calls_needed": mean_where(calls, ~free & needed),
      "dual_path_calls_unneeded": mean_where(calls, ~free & unneeded),
      # Exactly 0 when the logit mask works (a health check).
      "dual_path_calls_tool_free": mean_where(calls, free),
  }


def batch_metrics(
    reward_b: jax.Array,
    parts: Mapping[str, jax.Array],
    traj: types.Trajectory,
    mask_bl: jax.Array,
    adv_b: jax.Array,
    *,
    group_size: int,
) -> dict[str, jax.Array]:
  """Means over the fresh batch: reward, accuracy, tool use, tokens.

  Args:
    reward_b: [B] float32 reward the advantages were computed from (after
      every stage's reassignment; the stages log the environment's as
      'env_reward').
    parts: {name: [B] float32} reward components.
    traj: the fresh batch; facts 'correct', 'num_tool_calls',
      'num_tool_errors' [B]; finish, length [B].
    mask_bl: [B, L] bool the learner batch's loss mask.
    adv_b: [B] float32 episode advantages.
    group_size: episodes per group (rows are group-major, B a multiple).

  Returns:
    float32 []: 'reward' (the old name of 'shaped_reward', kept for earlier
    runs' records), 'shaped_reward', 'reward_<part>' per component,
    'accuracy', 'tool_calls', 'tool_errors', 'format_error_rate',
    'truncated_rate', 'policy_tokens' (loss-mask tokens per row),
    'trained_token_share', 'real_token_share' (`padding.metrics`),
    'adv_abs_mean' (mean |adv_b|), 'zero_variance_groups' (share of groups
    whose rewards are all equal).
  """
  reward_gk = reward_b.reshape(-1, group_size)
  is_const = jnp.all(reward_gk == reward_gk[:, :1], axis=1)
  facts = traj.facts
  return {
      "reward": jnp.mean(reward_b),
      "shaped_reward": jnp.mean(reward_b),
      **{f"reward_{k}": jnp.mean(v) for k, v in parts.items()},
      "accuracy": _mean_f32(facts["correct"]),
      "tool_calls": _mean_f32(facts["num_tool_calls"]),
      "tool_errors": _mean_f32(facts["num_tool_errors"]),
      "format_error_rate": _mean_f32(traj.finish == types.FORMAT_ERROR),
      "truncated_rate": _mean_f32(traj.finish == types.TRUNCATED),
      "policy_tokens": _mean_f32(jnp.sum(mask_bl, axis=1)),
      # Trained (loss-mask) tokens and non-pad tokens / all B * L tokens.
      **padding.metrics(mask_bl, traj.length),
      "adv_abs_mean": jnp.mean(jnp.abs(adv_b)),
      "zero_variance_groups": _mean_f32(is_const),
  }


def host_tool_failures(
    facts: Mapping[str, jax.Array],
) -> dict[str, jax.Array]:
  """Host tool steps that raised / timed out, summed over the batch.

  Args:
    facts: the fresh batch's facts; 'num_tool_exceptions' and
      'num_tool_timeouts' [B] int32 (`host_rollout`) when present.

  Returns:
    float32 [] 'tool_exceptions' and 'tool_timeouts', each only when its
    fact is present.
  """
  out = {}
  for name in ("tool_exceptions", "tool_timeouts"):
    if f"num_{name}" in facts:
      out[name] = jnp.sum(facts[f"num_{name}"]).astype(jnp.float32)
  return out


def episode_fact_metrics(traj: types.Trajectory) -> dict[str, jax.Array]:
  """Non-finite facts, episode length in turns, repeated calls.

  Args:
    traj: the fresh batch; num_turns [B] int32; float facts; optionally
      the fact 'num_redundant_calls' [B].

  Returns:
    float32 []: 'reward_nonfinite_inputs' (non-finite float facts the reward
    sanitised, summed over the batch, `sanitize.nonfinite_fact_counts`),
    'turns' (mean turns per episode) and, with that fact,
    'redundant_calls' (its mean: step-reward hacking shows there).
  """
  facts = traj.facts
  out = {
      "reward_nonfinite_inputs": jnp.sum(
          sanitize.nonfinite_fact_counts(facts)
      ).astype(jnp.float32),
      "turns": _mean_f32(traj.num_turns),
  }
  if "num_redundant_calls" in facts:
    out["redundant_calls"] = _mean_f32(facts["num_redundant_calls"])
  return out


def rm_monitor(
    traj: types.Trajectory,
    parts: Mapping[str, jax.Array],
    *,
    rm_params: Mapping[str, Any],
) -> dict[str, jax.Array]:
  """The frozen reward model's over-optimisation monitor.

  Gold-verifier monitor of Gao et al., arXiv:2210.10760
  (`rm_frozen.monitor_metrics`) on the RM reward: the 'rm' reward part when
  the config rewards with it, else `components.rm_reward(traj,
  **rm_params)`, against the fact 'correct'.

  Args:
    traj: the fresh batch; facts 'rm_score' [B] float32 (`stages.sample.
      rm_score`) and 'correct' [B].
    parts: {name: [B] float32} reward components.
    rm_params: the 'rm' entry of `rl.reward_params` (a plain dict).

  Returns:
    float32 []: 'rm_reward', 'verified_reward', 'rm_gap',
    'rm_verified_corr', 'rm_false_positive_rate', and 'rm_score' (the mean
    raw score).
  """
  facts = traj.facts
  rm_r = (
      parts["rm"] if "rm" in parts else components.rm_reward(traj, **rm_params)
  )
  out = dict(rm_frozen.monitor_metrics(rm_r, facts["correct"]))
  out["rm_score"] = jnp.mean(facts["rm_score"])
  return out


def _named(name: str, fn: StepMetric) -> StepMetric:
  """fn with __name__ = name (its name in `build_step_metrics`' list)."""
  fn.__name__ = name
  fn.__qualname__ = name
  return fn


def build_step_metrics(
    config, env, reward_model: Any = None
) -> tuple[StepMetric, ...]:
  """The post-update metric functions of `config`, in the order they run.

  Args:
    config: the experiment config (`rl.dual_path_tool_free`,
      `rl.group_size`, `rl.reward_params`; read once).
    env: the environment (host or JAX-native).
    reward_model: the frozen reward model (`rl.reward_model_dir`), or None.

  Returns:
    Functions `metric(r, batch) -> {name: float32 []}`, each named
    (`__name__`) as in the module docstring's table: 'dual_path' (with
    dual-path groups), 'batch', 'host_failures' (host environments),
    'episode_facts', 'rm_monitor' (with a frozen reward model).
  """
  rl_cfg = config.rl
  group_size = rl_cfg.group_size
  out = []
  if rl_cfg.dual_path_tool_free > 0:
    out.append(_named("dual_path", lambda r, b: dual_path_metrics(r.traj)))
  out.append(
      _named(
          "batch",
          lambda r, b: batch_metrics(
              r.reward, r.parts, r.traj, b.mask, r.adv_b, group_size=group_size
          ),
      )
  )
  if host_base.is_host(env):
    out.append(
        _named("host_failures", lambda r, b: host_tool_failures(r.traj.facts))
    )
  out.append(_named("episode_facts", lambda r, b: episode_fact_metrics(r.traj)))
  if reward_model is not None:
    rm_params = dict(rl_cfg.reward_params or {}).get("rm", {})
    rm_params = dict(
        rm_params.to_dict() if hasattr(rm_params, "to_dict") else rm_params
    )
    out.append(
        _named(
            "rm_monitor",
            lambda r, b: rm_monitor(r.traj, r.parts, rm_params=rm_params),
        )
    )
  return tuple(out)
