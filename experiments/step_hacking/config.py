"""A hackable per-call step reward on key-value chains, raw vs bounded.

Claim (Clipping/Delta, Gao et al., arXiv:2410.15115, docs/papers.md; PURE,
Cheng et al., arXiv:2504.15275, docs/papers.md): adding a process reward to the
success reward can hurt RL because the policy hacks it by repeating correct but
unnecessary steps (sum-form credit); bounding the cumulative step reward (Clip,
Delta) or min-form credit removes the hacking. G-RA (docs/papers.md) gates the
step rewards on the outcome instead.

Setup: configs/kv_chain.py (d = 1..3 hops, 5 assistant turns, so a d-hop chain
leaves 4 - d spare turns for repeated calls; SFT on an imperfect expert that also
makes 10% redundant calls), per-turn credit (`rl.credit='per_turn'`, discount 1)
in every arm, reward correct + 0.1 format. The step "PRM" pays for every
well-formed `get` of a key in the map, repeats included (`rl.step_reward =
'valid_call'`, score p_k in {0, 1} on call turns), with coefficient c = 0.5 per
call (fixed before any run: one spare turn filled with a repeat is worth half a
correct answer, two are worth one). Arms (the `arg`):
  success_only  no step reward
  sum           + c p_k per call turn (naive sum-form PRM)
  clip          + c min(p_k - 1, 0)   (Clipping, eta = 1: valid calls 0, failed -c)
  delta         + c (p_k - p_next)    (Delta; the last call keeps c p_k)
  min           + min-form credit     (PURE: return from turn k has c min_{j>=k} p_j)
  gated         + c p_k only in episodes whose outcome reward >= 1 (G-RA)
SFT 100 steps of 32 demonstrations, then 25 GRPO iterations of 32 episodes
(4 tasks x groups of 8); configs/kv_chain.py runs 300 x 64 SFT and 60 x 64 GRPO,
cut to fit the CPU budget before any run. Held-out: 128 fixed tasks, greedy (no
pass@k sampling), plus one sampled pass at T = 1. Append ',smoke' for the CI
size. `python -m experiments.step_hacking` covers success_only, sum, clip,
delta and min; each bound, 'gated' and 'delta_drop' included, is also its own
declared claim (bounds.py, README.md).

  python -m experiments.step_hacking                 # 3 seeds x 5 arms
  python main.py --config=experiments/step_hacking/config.py:sum --workdir=runs/sh_sum

One arm run through main.py uses two XLA CPU devices where main.py picks them
(docs/running.md); the recorded runs used one: add --config.mesh.cpu_devices=1.
"""

from __future__ import annotations

import ml_collections

from configs import kv_chain

# 'gated' (G-RA) and 'delta_drop' are run by their own claims (gated.py,
# delta_paper.py), not by `python -m experiments.step_hacking`.
ARMS = ("success_only", "sum", "clip", "delta", "min")
# 'delta_drop' (Delta with the last step's reward dropped) was added after the
# first look at the results, to test the per-turn loophole of 'delta' (README).
EXTRA_ARMS = ("gated", "delta_drop")
COEF = 0.5


def get_config(arg: str | None = "sum") -> ml_collections.ConfigDict:
  arm, _, size = (arg or "sum").partition(",")
  if arm not in ARMS + EXTRA_ARMS:
    raise ValueError(
        f"experiments/step_hacking/config.py: unknown arm {arm!r}; "
        f"known: {ARMS + EXTRA_ARMS} (append ',smoke' for the smoke size)"
    )
  config = kv_chain.get_config("smoke" if size == "smoke" else None)
  config.name = f"step_hacking_{arm}"
  config.rl.credit = "per_turn"
  config.rl.discount = 1.0
  config.rl.rewards = ml_collections.ConfigDict(dict(correct=1.0, format=0.1))
  if size != "smoke":
    # CPU budget (2 cores shared with ~10 other jobs, 3 seeds x 5 arms): fewer,
    # smaller SFT and GRPO iterations than configs/kv_chain.py (300 x 64 SFT,
    # 60 x 64 GRPO, 256 eval tasks); fixed before any result was seen.
    config.sft.steps = 100
    config.sft.batch_size = 32
    config.rl.steps = 25
    config.rl.batch_size = 32
    config.eval.num_tasks = 128
  # Held-out: greedy accuracy only (the claim's metrics come from extra_eval).
  config.eval.num_samples = 0
  config.eval.pass_k = ()
  # Step reward (agentic_rl/learner.step_rewards_bk); 'none' = old behaviour.
  config.rl.step_reward = "none" if arm == "success_only" else "valid_call"
  config.rl.step_reward_transform = "sum" if arm == "success_only" else arm
  config.rl.step_reward_coef = COEF
  # Clip threshold eta in score units (valid call 1 -> 0, failed call 0 -> -c).
  config.rl.step_reward_clip_eta = 1.0
  # G-RA gate on the composed outcome reward (correct + 0.1 format >= 1).
  config.rl.step_reward_gate_threshold = 1.0
  return config


def arms(smoke: bool) -> dict[str, ml_collections.ConfigDict]:
  return {a: get_config(a + (",smoke" if smoke else "")) for a in ARMS}
