"""Shared pieces of the learner: the optimizer, the POLICY mask and the
teacher-forced forward that both the loss and the behaviour recomputation call.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from agentic_rl import mixed_precision
from agentic_rl import sampling
from agentic_rl import types
from agentic_rl.models import lora as lora_lib
from agentic_rl.models import transformer

StepFn = Callable[
    [types.TrainState], tuple[types.TrainState, dict[str, jax.Array]]
]


def make_optimizer(cfg) -> optax.GradientTransformation:
  """AdamW with global-norm clipping and linear warmup then constant LR.

  The learning rate of update k (k = 0, 1, ...) is lr * k / warmup_steps during
  the warmup, then lr; warmup_steps = 0 means lr from the first update (a
  one-step linear schedule would give the first update a learning rate of 0).

  Low-precision (bfloat16) parameters get float32 master weights and float32
  optimizer state (`mixed_precision.with_float32_master`); for float32
  parameters the optimizer and its state are the plain chain.

  Args:
    cfg: ConfigDict with learning_rate, warmup_steps, weight_decay, max_grad_norm.
  """
  if int(cfg.warmup_steps) <= 0:
    schedule = optax.constant_schedule(cfg.learning_rate)
  else:
    schedule = optax.linear_schedule(
        0.0, cfg.learning_rate, int(cfg.warmup_steps)
    )
  # With LoRA adapters in the params, only they are optimised (models/lora.py);
  # low-precision trainable params get float32 master weights.
  return lora_lib.optimizer(
      mixed_precision.with_float32_master(
          optax.chain(
              optax.clip_by_global_norm(cfg.max_grad_norm),
              optax.adamw(
                  schedule, b1=0.9, b2=0.99, weight_decay=cfg.weight_decay
              ),
          )
      )
  )


def policy_mask(traj: types.Trajectory) -> jax.Array:
  """[B, L] bool loss mask: True exactly on POLICY (sampled) tokens."""
  return traj.role == types.POLICY


def adapter_dropout_key(config, state: types.TrainState):
  """The step's LoRA adapter-dropout key, or None without adapter dropout.

  Stream 6 of fold_in(rng, step) (the collect and SFT stages use streams
  0-5); the SFT and RL updates fold in the optimizer step and micro-batch.
  """
  lora_cfg = lora_lib.from_config(getattr(config.model, "lora", None))
  if lora_cfg is None or not lora_cfg.dropout > 0:
    return None
  return jax.random.fold_in(jax.random.fold_in(state.rng, state.step), 6)


def rollout_shared_prefix(rl_cfg) -> transformer.SharedPrefix | None:
  """The shared-prefix layout of the sampled batch, or None
  (`rl.shared_prefix_len` 0, the default).

  The batch is group-major (rl.group_size consecutive episodes per task), and
  the episodes of a group start with the same prompt, so their first
  `rl.shared_prefix_len` tokens are equal whenever that is at most the
  shortest prompt (arXiv:2506.05433); the rollout prefills them once per
  group.
  """
  length = rl_cfg.get("shared_prefix_len", 0)
  if not length:
    return None
  return transformer.SharedPrefix(length, rl_cfg.group_size)


def shared_prefix(rl_cfg) -> transformer.SharedPrefix | None:
  """The shared-prefix layout of the update's blocks, or None.

  A minibatch takes every num_minibatches-th row (`sharding.split_rows`), so
  with M = rl.num_minibatches dividing G = rl.group_size it holds G / M
  consecutive rows of every group, in order: its rows come in groups of G / M
  that share the prompt. Its micro-batches are cut by those groups
  (`split_unit`), so the policy, behaviour and reference forwards over them
  compute the first `rl.shared_prefix_len` positions once per G / M rows.
  The update checks the equality on every micro-batch (metric
  'shared_prefix_mismatch_max', 1 where some row differs from its group's
  first row; the loop stops the run on it).
  """
  prefix = rollout_shared_prefix(rl_cfg)
  if prefix is None:
    return None
  return transformer.SharedPrefix(
      prefix.length, rl_cfg.group_size // rl_cfg.num_minibatches
  )


def split_unit(rl_cfg) -> int:
  """Rows kept together by the update's micro-batch split
  (`sharding.split_rows`): the groups of `shared_prefix`, single rows
  without one."""
  prefix = shared_prefix(rl_cfg)
  return 1 if prefix is None else prefix.group


def shared_prefix_mismatch(
    tokens_bl: jax.Array, prefix: transformer.SharedPrefix | None
) -> jax.Array:
  """1.0 if some row's first `prefix.length` tokens differ from its group's
  first row, else 0.0 (float32 scalar; 0.0 without a prefix)."""
  if prefix is None:
    return jnp.float32(0.0)
  s, g = prefix.length, prefix.group
  head = tokens_bl[:, :s].reshape(-1, g, min(s, tokens_bl.shape[1]))
  return jnp.any(head != head[:, :1]).astype(jnp.float32)


def policy_forward(
    graphdef,
    params,
    tokens_bl: jax.Array,
    temperature,
    with_values: bool = False,
    targets_bl: jax.Array | None = None,
    dropout_key: jax.Array | None = None,
    prefix: transformer.SharedPrefix | None = None,
):
  """Teacher-forced log-probs, entropies and (optionally) values of a batch.

  The one function both the loss and the behaviour recomputation call, so the
  two see the same computation. Without values it is exactly
  `sampling.token_logprobs`. With values, one trunk pass gives both heads:
  hidden h_t = model.hidden_states(tokens[:, :-1])[:, t] reads tokens 0..t,
  logp[:, t + 1] = log_softmax(lm_head(h_t) / T)[tokens[:, t + 1]] and
  values[:, t + 1] = model.value(h_t): the value of a token is the value of
  the state (the whole prefix, prompt, observations and template tokens
  included) just BEFORE that token is emitted, i.e. V(s) of the state in
  which the token is the action. Position 0 gets 0 for all three.

  Args:
    graphdef, params: the policy (value_head=True when with_values).
    tokens_bl: [B, L] int32.
    temperature: sampling temperature (> 0).
    with_values: also return values (needs TransformerConfig.value_head).
    targets_bl: optional [B, L] int32 tokens to score in place of tokens_bl
      (the context stays tokens_bl): logp[:, t] = log p(targets[:, t] |
      tokens[:, :t]). Used by the shuffled-label placebo of the auxiliary
      next-observation loss (`rl.obs_prediction_placebo`, which changes
      targets at TOOL positions only). None = tokens_bl.
    dropout_key: PRNG key turning LoRA adapter dropout (`model.lora.dropout`)
      on for this forward; the RL loss passes one per micro-batch, every other
      forward (sampling, reference, behaviour) none. None = deterministic.
    prefix: optional `transformer.SharedPrefix` of the batch's rows
      (`shared_prefix`); same results up to float summation order.

  Returns:
    (logp [B, L] float32, entropy [B, L] float32, values [B, L] float32 or
     None).

  Raises:
    ValueError: with_values and the model has no value head.
  """
  if not with_values and targets_bl is None:
    # The key is passed only when set: without dropout the call is the
    # plain token_logprobs(graphdef, params, tokens, T).
    kw = {} if dropout_key is None else {"dropout_key": dropout_key}
    if prefix is not None:
      kw["shared_prefix"] = prefix
    logp, entropy = sampling.token_logprobs(
        graphdef, params, tokens_bl, temperature, **kw
    )
    return logp, entropy, None
  model = nnx.merge(graphdef, params)
  if dropout_key is not None:
    lora_lib.set_dropout_key(model, dropout_key)
  targets_bl = tokens_bl if targets_bl is None else targets_bl
  logp, entropy, hidden_bld = sampling.shared_prefix_logprob_and_entropy(
      model,
      tokens_bl[:, :-1],
      targets_bl[:, 1:],
      temperature,
      model.cfg.logprob_chunk_size,
      prefix,
  )
  pad = jnp.zeros((tokens_bl.shape[0], 1), jnp.float32)
  cat = lambda x: jnp.concatenate([pad, x.astype(jnp.float32)], axis=1)
  if not with_values:
    return cat(logp), cat(entropy), None
  values = model.value(hidden_bld)
  return cat(logp), cat(entropy), cat(values)


def d_model(params) -> int:
  """Hidden width D of the policy, read from its embedding table [V, D]."""
  return int(jnp.shape(params["embed_vd"][...])[-1])
