"""SPA: a learned stepwise progress attribution used as a PBRS potential."""

from __future__ import annotations

from typing import Any

import chex
import jax
import jax.numpy as jnp
import optax
from flax import nnx

from agentic_rl import types
from agentic_rl.credit.potential_arrays import state_ends

# ---------------------------------------------------------------------------
# SPA: learned stepwise progress attribution.
# ---------------------------------------------------------------------------


def spa_progress_loss(
    contrib_bk: jax.Array,
    turn_mask_bk: jax.Array,
    outcome_b: jax.Array,
) -> jax.Array:
  """SPA progress-estimator loss mean_b (sum_k m_bk c_bk - R_b)^2 (inferred).

  Stepwise Progress Attribution (Wang et al., SPA-RL, arXiv:2505.20732;
  docs/papers.md):
  a progress estimator c_psi(s_k, a_k) is trained so that its per-turn
  contributions summed over a trajectory match the task outcome; the squared
  loss is inferred from the abstract. The step reward (also inferred) is
  r_k = c_psi(s_k, a_k) + beta * grounding_k, built by the caller.
  Gradients flow into contrib_bk (masked turns get zero gradient).

  Args:
    contrib_bk: [B, K] float per-turn contributions c_psi.
    turn_mask_bk: [B, K] bool (or 0/1) valid-turn mask.
    outcome_b: [B] float outcome R_b (e.g. 1[correct]).

  Returns:
    float32 scalar loss.

  Raises:
    AssertionError: (chex) on rank/shape mismatch of the inputs.
  """
  chex.assert_rank([contrib_bk, turn_mask_bk], 2)
  chex.assert_rank(outcome_b, 1)
  chex.assert_equal_shape([contrib_bk, turn_mask_bk])
  chex.assert_equal_shape_prefix([contrib_bk, outcome_b], 1)
  m_bk = jnp.asarray(turn_mask_bk).astype(jnp.bool_)
  total_b = jnp.sum(
      jnp.where(m_bk, jnp.asarray(contrib_bk, jnp.float32), 0.0), axis=1
  )
  return jnp.mean(jnp.square(total_b - jnp.asarray(outcome_b, jnp.float32)))


def make_spa_optimizer(learning_rate: float) -> optax.GradientTransformation:
  """Adam (arXiv:1412.6980) at `learning_rate` for the SPA head."""
  return optax.adam(learning_rate)


def spa_init(d_model: int, learning_rate: float) -> types.SpaState:
  """Zero-initialised SPA head (every contribution, so every potential, is 0
  until the head has been trained), with a fresh optimizer state."""
  params = {
      "weight": jnp.zeros((d_model,), jnp.float32),
      "bias": jnp.zeros((), jnp.float32),
  }
  return types.SpaState(
      params=params, opt_state=make_spa_optimizer(learning_rate).init(params)
  )


def spa_turn_features(hidden_bld: jax.Array, end_bk1: jax.Array) -> jax.Array:
  """[B, K, D] float32 features of turn k: the hidden state at the last token
  of s_{k+1} (the context after turn k and its observation).

  Causal attention makes hidden[b, t] a function of tokens[b, :t + 1] only, so
  feature k depends on the history s_{k+1} alone; with `spa_potential` the
  potential Phi(s_k) is then a function of the state (history) s_k, as PBRS
  requires. Gradients are stopped (the head never trains the policy).

  Args:
    hidden_bld: [B, L, D] final hidden states of the policy
      (`Transformer.hidden_states`).
    end_bk1: [B, K + 1] int32 context lengths (`state_ends`).
  """
  chex.assert_rank([hidden_bld, end_bk1], [3, 2])
  pos_bk = jnp.clip(end_bk1[:, 1:] - 1, 0, hidden_bld.shape[1] - 1)
  feat = jnp.take_along_axis(hidden_bld, pos_bk[:, :, None], axis=1)
  return jax.lax.stop_gradient(feat.astype(jnp.float32))


