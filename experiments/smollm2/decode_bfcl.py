"""Decode held-out BFCL prompts with transformers' own `generate` (a check that is
independent of our sampler) and show what our parser makes of each reply.

  python -m experiments.smollm2.decode_bfcl [--n=12] [--max_new_tokens=96]

Uses the imported SmolLM2 folder (agentic_rl.models.gguf.smollm2_hf_folder), the
ChatML prompt of configs/smollm2_bfcl.py (BFCLEnv with the HF tokenizer) and
greedy decoding that stops at <|im_end|> / <|endoftext|>. Needs torch and
transformers (requirements-test.txt). On 2026-12-01 all 12 replies were prose or
Python definitions, none a call (experiments/smollm2/README.md).
"""

from __future__ import annotations

import argparse

from agentic_text import tokenizers as tk
from agentic_rl.models import gguf
from environments.host.bfcl import single_turn as bfcl_single_turn
from environments.host import parsers


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--n", type=int, default=12, help="held-out tasks to decode")
  p.add_argument("--max_new_tokens", type=int, default=96)
  args = p.parse_args(argv)
  import torch  # pylint: disable=g-import-not-at-top
  from transformers import AutoModelForCausalLM  # pylint: disable=g-import-not-at-top

  folder = gguf.smollm2_hf_folder()
  tokenizer = tk.HFTokenizer.from_folder(folder)
  env = bfcl_single_turn.BFCLEnv(
      categories=("simple", "multiple"),
      max_prompt_len=384,
      max_action_len=args.max_new_tokens,
      tokenizer=tokenizer,
  )
  model = AutoModelForCausalLM.from_pretrained(
      folder, dtype=torch.float32
  ).eval()
  stops = tuple(env.chat_format.stop_tokens)
  calls = 0
  for task in env.eval_tasks(args.n, 0):
    state, (ids, _) = env.reset(task)
    x = torch.tensor([list(ids)])
    with torch.no_grad():
      out = model.generate(
          x,
          max_new_tokens=args.max_new_tokens,
          do_sample=False,
          eos_token_id=list(stops),
      )
    text = tokenizer.decode(
        [i for i in out[0, x.shape[1] :].tolist() if i not in stops]
    )
    parsed = parsers.parse_tool_calls(text)
    facts = env.facts(env.step(state, text)[0])
    ok = not isinstance(parsed, parsers.ParseError)
    calls += ok
    print(
        f"=== {task.questions[0]!s:.200}\n--- reply: {text[:300]!r}\n--- parsed: "
        f"{[(c.name, c.arguments) for c in parsed] if ok else parsed.reason}; "
        f"correct={bool(facts['correct'])}"
    )
  print(f"{calls} of {args.n} replies parsed as a call")


if __name__ == "__main__":
  main()
