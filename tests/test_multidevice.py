"""Advantage estimators and losses on 8 simulated CPU devices (batch sharded over a
'data' mesh axis) give the same values as on one device.

Runs in a subprocess because the device count must be set before JAX starts.
"""

import textwrap

from tests import fakes

SCRIPT = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from agentic_rl import advantages, estimators, losses, credit
    assert jax.device_count() == 8, jax.devices()
    mesh = Mesh(np.array(jax.devices()), ("data",))
    rb = NamedSharding(mesh, P("data"))
    rbl = NamedSharding(mesh, P("data", None))
    k = jax.random.split(jax.random.PRNGKey(0), 6)
    B, L = 32, 12
    r = jax.random.bernoulli(k[0], 0.5, (B,)).astype(jnp.float32)
    g = jnp.repeat(jnp.arange(8, dtype=jnp.int32), 4)[jax.random.permutation(k[1], B)]
    logp = -jax.random.uniform(k[2], (B, L), minval=0.1, maxval=3.0)
    beh = logp + 0.1 * jax.random.normal(k[3], (B, L))
    ref = logp + 0.2 * jax.random.normal(k[4], (B, L))
    mask = jax.random.bernoulli(k[5], 0.7, (B, L))
    calls = jnp.arange(B, dtype=jnp.float32) % 3

    def everything(r, g, logp, beh, ref, mask, calls):
      out = {}
      arrays = {"reward_b": r, "group_b": g}
      settings = {"scale_by_std": True, "eps": 1e-6, "std_ddof": 0}
      for name, e in estimators.ESTIMATORS.items():
        if e.level == "episode" and set(e.inputs) <= set(arrays):
          out[name] = e.fn(*[arrays[i] for i in e.inputs],
                           **{s: settings[s] for s in e.settings})
      out["hdpo"] = credit.hdpo_advantages(r, calls, g, efficiency_weight=0.5)
      adv = advantages.broadcast_to_tokens(out["grpo"], jnp.where(mask, 2, 0))
      for mode in losses.AGG_MODES:
        pg, _ = losses.clipped_surrogate(logp, beh, adv, 0.2, 0.28, dual_clip=3.0)
        out["ppo_" + mode] = losses.aggregate(pg, mask, mode)
        cis, _ = losses.cispo_loss(logp, beh, adv, 0.2, 0.28)
        out["cispo_" + mode] = losses.aggregate(cis, mask, mode)
      gs, _ = losses.gspo_token_loss(logp, beh, adv, mask, 0.2, 0.28)
      out["gspo_token"] = losses.aggregate(gs, mask, "seq-mean-token-mean")
      for est in losses.KL_ESTIMATORS:
        out["kl_" + est] = losses.aggregate(
            losses.kl_estimate(est, logp, ref), mask, "token-mean")
      out["gspo"] = jnp.mean(losses.gspo_loss(logp, beh, out["grpo"], mask,
                                              0.2, 0.28)[0])
      out["value"] = losses.value_loss(logp, beh, ref, mask, 0.2)
      out["flowrl"] = losses.flowrl_loss(logp, beh, ref, mask, out["grpo"],
                                         0.1 * r, beta=2.0)[0]
      out["sil"] = losses.self_imitation_loss(logp, mask, r, 0.5 * r)
      out["kl_reward"] = losses.kl_penalized_rewards(r, logp, ref, mask, 0.1)
      out["token_gae"] = jax.vmap(advantages.token_gae,
                                  in_axes=(0, 0, 0, None, None))(
          ref, logp, mask, 0.9, 0.95)
      out["gae"] = jax.vmap(advantages.gae_advantages,
                            in_axes=(0, 0, 0, 0, None))(
          ref, logp, r, jnp.where(mask, 0.9, 0.0), 0.95)
      return out

    single = jax.jit(everything)(r, g, logp, beh, ref, mask, calls)
    sharded_args = [jax.device_put(x, rb) for x in (r, g)] + [
        jax.device_put(x, rbl) for x in (logp, beh, ref, mask)] + [
        jax.device_put(calls, rb)]
    multi = jax.jit(everything)(*sharded_args)
    assert len(multi["grpo"].sharding.device_set) == 8 or multi["grpo"].is_fully_replicated
    for key in single:
      np.testing.assert_allclose(np.asarray(multi[key]), np.asarray(single[key]),
                                 rtol=1e-5, atol=1e-6, err_msg=key)
    print("OK", len(single))
""")


def test_estimators_and_losses_match_on_8_devices():
  assert fakes.run_on_8_devices(SCRIPT).strip().startswith("OK")
