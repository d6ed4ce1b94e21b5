"""Update functions: loss -> grads -> optax, one jitted program per iteration.

`make_sft_step` and `make_rl_step` read the config once and return pure functions
`step(state) -> (state, metrics)`; the data for step s is generated inside from
fold_in(key, s), so a whole iteration (task sampling, multi-turn rollout, rewards,
advantages, reference log-probs and the PPO epochs) is one XLA program.

One module per stage:

  common.py        optimizer, POLICY mask, the teacher-forced `policy_forward`
  sft.py           SFT loss, gradient accumulation, `make_sft_step`
  collect.py       `make_collect_fn`: rollout -> rewards -> potentials ->
                   reference / behaviour log-probs -> advantages -> batch
  batch.py         `Rollout`, `LearnerBatch`, ...: the typed batch the
                   collect stages read and write
  stages/          the collect stages as top-level functions (sample.py:
                   rollout round, RM scores, env reward, soft overlong,
                   dynamic sampling; shaping.py: loss mask, overlong,
                   shared passes, likelihood reward, potential, dense aux,
                   dual penalty; replay.py: replay injection / insertion,
                   SIL samples; logprobs.py: loss length, reference and
                   behaviour log-probs, KL-in-reward; advantages.py: GAE or
                   the estimator tables; pack.py: the learner batch;
                   build.py: the stage list of a config, `chain`)
  potentials_by_name.py
                   `POTENTIALS`, the PBRS potentials by `rl.pbrs_potential`
  token_credit.py  per-token advantages: the adapter from the config
                   (`rl.advantage_estimator`, `rl.credit`,
                   `rl.tree_branching`) to `estimators.ESTIMATORS`
  behaviour.py     trainer-side behaviour log-probs (`rl.behaviour_logprobs`)
  update.py        the RL loss (policy loss from `losses.POLICY_LOSSES`) and
                   the PPO epochs, `make_update_fn`
  features.py      stateful features as (init, update) pairs whose states
                   live in `TrainState.features` (adaptive KL, replay
                   buffer, dual ascent, FlowRL log Z, SPA head); the
                   checkpoint shim of the older layout
  rl_step.py       `make_rl_step`: collect + update + the features' updates
                   + the post-update metrics
  step_metrics.py  the post-update metric functions (dual-path, batch, host
                   tool failures, episode facts, RM monitor) and
                   `build_step_metrics`, the list of a config

The names below are re-exported so that `learner.make_rl_step` etc. work.
"""

from agentic_rl import sampling  # noqa: F401  (tests patch learner.sampling)
from agentic_rl.learner.behaviour import (
    BEHAVIOUR_LOGPROBS,
    behaviour_forward,
    masked_behaviour_logprobs,
)
from agentic_rl.learner.collect import (
    dual_path_tool_free,
    make_collect_fn,
    make_host_rollout_fn,
    obs_prediction_info,
)
from agentic_rl.learner.common import (
    StepFn,
    make_optimizer,
    policy_forward,
    policy_mask,
)
from agentic_rl.learner.potentials_by_name import (
    POTENTIALS,
    uses_spa,
    value_potential,
)
from agentic_rl.learner.batch import LearnerBatch
from agentic_rl.learner.features import (
    Feature,
    build_features,
    dual_coef_update,
    init_rl_extras,
    restore_train_state,
)
from agentic_rl.learner.rl_step import make_rl_step
from agentic_rl.learner.sft import make_sft_step, sft_grad, sft_loss
from agentic_rl.learner.step_metrics import build_step_metrics, dual_path_metrics
from agentic_rl.learner.stages.pack import prompt_embedding
from agentic_rl.learner.stages.replay import inject_replay
from agentic_rl.learner.token_credit import (
    dense_aux_advantages,
    estimator_name,
    estimator_settings,
    pbrs_final_potential,
    pbrs_terminated,
    step_reward_on,
    step_rewards_bk,
    step_scores_bk,
    token_advantages,
    token_level_advantages,
)
from agentic_rl.learner.update import (
    _rl_loss,
    log_partition_graphdef,
    make_log_partition_optimizer,
    make_update_fn,
    policy_loss_settings,
    uses_values,
)

__all__ = [
    "BEHAVIOUR_LOGPROBS",
    "Feature",
    "LearnerBatch",
    "POTENTIALS",
    "StepFn",
    "_rl_loss",
    "behaviour_forward",
    "build_features",
    "build_step_metrics",
    "dense_aux_advantages",
    "dual_coef_update",
    "dual_path_metrics",
    "dual_path_tool_free",
    "estimator_name",
    "estimator_settings",
    "init_rl_extras",
    "inject_replay",
    "log_partition_graphdef",
    "make_collect_fn",
    "make_host_rollout_fn",
    "make_log_partition_optimizer",
    "make_optimizer",
    "make_rl_step",
    "make_sft_step",
    "make_update_fn",
    "masked_behaviour_logprobs",
    "obs_prediction_info",
    "pbrs_final_potential",
    "pbrs_terminated",
    "policy_forward",
    "policy_loss_settings",
    "policy_mask",
    "prompt_embedding",
    "restore_train_state",
    "sft_grad",
    "sft_loss",
    "step_reward_on",
    "step_rewards_bk",
    "step_scores_bk",
    "token_advantages",
    "token_level_advantages",
    "uses_spa",
    "uses_values",
    "value_potential",
]
