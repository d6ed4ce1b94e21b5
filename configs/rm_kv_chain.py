"""Outcome vs process reward models on key-value chains.

Same pipeline as configs/rm_arithmetic.py on environments/kv_chain.py: gold
episodes from the perfect expert, negatives from the imperfect expert (a
distractor key queried: wrong_value; a key re-queried: extra_call; answering with
hops left: missing_call, counted only when it makes the answer wrong) and token
edits (answer letter changed after the calls: ignored_obs). Per-turn labels from
the env's `progress` fact (hops resolved in order).

Launch:   python main.py --config=configs/rm_kv_chain.py --workdir=runs/rm_kv
Runtime:  51 minutes measured on the shared 2-core CPU under heavy contention
          (load 17-25); not measured on an idle machine.
Expected: held-out pairwise accuracy ~0.90 (ORM) / ~0.91 (PRM), ~1.0 on structural
          negatives and at chance on ignored observations; best-of-8 rank@1 0.344
          for both vs 0.254 random (seed 0; experiments/rm_selection/README.md).
"""

from __future__ import annotations

import ml_collections

from configs import rm_arithmetic


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  config = rm_arithmetic.get_config(arg)
  config.name = "rm_kv_chain" if arg is None else f"rm_kv_chain_{arg}"
  # Environment: environments/kv_chain.py (as configs/kv_chain.py).
  config.env = ml_collections.ConfigDict(
      dict(
          name="kv_chain",
          min_hops=1,
          max_hops=3,
          num_distractors=4,
          max_turns=5,
          expert_undercall_prob=0.3,
          expert_overcall_prob=0.1,
          expert_wrong_arg_prob=0.1,
      )
  )
  # Prompt 16 + 5 turns of <= 3 tokens + 4 observations of <= 7.
  config.max_len = 64
  # Imperfect-expert negatives (each probability applies per turn with hops left).
  config.rm.imperfect = ml_collections.ConfigDict(
      dict(
          wrong_value=dict(expert_wrong_arg_prob=1.0),
          extra_call=dict(expert_overcall_prob=1.0),
          missing_call=dict(expert_undercall_prob=1.0),
      )
  )
  return config
