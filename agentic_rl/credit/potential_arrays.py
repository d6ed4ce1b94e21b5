"""PBRS potentials as [B, K + 1] arrays over the states s_0 .. s_K.

`state_ends` locates each state s_k (the context after k turns) in the token
buffer; the model-based potentials (value head, SPA, next-observation
prediction, reference log-probs) read the model there. The learner's table of
potentials by config name is `agentic_rl.learner.potentials_by_name.POTENTIALS`.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from agentic_rl import types

# ---------------------------------------------------------------------------
# Potentials: [B, K + 1] arrays over the states s_0 .. s_K.
# ---------------------------------------------------------------------------


def progress_potential(
    progress_bk1: jax.Array, scale: float = 1.0
) -> jax.Array:
  """Oracle progress potential Phi(s_k) = scale * progress(s_k).

  A control arm for PBRS (docs/rewards_and_credit.md, potential sources):
  progress is an environment fact, e.g. hops resolved / depth on
  KV-CHAIN, in [0, 1].

  Args:
    progress_bk1: [B, K + 1] float progress after 0 .. K turns.
    scale: multiplier of the potential (reward units per unit progress).

  Returns:
    [B, K + 1] float32 potentials.

  Raises:
    AssertionError: (chex) if progress_bk1 is not rank 2.
  """
  chex.assert_rank(progress_bk1, 2)
  return jnp.asarray(scale, jnp.float32) * jnp.asarray(
      progress_bk1, jnp.float32
  )


def log_ratio_potential(gold_logp_bk1: jax.Array) -> jax.Array:
  """TRACE-style log-ratio state values (inferred form).

  V(s_k) = log p_ref(y* | s_k) - log p_ref(y* | s_0), where log p_ref(y*|s_k)
  is the frozen reference model's log-probability of the gold answer y*
  appended after the k-th tool boundary. TRACE (docs/papers.md; arXiv id not
  given there). From the abstract: states at tool-call boundaries, a frozen
  reference model's gold-answer log-probability per state, "log-ratio state
  values", a per-action reward equal to the TD change of those values, and
  telescoping over redundant calls. Inferred (docs/papers.md, matched here): the
  ratio is taken against the initial state s_0, and r_k = V(s_{k+1}) - V(s_k)
  with discount 1. Our choice: y* is appended after an answer-opening prefix
  (`gold_answer_logprobs`). V(s_0) = 0 by construction.

  As a PBRS potential: `pbrs_shaping(..., discount=1, terminated=False)`
  gives TRACE's inferred r_k, whose sum telescopes to V(s_n) - V(s_0) =
  V(s_n) (the final value is kept, an outcome-like term: not policy
  invariant); `terminated=True` gives policy-invariant PBRS whose sum is
  -V(s_0) = 0.

  Args:
    gold_logp_bk1: [B, K + 1] float log p_ref(y* | s_k), k = 0 .. K (nats;
      summed over the gold-answer tokens).

  Returns:
    [B, K + 1] float32 values V(s_k); column 0 is exactly 0.

  Raises:
    AssertionError: (chex) if gold_logp_bk1 is not rank 2.
  """
  chex.assert_rank(gold_logp_bk1, 2)
  logp = jnp.asarray(gold_logp_bk1, jnp.float32)
  return logp - logp[:, :1]


def success_probability_potential(p_bk1: jax.Array) -> jax.Array:
  """PiCA-style potential Phi(h_k) = P(correct final answer | h_k) (inferred).

  PiCA (docs/papers.md; arXiv id not given there): process rewards are
  history-conditioned success probabilities used as PBRS potentials, with
  discount 1; the exact form Phi = P(correct | h_k), F_k = Phi(h_{k+1}) -
  Phi(h_k) is inferred from the abstract. P comes from a learned value head
  or a reward model; pivot steps are the turns where it jumps.

  Args:
    p_bk1: [B, K + 1] float probabilities in [0, 1] after 0 .. K turns.

  Returns:
    [B, K + 1] float32 potentials (the probabilities, unchanged).

  Raises:
    AssertionError: (chex) if p_bk1 is not rank 2.
  """
  chex.assert_rank(p_bk1, 2)
  return jnp.asarray(p_bk1, jnp.float32)


def state_ends(
    role_bl: jax.Array, turn_bl: jax.Array, num_turns: int
) -> jax.Array:
  """[B, K + 1] int32 end position of the context s_k (the state after k turns).

  s_k = the prompt plus turns 0 .. k-1 with their observations: the number of
  non-PAD tokens whose turn index is < k (prompt tokens have turn -1; a turn's
  observation tokens carry the turn's index). For k past the episode's last
  turn this is the full episode length.

  Args:
    role_bl: [B, L] int8 roles.
    turn_bl: [B, L] int32 turn index per token.
    num_turns: K (static).
  """
  chex.assert_rank([role_bl, turn_bl], 2)
  real_bl = role_bl != types.PAD
  k_k1 = jnp.arange(num_turns + 1)
  inside = real_bl[:, None, :] & (turn_bl[:, None, :] < k_k1[None, :, None])
  return jnp.sum(inside, axis=-1).astype(jnp.int32)
