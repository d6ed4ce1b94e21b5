"""PORTool fork-relative tree advantages vs trajectory-only GRPO.

Claim (PORTool, docs/papers.md): rollouts that branch at tool-call boundaries,
with fork-relative step advantages blended into the trajectory-relative advantage
(A = alpha * fork-relative + (1 - alpha) * trajectory), beat trajectory-only GRPO
on accuracy and on tool-call steps per episode.

Setup: key-value chains with d = 3..5 hops (experiments/kv_deep.py), group of
G = 8 leaves. Arms:
  grpo       independent episodes, trajectory-level GRPO (no tree)
  tree_a0    tree rollouts forking 2-2-2 before turns 0, 1, 2; alpha = 0 (the
             tree's samples, trajectory-only advantages)
  tree_a0.5  the same, alpha = 0.5
  tree_a1    the same, alpha = 1 (fork-relative only)
Measured: greedy accuracy, pass@1 (T = 1 samples), tool calls per episode. Append ',smoke' for the CI size.

  python -m experiments.portool_tree                 # 3 seeds x 4 arms
"""

from __future__ import annotations

import ml_collections

from experiments import kv_deep

ARMS = ("grpo", "tree_a0", "tree_a0.5", "tree_a1")


def get_config(arg: str | None = "tree_a0.5") -> ml_collections.ConfigDict:
  arm, _, size = (arg or "tree_a0.5").partition(",")
  if arm not in ARMS:
    raise ValueError(
        f"experiments/portool_tree/config.py: unknown arm {arm!r}; "
        f"known: {ARMS} (append ',smoke' for the smoke size)"
    )
  config = kv_deep.deep_kv_chain(3, 5, smoke=size == "smoke")
  config.name = f"portool_tree_{arm}"
  if arm.startswith("tree_a"):
    # Forks multiply to the group size: 2-2-2 = 8 leaves (smoke: 2-2 = 4).
    config.rl.tree_branching = (2, 2) if size == "smoke" else (2, 2, 2)
    config.rl.tree_alpha = float(arm[len("tree_a") :])
  return config


def arms(smoke: bool) -> dict[str, ml_collections.ConfigDict]:
  return {a: get_config(a + (",smoke" if smoke else "")) for a in ARMS}
