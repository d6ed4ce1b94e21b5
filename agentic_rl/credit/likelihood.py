"""Reference-model log-probs of the gold answer after each turn (TRACE-style
log-ratio potential, likelihood reward), in one batched forward pass.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from agentic_rl import types
from agentic_rl.credit.potential_arrays import state_ends

# ---------------------------------------------------------------------------
# Reference-model log-probs of the gold answer after each turn (TRACE-style
# potentials, likelihood reward), in one batched forward pass.
# ---------------------------------------------------------------------------


def gold_answer_sequences(
    tokens_bl: jax.Array,
    end_bk1: jax.Array,
    gold_ba: jax.Array,
    gold_len_b: jax.Array,
    answer_prefix: tuple[int, ...],
    pad_id: int,
) -> tuple[jax.Array, jax.Array]:
  """Sequences s_k ++ answer_prefix ++ gold answer, one per (episode, k).

  Args:
    tokens_bl: [B, L] int32 episode tokens.
    end_bk1: [B, K + 1] int32 context lengths (`state_ends`).
    gold_ba: [B, A] int32 gold-answer tokens (env fact `gold_answer`).
    gold_len_b: [B] int32 real gold lengths (env fact `gold_answer_len`).
    answer_prefix: tokens opening an answer (e.g. (tokenizers.ANSWER,)).
    pad_id: filler token id after the gold answer (never scored).

  Returns:
    (seq [B, K + 1, L + P + A] int32, gold_mask [B, K + 1, L + P + A] bool
     marking the gold-answer positions).
  """
  b, l = tokens_bl.shape
  a = gold_ba.shape[1]
  p = len(answer_prefix)
  t = jnp.arange(l + p + a)
  end = end_bk1[..., None]  # [B, K+1, 1]
  ctx = jnp.concatenate(
      [tokens_bl, jnp.full((b, p + a), pad_id, tokens_bl.dtype)], axis=1
  )[:, None, :]
  pre = jnp.asarray(answer_prefix + (pad_id,), jnp.int32)[
      jnp.clip(t[None, None, :] - end, 0, p)
  ]
  gold_idx = jnp.clip(t[None, None, :] - end - p, 0, a - 1)
  gold = jnp.take_along_axis(gold_ba[:, None, :], gold_idx, axis=2)
  in_gold = (t >= end + p) & (t < end + p + gold_len_b[:, None, None])
  seq = jnp.where(
      t < end,
      ctx,
      jnp.where(t < end + p, pre, jnp.where(in_gold, gold, pad_id)),
  )
  return seq.astype(jnp.int32), in_gold


def gold_answer_logprobs(
    logprob_fn,
    tokens_bl: jax.Array,
    role_bl: jax.Array,
    turn_bl: jax.Array,
    gold_ba: jax.Array,
    gold_len_b: jax.Array,
    *,
    num_turns: int,
    answer_prefix: tuple[int, ...],
    pad_id: int,
) -> jax.Array:
  """log p_ref(y* | s_k) for k = 0 .. K, all in one batched forward pass.

  TRACE-style (docs/papers.md; arXiv id not given there): the frozen
  reference model scores the gold answer y* appended (after `answer_prefix`)
  to the context after each turn; with `log_ratio_potential` this gives the
  log-ratio state values, and the value at the final context is the
  likelihood reward (docs/papers.md: log-prob, not prob).

  Args:
    logprob_fn: tokens [N, T] int32 -> teacher-forced log-probs [N, T] float32
      (logp[:, t] = log p(tokens[:, t] | tokens[:, :t]); e.g.
      `lambda x: sampling.token_logprobs(graphdef, ref_params, x)[0]`).
    tokens_bl, role_bl, turn_bl: [B, L] trajectory fields.
    gold_ba: [B, A] int32 gold-answer tokens; gold_len_b: [B] int32 lengths.
    num_turns: K (static).
    answer_prefix: tokens opening an answer.
    pad_id: filler token id.

  Returns:
    [B, K + 1] float32 summed log-probs (nats) of the gold tokens.
  """
  b = tokens_bl.shape[0]
  end = state_ends(role_bl, turn_bl, num_turns)
  seq, gold_mask = gold_answer_sequences(
      tokens_bl, end, gold_ba, gold_len_b, answer_prefix, pad_id
  )
  n = b * (num_turns + 1)
  logp = logprob_fn(seq.reshape(n, -1)).reshape(seq.shape)
  return jnp.sum(jnp.where(gold_mask, logp, 0.0), axis=-1).astype(jnp.float32)


def likelihood_reward(
    gold_logp_bk1: jax.Array, num_turns_b: jax.Array, finish_b: jax.Array
) -> jax.Array:
  """[B] log p_ref(y* | final context): the likelihood reward (docs/papers.md).

  The final context is the state before the answering turn for ANSWERED
  episodes (the gold answer replaces the policy's answer), and the state after
  the last turn otherwise (index num_turns).

  Args:
    gold_logp_bk1: [B, K + 1] float (`gold_answer_logprobs`).
    num_turns_b: [B] int32 turns taken.
    finish_b: [B] int32 finish reasons.
  """
  idx = jnp.where(finish_b == types.ANSWERED, num_turns_b - 1, num_turns_b)
  idx = jnp.clip(idx, 0, gold_logp_bk1.shape[1] - 1)
  return jnp.take_along_axis(gold_logp_bk1, idx[:, None], axis=1)[:, 0]
