"""Reward components: functions of environment facts, by config name.

A component maps the trajectory's env facts and finish reasons to a [B] float32
reward, `fn(traj, **params)`; `factory.make_reward_fn` composes the ones named
in `rl.rewards` (docs/rewards_and_credit.md). Each component is also returned
separately (unweighted) so it can be logged.

Components (`REWARD_COMPONENTS`; keyword params and defaults in
`REWARD_PARAM_DEFAULTS`):

| name                      | r_i                              | params        |
|---------------------------|----------------------------------|---------------|
| correct                   | 1[correct]                       | -             |
| format                    | 1[answered, no tool error]       | -             |
| otc                       | 1[correct] f(m_i, n*_g) (OTC-PO) | c=1.0,        |
|                           |                                  | form='paper', |
|                           |                                  | alpha=1.0     |
| tool_cost                 | -c m_i (Router-R1)               | c=0.1         |
| failed_call_penalty       | -c e_i (AutoTIR)                 | c=0.1         |
| gated_relative_efficiency | 1[correct] lam e_rel (SlimSrch.) | lam=1.0       |
| tool_bonus                | b 1[m_i > 0] (anti-collapse)     | b=1.0         |
| dual_path_efficiency      | -c acc_n m_i + b nec^+ 1[corr] f | c=0.1, b=0.5, |
|                           | (AKBE / EAPO dual-path groups)   | otc_c=1.0     |
| rm                        | bounded learned-RM score         | transform=    |
|                           | (facts['rm_score'], rm_reward)   | 'sigmoid',... |

plus the ToolRL / TIER call-matching components of call_rewards.py.

m_i = facts['num_tool_calls'], e_i = facts['num_tool_errors']. Group
statistics use segment ops on the int32 `traj.group` ids (never row order), so
group ids must lie in [0, B) (see `advantages.group_ids_from_keys`).
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

import chex
import jax
import jax.numpy as jnp

from agentic_rl import call_rewards
from agentic_rl import types
from agentic_rl.rewards import transforms

RewardFn = Callable[..., jax.Array]


# ---------------------------------------------------------------------------
# Helpers.
# ---------------------------------------------------------------------------


def _num_calls(traj: types.Trajectory) -> jax.Array:
  return traj.facts["num_tool_calls"].astype(jnp.int32)


def _correct(traj: types.Trajectory) -> jax.Array:
  return traj.facts["correct"].astype(jnp.bool_)


def _correct_group_min_max(
    m_b: jax.Array, correct_b: jax.Array, group_b: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Per-row min/max of m over the CORRECT rows of the row's group.

  Returns (min_b, max_b, any_b): int32, int32, bool [B]; min/max are 0 where
  the group has no correct row (any_b False).
  """
  b = m_b.shape[0]
  group = group_b.astype(jnp.int32)
  big = jnp.iinfo(jnp.int32).max
  min_g = jax.ops.segment_min(
      jnp.where(correct_b, m_b, big), group, num_segments=b
  )
  max_g = jax.ops.segment_max(
      jnp.where(correct_b, m_b, -1), group, num_segments=b
  )
  any_g = (
      jax.ops.segment_max(correct_b.astype(jnp.int32), group, num_segments=b)
      > 0
  )
  any_b = any_g[group]
  return (
      jnp.where(any_b, min_g[group], 0),
      jnp.where(any_b, max_g[group], 0),
      any_b,
  )


# ---------------------------------------------------------------------------
# Components: fn(traj, **params) -> [B] float32.
# ---------------------------------------------------------------------------


def correct_reward(traj: types.Trajectory) -> jax.Array:
  """1 if the final answer is correct, else 0. Returns [B] float32."""
  return traj.facts["correct"].astype(jnp.float32)


def format_reward(traj: types.Trajectory) -> jax.Array:
  """1 if the episode ended with a well-formed answer and every tool call parsed.

  Returns [B] float32 in {0, 1}. Episodes that hit MAX_TURNS or TRUNCATED, or wrote
  a malformed answer or tool call, get 0.
  """
  ok = (traj.finish == types.ANSWERED) & (traj.facts["num_tool_errors"] == 0)
  return ok.astype(jnp.float32)


