"""Does a pretrained model learn? SmolLM2-135M-Instruct, LoRA, GRPO on BFCL.

One command runs every seed (each in its own process: LoRA SFT warm start on
gold calls of the training split, then LoRA GRPO, see `experiment_config`),
scores the same 100 held-out tasks before RL (the SFT checkpoint) and after
RL with greedy decoding (and, with --num_samples > 0, n samples per task at
T = 1 for pass@k), and writes into --out:

  seed_<s>/                the run's workdir (main.py layout: config.json,
                           metrics.jsonl, eval_sft.json, eval_report.json, ...)
  seed_<s>/eval_tasks_{sft,final}.json   per-task greedy correctness and
                           per-task correct-sample counts (this runner)
  results.json             commit, config hash, per-seed before/after scores,
                           paired differences with 95% CIs, pass@k, wall time
  results.md               the same as tables
  reward_curve.png         RL reward, KL and format reward per step, per seed

Statistics (experiments/stats.py): per seed, the paired per-task difference
after - before of greedy correctness over the held-out tasks (mean, 95%
Student-t CI over tasks); over seeds (>= 2), the paired per-seed difference of
held-out accuracy (mean, 95% t CI with n - 1 degrees of freedom). The claim
"RL raises held-out accuracy" is supported when the across-seed CI lies above
0, and the per-seed CIs say whether each seed alone moved.

  python -m experiments.smollm2_lora.run --out=runs/smollm2_lora \
      [--seeds=0,1,2] [--rl_steps=30] [--sft_steps=16] [--eval_tasks=100] \
      [--num_samples=4 --pass_k=1,2,4]
  python -m experiments.smollm2_lora.run --out=DIR --report_only   # tables only

A seed whose workdir exists resumes (main.py's checkpoints and its config
check). Setup choices and why: experiments/smollm2_lora/README.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time

import numpy as np

REPO = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)


def experiment_config(
    seed: int,
    rl_steps: int,
    sft_steps: int,
    eval_tasks: int,
    num_samples: int,
    pass_k: tuple[int, ...],
):
  """configs/smollm2_bfcl.py with LoRA adapters; every change is commented.

  Returns:
    ml_collections.ConfigDict ready for train.train_and_evaluate.
  """
  from configs import smollm2_bfcl  # noqa: PLC0415
  from configs import smollm2_common  # noqa: PLC0415

  config = smollm2_bfcl.get_config()
  config.name = "smollm2_lora_bfcl"
  config.seed = seed
  # LoRA rank 8 on all seven projections, alpha / rank = 2 (the bench_lora
  # setting; 2.44M trainable parameters). Reference = the base plus the SFT
  # adapters, i.e. the SFT policy.
  config.model.lora.rank = 8
  config.model.lora.alpha = 16.0
  # Learning rates: 10x the full fine-tuning rates of configs/smollm2_bfcl.py
  # (SFT 5e-5, RL 2e-6), the usual LoRA-vs-full ratio (adapters start at
  # B = 0 and their update is scaled by alpha / rank). Chosen before any run,
  # not tuned.
  config.sft = smollm2_common.sft_warm_start(
      steps=sft_steps, batch_size=8, learning_rate=5e-4
  )
  config.rl.learning_rate = 2e-5
  config.rl.steps = rl_steps
  # The imported model's zero-shot score is known (0.00, format errors 1.00,
  # experiments/smollm2/README.md) and costs ~18 CPU-minutes: not re-scored.
  config.eval.initial = False
  config.eval.num_tasks = eval_tasks
  config.eval.num_samples = num_samples
  config.eval.temperature = 1.0
  config.eval.pass_k = tuple(k for k in pass_k if k <= num_samples)
  return config


def config_hash(config) -> str:
  """sha1 (12 hex digits) of the config's JSON, keys sorted."""
  blob = json.dumps(json.loads(config.to_json_best_effort()), sort_keys=True)
  return hashlib.sha1(blob.encode()).hexdigest()[:12]


