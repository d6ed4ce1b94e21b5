"""SFT on length buckets (`sft.length_buckets`, `sft.bucket_lengths`,
learner/sft.py make_sft_step).

The demonstrations of the default task end well before max_len (lengths
17-39 of 64), so the SFT update runs on the shortest bucket that holds them.
These tests check that the bucketed step trains as the whole-buffer step does
(the cut columns are padding), that the bucket is the one the demonstrations
need (recomputed here from the step's own keys), and that under the seeds'
vmap every seed takes the longest seed's bucket in one real conditional.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentic_rl import learner
from agentic_rl import padding
from agentic_rl import rollout
from agentic_rl import seeds as seeds_lib
from agentic_rl import train
from agentic_rl import validation
from agentic_rl.learner import sft as sft_lib
from configs import default
from configs import schema


def _config(
    buckets: int, batch: int = 16, lengths: tuple = (), fit: bool = False
):
  config = default.get_config("smoke")
  config.model.num_layers = 1
  config.sft.batch_size = batch
  config.sft.length_buckets = buckets
  config.sft.bucket_lengths = lengths
  config.sft.fit_bucket = fit
  return schema.with_defaults(config)


def _built(buckets: int, seed: int = 0, batch: int = 16):
  config = _config(buckets, batch)
  config.seed = seed
  validation.validate_config(config)
  env = train.make_env(config)
  graphdef, state = train.init_state(config, train.make_model_config(config))
  return config, env, graphdef, state


def _demo_length(config, env, state) -> int:
  """The longest demonstration of the step's batch, from the step's keys
  (make_sft_step: fold_in(rng, step), then fold_in 0 and split)."""
  key = jax.random.fold_in(state.rng, state.step)
  task_key, expert_key = jax.random.split(jax.random.fold_in(key, 0))
  tasks = env.sample_tasks(task_key, config.sft.batch_size)
  traj = rollout.rollout(env, tasks, expert_key, max_len=config.max_len)
  return int(jnp.max(traj.length))


def _copy(tree):
  return jax.tree.map(lambda x: x.copy(), tree)


def test_bucketed_sft_step_trains_as_the_whole_buffer():
  config1, env, graphdef, state = _built(1)
  config4 = _config(4)
  lengths = padding.update_lengths(config4.max_len, 4, config4.trim_bucket)
  assert lengths == (16, 32, 48, 64)
  whole = learner.make_sft_step(
      config1, env, graphdef, learner.make_optimizer(config1.sft)
  )
  bucketed = learner.make_sft_step(
      config4, env, graphdef, learner.make_optimizer(config4.sft)
  )
  s1, s4 = _copy(state), _copy(state)
  used = []
  for _ in range(3):
    need = _demo_length(config4, env, s4)
    s1, m1 = whole(s1)
    s4, m4 = bucketed(s4)
    # The shortest bucket that holds the longest demonstration.
    want = min(n for n in lengths if n >= need)
    assert float(m4["length"]) == want < config4.max_len, (need, want)
    used.append(want)
    assert "length" not in m1
    for k in ("loss", "grad_norm", "policy_tokens", "trained_token_share"):
      np.testing.assert_allclose(m4[k], m1[k], rtol=2e-5, err_msg=k)
    # A share of the whole [B, max_len] buffer, not of the bucket.
    assert float(m4["trained_token_share"]) == pytest.approx(
        float(m4["policy_tokens"]) / config4.max_len
    )
  for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s4.params)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
  # The compiled step holds one conditional with a branch per length; the
  # shortest branch's tokens are [B, 16].
  hlo = bucketed.lower(_copy(s4)).compile().as_text()
  assert "conditional" in hlo
  assert f"s32[{config4.sft.batch_size},16]" in hlo


def test_explicit_bucket_lengths_train_as_the_whole_buffer():
  config1, env, graphdef, state = _built(1)
  config = _config(1, lengths=(24, 40))
  validation.validate_config(config)
  whole = learner.make_sft_step(
      config1, env, graphdef, learner.make_optimizer(config1.sft)
  )
  bucketed = learner.make_sft_step(
      config, env, graphdef, learner.make_optimizer(config.sft)
  )
  s1, s2 = _copy(state), _copy(state)
  for _ in range(3):
    need = _demo_length(config, env, s2)
    s1, m1 = whole(s1)
    s2, m2 = bucketed(s2)
    # The lengths given, then max_len: the shortest that holds the batch.
    want = min(n for n in (24, 40, 64) if n >= need)
    assert float(m2["length"]) == want < config.max_len, (need, want)
    for k in ("loss", "grad_norm", "policy_tokens", "trained_token_share"):
      np.testing.assert_allclose(m2[k], m1[k], rtol=2e-5, err_msg=k)
  for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s2.params)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
  # One conditional, with a branch per length (24, 40, 64) and no other;
  # the [B, 24] and [B, 40] token buffers are among its shapes.
  hlo = bucketed.lower(_copy(s2)).compile().as_text()
  branches = re.findall(r"conditional\(.*branch_computations=\{([^}]*)\}", hlo)
  assert [len(x.split(",")) for x in branches] == [3], branches
  b = config.sft.batch_size
  assert f"s32[{b},24]" in hlo and f"s32[{b},40]" in hlo
  # The 24 branch runs too: two demonstrations, the first seed whose batch
  # fits 24 tokens (direct answers are 17-18, short calls 23-24).
  for seed in range(40):
    c1, env, graphdef, state = _built(1, seed, batch=2)
    if _demo_length(c1, env, state) <= 24:
      break
  else:
    raise AssertionError("no two-demonstration batch of <= 24 tokens")
  c2 = _config(1, batch=2, lengths=(24, 40))
  _, m1 = learner.make_sft_step(
      c1, env, graphdef, learner.make_optimizer(c1.sft)
  )(_copy(state))
  _, m2 = learner.make_sft_step(
      c2, env, graphdef, learner.make_optimizer(c2.sft)
  )(_copy(state))
  assert float(m2["length"]) == 24
  for k in ("loss", "grad_norm"):
    np.testing.assert_allclose(m2[k], m1[k], rtol=2e-5, err_msg=k)


def test_fitted_bucket_is_the_longest_demonstration_rounded_up():
  config1, env, graphdef, state = _built(1)
  # The task's demonstrations, drawn here from other keys than the fit's:
  # 17-39 tokens (a direct answer, or a call, its observation and the
  # answer; 3-digit x 2-digit products give the longest).
  lengths = np.concatenate(
      [
          np.asarray(
              rollout.rollout(
                  env,
                  env.sample_tasks(jax.random.PRNGKey(100 + i), 512),
                  jax.random.PRNGKey(200 + i),
                  max_len=config1.max_len,
              ).length
          )
          for i in range(4)
      ]
  )
  assert lengths.min() == 17 and lengths.max() == 39
  assert sft_lib.fitted_length(env, config1.max_len, 16) == 40
  # Rounded to FIT_MULTIPLE = 8, never past max_len.
  assert sft_lib.fitted_length(env, 36, 16) == 36
  # The step compiles (40, 64) and trains as the whole buffer.
  config = _config(1, fit=True)
  validation.validate_config(config)
  fitted = learner.make_sft_step(
      config, env, graphdef, learner.make_optimizer(config.sft)
  )
  whole = learner.make_sft_step(
      config1, env, graphdef, learner.make_optimizer(config1.sft)
  )
  s1, m1 = whole(_copy(state))
  s2, m2 = fitted(_copy(state))
  assert float(m2["length"]) == 40
  np.testing.assert_allclose(m2["loss"], m1["loss"], rtol=2e-5)
  hlo = fitted.lower(_copy(s2)).compile().as_text()
  branches = re.findall(r"conditional\(.*branch_computations=\{([^}]*)\}", hlo)
  assert [len(x.split(",")) for x in branches] == [2], branches


def test_vmapped_seeds_fit_once_and_share_the_fitted_bucket():
  # The fit runs when the vmapped step is first traced (inside jit and vmap:
  # it has no traced inputs), once; every seed takes one branch of (40, 64).
  config = _config(1, batch=2, fit=True)
  states = [_built(1, seed, batch=2)[3] for seed in (0, 1, 2)]
  env = train.make_env(config)
  graphdef = train.init_state(config, train.make_model_config(config))[0]
  needs = [_demo_length(config, env, s) for s in states]
  stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *states)
  calls = []
  real = sft_lib.fitted_length

  def counted(*args):
    calls.append(args)
    return real(*args)

  sft_lib.fitted_length = counted
  try:
    sft_step, _ = seeds_lib.make_steps(
        config, env, graphdef, train.make_model_config(config)
    )
    assert not calls  # nothing drawn before the step is traced
    hlo = sft_step.lower(_copy(stacked)).compile().as_text()
    _, metrics = sft_step(stacked)
  finally:
    sft_lib.fitted_length = real
  assert len(calls) == 1, calls
  branches = re.findall(r"conditional\(.*branch_computations=\{([^}]*)\}", hlo)
  assert [len(x.split(",")) for x in branches] == [2], branches
  want = 40 if max(needs) <= 40 else 64
  np.testing.assert_array_equal(
      np.asarray(metrics["length"]), np.full(3, want, np.float32)
  )


def test_rm_mode_refuses_bad_sft_bucket_lengths():
  from agentic_rl import rm_train  # noqa: PLC0415
  from configs import rm_arithmetic  # noqa: PLC0415

  config = rm_arithmetic.get_config()
  rm_train.validate_rm_config(config)
  config.sft.bucket_lengths = (40, 24)
  with pytest.raises(
      validation.ConfigError,
      match=r"^config\.sft\.bucket_lengths=\(40, 24\): not strictly",
  ):
    rm_train.validate_rm_config(config)


def test_explicit_lengths_values_and_errors():
  assert padding.explicit_lengths((40,), 64) == (40, 64)
  assert padding.explicit_lengths((40, 64), 64) == (40, 64)
  assert padding.explicit_lengths((), 64) == (64,)
  assert padding.explicit_lengths((8, 9, 63), 64) == (8, 9, 63, 64)
  for bad in ((0,), (65,), (40, 40), (40, 24), (True,), (40.0,)):
    with pytest.raises(ValueError, match="bucket lengths"):
      padding.explicit_lengths(bad, 64)


def test_vmapped_seeds_take_the_longest_seeds_bucket_in_one_branch():
  # Two demonstrations per seed, so that the seeds need different buckets.
  config, env, graphdef, _ = _built(4, batch=2)
  states = [_built(4, seed, batch=2)[3] for seed in (0, 1, 2, 3)]
  needs = [_demo_length(config, env, s) for s in states]
  lengths = padding.update_lengths(config.max_len, 4, config.trim_bucket)
  own = [min(n for n in lengths if n >= need) for need in needs]
  assert len(set(own)) > 1, own
  stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *states)
  sft_step, _ = seeds_lib.make_steps(
      config, env, graphdef, train.make_model_config(config)
  )
  hlo = sft_step.lower(_copy(stacked)).compile().as_text()
  # An unbatched branch index: a real conditional, not a select over every
  # branch's results (vmap of lax.switch with a batched index).
  assert "conditional" in hlo
  _, metrics = sft_step(stacked)
  np.testing.assert_array_equal(
      np.asarray(metrics["length"]), np.full(4, max(own), np.float32)
  )
  # Each seed trains as it does alone on the whole buffer.
  single = learner.make_sft_step(
      _config(1, batch=2), env, graphdef, learner.make_optimizer(config.sft)
  )
  for i, s in enumerate(states):
    _, m = single(_copy(s))
    np.testing.assert_allclose(metrics["loss"][i], m["loss"], rtol=2e-5)


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"sft.length_buckets": 0}, r"^config\.sft\.length_buckets=0"),
        (
            {"trim_bucket": 0},
            r"^config\.sft\.length_buckets=4: the bucket lengths are "
            r"multiples of config\.trim_bucket, which is 0",
        ),
    ],
)
def test_invalid_sft_length_buckets_are_refused(changes, match):
  config = default.get_config("smoke")
  config.sft.length_buckets = 4
  validation.validate_config(config)
  for k, v in changes.items():
    section, _, field = k.rpartition(".")
    (config[section] if section else config)[field] = v
  with pytest.raises(validation.ConfigError, match=match):
    validation.validate_config(config)


@pytest.mark.parametrize(
    "lengths, buckets, fit, match",
    [
        (
            (40, 24),
            1,
            False,
            r"^config\.sft\.bucket_lengths=\(40, 24\): "
            ".*not strictly increasing",
        ),
        (
            (0, 40),
            1,
            False,
            r"^config\.sft\.bucket_lengths=\(0, 40\): .*not "
            r"an int in \[1, max_len=64\]",
        ),
        (
            (72,),
            1,
            False,
            r"^config\.sft\.bucket_lengths=\(72,\): " ".*max_len=64",
        ),
        (
            (40,),
            4,
            False,
            r"^config\.sft\.bucket_lengths=\(40,\): set "
            "together with sft.length_buckets=4",
        ),
        (
            (40,),
            1,
            True,
            r"^config\.sft\.bucket_lengths=\(40,\): set "
            "together with sft.fit_bucket=True",
        ),
        (
            (),
            4,
            True,
            r"^config\.sft\.fit_bucket=True: set together with "
            "sft.length_buckets=4",
        ),
    ],
)
def test_invalid_sft_bucket_settings_are_refused(lengths, buckets, fit, match):
  config = default.get_config()
  # The default job's: fitted to its demonstrations.
  assert config.sft.fit_bucket and config.sft.length_buckets == 1
  assert tuple(config.sft.bucket_lengths) == ()
  validation.validate_config(config)
  config.sft.length_buckets = buckets
  config.sft.bucket_lengths = lengths
  config.sft.fit_bucket = fit
  with pytest.raises(validation.ConfigError, match=match):
    validation.validate_config(config)
