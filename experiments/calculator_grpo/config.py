"""GRPO teaches a tiny transformer to use a calculator tool (the default task).

Claim (GRPO, arXiv:2402.03300, on our default task): GRPO with a correctness
reward raises held-out greedy accuracy well above the SFT start, by teaching the
policy to call the tool on hard items. One arm: configs/default.py unchanged
(`smoke` shrinks it for CI).

  python -m experiments.calculator_grpo [--seeds=0,1,2] [--smoke]
"""

from __future__ import annotations

import ml_collections

from configs import default

ARMS = ("GRPO",)


def get_config(arg: str | None = "GRPO") -> ml_collections.ConfigDict:
  arm, _, size = (arg or "GRPO").partition(",")
  if arm not in ARMS:
    raise ValueError(f"experiments/calculator_grpo/config.py: unknown arm {arm!r}; "
                     f"known: {ARMS} (append ',smoke' for the smoke size)")
  return default.get_config("smoke" if size == "smoke" else None)


def arms(smoke: bool) -> dict[str, ml_collections.ConfigDict]:
  return {a: get_config(a + (",smoke" if smoke else "")) for a in ARMS}
