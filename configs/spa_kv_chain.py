"""PBRS with a learned SPA progress potential on key-value chains.

SPA (Wang et al., "SPA-RL", arXiv:2505.20732): a progress estimator whose
per-turn contributions are trained to sum to the outcome. Here a linear head on
the policy's stop-gradient hidden state at the end of each turn
(TrainState.features['spa'], trained in every RL step) gives the
contributions c_k; their running sum is the PBRS potential Phi(s_k)
(rl.pbrs_potential='spa'), delivered through per-turn returns, where it acts
as a state baseline (docs/rewards_and_credit.md). Compare with
configs/kv_chain.py (outcome only) and with rl.pbrs_potential='progress' (the
oracle hops-resolved potential) as in experiments/pica_model_size.

Launch:   python main.py --config=configs/spa_kv_chain.py --workdir=runs/spa_kv
          python main.py --config=configs/spa_kv_chain.py:smoke --workdir=/tmp/spa_smoke
Runtime:  about configs/kv_chain.py's; not measured yet.
Expected: not measured yet; rl/spa_loss should fall over training (the head
          learns to predict the outcome from the turn-end states).
"""

from __future__ import annotations

from configs import kv_chain


def get_config(arg: str | None = None):
  config = kv_chain.get_config(arg)
  config.name = "spa_kv_chain" if arg is None else f"spa_kv_chain_{arg}"
  # Per-turn returns (reward-to-go), where a potential changes the advantages.
  config.rl.credit = "per_turn"
  # Phi(s_k) = pbrs_coef * sum_{j<k} c_j of the learned SPA head.
  config.rl.pbrs_potential = "spa"
  config.rl.pbrs_coef = 0.5
  # SPA head: Adam learning rate and full-batch steps per RL iteration.
  config.rl.spa_lr = 1e-2
  config.rl.spa_steps = 4
  return config
