"""experiments/bench_smollm2_calc.py helpers by hand: the buffer's tokens by
kind and the FLOPs of one iteration counted from the shapes."""

from __future__ import annotations

import types as pytypes

import numpy as np
import pytest

from agentic_rl import types
from experiments import bench_smollm2_calc as bench
from experiments.peers import common

P, Y, T, M, X = (
    types.PROMPT,
    types.POLICY,
    types.TOOL,
    types.TEMPLATE,
    types.PAD,
)

# Row 0: prompt of 2, a call of 2 sampled tokens, one tool token, the answer
# (1 sampled); row 1: prompt with scaffolding (2), 1 sampled, 3 padding.
ROLE = np.array(
    [[P, P, Y, Y, T, Y], [P, M, Y, X, X, X]],
    np.int8,
)
LENGTH = np.array([6, 3])

# d 2, one layer, one query and one kv head of 2, SwiGLU 3, vocabulary 5:
# projections 2 * 34 = 68 FLOPs per token, vocabulary 2 * 2 * 5 = 20 per
# logit, attention 4 * 1 * 1 * 2 = 8 per unit of context.
SMALL = dict(
    vocab_size=5,
    d_model=2,
    num_layers=1,
    num_heads=1,
    num_kv_heads=1,
    head_dim=2,
    ffn_dim=3,
)


def test_forward_flops_by_hand():
  assert common.forward_flops(SMALL, 1, 0, 0) == 68
  assert common.forward_flops(SMALL, 0, 1, 0) == 20
  assert common.forward_flops(SMALL, 0, 0, 1) == 8


def test_token_kinds_by_hand():
  assert bench.token_kinds(ROLE, LENGTH) == dict(
      prompt=4,  # 2 + 2 (the row's first sampled token is at 2 in both)
      sampled=4,  # 3 + 1
      observation=1,  # row 0's tool token
      padding=3,
      buffer=12,
      tool_episodes=1,
  )


def test_token_kinds_row_without_sampled_token_is_all_prompt():
  kinds = bench.token_kinds(np.array([[P, M, X]], np.int8), np.array([2]))
  assert kinds["prompt"] == 2 and kinds["sampled"] == 0
  assert kinds["observation"] == 0 and kinds["padding"] == 1


def test_step_flops_by_hand():
  # Sampling: 9 non-padding tokens, 4 sampled (logits), context 1+..+6 +
  # 1+2+3 = 27: 68 * 9 + 20 * 4 + 8 * 27 = 908. A forward over [2, 6]: 12
  # tokens with logits, context 2 * 21: 816 + 240 + 336 = 1392.
  got = bench.step_flops(SMALL, ROLE, LENGTH, 6)
  assert got == dict(
      sample=908, reference=1392, behaviour=0, update=2784, total=5084
  )
  # Full fine-tune (backward = 2 forwards), remat (+1), trainer behaviour
  # forward, 2 epochs: update 2 * 4 * 1392.
  got = bench.step_flops(
      SMALL,
      ROLE,
      LENGTH,
      6,
      lora=False,
      remat=True,
      trainer_behaviour=True,
      epochs=2,
  )
  assert got == dict(
      sample=908, reference=1392, behaviour=1392, update=11136, total=14828
  )
  # A trimmed batch of 3 columns: 6 tokens, context 2 * 6: 408 + 120 + 96.
  assert bench.step_flops(SMALL, ROLE, LENGTH, 3)["reference"] == 624


def test_step_flops_with_a_shared_prompt_by_hand():
  # Both rows one group sharing their first 2 positions (rl.shared_prefix_len
  # = 2): the second row skips them. Prefill: 2 positions without logits,
  # context 1 + 2: 68 * 2 + 8 * 3 = 160 less. Forwards over [2, 6]: 2
  # positions with logits, context 3: 136 + 40 + 24 = 200 less, the update
  # (LoRA: 2 forwards) 400 less.
  got = bench.step_flops(
      SMALL, ROLE, LENGTH, 6, prefix=2, prefix_group=2, sample_group=2
  )
  assert got == dict(
      sample=908 - 160,
      reference=1392 - 200,
      behaviour=0,
      update=2784 - 400,
      total=5084 - 760,
  )
  # A group of one row shares nothing; the prefill unshared (host path).
  assert bench.step_flops(
      SMALL, ROLE, LENGTH, 6, prefix=2, prefix_group=1, sample_group=1
  ) == bench.step_flops(SMALL, ROLE, LENGTH, 6)
  assert (
      bench.step_flops(
          SMALL, ROLE, LENGTH, 6, prefix=2, prefix_group=2, sample_group=1
      )["sample"]
      == 908
  )


def test_model_dims_multi_head_default():
  cfg = pytypes.SimpleNamespace(
      vocab_size=5,
      d_model=2,
      num_layers=1,
      num_heads=1,
      num_kv_heads=0,  # 0: as many kv heads as query heads
      head_dim=2,
      ffn_dim=3,
  )
  assert bench.model_dims(cfg) == SMALL


def test_make_config_keeps_the_configs_rows_per_micro_batch():
  # configs/smollm2_calc.py: 16 episodes in 4 micro-batches = 4 rows each; a
  # 32-episode step runs 8 micro-batches of 4 rows, as a run at 32 would.
  c = bench.make_config("native", 32, 4, [])
  assert (c.rl.batch_size, c.rl.group_size) == (32, 4)
  assert c.rl.num_minibatches == 1 and c.rl.num_microbatches == 8
  assert bench.microbatch_rows(c) == 4
  assert bench.make_config("host", 16, 4, []).rl.num_microbatches == 4
  # An explicit override comes after and wins.
  c = bench.make_config("native", 32, 4, ["rl.num_microbatches=4"])
  assert c.rl.num_microbatches == 4 and bench.microbatch_rows(c) == 8
  with pytest.raises(SystemExit, match="--batch=6"):
    bench.make_config("native", 6, 2, [])
