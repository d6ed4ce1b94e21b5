"""The stages of one RL iteration's collect step as top-level functions.

Each stage reads arrays, scalars and a typed batch (`types.Trajectory` or
`learner.batch.Rollout`) and returns the typed batch with the fields it sets;
its static settings are keyword-only arguments. `build.build_stages` lists
the stages of a config once (binding their arguments from the iteration's
`StageContext` and the config) and `build.chain` runs them; `learner.collect`'s
`make_collect_fn` builds the context, runs the chain and packs the batch:

  sample.py   rollout round, frozen-RM scores, environment reward, soft
              overlong penalty, DAPO dynamic sampling
  shaping.py  loss mask (POLICY tokens, dual-path tool-free rows), overlong
              policy, the gold-answer and observation passes, likelihood
              reward, PBRS potential, dark-room diagnostics, dense
              auxiliary advantages, dual-ascent penalty
  replay.py   replay buffer: fresh-batch keys, injection into failed
              groups, insertion of the fresh successes, the injected rows'
              mask, SIL samples, the buffer size metric
  logprobs.py loss length, reference log-probs, KL-in-reward, behaviour
              log-probs (sampler or trainer, with the mismatch metrics and
              the dual-path masked distribution), behaviour values
  advantages.py
              GAE, or the estimator tables with the step-reward
              diagnostics and the value head's targets
  pack.py     the learner batch of `make_update_fn`
  build.py    `build_stages` (the stage list of a config) and `chain`
"""
