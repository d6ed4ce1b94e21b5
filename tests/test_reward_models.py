"""Reward models: hand-valued losses, padding-invariant scores, a learning step."""

import json
import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from agentic_rl import learner
from agentic_rl.reward_models import ensembles as rm_ensembles
from agentic_rl.reward_models import frozen as rm_frozen
from agentic_rl.reward_models import model as rm_model
from agentic_rl.reward_models import training as rm_training
from agentic_rl import rm_train
from agentic_rl import validation
from agentic_rl.models import transformer
from configs import rm_arithmetic
from configs import rm_kv_chain
from tests import fakes

TINY1 = transformer.TransformerConfig(
    vocab_size=265,
    d_model=16,
    num_layers=1,
    num_heads=2,
    head_dim=8,
    ffn_dim=32,
)


def test_bradley_terry_hand_values():
  # log(1 + e^-2) = 0.126928; swapped log(1 + e^2) = 2.126928; difference 0: log 2.
  got = rm_training.bradley_terry_loss(
      jnp.array([2.0, 0.0, 0.7]), jnp.array([0.0, 2.0, 0.7])
  )
  np.testing.assert_allclose(
      got, [0.1269280, 2.1269280, math.log(2)], rtol=1e-5
  )
  # Margin m shifts the difference: (1, 0, m=1) -> log 2; (2, 0, m=0.5) -> log(1+e^-1.5).
  got = rm_training.bradley_terry_loss(
      jnp.array([1.0, 2.0]), jnp.array([0.0, 0.0]), jnp.array([1.0, 0.5])
  )
  np.testing.assert_allclose(
      got, [math.log(2), math.log1p(math.exp(-1.5))], rtol=1e-5
  )


def test_regression_and_process_bce_hand_values():
  np.testing.assert_allclose(
      rm_training.regression_loss(
          jnp.array([1.5, -1.0]), jnp.array([1.0, 1.0])
      ),
      [0.25, 4.0],
  )
  # BCE(0, y=1) = log 2; BCE(2, y=0) = log(1 + e^2); the masked entry is ignored.
  got = rm_training.process_bce_loss(
      jnp.array([[0.0, 2.0, 9.0]]),
      jnp.array([[1.0, 0.0, 0.0]]),
      jnp.array([[True, True, False]]),
  )
  np.testing.assert_allclose(
      got, (math.log(2) + math.log1p(math.exp(2))) / 2, rtol=1e-5
  )
  logits = jnp.array([[0.0, 0.0, 5.0], [math.log(3), 0.0, 0.0]])
  mask = jnp.array([[True, True, False], [True, False, False]])
  np.testing.assert_allclose(
      rm_model.prm_episode_score(logits, mask, "log_prod"),
      [2 * math.log(0.5), math.log(0.75)],
      rtol=1e-5,
  )
  np.testing.assert_allclose(
      rm_model.prm_episode_score(logits, mask, "min"), [0.5, 0.75], rtol=1e-5
  )
  with pytest.raises(ValueError, match="aggregation"):
    rm_model.prm_episode_score(logits, mask, "max")


def test_turn_boundaries_last_token_of_each_turn():
  turn = jnp.array(
      [[-1, -1, 0, 0, 0, 1, 1, -1], [-1, 0, 0, -1, -1, -1, -1, -1]]
  )
  idx, mask = rm_model.turn_boundaries(turn, 3)
  np.testing.assert_array_equal(idx, [[4, 6, 0], [2, 0, 0]])
  np.testing.assert_array_equal(
      mask, [[True, True, False], [True, False, False]]
  )


@pytest.fixture(scope="module")
def reward_model():
  graphdef, params = rm_model.init_reward_model(
      rm_model.RewardModelConfig(TINY1), jax.random.key(0)
  )
  trunk = nnx.merge(graphdef, params["trunk"])
  trunk.reward_head_d[...] = jax.random.normal(jax.random.key(1), (16,))
  return graphdef, {"trunk": nnx.state(trunk), "head": {}}


def _jit_scores(graphdef):
  """rm_model.outcome_scores of `graphdef`, jitted (params, tokens, mask): one
  compile per shape rather than op-by-op dispatch of the forward."""
  return jax.jit(lambda p, t, m: rm_model.outcome_scores(graphdef, p, t, m))


