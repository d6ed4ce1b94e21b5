"""python -m experiments.length_bias [--seeds=0,1,2] [--smoke]"""

import jax
import jax.numpy as jnp
import numpy as np

from agentic_rl import rollout
from agentic_rl import train
from agentic_rl import types
from experiments import harness
from experiments import stats
from experiments.length_bias import config

# Declared before the run: under GRPO's per-sequence normalisation
# (seq-mean-token-mean, std-scaled advantages) incorrect sampled responses end
# longer than under Dr.GRPO (no std scaling, constant response-budget
# normaliser). A loss aggregation can favour one length over another only when
# a group's responses differ in length: with a mean within-group spread below 1
# POLICY token the setup cannot show the bias.
# Free-length setup (2026-12-06, declared before any run with it; config.py):
# a turn may open with any number of '.' fillers that do not change its
# outcome, and the SFT expert's fillers are uniform in 0..8 per turn. The room
# metric stays the within-group std of POLICY tokens (fillers included),
# threshold 1: still the condition the mechanism needs (length differences
# within a group). It does not tell free length from structure (the
# fixed-length run passed it at 2.7 tokens from call vs direct-answer episodes
# alone); that the length is free to vary comes from the setup (env.filler_max,
# config.ACTION_LEN), not from a measured room. Metric, arms, prediction and
# threshold are unchanged; the room metric's name says the setup, so that the
# spec hash, and the ledger's version, tell this run (v2) from the
# fixed-length decision run (v1; the setup itself is not hashed).
SPEC = stats.ClaimSpec(
    primary_metric="len_incorrect",
    higher_is_better=False,
    room_metric="mean within-group std of POLICY tokens (tokens; free-length "
    "filler setup)",
    room_threshold=1.0,
    treatment="seq-mean-token-mean",
    control="drgrpo",
    prediction="worse",
    room_fn=harness.room_length_spread,
    claim="GRPO's per-sequence length normalisation lets incorrect responses "
    "grow longer than Dr.GRPO's constant normaliser without std scaling",
    paper="Dr.GRPO, arXiv:2503.20783",
    departures=(
        "tiny transformer from scratch",
        "arithmetic with a calculator tool, not free-form reasoning: the "
        "free length is a run of '.' filler tokens opening each turn "
        "(env.filler_max = 8: the SFT expert emits 0..8 per turn; in a "
        "24-token turn the policy may emit up to 16-21, as the rest of the "
        "turn leaves), which the task does not need and which never changes "
        "how the turn is read; the rest of a response has a fixed structure "
        "of 3-8 tokens per turn",
        "60 RL iterations",
    ),
    positive_control="",
)


def response_lengths(cfg, params):
  """POLICY tokens per episode of incorrect / correct sampled held-out episodes."""
  env = train.make_env(cfg)
  model_cfg = train.make_model_config(cfg)
  graphdef = train.init_state(cfg, model_cfg)[0]
  tasks = env.eval_tasks(cfg.eval.num_tasks, cfg.eval.seed)
  traj = rollout.rollout_jit(
      env,
      tasks,
      jax.random.PRNGKey(cfg.eval.seed + 7),
      max_len=cfg.max_len,
      graphdef=graphdef,
      params=params,
      model_config=model_cfg,
      temperature=jnp.float32(1.0),
  )
  n = np.sum(np.asarray(traj.role) == types.POLICY, axis=1).astype(np.float64)
  ok = np.asarray(traj.facts["correct"], bool)
  return {
      "len_incorrect": float(n[~ok].mean()) if (~ok).any() else float("nan"),
      "len_correct": float(n[ok].mean()) if ok.any() else float("nan"),
      "sampled_accuracy": float(ok.mean()),
  }


if __name__ == "__main__":
  harness.claim_main(
      __file__,
      title="Loss aggregation and the length of incorrect responses (Dr.GRPO)",
      arms_fn=config.arms,
      metrics=(
          ("accuracy", "accuracy"),
          ("sampled_accuracy", "acc. (T=1)"),
          ("len_incorrect", "tokens/ep incorrect"),
          ("len_correct", "tokens/ep correct"),
      ),
      curve_keys=("rl/accuracy", "rl/policy_tokens"),
      extra_eval=response_lengths,
      spec=SPEC,
  )