OTC_FORMS = ("paper", "inverse")


def otc_tool_score(
    m_b: jax.Array,
    n_b: jax.Array,
    *,
    c: float = 1.0,
    form: str = "paper",
    alpha: float = 1.0,
) -> jax.Array:
  """OTC tool-efficiency score f(m, n*) in [0, 1], with f(n*, n*) = 1.

  form='paper' (Wang et al., "Acting Less is Reasoning More! Teaching Model to
  Act Efficiently" (OTC-PO), arXiv:2504.14870, OTC-GRPO reward):

    f(m, n*) = 1                          if m = n* = 0,
             = cos(m * pi / (2 m + c))    if n* = 0,
             = sin(g(m, n*) * pi / (2 n*)) otherwise,
    g(m, n*) = 2 n* m / (m + n*)          (so g(n*, n*) = n*).

  For n* > 0 the score rises from 0 at m = 0 to 1 at m = n* and falls towards
  0 as m -> inf; for n* = 0 it falls from 1 at m = 0 towards cos(pi/2) = 0.

  form='inverse' (the catalogue's inferred stand-in, docs/papers.md; inferred,
  not the paper's): f(m, n*) = 1 / (1 + alpha * |m - n*|).

  Args:
    m_b: [B] int tool calls of each episode (>= 0).
    n_b: [B] int optimal calls n* of each episode's group (>= 0).
    c: smoothing constant of the n* = 0 branch (> 0), paper form only.
    form: 'paper' or 'inverse' (Python str).
    alpha: decay rate of the inverse form (>= 0), inverse form only.

  Returns:
    [B] float32 scores.

  Raises:
    ValueError: unknown form.
  """
  if form not in OTC_FORMS:
    raise ValueError(f"otc: unknown form {form!r}; known: {OTC_FORMS}")
  m = m_b.astype(jnp.float32)
  n = n_b.astype(jnp.float32)
  if form == "inverse":
    return (1.0 / (1.0 + alpha * jnp.abs(m - n))).astype(jnp.float32)
  n_zero = n == 0
  cos_branch = jnp.cos(m * jnp.pi / (2.0 * m + c))
  safe_n = jnp.where(n_zero, 1.0, n)
  g = 2.0 * safe_n * m / (m + safe_n)
  sin_branch = jnp.sin(g * jnp.pi / (2.0 * safe_n))
  out = jnp.where(n_zero, cos_branch, sin_branch)
  # Exact 1 on the optimum (sin(pi/2) and cos(0) already are; this pins it).
  out = jnp.where(m == n, 1.0, out)
  return out.astype(jnp.float32)


def otc_reward(
    traj: types.Trajectory,
    *,
    c: float = 1.0,
    form: str = "paper",
    alpha: float = 1.0,
) -> jax.Array:
  """OTC-PO tool-integrated reward R_i = 1[correct_i] * f(m_i, n*_g).

  Wang et al., "Acting Less is Reasoning More! Teaching Model to Act
  Efficiently" (OTC-PO), arXiv:2504.14870 (docs/papers.md). m_i = the episode's
  tool calls; n*_g = the fewest tool calls among the CORRECT episodes of the
  episode's group (the paper's OTC-GRPO estimate of the optimal call count).
  f is `otc_tool_score` (default the paper's sin/cos form; form='inverse' is
  the inferred 1 / (1 + alpha |m - n*|)). Incorrect episodes, and so every
  episode of a group without a correct one, get 0 (= the correctness reward).
  The paper's scale alpha on the tool term is the composition weight here.

  Args:
    traj: Trajectory with facts 'correct' (bool [B]) and 'num_tool_calls'
      (int [B]); `traj.group` int32 [B] ids in [0, B).
    c: n* = 0 smoothing constant (default 1.0).
    form: 'paper' (default) or 'inverse'.
    alpha: inverse-form decay (default 1.0).

  Returns:
    [B] float32 in [0, 1].

  Raises:
    ValueError: unknown form.
  """
  m_b = _num_calls(traj)
  correct_b = _correct(traj)
  n_b, _, _ = _correct_group_min_max(m_b, correct_b, traj.group)
  f_b = otc_tool_score(m_b, n_b, c=c, form=form, alpha=alpha)
  return jnp.where(correct_b, f_b, 0.0).astype(jnp.float32)


