"""Deep key-value chains shared by the credit-assignment claims (TRACE, PORTool, PiCA).

`deep_kv_chain(min_hops, max_hops, smoke)` returns configs/kv_chain.py with chains of
`min_hops`..`max_hops` hops (at most 6), enough assistant turns for every hop plus
the answer and one spare, a context length that holds them, a correctness-only
reward and a less noisy SFT expert than configs/kv_chain.py's. The smoke size
(`smoke=True`) is configs/default.py's smoke schedule (20 SFT steps, 4 RL steps),
for CI only: it exercises the code path and learns nothing.
"""

from __future__ import annotations

import ml_collections

from configs import kv_chain

# Tokens: prompt <= 16; per assistant turn <= 3 (`<call>k</call>` or answer);
# per observation <= 7 (`<obs>k</obs>` with its separators).
_PROMPT, _TURN, _OBS = 16, 3, 7

# Per-turn probability that the SFT expert answers before the chain is resolved.
# configs/kv_chain.py's 0.3 compounds over the hops: measured on 4096 expert
# episodes (2026-12-01), the expert itself succeeds in 0.45 of 1-3 hop chains
# but only 0.19 of 3-5 and 0.12 of 4-6 hop chains. With 0.1 it succeeds in 0.55
# (3-5) and 0.46 (4-6), about the 1-3 hop level that configs/kv_chain.py's RL
# learns from. The first trace_credit run (0.3, with the 0.1 format bonus)
# started RL at a sampled success of 0.03-0.06 and collapsed in every arm
# (experiments/trace_credit/README.md).
DEEP_EXPERT_UNDERCALL_PROB = 0.1


def deep_kv_chain(
    min_hops: int,
    max_hops: int,
    smoke: bool,
    *,
    expert_undercall_prob: float = DEEP_EXPERT_UNDERCALL_PROB,
) -> ml_collections.ConfigDict:
  """configs/kv_chain.py with d in [min_hops, max_hops] hops.

  The reward is correctness only (`rl.rewards = {correct: 1}`): kv_chain's 0.1
  format bonus pays for answering at once, and when sampled success is rare
  that is the best-paid behaviour (the first trace_credit run's outcome arm
  learned to answer at turn 0 with no call).

  Args:
    min_hops, max_hops: chain depth range, 1 <= min_hops <= max_hops <= 6.
    smoke: CI size (configs/default.py smoke schedule).
    expert_undercall_prob: the SFT expert's per-turn probability of answering
      early (`env.expert_undercall_prob`), in [0, 1]; see
      DEEP_EXPERT_UNDERCALL_PROB. dark_room keeps kv_chain's 0.3, the value it
      was measured with.

  Returns:
    The experiment config; max_turns = max_hops + 2, max_len rounded up to a
    multiple of 16.

  Raises:
    ValueError: a depth outside 1..6, min_hops > max_hops, or
      expert_undercall_prob outside [0, 1].
  """
  if not 1 <= min_hops <= max_hops <= 6:
    raise ValueError(
        f"deep_kv_chain: need 1 <= min_hops <= max_hops <= 6, got "
        f"min_hops={min_hops}, max_hops={max_hops}"
    )
  if not 0.0 <= expert_undercall_prob <= 1.0:
    raise ValueError(
        "deep_kv_chain: expert_undercall_prob must be in [0, 1], got "
        f"{expert_undercall_prob}"
    )
  config = kv_chain.get_config("smoke" if smoke else None)
  config.env.expert_undercall_prob = expert_undercall_prob
  config.rl.rewards = ml_collections.ConfigDict(dict(correct=1.0))
  config.env.min_hops = min_hops
  config.env.max_hops = max_hops
  config.env.max_turns = max_hops + 2
  need = (
      _PROMPT + config.env.max_turns * _TURN + (config.env.max_turns - 1) * _OBS
  )
  config.max_len = -(-need // 16) * 16
  return config