def _child(args) -> None:
  """One seed in this process; records per-task evaluation results."""
  import jax  # noqa: PLC0415

  from agentic_rl import train  # noqa: PLC0415

  config = experiment_config(
      args.seed,
      args.rl_steps,
      args.sft_steps,
      args.eval_tasks,
      args.num_samples,
      _ints(args.pass_k),
  )
  workdir = os.path.abspath(args.workdir)
  original_evaluate = train.evaluate

  def recording_evaluate(config, env, graphdef, params, model_cfg):
    # The first evaluation of a run scores the SFT checkpoint (eval_sft.json is
    # written after it returns), the next one the final policy.
    label = (
        "final"
        if os.path.exists(os.path.join(workdir, "eval_sft.json"))
        else "sft"
    )
    runs = []
    rollout_fn = train.host_rollout.rollout

    def recorded(*a, **kw):
      traj = rollout_fn(*a, **kw)
      runs.append(np.asarray(traj.facts["correct"], bool))
      return traj

    train.host_rollout.rollout = recorded
    t0 = time.time()
    try:
      out = original_evaluate(config, env, graphdef, params, model_cfg)
    finally:
      train.host_rollout.rollout = rollout_fn
    record = {
        "greedy_correct": runs[0].astype(int).tolist(),
        "sample_correct_counts": (
            np.sum(runs[1:], axis=0).astype(int).tolist()
            if len(runs) > 1
            else None
        ),
        "num_samples": len(runs) - 1,
        "summary": out,
        "seconds": time.time() - t0,
    }
    with open(os.path.join(workdir, f"eval_tasks_{label}.json"), "w") as f:
      json.dump(record, f, indent=1)
    return out

  train.evaluate = recording_evaluate

  def timed(make, phase):
    def make_timed(*a, **kw):
      step = make(*a, **kw)

      def run(*x, **y):
        t = time.time()
        out = jax.block_until_ready(step(*x, **y))
        with open(os.path.join(workdir, "step_seconds.jsonl"), "a") as f:
          f.write(
              json.dumps({"phase": phase, "seconds": time.time() - t}) + "\n"
          )
        return out

      return run

    return make_timed

  # Wall seconds per step (compile included in each phase's first step).
  train.learner.make_rl_step = timed(train.learner.make_rl_step, "rl")
  train.learner.make_sft_step = timed(train.learner.make_sft_step, "sft")
  t0 = time.time()
  train.train_and_evaluate(config, workdir)
  with open(os.path.join(workdir, "wall_seconds.json"), "w") as f:
    json.dump(
        {
            "seconds_this_process": time.time() - t0,
            "config_hash": config_hash(config),
        },
        f,
    )


def _ints(s: str) -> tuple[int, ...]:
  return tuple(int(x) for x in s.split(",") if x.strip())


def _load(path):
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def _metrics(workdir: str) -> list[dict]:
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def analyse(out: str, seeds: tuple[int, ...], pass_k: tuple[int, ...]) -> dict:
  """Reads every seed's workdir under `out`; returns the results dict."""
  from agentic_rl import metrics as metrics_lib  # noqa: PLC0415
  from experiments import harness  # noqa: PLC0415
  from experiments import stats  # noqa: PLC0415

  per_seed, before_acc, after_acc = [], [], []
  for s in seeds:
    wd = os.path.join(out, f"seed_{s}")
    sft, fin = (
        _load(os.path.join(wd, f"eval_tasks_{x}.json"))
        for x in ("sft", "final")
    )
    rows = _metrics(wd)
    rl = [r for r in rows if r.get("phase") == "rl"]
    entry = {
        "seed": s,
        "rl_steps_done": len(rl),
        "config_hash": (_load(os.path.join(wd, "wall_seconds.json")) or {}).get(
            "config_hash"
        ),
        "before": sft["summary"] if sft else None,
        "after": fin["summary"] if fin else None,
    }
    spath = os.path.join(wd, "step_seconds.jsonl")
    if os.path.exists(spath):
      with open(spath) as f:
        secs = [json.loads(line) for line in f if line.strip()]
      for ph in ("sft", "rl"):
        v = [x["seconds"] for x in secs if x["phase"] == ph]
        if v:
          entry[f"{ph}_seconds_per_step_median"] = float(np.median(v))
    if sft and fin:
      b = np.asarray(sft["greedy_correct"], float)
      a = np.asarray(fin["greedy_correct"], float)
      entry["per_task_paired"] = stats.paired_difference(a, b)
      entry["tasks_changed"] = {
          "gained": int(np.sum((a == 1) & (b == 0))),
          "lost": int(np.sum((a == 0) & (b == 1))),
      }
      before_acc.append(float(b.mean()))
      after_acc.append(float(a.mean()))
      for label, rec in (("before", sft), ("after", fin)):
        n = rec["num_samples"]
        if n:
          c = np.asarray(rec["sample_correct_counts"])
          entry[f"pass_at_k_{label}"] = {
              str(k): float(metrics_lib.pass_at_k(n, c, k).mean())
              for k in pass_k
              if k <= n
          }
    if rl:
      entry["rl_reward_first_last"] = [
          rl[0].get("rl/reward"),
          rl[-1].get("rl/reward"),
      ]
      entry["rl_kl_last"] = rl[-1].get("rl/kl")
    per_seed.append(entry)
  res = {
      "experiment": "smollm2_lora_bfcl",
      "commit": harness.git_commit(),
      "seeds": list(seeds),
      "per_seed": per_seed,
  }
  if len(before_acc) >= 2:
    res["across_seeds_paired"] = stats.paired_difference(after_acc, before_acc)
    lo = res["across_seeds_paired"]["ci"][0]
    res["verdict"] = "supported" if lo > 0 else "inconclusive"
  else:
    res["verdict"] = (
        f"not decided: {len(before_acc)} finished seed(s); the across-seed "
        "test needs >= 2 (3 planned)"
    )
  return res