def tool_cost_reward(traj: types.Trajectory, *, c: float = 0.1) -> jax.Array:
  """Per-call cost R_i = -c * m_i, m_i = facts['num_tool_calls'].

  Router-R1 style cost reward (docs/papers.md; format + outcome + cost). The
  paper's exact cost model is not reproduced; this is a constant cost per call.

  Args:
    traj: Trajectory with facts 'num_tool_calls' int [B].
    c: cost per call (default 0.1).

  Returns:
    [B] float32 (<= 0 for c >= 0).
  """
  return (-c * _num_calls(traj).astype(jnp.float32)).astype(jnp.float32)


def failed_call_penalty_reward(
    traj: types.Trajectory, *, c: float = 0.1
) -> jax.Array:
  """Penalty only for failed calls: R_i = -c * e_i (e_i = num_tool_errors).

  AutoTIR (docs/papers.md): hybrid reward with a penalty for *incorrect* tool
  usage, not for tool use itself; successful calls cost nothing.

  Args:
    traj: Trajectory with facts 'num_tool_errors' int [B].
    c: penalty per failed call (default 0.1).

  Returns:
    [B] float32 (<= 0 for c >= 0).
  """
  e = traj.facts["num_tool_errors"].astype(jnp.float32)
  return (-c * e).astype(jnp.float32)


def gated_relative_efficiency_reward(
    traj: types.Trajectory, *, lam: float = 1.0
) -> jax.Array:
  """SlimSearcher-style gated relative tool efficiency (inferred).

  R_i = 1[correct_i] * lam * (M_g - m_i) / max(M_g - m_g, 1),

  where M_g / m_g are the largest / smallest tool-call counts among the CORRECT
  episodes of group g. The most economical correct episode gets lam, the least
  economical 0; incorrect episodes get 0 (the correctness gate), and a group
  whose correct episodes all use the same count gives 0 to all. Counts are
  integers, so the denominator max(., 1) only guards the all-equal case.
  Combined with `correct` (weight 1) this is the inferred SlimSearcher
  form R = 1[correct] (1 + lam e_rel) (SlimSearcher, "Adaptive Reward Gating"); the
  normalisation by the within-group range of correct episodes is our choice.

  Args:
    traj: Trajectory with facts 'correct' bool [B], 'num_tool_calls' int [B];
      `traj.group` int32 [B] ids in [0, B).
    lam: efficiency weight lambda (default 1.0).

  Returns:
    [B] float32 in [0, lam].
  """
  m_b = _num_calls(traj)
  correct_b = _correct(traj)
  lo_b, hi_b, _ = _correct_group_min_max(m_b, correct_b, traj.group)
  e_rel = (hi_b - m_b).astype(jnp.float32) / jnp.maximum(hi_b - lo_b, 1).astype(
      jnp.float32
  )
  return jnp.where(correct_b, lam * e_rel, 0.0).astype(jnp.float32)


def tool_bonus_reward(traj: types.Trajectory, *, b: float = 1.0) -> jax.Array:
  """Anti-collapse tool-use bonus R_i = b * 1[m_i > 0].

  Counters "interaction collapse" (PyVision-RL, docs/papers.md; SPEAR's
  auxiliary tool-call reward, SPEAR): an episode that calls a tool at
  least once gets b. Meant to be annealed: give it a decaying weight schedule
  in `factory.make_reward_fn(..., schedules={'tool_bonus': {...}})` (inferred
  recipe).

  Args:
    traj: Trajectory with facts 'num_tool_calls' int [B].
    b: bonus (default 1.0; the scheduled weight then sets the magnitude).

  Returns:
    [B] float32 in {0, b}.
  """
  return jnp.where(_num_calls(traj) > 0, b, 0.0).astype(jnp.float32)


def call_score_reward(traj: types.Trajectory) -> jax.Array:
  """Fine-grained function-call credit R_i = facts['call_score'] in [0, 1].

  Partial credit per call field (function name, each parameter's value), from
  host function-calling environments (environments/host/bfcl/).

  Returns:
    [B] float32.
  """
  return traj.facts["call_score"].astype(jnp.float32)


