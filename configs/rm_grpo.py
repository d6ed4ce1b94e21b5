"""GRPO on the calculator task with a learned reward model.

The main experiment (configs/default.py) with a frozen reward model trained by
the rm mode (configs/rm_arithmetic.py) inside RL: as the reward (its bounded
score replaces the verifier's `correct`), or, with arg 'pbrs', as a PBRS
potential on top of the verified reward (per-turn credit). Every iteration logs
the gold-verifier over-optimisation monitor: rl/rm_reward (the RM reward),
rl/verified_reward (the env verifier's correctness), rl/rm_gap (their
difference), rl/rm_verified_corr (their Pearson correlation over the batch),
rl/rm_false_positive_rate and rl/rm_score (the raw RM logit).

Launch:   python main.py --config=configs/rm_arithmetic.py --workdir=runs/rm_arithmetic
          python main.py --config=configs/rm_grpo.py --workdir=runs/rm_grpo
          python main.py --config=configs/rm_grpo.py:pbrs --workdir=runs/rm_grpo_pbrs
          smoke: python main.py --config=configs/rm_arithmetic.py:smoke \
                   --workdir=runs/rm_arithmetic_smoke
                 python main.py --config=configs/rm_grpo.py:smoke --workdir=/tmp/rm_grpo
Runtime:  like configs/default.py (3-5 minutes on a 2-core CPU; smoke: ~1 minute)
          after the rm run; the RM pass adds one forward pass per iteration.
Expected: not measured (no full run was made). With the measured arithmetic RMs
          (experiments/rm_selection: they prefer direct answers on easy items
          and cannot check digits), expect rl/rm_reward to rise faster than
          rl/verified_reward, i.e. a growing rl/rm_gap: the monitor is the point.
"""

from __future__ import annotations

import ml_collections

from configs import default


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  args = set((arg or "").split(",")) - {""}
  unknown = args - {"smoke", "pbrs"}
  if unknown:
    raise ValueError(
        f"configs/rm_grpo.py: unknown arg {sorted(unknown)}; known: "
        "'smoke', 'pbrs' (comma-separated)"
    )
  config = default.get_config("smoke" if "smoke" in args else None)
  config.name = "rm_grpo" + "".join(f"_{a}" for a in sorted(args))

  rl = config.rl
  # An rm-mode workdir (python main.py --config=configs/rm_arithmetic.py ...)
  # whose final checkpoint holds the reward model; loaded frozen at start-up.
  rl.reward_model_dir = (
      "runs/rm_arithmetic_smoke" if "smoke" in args else "runs/rm_arithmetic"
  )
  # Which of its models: 'outcome' (Bradley-Terry ORM; on prefixes for PBRS) or
  # 'process' (per-turn PRM; episode score logit(prod_k sigmoid(s_k))).
  rl.reward_model_kind = "outcome"
  if "pbrs" in args:
    # Verified reward, RM as the potential Phi(s_k) in [0, 1] of PBRS
    # (reward_models.frozen.trajectory_rm_outputs), acting through per-turn returns.
    rl.rewards = ml_collections.ConfigDict(dict(correct=1.0, format=0.1))
    rl.reward_model_kind = "process"
    rl.pbrs_potential = "rm"
    rl.pbrs_coef = 0.5
    rl.credit = "per_turn"
  else:
    # The RM replaces the verifier: reward = rm + 0.1 format.
    rl.rewards = ml_collections.ConfigDict(dict(rm=1.0, format=0.1))
    # Bounded RM reward (rewards.components.rm_reward): 'sigmoid' sigma((s - ref) / T),
    # 'tanh', 'clip' min(s - eta, 0) or 'none'.
    rl.reward_params = ml_collections.ConfigDict(
        dict(rm=dict(transform="sigmoid", ref=0.0, temperature=1.0))
    )
  return config
