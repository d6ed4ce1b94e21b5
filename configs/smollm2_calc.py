"""GRPO teaches SmolLM2-135M-Instruct (LoRA) to use a calculator tool, on a CPU.

The CPU-sized pretrained twin of configs/default.py: `What is 483*27?` in the
checkpoint's own ChatML, with a short system prompt that describes the tool;
the policy answers (`Answer: 13041`) or calls it (`calc(483*27)`), reads the
result as a `tool` message and answers. Hard items (3-digit x 2-digit
products) need the tool: the imported model answers none of 200 directly.
Easy items (single-digit sums and products) can be answered without it, but
the imported model answers only 0.545 of 200 directly (products often wrong,
e.g. 7*8 -> 54; experiments/smollm2_calc/base_direct.json); after SFT the
start answers 0.90-1.00 of them greedily without calling the tool (every seed
of the decision run). Prompts are 72-75 tokens with the system prompt and
the tool's description, assistant turns at most 32 tokens, at most 2 turns.

JAX-native on the real tokenizer (environments/chat_arithmetic.py: SmolLM2
writes every digit as its own token, so the call is parsed and the
observation written with jnp): the whole GRPO iteration, rollout included, is
one XLA program. `:host` runs the same task through the host (Python tool)
path (environments/host/chat_arithmetic.py), turn by turn.

The SFT warm start imitates a deliberately imperfect expert: it answers 90%
of hard items directly (with the true value, which the model cannot compute)
and never calls the tool on easy ones, so the start answers without the tool
and leaves room for RL.

Launch (CPU; the checkpoint folder is written on first use,
configs/smollm2_common.py):
  python main.py --config=configs/smollm2_calc.py --workdir=runs/smollm2_calc
  python main.py --config=configs/smollm2_calc.py:smoke --workdir=/tmp/calc
  :host (the host rollout path), :host_smoke.
Runtime: :smoke a few minutes (compiles dominate); one step's cost is in
experiments/smollm2_calc/README.md (python experiments/bench_smollm2_calc.py).
Measured by the decision runs (python -m experiments.smollm2_calc and its
further claims; experiments/smollm2_calc/README.md has every seed): over 10
seeds GRPO raised held-out greedy accuracy from the SFT start's 0.490 to
0.697, +0.206 [+0.022, +0.391] (paired 95% t interval): supported; 4 of 10
seeds took the tool up (0.995-1.000), 6 never did. Turn-level credit
(MT-GRPO) against GRPO, 8 seeds: inconclusive. OTC's tool-efficiency reward
against GRPO, 8 seeds: inconclusive (experiments/smollm2_calc/results_otc.md).
"""

from __future__ import annotations

import ml_collections

from configs import smollm2_common

# Longest prompt (999*99) in SmolLM2 ids, with the default system prompt.
_PROMPT_LEN = 75


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  config = smollm2_common.base("smollm2_calc")
  config.env = ml_collections.ConfigDict(
      dict(
          # JAX-native, ids from the checkpoint's tokenizer.
          name="chat_arithmetic",
          # Prompt ids (the longest prompt is 75; checked by the environment).
          max_prompt_len=_PROMPT_LEN,
          # Ids of one assistant turn (a call is 10-16, an answer 5-11).
          max_action_len=32,
          # Observation ids (<|im_end|>, tool message, generation prompt).
          max_obs_len=20,
          # A call, then the answer.
          max_turns=2,
          # Fraction of tasks that are hard (need the tool).
          hard_fraction=0.5,
          # Share of demonstrations that misuse the tool (configs/default.py;
          # overridden on both kinds of item by the two fields below).
          expert_imperfect_prob=0.65,
          # The misuse is under-calling only: 90% of hard items answered
          # directly (with the true value, which the model cannot compute),
          # easy items never sent to the tool. The 40-step SFT start takes
          # one mode on the hard items, depending on the seed: with the
          # symmetric expert (0.65 both ways, version 1) seed 1 always
          # called (greedy 1.000); with 0.65 under-calling only (version 2)
          # seed 0 never called (greedy 0.505) and seed 1 called on 83% of
          # hard items (greedy 0.915, headroom 0.117 < 0.2): no room either
          # time. Version 3 (2026-12-05): 90%, so that calling is a 10%
          # habit the start is unlikely to take greedily;
          # experiments/smollm2_calc/README.md, setup attempts.
          expert_undercall_prob=0.9,
          expert_overcall_prob=0.0,
      )
  )
  config.max_len = _PROMPT_LEN + 2 * 32 + 20
  # Speed at L = 159 (experiments/smollm2_calc/README.md, "Step cost"): no
  # rematerialisation (saved activations of 4 rows x 159 positions fit; remat
  # recomputed every block's forward in the backward pass), and the sampler's
  # log-probs as behaviour log-probs: with one optimizer step per iteration
  # the ratio is 1 up to the sampler/trainer mismatch, and the trainer-side
  # behaviour forward was a whole extra pass over the batch.
  config.model.remat = False
  config.rl.behaviour_logprobs = "sampler"
  # LoRA rank 8 on all seven projections (experiments/bench_lora.py setting):
  # the frozen base is the reference, no optimizer state for it.
  config.model.lora.rank = 8
  config.model.lora.alpha = 16.0
  # SFT warm start on the imperfect expert (LoRA learning rate).
  config.sft = smollm2_common.sft_warm_start(
      steps=40, batch_size=8, learning_rate=1e-3
  )
  config.sft.num_microbatches = 2
  # GRPO: 4 tasks x 4 samples per step.
  config.rl.steps = 30
  config.rl.batch_size = 16
  config.rl.group_size = 4
  config.rl.num_microbatches = 4
  config.rl.learning_rate = 2e-4
  config.rl.rewards = ml_collections.ConfigDict(dict(correct=1.0, format=0.1))
  # Held-out: 200 fixed tasks (100 hard, 100 easy), greedy; pass@1 and
  # pass@2 from 2 samples per task at T = 1 (each pass over the 200 tasks
  # costs about as much as the greedy one).
  config.eval.num_tasks = 200
  config.eval.num_samples = 2
  config.eval.pass_k = (1, 2)
  config.checkpoint.every_steps = 10

  if arg in ("host", "host_smoke"):
    config.name = "smollm2_calc_host"
    config.env.name = "chat_arithmetic_host"
  if arg in ("smoke", "host_smoke"):
    config.name += "_smoke"
    smollm2_common.shrink_for_smoke(config)
  elif arg not in (None, "host"):
    raise ValueError(
        f"configs/smollm2_calc.py: unknown arg {arg!r}; known: 'smoke', "
        "'host', 'host_smoke'"
    )
  return config