def _group_mean(x_b: jax.Array, w_b: jax.Array, group_b: jax.Array):
  """Per-row mean of x over the rows of its group with w set, and whether any
  row has w set there. Returns (mean_b float32 (0 where none), any_b bool)."""
  b = x_b.shape[0]
  group = group_b.astype(jnp.int32)
  w = w_b.astype(jnp.float32)
  num_g = jax.ops.segment_sum(
      w * x_b.astype(jnp.float32), group, num_segments=b
  )
  den_g = jax.ops.segment_sum(w, group, num_segments=b)
  any_b = den_g[group] > 0
  return (
      jnp.where(any_b, num_g[group] / jnp.maximum(den_g[group], 1.0), 0.0),
      any_b,
  )


def tool_necessity_stats(
    correct_b: jax.Array,
    num_calls_b: jax.Array,
    tool_free_b: jax.Array,
    group_b: jax.Array,
) -> dict[str, jax.Array]:
  """Per-task tool necessity measured from a dual-path group.

  For the group g of each row: acc_t = accuracy of its tool-enabled episodes,
  acc_n = accuracy of its tool-free episodes (sampled with the tool-call
  token masked), necessity = acc_t - acc_n (AT-GRPO's Tool Benefit Score,
  docs/papers.md, inferred definition; AKBE's knowledge boundary,
  compares correctness across the two paths), n* = fewest tool calls among
  the correct tool-enabled episodes (0 if none).

  Args:
    correct_b: [B] bool final-answer correctness.
    num_calls_b: [B] int tool calls per episode.
    tool_free_b: [B] bool, episode sampled with tool calls disabled.
    group_b: [B] int32 task group ids in [0, B).

  Returns:
    dict of [B] arrays (each row carries its group's value): 'acc_tool',
    'acc_no_tool', 'necessity' (float32; 0 where the group lacks an arm),
    'n_star' (int32), 'both_arms' (bool: the group has episodes of both arms).
  """
  chex.assert_rank([correct_b, num_calls_b, tool_free_b, group_b], 1)
  chex.assert_equal_shape([correct_b, num_calls_b, tool_free_b, group_b])
  correct = jnp.asarray(correct_b).astype(jnp.bool_)
  free = jnp.asarray(tool_free_b).astype(jnp.bool_)
  acc_t, any_t = _group_mean(correct, ~free, group_b)
  acc_n, any_n = _group_mean(correct, free, group_b)
  both = any_t & any_n
  n_star, _, _ = _correct_group_min_max(
      num_calls_b.astype(jnp.int32), correct & ~free, group_b
  )
  return {
      "acc_tool": acc_t,
      "acc_no_tool": acc_n,
      "necessity": jnp.where(both, acc_t - acc_n, 0.0).astype(jnp.float32),
      "n_star": n_star,
      "both_arms": both,
  }


