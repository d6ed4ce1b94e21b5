"""Rewards: components of environment facts, their composition, and transforms.

One module per concept (docs/rewards_and_credit.md):

  components.py    `REWARD_COMPONENTS`: fn(traj, **params) -> [B] float32 by
                   config name (`rl.rewards`, `rl.reward_params`)
  composition.py   `compose`: weighted sum, product or per-component group
                   normalisation (GDPO) (`rl.reward_composition`)
  schedules.py     weight schedules over training steps (`rl.reward_schedules`)
  noise.py         label flips and Gaussian dithering (`rl.reward_noise`)
  factory.py       `make_reward_fn` / `reward_fn_from_config`: the composed
                   reward function of the config
  sanitize.py      non-finite facts read as 0 (`sanitize_facts`)
  transforms.py    bounded transforms of learned / step rewards, the learned
                   score's `SCORE_TRANSFORMS` (`rl.reward_params.rm.transform`)
  step_rewards.py  per-turn step (process) rewards (`rl.step_reward`,
                   `STEP_TRANSFORMS`)
  dual_ascent.py   the Lagrange multiplier of `rl.dual_constraint`

Nothing is re-exported here: import the module that holds a name.
"""
