"""Reward components (functions of environment facts) and their composition.

A component maps the trajectory's env facts and finish reasons to a [B] float32
reward, `fn(traj, **params)`. Components are composed by a weighted sum, a
product (all-or-nothing) or per-component group normalisation (GDPO); weights
may follow a schedule over training steps, and the composed reward may be
corrupted by label noise for robustness studies (docs/rewards_and_credit.md). Each
component is also returned separately (unweighted) so it can be logged.

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

Non-finite inputs (`sanitize_facts`): the composed reward never is NaN or
inf because of a fact. `make_reward_fn`'s reward reads every floating fact with
its NaN / +-inf entries replaced by 0 (for 'call_score' and the call_*_frac
facts: no credit, their minimum; for 'rm_score': the RM's neutral logit 0),
and `compose` treats a non-finite component value as 0 ('sum', 'product') or
leaves it out of its group's statistics with z = 0 ('gdpo'). The learner logs
how many fact entries were replaced (`nonfinite_fact_counts`, summed over the
batch: metric 'reward_nonfinite_inputs') and reads the PBRS potentials
('progress', 'rm_potential') through `finite_or_zero` too.

m_i = facts['num_tool_calls'], e_i = facts['num_tool_errors']. Group
statistics use segment ops on the int32 `traj.group` ids (never row order), so
group ids must lie in [0, B) (see `advantages.group_ids_from_keys`).

Also here: bounded transforms for learned/step rewards (`clip_transform`,
`delta_transform`, `min_form_values`, `saturating_transform`,
`gated_accumulation`), per-turn step rewards through those transforms
(`step_turn_rewards`, `min_form_turn_rewards`; `rl.step_reward`), reward noise (`flip_rewards`, `dither_rewards`),
composition (`compose`, `COMPOSITIONS`), weight schedules (`schedule_value`,
`SCHEDULE_KINDS`) and a Lagrangian multiplier update (`dual_ascent_update`).
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping

import chex
import jax
import jax.numpy as jnp

from agentic_rl import advantages
from agentic_rl import call_rewards
from agentic_rl import types

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


def finite_or_zero(x: jax.Array) -> jax.Array:
  """`x` with its NaN / +-inf entries replaced by 0 (same shape and dtype)."""
  x = jnp.asarray(x)
  return jnp.where(jnp.isfinite(x), x, jnp.zeros((), x.dtype))


_finite_or_zero = finite_or_zero


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
      out[k] = _finite_or_zero(v)
    else:
      out[k] = v
  return out


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
  in `make_reward_fn(..., schedules={'tool_bonus': {...}})` (inferred recipe).

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
  host function-calling environments (environments/host/bfcl.py).

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
  `rl.reward_model_dir` is set (reward_models.trajectory_rm_outputs: the ORM
  score, or logit(P) of a process RM), mapped by the `SCORE_TRANSFORMS` entry
  `transform` ('sigmoid', 'tanh', 'clip' or 'none'; see `bounded_score`).

  Returns:
    [B] float32.

  Raises:
    ValueError: unknown transform (at trace time; validated with the config).
  """
  return bounded_score(
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


# ---------------------------------------------------------------------------
# Bounded transforms for learned / step rewards.
# ---------------------------------------------------------------------------


def clip_transform(r_k: jax.Array, eta: float | jax.Array) -> jax.Array:
  """Clipping refinement r'_k = min(r_k - eta, 0) (inferred form).

  "Clipping" of Gao et al., "On Designing Effective RL Reward at Training Time
  for LLM Reasoning" (docs/papers.md; formula inferred, recalled from
  the full paper): every step reward is <= 0, so repeating steps can never
  raise the return; the cumulative reward of any trajectory is bounded above
  by 0.

  Args:
    r_k: any-shape float rewards (e.g. [B, K] per-turn PRM scores).
    eta: threshold, scalar or broadcastable to r_k.

  Returns:
    float32 array of r_k's shape, <= 0. Masking is the caller's job.
  """
  r = jnp.asarray(r_k, jnp.float32)
  return jnp.minimum(r - eta, 0.0).astype(jnp.float32)


def delta_transform(
    r_k: jax.Array, mask_k: jax.Array, keep_last: bool = True
) -> jax.Array:
  """Delta refinement r'_k = r_k - r_{next(k)}; the last valid turn keeps r_k.

  "Delta" of Gao et al., "On Designing Effective RL Reward at Training Time for
  LLM Reasoning" (docs/papers.md; formula inferred). next(k) is the
  next VALID turn after k (the next position for the usual prefix mask). The
  sum telescopes: sum_k r'_k = r_{first valid turn}, bounded whatever the
  number of turns; the reward-to-go from turn k is r_k. With
  keep_last=False the last valid turn gets 0 instead (the paper's figure and
  our reading of it: sum_k r'_k = r_first - r_last; the reward-to-go from
  turn k is r_k - r_last).

  Args:
    r_k: [..., K] float step rewards (turns on the last axis).
    mask_k: [..., K] bool (or 0/1) valid turns, same shape.
    keep_last: Python bool; see above.

  Returns:
    [..., K] float32, 0 at invalid turns.

  Raises:
    AssertionError: (chex) if shapes differ.
  """
  chex.assert_equal_shape([r_k, mask_k])
  m = jnp.moveaxis(jnp.asarray(mask_k).astype(jnp.bool_), -1, 0)
  r = jnp.moveaxis(jnp.asarray(r_k, jnp.float32), -1, 0)
  r = jnp.where(m, r, 0.0)

  def step(carry, xs):
    next_r, has_next = carry
    r_t, m_t = xs
    if keep_last:
      out = jnp.where(m_t, r_t - jnp.where(has_next, next_r, 0.0), 0.0)
    else:
      out = jnp.where(m_t & has_next, r_t - next_r, 0.0)
    carry = (jnp.where(m_t, r_t, next_r), has_next | m_t)
    return carry, out

  init = (jnp.zeros(r.shape[1:], jnp.float32), jnp.zeros(r.shape[1:], bool))
  _, out = jax.lax.scan(step, init, (r, m), reverse=True)
  return jnp.moveaxis(out, 0, -1)


def min_form_values(r_k: jax.Array, mask_k: jax.Array) -> jax.Array:
  """PURE min-form credit V_k = min_{j >= k, j valid} r_j (inferred form).

  Cheng et al., "Stop Summation: Min-Form Credit Assignment Is All Process
  Reward Model Needs for Reasoning" (PURE, docs/papers.md; formula
  inferred): the value of turn k is the minimum of the future process rewards
  instead of their (discounted) sum, which bounds the value range by the range
  of r and removes the incentive to add steps.

  Args:
    r_k: [..., K] float step rewards (turns on the last axis).
    mask_k: [..., K] bool (or 0/1) valid turns, same shape.

  Returns:
    [..., K] float32 values, 0 at invalid turns.

  Raises:
    AssertionError: (chex) if shapes differ.
  """
  chex.assert_equal_shape([r_k, mask_k])
  m = jnp.asarray(mask_k).astype(jnp.bool_)
  r = jnp.where(m, jnp.asarray(r_k, jnp.float32), jnp.inf)
  v = jax.lax.cummin(r, axis=r.ndim - 1, reverse=True)
  return jnp.where(m, v, 0.0).astype(jnp.float32)


def saturating_transform(
    r: jax.Array,
    ref: float | jax.Array = 0.0,
    temperature: float | jax.Array = 1.0,
) -> jax.Array:
  """Bounded, centred reward sigma((r - ref) / temperature) in (0, 1).

  PAR, "Preference As Reward" (Fu et al., "Reward Shaping to Mitigate Reward
  Hacking in RLHF", docs/papers.md; inferred form sigma(r - r_ref)): bounded,
  grows fast near the reference then saturates, a function of the centred
  reward. temperature generalises the unit scale.

  Args:
    r: any-shape float rewards (e.g. a learned RM score).
    ref: reference reward (scalar or broadcastable).
    temperature: > 0 scale.

  Returns:
    float32 array of r's shape, in (0, 1).
  """
  x = (jnp.asarray(r, jnp.float32) - ref) / temperature
  return jax.nn.sigmoid(x).astype(jnp.float32)


# Bounded maps of a learned score s [B] (e.g. a frozen reward model's logit)
# to a reward. Uniform signature of an entry: fn(s_b float32 [B], *, ref,
# temperature, eta) -> [B] float32; arguments an entry does not use are
# ignored. Used by the `rm` reward component (`rm_reward`) and by
# reward_models.rm_score_to_reward; config name
# `rl.reward_params.rm.transform`.
ScoreTransformFn = Callable[..., jax.Array]


def _score_sigmoid(s_b, *, ref, temperature, eta):
  """sigma((s - ref) / temperature) in (0, 1): `saturating_transform` (PAR,
  Fu et al., "Reward Shaping to Mitigate Reward Hacking in RLHF"; inferred)."""
  del eta
  return saturating_transform(s_b, ref, temperature)


def _score_tanh(s_b, *, ref, temperature, eta):
  """tanh((s - ref) / temperature) in (-1, 1)."""
  del eta
  return jnp.tanh((s_b - ref) / temperature).astype(jnp.float32)


def _score_clip(s_b, *, ref, temperature, eta):
  """min(s - eta, 0) <= 0: `clip_transform` (Gao et al., arXiv:2410.15115)."""
  del ref, temperature
  return clip_transform(s_b, eta)


def _score_none(s_b, *, ref, temperature, eta):
  """s unchanged (float32)."""
  del ref, temperature, eta
  return s_b


SCORE_TRANSFORMS: dict[str, ScoreTransformFn] = {
    "sigmoid": _score_sigmoid,
    "tanh": _score_tanh,
    "clip": _score_clip,
    "none": _score_none,
}
RM_TRANSFORMS = tuple(SCORE_TRANSFORMS)


def bounded_score(
    name: str,
    s_b: jax.Array,
    *,
    ref: float = 0.0,
    temperature: float = 1.0,
    eta: float = 0.0,
) -> jax.Array:
  """A learned score mapped by the `SCORE_TRANSFORMS` entry `name`.

  Args:
    name: 'sigmoid', 'tanh', 'clip' or 'none' (a Python str).
    s_b: [B] float scores (cast to float32 first).
    ref, temperature: centre and scale (> 0) of 'sigmoid' and 'tanh'.
    eta: threshold of 'clip'.

  Returns:
    [B] float32.

  Raises:
    ValueError: unknown transform name.
  """
  if name not in SCORE_TRANSFORMS:
    raise ValueError(f"transform={name!r}: unknown; known: {RM_TRANSFORMS}")
  s = jnp.asarray(s_b, jnp.float32)
  return SCORE_TRANSFORMS[name](s, ref=ref, temperature=temperature, eta=eta)


def gated_accumulation(
    outcome_b: jax.Array,
    step_rewards_bk: jax.Array,
    mask_bk: jax.Array,
    threshold: float | jax.Array,
) -> jax.Array:
  """G-RA: R_b = o_b + 1[o_b >= tau] * sum_k m_bk r_bk (inferred form).

  Gated Reward Accumulation (docs/papers.md; form inferred from
  "accumulates immediate rewards only when high-level rewards meet a
  predefined threshold"): step rewards count only for episodes whose outcome
  reward reaches the threshold, so they cannot be hacked at the expense of the
  goal.

  Args:
    outcome_b: [B] float high-level (outcome) reward.
    step_rewards_bk: [B, K] float step rewards.
    mask_bk: [B, K] bool (or 0/1) valid turns.
    threshold: tau, scalar.

  Returns:
    [B] float32.

  Raises:
    AssertionError: (chex) on rank/shape mismatch.
  """
  chex.assert_rank(outcome_b, 1)
  chex.assert_rank([step_rewards_bk, mask_bk], 2)
  chex.assert_equal_shape([step_rewards_bk, mask_bk])
  chex.assert_equal_shape_prefix([outcome_b, step_rewards_bk], 1)
  o = jnp.asarray(outcome_b, jnp.float32)
  m = jnp.asarray(mask_bk).astype(jnp.bool_)
  acc = jnp.sum(
      jnp.where(m, jnp.asarray(step_rewards_bk, jnp.float32), 0.0), axis=1
  )
  return (o + jnp.where(o >= threshold, acc, 0.0)).astype(jnp.float32)


# ---------------------------------------------------------------------------
# Per-turn step (process) rewards and their bounded transforms.
# ---------------------------------------------------------------------------

# `rl.step_reward`: where the per-turn step score p_k in [0, 1] comes from.
# 'valid_call': p_k = 1 for a well-formed tool call that returned a value (env
# fact 'valid_call_turn' [K]), 0 for any other call; repeats are paid again,
# so the score is hackable by design (experiments/step_hacking).
STEP_REWARDS = ("none", "valid_call", "prm")


def masked_quantile(
    x_bk: jax.Array, mask_bk: jax.Array, q: float | jax.Array
) -> jax.Array:
  """The q-quantile of the entries of x where mask is True (linear
  interpolation between order statistics, numpy's default 'linear' method).

  Used as the Clip threshold eta of `rl.step_reward_clip_quantile`: eta is a
  quantile of the batch's step scores, so that a fixed share of steps falls
  below it whatever the PRM's calibration (Gao et al., arXiv:2410.15115, set
  the Clip threshold from the distribution of PRM rewards).

  Args:
    x_bk: float array (any shape).
    mask_bk: bool array of x's shape.
    q: quantile in [0, 1].

  Returns:
    float32 scalar; 0.0 when no entry is masked in.
  """
  x = jnp.asarray(x_bk, jnp.float32).reshape(-1)
  m = jnp.asarray(mask_bk, jnp.bool_).reshape(-1)
  n = jnp.sum(m)
  # Masked-out entries sort last (+inf); order statistics 0..n-1 are real.
  srt = jnp.sort(jnp.where(m, x, jnp.inf))
  pos = jnp.asarray(q, jnp.float32) * jnp.maximum(n - 1, 0).astype(jnp.float32)
  lo = jnp.floor(pos).astype(jnp.int32)
  hi = jnp.minimum(lo + 1, jnp.maximum(n - 1, 0))
  frac = pos - lo.astype(jnp.float32)
  v_lo, v_hi = srt[lo], srt[hi]
  out = v_lo + frac * (v_hi - v_lo)
  return jnp.where(n > 0, out, 0.0).astype(jnp.float32)


def min_form_turn_rewards(
    p_bk: jax.Array, scored_bk: jax.Array, turn_mask_bk: jax.Array
) -> jax.Array:
  """Per-turn rewards whose undiscounted reward-to-go is PURE's min-form value.

  Cheng et al., "Stop Summation: Min-Form Credit Assignment Is All Process
  Reward Model Needs for Reasoning" (PURE, arXiv:2504.15275; docs/papers.md,
  form inferred there as V(s_t) = min_{k >= t} r_k). Here
  V_k = min_{j >= k, j scored} p_j over the scored turns at or after turn k,
  and V_k = 0 when no scored turn follows (e.g. the final answer turn); the
  returned rewards are r'_k = V_k - V_{k+1} (V_K = 0), so that
  sum_{j >= k} r'_j = V_k exactly (discount 1). Unlike `min_form_values`,
  a valid but unscored turn gets the min over the scored turns AFTER it, not 0
  (the two agree on scored turns).

  Args:
    p_bk: [B, K] float step scores.
    scored_bk: [B, K] bool (or 0/1) turns that carry a step score (a subset of
      the valid turns).
    turn_mask_bk: [B, K] bool (or 0/1) valid turns, a prefix per row.

  Returns:
    [B, K] float32 rewards, 0 at invalid turns.

  Raises:
    AssertionError: (chex) on rank/shape mismatch.
  """
  chex.assert_rank([p_bk, scored_bk, turn_mask_bk], 2)
  chex.assert_equal_shape([p_bk, scored_bk, turn_mask_bk])
  m = jnp.asarray(turn_mask_bk).astype(jnp.bool_)
  s = jnp.asarray(scored_bk).astype(jnp.bool_) & m
  r = jnp.where(s, jnp.asarray(p_bk, jnp.float32), jnp.inf)
  v = jax.lax.cummin(r, axis=1, reverse=True)
  v = jnp.where(jnp.isinf(v), 0.0, v)
  v_next = jnp.concatenate([v[:, 1:], jnp.zeros_like(v[:, :1])], axis=1)
  return jnp.where(m, v - v_next, 0.0).astype(jnp.float32)


# `rl.step_reward_transform`: how the scored steps enter the per-turn rewards.
# Uniform signature of an entry: fn(p_bk, scored_bk, turn_mask_bk, outcome_b,
# *, eta, gate_threshold) -> [B, K] float32 unscaled step rewards, where p_bk
# [B, K] float32 is already 0 off the scored turns, scored_bk and
# turn_mask_bk are [B, K] bool (scored is a subset of the valid turns) and
# outcome_b [B] is the episode's outcome reward. `step_turn_rewards` masks the
# result to the valid turns and multiplies it by the coefficient. A new
# transform is one function plus one entry here.
StepTransformFn = Callable[..., jax.Array]


def _step_sum(p, s, m, outcome_b, *, eta, gate_threshold):
  """'sum': s'_k = p_k, the naive sum-form process reward (unbounded)."""
  del s, m, outcome_b, eta, gate_threshold
  return p


def _step_clip(p, s, m, outcome_b, *, eta, gate_threshold):
  """'clip': s'_k = min(p_k - eta, 0) on scored turns (`clip_transform`;
  Gao et al., arXiv:2410.15115, inferred form)."""
  del m, outcome_b, gate_threshold
  return jnp.where(s, clip_transform(p, eta), 0.0)


def _step_delta(p, s, m, outcome_b, *, eta, gate_threshold):
  """'delta': s'_k = p_k - p_next(k), the last scored turn keeps p_k
  (`delta_transform`; arXiv:2410.15115, inferred form)."""
  del m, outcome_b, eta, gate_threshold
  return delta_transform(p, s)


def _step_delta_drop(p, s, m, outcome_b, *, eta, gate_threshold):
  """'delta_drop': as 'delta' but the last scored turn gets 0 (the paper's
  figure; arXiv:2410.15115)."""
  del m, outcome_b, eta, gate_threshold
  return delta_transform(p, s, keep_last=False)


def _step_min(p, s, m, outcome_b, *, eta, gate_threshold):
  """'min': PURE's min-form V_k - V_{k+1}, V_k = min_{j >= k} p_j
  (`min_form_turn_rewards`; arXiv:2504.15275)."""
  del outcome_b, eta, gate_threshold
  return min_form_turn_rewards(p, s, m)


def _step_gated(p, s, m, outcome_b, *, eta, gate_threshold):
  """'gated': s'_k = p_k 1[outcome_b >= gate_threshold] (G-RA, inferred)."""
  del s, m, eta
  gate_b = jnp.asarray(outcome_b, jnp.float32) >= gate_threshold
  return jnp.where(gate_b[:, None], p, 0.0)


STEP_TRANSFORMS: dict[str, StepTransformFn] = {
    "sum": _step_sum,
    "clip": _step_clip,
    "delta": _step_delta,
    "delta_drop": _step_delta_drop,
    "min": _step_min,
    "gated": _step_gated,
}
STEP_REWARD_TRANSFORMS = tuple(STEP_TRANSFORMS)


def step_turn_rewards(
    p_bk: jax.Array,
    scored_bk: jax.Array,
    turn_mask_bk: jax.Array,
    outcome_b: jax.Array,
    *,
    transform: str,
    coef: float | jax.Array,
    eta: float | jax.Array = 1.0,
    gate_threshold: float | jax.Array = 1.0,
) -> jax.Array:
  """Per-turn step rewards s'_bk added to the outcome reward before reward-to-go.

  p_k in [0, 1] is a per-turn step (process) score, defined on the scored turns
  (e.g. every tool call); unscored turns get no step reward of their own. With
  c = coef and discount 1 (learner.token_advantages, `rl.credit='per_turn'`):

  | transform | s'_k                                   | source                   |
  |-----------|----------------------------------------|--------------------------|
  | sum       | c p_k                                  | naive sum-form PRM       |
  | clip      | c min(p_k - eta, 0)                    | Clipping |
  | delta     | c (p_k - p_next(k)); last scored: c p_k| Delta |
  | delta_drop| c (p_k - p_next(k)); last scored: 0    | Delta, paper's figure    |
  | min       | c (V_k - V_{k+1}), V_k = min_{j>=k} p_j| PURE min-form |
  | gated     | c p_k 1[outcome_b >= gate_threshold]   | G-RA             |

  Clipping / Delta: Gao et al., "On Designing Effective RL Reward at Training
  Time for LLM Reasoning", arXiv:2410.15115 (docs/papers.md; both
  forms inferred from the abstract, see `clip_transform`, `delta_transform`). The
  sum of step rewards of an episode is then <= 0 (clip) or c p_first (delta),
  whatever the number of steps; the reward-to-go from scored turn k is c p_k
  for delta. PURE: arXiv:2504.15275 (`min_form_turn_rewards`); the step part
  of the return from turn k is c min_{j >= k} p_j. G-RA (docs/papers.md,
  inferred): R = o + 1[o >= tau] sum_k c p_k, delivered per turn
  (`gated_accumulation` is its episode total). 'sum' and 'gated' are not
  bounded: every extra scored step with p > 0 adds c p.

  Args:
    p_bk: [B, K] float step scores (0 off the scored turns is fine).
    scored_bk: [B, K] bool turns with a step score.
    turn_mask_bk: [B, K] bool valid turns (a prefix per row).
    outcome_b: [B] float outcome reward (read by 'gated' only).
    transform: a key of `STEP_TRANSFORMS` (= STEP_REWARD_TRANSFORMS).
    coef: c, the step-reward coefficient (reward units per unit score).
    eta: clip threshold in score units ('clip' only).
    gate_threshold: tau ('gated' only).

  Returns:
    [B, K] float32 per-turn step rewards, 0 at invalid turns.

  Raises:
    ValueError: unknown transform.
    AssertionError: (chex) on rank/shape mismatch.
  """
  if transform not in STEP_REWARD_TRANSFORMS:
    raise ValueError(
        f"step_turn_rewards: transform={transform!r}; known: "
        f"{STEP_REWARD_TRANSFORMS}"
    )
  chex.assert_rank([p_bk, scored_bk, turn_mask_bk], 2)
  chex.assert_equal_shape([p_bk, scored_bk, turn_mask_bk])
  chex.assert_rank(outcome_b, 1)
  chex.assert_equal_shape_prefix([outcome_b, p_bk], 1)
  m = jnp.asarray(turn_mask_bk).astype(jnp.bool_)
  s = jnp.asarray(scored_bk).astype(jnp.bool_) & m
  p = jnp.where(s, jnp.asarray(p_bk, jnp.float32), 0.0)
  out = STEP_TRANSFORMS[transform](
      p, s, m, outcome_b, eta=eta, gate_threshold=gate_threshold
  )
  return jnp.where(m, coef * out, 0.0).astype(jnp.float32)


# ---------------------------------------------------------------------------
# Reward noise.
# ---------------------------------------------------------------------------


def flip_rewards(
    key: jax.Array,
    r_b: jax.Array,
    p: float | jax.Array,
    low: float = 0.0,
    high: float = 1.0,
) -> jax.Array:
  """Symmetric label noise on a binary reward: r -> low + high - r w.p. p.

  Each entry is flipped independently with probability p (Bernoulli(p) from
  `key`); a flip swaps low <-> high. Entries not in {low, high} are mapped by
  the same affine reflection.

  Args:
    key: PRNG key.
    r_b: any-shape float rewards with values in {low, high}.
    p: flip probability in [0, 1].
    low, high: the two reward levels.

  Returns:
    float32 array of r_b's shape.
  """
  r = jnp.asarray(r_b, jnp.float32)
  flip = jax.random.uniform(key, r.shape) < p
  return jnp.where(flip, low + high - r, r).astype(jnp.float32)


def dither_rewards(
    key: jax.Array, r_b: jax.Array, sigma: float | jax.Array
) -> jax.Array:
  """Additive Gaussian reward noise r + sigma * N(0, 1).

  Args:
    key: PRNG key.
    r_b: any-shape float rewards.
    sigma: noise std (>= 0).

  Returns:
    float32 array of r_b's shape.
  """
  r = jnp.asarray(r_b, jnp.float32)
  return (r + sigma * jax.random.normal(key, r.shape, jnp.float32)).astype(
      jnp.float32
  )


# ---------------------------------------------------------------------------
# Composition.
# ---------------------------------------------------------------------------

COMPOSITIONS = ("sum", "product", "gdpo")


def compose(
    parts: Mapping[str, jax.Array],
    weights: Mapping[str, float | jax.Array],
    mode: str,
    group_b: jax.Array | None = None,
    eps: float = 1e-6,
) -> jax.Array:
  """Composes named [B] components into one [B] reward.

  Components used are the keys of `weights` (each must be in `parts`):

  A non-finite component value (NaN, +-inf) counts as 0 in 'sum' and
  'product'; in 'gdpo' it is left out of its group's mean and std and its z is
  0, so the other rows of that group keep finite values.

  - 'sum': R = sum_c w_c r_c.
  - 'product': R = prod_{c: w_c != 0} r_c. Each factor must lie in [0, 1]
    (not checked: values are traced), so any failed factor zeros the reward;
    weights are otherwise ignored (0 drops a component; a traced 0 also
    drops it). ToolRLA multiplicative decomposition (docs/papers.md; inferred
    R = f s p c). Needs non-negative factors: `tool_cost` and
    `failed_call_penalty` do not qualify.
  - 'gdpo': R = sum_c w_c z_g(r_c), z_g(x)_i = (x_i - mean_g x) / (std_g x +
    eps), population std over the row's group; a component that is constant
    within a group contributes exactly 0 there. GDPO per-reward decoupled
    normalisation as described by SMOPD (docs/papers.md; inferred form).
    Requires group_b. The result is already group-normalised; a GRPO
    estimator on top re-normalises it.

  Args:
    parts: name -> [B] float component values.
    weights: name -> weight (Python float or traced scalar).
    mode: one of COMPOSITIONS.
    group_b: [B] int32 group ids in [0, B); required for 'gdpo'.
    eps: added to the group std in 'gdpo'.

  Returns:
    [B] float32 reward.

  Raises:
    ValueError: unknown mode, empty weights, a weight naming a missing part,
      or 'gdpo' without group_b.
  """
  if mode not in COMPOSITIONS:
    raise ValueError(
        f"unknown reward composition {mode!r}; known: {COMPOSITIONS}"
    )
  if not weights:
    raise ValueError("compose: weights must name at least one component")
  for name in weights:
    if name not in parts:
      raise ValueError(
          f"compose: weight for {name!r} but no such part; parts: "
          f"{sorted(parts)}"
      )
  items = tuple(weights.items())
  if mode == "sum":
    return sum(w * _finite_or_zero(parts[name]) for name, w in items).astype(
        jnp.float32
    )
  if mode == "product":
    out = None
    for name, w in items:
      if isinstance(w, (int, float)) and w == 0:
        continue
      factor = _finite_or_zero(jnp.asarray(parts[name], jnp.float32))
      if not isinstance(w, (int, float)):
        factor = jnp.where(w == 0, 1.0, factor)
      out = factor if out is None else out * factor
    if out is None:
      b = jnp.shape(parts[items[0][0]])
      return jnp.ones(b, jnp.float32)
    return out.astype(jnp.float32)
  if group_b is None:
    raise ValueError("compose: mode 'gdpo' requires group_b")
  total = None
  for name, w in items:
    x = jnp.asarray(parts[name], jnp.float32)
    finite = jnp.isfinite(x)
    z = advantages.grpo_advantages(
        jnp.where(finite, x, 0.0), group_b, eps=eps, valid_b=finite
    )
    total = w * z if total is None else total + w * z
  return total.astype(jnp.float32)


# ---------------------------------------------------------------------------
# Schedules and dual ascent.
# ---------------------------------------------------------------------------

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


def dual_ascent_update(
    lam: float | jax.Array,
    observed: float | jax.Array,
    target: float | jax.Array,
    lr: float | jax.Array,
    lam_min: float = 0.0,
) -> jax.Array:
  """Projected dual ascent on a Lagrange multiplier for observed <= target.

  lam' = max(lam_min, lam + lr (observed - target)).

  Sign convention: the constrained problem max E[R] s.t. E[g] <= target has
  Lagrangian E[R] - lam (E[g] - target), so the policy's reward is
  R - lam g (e.g. lam as the per-call `tool_cost` c with g = tool calls per
  episode). lam grows while the constraint is violated (observed > target)
  and shrinks (down to lam_min >= 0) while it is slack. Standard projected
  subgradient ascent on the dual (e.g. Tessler et al., "Reward Constrained
  Policy Optimization", arXiv:1805.11074).

  Args:
    lam: current multiplier (scalar).
    observed: measured constraint statistic, e.g. mean calls per episode.
    target: the bound.
    lr: dual step size (> 0).
    lam_min: floor of the projection (default 0).

  Returns:
    float32 scalar (or broadcast shape of the inputs).
  """
  lam = jnp.asarray(lam, jnp.float32)
  upd = lam + lr * (jnp.asarray(observed, jnp.float32) - target)
  return jnp.maximum(lam_min, upd).astype(jnp.float32)


# ---------------------------------------------------------------------------
# Factory.
# ---------------------------------------------------------------------------

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
        name: _finite_or_zero(
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
