"""GRPO teaches a tiny transformer to use a calculator tool (the main experiment).

Task: `Compute 483*27.`; the policy either answers directly (`<answer>..</answer>`)
or calls the `calc` tool (`<call>483*27</call>`), reads `<obs>13041</obs>` and then
answers. Easy items (single-digit operands) can be answered without the tool; hard
items (3-digit x 2-digit products) need it. The SFT warm start imitates an expert
that is deliberately imperfect on 65% of the episodes (answers hard items without
the tool, calls the tool on easy ones), so the SFT policy's most likely first move
on a hard item is to answer without the tool; GRPO with a correctness reward then
teaches it to call the tool there.

Launch:   python main.py                       (workdir defaults to runs/default)
          python main.py --config=configs/default.py:smoke --workdir=/tmp/smoke
Runtime:  about 40 s on a 2-core CPU with a warm compile cache (38-45 s
          measured 2026-12-07; up to ~70 s when it compiles; smoke: 10-15 s warm,
          too short to learn anything, and it ends near 0 accuracy by design).
Expected: held-out accuracy after RL at least 15 points above the SFT checkpoint,
          driven by hard items; tool calls per hard episode rise towards 1
          (see README.md for measured numbers over 3 seeds).
"""

from __future__ import annotations

import ml_collections

