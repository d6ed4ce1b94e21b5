"""The vmapped multi-seed trainer reproduces independent single-seed runs."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentic_rl import metrics as metrics_lib
from agentic_rl import seeds as seeds_lib
from agentic_rl import train
from agentic_rl import validation
from configs import default
from experiments import seeds as experiment_seeds
from tests import fakes

# Seeds whose first RL batches need different length buckets at this batch
# size (found by running the single-seed step; asserted in the test).
_RL_BUCKET_BATCH = 2
_RL_BUCKET_SEEDS = (4, 5)


def _tiny():
  # A one-layer policy: the vmapped SFT and RL steps, the per-seed
  # evaluations and their re-traces on resume are most of this module's
  # time; what it asserts (vmapped = single runs, resume = uninterrupted,
  # wall-time records) does not depend on the depth.
  return fakes.shrink(
      default.get_config("smoke"),
      model=dict(num_layers=1),
      sft_steps=4,
      sft_batch=8,
      rl_steps=3,
      rl_batch=8,
      group_size=4,
      eval_tasks=8,
      eval_samples=2,
      checkpoint_every=2,
      log_every_steps=1,
  )


@pytest.fixture(scope="module")
def vmapped(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("seeds"))
  return workdir, seeds_lib.train_seeds(_tiny(), (0, 3), workdir)


@pytest.mark.slow  # 20-60 s of training: slow tier keeps the default tier short
@pytest.mark.parametrize("index,seed", [(1, 3)])  # the 2nd column is seed 3
def test_each_seed_matches_its_single_run(vmapped, tmp_path, index, seed):
  _, out = vmapped
  c = _tiny()
  c.seed = seed
  reports = train.train_and_evaluate(c, str(tmp_path))
  rows = metrics_lib.read_metrics(str(tmp_path))
  # Every SFT step, and the first RL step (rollout + update from the SFT
  # policy). Later RL steps of this tiny run have all-zero rewards, so their
  # gradients are float noise that Adam rescales to full-size steps: there a
  # batched matmul's reassociation is amplified and values are not comparable.
  for phase, n in (("sft", c.sft.steps), ("rl", 1)):
    for key in (
        "loss",
        "reward",
        "accuracy",
        "tool_calls",
        "kl",
        "grad_norm",
        "policy_tokens",
    ):
      name = f"{phase}/{key}"
      if name not in out["curves"]:
        continue
      single = [r[name] for r in rows if name in r][:n]
      assert len(single) == n, name
      np.testing.assert_allclose(
          out["curves"][name][:n, index],
          single,
          rtol=2e-4,
          atol=1e-5,
          err_msg=name,
      )
  # Seeds differ, so the two columns of the vmapped run are not copies.
  assert not np.allclose(
      out["curves"]["sft/loss"][:, 0], out["curves"]["sft/loss"][:, 1]
  )
  for key in ("accuracy", "tool_calls", "format_error_rate", "response_tokens"):
    assert out["sft"][index][key] == pytest.approx(
        reports["sft"][key], abs=1e-6
    )


def test_resume_from_checkpoint_gives_same_result(vmapped, tmp_path):
  _, out = vmapped
  workdir = str(tmp_path / "resumed")
  c = _tiny()
  c.rl.steps = 0  # stops at the SFT/RL boundary (checkpointed) ...
  first = seeds_lib.train_seeds(c, (0, 3), workdir)
  resumed = seeds_lib.train_seeds(_tiny(), (0, 3), workdir)  # ... and goes on
  # The wall time of both processes is on record, not only the last leg's.
  with open(f"{workdir}/wall.json") as f:
    calls = json.load(f)["calls"]
  assert calls == pytest.approx(
      [first["wall_call_s"], resumed["wall_call_s"]], abs=0.05
  )
  assert resumed["wall_total_s"] == pytest.approx(sum(calls), abs=0.05)
  assert resumed["wall_call_s"] >= resumed["wall_s"] > 0
  assert first["wall_complete"] and resumed["wall_complete"]
  # A call that only re-evaluates the finished workdir adds no entry.
  again = seeds_lib.train_seeds(_tiny(), (0, 3), workdir)
  with open(f"{workdir}/wall.json") as f:
    assert json.load(f)["calls"] == calls
  assert again["wall_total_s"] >= sum(calls) and again["wall_complete"]
  # Checkpoints without a readable log: the earlier time is unknown, and the
  # total is flagged as a lower bound (a damaged file is not read as 0).
  with open(f"{workdir}/wall.json", "w") as f:
    f.write('{"calls": [NaN]}')
  damaged = seeds_lib.train_seeds(_tiny(), (0, 3), workdir)
  assert not damaged["wall_complete"]
  assert damaged["wall_total_s"] == pytest.approx(
      damaged["wall_call_s"], abs=0.05
  )
  np.testing.assert_equal(
      resumed["rl"], out["rl"]
  )  # NaN == NaN (e.g. no calls)
  for name, values in out["curves"].items():
    np.testing.assert_allclose(
        resumed["curves"][name], values, rtol=1e-6, err_msg=name
    )


def test_no_seeds_is_an_error():
  with pytest.raises(ValueError, match="seeds"):
    seeds_lib.train_seeds(_tiny(), ())


def test_vmapped_seeds_share_one_rl_length_bucket():
  # Under vmap a per-seed bucket index would turn the update's lax.switch
  # into a select over every branch; the seeds' vmap names its axis and the
  # loss length is maximised over it, so one real conditional runs the
  # longest seed's bucket for all.
  from agentic_rl import learner  # noqa: PLC0415
  from configs import schema  # noqa: PLC0415

  config = schema.with_defaults(default.get_config("smoke"))
  config.model.num_layers = 1
  config.rl.update_length_buckets = 4
  config.rl.batch_size = _RL_BUCKET_BATCH
  config.rl.group_size = 2
  env = train.make_env(config)
  model_cfg = train.make_model_config(config)
  states = []
  for seed in _RL_BUCKET_SEEDS:
    config.seed = seed
    graphdef, st = train.init_state(config, model_cfg)
    states.append(train.start_rl(config, st))
  single = learner.make_rl_step(
      config, env, graphdef, learner.make_optimizer(config.rl), model_cfg
  )
  own = []
  for st in states:
    _, m = single(jax.tree.map(lambda x: x.copy(), st))
    own.append(float(m["update_length"]))
  assert len(set(own)) > 1, own  # the seeds need different buckets
  _, rl_step = seeds_lib.make_steps(config, env, graphdef, model_cfg)
  stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *states)
  hlo = rl_step.lower(jax.tree.map(lambda x: x.copy(), stacked))
  assert "conditional" in hlo.compile().as_text()
  _, metrics = rl_step(stacked)
  np.testing.assert_array_equal(
      np.asarray(metrics["update_length"]), np.full(len(own), max(own))
  )


def test_multi_process_runs_are_refused(tmp_path):
  config = default.get_config("smoke")
  config.mesh.distributed = True
  with pytest.raises(
      ValueError, match=r"^config\.mesh\.distributed=True: train_seeds runs"
  ):
    seeds_lib.train_seeds(config, [0, 1], workdir=str(tmp_path))
  assert not list(tmp_path.iterdir())  # refused before any work


def test_resume_refuses_a_changed_config(vmapped):
  # The check runs before any work, so the finished fixture workdir is enough.
  workdir, _ = vmapped
  with open(f"{workdir}/config.json") as f:
    saved = f.read()
  assert '"seeds": [\n    0,\n    3\n  ]' in saved
  c = _tiny()
  c.rl.learning_rate = 1e-3
  with pytest.raises(
      validation.ConfigError,
      match=r"config\.rl\.learning_rate=0\.001 \(was 0\.0005\)",
  ):
    seeds_lib.train_seeds(c, (0, 3), workdir)
  with pytest.raises(
      validation.ConfigError, match=r"config\.seeds=\[0, 1\] \(was \[0, 3\]\)"
  ):
    seeds_lib.train_seeds(_tiny(), (0, 1), workdir)
  with open(f"{workdir}/config.json") as f:  # a refused run leaves it untouched
    assert f.read() == saved


def test_config_hash_is_stable_and_sensitive():
  a, b = _tiny(), _tiny()
  assert experiment_seeds.config_hash(a) == experiment_seeds.config_hash(b)
  assert len(experiment_seeds.config_hash(a)) == 12
  b.rl.kl_coef = 0.02
  assert experiment_seeds.config_hash(a) != experiment_seeds.config_hash(b)


def test_check_resume_free_sections(tmp_path):
  workdir = str(tmp_path)
  saved = seeds_lib.config_with_seeds(_tiny(), (0, 1))
  with open(f"{workdir}/config.json", "w") as f:
    f.write(saved.to_json_best_effort(indent=2))
  c = _tiny()
  c.rl.kl_coef = 0.5  # an arm with other RL settings sharing an SFT-only run
  with pytest.raises(validation.ConfigError, match=r"config\.rl\.kl_coef=0\.5"):
    seeds_lib.check_resume(c, (0, 1), workdir)
  assert seeds_lib.check_resume(c, (0, 1), workdir, ("rl",)).rl.kl_coef == 0.5
  # A workdir saved before an rl field existed (here rl.kl_target is
  # missing from its config.json) resumes: the free section taken from it
  # gets the field's default, as the saved config does in the comparison
  # (an 8-seed SFT start written before rl.update_length_buckets existed was
  # refused for that field before).
  old = json.loads(saved.to_json_best_effort())
  del old["rl"]["kl_target"]
  with open(f"{workdir}/config.json", "w") as f:
    json.dump(old, f)
  assert seeds_lib.check_resume(c, (0, 1), workdir, ("rl",)).rl.kl_coef == 0.5
  c.sft.learning_rate = 1.0  # ... but its SFT settings must match
  with pytest.raises(
      validation.ConfigError, match=r"config\.sft\.learning_rate=1\.0"
  ):
    seeds_lib.check_resume(c, (0, 1), workdir, ("rl",))
