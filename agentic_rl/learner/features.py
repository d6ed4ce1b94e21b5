"""Stateful features of the RL phase as (init, update) pairs.

A feature with state across iterations (adaptive KL, the replay buffer, the
dual-ascent multiplier, FlowRL's log Z, the SPA head) is a `Feature`: its
state lives in `TrainState.features[name]` (`types.FeatureStates`), `init`
creates it at the start of the RL phase and `update` advances it after the
learner update, from the iteration's `batch.Rollout` and metrics. The list is
built once from the config (`build_features`: a feature that is off is
absent); `init_rl_extras` and the RL step loop over it (`init_states`,
`update_states`), with no branch per feature.

The stages read the states through `StageContext.features` (collect passes
`TrainState.features`).

The exception: FlowRL's log Z ('flowrl') is trained by the loss's gradient,
inside the learner update's optimizer steps, with its own Adam
(`update.make_log_partition_optimizer`); its pair has `update=None` and the
RL step hands `features.get('flowrl')` to the learner update (which returns
its new state) instead. Folding it into a post-update `update` would need the
learner update's gradients, so it stays the one documented exception.

Checkpoints written before the states moved into `TrainState.features`
(fields kl_coef, replay, dual_coef, log_partition, log_partition_opt_state,
spa) restore through `restore_train_state` (`LegacyTrainState`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import flax.struct
import jax
import jax.numpy as jnp
from flax import nnx

from agentic_rl import credit
from agentic_rl import losses
from agentic_rl import replay as replay_lib
from agentic_rl import types
from agentic_rl.learner.batch import Rollout
from agentic_rl.learner.common import d_model
from agentic_rl.learner.potentials_by_name import uses_spa
from agentic_rl.learner.update import make_log_partition_optimizer
from agentic_rl.rewards import dual_ascent

Metrics = dict[str, jax.Array]


@dataclasses.dataclass(frozen=True)
class Feature:
  """One stateful feature: its state `TrainState.features[name]`.

  Attributes:
    name: the state's key (`types.FEATURE_ORDER` fixes the leaf order).
    init: state -> the feature's initial state; called at the start of the
      RL phase for a feature whose state is absent (a restored or carried
      state is kept).
    update: (feature state, rollout, metrics) -> (new feature state, metrics
      to add), run after the learner update; `metrics` holds the update's
      (e.g. 'kl'). None: the state is not advanced here (FlowRL, see the
      module docstring).
  """

  name: str
  init: Callable[[types.TrainState], Any]
  update: (
      Callable[[Any, Rollout, Mapping[str, jax.Array]], tuple[Any, Metrics]]
      | None
  ) = None


def dual_coef_update(rl_cfg, lam: jax.Array, observed: jax.Array) -> jax.Array:
  """One projected dual-ascent step on the constraint multiplier.

  'max' (E[g] <= target): lam' = max(0, lam + lr (observed - target));
  'min' (E[g] >= target): lam' = max(0, lam + lr (target - observed))
  (`dual_ascent.dual_ascent_update`; RCPO, arXiv:1805.11074).

  Args:
    rl_cfg: the `rl` config block (dual_sense, dual_target, dual_lr).
    lam: float32 scalar multiplier.
    observed: float32 scalar, the batch mean of the constrained fact.

  Returns:
    float32 scalar.
  """
  sign = 1.0 if rl_cfg.dual_sense == "max" else -1.0
  return dual_ascent.dual_ascent_update(
      lam, sign * observed, sign * rl_cfg.dual_target, rl_cfg.dual_lr
  )


def kl_feature(rl_cfg) -> Feature:
  """'kl': the KL-in-loss coefficient beta, float32 [] (always on).

  Starts at `rl.kl_coef`; with `rl.kl_target` > 0 adaptive KL
  (`losses.adaptive_kl_update` on the update's metric 'kl'), else constant.
  Logs 'kl_coef', the coefficient this iteration's loss used.
  """

  def init(state):
    del state
    return jnp.float32(rl_cfg.kl_coef)

  def update(coef, r, metrics):
    del r
    new = coef
    if rl_cfg.kl_target > 0:
      new = losses.adaptive_kl_update(
          coef,
          metrics["kl"],
          rl_cfg.kl_target,
          rl_cfg.kl_horizon,
          rl_cfg.batch_size,
      )
    return new, {"kl_coef": coef}

  return Feature("kl", init, update)


def replay_feature(config) -> Feature:
  """'replay': the success replay buffer (`types.ReplayBuffer`, S =
  `rl.replay_capacity` slots of L = `max_len` tokens). The collect stages
  insert this batch's episodes (`Rollout.replay`); update keeps that buffer."""
  capacity = config.rl.replay_capacity

  def init(state):
    del state
    return replay_lib.init(capacity, config.max_len)

  def update(buf, r, metrics):
    del metrics
    return (buf if r.replay is None else r.replay), {}

  return Feature("replay", init, update)


def dual_feature(rl_cfg) -> Feature:
  """'dual': the dual-ascent multiplier lam, float32 [] (`rl.dual_constraint`).

  Starts at `rl.dual_init`; the collect stage `dual_penalty` subtracts
  sign * lam * g from the reward and records the batch mean of the fact
  (`Rollout.dual_observed`); update takes one `dual_coef_update` step and
  logs 'dual_coef' (the lam this batch used) and 'dual_observed'.
  """

  def init(state):
    del state
    return jnp.float32(rl_cfg.dual_init)

  def update(lam, r, metrics):
    del metrics
    if r.dual_observed is None:
      return lam, {}
    new = dual_coef_update(rl_cfg, lam, r.dual_observed)
    return new, {"dual_coef": lam, "dual_observed": r.dual_observed}

  return Feature("dual", init, update)


def flowrl_feature(rl_cfg) -> Feature:
  """'flowrl': FlowRL's learned log Z_phi(x) (`types.LogPartitionState`).

  A `losses.LogPartition` on the pooled prompt embedding [D]; its output
  layer starts at 0 (log Z = 0), the hidden layer is drawn from
  fold_in(rng, 2**31 - 1) so the policy's keys are untouched. Trained by the
  learner update (no `update` here; module docstring).
  """

  def init(state):
    d = jax.tree.leaves(state.params["embed_vd"])[0].shape[1]
    model = losses.LogPartition(
        d,
        rl_cfg.flowrl_log_z_hidden,
        rngs=nnx.Rngs(params=jax.random.fold_in(state.rng, 2**31 - 1)),
    )
    z = nnx.state(model)
    return types.LogPartitionState(
        params=z, opt_state=make_log_partition_optimizer(rl_cfg).init(z)
    )

  return Feature("flowrl", init)


def spa_feature(rl_cfg) -> Feature:
  """'spa': the SPA progress head (`types.SpaState`, `rl.pbrs_potential`
  'spa'); zero-initialised (`credit.spa_init`), trained after the update by
  `rl.spa_steps` Adam steps on this batch's `Rollout.spa_inputs`
  (`credit.spa_update`; logs 'spa_loss')."""

  def init(state):
    return credit.spa_init(d_model(state.params), rl_cfg.spa_lr)

  def update(spa, r, metrics):
    del metrics
    if r.spa_inputs is None:
      return spa, {}
    spa, loss = credit.spa_update(
        spa,
        r.spa_inputs.features,
        r.spa_inputs.turn_mask,
        r.spa_inputs.outcome,
        learning_rate=rl_cfg.spa_lr,
        num_steps=rl_cfg.spa_steps,
    )
    return spa, {"spa_loss": loss}

  return Feature("spa", init, update)


def build_features(config) -> tuple[Feature, ...]:
  """The features that are on for `config`, in `types.FEATURE_ORDER`.

  'kl' always; 'replay' with `rl.replay_capacity` > 0; 'dual' with
  `rl.dual_constraint`; 'flowrl' when the `rl.loss_type` entry of
  `losses.POLICY_LOSSES` `needs_log_partition` ('flowrl'); 'spa' with
  the SPA potential (`potentials_by_name.uses_spa`). The order is also the
  order of their updates in the RL step (their ops' trace order).
  """
  rl_cfg = config.rl
  out = [kl_feature(rl_cfg)]
  if rl_cfg.replay_capacity > 0:
    out.append(replay_feature(config))
  if rl_cfg.dual_constraint:
    out.append(dual_feature(rl_cfg))
  loss = losses.POLICY_LOSSES.get(rl_cfg.loss_type)
  if loss is not None and loss.needs_log_partition:
    out.append(flowrl_feature(rl_cfg))
  if uses_spa(rl_cfg):
    out.append(spa_feature(rl_cfg))
  return tuple(out)


def init_states(
    features: tuple[Feature, ...], state: types.TrainState
) -> types.TrainState:
  """`state` with the state of every feature that has none yet (`init`).

  States already present (carried from the SFT phase, restored) are kept;
  a feature that is off adds nothing, so the state's structure (and a
  checkpoint's) is unchanged without it.
  """
  new = {
      f.name: f.init(state) for f in features if f.name not in state.features
  }
  if not new:
    return state
  return state.replace(features=state.features.replace(**new))


def update_states(
    features: tuple[Feature, ...],
    states: types.FeatureStates,
    r: Rollout,
    metrics: Mapping[str, jax.Array],
) -> tuple[types.FeatureStates, Metrics]:
  """Every feature's post-update step, in the order of `features`.

  Args:
    features: `build_features(config)`.
    states: `TrainState.features` at the start of the iteration (or with the
      learner update's new FlowRL state).
    r: the iteration's Rollout after the last collect stage.
    metrics: the step's metrics so far (the update's, the stages' info).

  Returns:
    (the new states, the metrics the features add).
  """
  new, added = {}, {}
  for f in features:
    if f.update is None:
      continue
    new[f.name], m = f.update(states[f.name], r, metrics)
    added.update(m)
  return states.replace(**new), added


def init_rl_extras(config, state: types.TrainState) -> types.TrainState:
  """Adds the RL phase's feature states (`build_features(config)`) that
  `state` lacks: the replay buffer (`rl.replay_capacity` > 0), the
  dual-ascent multiplier (`rl.dual_constraint` set, starting at
  `rl.dual_init`), FlowRL's log-partition parameters with their optimizer
  state (`rl.loss_type='flowrl'`) and the SPA head (potential 'spa'). Without
  these switches only 'kl' is there and the state is returned unchanged, so
  checkpoints of such runs keep their structure."""
  return init_states(build_features(config), state)


# ------------------------------------------------------------- checkpoints


@flax.struct.dataclass
class LegacyTrainState:
  """`types.TrainState`'s layout before the feature states moved into
  `TrainState.features` (what older checkpoints hold).

  Attributes: those of TrainState, with kl_coef (features['kl']), replay
  (['replay']), dual_coef (['dual']), log_partition and
  log_partition_opt_state (['flowrl'].params / .opt_state) and spa (['spa'])
  in place of `features`.
  """

  step: jax.Array
  params: Any
  ref_params: Any
  opt_state: Any
  rng: jax.Array
  kl_coef: jax.Array | None = None
  replay: Any = None
  dual_coef: jax.Array | None = None
  log_partition: Any = None
  log_partition_opt_state: Any = None
  spa: Any = None
  reward_model: Any = None


def to_legacy(state: types.TrainState) -> LegacyTrainState:
  """`state` in the layout of `LegacyTrainState` (same leaves)."""
  f = state.features
  z = f.get("flowrl")
  return LegacyTrainState(
      step=state.step,
      params=state.params,
      ref_params=state.ref_params,
      opt_state=state.opt_state,
      rng=state.rng,
      kl_coef=f.get("kl"),
      replay=f.get("replay"),
      dual_coef=f.get("dual"),
      log_partition=None if z is None else z.params,
      log_partition_opt_state=None if z is None else z.opt_state,
      spa=f.get("spa"),
      reward_model=state.reward_model,
  )


def from_legacy(old: LegacyTrainState) -> types.TrainState:
  """The `types.TrainState` of a `LegacyTrainState` (same leaves)."""
  states = {
      "kl": old.kl_coef,
      "replay": old.replay,
      "dual": old.dual_coef,
      "spa": old.spa,
  }
  if old.log_partition is not None:
    states["flowrl"] = types.LogPartitionState(
        params=old.log_partition, opt_state=old.log_partition_opt_state
    )
  return types.TrainState(
      step=old.step,
      params=old.params,
      ref_params=old.ref_params,
      opt_state=old.opt_state,
      rng=old.rng,
      features=types.FeatureStates(
          {k: v for k, v in states.items() if v is not None}
      ),
      reward_model=old.reward_model,
  )


def _map_states(fn, tree, cls):
  return jax.tree.map(
      lambda x: fn(x) if isinstance(x, cls) else x,
      tree,
      is_leaf=lambda x: isinstance(x, cls),
  )


def _holds_legacy_state(tree) -> bool:
  """Whether a checkpoint's saved tree (nested dicts of its metadata) has a
  TrainState of the legacy layout (a node with 'rng' and 'kl_coef')."""
  if isinstance(tree, Mapping):
    if "rng" in tree and "kl_coef" in tree:
      return True
    return any(_holds_legacy_state(v) for v in tree.values())
  if isinstance(tree, (list, tuple)):
    return any(_holds_legacy_state(v) for v in tree)
  return False


def restore_train_state(ckpt, like: Any, step: int | None = None) -> Any:
  """`ckpt.restore(like, step)` that also reads the legacy layout.

  Args:
    ckpt: a `checkpoint.Checkpointer`.
    like: the target pytree: a `types.TrainState` or any pytree holding some
      (e.g. the rm-mode state dict's 'policy').
    step: the checkpoint step; None: the latest intact one.

  Returns:
    The restored pytree, structured like `like`. A checkpoint written with
    the legacy layout (`LegacyTrainState`: kl_coef, replay, dual_coef, ...)
    is read into that layout and its states moved into `features`, leaf for
    leaf.
  """
  if step is None:
    step = ckpt.latest_intact_step()
  if not _holds_legacy_state(ckpt.saved_tree(step)):
    return ckpt.restore(like, step=step)
  old = ckpt.restore(_map_states(to_legacy, like, types.TrainState), step=step)
  return _map_states(from_legacy, old, LegacyTrainState)