def test_score_read_at_last_real_token_whatever_the_padding(reward_model):
  """Unpadded, right-padded and left-padded copies score identically (and equal
  Transformer.reward); PRM boundary logits at the last turn equal the ORM score.
  """
  graphdef, params = reward_model
  scores = _jit_scores(graphdef)
  seq = jnp.array([257, 72, 105, 33, 258], jnp.int32)
  junk = jnp.array([7, 99, 200], jnp.int32)
  alone = scores(params, seq[None], jnp.ones((1, 5), bool))
  tokens = jnp.stack(
      [jnp.concatenate([seq, junk]), jnp.concatenate([junk, seq])]
  )
  mask = jnp.stack([jnp.arange(8) < 5, jnp.arange(8) >= 3])
  both = scores(params, tokens, mask)
  np.testing.assert_allclose(both, [alone[0], alone[0]], rtol=1e-5, atol=1e-5)
  reward = jax.jit(lambda p, t, m: nnx.merge(graphdef, p).reward(t, m))
  np.testing.assert_allclose(
      reward(params["trunk"], tokens, mask), both, rtol=1e-5, atol=1e-5
  )
  s_bk = jax.jit(
      lambda p, t, m, b: rm_model.boundary_logits(graphdef, p, t, m, b)
  )(params, tokens, mask, jnp.array([[2, 4], [5, 7]]))
  np.testing.assert_allclose(s_bk[:, 1], both, rtol=1e-5, atol=1e-5)
  assert abs(float(alone[0])) > 1e-3  # a real, nonzero score


def test_init_from_policy_copies_trunk_and_zero_head():
  pol = transformer.Transformer(TINY1, nnx.Rngs(params=jax.random.key(7)))
  _, pparams = nnx.split(pol)
  graphdef, params = rm_model.init_reward_model(
      rm_model.RewardModelConfig(TINY1, head_layers=2),
      jax.random.key(0),
      trunk_params=pparams,
  )
  np.testing.assert_array_equal(
      params["trunk"]["embed_vd"].get_value(), pparams["embed_vd"].get_value()
  )
  assert params["head"]["hidden_dd"].shape == (16, 16)
  s = _jit_scores(graphdef)(
      params, jnp.ones((2, 4), jnp.int32), jnp.ones((2, 4), bool)
  )
  np.testing.assert_array_equal(s, [0.0, 0.0])  # reward_head_d starts at 0


@pytest.mark.parametrize("kind,reg", [("outcome", 0.5), ("process", 0.0)])
def test_train_step_lowers_loss_on_separable_toy_set(kind, reg):
  graphdef, params = rm_model.init_reward_model(
      rm_model.RewardModelConfig(TINY1), jax.random.key(3)
  )
  cfg = ml_collections.ConfigDict(
      dict(
          learning_rate=1e-2,
          warmup_steps=1,
          weight_decay=0.0,
          max_grad_norm=1.0,
      )
  )
  tx = learner.make_optimizer(cfg)
  step = rm_training.make_train_step(
      graphdef, tx, kind=kind, regression_coef=reg
  )
  batch = fakes.toy_pairs()
  opt = tx.init(params)
  losses = []
  for _ in range(15):
    params, opt, m = step(params, opt, batch)
    losses.append(float(m["loss"]))
  assert losses[-1] < 0.5 * losses[0], losses
  assert float(m["pair_accuracy"]) == 1.0
  if (
      kind == "outcome"
  ):  # initial scores are 0: BT = log 2 plus regression 0.5 * 0.5
    np.testing.assert_allclose(losses[0], math.log(2) + 0.5 * 0.5, rtol=1e-5)


