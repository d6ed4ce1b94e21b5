"""Reward models for tool-using agents: outcome (Bradley-Terry / regression) and
process (per-turn) reward models on the policy's transformer trunk.

Model: the decoder of agentic_rl/models/transformer.py with its scalar reward head
`reward_head_d` (TransformerConfig.reward_head=True), optionally preceded by one
extra hidden layer of our own (`head_layers=2`: r = w . gelu(W h + c)). Sequences
are read whatever their padding side: positions count real tokens only and
padding keys are masked (as in `Transformer.reward`).

  outcome RM (ORM):  one score per episode, read at its last real token.
  process RM (PRM):  one logit per turn boundary (the last token of turn k: its
                     action and, for a tool call, the observation), trained with a
                     binary cross-entropy on per-turn labels; an episode's score is
                     sum_k log sigmoid(s_k) (the product of step-correctness
                     probabilities, Lightman et al., "Let's Verify Step by Step",
                     arXiv:2305.20050) or min_k sigmoid(s_k).

Losses (per pair / per episode; means are taken by the caller):

  Bradley-Terry:  -log sigmoid(r_chosen - r_rejected - m)   (Ouyang et al.,
                  InstructGPT, arXiv:2203.02155, eq. 1; margin m as in Touvron et
                  al., Llama 2, arXiv:2307.09288, eq. 2)
  regression:     (r - y)^2
  process BCE:    -[y log sigmoid(s) + (1 - y) log(1 - sigmoid(s))]

Robust variants: an ensemble of members (mean or min of their scores; Coste et al.,
"Reward Model Ensembles Help Mitigate Overoptimization", arXiv:2310.02743) and WARM
weight averaging of fine-tunes from one initialisation (Rame et al.,
arXiv:2401.12187). Use inside RL: `trajectory_rm_outputs` scores a batch of
episodes in one pass (episode logit for the `rm` reward component of
rewards/components.py, and per-state potentials for PBRS); `monitor_metrics` /
`overoptimization_gap` are the gold-verifier monitor (Gao et al., "Scaling Laws
for Reward Model Overoptimization", arXiv:2210.10760); `rm_score_to_reward`
bounds a score offline.

Modules (nothing is re-exported here: import the module that holds a name):

  model.py      the reward model: config, initialisation (optionally from a
                policy), hidden states, ORM scores, PRM boundary logits and
                episode aggregation, turn boundaries, `EpisodeBatch`
  training.py   the losses, `PairBatch`, the train step (rm mode), and the
                evaluation math (pairwise accuracy, best-of-N)
  ensembles.py  ensembles (mean / min of member scores) and WARM averaging
  frozen.py     a frozen RM used inside RL: `FrozenRewardModel`, one-pass
                episode scores and potentials (`trajectory_rm_outputs`), the
                bounded reward and the gold-verifier monitor
"""