def spa_contributions(params: Any, feat_bkd: jax.Array) -> jax.Array:
  """Per-turn contributions c_psi(s_k, a_k) = weight . feat_bk + bias, [B, K]
  float32 (SPA, arXiv:2505.20732: a progress estimator whose per-step
  contributions accumulate to the task completion; the linear head on the
  policy's stop-gradient hidden states is our choice)."""
  return jnp.einsum("bkd,d->bk", feat_bkd, params["weight"]) + params["bias"]


def spa_potential(contrib_bk: jax.Array, turn_mask_bk: jax.Array) -> jax.Array:
  """SPA potential Phi(s_k) = sum_{j<k} m_j c_j, [B, K + 1] float32.

  The progress credited so far: Phi(s_0) = 0 and Phi(s_n) = the estimator's
  prediction of the outcome after the n valid turns. As a PBRS potential
  (`shape_turn_rewards`, discount 1) a non-final turn k gets F_k = c_k, the
  last turn of a terminated episode gets -Phi(s_{n-1}) (Phi(terminal) = 0,
  so the shaping telescopes to -Phi(s_0) = 0), and per-turn returns become
  G_k = R - Phi(s_k): the outcome minus the progress already credited. Using
  the cumulative contributions as the potential is our choice (SPA itself
  pays r_k = c_k + beta * grounding_k, which does not telescope).

  Args:
    contrib_bk: [B, K] float contributions (`spa_contributions`).
    turn_mask_bk: [B, K] bool valid turns (prefix per row).
  """
  chex.assert_rank([contrib_bk, turn_mask_bk], 2)
  c = jnp.where(
      jnp.asarray(turn_mask_bk, bool), jnp.asarray(contrib_bk, jnp.float32), 0.0
  )
  return jnp.concatenate(
      [jnp.zeros((c.shape[0], 1), jnp.float32), jnp.cumsum(c, axis=1)], axis=1
  )


def spa_policy_features(
    graphdef, params, tokens_bl, role_bl, turn_bl, num_turns: int
) -> jax.Array:
  """[B, K, D] SPA features from one batched forward pass of the policy.

  `spa_turn_features` of `Transformer.hidden_states(tokens_bl)` at the turn
  boundaries `state_ends(role_bl, turn_bl, K)`; stop-gradient.

  Args:
    graphdef, params: the policy (nnx.split).
    tokens_bl, role_bl, turn_bl: [B, L] trajectory fields.
    num_turns: K (static).
  """
  model = nnx.merge(graphdef, params)
  hidden_bld, _ = model.hidden_states(tokens_bl)
  return spa_turn_features(hidden_bld, state_ends(role_bl, turn_bl, num_turns))


def spa_update(
    spa: types.SpaState,
    feat_bkd: jax.Array,
    turn_mask_bk: jax.Array,
    outcome_b: jax.Array,
    *,
    learning_rate: float,
    num_steps: int = 1,
) -> tuple[types.SpaState, jax.Array]:
  """`num_steps` full-batch Adam steps on `spa_progress_loss` of the head.

  Args:
    spa: current head and optimizer state.
    feat_bkd: [B, K, D] float32 features (`spa_turn_features`).
    turn_mask_bk: [B, K] bool valid turns.
    outcome_b: [B] float targets R_b (e.g. 1[correct]).
    learning_rate: Adam step size (static; must match `spa_init`'s).
    num_steps: gradient steps (static, >= 1), run with `lax.scan`.

  Returns:
    (new types.SpaState, float32 loss before the first step).
  """
  tx = make_spa_optimizer(learning_rate)
  loss_fn = lambda p: spa_progress_loss(
      spa_contributions(p, feat_bkd), turn_mask_bk, outcome_b
  )

  def one(carry, _):
    p, o = carry
    loss, g = jax.value_and_grad(loss_fn)(p)
    upd, o = tx.update(g, o, p)
    return (optax.apply_updates(p, upd), o), loss

  (p, o), losses = jax.lax.scan(
      one, (spa.params, spa.opt_state), None, length=num_steps
  )
  return types.SpaState(params=p, opt_state=o), losses[0]
