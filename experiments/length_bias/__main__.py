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
SPEC = stats.ClaimSpec(
    primary_metric="len_incorrect",
    higher_is_better=False,
    room_metric="mean within-group std of POLICY tokens (tokens)",
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
        "arithmetic responses of "
        "8-14 tokens of fixed structure (no free-form reasoning)",
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
