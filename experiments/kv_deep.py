"""Deep key-value chains shared by the credit-assignment claims (TRACE, PORTool, PiCA).

`deep_kv_chain(min_hops, max_hops, smoke)` returns configs/kv_chain.py with chains of
`min_hops`..`max_hops` hops (at most 6), enough assistant turns for every hop plus
the answer and one spare, and a context length that holds them. The smoke size
(`smoke=True`) is configs/default.py's smoke schedule (20 SFT steps, 4 RL steps),
for CI only: it exercises the code path and learns nothing.
"""

from __future__ import annotations

import ml_collections

from configs import kv_chain

# Tokens: prompt <= 16; per assistant turn <= 3 (`<call>k</call>` or answer);
# per observation <= 7 (`<obs>k</obs>` with its separators).
_PROMPT, _TURN, _OBS = 16, 3, 7


def deep_kv_chain(min_hops: int, max_hops: int,
                  smoke: bool) -> ml_collections.ConfigDict:
  """configs/kv_chain.py with d in [min_hops, max_hops] hops.

  Args:
    min_hops, max_hops: chain depth range, 1 <= min_hops <= max_hops <= 6.
    smoke: CI size (configs/default.py smoke schedule).

  Returns:
    The experiment config; max_turns = max_hops + 2, max_len rounded up to a
    multiple of 16.

  Raises:
    ValueError: a depth outside 1..6 or min_hops > max_hops.
  """
  if not 1 <= min_hops <= max_hops <= 6:
    raise ValueError(f"deep_kv_chain: need 1 <= min_hops <= max_hops <= 6, got "
                     f"min_hops={min_hops}, max_hops={max_hops}")
  config = kv_chain.get_config("smoke" if smoke else None)
  config.env.min_hops = min_hops
  config.env.max_hops = max_hops
  config.env.max_turns = max_hops + 2
  need = _PROMPT + config.env.max_turns * _TURN + (config.env.max_turns - 1) * _OBS
  config.max_len = -(-need // 16) * 16
  return config
