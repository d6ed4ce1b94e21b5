"""Annotated template: copy this file to start an ablation.

Every policy-optimisation switch is one line below, set to the default experiment's
value, with the alternatives in the comment. Launch:

  python main.py --config=configs/forkme.py --workdir=runs/forkme
  python main.py --config=configs/forkme.py:smoke --workdir=/tmp/forkme_smoke

Runtime and expected result: as configs/default.py until you change a switch.
"""

from __future__ import annotations

import ml_collections

from configs import default


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  config = default.get_config(arg)
  config.name = "forkme" if arg is None else f"forkme_{arg}"
  rl = config.rl

  # --- Advantages (agentic_rl/estimators.py) ---------------------------------
  # "grpo" | "drgrpo" | "rloo" | "reinforce_pp" | "reinforce_pp_baseline" |
  # "hdpo" | "gigpo" | "gae"
  rl.advantage_estimator = "grpo"
  # GRPO/RLOO: divide by the group std (False = mean-centred only).
  rl.scale_by_std = True
  # Group std: 0 = population, 1 = sample (Bessel).
  rl.std_ddof = 0

  # "gigpo": episode advantage + w * step advantage among identical states.
  rl.gigpo_step_weight = 1.0
  # GiGPO anchor states at the same turn only (True) or at any turn (False).
  rl.gigpo_match_turn = True

  # PORTool tree rollouts: e.g. (2, 2) forks (product = group_size); () = off.
  rl.tree_branching = ()
  rl.tree_alpha = 0.5

  # "hdpo": accuracy advantage + w * efficiency advantage among correct episodes.
  rl.hdpo_efficiency_weight = 0.5

  # "gae": PPO with GAE from the value head (also set config.model.value_head
  # = True); lambda, value-loss coefficient, value clip (0 = unclipped).
  rl.gae_lambda = 0.95
  rl.value_coef = 0.5
  rl.value_clip = 0.2

  # --- Credit assignment (agentic_rl/credit/) ------------------------------------
  # "trajectory" | "per_turn"
  rl.credit = "trajectory"
  rl.discount = 1.0
  # PBRS on the env's progress potential, e.g. 0.5 (acts through per_turn).
  rl.pbrs_coef = 0.0
  # Potential: "progress" | "trace" (reference log-prob of the gold answer) |
  # "value" (value head V(s_k); needs config.model.value_head = True) |
  # "spa" (learned per-turn contributions summed so far;
  # TrainState.features['spa']) |
  # "obs_prediction" (the policy's mean probability of the observation tokens
  # seen so far: next-observation prediction, docs/papers.md).
  rl.pbrs_potential = "progress"
  # SPA head: Adam learning rate, steps per RL iteration.
  rl.spa_lr = 1e-2
  rl.spa_steps = 4
  # Dual-path groups: tool-free episodes per group (tool-call token masked),
  # e.g. 2 of 8; 0 = off. Logs rl/dual_path_*; see the dual_path_efficiency
  # reward. False: the tool-free episodes only measure tool necessity.
  rl.dual_path_tool_free = 0
  rl.dual_path_train_tool_free = True
  # Dense signal as "reward" | "aux_loss".
  rl.dense_as = "reward"
  # Next-observation CE on TOOL tokens as an auxiliary loss, e.g. 0.1 (0 =
  # off); placebo: its labels shuffled across the batch; log: rl/obs_pred_*,
  # rl/horizon_rate, rl/num_turns.
  rl.obs_prediction_coef = 0.0
  rl.obs_prediction_placebo = False
  rl.log_obs_prediction = False
  # Likelihood reward log p_ref(gold | context), e.g. 0.1 (0 = off).
  rl.likelihood_coef = 0.0

  # --- Rewards (agentic_rl/rewards/) -------------------------------------------
  # Components and weights: correct, format, otc, tool_cost, failed_call_penalty,
  # gated_relative_efficiency, tool_bonus, dual_path_efficiency (needs
  # rl.dual_path_tool_free > 0), toolrl, tier, call_score. E.g. OTC instead of
  # plain correctness:
  #   rl.rewards = ml_collections.ConfigDict(dict(otc=1.0, format=0.1))
  rl.rewards = ml_collections.ConfigDict(dict(correct=1.0, format=0.1))
  # Component parameters, e.g. dict(tool_cost=dict(c=0.05)).
  rl.reward_params = ml_collections.ConfigDict()
  # "sum" | "product" | "gdpo"
  rl.reward_composition = "sum"
  # Scheduled weights, e.g. an annealed anti-collapse bonus:
  #   dict(tool_bonus=dict(kind="linear", start=0.2, end=0.0, steps=30))
  rl.reward_schedules = ml_collections.ConfigDict()
  # Robustness: dict(flip_p=0.1), dict(dither_sigma=0.05).
  rl.reward_noise = ml_collections.ConfigDict()

  # --- Policy loss (agentic_rl/losses.py) ---------------------------------------
  # "ppo" | "gspo" | "gspo_token" | "cispo" | "flowrl" (gspo and flowrl need
  # loss_agg_mode "seq-mean-token-mean")
  rl.loss_type = "ppo"
  # FlowRL: reward temperature, importance-weight clip, log Z MLP width
  # (0 = one scalar), log Z learning rate.
  rl.flowrl_beta = 15.0
  rl.flowrl_clip = 0.2
  rl.flowrl_log_z_hidden = 64
  rl.flowrl_log_z_lr = 1e-3
  # Behaviour log-probs of the ratio: "trainer" (exact first ratios) | "sampler".
  rl.behaviour_logprobs = "trainer"
  # Clip-higher (DAPO): e.g. clip_low 0.2, clip_high 0.28.
  rl.clip_low = 0.2
  rl.clip_high = 0.2
  # Dual-clip bound for negative advantages, e.g. 3.0; 0 = off.
  rl.dual_clip = 0.0
  # "token-mean" | "seq-mean-token-mean" | "seq-mean-token-sum-norm"
  rl.loss_agg_mode = "token-mean"
  # seq-mean-token-sum-norm constant normaliser (0 = max_len).
  rl.loss_norm_constant = 0
  # Entropy bonus, e.g. 1e-3.
  rl.entropy_coef = 0.0

  # --- KL to the reference (SFT) model ------------------------------------------
  # "k1" | "k2" | "k3"
  rl.kl_estimator = "k3"
  # In the loss (0 = off) ...
  rl.kl_coef = 0.01
  # ... adapted towards a target KL per token (0 = fixed coefficient) ...
  rl.kl_target = 0.0
  # ... and/or subtracted from the reward (0 = off).
  rl.kl_reward_coef = 0.0

  # --- Batch policies (agentic_rl/batch_policies.py) ----------------------------
  # DAPO dynamic sampling: e.g. 2 (sample twice the groups, keep varying ones).
  rl.dynamic_sampling_oversample = 1
  # "reward" | "correct"
  rl.dynamic_sampling_metric = "reward"
  # Bounded refill rounds when too few groups vary, e.g. 2 (0 = one round).
  rl.dynamic_sampling_max_retries = 0
  # Per-task replay of successful episodes: slots, e.g. 256 (0 = off) ...
  rl.replay_capacity = 0
  rl.replay_success_threshold = 1.0
  # ... injected into all-fail groups of the same task (RAPO) ...
  rl.replay_inject = False
  # ... and/or SPEAR self-imitation on buffered episodes, e.g. 0.1 (0 = off).
  rl.sil_coef = 0.0
  rl.sil_batch_size = 4
  # Dual ascent toward a constraint on an env fact, e.g. at most 0.5 calls:
  #   rl.dual_constraint = "num_tool_calls"; rl.dual_target = 0.5
  rl.dual_constraint = ""
  rl.dual_sense = "max"  # "max": E[g] <= target | "min": E[g] >= target
  rl.dual_target = 1.0
  rl.dual_lr = 0.05
  rl.dual_init = 0.0
  # Overlong (TRUNCATED) episodes: "none" | "mask" | "reward".
  rl.overlong_mode = "none"
  rl.overlong_reward = 0.0
  # DAPO soft overlong penalty width (0 = off) below overlong_soft_max tokens.
  rl.overlong_soft_cache = 0
  rl.overlong_soft_max = 32

  # --- Batch shape ------------------------------------------------------------------
  rl.ppo_epochs = 1
  rl.num_minibatches = 2
  # Gradient accumulation inside each minibatch: the same loss and gradient, less
  # memory. On a CPU it can also be faster (cache): bench_peers' iteration ran
  # 8-12% faster with 4 micro-batches of 16 x 96 tokens than with 1, and slower
  # again with 16 (docs/models.md). Measure yours: experiments/bench_ab.py.
  rl.num_microbatches = 1
  # Shared prompt (arXiv:2506.05433): the first shared_prefix_len tokens of a
  # group's episodes (its prompt, e.g. a long system prompt with the tools'
  # descriptions) are computed once per group in the prefill and once per
  # group_size / num_minibatches episodes in the reference forward and the
  # update: same results up to float order, 15-17% faster on bench_peers'
  # 32-token prompts (num_minibatches 1). With long prompts the decode also
  # reads the prompt's cache entries once per group (rollouts 22-25% faster at
  # 256-512-token prompts in groups of 8, a 4-layer model on a 2-core CPU;
  # docs/models.md). At most the shortest prompt; needs num_minibatches
  # dividing group_size. 0 = off.
  rl.shared_prefix_len = 0
  return config
