"""The imported SmolLM2-135M-Instruct on configs/smollm2_calc.py's task, greedy.

Two measurements on the same held-out items (`env.eval_tasks(2n, seed)`: the
first n hard, 3-digit x 2-digit products; the last n easy, single-digit sums
and products), with our KV-cache sampler at temperature 0 and no adapters:

  direct: the prompt ends with the assistant's `Answer: ` (the answer forced,
    no tool); the digits the model writes next are its answer (its first
    non-digit id ends the number; none = wrong).
  free: the task as the policy sees it (the tool described in the system
    prompt); correct, tool calls, format errors per the environment.

Prints one JSON object (accuracies, counts, prompt lengths in ids) and writes
it to --out if given.

Usage:
  python -m experiments.smollm2_calc.base_accuracy --n=200 [--batch=100]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from agentic_rl import rollout
from agentic_rl import train
from agentic_rl import types
from agentic_rl.models import hf
from configs import smollm2_calc


def _chunks(tasks, n: int, batch: int):
  for i in range(0, n, batch):
    yield jax.tree.map(lambda x, i=i: x[i : i + batch], tasks)


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--n", type=int, default=200, help="items per kind")
  parser.add_argument("--batch", type=int, default=100)
  parser.add_argument("--seed", type=int, default=777)
  parser.add_argument("--modes", default="direct,free")
  parser.add_argument("--out", default="")
  args = parser.parse_args()

  config = smollm2_calc.get_config()
  config.model.lora.rank = 0
  env = train.make_env(config)
  model_cfg = train.make_model_config(config)
  graphdef, params = hf.params_from_hf_tensors(
      model_cfg, hf.read_safetensors(config.model.hf_path)
  )
  table = env.table
  tasks = env.eval_tasks(2 * args.n, args.seed)
  hard = np.asarray(tasks.hard)
  answer = np.asarray(tasks.answer)
  lens = [
      env.prompt_length(jax.tree.map(lambda x, i=i: x[i], tasks))
      for i in range(2 * args.n)
  ]
  out = {
      "n_hard": int(hard.sum()),
      "n_easy": int((~hard).sum()),
      "prompt_len_min": int(min(lens)),
      "prompt_len_max": int(max(lens)),
      "prompt_len_mean_hard": float(np.mean(np.asarray(lens)[hard])),
      "prompt_len_mean_easy": float(np.mean(np.asarray(lens)[~hard])),
  }
  key = jax.random.PRNGKey(0)

  if "direct" in args.modes:
    t0 = time.time()
    # The prompt ends with "Answer: ": the model's next ids are its number.
    direct_table = dataclasses.replace(
        table, prompt_tail=table.prompt_tail + table.answer_open
    )
    direct_env = dataclasses.replace(
        env,
        table=direct_table,
        max_prompt_len=env.max_prompt_len + len(table.answer_open),
        max_action_len=16,
    )
    digits = np.asarray(table.digits)
    values, texts = [], []
    for chunk in _chunks(tasks, 2 * args.n, args.batch):
      traj = rollout.rollout_jit(
          direct_env,
          chunk,
          key,
          max_len=direct_env.max_prompt_len + 16,
          graphdef=graphdef,
          params=params,
          model_config=model_cfg,
          temperature=jnp.float32(0.0),
      )
      toks = np.asarray(traj.tokens)
      role = np.asarray(traj.role)
      for row, r in zip(toks, role):
        ids = row[r == types.POLICY]
        v = ""
        for i in ids:
          hit = np.flatnonzero(digits == i)
          if not hit.size:
            break
          v += str(int(hit[0]))
        values.append(int(v) if v and len(v) <= 9 else None)
        texts.append(env.tokenizer.decode([int(i) for i in ids]))
    ok = np.array([v == a for v, a in zip(values, answer)])
    out["direct_accuracy_hard"] = float(ok[hard].mean())
    out["direct_accuracy_easy"] = float(ok[~hard].mean())
    out["direct_no_number"] = float(np.mean([v is None for v in values]))
    out["direct_seconds"] = round(time.time() - t0, 1)
    # A few direct replies of each kind, as text.
    out["direct_examples"] = [
        f"{i}: {int(tasks.a[i])}{'+-*'[int(tasks.op[i])]}{int(tasks.b[i])} "
        f"-> {texts[i]!r}"
        for i in list(range(4)) + list(range(args.n, args.n + 8))
    ]

  if "free" in args.modes:
    t0 = time.time()
    facts = []
    for chunk in _chunks(tasks, 2 * args.n, args.batch):
      traj = rollout.rollout_jit(
          env,
          chunk,
          key,
          max_len=config.max_len,
          graphdef=graphdef,
          params=params,
          model_config=model_cfg,
          temperature=jnp.float32(0.0),
      )
      facts.append(jax.device_get(traj.facts))
    f = {k: np.concatenate([x[k] for x in facts]) for k in facts[0]}
    for name, m in (("hard", hard), ("easy", ~hard)):
      out[f"free_accuracy_{name}"] = float(f["correct"][m].mean())
      out[f"free_tool_calls_{name}"] = float(f["num_tool_calls"][m].mean())
      out[f"free_format_error_{name}"] = float(f["format_error"][m].mean())
      out[f"free_answered_{name}"] = float(f["answered"][m].mean())
    out["free_seconds"] = round(time.time() - t0, 1)

  print(json.dumps(out, indent=1))
  if args.out:
    with open(args.out, "w") as fh:
      json.dump(out, fh, indent=1)


if __name__ == "__main__":
  main()
