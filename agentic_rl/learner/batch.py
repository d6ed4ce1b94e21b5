"""Typed containers of one RL iteration's collect stages.

`Rollout` is what the stages of `make_collect_fn` know about the batch: the
sampling stages set its required fields, every later stage sets the optional
field(s) named in its comment (None until then). `LearnerBatch` is what the
update reads, `SilSample` and `SpaInputs` are the batches of the
self-imitation loss and of the SPA head, and `StageContext` holds the
per-iteration inputs every stage may read (keys, parameters, feature states).

Shapes: B rows (episodes), L tokens, K = env.max_turns turns, S replayed
episodes, D the model width.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Mapping

import flax.struct
import jax

if TYPE_CHECKING:  # annotations only
  from agentic_rl import types


def _name_sorted_pytree(cls):
  """Registers the frozen dataclass `cls` as a pytree whose leaves flatten in
  sorted field-name order (not declaration order), and gives it `replace`.

  `LearnerBatch` and `SilSample` replace dicts, which JAX flattens by sorted
  key: the split into minibatches (`jax.tree.map`), the `lax.scan` and
  `lax.switch` operands and the trimmed buckets then keep the dicts' leaf
  order, so the lowered program is the same as with the dicts. A field that is None is an
  empty subtree (as an absent key was).
  """
  names = sorted(f.name for f in dataclasses.fields(cls))
  cls.replace = lambda self, **changes: dataclasses.replace(self, **changes)
  return jax.tree_util.register_dataclass(
      cls, data_fields=names, meta_fields=[]
  )


@_name_sorted_pytree
@dataclasses.dataclass(frozen=True)
class SilSample:
  """Replayed episodes for the self-imitation loss (SPEAR / SIL).

  A pytree whose leaves flatten in sorted field-name order (baseline, mask,
  returns, tokens, valid: the order of the dict it replaced).

  Attributes:
    tokens: [S, L] int32 episode tokens of the sampled buffer slots.
    mask: [S, L] bool, their POLICY tokens.
    returns: [S] float32 reward each episode got when it was stored.
    baseline: [S] float32 the current policy's baseline on its task
      (`replay.sil_baselines`).
    valid: [S] bool, whether the sampled slot holds an episode.
  """

  tokens: jax.Array
  mask: jax.Array
  returns: jax.Array
  baseline: jax.Array
  valid: jax.Array


@flax.struct.dataclass
class SpaInputs:
  """The SPA head's training batch (`credit.spa_update`).

  Attributes:
    features: [B, K, D] float32 stop-gradient hidden states at the turn ends.
    turn_mask: [B, K] bool, the turns each episode took.
    outcome: [B] float32 episode outcome (facts 'correct').
  """

  features: jax.Array
  turn_mask: jax.Array
  outcome: jax.Array


@flax.struct.dataclass
class Rollout:
  """What the stages of one RL iteration know about the batch.

  The required fields are set by the sampling stages; every optional field is
  None until the stage named in its comment sets it. `reward` is rewritten
  by several stages, in this order: environment reward, soft overlong
  penalty, overlong mode, likelihood reward, dual penalty, replay injection,
  KL-in-reward, telescoped PBRS (inside the advantage estimator).

  Attributes:
    traj: the fresh batch (rollout, frozen-RM facts, dynamic sampling).
    reward: [B] float32, the running reward.
    parts: {name: [B] float32} the reward's components (`rl.rewards`).
    info: {name: [] array} scalar metrics added by the stages.
    env_reward: [B] float32, the environment's reward before DAPO's soft
      overlong penalty (soft_overlong_penalty, kept through dynamic
      sampling; read by env_reward_info); None when the penalty is off.
    mask: [B, L] bool loss mask (policy mask, overlong, replay injection).
    any_usable: [] bool, dynamic sampling found a group with varying
      outcomes (the RL step skips the update otherwise).
    gold_logp: [B, K + 1] float32 reference log-probs of the gold answer.
    obs_prob: [B, L] float32 policy probability of each token.
    obs_hit: [B, L] bool, each token is the policy's arg-max prediction.
    phi: [B, K + 1] float32 unscaled PBRS potential.
    spa_inputs: the SPA head's training batch (potential 'spa').
    aux_advantage: [B, L] float32 dense auxiliary advantages.
    dual_observed: [] float32 batch mean of the constrained fact.
    fresh_reward: [B] float32 the fresh rows' reward before replay injection.
    fresh_keys: [B] uint32 task keys of the fresh rows.
    train_traj: the trained rows (traj with replay injections; else traj).
    injected: [B] bool, rows replaced by a replayed episode.
    replay: the replay buffer after this batch's insertion.
    sil: the self-imitation batch.
    loss_length: [] int32 columns the update's loss reads.
    ref_logp: [B, L] float32 reference log-probs.
    behaviour_logp: [B, L] float32 behaviour log-probs.
    behaviour_shift: [B, L] float32 masked-sampling log-prob shift.
    old_values: [B, L] float32 behaviour values V_old.
    adv_b: [B] float32 episode-level advantages.
    advantage: [B, L] float32 per-token advantages.
    returns: [B, L] float32 value targets.
  """

  traj: types.Trajectory
  reward: jax.Array
  parts: dict[str, jax.Array]
  info: dict[str, jax.Array]
  env_reward: jax.Array | None = None
  mask: jax.Array | None = None
  any_usable: jax.Array | None = None
  gold_logp: jax.Array | None = None
  obs_prob: jax.Array | None = None
  obs_hit: jax.Array | None = None
  phi: jax.Array | None = None
  spa_inputs: SpaInputs | None = None
  aux_advantage: jax.Array | None = None
  dual_observed: jax.Array | None = None
  fresh_reward: jax.Array | None = None
  fresh_keys: jax.Array | None = None
  train_traj: types.Trajectory | None = None
  injected: jax.Array | None = None
  replay: types.ReplayBuffer | None = None
  sil: SilSample | None = None
  loss_length: jax.Array | None = None
  ref_logp: jax.Array | None = None
  behaviour_logp: jax.Array | None = None
  behaviour_shift: jax.Array | None = None
  old_values: jax.Array | None = None
  adv_b: jax.Array | None = None
  advantage: jax.Array | None = None
  returns: jax.Array | None = None

  def with_info(self, **metrics: jax.Array) -> Rollout:
    """A copy whose `info` also holds `metrics` (a later value of a name
    replaces the earlier one)."""
    return self.replace(info={**self.info, **metrics})


@_name_sorted_pytree
@dataclasses.dataclass(frozen=True)
class LearnerBatch:
  """What the update reads: [B, L] arrays, optional ones None when unused.

  Built by `stages.pack.pack`, read by `make_update_fn`. The fields are
  declared in the order pack sets them; the pytree flattens them in sorted
  name order (the order of the dict this replaced, whose leaf order drives
  the op order of the minibatch split and of `padding.trim_batch`).

  Attributes:
    tokens: [B, L] int32 trained rows.
    mask: [B, L] bool loss mask.
    behaviour_logp: [B, L] float32 behaviour log-probs.
    ref_logp: [B, L] float32 reference log-probs.
    advantage: [B, L] float32 per-token advantages.
    old_values: [B, L] float32 V_old (value head).
    returns: [B, L] float32 value targets (value head).
    reward_hat: [B] float32 FlowRL's episode-level reward.
    prompt_embedding: [B, D] float32 FlowRL's log-partition input.
    behaviour_shift: [B, L] float32 masked-sampling log-prob shift.
    aux_advantage: [B, L] float32 dense auxiliary advantages.
    obs_mask: [B, L] bool next-observation prediction targets (TOOL tokens).
    obs_targets: [B, L] int32 permuted targets (placebo).
    sil: the self-imitation batch (not split into minibatches).
  """

  tokens: jax.Array
  mask: jax.Array
  behaviour_logp: jax.Array
  ref_logp: jax.Array
  advantage: jax.Array
  old_values: jax.Array | None = None
  returns: jax.Array | None = None
  reward_hat: jax.Array | None = None
  prompt_embedding: jax.Array | None = None
  behaviour_shift: jax.Array | None = None
  aux_advantage: jax.Array | None = None
  obs_mask: jax.Array | None = None
  obs_targets: jax.Array | None = None
  sil: SilSample | None = None


@dataclasses.dataclass(frozen=True)
class StageContext:
  """Per-iteration inputs of the stages, built once by collect (traced).

  Attributes:
    key: PRNG key fold_in(state.rng, state.step); stages derive their own
      keys from it by fold_in with fixed indices.
    step: [] int32 training step (state.step).
    params: the sampling parameters of the policy.
    ref_params: the full reference parameters (with LoRA: the policy's base
      plus the reference adapters).
    reward_model: the frozen reward model's parameters, or None.
    features: read-only feature states by name (`TrainState.features`:
      'kl', 'replay', 'dual', 'flowrl', 'spa'; `learner.features`); a
      feature that is off is absent.
    first_traj: the first round's trajectory when it was rolled out outside
      the jitted program (host environments), else None.
  """

  key: jax.Array
  step: jax.Array
  params: Any
  ref_params: Any
  reward_model: Any | None = None
  features: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  first_traj: types.Trajectory | None = None
