"""Credit assignment: PBRS, potentials, shaped returns, HDPO, SPA.

One module per topic: pbrs.py (shaping), potential_arrays.py (potential
arrays, state positions), turn_estimators.py (HDPO, GiGPO, PORTool tree),
spa.py (learned progress head), likelihood.py (reference log-probs of the
gold answer), obs_prediction.py (next-observation prediction). The names
below are re-exported so that `credit.pbrs_shaping` etc. keep working.

Per-turn quantities are [B, K] arrays with a turn mask (docs/design.md);
potentials are [B, K + 1] (Phi(s_0) .. Phi(s_K), s_k = the state after k
turns). Core math is written for one episode (`pbrs_shaping`) and vmapped by
the batched wrappers; group statistics are segment ops on `group_b` (via
`advantages.grpo_advantages`).

How shaping reaches the policy (docs/rewards_and_credit.md, "How shaping
reaches the policy"):

* Trajectory-level returns, discount 1, Phi(terminal) = 0: every shaped return
  is outcome - Phi(s_0). When all episodes of a task share s_0 (same prompt,
  so the same Phi(s_0)), group-relative advantages (GRPO, with or without std
  normalisation) are unchanged: PBRS has no effect on this path.
* Per-turn returns (reward-to-go, `advantages.turn_reward_to_go` on
  `shape_turn_rewards`): the shaped return at turn k is the unshaped
  reward-to-go - Phi(s_k) (discount 1, terminated), i.e. Phi is a
  state-dependent baseline.
* A dense term that does NOT telescope (e.g. lambda * s_b added to the
  outcome) under z-scored GRPO: in an all-fail group the advantage does not
  depend on lambda > 0 ("dark room"); `hdpo_advantages` is the
  conditional alternative for efficiency terms.

Floating-point caveat: on the trajectory path the shift -Phi(s_0) is exact
only in real arithmetic. Summing the float32 F_k
(`episode_returns_with_shaping`) leaves a residue of a few ulp(max |Phi|)
that differs between episodes. In a group whose outcomes are all equal,
GRPO's std division (std ~ ulp, eps = 1e-6) turns that residue into
advantages of order 0.1 (up to ~0.4 seen with O(1) random potentials,
K = 4) instead of exactly 0. On the trajectory path use
`telescoped_episode_returns` (closed form: the shift is one rounding of
-Phi(s_0), identical within a group), or mean-only advantages.
"""

from agentic_rl.credit.pbrs import (
    pbrs_shaping,
    shape_turn_rewards,
    episode_returns_with_shaping,
    telescoped_episode_returns,
)
from agentic_rl.credit.potential_arrays import (
    progress_potential,
    log_ratio_potential,
    success_probability_potential,
    state_ends,
)
from agentic_rl.credit.turn_estimators import (
    hdpo_advantages,
    observation_state_keys,
    gigpo_step_advantages,
    tree_fork_advantages,
    tree_turn_advantages,
)
from agentic_rl.credit.spa import (
    spa_progress_loss,
    make_spa_optimizer,
    spa_init,
    spa_turn_features,
    spa_contributions,
    spa_potential,
    spa_policy_features,
    spa_update,
)
from agentic_rl.credit.likelihood import (
    gold_answer_sequences,
    gold_answer_logprobs,
    likelihood_reward,
)
from agentic_rl.credit.obs_prediction import (
    observation_prediction_scores,
    observation_prediction_potential,
    shuffle_observation_targets,
    observation_prediction_loss,
)

__all__ = [
    "pbrs_shaping",
    "shape_turn_rewards",
    "episode_returns_with_shaping",
    "telescoped_episode_returns",
    "progress_potential",
    "log_ratio_potential",
    "success_probability_potential",
    "state_ends",
    "hdpo_advantages",
    "observation_state_keys",
    "gigpo_step_advantages",
    "tree_fork_advantages",
    "tree_turn_advantages",
    "spa_progress_loss",
    "make_spa_optimizer",
    "spa_init",
    "spa_turn_features",
    "spa_contributions",
    "spa_potential",
    "spa_policy_features",
    "spa_update",
    "gold_answer_sequences",
    "gold_answer_logprobs",
    "likelihood_reward",
    "observation_prediction_scores",
    "observation_prediction_potential",
    "shuffle_observation_targets",
    "observation_prediction_loss",
]
