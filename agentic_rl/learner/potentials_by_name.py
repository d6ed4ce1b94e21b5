"""PBRS potentials Phi(s_k) [B, K + 1] by name (`rl.pbrs_potential`).

`POTENTIALS` maps each name to a function `fn(ctx: PotentialContext) ->
[B, K + 1] float32`, the unscaled potential of the states s_0 .. s_K (s_k =
the context after k turns, `credit.state_ends`); the learner multiplies it by
`rl.pbrs_coef` and shapes the rewards with it (`credit.shape_turn_rewards`,
Ng, Harada & Russell, ICML 1999). A potential that needs model calls reads
them from the context (the policy and its parameters, the reference
parameters, the SPA head, shared cached passes). Adding a potential = one
function here + one `POTENTIALS` entry; validation reads the valid names
from the table.
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


@dataclasses.dataclass
class PotentialContext:
  """Everything a potential may read, built once per batch by the collect stage.

  Attributes:
    rl_cfg: the `rl` config block.
    traj: the batch's trajectory ([B, L] tokens, role, turn; facts).
    graphdef: the policy's graph.
    params: the sampling parameters of the policy.
    ref_params: the reference model's parameters.
    spa: the SPA head (`types.SpaState`) or None.
    max_turns: K (static).
    temperature: the sampling temperature.
    gold_logp: [B, K + 1] float32 gold-answer log-probs when the collect
      stage computed them (`stages.shaping.gold_logprobs`); None computes
      them on first use.
    obs_scores: (prob_bl, hit_bl) when the collect stage computed them
      (`stages.shaping.observation_scores`); None computes them on first use.
    extras: outputs the RL step needs later (e.g. SPA's training inputs);
      an entry may add keys.
  """

  rl_cfg: Any
  traj: types.Trajectory
  graphdef: nnx.GraphDef
  params: Any
  ref_params: Any
  spa: Any
  max_turns: int
  temperature: float
  gold_logp: jax.Array | None = None
  obs_scores: tuple[jax.Array, jax.Array] | None = None
  extras: dict = dataclasses.field(default_factory=dict)
  _cache: dict = dataclasses.field(default_factory=dict)

  def gold_logprobs(self) -> jax.Array:
    """[B, K + 1] float32 log p_ref(gold answer | s_k), one batched pass of the
    reference model (`credit.gold_answer_logprobs`); computed once per batch
    (shared by the 'trace' potential and the likelihood reward)."""
    if self.gold_logp is not None:
      return self.gold_logp
    if "gold" not in self._cache:
      self._cache["gold"] = reference_gold_logprobs(
          self.graphdef,
          self.ref_params,
          self.traj,
          self.temperature,
          self.max_turns,
      )
    return self._cache["gold"]

  def observation_scores(self) -> tuple[jax.Array, jax.Array]:
    """(prob_bl, hit_bl) [B, L] of `credit.observation_prediction_scores` under
    the sampling policy; computed once per batch (shared by the
    'obs_prediction' potential and the dark-room diagnostics)."""
    if self.obs_scores is not None:
      return self.obs_scores
    if "obs" not in self._cache:
      self._cache["obs"] = credit.observation_prediction_scores(
          self.graphdef, self.params, self.traj.tokens, self.temperature
      )
    return self._cache["obs"]


PotentialFn = Callable[[PotentialContext], jax.Array]


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


def progress_potential(ctx: PotentialContext) -> jax.Array:
  """'progress': the environment's fact 'progress' [B, K + 1] (a non-finite
  entry reads as 0; `sanitize.finite_or_zero`)."""
  return sanitize.finite_or_zero(ctx.traj.facts["progress"])


def trace_potential(ctx: PotentialContext) -> jax.Array:
  """'trace': log p_ref(y* | s_k) - log p_ref(y* | s_0), the reference model's
  log-ratio of the gold answer (`credit.log_ratio_potential`; TRACE-style,
  inferred form). Needs env facts 'gold_answer', 'gold_answer_len'."""
  return credit.log_ratio_potential(ctx.gold_logprobs())


def value_head_potential(ctx: PotentialContext) -> jax.Array:
  """'value': V(s_k) of the policy's value head with the sampling parameters
  (`value_potential`); the head is trained on Monte-Carlo returns."""
  return value_potential(ctx.graphdef, ctx.params, ctx.traj, ctx.max_turns)


def spa_potential(ctx: PotentialContext) -> jax.Array:
  """'spa': Phi(s_k) = sum_{j<k} c_j of the learned SPA head on the policy's
  stop-gradient hidden states at the turn ends (SPA-RL, arXiv:2505.20732,
  inferred form; `credit.spa_potential`). Adds extras['spa'] = (features
  [B, K, D], turn mask [B, K], outcome [B]): the head is trained on this batch
  by the RL step."""
  t, k = ctx.traj, ctx.max_turns
  feat = credit.spa_policy_features(
      ctx.graphdef, ctx.params, t.tokens, t.role, t.turn, k
  )
  turn_mask = jnp.arange(k)[None, :] < t.num_turns[:, None]
  phi = credit.spa_potential(
      credit.spa_contributions(ctx.spa.params, feat), turn_mask
  )
  ctx.extras["spa"] = (feat, turn_mask, t.facts["correct"].astype(jnp.float32))
  return phi


def rm_potential(ctx: PotentialContext) -> jax.Array:
  """'rm': the frozen learned reward model's per-state potential, env fact
  'rm_potential' [B, K + 1] written by the collect stage
  (`reward_models.frozen.trajectory_rm_outputs`); a non-finite entry reads as 0.
  """
  return sanitize.finite_or_zero(ctx.traj.facts["rm_potential"])


def obs_prediction_potential(ctx: PotentialContext) -> jax.Array:
  """'obs_prediction': the sampling policy's mean probability of the
  observation (TOOL) tokens in s_k (`credit.observation_prediction_potential`;
  the "dark room" study)."""
  prob_bl, _ = ctx.observation_scores()
  return credit.observation_prediction_potential(
      prob_bl, ctx.traj.role, ctx.traj.turn, ctx.max_turns
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
  with `rl.pbrs_coef` > 0): the head lives in `TrainState.spa`."""
  return rl_cfg.pbrs_potential == "spa" and pbrs_on(rl_cfg)


def compute_potential(ctx: PotentialContext) -> jax.Array | None:
  """[B, K + 1] float32 unscaled potential of `rl.pbrs_potential` from
  `POTENTIALS`, or None when PBRS is off (`rl.pbrs_coef` = 0).

  Raises:
    ValueError: unknown `rl.pbrs_potential` (validation catches it first).
  """
  if not pbrs_on(ctx.rl_cfg):
    return None
  name = ctx.rl_cfg.pbrs_potential
  if name not in POTENTIALS:
    raise ValueError(
        f"rl.pbrs_potential={name!r}: unknown; known: " f"{tuple(POTENTIALS)}"
    )
  return POTENTIALS[name](ctx)
