"""Loss-aggregation length bias (Dr.GRPO), on arithmetic.

Claim (Dr.GRPO, Liu et al., arXiv:2503.20783): with per-sequence length
normalisation (seq-mean-token-mean) a negative advantage is spread over more tokens
in a long response, so long incorrect responses are penalised less per token and
incorrect responses grow longer over training; token-mean over the batch or a
constant normaliser (seq-mean-token-sum-norm) removes that bias.

Setup: the default arithmetic experiment; arms differ only in `rl.loss_agg_mode`
('token-mean', 'seq-mean-token-mean', 'seq-mean-token-sum-norm' with the buffer
length as constant) and the `drgrpo` arm: Dr.GRPO as the paper defines it,
'seq-mean-token-sum-norm' with a constant response budget (RESPONSE_BUDGET
POLICY tokens, not the 64-token buffer that includes the prompt) and advantages
not divided by the group's std (`rl.scale_by_std = False`). Measured: POLICY tokens per episode of incorrect and correct
sampled (T = 1) held-out episodes, and the training curve of POLICY tokens.
Append ',smoke' for the CI size.

  python -m experiments.length_bias                  # 3 seeds x 4 arms
"""

from __future__ import annotations

import ml_collections

from configs import default

ARMS = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
    "drgrpo",
)
# Constant normaliser of the drgrpo arm: a budget of POLICY tokens per episode
# (3 assistant turns in a 64-token buffer that also holds the prompt and the
# observations; the first run measured at most 14 POLICY tokens). Any constant
# removes the length bias; its value only scales the step size.
RESPONSE_BUDGET = 32


def get_config(arg: str | None = "token-mean") -> ml_collections.ConfigDict:
  arm, _, size = (arg or "token-mean").partition(",")
  if arm not in ARMS:
    raise ValueError(
        f"experiments/length_bias/config.py: unknown arm {arm!r}; "
        f"known: {ARMS} (append ',smoke' for the smoke size)"
    )
  config = default.get_config("smoke" if size == "smoke" else None)
  config.name = f"length_bias_{arm}"
  if arm == "drgrpo":
    config.rl.loss_agg_mode = "seq-mean-token-sum-norm"
    config.rl.loss_norm_constant = RESPONSE_BUDGET
    config.rl.scale_by_std = False
  else:
    config.rl.loss_agg_mode = arm
  return config


def arms(smoke: bool) -> dict[str, ml_collections.ConfigDict]:
  return {a: get_config(a + (",smoke" if smoke else "")) for a in ARMS}