def plot(out: str, seeds: tuple[int, ...]) -> str:
  """reward_curve.png: RL reward, KL to the reference and format reward per step."""
  import matplotlib  # noqa: PLC0415

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # noqa: PLC0415

  keys = (
      ("rl/reward", "training reward"),
      ("rl/kl", "KL to SFT reference (nats/token)"),
      ("rl/accuracy", "training accuracy"),
  )
  fig, axes = plt.subplots(1, len(keys), figsize=(4 * len(keys), 3.2))
  for s in seeds:
    rl = [
        r
        for r in _metrics(os.path.join(out, f"seed_{s}"))
        if r.get("phase") == "rl"
    ]
    for ax, (k, _) in zip(axes, keys):
      pts = [(r["step"], r[k]) for r in rl if r.get(k) is not None]
      if pts:
        ax.plot(*zip(*pts), marker=".", label=f"seed {s}")
  for ax, (_, title) in zip(axes, keys):
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("step (SFT steps first)")
    ax.legend(fontsize=7)
  fig.tight_layout()
  path = os.path.join(out, "reward_curve.png")
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


def markdown(res: dict) -> str:
  """results.md: per-seed before/after table and the across-seed test."""
  f = lambda x: "n/a" if x is None or x != x else f"{x:.3f}"
  lines = [
      f"# SmolLM2-135M LoRA GRPO on BFCL (commit {res['commit']})",
      "",
      "| seed | config | RL steps | acc. before | acc. after | after - before "
      "[95% CI over tasks] | gained / lost | format err. before / after | "
      "RL reward first / last | KL last |",
      "|---|---|---|---|---|---|---|---|---|---|",
  ]
  for e in res["per_seed"]:
    b, a = e.get("before") or {}, e.get("after") or {}
    p = e.get("per_task_paired")
    diff = (
        f"{p['mean']:+.3f} [{p['ci'][0]:+.3f}, {p['ci'][1]:+.3f}]"
        if p
        else "n/a"
    )
    ch = e.get("tasks_changed")
    rw = e.get("rl_reward_first_last") or [None, None]
    lines.append(
        f"| {e['seed']} | {e['config_hash']} | {e['rl_steps_done']} | "
        f"{f(b.get('accuracy'))} | {f(a.get('accuracy'))} | {diff} | "
        f"{(str(ch['gained']) + ' / ' + str(ch['lost'])) if ch else 'n/a'} | "
        f"{f(b.get('format_error_rate'))} / {f(a.get('format_error_rate'))} | "
        f"{f(rw[0])} / {f(rw[1])} | {f(e.get('rl_kl_last'))} |"
    )
  pk = [
      (e["seed"], e.get("pass_at_k_before"), e.get("pass_at_k_after"))
      for e in res["per_seed"]
      if e.get("pass_at_k_before")
  ]
  if pk:
    lines += [
        "",
        "| seed | k | pass@k before | pass@k after |",
        "|---|---|---|---|",
    ]
    for s, pb, pa in pk:
      for k in pb:
        lines.append(f"| {s} | {k} | {f(pb[k])} | {f((pa or {}).get(k))} |")
  lines.append("")
  if "across_seeds_paired" in res:
    p = res["across_seeds_paired"]
    lines.append(
        f"Across seeds (n = {p['n']}): after - before accuracy {p['mean']:+.3f}, "
        f"95% CI [{p['ci'][0]:+.3f}, {p['ci'][1]:+.3f}] -> {res['verdict']}."
    )
  else:
    lines.append(f"Verdict: {res['verdict']}.")
  return "\n".join(lines) + "\n"


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", required=True)
  ap.add_argument("--seeds", default="0,1,2")
  ap.add_argument("--rl_steps", type=int, default=30)
  ap.add_argument("--sft_steps", type=int, default=16)
  ap.add_argument("--eval_tasks", type=int, default=100)
  ap.add_argument("--num_samples", type=int, default=4)
  ap.add_argument("--pass_k", default="1,2,4")
  ap.add_argument("--report_only", action="store_true")
  ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
  ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
  ap.add_argument("--workdir", default="", help=argparse.SUPPRESS)
  args = ap.parse_args(argv)
  if args.child:
    _child(args)
    return
  seeds = _ints(args.seeds)
  os.makedirs(args.out, exist_ok=True)
  walls = {}
  if not args.report_only:
    for s in seeds:
      cmd = [
          sys.executable,
          "-m",
          "experiments.smollm2_lora.run",
          "--child",
          f"--seed={s}",
          f"--workdir={os.path.join(args.out, f'seed_{s}')}",
          f"--rl_steps={args.rl_steps}",
          f"--sft_steps={args.sft_steps}",
          f"--eval_tasks={args.eval_tasks}",
          f"--num_samples={args.num_samples}",
          f"--pass_k={args.pass_k}",
          "--out=unused",
      ]
      t0 = time.time()
      subprocess.run(cmd, cwd=REPO, check=True)
      walls[s] = time.time() - t0
  res = analyse(args.out, seeds, _ints(args.pass_k))
  res["args"] = vars(args)
  res["wall_seconds"] = walls
  res["plot"] = plot(args.out, seeds)
  from agentic_rl import metrics  # noqa: PLC0415

  metrics.write_strict_json(os.path.join(args.out, "results.json"), res, 1)
  text = markdown(res)
  with open(os.path.join(args.out, "results.md"), "w") as f:
    f.write(text)
  print(text)


if __name__ == "__main__":
  main()
