"""experiments/bench_peers.py helpers: FLOP and parameter counts by hand, the
interleaving order, paired ratios and the table, allocator environments, the
benchmark tokenizer and environment. No peer engine is needed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from absl import app
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from agentic_rl.models import transformer
from experiments import bench_args
from experiments.peers import common
from experiments.peers import ours_worker

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# d 2, one layer, one query and one kv head of 2, SwiGLU 3, vocabulary 5.
SMALL = dict(
    vocab_size=5,
    d_model=2,
    num_layers=1,
    num_heads=1,
    num_kv_heads=1,
    head_dim=2,
    ffn_dim=3,
    rope_theta=10_000.0,
    norm_eps=1e-6,
)


def test_iteration_flops_by_hand():
  # Projection weights per token: q 2*2 + k 2*2 + v 2*2 + o 2*2 + 3 * 2*3 =
  # 34; attention 4 * layers * heads * head_dim = 8 per unit of context;
  # output layer 2 * 5 = 10 weights. P = 2, N = 3, T = 5.
  # sample: 2*34 * (P + N - 1 = 4) + 2*10 * N + 8 * (contexts 1+2 + 3+4)
  #       = 272 + 60 + 80 = 412
  # forward: 2*34 * 5 + 2*10 * 3 + 8 * (1+2+3+4+5) = 340 + 60 + 120 = 520
  got = common.iteration_flops(SMALL, episodes=2, prompt_len=2, new_tokens=3)
  assert got == dict(
      sample=2 * 412,
      reference=2 * 520,
      policy=2 * 3 * 520,
      total=2 * (412 + 4 * 520),
  )


def test_benchmark_workload_numbers():
  # The numbers the docstring quotes.
  s = common.spec(tiny=False)
  assert s["params"] == 4_059_392
  assert s["episodes"] == 64
  assert round(s["flops"]["total"] / 1e9, 1) == 252.2
  assert len(s["prompts"]) == 16
  assert {len(p) for p in s["prompts"]} == {32}
  assert all(0 <= i < 480 for p in s["prompts"] for i in p)
  assert s["prompts"] == common.spec(tiny=False)["prompts"]  # fixed


@pytest.mark.parametrize("tiny", [False, True])
def test_param_count_matches_our_model(tiny):
  m = common.TINY_MODEL if tiny else common.MODEL
  cfg = transformer.TransformerConfig(qkv_bias=True, tie_embeddings=True, **m)
  shapes = nnx.state(
      nnx.eval_shape(lambda: transformer.Transformer(cfg, nnx.Rngs(0)))
  )
  n = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))
  assert common.param_count(m) == n


def test_param_count_by_hand():
  # q 2*2 + 2, k and v 2*2 + 2 each, o 2*2, gate/up/down 3 * 2*3, norms 2*2;
  # embedding 5*2, final norm 2.
  per_layer = 6 + 6 + 6 + 4 + 18 + 4
  assert common.param_count(SMALL) == per_layer + 10 + 2


def test_round_order_rotates():
  e = ["ours", "trl", "tunix"]
  assert [common.round_order(e, r) for r in range(4)] == [
      ["ours", "trl", "tunix"],
      ["trl", "tunix", "ours"],
      ["tunix", "ours", "trl"],
      ["ours", "trl", "tunix"],
  ]
  assert common.round_order([], 3) == []


def _result(engine, r, s, mm=100e9):
  return dict(
      engine=engine,
      round=r,
      s_per_iter=s,
      matmul_flops=mm,
      allocator="glibc",
      threads="2",
      version="v",
  )


def test_paired_ratios_and_table():
  results = {
      "ours": [_result("ours", 0, 1.0), _result("ours", 1, 2.0)],
      "trl": [_result("trl", 0, 1.5), _result("trl", 1, 2.0, 200e9)],
      # tunix failed in round 1: only round 0 pairs.
      "tunix": [_result("tunix", 0, 3.0)],
  }
  rounds = [{"ours": 1.0, "trl": 1.5, "tunix": 3.0}, {"ours": 2.0, "trl": 2.0}]
  assert common.paired_ratios(rounds, "trl") == [1.5, 1.0]
  assert common.paired_ratios(rounds, "tunix") == [3.0]
  rows = common.table(results, flops_total=150e9)
  assert len(rows) == 2 + 3
  ours, trl, tunix = rows[2:]
  # ours: median 1.5 s -> 100 GFLOP/s, own matmul 100 -> 100%, best 200 -> 50%.
  assert ours.startswith("| ours | 1.500 [1.000, 2.000] | 1 | 100.0 | 100.0 ")
  assert "| 100% | 50% |" in ours
  # trl: ratios 1.5 and 1.0 -> median 1.25; median matmul 150 GFLOP/s.
  assert "| 1.25x [1.00x, 1.50x] |" in trl
  assert "| 1.750 [1.500, 2.000] |" in trl
  assert "| 150.0 |" in trl
  # one round: no spread printed
  assert tunix.startswith("| tunix | 3.000 | 3.00x | 50.0 |")


def test_allocator_env():
  base = dict(
      PATH="/bin",
      LD_PRELOAD="/x/libtcmalloc.so",
      MALLOC_ARENA_MAX="4",
      AGENTIC_RL_HOST_MEMORY="return",
  )
  env = common.allocator_env
  # default: as shipped; inherited allocator settings dropped
  assert env("default", "ours", base) == {"PATH": "/bin"}
  assert env("default", "trl", base) == {"PATH": "/bin"}
  assert env("system", "ours", base)["AGENTIC_RL_HOST_MEMORY"] == "system"
  assert env("system", "tunix", base) == {"PATH": "/bin"}
  keep_ours = env("keep", "ours", base)
  assert keep_ours == {"PATH": "/bin", "AGENTIC_RL_HOST_MEMORY": "keep"}
  keep_peer = env("keep", "trl", base)
  assert keep_peer == {
      "PATH": "/bin",
      "MALLOC_ARENA_MAX": "1",
      "MALLOC_MMAP_MAX_": "0",
      "MALLOC_TRIM_THRESHOLD_": "2147483647",
  }
  for engine in ("ours", "trl", "tunix"):
    je = env("jemalloc", engine, base)
    assert je["LD_PRELOAD"] == common.JEMALLOC
    assert je["MALLOC_CONF"] == common.JEMALLOC_CONF
    assert "MALLOC_ARENA_MAX" not in je
  assert env("jemalloc", "ours", base)["AGENTIC_RL_HOST_MEMORY"] == "system"
  with pytest.raises(ValueError, match="allocator 'tcmalloc'"):
    env("tcmalloc", "ours", base)


def test_prompt_text_and_reward():
  assert common.prompt_text([3, 0, 17]) == "t3 t0 t17"
  assert common.text_reward("t7 t2 t0 t71", 8) == 2 / 8
  assert common.text_reward("", 8) == 0.0


def test_tokenizer_round_trip(tmp_path):
  tokenizers = pytest.importorskip("tokenizers")
  common.write_tokenizer(str(tmp_path), vocab_size=12)
  tok = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
  assert tok.encode("t3 t0 t11").ids == [3, 0, 11]
  # The specials lie outside the model's vocabulary.
  assert [tok.token_to_id(s) for s in (common.PAD, common.EOS)] == [12, 13]
  assert tok.decode([3, 0, 11]) == "t3 t0 t11"
  cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
  assert cfg["pad_token"] == common.PAD and cfg["eos_token"] == common.EOS


def test_bench_env_step_and_facts():
  env = ours_worker.BenchEnv(prompts=((1, 2, 3), (4, 5, 6)), max_action_len=4)
  assert env.max_prompt_len == 3 and env.stop_tokens == ()
  tasks = env.sample_tasks(jax.random.PRNGKey(0), 5)
  assert tasks.tolist() == [0, 1, 0, 1, 0]
  state, prompt, plen = env.reset(tasks[1])
  assert prompt.tolist() == [4, 5, 6] and int(plen) == 3
  # even ids at 0 and 2; the last one lies past action_len
  action = jnp.asarray([4, 1, 0, 2], jnp.int32)
  state, obs, obs_len, done = env.step(state, action, jnp.int32(3))
  assert bool(done) and int(obs_len) == 0 and obs.shape == (1,)
  facts = env.facts(state)
  assert float(facts["call_score"]) == 2 / 4
  assert bool(facts["correct"]) and bool(facts["answered"])
  assert not bool(facts["format_error"])


def test_ours_config():
  spec = common.spec(tiny=True)
  config = ours_worker.ours_config(spec, "/some/folder")
  assert config.max_len == spec["prompt_len"] + spec["new_tokens"]
  rl = config.rl
  assert rl.batch_size == spec["episodes"] == 8
  assert (rl.num_minibatches, rl.ppo_epochs, rl.num_microbatches) == (1, 1, 1)
  assert rl.kl_estimator == "k3" and rl.kl_coef == spec["beta"] > 0
  assert rl.behaviour_logprobs == "sampler"
  assert config.model.hf_path == "/some/folder"
  # --micro_batches reaches the accumulation loop (and nothing else).
  micro = ours_worker.ours_config(dict(spec, micro_batches=2), "/some/folder")
  assert micro.rl.num_microbatches == 2
  assert micro.rl.batch_size == rl.batch_size


def _run_tiny(tmp_path, *args):
  """`bench_peers.py --tiny --engines=ours` with its model folder under
  tmp_path, plus `args`; the finished process."""
  return subprocess.run(
      [
          sys.executable,
          os.path.join(REPO, "experiments", "bench_peers.py"),
          "--tiny",
          "--engines=ours",
          f"--model_dir={tmp_path / 'model'}",
          *args,
      ],
      capture_output=True,
      text=True,
      check=False,
  )


@pytest.mark.slow
def test_tiny_run_ours(tmp_path):
  """The driver end to end on our engine (--tiny; about a minute)."""
  out = tmp_path / "bench.md"
  p = _run_tiny(tmp_path, "--rounds=1", "--iters=1", f"--out={out}")
  assert p.returncode == 0, p.stderr[-2000:]
  text = out.read_text()
  assert "round 0 ours" in text and "completion tokens mean 8.0" in text
  assert "| ours |" in text


def test_micro_batches_must_divide_the_prompts(tmp_path):
  """--micro_batches that does not divide the prompts is refused before any
  engine starts (tunix counts micro-batches in prompts)."""
  p = _run_tiny(tmp_path, "--micro_batches=3")
  assert p.returncode == 2
  assert "--micro_batches=3: 3 must divide the 2 prompts" in p.stderr
  assert "Protocol:" not in p.stderr  # one line, not the usage text
  assert "round 0" not in p.stdout


def test_parse_micro_batches():
  parse = lambda text, n: bench_args.parse_micro_batches(
      text, n, ("ours", "trl", "tunix")
  )
  assert parse("4", 16) == {"ours": 4, "trl": 4, "tunix": 4}
  assert parse("ours=4", 16) == {"ours": 4, "trl": 1, "tunix": 1}
  assert parse("ours=4,trl=2,tunix=1", 16) == {"ours": 4, "trl": 2, "tunix": 1}
  for bad, msg in [
      ("0", "not an integer >= 1"),
      ("x", "not an integer >= 1"),
      ("ours=", "not an integer >= 1"),
      ("3", "3 must divide the 16 prompts"),
      ("vllm=2", "unknown engine 'vllm'"),
  ]:
    with pytest.raises(app.UsageError, match=msg):
      parse(bad, 16)


def test_parse_cpu_devices():
  parse = lambda text, n: bench_args.parse_cpu_devices(
      text, n, ("ours", "tunix")
  )
  assert parse("1", 16) == {"ours": 1, "tunix": 1}
  assert parse("2", 16) == {"ours": 2, "tunix": 2}
  assert parse("ours=2", 16) == {"ours": 2, "tunix": 1}
  for bad, msg in [
      ("0", "not an integer >= 1"),
      ("3", "--cpu_devices=3: 3 must divide the 16 prompts"),
      ("trl=2", "unknown engine 'trl'"),
  ]:
    with pytest.raises(app.UsageError, match=msg):
      parse(bad, 16)


def test_cpu_devices_env_replaces_only_the_device_count():
  flag = "--xla_force_host_platform_device_count"
  base = {"XLA_FLAGS": f"--xla_backend_optimization_level=0 {flag}=8", "A": "1"}
  env = common.cpu_devices_env(2, base)
  assert env["XLA_FLAGS"] == f"--xla_backend_optimization_level=0 {flag}=2"
  assert env["A"] == "1" and base["XLA_FLAGS"].endswith("=8")  # base kept
  assert common.cpu_devices_env(1, {})["XLA_FLAGS"] == f"{flag}=1"
  with pytest.raises(ValueError, match="cpu devices 0"):
    common.cpu_devices_env(0, {})


def test_cpu_devices_must_keep_whole_groups_in_each_micro_batch(tmp_path):
  # --tiny: 2 prompts; ours' 2 micro-batches hold one prompt each, which 2
  # devices cannot split into whole groups. Refused before any engine runs.
  p = _run_tiny(tmp_path, "--micro_batches=ours=2", "--cpu_devices=2")
  assert p.returncode == 2, p.stderr
  assert (
      "--cpu_devices: ours's 2 devices must divide the 1 prompts of each of "
      "its 2 micro-batches" in p.stderr
  )
  assert "round 0" not in p.stdout


@pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPU cores"
)
@pytest.mark.parametrize("micro,want", [("1", "ours 2"), ("ours=2", "ours 1")])
def test_default_cpu_devices_are_what_main_py_picks(tmp_path, micro, want):
  # --tiny: 2 prompts of 4 episodes. One micro-batch: main.py's automatic 2
  # devices. Two: one prompt each, which 2 devices cannot hold whole: 1.
  p = _run_tiny(tmp_path, "--rounds=1", f"--micro_batches={micro}")
  assert p.returncode == 0, p.stderr[-2000:]
  assert f"; XLA CPU devices {want};" in p.stdout
  n = want.split()[1]
  assert f"XLA, {os.cpu_count()} CPUs, {n} device" in p.stdout


def test_xla_threads_cell():
  assert common.xla_threads(2, 1) == "XLA, 2 CPUs, 1 device"
  assert common.xla_threads(2, 2) == "XLA, 2 CPUs, 2 devices"
