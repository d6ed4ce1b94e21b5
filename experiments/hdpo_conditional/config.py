"""Conditional efficiency (HDPO) vs an additive per-call penalty, on arithmetic.

Claim (HDPO; docs/papers.md): a small additive per-call penalty barely changes tool
calls (after group normalisation it is swamped by accuracy variance), a large one
causes under-use on items that need the tool; the conditional efficiency advantage
(efficiency compared only among correct episodes of the group, added to the
accuracy advantage) reduces calls where the tool is unnecessary without losing
accuracy.

Setup: the default arithmetic experiment (easy items with operands 0..4 need no
tool, hard 3x2-digit products do) with an over-calling SFT start: the expert
always uses the tool on hard items and also on 50% of easy items. Arms (the
`arg`):
  correct      correct + 0.1 format (no efficiency term)
  cost_<c>     correct + 0.1 format + tool_cost (-c per call), c in 0.02 / 0.1 /
               0.3 / 1.2; 1.2 exceeds the value of a needed call (calling lifts
               a hard item's reward from about 0 to 1.1), so it is the positive
               control of "a large penalty causes under-use on hard items"
  hdpo         advantage_estimator 'hdpo' (accuracy advantage + 0.5 x efficiency
               advantage among correct episodes)
Append ',smoke' for the CI size.

  python -m experiments.hdpo_conditional             # 3 seeds x 6 arms
  python main.py --config=experiments/hdpo_conditional/config.py:hdpo --workdir=runs/hdpo

One arm run through main.py uses two XLA CPU devices where main.py picks them
(docs/running.md); the recorded runs used one: add --config.mesh.cpu_devices=1.
"""

from __future__ import annotations

import ml_collections

from configs import default

ARMS = ("correct", "cost_0.02", "cost_0.1", "cost_0.3", "cost_1.2", "hdpo")


def get_config(arg: str | None = "hdpo") -> ml_collections.ConfigDict:
  arm, _, size = (arg or "hdpo").partition(",")
  if arm not in ARMS:
    raise ValueError(
        f"experiments/hdpo_conditional/config.py: unknown arm {arm!r}; "
        f"known: {ARMS} (append ',smoke' for the smoke size)"
    )
  config = default.get_config("smoke" if size == "smoke" else None)
  config.name = f"hdpo_conditional_{arm}"
  config.env.expert_undercall_prob = 0.0
  config.env.expert_overcall_prob = 0.5
  # Easy items with operands 0..4 (since the second setup change of
  # 2026-12-02, shared with experiments/otc_efficiency): with 0..9 the start's
  # direct answers on easy items were right on only about a quarter of sampled
  # episodes, so the tool was needed there too (README).
  config.env.easy_max_operand = 4
  # SFT 600 steps, not the default 300 (setup change of 2026-12-06, declared
  # before any run with it; shared by otc_efficiency and hdpo_conditional):
  # with 300 steps the room check on 512 sampled groups failed on seeds 1, 5
  # and 7 (direct easy-item accuracy 0.884 / 0.806 / 0.841 < 0.9): the start
  # does not yet answer the 75 easy items (operands 0..4, three operators)
  # reliably without the tool. Longer imitation of the same expert sharpens
  # its direct answers; the RL arms, rewards and sizes are unchanged.
  if size != "smoke":
    config.sft.steps = 600
  config.rl.rewards = ml_collections.ConfigDict(dict(correct=1.0, format=0.1))
  if arm.startswith("cost_"):
    config.rl.rewards.tool_cost = 1.0
    config.rl.reward_params = ml_collections.ConfigDict(
        dict(tool_cost=dict(c=float(arm[len("cost_") :])))
    )
  elif arm == "hdpo":
    config.rl.advantage_estimator = "hdpo"
    config.rl.hdpo_efficiency_weight = 0.5
  return config


def arms(smoke: bool) -> dict[str, ml_collections.ConfigDict]:
  return {a: get_config(a + (",smoke" if smoke else "")) for a in ARMS}
