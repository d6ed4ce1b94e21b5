"""ToolRLA multiplicative vs additive reward composition, and TIER
execution-based vs reference-trajectory-matching rewards over call depth 1..6.

Claims (docs/papers.md):
  ToolRLA (docs/papers.md): composing the tool-call reward factors (format,
    tool selection, parameter accuracy, constraint compliance; each in [0, 1])
    multiplicatively beats their additive mean (+7 pp task completion, fewer
    violations).
  TIER (docs/papers.md): a trajectory-invariant execution reward (format +
    schema adherence + execution success + answer correctness) stays accurate at
    every compositional depth 1..6, while rewards that match a reference
    trajectory collapse beyond depth ~4.

Setup (chosen before any arm was run): environments/schema_calls.py with the
two equivalent addition tools `add(a,b)` and `sum(x,y)` (num_tools = 2, so every
node is a + node with 4 valid calls: 2 tools x 2 value orders, plus the other
order of independent sub-expressions), depth d uniform in 1..6, `sum` forbidden in
half of the prompts. The SFT expert picks the tool and the value order at random
(so it demonstrates every valid path) and is imperfect: answers at once 10%,
repeats a call 10%, wrong value 5%, wrong tool name (`mul`, not offered) 5%, calls
the forbidden `sum` on 20% of the + calls of constrained tasks. SFT once per seed,
then 4 GRPO arms from the same checkpoint:
  additive        R = (f + s + p + c + a) / 5 (rl.reward_composition = 'sum')
  multiplicative  R = f s p c a               (rl.reward_composition = 'product')
  execution       TIER: F + S + E + A       (call_rewards.tier_reward)
  reference_match F + 2 M + A               (call_rewards.ref_match_reward; M =
                  exact match with the canonical reference trajectory
                  (`exact=True`: 1 only if every reference call is reproduced
                  in order, as in TIER's reference-matching baseline),
                  weight 2 = the weight of S + E, so both rewards give the
                  answer 1/4 of their maximum)
The ToolRLA factors: f format validity, s tool-name validity, p parameter
accuracy, c = no forbidden call, a = answer correctness. Earlier runs (README)
had no answer factor and fractional reference matching; both were changed to
the papers' forms on 2026-12-02, before any run of the new arms.

  python -m experiments.tool_composition            # 3 seeds x 4 arms

The declared claim (SPEC in __main__.py) needs all four arms: ToolRLA's part
on additive / multiplicative, TIER's two depth parts on execution /
reference_match; its decision run (8 seeds) is in README.md.
Append ',smoke' to an arm for the CI size.
"""

from __future__ import annotations

import ml_collections

from configs import schema_calls

ARMS = ("additive", "multiplicative", "execution", "reference_match")
MAX_DEPTH = 6
# Tokens: prompt <= 82 (two schemas, the rule, a depth-6 query); a call turn
# `CALL add(a=63,b=9) CALL_END` <= 16; an observation `OBS 63 OBS_END` <= 6 with
# its separators (values <= 9 * 7 = 63); the answer <= 5. Room for the d calls, one
# repeated call and the answer: 82 + 7 * 22 + 5 = 241 -> 256.
MAX_LEN = 256
# ToolRLA factors: format, tool name, parameters, constraint compliance and
# answer correctness (`correct`), equal weights in the additive mean. The first
# runs had no answer factor (one correct call plus any answer scored 1, so
# calling less was optimal); the paper's reward has an answer/coverage term.
TOOLRLA = dict(
    call_format=0.2,
    call_name=0.2,
    call_params=0.2,
    call_constraint=0.2,
    correct=0.2,
)


def get_config(arg: str | None = "execution") -> ml_collections.ConfigDict:
  arm, _, size = (arg or "execution").partition(",")
  if arm not in ARMS:
    raise ValueError(
        f"experiments/tool_composition/config.py: unknown arm {arm!r};"
        f" known: {ARMS} (append ',smoke' for the smoke size)"
    )
  smoke = size == "smoke"
  config = schema_calls.get_config("smoke" if smoke else None)
  config.name = f"tool_composition_{arm}"
  config.env.update(
      dict(
          num_tools=2,
          min_depth=1,
          max_depth=MAX_DEPTH,
          branch_prob=0.5,
          forbid_prob=0.5,
          max_turns=MAX_DEPTH + 2,
          expert_undercall_prob=0.1,
          expert_overcall_prob=0.1,
          expert_wrong_arg_prob=0.05,
          expert_wrong_name_prob=0.05,
          expert_violation_prob=0.2,
      )
  )
  config.max_len = MAX_LEN
  if not smoke:
    # Sized for the 2-core CPU at max_len 256 (3 seeds x 4 arms). The first
    # measured run (80 SFT steps, 10 GRPO iterations; README) left the SFT start
    # at 2% success, too weak to compare arms; this is the second run's size.
    config.sft.steps = 300
    config.sft.batch_size = 32
    config.rl.steps = 30
    config.rl.batch_size = 32  # 4 tasks x G = 8
    config.eval.num_tasks = 96  # about 16 per depth
  config.eval.num_samples = 1
  config.eval.pass_k = (1,)
  if arm in ("additive", "multiplicative"):
    config.rl.rewards = ml_collections.ConfigDict(dict(TOOLRLA))
    config.rl.reward_composition = (
        "product" if arm == "multiplicative" else "sum"
    )
  elif arm == "execution":
    config.rl.rewards = ml_collections.ConfigDict(dict(tier=1.0))
  else:
    config.rl.rewards = ml_collections.ConfigDict(dict(ref_match=1.0))
    config.rl.reward_params = ml_collections.ConfigDict(
        dict(
            ref_match=dict(w_format=1.0, w_match=2.0, w_answer=1.0, exact=True)
        )
    )
  return config


def arms(smoke: bool) -> dict[str, ml_collections.ConfigDict]:
  return {a: get_config(a + (",smoke" if smoke else "")) for a in ARMS}
