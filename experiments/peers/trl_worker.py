"""TRL's process of experiments/bench_peers.py (runs in the TRL virtualenv).

Reads the spec (JSON) on stdin, trains with trl.GRPOTrainer for
warmup_iters + iters steps on the benchmark's HF folder, prints one
`RESULT {json}` line. One training step is one GRPO iteration: generation of
64 completions (transformers `generate`, KV cache), the reference model's
log-probs, the loss forward + backward and one AdamW step (one generation
per step; gradient accumulation over spec["micro_batches"] micro-batches,
1 by default). The time of an iteration is the
interval between consecutive `on_step_end` callbacks; the float32 matmul rate
(torch.matmul) is measured in the callback of the last warm-up step.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
from experiments.peers import common  # pylint: disable=g-import-not-at-top


def main() -> None:
  spec = common.read_spec()
  import datasets  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  import trl  # pylint: disable=g-import-not-at-top

  folder, n_new = spec["folder"], spec["new_tokens"]
  warmup, iters = spec["warmup_iters"], spec["iters"]
  micro = spec.get("micro_batches", 1)
  # The word-level tokenizer.json as written (AutoTokenizer would rebuild a
  # Qwen2 BPE tokenizer from the config's model_type).
  tok = transformers.PreTrainedTokenizerFast.from_pretrained(folder)
  texts = [common.prompt_text(p) for p in spec["prompts"]]
  got = tok(texts[0], add_special_tokens=False)["input_ids"]
  if got != spec["prompts"][0]:
    raise AssertionError(f"tokenizer: {got[:8]}... != {spec['prompts'][0][:8]}")
  lengths = []

  def reward(prompts, completions, completion_ids, **kwargs):
    del prompts, kwargs
    lengths.extend(len(c) for c in completion_ids)
    return [common.text_reward(c, n_new) for c in completions]

  n = spec["matmul_n"]
  a = torch.randn(n, n, dtype=torch.float32)
  times, marks, info = [], [], {}

  class Timer(transformers.TrainerCallback):

    def on_substep_end(self, args, state, control, **kwargs):
      # A micro-step whose gradient is accumulated (no optimizer step).
      del args, state, control, kwargs
      info["substeps"] = info.get("substeps", 0) + 1

    def on_step_end(self, args, state, control, **kwargs):
      del args, control, kwargs
      info["steps"] = info.get("steps", 0) + 1
      now = time.perf_counter()
      step = state.global_step
      if step == warmup:
        info["warmup_s"] = now - info["start"]
        info["matmul_flops"] = common.matmul_rate(lambda: a @ a, n)
        info["r0"] = common.rusage()
        lengths.clear()
        now = time.perf_counter()
      elif step > warmup:
        times.append(now - marks[-1])
      marks.append(now)

    def on_log(self, args, state, control, logs=None, **kwargs):
      del args, state, control, kwargs
      info.setdefault("logs", {}).update(logs or {})

  args = trl.GRPOConfig(
      output_dir=tempfile.mkdtemp(prefix="bench_peers_trl_"),
      # --micro_batches: the 64 episodes in N accumulated micro-batches; the
      # generation batch stays 64 (per-device batch x accumulation steps).
      per_device_train_batch_size=spec["episodes"] // micro,
      gradient_accumulation_steps=micro,
      num_generations=spec["group_size"],
      max_completion_length=n_new,
      temperature=1.0,
      top_p=1.0,
      top_k=0,
      beta=spec["beta"],
      num_iterations=1,
      use_vllm=False,
      learning_rate=spec["learning_rate"],
      lr_scheduler_type="constant",
      warmup_steps=0,
      max_grad_norm=1.0,
      max_steps=warmup + iters,
      logging_steps=warmup + iters,  # one log line, after the last step
      report_to="none",
      save_strategy="no",
      use_cpu=True,
      bf16=False,
      fp16=False,
      disable_tqdm=True,
      dataloader_num_workers=0,
      seed=0,
      model_init_kwargs={"dtype": torch.float32},
      log_completions=False,
  )
  trainer = trl.GRPOTrainer(
      model=folder,
      reward_funcs=[reward],
      args=args,
      train_dataset=datasets.Dataset.from_dict({"prompt": texts}),
      processing_class=tok,
      callbacks=[Timer()],
  )
  params = sum(p.numel() for p in trainer.model.parameters())
  info["start"] = time.perf_counter()
  trainer.train()
  r1 = common.rusage()
  logs = info.get("logs", {})
  common.log("trl logs:", logs)
  common.emit(
      dict(
          engine="trl",
          version=(
              f"trl {trl.__version__}, transformers {transformers.__version__}"
              f", torch {torch.__version__}"
          ),
          threads=f"torch {torch.get_num_threads()} threads",
          allocator=common.allocator_in_use(),
          params=params,
          warmup_s=info["warmup_s"],
          matmul_flops=info["matmul_flops"],
          completion_tokens=f"{min(lengths)}-{max(lengths)}",
          reward=float(logs.get("reward", float("nan"))),
          kl=float(logs.get("kl", float("nan"))),
          user_s_per_iter=(r1["user_s"] - info["r0"]["user_s"]) / len(times),
          sys_s_per_iter=(r1["sys_s"] - info["r0"]["sys_s"]) / len(times),
          peak_rss_gb=r1["peak_rss_gb"],
          accumulation=(
              f"{trainer.args.gradient_accumulation_steps} x "
              f"{trainer.args.per_device_train_batch_size} episodes "
              "configured, "
              f"{(info.get('substeps', 0) + info['steps']) / info['steps']:g}"
              " micro-steps per optimizer step observed"
          ),
          **common.summary(times),
      )
  )


if __name__ == "__main__":
  main()
