"""Arms of the pretrained decision run (`python -m experiments.smollm2_calc`).

One arm: configs/smollm2_calc.py unchanged (SmolLM2-135M-Instruct, LoRA rank
8, SFT warm start on the imperfect expert, GRPO), compared with its own SFT
start per seed. `smoke` shrinks it for CI (configs/smollm2_common.py
shrink_for_smoke).
"""

from __future__ import annotations

import ml_collections

from configs import smollm2_calc

ARMS = ("GRPO",)
# Arms of the folder's further claims (same SFT starts and GRPO arm, so a
# further claim trains only its own arm per seed): 'OTC' (otc.py), 'MT-GRPO'
# (turn_credit.py).
OTHER_ARMS = ("OTC", "MT-GRPO")


def get_config(arg: str | None = "GRPO") -> ml_collections.ConfigDict:
  arm, _, size = (arg or "GRPO").partition(",")
  if arm not in ARMS + OTHER_ARMS:
    raise ValueError(
        f"experiments/smollm2_calc/config.py: unknown arm {arm!r}; known: "
        f"{ARMS + OTHER_ARMS} (append ',smoke' for the smoke size)"
    )
  config = smollm2_calc.get_config("smoke" if size == "smoke" else None)
  if arm == "OTC":
    # OTC-PO's tool-integrated reward (paper form, c = 1) in place of the
    # correctness term, plus the same format term (rewards.components.otc_reward).
    config.rl.rewards = ml_collections.ConfigDict(dict(otc=1.0, format=0.1))
  if arm == "MT-GRPO":
    # Turn-level credit (MT-GRPO, arXiv:2505.11821, our form): per-turn
    # returns normalised per turn index, plus the turn reward 1[the tool's
    # result is the answer] (the env's 'progress' fact, weight 1) on the call
    # turn, as PBRS with the final potential kept ('never'; discount 1, the
    # default): the call turn's return is outcome + 1[result = answer], the
    # answer turn's the outcome (learner.pbrs_final_potential).
    config.rl.credit = "per_turn"
    config.rl.pbrs_potential = "progress"
    config.rl.pbrs_coef = 1.0
    config.rl.pbrs_cutoff = "never"
  return config


def arms(smoke: bool) -> dict[str, ml_collections.ConfigDict]:
  return {a: get_config(a + (",smoke" if smoke else "")) for a in ARMS}
