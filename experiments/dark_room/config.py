"""Dense next-observation-prediction reward under z-scored vs mean-only GRPO.

Claim (docs/papers.md, "dark room"): a potential-based next-observation
prediction reward under GRPO drives the policy into a degenerate absorbing state
(prediction accuracy up, success -> 0, episode length pinned at the horizon);
removing only GRPO's std normalisation restores baseline parity (in all-fail
groups the z-scored advantage does not depend on the shaping coefficient); the
same signal as an auxiliary loss does not collapse (the paper: about +20
points), and a shuffled-label placebo matches the true-label auxiliary arm.

Setup (fixed before any arm was run): key-value chains with d = 5..6 hops
(experiments/kv_deep.py; 8 assistant turns = the horizon), reward = correctness
only (no format bonus, which would by itself pay 0.1 for answering and so mask
a bounded bonus of at most lambda = 0.1), trajectory-level GRPO returns, discount
1. The prediction score is the policy's teacher-forced probability of the
observation (TOOL) tokens (credit.observation_prediction_scores); Phi(s_k) =
its mean over the observations of s_k. Arms:
  outcome           correctness only (z-scored GRPO); prediction metrics logged
  pred_zscore       + PBRS on Phi (rl.pbrs_potential='obs_prediction',
                    rl.pbrs_coef = 0.1), z-scored GRPO (rl.scale_by_std=True)
  pred_meanonly     the same with rl.scale_by_std = False (mean-only)
  pred_aux          correctness reward; the next-observation CE on TOOL tokens as
                    an auxiliary loss (rl.obs_prediction_coef = 0.1)
  pred_aux_placebo  the same with the CE labels shuffled across the batch
                    (rl.obs_prediction_placebo = True)
With discount 1, trajectory returns and Phi(terminal) = 0, the shaped return is
R for an episode that answers and R + lambda * Phi(s_n) for one cut off at the
horizon (PBRS keeps the last potential of a truncated episode), so the bonus can
only be collected by never answering.

  python -m experiments.dark_room [--seeds=0,1,2] [--smoke]
"""

from __future__ import annotations

import ml_collections

from experiments import kv_deep

ARMS = (
    "outcome",
    "pred_zscore",
    "pred_meanonly",
    "pred_aux",
    "pred_aux_placebo",
)
# Shaping coefficient lambda (reward units per unit of mean probability).
PBRS_COEF = 0.1
# Weight of the auxiliary next-observation CE (nats per observation token).
AUX_COEF = 0.1


def get_config(arg: str | None = "pred_zscore") -> ml_collections.ConfigDict:
  arm, _, size = (arg or "pred_zscore").partition(",")
  if arm not in ARMS:
    raise ValueError(
        f"experiments/dark_room/config.py: unknown arm {arm!r}; "
        f"known: {ARMS} (append ',smoke' for the smoke size)"
    )
  # kv_chain's expert noise (0.3), the setting every dark_room number was
  # measured with (kv_deep's default is lower since 2026-12-01).
  config = kv_deep.deep_kv_chain(
      5, 6, smoke=size == "smoke", expert_undercall_prob=0.3
  )
  config.name = f"dark_room_{arm}"
  # Success only (kv_deep's reward): a format bonus would pay for answering
  # (see docstring).
  config.rl.credit = "trajectory"
  config.rl.discount = 1.0
  config.rl.log_obs_prediction = True
  if size != "smoke":
    # Sized for the shared 2-core CPU (measured ~7 s per SFT step of 3 x 64
    # episodes under load 14, so configs/kv_chain.py's 300 + 60 steps of 64
    # did not fit): SFT 150 steps of 32 demonstrations, GRPO 40 iterations of
    # 32 episodes (4 tasks x 8), held-out 128 tasks, pass@k from 2 samples.
    config.sft.steps = 150
    config.sft.batch_size = 32
    config.rl.steps = 40
    config.rl.batch_size = 32
    config.eval.num_tasks = 128
    config.eval.num_samples = 2
    config.eval.pass_k = (1, 2)
  if arm in ("pred_zscore", "pred_meanonly"):
    config.rl.pbrs_potential = "obs_prediction"
    config.rl.pbrs_coef = PBRS_COEF
    config.rl.scale_by_std = arm == "pred_zscore"
  elif arm in ("pred_aux", "pred_aux_placebo"):
    config.rl.obs_prediction_coef = AUX_COEF
    config.rl.obs_prediction_placebo = arm == "pred_aux_placebo"
  return config


def arms(smoke: bool) -> dict[str, ml_collections.ConfigDict]:
  return {a: get_config(a + (",smoke" if smoke else "")) for a in ARMS}
