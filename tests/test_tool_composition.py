"""experiments/tool_composition: ToolRLA factors under multiplicative vs
additive composition, reference-trajectory matching vs TIER execution reward.

Every expected value is computed by hand from real schema_calls episodes (the
environment's own facts) or hand-built facts.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from agentic_rl import call_rewards as cr
from agentic_rl.rewards import components
from agentic_rl.rewards import factory
from agentic_text import tokenizers as tk
from environments import schema_calls as sc
from tests import fakes

TOK = tk.ByteTokenizer()
ENV = sc.SchemaCallsEnv()
D = ENV.max_depth


def _task(
    op,
    left_ref,
    right_ref,
    left_const,
    right_const,
    depth,
    branch,
    forbidden=-1,
):
  pad = lambda x, v: np.asarray(list(x) + [v] * (D - len(x)), np.int32)
  op, lr, rr = pad(op, 0), pad(left_ref, -1), pad(right_ref, -1)
  lc, rc = pad(left_const, 0), pad(right_const, 0)
  val = np.zeros((D,), np.int32)
  f = {0: lambda a, b: a + b, 1: lambda a, b: a * b, 2: lambda a, b: a - b}
  for i in range(depth):
    a = val[lr[i]] if lr[i] >= 0 else lc[i]
    b = val[rr[i]] if rr[i] >= 0 else rc[i]
    val[i] = f[int(op[i])](a, b)
  return sc.SchemaTask(
      depth=jnp.int32(depth),
      branch=jnp.bool_(branch),
      op=jnp.asarray(op),
      leaf=jnp.zeros((D + 1,), jnp.int32),
      left_ref=jnp.asarray(lr),
      right_ref=jnp.asarray(rr),
      left_const=jnp.asarray(lc),
      right_const=jnp.asarray(rc),
      value=jnp.asarray(val),
      answer=jnp.int32(val[depth - 1]),
      forbidden=jnp.int32(forbidden),
  )


# (3+4)*5: node0 = 7, node1 = 35. Reference: add(a=3,b=4), mul(a=7,b=5).
CHAIN = _task(
    [sc.OP_ADD, sc.OP_MUL], [-1, 0], [-1, -1], [3, 0], [4, 5], 2, False
)
# (2+3)*(6-1): node0 = 5, node1 = 5, node2 = 25. Reference: add(a=2,b=3),
# sub(a=6,b=1), mul(a=5,b=5).
BRANCH = _task(
    [sc.OP_ADD, sc.OP_SUB, sc.OP_MUL],
    [-1, -1, 0],
    [-1, -1, 1],
    [2, 6, 0],
    [3, 1, 0],
    3,
    True,
)
# 3+4 with `sum` forbidden.
FORBID = _task([sc.OP_ADD], [-1], [-1], [3], [4], 1, False, forbidden=1)

DRIVE = fakes.env_driver(ENV)


def _episode(task, calls, answer):
  """Final facts after the tool calls `calls`, then the answer."""
  return DRIVE.run(task, [*map(DRIVE.call, calls), DRIVE.answer(answer)]).facts


def _batch(episodes):
  facts = jax.tree.map(lambda *x: jnp.stack(x), *episodes)
  return fakes.trajectory(facts)


@pytest.fixture(scope="module")
def paths():
  """Real episodes: 0 reference path; 1 valid alternative path (equivalent tool,
  swapped commutative values); 2 reference path plus a repeated call; 3 the
  branch task in the other sub-expression order; 4 the branch task on the
  reference path."""
  return _batch(
      [
          _episode(CHAIN, ["add(a=3,b=4)", "mul(a=7,b=5)"], "35"),
          _episode(CHAIN, ["sum(y=3,x=4)", "mul(a=5,b=7)"], "35"),
          _episode(
              CHAIN, ["add(a=3,b=4)", "mul(a=7,b=5)", "mul(a=7,b=5)"], "35"
          ),
          _episode(
              BRANCH, ["sub(a=6,b=1)", "add(a=2,b=3)", "mul(a=5,b=5)"], "25"
          ),
          _episode(
              BRANCH, ["add(a=2,b=3)", "sub(a=6,b=1)", "mul(a=5,b=5)"], "25"
          ),
      ]
  )


def test_ref_match_fact_per_turn(paths):
  m = np.asarray(paths.facts["call_ref_match"], bool)
  k = ENV.max_turns
  expect = np.zeros((5, k), bool)
  expect[0, :2] = True
  # Episode 1: sum instead of add, then mul(a=5,b=7) against reference (7, 5).
  expect[2, :2] = True  # the repeat at turn 2 is past the reference (d = 2)
  expect[3, 2] = True  # mul(a=5,b=5) is reference call 2 (both values are 5)
  expect[4, :3] = True
  np.testing.assert_array_equal(m, expect)
  # Every episode answered correctly and executed every call.
  np.testing.assert_array_equal(paths.facts["correct"], [1, 1, 1, 1, 1])
  np.testing.assert_array_equal(paths.facts["num_tool_errors"], [0] * 5)
  np.testing.assert_array_equal(paths.facts["has_constraint"], [0] * 5)


def test_alternative_path_full_execution_credit_no_reference_credit(paths):
  # M = matched / max(d, calls): 2/2, 0/2, 2/3, 1/3, 3/3.
  np.testing.assert_allclose(
      cr.reference_match_score(paths), [1.0, 0.0, 2 / 3, 1 / 3, 1.0], rtol=1e-6
  )
  np.testing.assert_allclose(
      cr.reference_match_score(paths, exact=True), [1.0, 0.0, 0.0, 0.0, 1.0]
  )
  # TIER: F + S + E + A = 4 for every valid path (all calls execute).
  np.testing.assert_allclose(cr.tier_reward(paths), [4.0] * 5, rtol=1e-6)
  # Reference matching: F + M + A.
  np.testing.assert_allclose(
      cr.ref_match_reward(paths),
      [3.0, 2.0, 2 + 2 / 3, 2 + 1 / 3, 3.0],
      rtol=1e-6,
  )
  np.testing.assert_allclose(
      cr.ref_match_reward(
          paths, w_format=0.0, w_match=2.0, w_answer=1.0, exact=True
      ),
      [3.0, 1.0, 1.0, 1.0, 3.0],
      rtol=1e-6,
  )


@pytest.fixture(scope="module")
def constraint_eps():
  """FORBID (3+4, `sum` forbidden): 0 compliant; 1 violates (sum does not
  execute) and still answers 7; 2 no call; 3 wrong second value (add(3,5))."""
  return _batch(
      [
          _episode(FORBID, ["add(a=3,b=4)"], "7"),
          _episode(FORBID, ["sum(x=3,y=4)"], "7"),
          _episode(FORBID, [], "7"),
          _episode(FORBID, ["add(a=3,b=5)"], "8"),
      ]
  )


def test_toolrla_factors(constraint_eps):
  t = constraint_eps
  np.testing.assert_array_equal(t.facts["has_constraint"], [1, 1, 1, 1])
  np.testing.assert_array_equal(t.facts["num_forbidden_calls"], [0, 1, 0, 0])
  np.testing.assert_allclose(cr.call_format_reward(t), [1, 1, 1, 1])
  np.testing.assert_allclose(cr.call_name_reward(t), [1, 1, 0, 1])
  # (names Jaccard + values fraction) / 2: 1, 1 (sum's own x, y), 0 (no call),
  # (1 + 1/2) / 2 = 0.75.
  np.testing.assert_allclose(cr.call_params_reward(t), [1, 1, 0, 0.75])
  np.testing.assert_allclose(cr.call_constraint_reward(t), [1, 0, 1, 1])


TOOLRLA = {
    "call_format": 0.25,
    "call_name": 0.25,
    "call_params": 0.25,
    "call_constraint": 0.25,
}


def test_multiplicative_vs_additive(constraint_eps):
  mult = factory.make_reward_fn(TOOLRLA, composition="product")
  add = factory.make_reward_fn(TOOLRLA, composition="sum")
  # f s p c: 1, 1*1*1*0 = 0, 1*0*0*1 = 0, 1*1*0.75*1 = 0.75.
  np.testing.assert_allclose(
      jax.jit(mult)(constraint_eps)[0], [1.0, 0.0, 0.0, 0.75], rtol=1e-6
  )
  # (f + s + p + c) / 4: 1, 3/4, 2/4, 3.75/4.
  np.testing.assert_allclose(
      jax.jit(add)(constraint_eps)[0], [1.0, 0.75, 0.5, 0.9375], rtol=1e-6
  )


def test_registered_defaults():
  assert components.REWARD_PARAM_DEFAULTS["ref_match"] == dict(
      w_format=1.0, w_match=1.0, w_answer=1.0, exact=False
  )
  for name in ("call_format", "call_params", "call_constraint"):
    assert components.REWARD_PARAM_DEFAULTS[name] == {}


def test_bad_keys_raise():
  with pytest.raises(ValueError, match="ref_match: exact must be a bool"):
    factory.make_reward_fn(
        {"ref_match": 1.0}, params={"ref_match": {"exact": 1}}
    )
  with pytest.raises(
      ValueError,
      match="unknown param 'w' of reward component " "'call_constraint'",
  ):
    factory.make_reward_fn(
        {"call_constraint": 1.0}, params={"call_constraint": {"w": 1.0}}
    )
  with pytest.raises(ValueError, match="expert_violation_prob"):
    sc.SchemaCallsEnv(expert_violation_prob=1.5)


def test_experiment_configs_validate_and_arm_rewards():
  from agentic_rl import validation
  from experiments.tool_composition import config

  cfgs = config.arms(smoke=True)
  assert tuple(cfgs) == config.ARMS
  for arm, cfg in cfgs.items():
    validation.validate_config(cfg)
  assert cfgs["multiplicative"].rl.reward_composition == "product"
  assert cfgs["additive"].rl.reward_composition == "sum"
  bad = config.get_config("execution,smoke")
  bad.rl.reward_params = ml_collections.ConfigDict({"tier": {"w_speed": 1.0}})
  with pytest.raises(ValueError, match="w_speed"):
    validation.validate_config(bad)
  with pytest.raises(ValueError, match="unknown arm"):
    config.get_config("nope")


def test_expert_violation_prob():
  """With expert_violation_prob = 1 the expert calls the forbidden `sum` on a +
  node; with the default 0 it never does (old behaviour)."""

  def first_tools(env, keys):
    # Jitted (reset, and the expert vmapped over the keys, as a rollout runs
    # it): a few compiled programs rather than op-by-op dispatch.
    state = jax.jit(env.reset)(FORBID)[0]
    ids, _ = jax.jit(jax.vmap(env.expert_action, in_axes=(None, 0)))(
        state, keys
    )
    return [bytes(np.asarray(row[1:4]).tolist()).decode() for row in ids]

  keys = jax.random.split(jax.random.key(0), 8)
  obey = sc.SchemaCallsEnv()
  violate = sc.SchemaCallsEnv(expert_violation_prob=1.0)
  assert set(first_tools(obey, keys)) == {"add"}
  assert set(first_tools(violate, keys)) == {"sum"}


def _runner():
  import importlib  # noqa: PLC0415

  return importlib.import_module("experiments.tool_composition.__main__")


def test_spec_decides_both_claims_on_the_runners_arms():
  """SPEC (v2): ToolRLA's part on the composition arms, TIER's two depth
  parts on execution vs reference_match, all on arms the runner trains, and a
  room metric on deep-item success."""
  from experiments import stats  # noqa: PLC0415
  from experiments.tool_composition import config  # noqa: PLC0415

  spec = _runner().SPEC
  parts = [
      (p.metric, p.treatment, p.control, p.prediction) for p in spec.all_parts
  ]
  assert parts == [
      ("accuracy", "multiplicative", "additive", "better"),
      ("acc_d5_6", "execution", "reference_match", "better"),
      ("depth_drop", "execution", "reference_match", "lower"),
  ]
  # `--arms` keeps every part's arm: the decision run trains all four.
  assert sorted(spec.arms) == sorted(config.ARMS)
  assert spec.room_fn is _runner().room_mixed_deep_groups_8x
  assert spec.room_threshold == 0.1
  assert spec.positive_control_check is None
  assert not any("not run" in d or "not part of" in d for d in spec.departures)
  assert stats.spec_hash(spec.to_json()) == spec.to_json()["spec_hash"]


def test_room_mixed_deep_groups_samples_depth_5_6(monkeypatch):
  from experiments import harness  # noqa: PLC0415
  from experiments.tool_composition import config  # noqa: PLC0415

  seen = {}

  def fake_sample_groups(cfg, params, num_groups=None):
    seen["depth"] = (cfg.env.min_depth, cfg.env.max_depth)
    seen["params"] = params
    seen["num_groups"] = num_groups
    # 4 groups of 3 episodes: mixed, all fail, all correct, mixed.
    c = [[1, 0, 0], [0, 0, 0], [1, 1, 1], [0, 1, 1]]
    return {"correct": np.asarray(c, np.float64)}

  monkeypatch.setattr(harness, "sample_groups", fake_sample_groups)
  cfg = config.get_config("additive,smoke")
  assert _runner().room_mixed_deep_groups_8x(cfg, "params") == 0.5
  # 8x the default groups: the smoke size's num_tasks 16 -> 8 x 4 = 32.
  assert cfg.eval.num_tasks == 16
  assert seen == {"depth": (5, 6), "params": "params", "num_groups": 32}
  assert cfg.env.min_depth == 1  # the arm's own config is left as it was


def _depth_rows(d12, d56, accuracy):
  return [
      {
          "accuracy": a,
          "acc_d1_2": s,
          "acc_d5_6": d,
          "depth_drop": s - d,
      }
      for s, d, a in zip(d12, d56, accuracy)
  ]


def test_spec_tier_parts_from_per_seed_rows():
  """The TIER parts are decided from per-seed paired differences like any
  part: execution solving more deep items and dropping less from depth 1-2
  to 5-6 than reference matching supports both; without the TIER arms (the
  recorded v1 run) they are not run and the claim cannot be supported."""
  from experiments import stats  # noqa: PLC0415

  spec = _runner().SPEC
  n = 8
  jitter = np.linspace(0.0, 0.07, n)
  flat = np.full(n, 0.5)
  rows = {
      "additive": _depth_rows(flat, flat - 0.3, 0.30 + jitter),
      "multiplicative": _depth_rows(flat, flat - 0.3, 0.40 + jitter[::-1]),
      # Execution: 0.45-0.52 on depth 5-6 (drop <= 0.05); reference
      # matching: 0.1 (drop 0.4).
      "execution": _depth_rows(flat, 0.45 + jitter, 0.5 + jitter),
      "reference_match": _depth_rows(flat, np.full(n, 0.1), 0.3 + jitter),
  }
  a = stats.analyse(spec, rows, [0.5] * n)
  assert [p["verdict"] for p in a["parts"]] == ["supported"] * 3
  assert a["verdict"] == "supported"
  np.testing.assert_allclose(
      a["parts"][2]["effect"]["diffs"], -(0.35 + jitter), atol=1e-12
  )
  # Reference matching ahead on deep items: parts 2 and 3 contradicted, but
  # without a positive-control check the claim is not 'contradicted'.
  swapped = dict(
      rows, execution=rows["reference_match"], reference_match=rows["execution"]
  )
  b = stats.analyse(spec, swapped, [0.5] * n)
  assert [p["verdict"] for p in b["parts"]][1:] == ["contradicted"] * 2
  assert b["verdict"] == stats.CANNOT_SHOW
  # No room in one seed: untestable, whatever the arms did.
  assert stats.analyse(spec, rows, [0.5] * 7 + [0.05])["verdict"] == (
      stats.UNTESTABLE
  )
  v1_run = {k: rows[k] for k in ("additive", "multiplicative")}
  c = stats.analyse(spec, v1_run, [0.5] * n)
  assert [p["verdict"] for p in c["parts"]][1:] == [stats.NOT_RUN] * 2
  assert c["verdict"] == "inconclusive" and c["p_claim"] is None
