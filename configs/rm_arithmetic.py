"""Outcome vs process reward models for the calculator task.

Trains the policy by SFT (the policy whose samples the reward models rank, and the
initialisation of both reward-model trunks), builds preference pairs from the
arithmetic environment's ground truth (agentic_rl/preference_data.py: wrong value
in the call, extra call, missing call, ignored observation, wrong direct answer),
trains an outcome RM (Bradley-Terry, arXiv:2203.02155) and a process RM (BCE per
turn boundary on labels from the env's progress fact), then reports held-out
pairwise accuracy by negative type and best-of-8 rank@1 on SFT-policy samples.

Launch:   python main.py --config=configs/rm_arithmetic.py --workdir=runs/rm_arith
          python main.py --config=configs/rm_arithmetic.py:smoke --workdir=/tmp/rm_smoke
Runtime:  ~6-10 minutes on a 2-core CPU (mostly compiles and data generation);
          smoke: ~2-3 minutes.
Expected: held-out pairwise accuracy well above 0.5 for both RMs; see
          experiments/rm_selection/README.md for the measured numbers.
"""

from __future__ import annotations

import ml_collections

from configs import common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  config = common.base()
  config.name = "rm_arithmetic"
  # main.py dispatch: 'rl' (default) or 'rm' (agentic_rl/rm_train.py).
  config.mode = "rm"

  # Environment: environments/arithmetic.py (same as configs/default.py).
  config.env = ml_collections.ConfigDict(
      dict(
          name="arithmetic",
          hard_fraction=0.5,
          expert_imperfect_prob=0.65,
          max_turns=3,
      )
  )

  # SFT of the policy (learner.make_sft_step, as in the main job).
  config.sft = common.optimizer(learning_rate=3e-3, warmup_steps=20)
  config.sft.steps = 150
  config.sft.batch_size = 64
  # Gradient accumulation over this many blocks of the SFT batch (same update).
  config.sft.num_microbatches = 1
  # SFT length buckets (learner.make_sft_step): 1 = train on the whole
  # max_len buffer (the recorded RM runs); K > 1 compiles the update for K
  # lengths and runs the shortest that holds every demonstration.
  config.sft.length_buckets = 1
  # Explicit SFT bucket lengths instead of K uniform ones (needs
  # length_buckets = 1; max_len is appended); () = none.
  config.sft.bucket_lengths = ()
  # Or fit them to the demonstrations (learner/sft.py fitted_length).
  config.sft.fit_bucket = False

  # Reward models: optimizer (AdamW + clipping) and training.
  config.rm = common.optimizer(learning_rate=1e-3, warmup_steps=10)
  # Optimizer steps of each of the two reward models (ORM, then PRM).
  config.rm.steps = 150
  # Preference pairs per step.
  config.rm.batch_size = 32
  # 1: linear head reward_head_d; 2: one extra gelu layer before it.
  config.rm.head_layers = 1
  # Outcome RM loss: bt_coef * Bradley-Terry + regression_coef * (r - correct)^2.
  config.rm.bt_coef = 1.0
  config.rm.regression_coef = 0.0
  # Bradley-Terry margin m (arXiv:2307.09288): -log sigmoid(r_c - r_r - m).
  config.rm.margin = 0.0
  # Process RM episode score: 'log_prod' (sum log sigmoid) or 'min'.
  config.rm.prm_aggregation = "log_prod"
  # Initialise both RM trunks from the SFT policy (InstructGPT).
  config.rm.init_from_sft = True
  # Tasks whose gold episode and negatives make the train / held-out pairs.
  config.rm.num_train_tasks = 512
  config.rm.num_test_tasks = 256
  # Tasks per data-generation program (one compile per shape).
  config.rm.data_chunk = 256
  # Imperfect-expert negatives: {negative type: env field overrides}.
  config.rm.imperfect = ml_collections.ConfigDict(
      dict(
          wrong_value=dict(expert_wrong_arg_prob=1.0),
          extra_call=dict(expert_overcall_prob=1.0),
      )
  )

  # Best-of-N: num_samples SFT-policy episodes per task on num_tasks fixed tasks.
  config.rm_eval = ml_collections.ConfigDict(
      dict(
          # Fixed tasks (drawn from seed) and SFT-policy samples per task.
          num_tasks=64,
          num_samples=8,
          # Sampling temperature of the best-of-N candidates; task seed.
          temperature=1.0,
          seed=12345,
      )
  )
  config.checkpoint.every_steps = 50
  config.log_every_steps = 10

  if arg == "smoke":
    config.name = "rm_arithmetic_smoke"
    config.sft.steps = 10
    config.sft.batch_size = 16
    config.rm.steps = 6
    config.rm.batch_size = 8
    config.rm.num_train_tasks = 32
    config.rm.num_test_tasks = 16
    config.rm.data_chunk = 16
    config.rm_eval.num_tasks = 4
    config.checkpoint.every_steps = 5
    config.log_every_steps = 2
  elif arg is not None:
    raise ValueError(
        f"configs/rm_arithmetic.py: unknown arg {arg!r}; known: 'smoke'"
    )
  return config
