"""Loss-aggregation length bias (Dr.GRPO), on arithmetic with filler tokens.

Claim (Dr.GRPO, Liu et al., arXiv:2503.20783): with per-sequence length
normalisation (seq-mean-token-mean) a negative advantage is spread over more tokens
in a long response, so long incorrect responses are penalised less per token and
incorrect responses grow longer over training; token-mean over the batch or a
constant normaliser (seq-mean-token-sum-norm) removes that bias.

Setup: the default arithmetic experiment with the environment's free-length
filler option on (`env.filler_max`, environments/arithmetic.py): any turn may
open with any number of '.' filler tokens, which the environment drops before
reading the turn, so a response's length is free to vary without changing its
outcome; the SFT expert opens each turn with a uniform 0..FILLER_MAX of them, so
the start policy's lengths vary within a group. Turns are longer
(ACTION_LEN) and the buffer holds the longest possible episode (`max_len`).
Arms differ only in `rl.loss_agg_mode` ('token-mean', 'seq-mean-token-mean',
'seq-mean-token-sum-norm' with the buffer length as constant) and the `drgrpo`
arm: Dr.GRPO as the paper defines it, 'seq-mean-token-sum-norm' with a constant
response budget (RESPONSE_BUDGET POLICY tokens, not the buffer that includes
the prompt) and advantages not divided by the group's std
(`rl.scale_by_std = False`). Measured: POLICY tokens (fillers included) per
episode of incorrect and correct sampled (T = 1) held-out episodes, and the
training curve of POLICY tokens. The decision run of 2026-12-02 had no fillers
(fixed-structure responses of 8-14 tokens, max_len 64, budget 32); README.md.
Append ',smoke' for the CI size.

  python -m experiments.length_bias                  # 3 seeds x 4 arms
"""

from __future__ import annotations

import ml_collections

from configs import default
from environments import arithmetic

ARMS = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
    "drgrpo",
)
# Declared before the run (2026-12-06, before any run with fillers), from what
# the setup needs, not from an outcome:
# - FILLER_MAX = 8: the expert's fillers per turn are uniform in 0..8. The
#   shortest response, a direct answer (ANSWER, 1-5 digits, ANSWER_END: 3-7
#   tokens), can then be doubled by fillers alone, so the per-sequence weights
#   1/|o_i| of seq-mean-token-mean differ by 2x or more within a group even
#   among responses of one structure (the fixed-length run's 8-14 tokens
#   differed by less than 2x); the count's std, 2.58 tokens per turn, clears
#   the room threshold (1 token) without the structural spread.
# - ACTION_LEN = 24 tokens per turn: the expert's longest turn (a call, 8
#   tokens, plus 8 fillers) is 16, so the policy can emit up to 16 fillers
#   before a hard item's call and 17 before its answer (up to 21 before an
#   easy item's shorter turns), twice the start's most: lengths can grow past
#   the start's range in every arm (the claim is about growth).
# - max_len = the longest possible episode (prompt capacity + max_turns full
#   turns + max_turns - 1 full observations = 24 + 3 * 24 + 2 * 12 = 120), so
#   no episode is ever cut by the buffer: the only length caps are ACTION_LEN
#   per turn and the turn budget, the same in every arm.
FILLER_MAX = 8
ACTION_LEN = 24
# Constant normaliser of the drgrpo arm: a budget of POLICY tokens per episode,
# the most an episode can hold (max_turns turns of ACTION_LEN tokens = 72; the
# paper's constant is its generation budget). The fixed-length run used 32,
# then the POLICY tokens a 64-token buffer left after the prompt and the
# observations. Any constant removes the length bias; its value only scales
# the step size.
RESPONSE_BUDGET = 3 * ACTION_LEN


def get_config(arg: str | None = "token-mean") -> ml_collections.ConfigDict:
  arm, _, size = (arg or "token-mean").partition(",")
  if arm not in ARMS:
    raise ValueError(
        f"experiments/length_bias/config.py: unknown arm {arm!r}; "
        f"known: {ARMS} (append ',smoke' for the smoke size)"
    )
  config = default.get_config("smoke" if size == "smoke" else None)
  config.name = f"length_bias_{arm}"
  config.env.filler_max = FILLER_MAX
  config.env.max_action_len = ACTION_LEN
  env = arithmetic.ArithmeticEnv(
      **{k: v for k, v in config.env.items() if k != "name"}
  )
  if env.max_turns * env.max_action_len != RESPONSE_BUDGET:
    raise ValueError(
        f"RESPONSE_BUDGET={RESPONSE_BUDGET} must be env.max_turns * "
        f"max_action_len = {env.max_turns * env.max_action_len}"
    )
  config.max_len = (
      env.max_prompt_len
      + env.max_turns * env.max_action_len
      + (env.max_turns - 1) * env.max_obs_len
  )
  if arm == "drgrpo":
    config.rl.loss_agg_mode = "seq-mean-token-sum-norm"
    config.rl.loss_norm_constant = RESPONSE_BUDGET
    config.rl.scale_by_std = False
  else:
    config.rl.loss_agg_mode = arm
  return config


def arms(smoke: bool) -> dict[str, ml_collections.ConfigDict]:
  return {a: get_config(a + (",smoke" if smoke else "")) for a in ARMS}
