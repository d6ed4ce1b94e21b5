"""Dual-path groups (per-episode tool-call logit mask, tool-necessity metrics)
and the SPA head's place in the train state, end to end through one RL step."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentic_rl import types
from agentic_rl import learner
from agentic_rl import rollout
from agentic_text import tokenizers
from agentic_rl import validation
from configs import default
from tests import fakes


def test_mask_logits_hand_values():
  logits = jnp.array([[0.0, 1.0, 2.0, 3.0], [0.5, 0.5, 0.5, 0.5]])
  out = rollout.mask_logits(logits, jnp.array([True, False]), (1, 3))
  np.testing.assert_array_equal(
      out,
      [
          [0.0, rollout.BANNED_LOGIT, 2.0, rollout.BANNED_LOGIT],
          [0.5, 0.5, 0.5, 0.5],
      ],
  )
  # The masked distribution is the policy renormalised over allowed tokens.
  p = jax.nn.softmax(out[0])
  q = jnp.exp(jnp.array([0.0, 2.0])) / (1.0 + math.exp(2.0))
  np.testing.assert_allclose(p[jnp.array([0, 2])], q, rtol=1e-6)
  assert float(p[1]) == 0.0 and float(p[3]) == 0.0


def test_tool_free_rows_pattern_and_env_call_tokens():
  np.testing.assert_array_equal(
      learner.dual_path_tool_free(8, 4, 1), [False, False, False, True] * 2
  )
  np.testing.assert_array_equal(
      learner.dual_path_tool_free(6, 3, 2), [False, True, True] * 2
  )
  assert learner.dual_path_tool_free(8, 4, 0) is None
  assert rollout.tool_call_tokens(fakes.EchoEnv()) == (tokenizers.CALL,)


def test_generate_turn_never_samples_a_banned_token_and_logs_masked_logp():
  # Next-token logits that put almost all mass on CALL: unbanned rows sample
  # CALL; banned rows never do, and their behaviour log-prob is that of the
  # masked distribution, uniform over the other V - 1 tokens: -log(V - 1).
  graphdef, params, cfg = fakes.tiny_policy(0)
  b, v = 8, cfg.vocab_size
  banned = jnp.array([True, False] * 4)

  @jax.jit
  def gen(params, key):
    prompt = jnp.full((b, 3), tokenizers.BOS, jnp.int32)
    st = rollout.init_state(
        prompt,
        jnp.full((b,), 3, jnp.int32),
        None,
        max_len=8,
        graphdef=graphdef,
        params=params,
        model_config=cfg,
    )
    st = st.replace(
        next_logits=jnp.zeros((b, v)).at[:, tokenizers.CALL].set(60.0)
    )
    return rollout.generate_turn(
        graphdef,
        params,
        st,
        key,
        max_action_len=1,
        temperature=1.0,
        stop_tokens=tokenizers.STOP_TOKENS,
        banned_b=banned,
        banned_tokens=(tokenizers.CALL,),
    )

  for seed in range(3):
    out, action, _ = gen(params, jax.random.PRNGKey(seed))
    first = np.asarray(action[:, 0])
    assert np.all(first[~np.asarray(banned)] == tokenizers.CALL)
    assert not np.any(first[np.asarray(banned)] == tokenizers.CALL)
    logp = np.asarray(out.logprob[:, 3])
    np.testing.assert_allclose(
        logp[np.asarray(banned)], -math.log(v - 1), rtol=1e-5
    )
    np.testing.assert_allclose(logp[~np.asarray(banned)], 0.0, atol=1e-6)


def test_dual_path_metrics_hand_values():
  # Two groups of 4, last 2 of each tool-free. g0: tool rows correct (calls
  # 1, 3), free rows 1 correct -> acc_n 0.5 > 0 (tools unneeded), nec 0.5.
  # g1: tool rows correct/wrong (calls 2, 2), free rows wrong -> needed, nec 0.5.
  free = jnp.array([False, False, True, True] * 2)
  traj = fakes.trajectory(
      width=2,
      length=0,
      finish=1,
      group=jnp.repeat(jnp.arange(2), 4),
      facts={
          "correct": jnp.array([1, 1, 1, 0, 1, 0, 0, 0], bool),
          "num_tool_calls": jnp.array([1, 3, 0, 0, 2, 2, 0, 0]),
          "tool_free": free,
      },
  )
  m = jax.jit(learner.dual_path_metrics)(traj)
  want = {
      "dual_path_acc_tool": 0.75,
      "dual_path_acc_no_tool": 0.25,
      "dual_path_necessity": 0.5,
      "dual_path_needed_frac": 0.5,
      "dual_path_unneeded_frac": 0.5,
      "dual_path_calls_needed": 2.0,
      "dual_path_calls_unneeded": 2.0,
      "dual_path_calls_tool_free": 0.0,
  }
  assert set(m) == set(want)
  for k, v in want.items():
    np.testing.assert_allclose(float(m[k]), v, rtol=1e-6, err_msg=k)
  # With the env's label (g0 unnecessary, g1 necessary) and g0's free rows
  # both correct: g0 nec = 1 - 1 = 0, g1 nec = 0.5 - 0 = 0.5.
  facts = dict(
      traj.facts,
      tool_necessary=jnp.repeat(jnp.array([0, 1], bool), 4),
      correct=jnp.array([1, 1, 1, 1, 1, 0, 0, 0], bool),
  )
  m = learner.dual_path_metrics(traj.replace(facts=facts))
  np.testing.assert_allclose(
      float(m["dual_path_necessity_labelled_unnecessary"]), 0.0, atol=1e-7
  )
  np.testing.assert_allclose(
      float(m["dual_path_necessity_labelled_necessary"]), 0.5, rtol=1e-6
  )


@pytest.mark.parametrize(
    "field,value,match",
    [
        (
            "dual_path_tool_free",
            4,
            r"rl\.dual_path_tool_free=4: must be an int in \[0, rl\.group_size=4\)",
        ),
        ("dual_path_tool_free", -1, r"rl\.dual_path_tool_free=-1"),
        ("pbrs_potential", "spa2", r"rl\.pbrs_potential='spa2'"),
        ("spa_lr", 0.0, r"rl\.spa_lr=0\.0: must be > 0"),
        ("spa_steps", 0, r"rl\.spa_steps=0: must be an int >= 1"),
    ],
)
def test_validation_names_field_and_value(field, value, match):
  config = default.get_config("smoke")
  if field.startswith("spa"):
    config.rl.pbrs_potential = "spa"
  config.rl[field] = value
  with pytest.raises(ValueError, match=match):
    validation.validate_config(config)
  config = default.get_config("smoke")
  config.rl.dual_path_tool_free = 1
  config.rl.tree_branching = (2, 2)
  with pytest.raises(ValueError, match="rl.dual_path_tool_free=1: dual-path"):
    validation.validate_config(config)


@pytest.mark.slow  # 20-60 s of training: slow tier keeps the default tier short
def test_rl_step_with_dual_path_groups_and_spa_potential(tmp_path):
  """One jitted GRPO iteration with 2 tool-free episodes per group, the
  dual-path efficiency reward and PBRS on the SPA potential (per-turn
  credit); the SPA head is in the train state and survives a checkpoint."""
  from agentic_rl import checkpoint
  from tests.test_learner import _rl_state_and_step

  config = default.get_config("smoke")
  config.rl.dual_path_tool_free = 2
  config.rl.rewards = {"correct": 1.0, "dual_path_efficiency": 1.0}
  config.rl.credit = "per_turn"
  config.rl.pbrs_coef = 0.5
  config.rl.pbrs_potential = "spa"
  config.rl.spa_steps = 2
  state, step = _rl_state_and_step(config)
  spa = state.features["spa"]
  assert isinstance(spa, types.SpaState)
  assert spa.params["weight"].shape == (config.model.d_model,)
  state, m = step(state)
  assert all(np.isfinite(float(v)) for v in m.values()), m
  assert {
      "reward_dual_path_efficiency",
      "spa_loss",
      "dual_path_necessity",
      "dual_path_acc_tool",
      "dual_path_acc_no_tool",
  } <= set(m)
  # The logit mask works: tool-free episodes made no tool call.
  assert float(m["dual_path_calls_tool_free"]) == 0.0
  ckpt = checkpoint.Checkpointer(str(tmp_path / "ckpt"))
  ckpt.save(1, state, force=True)
  ckpt.wait()
  restored = ckpt.restore(state, step=1)
  for a, b in zip(
      jax.tree.leaves(state.features["spa"]),
      jax.tree.leaves(restored.features["spa"]),
  ):
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("arg", [None, "smoke"])
def test_feature_configs_validate(arg):
  from configs import dual_path, forkme, spa_kv_chain

  for mod in (dual_path, spa_kv_chain, forkme):
    validation.validate_config(mod.get_config(arg))
  config = forkme.get_config(arg)
  config.rl.dual_path_tool_free = 1
  config.rl.rewards = {"correct": 1.0, "dual_path_efficiency": 1.0}
  config.rl.pbrs_coef = 0.5
  config.rl.pbrs_potential = "spa"
  config.rl.gigpo_match_turn = False
  validation.validate_config(config)