def test_best_of_n_hand_values():
  score = jnp.array([[0.1, 0.9, 0.3], [2.0, 1.0, 0.0]])
  correct = jnp.array([[False, True, False], [False, False, True]])
  got = rm_training.best_of_n(score, correct)
  np.testing.assert_allclose(got["rank1_accuracy"], 0.5)
  np.testing.assert_allclose(got["random_accuracy"], 2 / 6, rtol=1e-6)
  np.testing.assert_allclose(got["oracle_accuracy"], 1.0)
  np.testing.assert_allclose(got["rank1_regret"], 0.5)
  np.testing.assert_allclose(
      rm_training.pairwise_accuracy(
          jnp.array([1.0, 0.0, 2.0]), jnp.array([0.0, 0.0, 3.0])
      ),
      0.5,
  )


def test_ensemble_and_warm_hand_values(reward_model):
  s = jnp.array([[1.0, -2.0], [3.0, 0.0]])
  np.testing.assert_allclose(
      rm_ensembles.ensemble_reduce(s, "mean"), [2.0, -1.0]
  )
  np.testing.assert_allclose(
      rm_ensembles.ensemble_reduce(s, "min"), [1.0, -2.0]
  )
  with pytest.raises(ValueError, match="reduction"):
    rm_ensembles.ensemble_reduce(s, "max")
  a = {"w": jnp.array([1.0, 2.0]), "b": jnp.array(0.0)}
  b = {"w": jnp.array([3.0, 6.0]), "b": jnp.array(4.0)}
  avg = rm_ensembles.average_params([a, b])
  np.testing.assert_allclose(avg["w"], [2.0, 4.0])
  np.testing.assert_allclose(avg["b"], 2.0)
  w = rm_ensembles.average_params([a, b], weights=[3, 1])
  np.testing.assert_allclose(w["w"], [1.5, 3.0])
  with pytest.raises(ValueError, match="weights"):
    rm_ensembles.average_params([a, b], weights=[1.0])
  # An ensemble of two identical members scores like one member.
  graphdef, params = reward_model
  fn = jax.jit(
      lambda p, t: rm_model.outcome_scores(
          graphdef, p, t, jnp.ones(t.shape, bool)
      )
  )
  t = jnp.array([[257, 50, 51, 258]], jnp.int32)
  np.testing.assert_allclose(
      rm_ensembles.ensemble_scores(fn, [params, params], t, "min"),
      fn(params, t),
      rtol=1e-5,
      atol=1e-6,
  )


def test_rm_score_to_reward_transforms_and_overoptimization_gap():
  s = jnp.array([0.0, 2.0])
  np.testing.assert_allclose(
      rm_frozen.rm_score_to_reward(s, "sigmoid"),
      [0.5, 1 / (1 + math.exp(-2))],
      rtol=1e-6,
  )
  np.testing.assert_allclose(
      rm_frozen.rm_score_to_reward(s, "tanh", ref=1.0, temperature=2.0),
      [math.tanh(-0.5), math.tanh(0.5)],
      rtol=1e-6,
  )
  with pytest.raises(ValueError, match="transform"):
    rm_frozen.rm_score_to_reward(s, "exp")
  gap = rm_frozen.overoptimization_gap(
      jnp.array([0.9, 0.8, 0.2, 0.6]), jnp.array([1.0, 0.0, 0.0, 0.0])
  )
  np.testing.assert_allclose(gap["rm_reward"], 0.625, rtol=1e-6)
  np.testing.assert_allclose(gap["verified_reward"], 0.25)
  np.testing.assert_allclose(gap["gap"], 0.375, rtol=1e-6)
  np.testing.assert_allclose(gap["false_positive_rate"], 2 / 3, rtol=1e-6)


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("rm.head_layers", 3, r"config.rm.head_layers=3"),
        ("rm.prm_aggregation", "max", r"config.rm.prm_aggregation='max'"),
        ("rm.steps", 0, r"config.rm.steps=0"),
        ("rm.learning_rate", -1.0, r"config.rm.learning_rate=-1.0"),
        ("env.name", "nope", r"config.env.name='nope'"),
        ("mesh.distributed", True, r"config.mesh.distributed=True: reward"),
    ],
)
def test_rm_config_validation_names_field_and_value(field, value, match):
  config = rm_arithmetic.get_config()
  section, name = field.split(".")
  config[section][name] = value
  with pytest.raises(ValueError, match=match):
    rm_train.validate_rm_config(config)
  assert issubclass(validation.ConfigError, ValueError)


