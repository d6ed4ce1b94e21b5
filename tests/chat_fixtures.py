"""A tiny chat checkpoint for tests: a random LlamaForCausalLM (transformers)
with a small byte-level BPE trained here (`tokenizers`) and a ChatML template,
written as an HF folder (config.json, model.safetensors, tokenizer.json,
tokenizer_config.json, generation_config.json). Nothing is downloaded."""

from __future__ import annotations

import json
import os

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# The chat template of Qwen2 / ChatML, as shipped in tokenizer_config.json.
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CORPUS = [
    "You are an expert in composing functions. You are given a question.",
    '<tool_call>[{"name": "calculate_area", "arguments": {"base": 10}}]'
    "</tool_call>",
    "What is 483 times 27? Please compute it exactly. The answer is 13041.",
    "```python\nprint(17 * 23)\n```",
    "<answer>391</answer>",
    "system user assistant tool\n",
    "Find the area of a triangle with base 10.",
] * 20


def write_chat_checkpoint(
    path: str, vocab_size: int = 400, seed: int = 0, template: str = CHATML
) -> str:
  """Writes the tiny chat checkpoint into `path` and returns it.

  The model's vocabulary is `vocab_size` (>= the tokenizer's ids and >= the
  byte tokenizer's 265, which config validation asks of every checkpoint).
  """
  import tokenizers as hf_tokenizers  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  os.makedirs(path, exist_ok=True)
  bpe = hf_tokenizers.Tokenizer(hf_tokenizers.models.BPE())
  bpe.pre_tokenizer = hf_tokenizers.pre_tokenizers.ByteLevel(
      add_prefix_space=False
  )
  bpe.decoder = hf_tokenizers.decoders.ByteLevel()
  trainer = hf_tokenizers.trainers.BpeTrainer(
      vocab_size=vocab_size,
      special_tokens=SPECIALS,
      initial_alphabet=hf_tokenizers.pre_tokenizers.ByteLevel.alphabet(),
  )
  bpe.train_from_iterator(CORPUS, trainer)
  bpe.save(os.path.join(path, "tokenizer.json"))
  with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
    json.dump(
        {
            "chat_template": template,
            "eos_token": "<|im_end|>",
            "bos_token": None,
            "pad_token": "<|im_end|>",
        },
        f,
    )
  with open(os.path.join(path, "generation_config.json"), "w") as f:
    json.dump({"eos_token_id": 2, "bos_token_id": 1}, f)
  torch.manual_seed(seed)
  config = transformers.LlamaConfig(
      vocab_size=vocab_size,
      hidden_size=32,
      intermediate_size=64,
      num_hidden_layers=2,
      num_attention_heads=4,
      num_key_value_heads=2,
      head_dim=8,
      tie_word_embeddings=True,
      max_position_embeddings=2048,
      bos_token_id=1,
      eos_token_id=2,
      pad_token_id=2,
  )
  transformers.LlamaForCausalLM(config).save_pretrained(path)
  return path
