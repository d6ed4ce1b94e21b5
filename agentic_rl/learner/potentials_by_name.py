"""PBRS potentials Phi(s_k) [B, K + 1] by name (`rl.pbrs_potential`).

`POTENTIALS` maps each name to a function `fn(r: Rollout, ctx:
PotentialContext) -> Rollout` that sets `r.phi`, the unscaled potential
[B, K + 1] float32 of the states s_0 .. s_K (s_k = the context after k
turns, `credit.state_ends`); the learner multiplies it by `rl.pbrs_coef` and
shapes the rewards with it (`credit.shape_turn_rewards`, Ng, Harada &
Russell, ICML 1999). A potential reads the batch and the shared passes from
the Rollout (`gold_logp`, `obs_prob`: set by the collect stages before it)
and the policy, its sampling parameters, the SPA head and K from the
context; one that hands something to the RL step sets its Rollout field
(SPA: `spa_inputs`). Adding a potential = one function here + one
`POTENTIALS` entry; validation reads the valid names from the table.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx

from agentic_rl import credit
from agentic_rl.rewards import sanitize
from agentic_rl import sampling
from agentic_text import tokenizers
from agentic_rl import types
from agentic_rl.learner.batch import Rollout, SpaInputs


@dataclasses.dataclass(frozen=True)
class PotentialContext:
  """The model-side inputs of a potential, built once per batch by collect.

  Attributes:
    graphdef: the policy's graph.
    params: the sampling parameters of the policy.
    spa: the SPA head (`types.SpaState`) or None.
    max_turns: K (static).
  """

  graphdef: nnx.GraphDef
  params: Any
  spa: Any
  max_turns: int


PotentialFn = Callable[[Rollout, PotentialContext], Rollout]


def reference_gold_logprobs(
    graphdef: nnx.GraphDef,
    ref_params,
    traj: types.Trajectory,
    temperature: float,
    max_turns: int,
) -> jax.Array:
  """[B, K + 1] float32 log p_ref(gold answer | s_k), k = 0 .. K.

  One batched teacher-forced pass of the reference model
  (`credit.gold_answer_logprobs`, `sampling.token_logprobs` at
  `temperature`) over the gold answer appended, after the answer tag, to
  the context after each turn.

  Args:
    graphdef, ref_params: the reference model.
    traj: the batch ([B, L] tokens, role, turn; facts 'gold_answer' [B, A]
      int32 and 'gold_answer_len' [B] int32).
    temperature: the sampling temperature.
    max_turns: K (static).

  Raises:
    KeyError: the facts lack 'gold_answer' or 'gold_answer_len'.
  """
  t = traj

  def logprob_fn(x):
    return sampling.token_logprobs(graphdef, ref_params, x, temperature)[0]

  return credit.gold_answer_logprobs(
      logprob_fn,
      t.tokens,
      t.role,
      t.turn,
      t.facts["gold_answer"],
      t.facts["gold_answer_len"],
      num_turns=max_turns,
      answer_prefix=(tokenizers.ANSWER,),
      pad_id=tokenizers.PAD,
  )


def value_potential(
    graphdef: nnx.GraphDef, params, traj: types.Trajectory, max_turns: int
) -> jax.Array:
  """[B, K + 1] PBRS potential Phi(s_k) = V(s_k) from the policy's value head.

  s_k is the context after k turns (`credit.state_ends`: the prompt plus
  turns 0 .. k-1 and their observations); V(s_k) is the value head read at
  the last token of s_k (one forward over the full trajectory; the value
  after token t depends on tokens 0..t only). For k past the last turn it is
  the value of the whole episode; PBRS then sets Phi(terminal) = 0 for
  terminated episodes (credit.shape_turn_rewards). Gradient-free (the
  potential is part of the reward).

  Args:
    graphdef, params: the policy (TransformerConfig.value_head=True).
    traj: the batch (tokens, role, turn).
    max_turns: K.
  """
  model = nnx.merge(graphdef, params)
  hidden_bld, _ = model.hidden_states(traj.tokens)
  v_bl = model.value(hidden_bld)
  end_bk1 = credit.state_ends(traj.role, traj.turn, max_turns)
  idx = jnp.clip(end_bk1 - 1, 0, traj.tokens.shape[1] - 1)
  return jax.lax.stop_gradient(jnp.take_along_axis(v_bl, idx, axis=1))


def progress_potential(r: Rollout, ctx: PotentialContext) -> Rollout:
  """'progress': the environment's fact 'progress' [B, K + 1] (a non-finite
  entry reads as 0; `sanitize.finite_or_zero`)."""
  del ctx
  return r.replace(phi=sanitize.finite_or_zero(r.traj.facts["progress"]))


def trace_potential(r: Rollout, ctx: PotentialContext) -> Rollout:
  """'trace': log p_ref(y* | s_k) - log p_ref(y* | s_0), the reference model's
  log-ratio of the gold answer (`credit.log_ratio_potential`; TRACE-style,
  inferred form). Reads r.gold_logp (`stages.shaping.gold_logprobs`; env
  facts 'gold_answer', 'gold_answer_len')."""
  del ctx
  return r.replace(phi=credit.log_ratio_potential(r.gold_logp))


def value_head_potential(r: Rollout, ctx: PotentialContext) -> Rollout:
  """'value': V(s_k) of the policy's value head with the sampling parameters
  (`value_potential`); the head is trained on Monte-Carlo returns."""
  return r.replace(
      phi=value_potential(ctx.graphdef, ctx.params, r.traj, ctx.max_turns)
  )


def spa_potential(r: Rollout, ctx: PotentialContext) -> Rollout:
  """'spa': Phi(s_k) = sum_{j<k} c_j of the learned SPA head on the policy's
  stop-gradient hidden states at the turn ends (SPA-RL, arXiv:2505.20732,
  inferred form; `credit.spa_potential`). Also sets r.spa_inputs (features
  [B, K, D], turn mask [B, K], outcome [B]): the head is trained on this batch
  by the RL step."""
  t, k = r.traj, ctx.max_turns
  feat = credit.spa_policy_features(
      ctx.graphdef, ctx.params, t.tokens, t.role, t.turn, k
  )
  turn_mask = jnp.arange(k)[None, :] < t.num_turns[:, None]
  phi = credit.spa_potential(
      credit.spa_contributions(ctx.spa.params, feat), turn_mask
  )
  spa_inputs = SpaInputs(
      features=feat,
      turn_mask=turn_mask,
      outcome=t.facts["correct"].astype(jnp.float32),
  )
  return r.replace(phi=phi, spa_inputs=spa_inputs)


def rm_potential(r: Rollout, ctx: PotentialContext) -> Rollout:
  """'rm': the frozen learned reward model's per-state potential, env fact
  'rm_potential' [B, K + 1] written by the collect stage
  (`reward_models.frozen.trajectory_rm_outputs`); a non-finite entry reads as 0.
  """
  del ctx
  return r.replace(phi=sanitize.finite_or_zero(r.traj.facts["rm_potential"]))


def obs_prediction_potential(r: Rollout, ctx: PotentialContext) -> Rollout:
  """'obs_prediction': the sampling policy's mean probability of the
  observation (TOOL) tokens in s_k (`credit.observation_prediction_potential`;
  the "dark room" study). Reads r.obs_prob
  (`stages.shaping.observation_scores`)."""
  return r.replace(
      phi=credit.observation_prediction_potential(
          r.obs_prob, r.traj.role, r.traj.turn, ctx.max_turns
      )
  )


POTENTIALS: dict[str, PotentialFn] = {
    "progress": progress_potential,
    "trace": trace_potential,
    "value": value_head_potential,
    "spa": spa_potential,
    "rm": rm_potential,
    "obs_prediction": obs_prediction_potential,
}


def pbrs_on(rl_cfg) -> bool:
  """True when PBRS shaping is on (`rl.pbrs_coef` > 0)."""
  return rl_cfg.pbrs_coef > 0


def uses_spa(rl_cfg) -> bool:
  """True when PBRS uses the learned SPA potential (`rl.pbrs_potential='spa'`
  with `rl.pbrs_coef` > 0): the head lives in `TrainState.features['spa']`."""
  return rl_cfg.pbrs_potential == "spa" and pbrs_on(rl_cfg)