from configs import common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  config = common.base()
  # Run name (default workdir runs/<name>).
  config.name = "default"
  # Tokenizer: 'byte' (agentic_text/tokenizers.py, what the JAX-native
  # environments emit) or 'hf' (the checkpoint's tokenizer and chat template
  # from model.hf_path; host environments only).
  config.tokenizer = "byte"
  # Task loader of a host environment (agentic_rl/data.py,
  # data.validate_data_config); empty = the environment's own tasks.
  config.data = ml_collections.ConfigDict()

  # Environment: environments/arithmetic.py.
  config.env = ml_collections.ConfigDict(
      dict(
          name="arithmetic",
          # Fraction of tasks that are hard (need the tool).
          hard_fraction=0.5,
          # Fraction of demonstrations that deliberately misuse the tool (answer a hard
          # item without it, or call it on an easy one). Above 0.5, the SFT policy's
          # most likely first move on a hard item is to answer without the tool.
          expert_imperfect_prob=0.65,
          # Assistant turns per episode (call, answer, one spare).
          max_turns=3,
      )
  )

  # Attention of the training forward (agentic_rl/models/attention.py):
  # 'auto' = the dense [B, H, L, L] scores up to attention_block positions
  # (faster there, and small), the chunked form above (less memory and
  # faster: experiments/bench_attention.md); 'chunked' / 'dense' force one.
  config.model.attention_impl = "auto"
  config.model.attention_block = 256

  # SFT warm start on expert demonstrations (loss on POLICY tokens only).
  config.sft = common.optimizer(learning_rate=3e-3, warmup_steps=20)
  config.sft.steps = 300
  config.sft.batch_size = 64
  # Gradient accumulation over this many blocks of the SFT batch (same update).
  config.sft.num_microbatches = 1
  # JAX-native environments: compile the SFT update for this many buffer
  # lengths (max_len * i / K rounded up to trim_bucket) and run the shortest
  # that holds every demonstration (logged as sft/length; the rest of the
  # buffer is padding); 1 = no uniform buckets (the whole max_len buffer
  # unless bucket_lengths or fit_bucket below give lengths). Host
  # environments trim on the host whatever K.
  config.sft.length_buckets = 1
  # Or the lengths themselves (increasing; max_len is appended; needs
  # length_buckets = 1); () = none.
  config.sft.bucket_lengths = ()
  # Or fit them to the environment's demonstrations (JAX-native
  # environments; needs length_buckets = 1 and no bucket_lengths): the
  # longest of 256 drawn when the SFT step is first traced, rounded up to a
  # multiple of 8, and max_len (learner/sft.py fitted_length). This task's
  # demonstrations are 17-39 tokens, so (40, 64): two compiled branches, and
  # each step trains 40 positions instead of the 48 of K = 4
  # (docs/models.md, "SFT bucket lengths fitted to the demonstrations").
  config.sft.fit_bucket = True

  # GRPO (Shao et al., arXiv:2402.03300).
  config.rl = common.optimizer(learning_rate=5e-4, warmup_steps=5)
  config.rl.steps = 60
  # Episodes per iteration; batch_size / group_size tasks.
  config.rl.batch_size = 64
  # Completions per task: G in GRPO.
  config.rl.group_size = 8
  # Optimizer steps per iteration = ppo_epochs * num_minibatches; minibatch j
  # holds rows i with i % num_minibatches == j (strided: on a device mesh each
  # minibatch keeps every device's share of the rows) and is split the same way
  # into num_microbatches for gradient accumulation (the loss denominator is
  # computed over the whole minibatch).
  config.rl.num_minibatches = 2
  config.rl.num_microbatches = 1
  # Shared prompt (arXiv:2506.05433): a group's episodes start with the same
  # prompt, so their first shared_prefix_len positions are computed once per
  # group in the rollout's prefill and once per group_size / num_minibatches
  # episodes (the rows of a group that one minibatch holds) in the policy,
  # behaviour and reference forwards, instead of once per episode. Same
  # results up to float summation order. At most the shortest prompt, in
  # tokens (e.g. a system prompt's length; the config check refuses more than
  # the longest). Needs num_minibatches dividing group_size (equal to it, the
  # forwards share nothing), micro-batches of whole such row groups, and the
  # dense attention at max_len; not with LoRA dropout. The update compares
  # the tokens themselves: a step whose rows differ there stops the run before
  # it is logged or saved (re-run with a smaller value to resume). On a device
  # mesh it pays when a micro-batch holds at least one row group per data
  # device (the prefix rows are replicated otherwise). 0 = off.
  config.rl.shared_prefix_len = 0
  # JAX-native environments: compile the update for this many buffer lengths
  # (max_len * i / K rounded up to trim_bucket) and run the shortest that
  # holds every trained position (agentic_rl/padding.py bucketed_update;
  # logged as rl/update_length); 1 = train on the whole max_len buffer.
  config.rl.update_length_buckets = 1
  config.rl.ppo_epochs = 1
  config.rl.temperature = 1.0
  # Advantage estimator (agentic_rl/advantages.py): 'grpo' (arXiv:2402.03300),
  # 'drgrpo' (arXiv:2503.20783), 'rloo' (arXiv:2402.14740), 'reinforce_pp' and
  # 'reinforce_pp_baseline' (arXiv:2501.03262), 'hdpo' (conditional efficiency,
  # agentic_rl/credit/).
  # 'hdpo' ignores the composed reward: z-scored correctness plus an efficiency
  # channel (fewer tool calls) among the correct episodes of each group.
  # 'gae': PPO with GAE from the policy's value head (needs
  # model.value_head=True; values of the state before each POLICY token,
  # observation tokens add no discount step; estimators.gae_token_advantages).
  config.rl.advantage_estimator = "grpo"
  # GAE lambda (arXiv:1506.02438), value-loss coefficient, and the PPO value
  # clip range in return units (0 = unclipped); used by 'gae' and by the
  # value potential (rl.pbrs_potential='value').
  config.rl.gae_lambda = 0.95
  config.rl.value_coef = 0.5
  config.rl.value_clip = 0.2
  # 'gigpo' (arXiv:2505.10978): episode GRPO advantage + gigpo_step_weight *
  # step advantage within groups of identical states (same observation) of a
  # task group, on discounted step returns (rl.discount).
  config.rl.gigpo_step_weight = 1.0
  # GiGPO anchor states: True groups equal observations at the same turn only
  # (our default); False at any turn, as in the paper (agentic_rl/credit/).
  config.rl.gigpo_match_turn = True
  # PORTool tree rollouts (agentic_rl/tree_rollout.py): fork sizes before
  # turns 0 .. d-1, product = group_size, e.g. (2, 2); () = off (plain
  # groups). Advantages: alpha * fork-relative + (1 - alpha) * trajectory
  # (credit.tree_fork_advantages).
  config.rl.tree_branching = ()
  config.rl.tree_alpha = 0.5
  # HDPO efficiency-channel weight w (used only by 'hdpo').
  config.rl.hdpo_efficiency_weight = 0.5
  # Divide group-centred rewards by the group std (grpo, rloo).
  config.rl.scale_by_std = True
  config.rl.adv_eps = 1e-6
  # 0: population std; 1: sample std.
  config.rl.std_ddof = 0
  # Policy loss (agentic_rl/losses.py): 'ppo' clipped surrogate
  # (arXiv:1707.06347), 'gspo' / 'gspo_token' (arXiv:2507.18071; 'gspo' needs
  # loss_agg_mode 'seq-mean-token-mean'), 'cispo' (arXiv:2506.13585).
  # 'flowrl' (arXiv:2509.15207): trajectory-balance loss with a learned
  # log-partition (needs loss_agg_mode 'seq-mean-token-mean').
  config.rl.loss_type = "ppo"
  # FlowRL: reward temperature beta (the authors' code uses 15), importance-
  # weight clip eps, width of the log Z MLP on the pooled prompt embedding
  # (0 = one scalar log Z), and the Adam learning rate of log Z.
  config.rl.flowrl_beta = 15.0
  config.rl.flowrl_clip = 0.2
  config.rl.flowrl_log_z_hidden = 64
  config.rl.flowrl_log_z_lr = 1e-3
  # Behaviour log-probs of the importance ratio: 'trainer' (recomputed once
  # per batch by the loss's own teacher-forced forward, before the update:
  # the first optimizer step's ratios are exactly 1) or 'sampler' (as
  # recorded while sampling; differ from the trainer's by float rounding).
  # 'trainer' logs rl/logp_mismatch_max and _mean (sampler vs trainer).
  config.rl.behaviour_logprobs = "trainer"
  # Clip range; clip_high > clip_low is DAPO clip-higher (arXiv:2503.14476).
  config.rl.clip_low = 0.2
  config.rl.clip_high = 0.2
  # Dual-clip bound c > 1 for negative advantages (arXiv:1912.09729); 0 = off.
  config.rl.dual_clip = 0.0
  # 'token-mean', 'seq-mean-token-mean' or 'seq-mean-token-sum-norm' (Dr.GRPO).
  config.rl.loss_agg_mode = "token-mean"
  # Constant normaliser of 'seq-mean-token-sum-norm'; 0 = the buffer length L.
  config.rl.loss_norm_constant = 0
  # KL to the frozen SFT reference: estimator 'k1', 'k2' or 'k3'.
  config.rl.kl_estimator = "k3"
  # Coefficient of the KL term in the loss.
  config.rl.kl_coef = 0.01
  # > 0: adapt kl_coef towards this KL per token (arXiv:1909.08593).
  config.rl.kl_target = 0.0
  config.rl.kl_horizon = 10_000
  # Coefficient of the KL penalty subtracted from the reward (no gradient).
  config.rl.kl_reward_coef = 0.0
  # Entropy bonus coefficient.
  config.rl.entropy_coef = 0.0
  # Credit assignment (agentic_rl/credit/): 'trajectory' (one advantage per
  # episode) or 'per_turn' (outcome at the last turn, reward-to-go per turn,
  # group-relative per turn index; needs advantage_estimator 'grpo').
  config.rl.credit = "trajectory"
  # Discount across turns (per-turn returns and PBRS).
  config.rl.discount = 1.0
  # PBRS F_k = discount * Phi(s_{k+1}) - Phi(s_k) with Phi = pbrs_coef * the env's
  # 'progress' fact (Ng et al. 1999); 0 = off. With credit 'trajectory' and
  # discount 1 it cannot change GRPO advantages (docs/rewards_and_credit.md).
  config.rl.pbrs_coef = 0.0
  # Potential of PBRS: 'progress' (the env's progress fact) or 'trace' (TRACE
  # log-ratio values log p_ref(gold | s_k) - log p_ref(gold | s_0), from one
  # batched reference-model pass; needs env facts gold_answer, gold_answer_len)
  # or 'value' (the policy's value head V(s_k) at each turn boundary; needs
  # model.value_head=True; the head is trained on Monte-Carlo returns with
  # rl.value_coef / rl.value_clip);
  # or 'obs_prediction' (the policy's mean probability of the observation
  # tokens seen so far; see obs_prediction_coef below);
  # or 'spa' (SPA, docs/papers.md: Phi(s_k) = sum_{j<k} c_j of a linear head on
  # the policy's stop-gradient hidden state after each turn, trained in the
  # same RL step so that sum_k c_k regresses 1[correct];
  # TrainState.features['spa']).
  config.rl.pbrs_potential = "progress"
  # PBRS at episodes cut off by the turn budget or the context (MAX_TURNS,
  # TRUNCATED): 'keep' Phi(s_n) in the return (as if the task continued; an
  # episode that never answers collects it), or 'zero' (every ending is
  # terminal: policy-invariant shaping for the budgeted task), or 'never' (no
  # ending is terminal: the final potential stays in every return, TRACE's
  # form; for an answered episode that is the potential of the state before
  # its answer turn). learner.pbrs_terminated, learner.pbrs_final_potential.
  config.rl.pbrs_cutoff = "keep"
  # SPA head: Adam learning rate and full-batch steps per RL iteration.
  config.rl.spa_lr = 1e-2
  config.rl.spa_steps = 4
  # Dual-path groups (AKBE / EAPO, docs/papers.md): the last N episodes
  # of each group are sampled with the tool-call token masked (0 = off); tool
  # necessity per task = acc(with tools) - acc(without) is logged
  # (rl/dual_path_*) and feeds the 'dual_path_efficiency' reward component.
  config.rl.dual_path_tool_free = 0
  # Train on the tool-free episodes too (their behaviour log-probs are those of
  # the masked distribution); False = they only measure tool necessity.
  config.rl.dual_path_train_tool_free = True
  # Dense (PBRS) signal delivered as 'reward' (inside the returns) or as
  # 'aux_loss' (its per-turn F_k in a separate surrogate term; the outcome
  # advantages are unchanged).
  config.rl.dense_as = "reward"
  # Next-observation prediction (docs/papers.md, "dark room"): the policy's
  # teacher-forced prediction of the tool observations (TOOL tokens).
  # rl.pbrs_potential='obs_prediction' makes Phi(s_k) = its mean probability of
  # the observation tokens in s_k (a PBRS reward with rl.pbrs_coef).
  # obs_prediction_coef > 0 adds the CE on observation tokens as an auxiliary
  # loss instead (weight; 0 = off); obs_prediction_placebo shuffles its labels
  # across the batch. log_obs_prediction logs rl/obs_pred_prob, obs_pred_acc,
  # horizon_rate and num_turns (always on when either channel is).
  config.rl.obs_prediction_coef = 0.0
  config.rl.obs_prediction_placebo = False
  config.rl.log_obs_prediction = False
  # Likelihood reward coef * log p_ref(gold answer | final context) (nats);
  # 0 = off. Needs env facts gold_answer, gold_answer_len.
  config.rl.likelihood_coef = 0.0
  # DAPO dynamic sampling (arXiv:2503.14476): roll out this many times more
  # groups and keep the first batch_size / group_size whose metric ('reward' or
  # 'correct') varies within the group; 1 = off. An iteration with no such group
  # skips the update (metric rl/skipped_update).
  config.rl.dynamic_sampling_oversample = 1
  config.rl.dynamic_sampling_metric = "reward"
  # Refill rounds after the first when fewer groups vary (each rolls out
  # oversample * batch_size / group_size fresh groups into the empty slots;
  # stops early once full; rl/dynamic_sampling_rounds logs the rounds used).
  config.rl.dynamic_sampling_max_retries = 0
  # Per-task replay buffer of successful episodes (agentic_rl/replay.py): slots
  # (one episode per task, keyed by prompt); 0 = off.
  config.rl.replay_capacity = 0
  # Reward at or above which an episode counts as a success (stored/replayed).
  config.rl.replay_success_threshold = 1.0
  # RAPO-style per-prompt replay: a group without success whose task has a
  # buffered success gets it in place of its last episode; its advantage is
  # computed against the current group (needs credit 'trajectory').
  config.rl.replay_inject = False
  # SPEAR self-imitation (arXiv:2509.22601): coefficient of
  # -(R - b)_+ log pi on sil_batch_size buffered episodes; 0 = off.
  config.rl.sil_coef = 0.0
  config.rl.sil_batch_size = 4
  # Dual ascent (RCPO, arXiv:1805.11074) on a per-episode env fact g, e.g.
  # 'num_tool_calls': reward R - lam * g with E[g] <= dual_target ('max') or
  # R + lam * g with E[g] >= dual_target ('min'); lam >= 0 moves by dual_lr *
  # the violation after every RL step (logged rl/dual_coef, checkpointed).
  # '' = off.
  config.rl.dual_constraint = ""
  config.rl.dual_sense = "max"
  config.rl.dual_target = 1.0
  config.rl.dual_lr = 0.05
  config.rl.dual_init = 0.0
  # TRUNCATED (overlong) episodes: 'none', 'mask' (no gradient) or 'reward'
  # (reward replaced by overlong_reward).
  config.rl.overlong_mode = "none"
  config.rl.overlong_reward = 0.0
  # DAPO soft overlong penalty on the number of POLICY tokens: 0 = off, else the
  # width L_cache of the linear zone below overlong_soft_max.
  config.rl.overlong_soft_cache = 0
  config.rl.overlong_soft_max = 32
  # Reward components (agentic_rl/rewards/components.py) and their weights.
  config.rl.rewards = ml_collections.ConfigDict(dict(correct=1.0, format=0.1))
  # Per-component parameters, e.g. dict(otc=dict(c=1.0))
  # (rewards.components.REWARD_PARAM_DEFAULTS).
  config.rl.reward_params = ml_collections.ConfigDict()
  # 'sum' (weighted), 'product' (ToolRLA, components in [0, 1]) or 'gdpo'
  # (per-component group normalisation before the weighted sum).
  config.rl.reward_composition = "sum"
  # Weights following a schedule over RL steps, e.g.
  # dict(tool_bonus=dict(kind="linear", start=0.5, end=0.0, steps=30)).
  config.rl.reward_schedules = ml_collections.ConfigDict()
  # Robustness studies: dict(flip_p=0.1) and/or dict(dither_sigma=0.05).
  config.rl.reward_noise = ml_collections.ConfigDict()
  # Learned reward model (docs/reward_models.md): an rm-mode workdir whose final
  # checkpoint holds it, loaded frozen at start-up ('' = none; used by reward
  # component 'rm' and rl.pbrs_potential='rm'), and which of its models:
  # 'outcome' (Bradley-Terry ORM) or 'process' (per-turn PRM).
  config.rl.reward_model_dir = ""
  config.rl.reward_model_kind = "outcome"
  # Per-turn step (process) rewards (rewards.step_rewards.step_turn_rewards;
  # needs credit 'per_turn'): the step score p_k in [0, 1] ('none' = off,
  # 'valid_call', or 'prm': the frozen process RM's per-turn score on every
  # turn, answer included), its transform ('sum', 'clip', 'delta',
  # 'delta_drop', 'min', 'gated'), coefficient c, the clip transform's eta
  # and the gated transform's outcome threshold.
  config.rl.step_reward = "none"
  config.rl.step_reward_transform = "sum"
  config.rl.step_reward_coef = 0.0
  config.rl.step_reward_clip_eta = 1.0
  # Clip threshold from the batch: eta = this quantile of the scored step
  # scores (0 = use step_reward_clip_eta).
  config.rl.step_reward_clip_quantile = 0.0
  config.rl.step_reward_gate_threshold = 1.0
  # Log RL metrics (and the learning curve's RL points) every this many RL
  # steps; SFT logs every config.log_every_steps.
  config.rl.log_every_steps = 1

  # Held-out evaluation on a fixed task set (greedy) plus pass@k from samples.
  # initial=True also evaluates the weights before SFT (eval_initial.json; only
  # when sft.steps > 0, e.g. an imported checkpoint's zero-shot score).
  config.eval = ml_collections.ConfigDict(
      dict(
          # Held-out tasks, drawn once from this seed (the same set every run).
          num_tasks=256,
          seed=12345,
          # Samples per task at this temperature for pass@k (0 samples = greedy only).
          num_samples=8,
          temperature=1.0,
          # The k of pass@k (each <= num_samples).
          pass_k=(1, 2, 4, 8),
          # Also evaluate the weights before SFT (see above).
          initial=False,
      )
  )

  # Save every this many steps (and at the end of each phase). 100 here: a
  # save costs ~0.2 s of Orbax's Python for a small state (threads and event
  # loops; the default job's 125 arrays, 6 MB), two to three of this job's
  # SFT steps; every 25 steps took ~11% of its SFT phase, every 100 ~4%
  # (docs/models.md, "SFT bucket lengths fitted to the demonstrations").
  # Configs with slow steps save more often (e.g. configs/gsm_tool.py).
  config.checkpoint.every_steps = 100

  if arg == "smoke":
    config.name = "default_smoke"
    config.sft.steps = 20
    config.sft.batch_size = 16
    config.sft.fit_bucket = False  # 20 steps: the fit costs more than it saves
    config.rl.steps = 4
    config.rl.batch_size = 16
    config.rl.group_size = 4
    config.eval.num_tasks = 16
    config.eval.num_samples = 2
    config.eval.pass_k = (1, 2)
    config.checkpoint.every_steps = 5
    config.log_every_steps = 2
  elif arg is not None:
    raise ValueError(f"configs/default.py: unknown arg {arg!r}; known: 'smoke'")
  return config
