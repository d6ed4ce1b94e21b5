"""experiments/bench_decode_weights.py: the decode's FLOP count by hand, the
shared-layer model, and (slow tier) the script end to end on the tiny
model."""

import os
import re
import subprocess
import sys

import jax
import pytest
from flax import nnx

from agentic_rl.models import transformer
from experiments import bench_decode_weights
from experiments.peers import common

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_decode_flops_counted_by_hand():
  # One layer, d 4, F 8, vocab 10, 2 query heads / 1 kv head of 2; 3 rows
  # decode 2 tokens after a 5-token prompt.
  model = dict(
      d_model=4,
      ffn_dim=8,
      vocab_size=10,
      num_heads=2,
      num_kv_heads=1,
      head_dim=2,
      num_layers=1,
  )
  # Per token: q/k/v 2*4*(2+2)*2 = 64, output 2*2*2*4 = 32, SwiGLU
  # 2*3*4*8 = 192, output layer 2*4*10 = 80: 368.
  # Attention: 2 products x 2 FLOPs x 2 heads x 2 dims x (6 then 7) keys.
  attention = 2 * 2 * 2 * 2 * (6 + 7)
  assert bench_decode_weights.decode_flops(model, 3, 5, 2) == 3 * (
      2 * 368 + attention
  )


def test_decode_flops_of_the_benchmark_model():
  # Per token 2 x (4 layers x 983,040 weights + the 256 x 480 output
  # layer) = 8.11 MFLOP, close to 2 x 4,059,392 parameters (the tied table is
  # counted once, as the output layer; norms and biases are left out), plus
  # ~0.26 MFLOP of attention over ~64 cached positions: ~3% above.
  flops = bench_decode_weights.decode_flops(common.MODEL, 64, 32, 64)
  per_token = 2 * (4 * 983_040 + 256 * 480)
  attention = sum(4 * 2 * 2 * 4 * 64 * (33 + i) for i in range(64))
  assert flops == 64 * (64 * per_token + attention)
  assert flops == pytest.approx(2 * 4_059_392 * 64 * 64, rel=0.04)


def test_share_layers_keeps_one_copy_that_every_layer_reads():
  cfg = transformer.TransformerConfig(
      qkv_bias=True, tie_embeddings=True, max_positions=8, **common.TINY_MODEL
  )
  full = transformer.Transformer(cfg, nnx.Rngs(0))
  _, full_state = nnx.split(full)
  gd, state = nnx.split(
      bench_decode_weights.share_layers(
          transformer.Transformer(cfg, nnx.Rngs(0))
      )
  )
  nbytes = lambda t: sum(x.nbytes for x in jax.tree.leaves(t))
  layer = nbytes(nnx.state(full.blocks[0]))
  # One layer's weights instead of num_layers (2 in the tiny model).
  assert nbytes(state) == nbytes(full_state) - (cfg.num_layers - 1) * layer
  merged = nnx.merge(gd, state)
  assert merged.blocks[1] is merged.blocks[0]
  # Every layer computes with layer 0's weights: the shared model's logits
  # are those of the full model with layer 1's weights overwritten by layer
  # 0's.
  nnx.update(full.blocks[1], nnx.state(full.blocks[0]))
  tokens = jax.numpy.asarray([[1, 2, 3]], jax.numpy.int32)
  want, _ = full(tokens)
  got, _ = merged(tokens)
  assert jax.numpy.array_equal(got, want)


@pytest.mark.slow
def test_script_times_both_programs_on_the_tiny_model():
  proc = subprocess.run(
      [
          sys.executable,
          "-m",
          "experiments.bench_decode_weights",
          "--tiny",
          "--pairs=2",
      ],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=600,
      check=False,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = proc.stdout
  assert "over 2 XLA CPU device(s), 32 rows each" in out
  assert "model   " in out and "shared  " in out
  assert "model - shared, paired: median" in out
  # The shared model keeps one of the tiny model's 2 layers: fewer bytes.
  m = re.search(
      r"2 layers of ([\d.]+) MB, ([\d.]+) MB of weights in all \(([\d.]+) MB"
      r" shared\)",
      out,
  )
  assert m, out
  layer, total, shared = map(float, m.groups())
  assert shared == pytest.approx(total - layer, abs=0.011)
  assert 0 < shared < total
