"""SFT stage: token-mean NLL on expert demonstrations, with gradient
accumulation, and the jitted SFT step.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from absl import logging
from flax import nnx

from agentic_rl import losses
from agentic_rl import mixed_precision
from agentic_rl import padding
from agentic_rl import host_rollout
from agentic_rl import rollout
from agentic_rl import sampling
from agentic_rl import sharding
from agentic_rl import types
from agentic_rl.models import lora as lora_lib
from agentic_rl.learner.common import StepFn, adapter_dropout_key, policy_mask
from environments.host import base as host_base


def sft_loss(
    graphdef,
    params,
    traj: types.Trajectory,
    denominator=None,
    dropout_key=None,
):
  """Token-mean negative log-likelihood of the POLICY tokens of demonstrations.

  Args:
    graphdef, params: the policy.
    traj: demonstrations, [B, L] arrays.
    denominator: the token count to divide the summed NLL by; None = this
      batch's POLICY-token count (clamped to >= 1). Gradient accumulation passes
      the whole batch's count so that the micro-batch losses sum to the
      full-batch token mean.
    dropout_key: PRNG key of the LoRA adapter-dropout masks
      (`model.lora.dropout` > 0); None = deterministic.

  Returns:
    (loss, {"loss", "policy_tokens"}): float32 scalars; policy_tokens is the
    mean POLICY-token count per demonstration.
  """
  logp, _ = sampling.token_logprobs(
      graphdef, params, traj.tokens, 1.0, dropout_key=dropout_key
  )
  mask = policy_mask(traj)
  if denominator is None:
    nll = losses.token_mean(-logp, mask)
  else:
    nll = jnp.sum(-logp * mask.astype(jnp.float32)) / denominator
  policy_tokens = jnp.mean(jnp.sum(mask, axis=1).astype(jnp.float32))
  return nll, {"loss": nll, "policy_tokens": policy_tokens}


def sft_grad(
    graphdef,
    params,
    traj: types.Trajectory,
    num_microbatches: int = 1,
    dropout_key=None,
):
  """(loss, metrics, grads) of `sft_loss` with gradient accumulation.

  The [B, L] batch is cut into `num_microbatches` blocks of rows by a strided
  split (row i in block i % num_microbatches, `sharding.split_rows`, so that
  on a device mesh every block keeps each device's share of the rows),
  scanned with `lax.scan`; each block's summed NLL is divided by the whole
  batch's POLICY-token count, so the accumulated loss and gradient equal the
  full-batch token mean (up to float summation order) while only one block's
  activations are live at a time. `dropout_key` (LoRA adapter dropout only):
  block k draws its masks from fold_in(dropout_key, k); None = none.

  Raises:
    ValueError: if num_microbatches does not divide B.
  """
  rows = traj.tokens.shape[0]
  if num_microbatches < 1 or rows % num_microbatches:
    raise ValueError(
        f"sft.num_microbatches={num_microbatches} must divide the "
        f"batch ({rows} demonstrations)"
    )
  # With LoRA adapters, only they are differentiated (models/lora.py).
  grad_fn = lora_lib.value_and_grad(
      lambda p, t, d, k: sft_loss(graphdef, p, t, d, k), has_aux=True
  )
  block_key = lambda k: (
      None if dropout_key is None else jax.random.fold_in(dropout_key, k)
  )
  if num_microbatches == 1:
    (loss, metrics), grads = grad_fn(params, traj, None, block_key(0))
    return loss, metrics, grads
  mask = policy_mask(traj)
  denominator = jnp.maximum(jnp.sum(mask.astype(jnp.float32)), 1.0)
  # Only the fields sft_loss reads are cut into blocks.
  blocks = sharding.split_rows((traj.tokens, traj.role), num_microbatches)

  def micro(acc, xs):
    block, k = xs
    tokens, role = sharding.constrain_batch(block)
    (loss, m), g = grad_fn(
        params,
        traj.replace(tokens=tokens, role=role),
        denominator,
        block_key(k),
    )
    acc_loss, acc_tokens, acc_g = acc
    return (
        acc_loss + loss,
        acc_tokens + m["policy_tokens"],
        mixed_precision.accumulate(acc_g, g),
    ), None

  zeros = mixed_precision.accumulation_zeros(params)  # f32 for bf16 params
  (loss, tokens, grads), _ = jax.lax.scan(
      micro,
      (jnp.float32(0.0), jnp.float32(0.0), zeros),
      (blocks, jnp.arange(num_microbatches)),
  )
  return loss, {"loss": loss, "policy_tokens": tokens / num_microbatches}, grads


# fitted_length: demonstrations sampled (in batches of the SFT batch size),
# the key they are drawn from (the same for every seed and process, so that
# all compile the same lengths), and the multiple the longest is rounded to.
FIT_SAMPLES = 256
FIT_MULTIPLE = 8
_FIT_KEY = 0x5F7


def fitted_length(env, max_len: int, batch_size: int) -> int:
  """The SFT bucket that `sft.fit_bucket` fits to the environment's
  demonstrations: the longest of at least FIT_SAMPLES expert demonstrations
  (`rollout.rollout` of the expert, as the SFT step draws them, from a fixed
  key), rounded up to a multiple of FIT_MULTIPLE, at most max_len. A longer
  demonstration later only means that step runs the max_len branch.

  Compiles and runs one program (ceil(FIT_SAMPLES / batch_size) expert
  rollouts under `lax.map`; no model): a few seconds cold, cached by the
  persistent compilation cache. Deterministic: every process of a run (same
  program, integer lengths) gets the same value.

  Args:
    env: a JAX-native environment (a host environment's `sample_tasks`
      takes a numpy generator, not a key).
    max_len: the buffer length L.
    batch_size: demonstrations per rollout call (the SFT batch size), >= 1.

  Returns:
    int in [1, max_len] (max_len when nothing shorter holds them).

  Raises:
    ValueError: batch_size < 1 or max_len < 1.
  """
  if batch_size < 1 or max_len < 1:
    raise ValueError(
        f"fitted_length: batch_size={batch_size}, max_len={max_len}: need >= 1"
    )
  calls = -(-FIT_SAMPLES // batch_size)

  @jax.jit
  def longest():
    def one(key):
      task_key, expert_key = jax.random.split(key)
      tasks = env.sample_tasks(task_key, batch_size)
      traj = rollout.rollout(env, tasks, expert_key, max_len=max_len)
      return jnp.max(traj.length).astype(jnp.int32)

    keys = jax.random.split(jax.random.PRNGKey(_FIT_KEY), calls)
    return jnp.max(jax.lax.map(one, keys))

  # Compiled ahead of time and called as an executable: no primitive is
  # bound, so this also runs unchanged inside another function's trace.
  n = longest.lower().compile()()
  return padding.bucket_length(n, bucket=FIT_MULTIPLE, max_len=max_len)


def sft_lengths(config, env) -> tuple:
  """The buffer lengths the SFT update is compiled for (see make_sft_step):
  (max_len,) for host environments (trimmed on the host) and without
  buckets; else (`fitted_length`, max_len) with `sft.fit_bucket`, the
  explicit `sft.bucket_lengths`, or K uniform `sft.length_buckets`.

  Returns:
    Increasing tuple of ints ending in config.max_len.

  Raises:
    ValueError: `sft.bucket_lengths` not strictly increasing ints in [1,
      max_len] (`padding.explicit_lengths`; validation.py refuses them
      first).
  """
  max_len = config.max_len
  if host_base.is_host(env):
    return (max_len,)
  if config.sft.fit_bucket:
    n = fitted_length(env, max_len, config.sft.batch_size)
    lengths = padding.explicit_lengths((n,), max_len)
    logging.info(
        "SFT update compiled for buffer lengths %s (fitted to the "
        "demonstrations)",
        lengths,
    )
    return lengths
  if tuple(config.sft.bucket_lengths):
    return padding.explicit_lengths(config.sft.bucket_lengths, max_len)
  if config.sft.length_buckets > 1 and config.trim_bucket > 0:
    return padding.update_lengths(
        max_len, config.sft.length_buckets, config.trim_bucket
    )
  return (max_len,)


def make_sft_step(
    config,
    env,
    graphdef: nnx.GraphDef,
    tx: optax.GradientTransformation,
    state_sharding=None,
    seed_axis_name: str | None = None,
) -> StepFn:
  """SFT on expert demonstrations generated on the fly (one batch per step).

  JAX-native environments: one jitted program. Host environments
  (`env.is_host`): the demonstrations come from the host driver, the update is
  jitted.

  Length buckets (`sft.length_buckets` = K > 1, JAX-native environments):
  the update is compiled for K buffer lengths (`padding.update_lengths`,
  multiples of `trim_bucket`) and runs on the shortest that holds every
  demonstration's tokens (`lax.switch`); the columns cut off are padding, so
  the loss and gradient are those of the whole buffer up to float summation
  order (LoRA adapter-dropout masks are drawn at the bucket's shape). Metric
  'length' is the bucket used; 'trained_token_share' stays a share of the
  whole [B, max_len] buffer. `sft.bucket_lengths` (non-empty) gives the
  lengths instead (`padding.explicit_lengths`: increasing, max_len
  appended), and `sft.fit_bucket` fits them to the environment:
  (`fitted_length`, max_len), the first the longest of 256 demonstrations
  drawn when the step is first traced (`fitted_length`: one more compiled
  program), rounded up to a multiple of 8 (the default task: 39 tokens ->
  40): two compiled branches, none longer than the data needs. Host
  environments trim on the host instead (`padding.host_trim_length`),
  whatever K, lengths or fit. `seed_axis_name`: the `jax.vmap`
  axis name when the step is vmapped over seeds (`agentic_rl/seeds.py`), so
  that all seeds take the longest seed's bucket (`padding.bucket_index`).

  `state_sharding` (sharding.tree_shardings of the state) keeps the state's
  layout across steps on a device mesh; the batch is split over the ambient
  mesh's ('data', 'fsdp') axes (sharding.constrain_batch).
  `sft.num_microbatches` accumulates the gradient over that many
  blocks of the batch (`sft_grad`): same loss and update, less memory.

  Raises:
    ValueError (when the step is first traced): `sft.bucket_lengths` not
      strictly increasing ints in [1, max_len] (`sft_lengths`;
      validation.py refuses them first).
  """
  batch_size = config.sft.batch_size
  num_microbatches = config.sft.num_microbatches
  max_len = config.max_len
  # sft_lengths, computed when the step is first traced: a run that never
  # trains SFT never draws the fit's demonstrations.
  cached = []

  def bucket_lengths() -> tuple:
    if not cached:
      cached.append(sft_lengths(config, env))
    return cached[0]

  def learn_on(state: types.TrainState, traj: types.Trajectory):
    _, metrics, grads = sft_grad(
        graphdef,
        state.params,
        traj,
        num_microbatches,
        adapter_dropout_key(config, state),
    )
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics["grad_norm"] = optax.tree.norm(grads)
    metrics["expert_tool_calls"] = jnp.mean(traj.facts["num_tool_calls"])
    state = state.replace(
        step=state.step + 1,
        params=params,
        opt_state=opt_state,
    )
    return state, metrics

  def learn(state: types.TrainState, traj: types.Trajectory):
    # Trained (POLICY) tokens / all B * L tokens of the demonstration buffer
    # this step was given (host environments: the host-trimmed one).
    share = jnp.mean(policy_mask(traj).astype(jnp.float32))
    lengths = bucket_lengths()
    if len(lengths) == 1:
      state, metrics = learn_on(state, traj)
    else:
      index = padding.bucket_index(
          lengths, jnp.max(traj.length).astype(jnp.int32), seed_axis_name
      )

      def branch(n):
        return lambda operands: learn_on(
            operands[0], padding.trim(operands[1], max_len, n)
        )

      state, metrics = jax.lax.switch(
          index, [branch(n) for n in lengths], (state, traj)
      )
      metrics["length"] = jnp.asarray(lengths, jnp.float32)[index]
    metrics["trained_token_share"] = share
    return state, metrics

  if host_base.is_host(env):
    learn_jit = jax.jit(learn, donate_argnums=0)  # host envs: one device

    def host_step(state: types.TrainState):
      key = jax.random.fold_in(state.rng, state.step)
      task_key, expert_key = jax.random.split(jax.random.fold_in(key, 0))
      tasks = env.sample_tasks(host_rollout.numpy_rng(task_key), batch_size)
      traj = host_rollout.rollout(env, tasks, expert_key, max_len=max_len)
      traj = padding.trim(
          traj,
          max_len,
          padding.host_trim_length(config, sharding.to_host(traj.length)),
      )
      return learn_jit(state, traj)

    return host_step

  def step(state: types.TrainState):
    key = jax.random.fold_in(state.rng, state.step)
    task_key, expert_key = jax.random.split(jax.random.fold_in(key, 0))
    tasks = sharding.constrain_batch(env.sample_tasks(task_key, batch_size))
    traj = rollout.rollout(env, tasks, expert_key, max_len=max_len)
    return learn(state, traj)

  return jax.jit(
      step, donate_argnums=0, **sharding.step_jit_kwargs(state_sharding)
  )
