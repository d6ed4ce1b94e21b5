"""Shaping gain vs model size (PiCA).

Claim (PiCA, docs/papers.md; Planner-R1, Planner-R1): dense, potential-based shaping
helps smaller models more than larger ones (PiCA: +15.2% at 3B vs +2.2% at 7B).

Setup: key-value chains with d = 3..5 hops (experiments/kv_deep.py), per-turn
returns. Three model sizes (parameters counted by the runner):
  xs  d_model 64, 2 layers    s  the `tiny` preset (d_model 96, 3 layers)
  m   the `small` preset (d_model 128, 4 layers)
and two arms per size: `outcome` (correctness only, per-turn returns) and
`pbrs` (the same + PBRS F_k = Phi(s_{k+1}) - Phi(s_k) on the env's oracle hop
progress, `rl.pbrs_coef = 1`, `rl.pbrs_cutoff = 'zero'`). The paper's Phi is a
learned success probability; the oracle potential is the control arm and
isolates the size effect from the quality of a learned Phi. Arms are named `<size>_<arm>`.
Append ',smoke' for the CI size.

  python -m experiments.pica_model_size              # 3 seeds x 6 arms
"""

from __future__ import annotations

import ml_collections

from configs import common
from experiments import kv_deep

SIZES = {
    "xs": dict(d_model=64, num_layers=2, num_heads=4, head_dim=16, ffn_dim=192),
    "s": common.MODEL_PRESETS["tiny"],
    "m": common.MODEL_PRESETS["small"],
}
ARMS = tuple(f"{s}_{a}" for s in SIZES for a in ("outcome", "pbrs"))


def get_config(arg: str | None = "s_pbrs") -> ml_collections.ConfigDict:
  arm, _, size = (arg or "s_pbrs").partition(",")
  if arm not in ARMS:
    raise ValueError(
        f"experiments/pica_model_size/config.py: unknown arm {arm!r}; "
        f"known: {ARMS} (append ',smoke' for the smoke size)"
    )
  model_size, shaping = arm.split("_")
  config = kv_deep.deep_kv_chain(3, 5, smoke=size == "smoke")
  config.name = f"pica_model_size_{arm}"
  config.model.update(SIZES[model_size])
  config.rl.credit = "per_turn"
  if shaping == "pbrs":
    config.rl.pbrs_potential = "progress"
    config.rl.pbrs_coef = 1.0
    # Running out of turns is terminal (Phi = 0): policy-invariant shaping; with
    # Phi kept, a cut-off episode at full progress earns as much as a correct
    # answer (experiments/trace_credit/README.md).
    config.rl.pbrs_cutoff = "zero"
  return config


def arms(smoke: bool) -> dict[str, ml_collections.ConfigDict]:
  return {a: get_config(a + (",smoke" if smoke else "")) for a in ARMS}
