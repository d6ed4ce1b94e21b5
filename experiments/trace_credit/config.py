"""TRACE-style turn rewards vs outcome-only on deep key-value chains.

Claim (TRACE, docs/papers.md): TD rewards on frozen-reference log-ratio values of
the gold answer, V(s_k) = log p_ref(y* | s_k) - log p_ref(y* | s_0), learn faster
than outcome-only RL on long-horizon tool use and give about zero net reward to
redundant calls (the values telescope).

Setup: key-value chains with d = 4..6 hops (experiments/kv_deep.py), reference
model = the SFT checkpoint, per-turn returns (`rl.credit = 'per_turn'`). Arms:
  outcome   correctness only (experiments/kv_deep.py), per-turn returns, no shaping
  trace     the same + PBRS on the TRACE potential (`rl.pbrs_potential = 'trace'`,
            `rl.pbrs_coef = 0.2` nats -> reward units; `rl.pbrs_cutoff =
            'zero'`: an episode cut off at the turn budget ends with Phi = 0)
  progress  the same + PBRS on the oracle hop-progress potential (control)
  trace_faithful  the trace arm with `rl.pbrs_cutoff = 'never'`: V(s_T) kept in
            every return, TRACE's own form (s_T = the state before the answer
            turn for answered episodes; learner.pbrs_final_potential); run by
            the second declared claim, experiments/trace_credit/faithful.py,
            not by this folder's default runner
Measured: final greedy accuracy, mean RL-curve accuracy over the first 20
iterations (learning speed), and on held-out sampled episodes of each final policy
the mean TRACE turn reward r_k = V(s_{k+1}) - V(s_k) (under the scored policy as
reference) of calls that advanced the chain vs calls that did not (redundant or
off-path). Append ',smoke' for the CI size.

  python -m experiments.trace_credit                 # 3 seeds x 3 arms
"""

from __future__ import annotations

import ml_collections

from experiments import kv_deep

# The first claim's arms (python -m experiments.trace_credit); the second
# claim's runner (faithful.py) builds 'outcome' and 'trace_faithful'.
ARMS = ("outcome", "trace", "progress")
KNOWN_ARMS = ARMS + ("trace_faithful",)


def get_config(arg: str | None = "trace") -> ml_collections.ConfigDict:
  arm, _, size = (arg or "trace").partition(",")
  if arm not in KNOWN_ARMS:
    raise ValueError(
        f"experiments/trace_credit/config.py: unknown arm {arm!r}; "
        f"known: {KNOWN_ARMS} (append ',smoke' for the smoke size)"
    )
  config = kv_deep.deep_kv_chain(4, 6, smoke=size == "smoke")
  config.name = f"trace_credit_{arm}"
  config.rl.credit = "per_turn"
  config.rl.discount = 1.0
  if arm == "trace_faithful":
    # TRACE's own form: V(s_T) stays in every return (no ending is terminal),
    # so the turn rewards sum to V(s_T) - V(s_0), not to -V(s_0).
    config.rl.pbrs_potential = "trace"
    config.rl.pbrs_coef = 0.2
    config.rl.pbrs_cutoff = "never"
  elif arm != "outcome":
    config.rl.pbrs_potential = arm
    config.rl.pbrs_coef = 0.2 if arm == "trace" else 1.0
    # Running out of turns is a terminal failure: Phi = 0 there, so the shaping
    # is policy invariant (the first run kept Phi(s_n) and 2 of 3 seeds of both
    # shaped arms learned to call until the budget; README.md).
    config.rl.pbrs_cutoff = "zero"
  return config


def arms(smoke: bool) -> dict[str, ml_collections.ConfigDict]:
  return {a: get_config(a + (",smoke" if smoke else "")) for a in ARMS}
