"""Bit-identity harness for refactors of the training code.

    python -m experiments.bit_identity list
    python -m experiments.bit_identity record --out=F.json [--only=a,b*] [--jobs=2]
    python -m experiments.bit_identity check --ref=F.json [--only=...] [--out=G.json]

A refactor that promises "results unchanged" must leave every number of a run
bit for bit the same. `record` runs each variant of `VARIANTS` (a few RL steps
of one config, shrunk to tiny shapes) through the same public entry points
main.py uses (`agentic_rl.train.train_and_evaluate`; `rm_train` and
`seeds.train_seeds` for their variants), then reads what the run wrote:

  metrics  every scalar of metrics.jsonl at every step (SFT and RL; the
           wall-clock `steps_per_sec` left out), and the SFT evaluation
           (eval_sft.json; seeds: every seed's reports);
  state    every leaf of the final checkpoint (params, optimizer state, kl
           coefficient, replay buffer, dual coefficient, log Z, SPA head, ...):
           dtype, shape, sum and sum of squares (float64 accumulation, as
           exact hex) and the SHA-256 of its bytes.

Values are stored as exact hex (`float.hex` of the logged value: a float32
metric upcast to float64 loses nothing). `check` re-runs the variants and
compares: a variant passes when every recorded value and leaf is reproduced
exactly (hashes equal). A leaf that moved to another place of the state (e.g.
a feature's state gathered under one field) is matched by content and
reported as relocated, not as a difference. Metrics or leaves the reference
does not have fail the check unless --allow_new.

The file records the versions of jax, jaxlib and the other libraries, the
backend and device, the CPU and the XLA_* / JAX_* environment variables;
`check` refuses a reference made under different ones (--force compares
anyway): bit identity only holds for the same compiler on the same machine.

Procedure for a refactor: record on the base commit, run `check` against it
once on the same commit (proves every variant is deterministic), then check
after every commit of the refactor.

Each variant runs in its own Python process (same state for `--only` and for
a full run; a crash or an optional dependency missing affects that variant
only). The processes of one invocation share a persistent XLA compilation
cache in the work folder, so programs common to several variants (the SFT
step, the evaluation rollout) compile once; a cache cannot change results
(an entry is the compiled program of the same HLO).

Variants needing optional packages (bfcl-eval, reasoning-gym, torch /
transformers / tokenizers) are recorded as skipped where these are missing.
The learned-RM variants read the reward model the `rm_train` variant trains
(run first whenever one of them is selected).
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import copy
import dataclasses
import datetime
import fnmatch
import hashlib
import importlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any, Callable

import numpy as np

# Bump when a variant's definition or what is recorded changes: records of
# another harness version are not compared.
HARNESS_VERSION = 1
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# RL steps of every RL variant (the stateful features need >= 2 to read what
# the previous step stored).
RL_STEPS = 3

# Libraries whose version changes numerics (or the fixtures): compared.
LIBRARIES = (
    "jax",
    "jaxlib",
    "numpy",
    "ml-dtypes",
    "flax",
    "optax",
    "orbax-checkpoint",
    "ml-collections",
    "tokenizers",
    "transformers",
    "torch",
    "bfcl-eval",
    "reasoning-gym",
)

# Metrics that measure wall time, not the computation.
_UNTIMED = ("steps_per_sec",)


# ---------------------------------------------------------------------------
# Variants
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Variant:
  """One run of the harness.

  Attributes:
    name: identifier (--only).
    covers: the branches / features it exercises (`list` prints it).
    build: fixtures dict -> the experiment config (already shrunk).
    kind: 'rl' (train.train_and_evaluate), 'rm' (rm_train.
      train_and_evaluate_rm) or 'seeds' (seeds.train_seeds, SEEDS).
    needs: fixtures: 'rm_dir' (the rm_train variant's workdir), 'chat_ckpt'
      (tests/chat_fixtures.py's tiny HF chat checkpoint, built in the run).
    requires: importable modules; without them the variant is skipped.
    resume: 'rl' only: halt after the first RL step, then resume to the end
      (two train_and_evaluate calls on one workdir).
  """

  name: str
  covers: str
  build: Callable[[dict], Any]
  kind: str = "rl"
  needs: tuple[str, ...] = ()
  requires: tuple[str, ...] = ()
  resume: bool = False


SEEDS = (0, 1)

# The reward models of the rm_train variant (tests/test_rm_rl.py's shapes).
_RM_MODEL = dict(
    vocab_size=265,
    d_model=16,
    num_layers=1,
    num_heads=2,
    head_dim=8,
    ffn_dim=32,
)


def _set(config, path: str, value) -> None:
  """config.<path> = value for a dotted path; dicts become ConfigDicts (a
  whole block replaced, not merged)."""
  import ml_collections  # pylint: disable=g-import-not-at-top

  *parents, leaf = path.split(".")
  node = config
  for p in parents:
    node = node[p]
  if isinstance(value, dict):
    value = ml_collections.ConfigDict(value)
  node[leaf] = value


def _shrink_rl(config, *, eval_samples: int = 0):
  """Tiny evaluation, no periodic checkpoints (the phase ends and the end are
  forced), every step logged, halted right after the last RL step (so the
  final evaluation, identical to the SFT one's code path, is not run)."""
  config.rl.steps = RL_STEPS
  config.eval.num_tasks = 4
  config.eval.num_samples = eval_samples
  config.eval.pass_k = tuple(range(1, eval_samples + 1))[:2]
  config.eval.initial = False
  config.checkpoint.every_steps = 1000
  config.checkpoint.max_to_keep = 2
  config.log_every_steps = 1
  config.rl.log_every_steps = 1
  config.halt_after_step = config.sft.steps + config.rl.steps
  return config


def _rl(
    module: str = "default",
    arg: str | None = "smoke",
    overrides: dict | None = None,
    *,
    native: bool = True,
    eval_samples: int = 0,
):
  """configs/<module>.py:<arg> with dotted-path `overrides`, shrunk.

  `native`: a JAX-native config derived from configs/default.py: the policy
  gets 2 layers instead of the tiny preset's 3 (compile time).
  """

  def build(fixtures):
    del fixtures
    config = importlib.import_module(f"configs.{module}").get_config(arg)
    if native:
      config.model.num_layers = 2
    for path, value in (overrides or {}).items():
      _set(config, path, value)
    return _shrink_rl(config, eval_samples=eval_samples)

  return build


def _rm_grpo(arg: str, overrides: dict | None = None):
  """configs/rm_grpo.py:<arg> on the rm_train variant's reward models."""

  def build(fixtures):
    config = _rl("rm_grpo", arg, overrides)(fixtures)
    config.rl.reward_model_dir = fixtures["rm_dir"]
    return config

  return build


def _rm_train(fixtures):
  """configs/rm_arithmetic.py:smoke, tiny: 2 SFT steps, 2 ORM and 2 PRM
  steps; halted at the end (the best-of-N report is not run)."""
  del fixtures
  config = importlib.import_module("configs.rm_arithmetic").get_config("smoke")
  config.model.update(_RM_MODEL)
  config.sft.steps = 2
  config.sft.batch_size = 8
  config.rm.steps = 2
  config.rm.batch_size = 4
  config.rm_eval.num_tasks = 2
  config.checkpoint.every_steps = 1000
  config.log_every_steps = 1
  config.halt_after_step = config.sft.steps + 2 * config.rm.steps
  return config


def _host_gsm_tool_hf(fixtures):
  """configs/gsm_tool.py:smoke from the tiny HF chat checkpoint."""
  config = _rl("gsm_tool", "smoke", native=False)(fixtures)
  config.tokenizer = "hf"
  config.model.hf_path = fixtures["chat_ckpt"]
  return config


def _seeds(fixtures):
  config = _rl()(fixtures)
  config.halt_after_step = -1  # train_seeds runs to the end
  return config


_STATEFUL = {
    # FlowRL's log Z (MLP), the replay buffer with SIL, the dual-ascent
    # multiplier and the adaptive KL coefficient, on the budget env.
    "rl.loss_type": "flowrl",
    "rl.loss_agg_mode": "seq-mean-token-mean",
    "rl.flowrl_log_z_hidden": 8,
    "rl.flowrl_log_z_lr": 1e-2,
    "rl.replay_capacity": 8,
    "rl.replay_success_threshold": 0.1,
    "rl.sil_coef": 0.1,
    "rl.sil_batch_size": 2,
    "rl.dual_constraint": "num_tool_calls",
    "rl.dual_target": 0.25,
    "rl.dual_lr": 0.5,
    "rl.dual_init": 0.1,
    "rl.kl_target": 0.05,
}

VARIANTS: tuple[Variant, ...] = (
    # -- Estimators, losses, behaviour log-probs (configs/default.py:smoke) --
    Variant(
        "grpo_default",
        "the default: one plain rollout round, env reward, POLICY mask, "
        "reference forward, trainer behaviour log-probs (no values), episode "
        "estimator 'grpo', PPO token-mean, 2 minibatches; SFT -> RL "
        "transition; evaluation with pass@k samples",
        _rl(eval_samples=2),
    ),
    Variant(
        "sampler_drgrpo",
        "behaviour_logprobs='sampler' (behaviour stage returns the sampler's), "
        "'drgrpo', 'seq-mean-token-sum-norm', k1, entropy bonus, clip-higher, "
        "dual-clip",
        _rl(
            overrides={
                "rl.behaviour_logprobs": "sampler",
                "rl.advantage_estimator": "drgrpo",
                "rl.scale_by_std": False,
                "rl.loss_agg_mode": "seq-mean-token-sum-norm",
                "rl.kl_estimator": "k1",
                "rl.entropy_coef": 0.01,
                "rl.clip_high": 0.28,
                "rl.dual_clip": 3.0,
            }
        ),
    ),
    Variant(
        "rloo_gspo_buckets",
        "'rloo' (sample std), 'gspo' seq-mean-token-mean, k2; update length "
        "buckets: reference / behaviour forwards on the bucket, mismatch "
        "metric cut at the loss length, bucketed update",
        _rl(
            overrides={
                "rl.advantage_estimator": "rloo",
                "rl.std_ddof": 1,
                "rl.loss_type": "gspo",
                "rl.loss_agg_mode": "seq-mean-token-mean",
                "rl.kl_estimator": "k2",
                "rl.update_length_buckets": 3,
            }
        ),
    ),
    Variant(
        "rpp_cispo_micro",
        "'reinforce_pp_baseline', 'cispo', 2 micro-batches, 2 PPO epochs; SFT "
        "with 2 micro-batches",
        _rl(
            overrides={
                "rl.advantage_estimator": "reinforce_pp_baseline",
                "rl.loss_type": "cispo",
                "rl.num_microbatches": 2,
                "rl.ppo_epochs": 2,
                "sft.num_microbatches": 2,
            }
        ),
    ),
    Variant(
        "rpp_gspo_token_rewards",
        "'reinforce_pp', 'gspo_token'; reward components otc / tool_bonus, "
        "a linear schedule, reward noise (flip + dither), 'gdpo' composition",
        _rl(
            overrides={
                "rl.advantage_estimator": "reinforce_pp",
                "rl.loss_type": "gspo_token",
                "rl.rewards": {
                    "correct": 1.0,
                    "format": 0.1,
                    "otc": 1.0,
                    "tool_bonus": 1.0,
                },
                "rl.reward_schedules": {
                    "tool_bonus": {
                        "kind": "linear",
                        "start": 0.2,
                        "end": 0.0,
                        "steps": 2,
                    }
                },
                "rl.reward_noise": {"flip_p": 0.1, "dither_sigma": 0.05},
                "rl.reward_composition": "gdpo",
            }
        ),
    ),
    Variant(
        "hdpo_kl_reward_ds",
        "'hdpo'; KL-in-reward; adaptive KL (kl_target); overlong 'mask' and "
        "the soft overlong penalty; dynamic sampling x2 without retries "
        "(group selection and gather)",
        _rl(
            overrides={
                "rl.advantage_estimator": "hdpo",
                "rl.kl_reward_coef": 0.01,
                "rl.kl_target": 0.05,
                "rl.overlong_mode": "mask",
                "rl.overlong_soft_cache": 8,
                "rl.dynamic_sampling_oversample": 2,
            }
        ),
    ),
    Variant(
        "dynamic_sampling_retries",
        "dynamic sampling on 'correct' with 2 retry rounds (the while loop; "
        "an iteration without a usable group skips its update)",
        _rl(
            overrides={
                "rl.dynamic_sampling_oversample": 2,
                "rl.dynamic_sampling_max_retries": 2,
                "rl.dynamic_sampling_metric": "correct",
            }
        ),
    ),
    # -- Credit assignment and shaping --
    Variant(
        "per_turn_pbrs_progress",
        "credit 'per_turn' with the 'progress' potential, discount 0.9, "
        "pbrs_cutoff 'zero'",
        _rl(
            overrides={
                "rl.credit": "per_turn",
                "rl.pbrs_coef": 0.5,
                "rl.pbrs_potential": "progress",
                "rl.discount": 0.9,
                "rl.pbrs_cutoff": "zero",
            }
        ),
    ),
    Variant(
        "trace_likelihood",
        "credit 'trajectory' with the 'trace' potential (telescoped returns, "
        "pbrs_cutoff 'never'), the likelihood reward (shared gold pass)",
        _rl(
            overrides={
                "rl.pbrs_coef": 0.5,
                "rl.pbrs_potential": "trace",
                "rl.discount": 0.95,
                "rl.pbrs_cutoff": "never",
                "rl.likelihood_coef": 0.1,
            }
        ),
    ),
    Variant(
        "obs_prediction_aux",
        "'obs_prediction' potential delivered as an auxiliary loss "
        "(dense_as='aux_loss'), dark-room diagnostics, next-observation CE "
        "with placebo labels (loss length includes TOOL tokens)",
        _rl(
            overrides={
                "rl.credit": "per_turn",
                "rl.pbrs_coef": 0.5,
                "rl.pbrs_potential": "obs_prediction",
                "rl.dense_as": "aux_loss",
                "rl.obs_prediction_coef": 0.1,
                "rl.obs_prediction_placebo": True,
            }
        ),
    ),
    Variant(
        "value_potential",
        "value head as the PBRS potential (per-turn), behaviour values and "
        "Monte-Carlo value targets, value loss",
        _rl(
            overrides={
                "model.value_head": True,
                "rl.credit": "per_turn",
                "rl.pbrs_coef": 0.5,
                "rl.pbrs_potential": "value",
            }
        ),
    ),
    Variant(
        "gae_ppo",
        "'gae' from the value head (behaviour values, GAE advantages and "
        "returns), 2 PPO epochs",
        _rl(
            overrides={
                "model.value_head": True,
                "rl.advantage_estimator": "gae",
                "rl.gae_lambda": 0.9,
                "rl.ppo_epochs": 2,
            }
        ),
    ),
    Variant(
        "gigpo_product",
        "'gigpo' (anchor states at any turn), 'product' reward composition",
        _rl(
            overrides={
                "rl.advantage_estimator": "gigpo",
                "rl.gigpo_match_turn": False,
                "rl.gigpo_step_weight": 0.5,
                "rl.reward_composition": "product",
            }
        ),
    ),
    Variant(
        "tree_overlong_reward",
        "PORTool tree rollouts (2, 2) and tree advantages; overlong 'reward'",
        _rl(
            overrides={
                "rl.tree_branching": (2, 2),
                "rl.overlong_mode": "reward",
                "rl.overlong_reward": -0.5,
            }
        ),
    ),
    Variant(
        "step_reward_kv",
        "kv_chain env; per-turn 'valid_call' step rewards, 'clip' transform "
        "with the batch-quantile threshold",
        _rl(
            "kv_chain",
            overrides={
                "rl.credit": "per_turn",
                "rl.step_reward": "valid_call",
                "rl.step_reward_transform": "clip",
                "rl.step_reward_coef": 0.5,
                "rl.step_reward_clip_quantile": 0.5,
            },
        ),
    ),
    Variant(
        "spa_kv",
        "configs/spa_kv_chain.py: the SPA potential and its head in "
        "TrainState.features['spa'] (init, read, trained every step)",
        _rl("spa_kv_chain"),
    ),
    # -- Batch features and stateful features --
    Variant(
        "dual_path",
        "configs/dual_path.py: tool-free rows (logit mask), masked behaviour "
        "log-probs and behaviour_shift, dual_path_efficiency reward, "
        "dual-path metrics (with the tool_necessary label)",
        _rl("dual_path"),
    ),
    Variant(
        "dual_path_measure_dual_min",
        "dual path with tool-free rows out of the loss mask, sampler "
        "behaviour; dual ascent 'min' on num_tool_calls",
        _rl(
            "dual_path",
            overrides={
                "rl.dual_path_train_tool_free": False,
                "rl.behaviour_logprobs": "sampler",
                "rl.dual_constraint": "num_tool_calls",
                "rl.dual_sense": "min",
                "rl.dual_target": 0.5,
                "rl.dual_lr": 0.5,
                "rl.dual_init": 0.1,
            },
        ),
    ),
    Variant(
        "replay_inject_sil",
        "replay buffer: insertion, injection into failed groups, SIL samples "
        "and loss",
        _rl(
            overrides={
                "rl.replay_capacity": 8,
                "rl.replay_inject": True,
                "rl.replay_success_threshold": 0.1,
                "rl.sil_coef": 0.1,
                "rl.sil_batch_size": 2,
            }
        ),
    ),
    Variant(
        "stateful_resume",
        "budget env; FlowRL log Z (MLP) with its optimizer, replay + SIL, dual "
        "ascent 'max', adaptive KL; halted after the first RL step and "
        "resumed from its checkpoint (restores every feature's state)",
        _rl("budget", overrides=_STATEFUL),
        resume=True,
    ),
    Variant(
        "lora_dropout",
        "LoRA rank 4 with adapter dropout (reference = base + reference "
        "adapters; dropout keys per micro-batch; adapter-only checkpoint)",
        _rl(
            overrides={
                "model.lora.rank": 4,
                "model.lora.alpha": 8.0,
                "model.lora.dropout": 0.1,
            }
        ),
    ),
    Variant(
        "bf16_master",
        "bfloat16 parameters with float32 master weights (the master carried "
        "over at the SFT -> RL transition)",
        _rl(
            overrides={
                "model.param_dtype": "bfloat16",
                "model.dtype": "bfloat16",
            }
        ),
    ),
    # -- Learned reward models --
    Variant(
        "rm_train",
        "mode 'rm' (rm_train): SFT, then the outcome and process RMs; its "
        "workdir is the reward model of the two variants below",
        _rm_train,
        kind="rm",
    ),
    Variant(
        "rm_outcome_reward",
        "configs/rm_grpo.py:smoke: frozen ORM scored in the rollout, 'rm' "
        "reward component, over-optimisation monitor",
        _rm_grpo("smoke"),
        needs=("rm_dir",),
    ),
    Variant(
        "prm_pbrs_step_reward",
        "configs/rm_grpo.py:smoke,pbrs: PRM potentials ('rm' potential, "
        "per-turn credit) and 'prm' step rewards (facts rm_step_score)",
        _rm_grpo(
            "smoke,pbrs",
            {
                "rl.step_reward": "prm",
                "rl.step_reward_coef": 0.5,
            },
        ),
        needs=("rm_dir",),
    ),
    # -- Host environments --
    Variant(
        "host_bfcl",
        "configs/bfcl_grpo.py:smoke: host rollout (single turn, byte "
        "tokenizer), host batch trimming, call_score reward",
        _rl("bfcl_grpo", "smoke", native=False),
        requires=("bfcl_eval",),
    ),
    Variant(
        "host_gsm_tool_hf",
        "configs/gsm_tool.py:smoke from a tiny HF chat checkpoint: multi-turn "
        "host env with a sandboxed Python tool, HF tokenizer and import",
        _host_gsm_tool_hf,
        needs=("chat_ckpt",),
        requires=("reasoning_gym", "torch", "transformers", "tokenizers"),
    ),
    # -- Other training loops --
    Variant(
        "seeds_vmapped",
        f"seeds.train_seeds: the default smoke run for seeds {SEEDS} in one "
        "vmapped program (SFT, RL, per-seed evaluation)",
        _seeds,
        kind="seeds",
    ),
)

VARIANTS_BY_NAME = {v.name: v for v in VARIANTS}


def select(only: str | None) -> list[Variant]:
  """The variants named by a comma-separated list of names / fnmatch patterns
  (None or '': all), in VARIANTS order.

  Raises:
    SystemExit: a pattern that matches no variant.
  """
  if not only:
    return list(VARIANTS)
  patterns = [p.strip() for p in only.split(",") if p.strip()]
  for p in patterns:
    if not any(fnmatch.fnmatchcase(v.name, p) for v in VARIANTS):
      raise SystemExit(
          f"--only: {p!r} matches no variant; known: "
          f"{', '.join(VARIANTS_BY_NAME)}"
      )
  return [
      v
      for v in VARIANTS
      if any(fnmatch.fnmatchcase(v.name, p) for p in patterns)
  ]


# ---------------------------------------------------------------------------
# Fingerprints
# ---------------------------------------------------------------------------


def value_hex(x) -> str:
  """Exact text of a logged scalar: float.hex, 'null' for JSON null."""
  if x is None:
    return "null"
  return float(x).hex()


def leaf_fingerprint(x) -> dict[str, Any]:
  """dtype, shape, sum and sum of squares (float64 accumulation, float.hex)
  and the SHA-256 of the bytes of one array."""
  a = np.ascontiguousarray(np.asarray(x))
  f = a.astype(np.float64)
  return {
      "dtype": str(a.dtype),
      "shape": list(a.shape),
      "sum": float(np.sum(f)).hex(),
      "sumsq": float(np.sum(f * f)).hex(),
      "sha256": hashlib.sha256(a.tobytes()).hexdigest(),
  }


def tree_fingerprints(tree) -> dict[str, dict[str, Any]]:
  """{path: leaf_fingerprint} of every leaf of a pytree."""
  import jax  # pylint: disable=g-import-not-at-top

  leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
  return {jax.tree_util.keystr(path): leaf_fingerprint(x) for path, x in leaves}


def group_of(path: str) -> str:
  """'params', 'opt_state' or 'other': the part of the state a leaf path
  belongs to (for the per-part counts of the report only)."""
  head = path.split("]")[0].strip("['\"")
  if "opt" in head:
    return "opt_state"
  if head in ("params", "orm", "prm", "policy"):
    return "params"
  return "other"


# ---------------------------------------------------------------------------
# One variant (runs in its own process)
# ---------------------------------------------------------------------------


def runtime_env() -> dict[str, Any]:
  """Backend and devices of this process (from jax)."""
  import jax  # pylint: disable=g-import-not-at-top

  devices = jax.devices()
  return {
      "backend": jax.default_backend(),
      "device_count": len(devices),
      "device_kind": devices[0].device_kind if devices else "",
  }


def _read_metrics(workdir: str) -> dict[str, dict[str, str]]:
  """{step: {name: hex}} of metrics.jsonl (records of one step merged)."""
  out: dict[str, dict[str, str]] = {}
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    return out
  with open(path, encoding="utf-8") as f:
    for line in f:
      line = line.strip()
      if not line:
        continue
      record = json.loads(line)
      row = out.setdefault(str(record["step"]), {})
      for k, v in record.items():
        if k in ("step", "phase") or k.endswith(_UNTIMED):
          continue
        row[k] = value_hex(v)
  return out


def _read_json_scalars(path: str, prefix: str) -> dict[str, str]:
  """{prefix/name: hex} of a JSON file of scalars (missing file: {})."""
  if not os.path.exists(path):
    return {}
  with open(path) as f:
    report = json.load(f)
  return {
      f"{prefix}/{k}": value_hex(v)
      for k, v in sorted(report.items())
      if isinstance(v, (int, float)) or v is None
  }


def read_checkpoint(directory: str):
  """(step, state) of the newest checkpoint under `directory`, read without a
  target structure (nested dicts of numpy arrays; as the checkpoint holds it,
  independent of the TrainState class that wrote it)."""
  import jax  # pylint: disable=g-import-not-at-top
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  steps = sorted(int(d) for d in os.listdir(directory) if d.isdigit())
  if not steps:
    raise FileNotFoundError(f"no checkpoint in {directory}")
  path = os.path.join(directory, str(steps[-1]), "default")
  ckptr = ocp.PyTreeCheckpointer()
  meta = ckptr.metadata(path)
  meta = getattr(meta, "item_metadata", meta)
  tree = getattr(meta, "tree", meta)
  args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
  return steps[-1], ckptr.restore(path, restore_args=args)


def _config_sha(workdir: str, root: str) -> str:
  """SHA-256 of the run's resolved config.json, with the work folder's path
  replaced (for a note only: a refactor may rename fields)."""
  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path):
    return ""
  with open(path) as f:
    text = f.read().replace(root, "<root>")
  return hashlib.sha256(text.encode()).hexdigest()


def _dir_sha(path: str) -> str:
  """SHA-256 over the names and bytes of every file under `path`."""
  h = hashlib.sha256()
  for dirpath, dirnames, filenames in os.walk(path):
    dirnames.sort()
    for name in sorted(filenames):
      full = os.path.join(dirpath, name)
      h.update(os.path.relpath(full, path).encode())
      with open(full, "rb") as f:
        h.update(f.read())
  return h.hexdigest()


def _warnings(metrics: dict[str, dict[str, str]]) -> list[str]:
  """Signs that a variant exercises less than it claims (advantages all 0,
  every update skipped, an empty replay buffer)."""
  out = []

  def column(name):
    return [
        float.fromhex(row[name])
        for row in metrics.values()
        if row.get(name, "null") != "null"
    ]

  for name, why in (
      ("rl/adv_abs_mean", "advantages are 0 at every step"),
      ("rl/replay_size", "the replay buffer stays empty"),
  ):
    col = column(name)
    if col and all(v == 0.0 for v in col):
      out.append(f"{name}: {why}")
  col = column("rl/skipped_update")
  if col and all(v == 1.0 for v in col):
    out.append("rl/skipped_update: every RL update was skipped")
  return out


def run_variant(
    name: str, workdir: str, rm_dir: str | None = None
) -> dict[str, Any]:
  """Runs one variant in this process; returns its record (see module doc)."""
  v = VARIANTS_BY_NAME[name]
  root = os.path.dirname(os.path.abspath(workdir))
  missing = [m for m in v.requires if importlib.util.find_spec(m) is None]
  if missing:
    return {"skipped": f"missing module(s) {', '.join(missing)}"}
  fixtures: dict[str, str] = {}
  out: dict[str, Any] = {}
  if "rm_dir" in v.needs:
    if not rm_dir:
      raise ValueError(f"{name} needs --rm_dir (the rm_train variant's)")
    fixtures["rm_dir"] = rm_dir
  if "chat_ckpt" in v.needs:
    # Loaded from its file: tests/ is not a package.
    spec = importlib.util.spec_from_file_location(
        "chat_fixtures", os.path.join(REPO, "tests", "chat_fixtures.py")
    )
    chat_fixtures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(chat_fixtures)
    path = workdir + "_chat_ckpt"
    chat_fixtures.write_chat_checkpoint(path)
    fixtures["chat_ckpt"] = path
    out["fixture_sha256"] = _dir_sha(path)
  config = v.build(fixtures)
  config.name = f"bit_identity_{name}"
  t0 = time.time()
  eval_scalars: dict[str, str] = {}
  if v.kind == "rl":
    from agentic_rl import train  # pylint: disable=g-import-not-at-top

    if v.resume:
      # A checkpoint after the first RL step to resume from.
      config.checkpoint.every_steps = 1
      total = config.halt_after_step
      config.halt_after_step = config.sft.steps + 1
      train.train_and_evaluate(copy.deepcopy(config), workdir)
      config.halt_after_step = total
    train.train_and_evaluate(config, workdir)
    eval_scalars = _read_json_scalars(
        os.path.join(workdir, "eval_sft.json"), "eval_sft"
    )
  elif v.kind == "rm":
    from agentic_rl import rm_train  # pylint: disable=g-import-not-at-top

    rm_train.train_and_evaluate_rm(config, workdir)
  elif v.kind == "seeds":
    from agentic_rl import seeds  # pylint: disable=g-import-not-at-top

    result = seeds.train_seeds(config, SEEDS, workdir)
    # The curves hold every step's metrics ([steps, S] float64 of float32).
    metrics: dict[str, dict[str, str]] = {}
    sft_steps = config.sft.steps
    for key, rows in sorted(result["curves"].items()):
      offset = 0 if key.startswith("sft/") else sft_steps
      if key.endswith(_UNTIMED):
        continue
      for i, row in enumerate(np.asarray(rows)):
        for s, x in zip(SEEDS, np.reshape(row, (-1,))):
          step = metrics.setdefault(str(offset + i + 1), {})
          step[f"{key}[seed{s}]"] = value_hex(None if not np.isfinite(x) else x)
    for phase in ("sft", "rl"):
      for s, report in zip(SEEDS, result[phase]):
        for k, x in sorted(report.items()):
          if isinstance(x, (int, float)):
            eval_scalars[f"eval_{phase}/{k}[seed{s}]"] = value_hex(x)
    out["metrics"] = metrics
  else:
    raise ValueError(f"{name}: unknown kind {v.kind!r}")
  out["wall_s"] = round(time.time() - t0, 1)
  if "metrics" not in out:
    out["metrics"] = _read_metrics(workdir)
  out["eval"] = eval_scalars
  step, state = read_checkpoint(os.path.join(workdir, "checkpoints"))
  out["checkpoint_step"] = step
  out["state"] = tree_fingerprints(state)
  out["config_sha256"] = _config_sha(workdir, root)
  out["warnings"] = _warnings(out["metrics"])
  out["env"] = runtime_env()
  return out


# ---------------------------------------------------------------------------
# Comparison
# ---------------------------------------------------------------------------


# Header fields that must agree for a comparison to mean anything.
_COMPARED_ENV = (
    "harness_version",
    "python",
    "machine",
    "cpu",
    "cpu_count",
    "backend",
    "device_count",
    "device_kind",
    "env_vars",
    "versions",
)


def env_mismatches(ref: dict, new: dict) -> list[str]:
  """'field: ref -> new' for every compared header field that differs."""
  out = []
  for k in _COMPARED_ENV:
    a, b = ref.get(k), new.get(k)
    if isinstance(a, dict) and isinstance(b, dict):
      for sub in sorted(set(a) | set(b)):
        if a.get(sub) != b.get(sub):
          out.append(f"{k}.{sub}: {a.get(sub)!r} -> {b.get(sub)!r}")
    elif a != b:
      out.append(f"{k}: {a!r} -> {b!r}")
  return out


@dataclasses.dataclass
class VariantReport:
  """Result of comparing one variant: status 'ok', 'DIFF', 'ERROR' (failed
  now), 'SKIPPED' (skipped in the reference), 'UNCHECKED' (skipped now, not
  in the reference), 'NO-REF' (not in the reference)."""

  name: str
  status: str
  metrics: tuple[int, int] = (0, 0)
  state: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)
  evals: tuple[int, int] = (0, 0)
  diffs: list[str] = dataclasses.field(default_factory=list)
  notes: list[str] = dataclasses.field(default_factory=list)


def _rel(a_hex: str, b_hex: str) -> str:
  a, b = float.fromhex(a_hex), float.fromhex(b_hex)
  scale = max(abs(a), abs(b))
  return "0" if scale == 0 else f"{abs(a - b) / scale:.2g}"


def _compare_scalars(
    ref: dict[str, str], new: dict[str, str], where: str, allow_new: bool
):
  """(equal, total, diffs) of two {name: hex} dicts."""
  equal, diffs = 0, []
  for k in sorted(ref):
    if k not in new:
      diffs.append(f"{where}{k}: missing")
    elif new[k] == ref[k]:
      equal += 1
    else:
      rel = (
          "" if "null" in (ref[k], new[k]) else f" (rel {_rel(ref[k], new[k])})"
      )
      diffs.append(f"{where}{k}: {ref[k]} -> {new[k]}{rel}")
  if not allow_new:
    diffs += [f"{where}{k}: new" for k in sorted(set(new) - set(ref))]
  return equal, len(ref), diffs


def _content(fp: dict) -> tuple:
  return fp["dtype"], tuple(fp["shape"]), fp["sha256"]


def _compare_state(ref: dict, new: dict, allow_new: bool):
  """(per-group (equal, total), diffs, notes) of two {path: fingerprint}."""
  counts = collections.defaultdict(lambda: [0, 0])
  diffs, notes = [], []
  unmatched = []
  for path in sorted(ref):
    g = group_of(path)
    counts[g][1] += 1
    if path not in new:
      unmatched.append(path)
    elif _content(new[path]) == _content(ref[path]):
      counts[g][0] += 1
    else:
      a, b = ref[path], new[path]
      if (a["dtype"], a["shape"]) != (b["dtype"], b["shape"]):
        diffs.append(
            f"{path}: {a['dtype']}{a['shape']} -> {b['dtype']}{b['shape']}"
        )
      else:
        diffs.append(
            f"{path}: sum {a['sum']} -> {b['sum']} (rel "
            f"{_rel(a['sum'], b['sum'])}), sumsq rel "
            f"{_rel(a['sumsq'], b['sumsq'])}"
        )
  extra = [p for p in sorted(new) if p not in ref]
  pool = collections.Counter(_content(new[p]) for p in extra)
  relocated = 0
  for path in unmatched:
    key = _content(ref[path])
    if pool[key] > 0:
      pool[key] -= 1
      relocated += 1
      counts[group_of(path)][0] += 1
    else:
      diffs.append(f"{path}: missing (no leaf with the same content)")
  if relocated:
    notes.append(f"{relocated} state leaves relocated (matched by content)")
  left = sum(pool.values())
  if left and not allow_new:
    shown = [p for p in extra if pool[_content(new[p])] > 0][:5]
    diffs.append(f"{left} new state leaves, e.g. {shown}")
  return {g: tuple(c) for g, c in sorted(counts.items())}, diffs, notes


def compare_variant(
    name: str, ref: dict | None, new: dict | None, allow_new: bool = False
) -> VariantReport:
  """Compares the records of one variant (see VariantReport)."""
  if ref is None:
    return VariantReport(name, "NO-REF")
  if "skipped" in ref:
    return VariantReport(name, "SKIPPED", notes=[ref["skipped"]])
  if "error" in ref:
    return VariantReport(name, "SKIPPED", notes=["failed when recorded"])
  if new is None or "error" in new:
    why = ((new or {}).get("error") or "not run").strip().splitlines()
    return VariantReport(name, "ERROR", diffs=why[-1:] or ["failed"])
  if "skipped" in new:
    return VariantReport(name, "UNCHECKED", diffs=[new["skipped"]])
  m_eq = m_tot = 0
  diffs: list[str] = []
  steps = set(ref["metrics"]) | set(new["metrics"])
  for step in sorted(steps, key=int):
    eq, tot, d = _compare_scalars(
        ref["metrics"].get(step, {}),
        new["metrics"].get(step, {}),
        f"step {step} ",
        allow_new,
    )
    m_eq, m_tot = m_eq + eq, m_tot + tot
    diffs += d
  e_eq, e_tot, d = _compare_scalars(ref["eval"], new["eval"], "", allow_new)
  diffs += d
  state, d, notes = _compare_state(ref["state"], new["state"], allow_new)
  diffs += d
  if ref.get("checkpoint_step") != new.get("checkpoint_step"):
    diffs.append(
        f"checkpoint step {ref.get('checkpoint_step')} -> "
        f"{new.get('checkpoint_step')}"
    )
  if ref.get("config_sha256") != new.get("config_sha256"):
    notes.append("resolved config.json differs (renamed or added fields?)")
  if ref.get("fixture_sha256") != new.get("fixture_sha256"):
    notes.append("the chat checkpoint fixture differs (tests/chat_fixtures.py)")
  return VariantReport(
      name,
      "DIFF" if diffs else "ok",
      metrics=(m_eq, m_tot),
      state=state,
      evals=(e_eq, e_tot),
      diffs=diffs,
      notes=notes,
  )


def format_table(reports: list[VariantReport], max_diffs: int = 5) -> str:
  """The per-variant table of `check`, with the first differences."""

  def frac(t):
    return f"{t[0]}/{t[1]}" if t[1] else "-"

  head = (
      f"{'variant':<28} {'status':<9} {'metrics':>11} {'params':>9} "
      f"{'opt_state':>9} {'other':>7} {'eval':>7}"
  )
  lines = [head, "-" * len(head)]
  for r in reports:
    lines.append(
        f"{r.name:<28} {r.status:<9} {frac(r.metrics):>11} "
        f"{frac(r.state.get('params', (0, 0))):>9} "
        f"{frac(r.state.get('opt_state', (0, 0))):>9} "
        f"{frac(r.state.get('other', (0, 0))):>7} {frac(r.evals):>7}"
    )
    for d in r.diffs[:max_diffs]:
      lines.append(f"    - {d}")
    if len(r.diffs) > max_diffs:
      lines.append(f"    ... and {len(r.diffs) - max_diffs} more")
    for n in r.notes:
      lines.append(f"    note: {n}")
  return "\n".join(lines)


# ---------------------------------------------------------------------------
# Orchestration (parent process)
# ---------------------------------------------------------------------------


def _cpu_model() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor()


def _versions() -> dict[str, str | None]:
  out = {}
  for lib in LIBRARIES:
    try:
      out[lib] = importlib.metadata.version(lib)
    except importlib.metadata.PackageNotFoundError:
      out[lib] = None
  return out


def _git(*args: str) -> str:
  try:
    return subprocess.run(
        ["git", *args], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return ""


def host_header() -> dict[str, Any]:
  """What a record's numbers depend on, as far as the parent can tell (the
  backend and devices come from the variants' processes)."""
  return {
      "harness_version": HARNESS_VERSION,
      "python": platform.python_version(),
      "machine": platform.machine(),
      "cpu": _cpu_model(),
      "cpu_count": os.cpu_count(),
      "env_vars": {
          k: v
          for k, v in sorted(os.environ.items())
          if k.startswith(("XLA_", "JAX_")) and "CACHE" not in k
      },
      "versions": _versions(),
  }


def _run_child(
    v: Variant, root: str, cache: str | None, rm_dir: str | None, timeout: int
) -> dict[str, Any]:
  """Runs one variant in a fresh Python process; returns its record."""
  workdir = os.path.join(root, v.name)
  out = os.path.join(root, f"{v.name}.json")
  log = os.path.join(root, f"{v.name}.log")
  cmd = [
      sys.executable,
      "-m",
      "experiments.bit_identity",
      "_child",
      f"--variant={v.name}",
      f"--workdir={workdir}",
      f"--out={out}",
  ]
  if rm_dir:
    cmd.append(f"--rm_dir={rm_dir}")
  if cache:
    cmd.append(f"--compilation_cache={cache}")
  t0 = time.time()
  with open(log, "w") as f:
    try:
      proc = subprocess.run(
          cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, timeout=timeout
      )
      rc = proc.returncode
    except subprocess.TimeoutExpired:
      rc = "timeout"
  if rc == 0 and os.path.exists(out):
    with open(out) as f:
      record = json.load(f)
  else:
    with open(log, errors="replace") as f:
      tail = f.read()[-3000:]
    record = {"error": f"exit {rc}; log {log}:\n{tail}"}
  status = (
      "error"
      if "error" in record
      else ("skipped" if "skipped" in record else "done")
  )
  print(
      f"  {v.name:<28} {status:<8} {time.time() - t0:6.0f} s",
      flush=True,
  )
  return record


def run_all(
    variants: list[Variant],
    root: str,
    *,
    jobs: int = 1,
    cache: str | None = None,
    timeout: int = 3600,
) -> dict[str, dict]:
  """Runs the variants (rm_train first when a selected variant needs its
  reward model); returns {name: record}."""
  os.makedirs(root, exist_ok=True)
  records: dict[str, dict] = {}
  names = {v.name for v in variants}
  rm_dir = None
  if any("rm_dir" in v.needs for v in variants) or "rm_train" in names:
    records["rm_train"] = _run_child(
        VARIANTS_BY_NAME["rm_train"], root, cache, None, timeout
    )
    if "error" not in records["rm_train"]:
      rm_dir = os.path.join(root, "rm_train")
  rest = [v for v in variants if v.name != "rm_train"]
  with concurrent.futures.ThreadPoolExecutor(max(1, jobs)) as pool:
    futures = {
        v.name: pool.submit(
            _run_child,
            v,
            root,
            cache,
            rm_dir if "rm_dir" in v.needs else None,
            timeout,
        )
        for v in rest
        if not ("rm_dir" in v.needs and rm_dir is None)
    }
    for v in rest:
      if v.name in futures:
        records[v.name] = futures[v.name].result()
      else:
        records[v.name] = {"error": "the rm_train variant failed"}
  if "rm_train" not in names:
    records.pop("rm_train", None)
  return {v.name: records[v.name] for v in variants}


def _header(records: dict[str, dict]) -> dict[str, Any]:
  header = host_header()
  envs = [r["env"] for r in records.values() if "env" in r]
  if envs:
    header.update(envs[0])
    if any(e != envs[0] for e in envs):
      print(
          "warning: the variants' processes saw different backends/devices",
          file=sys.stderr,
      )
  header["created"] = datetime.datetime.now(datetime.timezone.utc).isoformat(
      timespec="seconds"
  )
  header["git_commit"] = _git("rev-parse", "HEAD")
  header["git_dirty"] = bool(_git("status", "--porcelain"))
  header["rl_steps"] = RL_STEPS
  return header


def _work_root(args) -> tuple[str, bool]:
  """(work folder, whether this call created it and may remove it)."""
  if args.workdir:
    return os.path.abspath(args.workdir), False
  return tempfile.mkdtemp(prefix="bit_identity_"), True


def _cache(args, root: str) -> str | None:
  if args.no_cache:
    return None
  return os.path.abspath(args.compilation_cache or os.path.join(root, "xla"))


def _write(path: str, obj) -> None:
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(obj, f, indent=1, sort_keys=True)
  os.replace(tmp, path)


def cmd_record(args) -> int:
  variants = select(args.only)
  root, temporary = _work_root(args)
  print(f"recording {len(variants)} variant(s) in {root}", flush=True)
  records = run_all(
      variants,
      root,
      jobs=args.jobs,
      cache=_cache(args, root),
      timeout=args.timeout,
  )
  _write(args.out, {"header": _header(records), "variants": records})
  failed = [n for n, r in records.items() if "error" in r]
  for n, r in records.items():
    for w in r.get("warnings", ()):
      print(f"warning: {n}: {w}")
    if "skipped" in r:
      print(f"skipped: {n}: {r['skipped']}")
  for n in failed:
    print(f"FAILED: {n}: {records[n]['error'][-1500:]}")
  print(f"wrote {args.out}")
  if temporary and not failed and not args.keep:
    shutil.rmtree(root, ignore_errors=True)
  elif failed or args.keep:
    print(f"work folder kept: {root}")
  return 1 if failed else 0


def cmd_check(args) -> int:
  with open(args.ref) as f:
    ref = json.load(f)
  here = host_header()
  refused = env_mismatches(ref["header"], {**ref["header"], **here})
  if refused and not args.force:
    print(
        "refused: the reference was recorded under a different setup "
        "(--force compares anyway):\n  " + "\n  ".join(refused)
    )
    return 2
  variants = select(args.only)
  root, temporary = _work_root(args)
  print(f"checking {len(variants)} variant(s) in {root}", flush=True)
  records = run_all(
      variants,
      root,
      jobs=args.jobs,
      cache=_cache(args, root),
      timeout=args.timeout,
  )
  header = _header(records)
  refused = env_mismatches(ref["header"], header)
  if args.out:
    _write(args.out, {"header": header, "variants": records})
  reports = [
      compare_variant(
          v.name,
          ref["variants"].get(v.name),
          records.get(v.name),
          allow_new=args.allow_new,
      )
      for v in variants
  ]
  print(format_table(reports))
  if refused:
    print("setup differs from the reference's:\n  " + "\n  ".join(refused))
  bad = [r for r in reports if r.status in ("DIFF", "ERROR", "UNCHECKED")]
  print(
      f"{len(reports) - len(bad)}/{len(reports)} variants without a "
      f"difference; {len(bad)} with one"
      + (" (reference setup differs: --force)" if refused else "")
  )
  if temporary and not bad and not args.keep:
    shutil.rmtree(root, ignore_errors=True)
  else:
    print(f"work folder kept: {root}")
  if refused and not args.force:
    return 2
  return 1 if bad else 0


def cmd_list(args) -> int:
  del args
  for v in VARIANTS:
    extra = f" [needs {', '.join(v.needs)}]" if v.needs else ""
    print(f"{v.name:<28} {v.kind:<5} {v.covers}{extra}")
  return 0


def cmd_child(args) -> int:
  """Runs one variant in this process and writes its record to --out."""
  if args.compilation_cache:
    import jax  # pylint: disable=g-import-not-at-top

    jax.config.update("jax_compilation_cache_dir", args.compilation_cache)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  try:
    record = run_variant(args.variant, args.workdir, args.rm_dir)
  except Exception:  # pylint: disable=broad-except
    record = {"error": traceback.format_exc()}
  _write(args.out, record)
  return 0


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
      prog="python -m experiments.bit_identity",
      description=__doc__.split("\n\n")[1],
      formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  sub = parser.add_subparsers(dest="command", required=True)
  run_args = argparse.ArgumentParser(add_help=False)
  run_args.add_argument(
      "--only", default="", help="comma-separated names or fnmatch patterns"
  )
  run_args.add_argument(
      "--jobs", type=int, default=1, help="variants run at once"
  )
  run_args.add_argument(
      "--workdir", default="", help="work folder (default: a temporary one)"
  )
  run_args.add_argument(
      "--keep", action="store_true", help="keep the work folder"
  )
  run_args.add_argument(
      "--compilation_cache",
      default="",
      help="persistent XLA cache folder (default: one in the work folder)",
  )
  run_args.add_argument("--no_cache", action="store_true")
  run_args.add_argument(
      "--timeout", type=int, default=3600, help="seconds per variant"
  )
  p = sub.add_parser("record", parents=[run_args], help="record a reference")
  p.add_argument("--out", required=True)
  p.set_defaults(fn=cmd_record)
  p = sub.add_parser("check", parents=[run_args], help="compare with one")
  p.add_argument("--ref", required=True)
  p.add_argument("--out", default="", help="also write this run's record")
  p.add_argument("--force", action="store_true", help="compare across setups")
  p.add_argument(
      "--allow_new",
      action="store_true",
      help="metrics / state leaves the reference lacks are not differences",
  )
  p.set_defaults(fn=cmd_check)
  p = sub.add_parser("list", help="the variants and what they cover")
  p.set_defaults(fn=cmd_list)
  p = sub.add_parser("_child", help=argparse.SUPPRESS)
  p.add_argument("--variant", required=True)
  p.add_argument("--workdir", required=True)
  p.add_argument("--out", required=True)
  p.add_argument("--rm_dir", default="")
  p.add_argument("--compilation_cache", default="")
  p.set_defaults(fn=cmd_child)
  args = parser.parse_args(argv)
  if getattr(args, "no_cache", False) and args.compilation_cache:
    # --no_cache wins in `_cache`: the folder would be parsed and ignored.
    print(
        f"error: --compilation_cache={args.compilation_cache} with --no_cache:"
        " pass one of them",
        file=sys.stderr,
    )
    return 2
  return args.fn(args)


if __name__ == "__main__":
  sys.exit(main())