def test_rm_config_rejects_unknown_negative_type_and_env_field():
  config = rm_arithmetic.get_config("smoke")
  rm_train.validate_rm_config(config)  # the shipped configs are valid
  rm_train.validate_rm_config(rm_arithmetic.get_config())
  rm_train.validate_rm_config(rm_kv_chain.get_config())
  config.rm.imperfect.bogus = dict(expert_wrong_arg_prob=1.0)
  with pytest.raises(ValueError, match="rm.imperfect.bogus"):
    rm_train.validate_rm_config(config)
  config = rm_arithmetic.get_config("smoke")
  config.rm.imperfect.wrong_value = dict(no_such_field=1.0)
  with pytest.raises(
      ValueError, match="rm.imperfect.wrong_value.no_such_field"
  ):
    rm_train.validate_rm_config(config)


@pytest.mark.slow
def test_rm_mode_smoke_runs_and_resumes(tmp_path):
  """The smoke config end to end, halted after the SFT phase then resumed: the
  report holds held-out pairwise accuracies and best-of-N for both RMs."""
  config = rm_arithmetic.get_config("smoke")
  config.halt_after_step = config.sft.steps
  workdir = str(tmp_path / "rm")
  assert rm_train.train_and_evaluate_rm(config, workdir) is None
  config.halt_after_step = -1
  report = rm_train.train_and_evaluate_rm(config, workdir)
  for name in ("orm", "prm"):
    assert 0.0 <= report[f"{name}_pairwise"]["overall"] <= 1.0
    assert set(report[f"{name}_pairwise"]["by_type"]) <= set(
        __import__("agentic_rl.preference_data").preference_data.NEGATIVE_TYPES
    )
    assert "rank1_accuracy" in report["best_of_n"][name]
  for f in (
      "rm_report.json",
      "rm_report.md",
      "metrics.jsonl",
      "preferences.jsonl",
  ):
    assert (tmp_path / "rm" / f).exists()
  # Re-running the finished workdir is a no-op: same report, one eval line.
  before = (tmp_path / "rm" / "metrics.jsonl").read_text()
  assert rm_train.train_and_evaluate_rm(config, workdir) == json.loads(
      (tmp_path / "rm" / "rm_report.json").read_text()
  )
  assert (tmp_path / "rm" / "metrics.jsonl").read_text() == before
  rows = __import__("agentic_rl.metrics").metrics.read_metrics(workdir)
  assert sum(r.get("phase") == "eval" for r in rows) == 1


def test_rm_reward_fn_on_a_trajectory_matches_scores_and_monitor(reward_model):
  from agentic_rl import types  # pylint: disable=g-import-not-at-top

  graphdef, params = reward_model
  tokens = jnp.array(
      [[257, 72, 105, 33, 258, 256], [257, 50, 51, 256, 256, 256]], jnp.int32
  )
  role = jnp.array([[1, 1, 2, 2, 3, 0], [1, 1, 2, 0, 0, 0]], jnp.int8)
  turn = jnp.array([[-1, -1, 0, 0, 0, -1], [-1, -1, 0, -1, -1, -1]], jnp.int32)
  traj = types.Trajectory(
      tokens=tokens,
      role=role,
      logprob=jnp.zeros((2, 6)),
      turn=turn,
      length=jnp.array([5, 3]),
      num_turns=jnp.array([1, 1]),
      finish=jnp.array([1, 1]),
      group=jnp.array([0, 0]),
      facts={"correct": jnp.array([True, False])},
  )
  fn = rm_frozen.make_rm_reward_fn(
      graphdef, params, num_turns_k=2, transform="sigmoid"
  )
  r, mon = jax.jit(fn)(traj)
  want = jax.nn.sigmoid(_jit_scores(graphdef)(params, tokens, role != 0))
  np.testing.assert_allclose(r, want, rtol=1e-5)
  np.testing.assert_allclose(mon["gap"], float(want.mean()) - 0.5, rtol=1e-5)
  with pytest.raises(ValueError, match="transform"):
    rm_frozen.make_rm_reward_fn(
        graphdef, params, num_turns_k=2, transform="exp"
    )