def dual_path_efficiency_reward(
    traj: types.Trajectory,
    *,
    c: float = 0.1,
    b: float = 0.5,
    otc_c: float = 1.0,
) -> jax.Array:
  """Tool-efficiency reward from dual-path groups (inferred form).

  Each group holds tool-enabled episodes and tool-free ones (tool-call token
  masked at sampling; `rl.dual_path_tool_free`). With the group's acc_t,
  acc_n, necessity nec = acc_t - acc_n and n* from `tool_necessity_stats`,
  a tool-enabled episode i with m_i calls gets

    R_i = -c * acc_n * m_i  +  b * max(nec, 0) * 1[correct_i] * f(m_i, n*),

  f = OTC's paper score (`otc_tool_score`, arXiv:2504.14870; f(n*, n*) = 1,
  smoothing constant otc_c). Tool-free episodes, and every episode of a group
  that lacks one of the two arms, get 0 (their correctness is scored by
  `correct`).

  Sources and what is ours. From AKBE's abstract (Chen et al.,
  arXiv:2605.26952; docs/papers.md): dual-path (with-tool / no-tool)
  rollouts; the knowledge boundary is whether a task needs tools and the
  minimum number of calls; trajectories are categorised by comparing
  correctness across the paths. Inferred from the abstract (not from a paper):
  the categories (i) solved without tools -> tools unnecessary, penalise
  calls; (ii) only solved with tools -> tools needed, favour the minimal-call
  correct episodes; (iii) neither -> no efficiency signal; EAPO
  penalising redundant calls mainly on easy queries; AT-GRPO (AdaTooler-V) scaling
  the tool reward by the Tool Benefit Score acc_t - acc_n. Our choice makes
  the categories soft: the call cost is weighted by acc_n (how often the task
  is solved without tools: full cost in (i), none in (ii) and (iii)) and the
  minimal-call bonus by max(nec, 0) (none in (i) when tools do not help, full
  in (ii) when tools are necessary, none in (iii)).

  Args:
    traj: Trajectory with facts 'correct' bool [B], 'num_tool_calls' int [B],
      'tool_free' bool [B] (added by the rollout in dual-path groups; absent
      means no tool-free episode, so the reward is 0); `traj.group` int32 [B]
      ids in [0, B).
    c: cost per call at acc_n = 1 (default 0.1).
    b: minimal-call bonus at nec = 1 (default 0.5).
    otc_c: n* = 0 smoothing constant of f.

  Returns:
    [B] float32.
  """
  m_b = _num_calls(traj)
  correct_b = _correct(traj)
  free_b = jnp.asarray(
      traj.facts.get("tool_free", jnp.zeros(m_b.shape, jnp.bool_)), jnp.bool_
  )
  st = tool_necessity_stats(correct_b, m_b, free_b, traj.group)
  f_b = otc_tool_score(m_b, st["n_star"], c=otc_c)
  cost = -c * st["acc_no_tool"] * m_b.astype(jnp.float32)
  bonus = b * jnp.maximum(st["necessity"], 0.0) * jnp.where(correct_b, f_b, 0.0)
  return jnp.where(st["both_arms"] & ~free_b, cost + bonus, 0.0).astype(
      jnp.float32
  )


def rm_reward(
    traj: types.Trajectory,
    *,
    transform: str = "sigmoid",
    ref: float = 0.0,
    temperature: float = 1.0,
    eta: float = 0.0,
) -> jax.Array:
  """A frozen learned reward model's episode score s, bounded.

  s = facts['rm_score'], the RM's episode logit written by the learner when
  `rl.reward_model_dir` is set (reward_models.frozen.trajectory_rm_outputs: the ORM
  score, or logit(P) of a process RM), mapped by the
  `transforms.SCORE_TRANSFORMS` entry `transform` ('sigmoid', 'tanh', 'clip' or
  'none'; see `transforms.bounded_score`).

  Returns:
    [B] float32.

  Raises:
    ValueError: unknown transform (at trace time; validated with the config).
  """
  return transforms.bounded_score(
      transform,
      traj.facts["rm_score"],
      ref=ref,
      temperature=temperature,
      eta=eta,
  )


REWARD_COMPONENTS: dict[str, RewardFn] = {
    "correct": correct_reward,
    "call_score": call_score_reward,
    "format": format_reward,
    "otc": otc_reward,
    "tool_cost": tool_cost_reward,
    "failed_call_penalty": failed_call_penalty_reward,
    "gated_relative_efficiency": gated_relative_efficiency_reward,
    "tool_bonus": tool_bonus_reward,
    "dual_path_efficiency": dual_path_efficiency_reward,
    # Learned reward model (needs rl.reward_model_dir; see rm_reward).
    "rm": rm_reward,
}
# ToolRL / TIER call-matching components over schema-call facts (call_rewards.py).
REWARD_COMPONENTS.update(call_rewards.CALL_REWARD_COMPONENTS)


def _param_defaults(fn: RewardFn) -> dict[str, Any]:
  return {
      p.name: p.default
      for p in inspect.signature(fn).parameters.values()
      if p.kind == inspect.Parameter.KEYWORD_ONLY
  }


# Component name -> {param: default}; the config-facing `params` of each.
REWARD_PARAM_DEFAULTS: dict[str, dict[str, Any]] = {
    name: _param_defaults(fn) for name, fn in REWARD_COMPONENTS.items()
}
