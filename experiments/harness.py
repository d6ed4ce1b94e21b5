"""Shared runner of the claim reproductions: arms x seeds -> table + plot.

A claim folder defines `ARMS` (arm name -> config, via its `config.py`) and calls
`run_claim`. Per arm, every seed trains in one vmapped program
(`agentic_rl.seeds.train_seeds`). Arms whose SFT phase is identical (same model,
environment, SFT settings, context length) share one SFT run: it is trained once
(rl.steps = 0) and each arm's workdir starts from a copy of its checkpoint, so the
arms differ only in what the claim varies.

A claim may declare a `stats.ClaimSpec` (parts, treatment and control arms,
predictions, room metric and threshold, positive-control check) before its run:
the room metric is computed from the shared SFT start policy of every seed
(`spec.room_fn`), printed and stored per seed, and the paired per-seed effects
with their 95% t intervals, sign-flip p-values and the verdict
(`stats.analyse`) go into results.md / results.json; a seed whose room is
below the threshold makes the verdict 'untestable at this setup'.

Outputs in `out_dir`: `results.md` (per metric mean +- standard error over seeds,
then every seed's value, then the verdict), `results.json` (all numbers, plus the
commit, the date, every arm's config hash, the seeds, room and analysis, and the
claim's ledger: one entry per decision run and re-decision, kept across runs),
`results.png` (a grid of panels: bars per arm with 95% t intervals and the seeds
as dots, RL learning curves with 95% t bands; panels of one metric share their
y-limits and show the SFT start level as a dashed line). Workdirs live under
`root` and make a re-run resume instead of restarting (a changed config is
refused, agentic_rl/seeds.py). A decision run (`cli` without --smoke) refuses
a git tree with uncommitted changes other than results files
(`require_clean_tree`), so its recorded commit is the code that ran.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import time
from typing import Callable, Mapping, Sequence

import jax
from jax.experimental.compilation_cache import compilation_cache
import ml_collections
import numpy as np

from agentic_rl import seeds as seeds_lib
from agentic_rl import validation
from agentic_rl.metrics import write_strict_json
from experiments import seeds as experiment_seeds
from experiments import stats

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _sft_key(config: ml_collections.ConfigDict) -> str:
  blob = json.dumps(
      {
          k: config[k].to_dict() if hasattr(config[k], "to_dict") else config[k]
          for k in ("model", "env", "sft", "max_len")
      },
      sort_keys=True,
      default=str,
  )
  return hashlib.sha1(blob.encode()).hexdigest()[:10]


def seeds_tag(seeds: Sequence[int]) -> str:
  """Short name of a seed list for workdir names: 's0-7' for 0, 1, ..., 7,
  's0_2_5' otherwise."""
  seeds = [int(s) for s in seeds]
  if len(seeds) > 1 and seeds == list(range(seeds[0], seeds[-1] + 1)):
    return f"s{seeds[0]}-{seeds[-1]}"
  return "s" + "_".join(map(str, seeds))


def run_dir(root: str, name: str, seeds: Sequence[int]) -> str:
  """The workdir of one SFT start or arm (`name`) trained on `seeds`.

  ROOT/NAME_<seeds_tag>, so runs of the same arm on other seed lists (a
  3-seed room check, then an 8-seed decision run) live side by side instead
  of the second being refused by the resume check. A workdir ROOT/NAME from
  before the tag existed is reused when its config.json holds the same seeds.
  """
  legacy = os.path.join(root, name)
  path = os.path.join(legacy, "config.json")
  if os.path.exists(path):
    try:
      with open(path) as f:
        saved = json.load(f).get("seeds")
    except ValueError:  # unreadable: not reused
      saved = None
    if saved is not None and [int(s) for s in saved] == [int(s) for s in seeds]:
      return legacy
  return f"{legacy}_{seeds_tag(seeds)}"


def mean_se(values: Sequence[float]) -> tuple[float, float]:
  """Mean and standard error (sample std / sqrt(n); 0 for one value)."""
  v = np.asarray(values, np.float64)
  se = float(v.std(ddof=1) / np.sqrt(len(v))) if len(v) > 1 else 0.0
  return float(v.mean()), se


def ci_halfwidth(values: Sequence[float], level: float = 0.95) -> float:
  """Half-width t_{n-1} * SE of the mean's t interval (0 for one value)."""
  n = len(values)
  return mean_se(values)[1] * stats.t_multiplier(n, level) if n > 1 else 0.0


def git_commit(repo: str = REPO) -> str:
  """`git rev-parse HEAD` of repo (+ '-dirty' with uncommitted changes to
  tracked files other than results files, `_RESULTS_FILE`), or 'unknown'
  outside a git checkout or without git."""
  try:
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
  except (OSError, subprocess.SubprocessError):
    return "unknown"
  dirty = [
      line
      for line in dirty.splitlines()
      if line.strip()
      and not _RESULTS_FILE.match(line[3:].split(" -> ")[-1].strip('"'))
  ]
  return head + ("-dirty" if dirty else "") if head else "unknown"


# Files a run writes into a claim folder: allowed to differ from HEAD when a
# decision run starts (a re-run overwrites them anyway).
_RESULTS_FILE = re.compile(
    r"^experiments/[^/]+/((results|room_check)[^/]*\.(json|md|png)"
    r"|seed_records/[^/]+\.json)$"
)


def dirty_paths(repo: str = REPO) -> list[str] | None:
  """Paths of `git status --porcelain` (tracked changes and untracked files
  that git does not ignore) other than results files (`_RESULTS_FILE`), or
  None outside a git checkout or without git."""
  try:
    out = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
  except (OSError, subprocess.SubprocessError):
    return None
  paths = []
  for line in out.splitlines():
    path = line[3:].split(" -> ")[-1].strip('"')
    if path and not _RESULTS_FILE.match(path):
      paths.append(path)
  return paths


def require_clean_tree(repo: str = REPO) -> None:
  """Refuses a decision run from a tree whose code is not its commit.

  Raises:
    UsageError: uncommitted changes or untracked files besides results files
      (the first five named), or no git checkout (the run's commit could not
      be recorded).
  """
  paths = dirty_paths(repo)
  if paths is None:
    raise UsageError(
        f"a decision run needs a git checkout to record its commit ({repo} is "
        "not one); use --smoke for a trial run"
    )
  if paths:
    more = f" and {len(paths) - 5} more" if len(paths) > 5 else ""
    raise UsageError(
        "a decision run needs a clean git tree (results files aside): commit "
        f"or stash {', '.join(paths[:5])}{more}; or use --smoke for a trial "
        "run"
    )


def _today() -> str:
  return time.strftime("%Y-%m-%d", time.gmtime())


def ledger_entry(meta: Mapping, kind: str = "decision run", **extra) -> dict:
  """One ledger entry from a results.json dict (`meta`): kind, date, commit,
  spec_hash, the arms' config hashes (None in a file from before they were
  recorded), seeds, verdict, command and the rules version that decided it."""
  analysis = meta.get("analysis") or {}
  spec = meta.get("spec") or {}
  return {
      "kind": kind,
      "date": meta.get("date"),
      "commit": meta.get("commit"),
      "spec_hash": stats.spec_hash(spec) if spec else None,
      "config_hash": meta.get("config_hash"),
      "seeds": meta.get("seeds"),
      "verdict": analysis.get("verdict"),
      "rules": analysis.get("rules", 1),
      "command": meta.get("command"),
      **extra,
  }


def _is_decision(d: Mapping) -> bool:
  a = d.get("analysis") or {}
  return (
      a.get("verdict") in stats.VERDICTS
      and not d.get("room_only")
      and len(d.get("seeds") or ()) >= 2
  )


def carry_ledger(path: str, entry: dict) -> list[dict]:
  """The ledger of the results file at `path` (read before it is
  overwritten) with `entry` appended. A file from before the ledger existed
  contributes its own run as the first entry. The last entry is replaced
  instead when it is the same run (same kind, commit, seeds and spec hash:
  a re-run that resumed finished workdirs; the arms' config hashes too,
  where both entries record them)."""
  ledger: list[dict] = []
  if os.path.exists(path):
    try:
      with open(path) as f:
        prev = json.load(f)
    except ValueError:
      prev = {}
    ledger = list(prev.get("ledger") or [])
    if not ledger and _is_decision(prev):
      ledger = [ledger_entry(prev)]
  same = ("kind", "commit", "seeds", "spec_hash", "rules")
  if (
      ledger
      and all(ledger[-1].get(k) == entry.get(k) for k in same)
      and (
          ledger[-1].get("config_hash") is None
          or entry.get("config_hash") is None
          or ledger[-1]["config_hash"] == entry["config_hash"]
      )
  ):
    ledger[-1] = entry
  else:
    ledger.append(entry)
  return ledger


def ledger_from_git(path: str, repo: str = REPO) -> list[dict]:
  """The decision runs recorded in every committed version of a results file.

  Walks `git log -- path` oldest first and keeps each version holding a
  decided analysis (a verdict of stats.VERDICTS, 2 or more seeds, not a room
  check) of a run not seen before (run commit, seeds and spec hash). A
  version written before the harness recorded the run's date carries the
  date of the commit that recorded it ('date_of': 'recording commit').

  Args:
    path: the results file, absolute or relative to `repo`.
    repo: the git checkout.

  Returns:
    Ledger entries (ledger_entry's dicts plus 'recorded_in', the commit that
    added the version); [] without git or history.
  """
  rel = os.path.relpath(os.path.abspath(path), repo)
  try:
    log = subprocess.run(
        ["git", "log", "--reverse", "--format=%H %as", "--", rel],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split("\n")
  except (OSError, subprocess.SubprocessError):
    return []
  ledger, seen = [], set()
  for line in log:
    if not line.strip():
      continue
    sha, date = line.split()
    try:
      text = subprocess.run(
          ["git", "show", f"{sha}:{rel}"],
          cwd=repo,
          capture_output=True,
          text=True,
          timeout=60,
          check=True,
      ).stdout
      d = json.loads(text)
    except (OSError, subprocess.SubprocessError, ValueError):
      continue
    if not isinstance(d, dict) or not _is_decision(d):
      continue
    entry = ledger_entry(d)
    key = (entry["commit"], tuple(entry["seeds"]), entry["spec_hash"])
    if key in seen:
      continue
    seen.add(key)
    if not entry["date"]:
      entry["date"], entry["date_of"] = date, "recording commit"
    entry["recorded_in"] = sha[:12]
    ledger.append(entry)
  return ledger


# results.md: the re-decision section starts at this line.
REDECIDED_MARKER = (
    "<!-- re-decided: python -m experiments.summary --redecide -->"
)


def redecide(
    path: str,
    spec: stats.ClaimSpec,
    *,
    rows: Mapping | None = None,
    note: str = "",
    repo: str = REPO,
) -> dict:
  """Re-decides a recorded decision run under the current rules and spec.

  Nothing is trained: the analysis is recomputed from the recorded per-seed
  rows and per-seed room values (stats.analyse), the recorded analysis and
  spec are kept as 'analysis_as_recorded' / 'spec_as_recorded' (the first
  time), and the ledger (from git history, `ledger_from_git`, when the file
  has none) gets a 're-decision' entry pointing at the run whose data it
  re-uses ('data_of', 1-based). Repeating it replaces that entry. The
  results.md beside the file gets the new verdict after REDECIDED_MARKER.

  Args:
    path: a results.json written by run_claim (or a runner like it).
    spec: the claim's declared ClaimSpec now.
    rows: arm -> per-seed rows (default: the file's 'rows').
    note: why the claim was re-decided (stored in the entry).
    repo: the git checkout (for the ledger).

  Returns:
    The rewritten results dict.

  Raises:
    ValueError: the file holds no decided run.
  """
  with open(path) as f:
    res = json.load(f)
  if not _is_decision(res):
    raise ValueError(f"redecide: {path} holds no decision run")
  ledger = list(res.get("ledger") or ledger_from_git(path, repo))
  if not ledger:
    ledger = [ledger_entry(res)]
  runs = [i for i, e in enumerate(ledger) if e["kind"] == "decision run"]
  analysis = stats.analyse(
      spec,
      res["rows"] if rows is None else rows,
      (res.get("room") or {}).get("per_seed"),
  )
  res.setdefault("analysis_as_recorded", res.get("analysis"))
  res.setdefault("spec_as_recorded", res.get("spec"))
  res["analysis"] = analysis
  res["spec"] = spec.to_json()
  entry = ledger_entry(
      res,
      kind="re-decision",
      date=_today(),
      data_of=runs[-1] + 1 if runs else None,
      note=note,
  )
  if ledger[-1]["kind"] == "re-decision":
    ledger[-1] = entry
  else:
    ledger.append(entry)
  res["ledger"] = ledger
  write_strict_json(path, res)
  md = os.path.splitext(path)[0] + ".md"
  if os.path.exists(md):
    with open(md) as f:
      text = f.read().split(REDECIDED_MARKER)[0].rstrip("\n")
    text += (
        f"\n\n{REDECIDED_MARKER}\n\n## Verdict re-decided on {entry['date']} "
        f"(rules {stats.RULES}, spec {entry['spec_hash']}; nothing re-run)\n\n"
        + (f"{note}\n\n" if note else "")
        + stats.format_analysis(analysis)
        + "\n"
    )
    with open(md, "w") as f:
      f.write(text)
  return res


def default_num_groups(config) -> int:
  """sample_groups' default number of groups: config.eval.num_tasks // 4 (64
  at the claims' full size), at least 1."""
  return max(config.eval.num_tasks // 4, 1)


def sample_groups(
    config: ml_collections.ConfigDict,
    params,
    *,
    num_groups: int | None = None,
    group_size: int | None = None,
    seed: int = 0,
    temperature: float = 1.0,
) -> dict[str, np.ndarray]:
  """Samples GRPO-style groups from a policy, as its first RL iteration would.

  Tasks come from the training distribution (`env.sample_tasks` with a fixed
  key), each repeated `group_size` times; episodes are sampled at `temperature`.

  Args:
    config: the experiment config.
    params: one seed's policy parameters.
    num_groups: default config.eval.num_tasks // 4 (64 at the claims' full
      size).
    group_size: default config.rl.group_size.
    seed: PRNG seed of tasks and sampling.
    temperature: sampling temperature (the RL default is 1).

  Returns:
    The environment's per-episode facts (e.g. 'correct', 'num_tool_calls',
    'hard') as float64 arrays of shape [num_groups, group_size].
  """
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from agentic_rl import rollout  # pylint: disable=g-import-not-at-top
  from agentic_rl import train  # pylint: disable=g-import-not-at-top

  g = int(group_size or config.rl.group_size)
  n = int(num_groups or default_num_groups(config))
  env = train.make_env(config)
  model_cfg = train.make_model_config(config)
  graphdef = train.init_state(config, model_cfg)[0]
  task_key, sample_key = jax.random.split(jax.random.PRNGKey(seed))
  tasks = jax.tree.map(
      lambda x: jnp.repeat(x, g, axis=0), env.sample_tasks(task_key, n)
  )
  traj = rollout.rollout_jit(
      env,
      tasks,
      sample_key,
      max_len=config.max_len,
      group=jnp.repeat(jnp.arange(n, dtype=jnp.int32), g),
      graphdef=graphdef,
      params=params,
      model_config=model_cfg,
      temperature=jnp.float32(temperature),
  )
  facts = jax.device_get(traj.facts)
  out = {
      k: np.asarray(v, np.float64).reshape(n, g)
      for k, v in facts.items()
      if np.ndim(v) == 1
  }
  from agentic_rl import types  # pylint: disable=g-import-not-at-top

  out["policy_tokens"] = (
      np.sum(np.asarray(traj.role) == types.POLICY, axis=1)
      .astype(np.float64)
      .reshape(n, g)
  )
  return out


def room_correct_zero_call_groups(config, params) -> float:
  """Share of sampled groups holding at least one correct episode without a tool
  call: only there can an efficiency signal (OTC, HDPO) prefer not calling at
  equal correctness. In [0, 1]."""
  f = sample_groups(config, params)
  return float(
      np.any((f["correct"] > 0) & (f["num_tool_calls"] == 0), axis=1).mean()
  )


def room_direct_easy_accuracy(
    config, params, num_groups: int | None = None
) -> float:
  """Accuracy of the start policy's sampled (T = 1) easy-item episodes (the
  'hard' fact 0) that make no tool call: whether not calling is a real
  option. An episode without a call that never gives a well-formed answer
  counts as a wrong direct answer. When direct answers are mostly wrong,
  every reward that pays for correctness prefers the call, and an efficiency
  term cannot change that without paying for wrong answers. 0 when every
  easy episode calls the tool. In [0, 1]. `num_groups` as sample_groups."""
  f = sample_groups(config, params, num_groups=num_groups)
  direct = (f["hard"] == 0) & (f["num_tool_calls"] == 0)
  if not direct.any():
    return 0.0
  return float(f["correct"][direct].mean())


def room_direct_easy_accuracy_8x(config, params) -> float:
  """room_direct_easy_accuracy over 8 times sample_groups' default number of
  groups (512 groups of 8 = 4096 episodes at the claims' full size). A start
  that calls the tool on nearly every easy item leaves few direct episodes
  in the default 64 groups, so the estimate of one seed rests on a handful of
  episodes (otc_efficiency / hdpo_conditional, spec v4). In [0, 1]."""
  return room_direct_easy_accuracy(
      config, params, num_groups=8 * default_num_groups(config)
  )


def room_mixed_groups(config, params) -> float:
  """Share of sampled groups whose episodes differ in correctness: the only
  groups where a group-relative advantage (GRPO) is non-zero, i.e. where
  learning from the outcome reward can start. In [0, 1]."""
  return 1.0 - room_tied_groups(config, params)


def room_mixed_hard_groups(config, params) -> float:
  """Share of the sampled hard-item groups (the 'hard' fact; each group
  repeats one task) whose episodes differ in correctness: the groups where
  GRPO can learn what the start does not yet do reliably (call the tool on a
  hard item). 0 without hard groups. In [0, 1]."""
  f = sample_groups(config, params)
  c, hard = f["correct"], f["hard"][:, 0] > 0
  if not hard.any():
    return 0.0
  mixed = ~np.all(c == c[:, :1], axis=1)
  return float(mixed[hard].mean())


def room_tied_groups(config, params) -> float:
  """Share of sampled groups whose episodes all tie on correctness (all right
  or all wrong): GRPO's advantage is zero there, and only there can reward
  dithering add a gradient. In [0, 1]."""
  c = sample_groups(config, params)["correct"]
  return float(np.all(c == c[:, :1], axis=1).mean())


def room_all_fail_groups(config, params) -> float:
  """Share of sampled groups in which every episode fails: there the outcome
  reward is constant, so a z-scored GRPO advantage is driven by a dense shaping
  term alone (the dark-room mechanism). In [0, 1]."""
  c = sample_groups(config, params)["correct"]
  return float(np.all(c == 0, axis=1).mean())


def room_headroom(config, params) -> float:
  """1 - the start policy's sampled (T = 1) accuracy on training tasks: how far
  an arm can rise above the start before the ceiling hides differences in
  learning speed. In [0, 1]."""
  return 1.0 - float(sample_groups(config, params)["correct"].mean())


def room_start_accuracy(config, params) -> float:
  """The start policy's sampled (T = 1) accuracy on training tasks: how much a
  reward hack can destroy. In [0, 1]."""
  return float(sample_groups(config, params)["correct"].mean())


def room_start_greedy_accuracy(config, params) -> float:
  """The start policy's greedy (T = 0) accuracy on 128 training tasks, the
  decoding of the held-out `accuracy`: how much a reward hack can destroy.
  In [0, 1]."""
  c = sample_groups(
      config, params, num_groups=128, group_size=1, temperature=0.0
  )["correct"]
  return float(c.mean())


def room_greedy_headroom(config, params) -> float:
  """1 - the start policy's greedy (T = 0) accuracy on 128 training tasks
  (`room_start_greedy_accuracy`): how far the held-out greedy accuracy can
  rise above the start. In [0, 1]."""
  return 1.0 - room_start_greedy_accuracy(config, params)


def room_length_spread(config, params) -> float:
  """Mean over sampled groups of the standard deviation of the POLICY-token
  count of the group's episodes (tokens): a loss aggregation can favour long or
  short responses only when a group's responses differ in length. >= 0."""
  n = sample_groups(config, params)["policy_tokens"]
  return float(n.std(axis=1).mean())


def room_violation_rate(config, params) -> float:
  """Share of the start policy's sampled constrained episodes that call the
  forbidden tool: a constraint factor (ToolRLA) can only act where the start
  violates. In [0, 1]; 0 without constrained episodes."""
  f = sample_groups(config, params)
  constrained = f["has_constraint"] > 0
  if not constrained.any():
    return 0.0
  return float((f["num_forbidden_calls"][constrained] > 0).mean())


def _with_curve_means(
    rows: Sequence[Mapping], curves: Mapping, curve_means: Sequence[tuple]
) -> list[dict]:
  """Per-seed rows with each declared curve mean added.

  Args:
    rows: one metrics dict per seed, [n].
    curves: curve key -> [steps, n] array (NaN where a step logged nothing).
    curve_means: (new key, curve key, first, last): the new key's value for
      seed i is the mean of curves[curve key][first:last, i] (numpy slice
      rules; NaN when the curve is missing or the slice empty).

  Returns:
    New row dicts; a key already in a row is recomputed, not kept.
  """
  rows = [dict(r) for r in rows]
  for new_key, curve_key, first, last in curve_means:
    c = np.asarray(
        curves.get(curve_key, np.full((1, len(rows)), np.nan)), np.float64
    )
    sl = c[first:last]
    per_seed = sl.mean(0) if sl.shape[0] else np.full((len(rows),), np.nan)
    for r, v in zip(rows, per_seed):
      r[new_key] = float(v)
  return rows


def run_claim(
    title: str,
    arms: Mapping[str, ml_collections.ConfigDict],
    seeds: Sequence[int],
    *,
    root: str,
    out_dir: str,
    metrics: Sequence[tuple[str, str]],
    curve_keys: Sequence[str] = ("rl/accuracy", "rl/tool_calls"),
    extra_eval: Callable | None = None,
    include_sft_row: bool = True,
    curve_means: Sequence[tuple[str, str, int, int]] = (),
    spec: stats.ClaimSpec | None = None,
    stem: str = "results",
    stop_without_room: bool = False,
    room_only: bool = False,
    command: str | None = None,
    seeds_per_call: int | None = None,
) -> dict:
  """Trains every arm for every seed and writes the claim's table and plot.

  Args:
    title: heading of results.md.
    arms: arm label -> experiment config (its `seed` is ignored).
    seeds: seeds, shared by every arm.
    root: parent of the workdirs (resumable).
    out_dir: where results.md / .json / .png go.
    metrics: (key, column label) of held-out metrics (train.evaluate keys, or
      keys added by `extra_eval`).
    curve_keys: per-step training metrics plotted over RL iterations.
    extra_eval: optional fn(config, params_of_one_seed) -> dict of extra held-out
      metrics, run on the final policy of every seed (and of the SFT start).
    include_sft_row: add the shared SFT start as the first row.
    curve_means: (new metric key, curve key, first, last) adds to each arm's
      per-seed row the mean of a training curve over RL iterations
      [first, last) (e.g. early-learning speed); list the key in `metrics`.
    spec: the claim's declared ClaimSpec (None: no verdict). Its arms are arm
      labels or 'SFT (start)'; its room metric is computed on the SFT start of
      the control arm (of the treatment when the control is the start), as the
      mean over seeds.
    stem: output file names (stem.md / .json / .png).
    stop_without_room: with a spec whose room metric is below its threshold,
      skip the RL arms (their rows are absent; the verdict is 'untestable at
      this setup'), which saves the RL compute of a claim that cannot decide.
    room_only: train the start policy and compute the room metric, then stop
      (no RL arms, whatever the room): a cheap look at whether a setup can
      decide the claim. The verdict is 'untestable at this setup' when the
      room is below the threshold, else 'not run (room check only)'.
    command: the command line that produced the run (stored in results.json).
    seeds_per_call: None trains all seeds of an arm as one vmapped program;
      k trains them k at a time, one chunk after the other (each chunk its
      own SFT and arm workdirs, ROOT/NAME_s<seeds>), for models whose seeds
      do not fit one program (a pretrained checkpoint: 1). A chunk's start,
      room value, arms and evaluations are complete and on disk before the
      next chunk starts, so an interrupted run resumes from the chunks
      already recorded (their workdirs, `seed_<s>/eval_report.json` and
      `room_<...>.json`, are read back, not recomputed); after each chunk the
      per-seed rows so far are written to ROOT/progress.json.

  Returns:
    {'rows': {row label: [per-seed metric dicts]}, 'curves': {arm: {key:
    [steps, S]}}, 'wall_s': {arm: seconds, every process's time on the arm's
    workdir}, 'room': {'metric', 'value',
    'per_seed'} or None, 'analysis': stats.analyse's dict or None}.

  Raises:
    ValueError: a spec whose arms are not among `arms`.
  """
  commit = git_commit()  # the code that runs, not what HEAD is when it ends
  t_start = time.time()
  labels = set(arms) | ({"SFT (start)"} if include_sft_row else set())
  if spec is not None and not {spec.treatment, spec.control} <= labels:
    raise ValueError(
        f"run_claim: spec arms {spec.treatment!r} / {spec.control!r} "
        f"must be among the row labels {sorted(labels)}"
    )
  room = None
  os.makedirs(root, exist_ok=True)
  rows: dict[str, list[dict]] = {}
  curves: dict[str, dict] = {}
  walls: dict[str, float] = {}
  earlier_s: list[float] = []  # workdirs' training seconds, earlier calls
  wall_complete: list[bool] = []
  room_per_seed: list[float] = []
  # seed -> start_digest where the start trained again here did not
  # reproduce its record (results.json's `restarted_seeds`).
  variant_seeds: dict[int, str] = {}
  room_s = 0.0
  room_arm = None
  if spec is not None and spec.room_fn is not None:
    # The room check comes first, from the start policy of the control arm (of
    # the treatment when the control is the SFT start), before any RL.
    room_arm = spec.control if spec.control in arms else spec.treatment
  if room_only and room_arm is None:
    raise ValueError("run_claim: room_only needs a spec with a room_fn")
  k = len(seeds) if seeds_per_call is None else int(seeds_per_call)
  if k < 1:
    raise ValueError(f"run_claim: seeds_per_call={seeds_per_call} must be >= 1")
  chunks = [list(seeds[i : i + k]) for i in range(0, len(seeds), k)]
  skip_rl = room_only

  def _wall_of(out):
    # The training time behind the workdir (seeds.train_seeds' wall.json: this
    # call plus the earlier calls that trained it, e.g. an interrupted run
    # resumed here, or another claim's run that shares the workdir), not only
    # this process's: a resumed run would otherwise report its last leg.
    earlier_s.append(out["wall_total_s"] - out["wall_call_s"])
    wall_complete.append(out["wall_complete"])
    return out["wall_total_s"]

  def _add_wall(name, out):
    walls[name] = walls.get(name, 0.0) + _wall_of(out)

  # Sequential seeds keep a record of every finished start and arm in the
  # claim folder (committed with the results), so that a run continues on
  # another machine from the seeds already recorded.
  rec_dir = (
      None if seeds_per_call is None else os.path.join(out_dir, RECORD_DIR)
  )

  def _add_recorded_wall(name, rec):
    walls[name] = walls.get(name, 0.0) + rec["wall_s"]
    earlier_s.append(rec["wall_s"])
    wall_complete.append(bool(rec.get("wall_complete", True)))

  for chunk in chunks:
    tag = seeds_tag(chunk)
    sft_dirs: dict[str, str] = {}
    sft_outs: dict[str, dict | None] = {}
    chunk_rows: dict[str, list[dict]] = {}
    # SFT key -> start_digest of a start trained again here that does not
    # reproduce its record (another machine's compiler rounds differently):
    # the arms recorded from the old start cannot pair with arms trained from
    # this one, so every arm of the chunk trains again from it, under records
    # and workdirs named by the digest; the old records stay as they are.
    variants: dict[str, str] = {}

    def suffix(config, variants=variants):
      key = _sft_key(config)
      return f"_start{variants[key]}" if key in variants else ""

    def start_name(config, tag=tag):
      return f"sft_{_sft_key(config)}_{tag}{suffix(config)}"

    def start_record(config, chunk=chunk):
      if rec_dir is None:
        return None
      return read_record(
          rec_dir, start_name(config), _start_match(config, chunk)
      )

    def arm_record(arm, config, chunk=chunk, tag=tag):
      if rec_dir is None:
        return None
      match = {"arm": arm, "seeds": list(chunk), **_arm_match(config)}
      if suffix(config):
        match["start_digest"] = variants[_sft_key(config)]
      return read_record(
          rec_dir, _arm_record_name(arm, tag, config) + suffix(config), match
      )

    def sft(
        config,
        trained=True,
        chunk=chunk,
        tag=tag,
        sft_dirs=sft_dirs,
        sft_outs=sft_outs,
        chunk_rows=chunk_rows,
    ):
      """(key, train_seeds' output or None): the start of `config`'s arms,
      trained (or resumed) when `trained`, else its row read from the
      record when there is one."""
      key = _sft_key(config)
      if key in sft_dirs or (key in sft_outs and not trained):
        return key, sft_outs.get(key)
      rec = start_record(config)
      if not trained and rec is not None:
        if include_sft_row and "SFT (start)" not in chunk_rows:
          chunk_rows["SFT (start)"] = rec["rows"]
        _add_recorded_wall(f"sft_{key}", rec)
        sft_outs[key] = None
        return key, None
      sft_dir = run_dir(root, f"sft_{key}", chunk)
      c = ml_collections.ConfigDict(config.to_dict())
      c.rl.steps = 0
      # Arms that share this SFT run differ in their RL settings: only the
      # other sections must match the SFT workdir's config.json.
      out = seeds_lib.train_seeds(c, chunk, sft_dir, resume_free=("rl",))
      if key not in sft_outs:  # a recorded start's time is counted once
        _add_wall(f"sft_{key}", out)
      sft_dirs[key] = sft_dir
      sft_outs[key] = out
      row = _with_extra(out, "sft", extra_eval, config, chunk)
      if rec is not None:
        # The arms recorded from this start pair with arms trained now only
        # if the start trained again is the recorded one.
        diffs = start_differences(rec, row, chunk)
        if diffs:
          variants[key] = start_digest(row)
          print(
              f"seeds {chunk}: the SFT start trained again differs from its "
              f"record (commit {rec.get('commit')}): "
              + "; ".join(diffs[:4])
              + f". Every arm of these seeds trains again from this start "
              f"(records and workdirs *_start{variants[key]}); the old "
              "records stay as they are",
              flush=True,
          )
          variant_seeds.update({int(s): variants[key] for s in chunk})
          rec = start_record(config)
      if include_sft_row and "SFT (start)" not in chunk_rows:
        chunk_rows["SFT (start)"] = row
      if rec_dir is not None and rec is None:
        # Written once, by the process that trained the start: a later
        # process that only reloads it keeps the record's commit and time.
        write_record(
            rec_dir,
            start_name(config),
            {
                **_start_match(config, chunk),
                "kind": "start",
                **({"start_digest": variants[key]} if key in variants else {}),
                "rows": row,
                "room": {},
                "wall_s": out["wall_total_s"],
                "wall_complete": out["wall_complete"],
                "commit": commit,
            },
        )
      return key, out

    if rec_dir is not None and not room_only:
      # A recorded start that an arm without a record needs is trained
      # again first, before any record is read as this chunk's: if it does
      # not reproduce its record, every arm of the chunk trains from it
      # (`variants`), the recorded ones included. Not when the recorded room
      # already stops the run.
      for arm, config in arms.items():
        rec = start_record(config)
        if rec is None or arm_record(arm, config) is not None:
          continue
        recorded_room = (
            _recorded_room(rec, spec) if room_arm is not None else None
        )
        if (
            stop_without_room
            and recorded_room is not None
            and not stats.room_record(spec, recorded_room)["ok"]
        ):
          continue
        sft(config)
    if room_arm is not None:
      config = arms[room_arm]
      rec = start_record(config) if rec_dir is not None else None
      t0 = time.time()
      recorded = _recorded_room(rec, spec) if rec is not None else None
      if recorded is not None:
        sft(config, trained=False)
        per_seed = [float(v) for v in recorded]
      else:
        key, out = sft(config)
        per_seed = _room_values(spec, config, out, chunk, sft_dirs[key])
        if rec_dir is not None:
          rec = start_record(config)
          rec["room"][_room_key(spec)] = per_seed
          write_record(rec_dir, start_name(config), rec)
      room_s += time.time() - t0
      room_per_seed += per_seed
      checked = stats.room_record(spec, per_seed)
      print(
          f"room check ({spec.room_metric}, start policy of {room_arm}), "
          f"seeds {chunk}: {[round(v, 3) for v in per_seed]} (threshold "
          f"{spec.room_threshold}, every seed): "
          + (
              "room"
              if checked["ok"]
              else f"NO room at seeds {[chunk[i] for i in checked['failing']]}"
              ": untestable at this setup"
          ),
          flush=True,
      )
      if stop_without_room and not checked["ok"]:
        skip_rl = True  # no RL arm from here on
    chunk_curves: dict[str, dict] = {}
    for arm, config in arms.items():
      if skip_rl:
        if include_sft_row and "SFT (start)" not in chunk_rows:
          sft(config, trained=False)  # the start row of every seed
        continue  # no RL arm, so no other SFT start is needed either
      rec = arm_record(arm, config)
      if rec is not None:
        if include_sft_row and "SFT (start)" not in chunk_rows:
          sft(config, trained=False)
        chunk_rows[arm] = rec["rows"]
        chunk_curves[arm] = {
            k: np.array(
                [[np.nan if x is None else x for x in row] for row in v],
                np.float64,
            )
            for k, v in rec["curves"].items()
        }
        # A claim that reads another claim's record may declare curve means
        # that record's rows lack: computed here from its stored curves, by
        # the same rule as for a fresh run.
        chunk_rows[arm] = _with_curve_means(
            chunk_rows[arm], chunk_curves[arm], curve_means
        )
        _add_recorded_wall(arm, rec)
        continue
      key = sft(config)[0]
      arm_dir = run_dir(root, arm, chunk) + suffix(config)
      try:
        seeds_lib.check_resume(config, chunk, arm_dir)
      except validation.ConfigError:
        # The workdir holds this arm under another setup (an earlier version
        # of the claim): kept as it is, and this config trains beside it.
        arm_dir = f"{arm_dir}_{experiment_seeds.config_hash(config)[:8]}"
      if not os.path.exists(arm_dir):
        # The arm's own config.json is written by train_seeds (not the SFT
        # run's).
        shutil.copytree(
            sft_dirs[key],
            arm_dir,
            ignore=shutil.ignore_patterns(
                "seed_*", "config.json", "wall.json", "room_*.json"
            ),
        )
        # The copied SFT checkpoints' time is the SFT workdir's: the arm's
        # own log starts empty (a copied checkpoint without a log would
        # otherwise mark the arm's time as incomplete).
        with open(os.path.join(arm_dir, "wall.json"), "w") as f:
          json.dump({"calls": []}, f)
      out = seeds_lib.train_seeds(config, chunk, arm_dir)
      _add_wall(arm, out)
      chunk_rows[arm] = _with_extra(out, "rl", extra_eval, config, chunk)
      chunk_rows[arm] = _with_curve_means(
          chunk_rows[arm], out["curves"], curve_means
      )
      chunk_curves[arm] = out["curves"]
      if rec_dir is not None:
        write_record(
            rec_dir,
            _arm_record_name(arm, tag, config) + suffix(config),
            {
                "arm": arm,
                "seeds": list(chunk),
                **_arm_match(config),
                **({"start_digest": variants[key]} if key in variants else {}),
                "kind": "arm",
                "rows": chunk_rows[arm],
                "curves": {
                    k: np.asarray(v, np.float64).tolist()
                    for k, v in out["curves"].items()
                    if k.startswith("rl/")
                },
                "wall_s": out["wall_total_s"],
                "wall_complete": out["wall_complete"],
                "commit": commit,
            },
        )
    for label, reports in chunk_rows.items():
      rows.setdefault(label, []).extend(reports)
    for arm, arm_curves in chunk_curves.items():
      merged = curves.setdefault(arm, {})
      for name, c in arm_curves.items():
        merged[name] = (
            np.asarray(c)
            if name not in merged
            else _concat_seed_axis(merged[name], np.asarray(c))
        )
    if len(chunks) > 1:
      write_strict_json(
          os.path.join(root, "progress.json"),
          {
              "seeds_done": list(seeds[: len(next(iter(rows.values())))])
              if rows
              else [],
              "rows": rows,
              "room_per_seed": room_per_seed,
          },
      )
    if skip_rl and not room_only and len(chunks) > 1:
      # A seed without room makes the claim untestable at this setup: the
      # later seeds' starts would cost their SFT runs and change nothing.
      seeds = [s for c in chunks[: chunks.index(chunk) + 1] for s in c]
      print(f"no room: stopping after seeds {seeds}", flush=True)
      # The RL arms of the earlier seeds (trained before the seed without
      # room) stay in their records; the table and the verdict show the
      # run as it stopped: starts and room only, as a vmapped run shows it.
      partial = [a for a in arms if a in rows]
      for arm in partial:
        rows.pop(arm)
        curves.pop(arm, None)
      if partial:
        print(
            f"RL arms {partial} of the earlier seeds are left out of the "
            f"table (kept in {rec_dir})",
            flush=True,
        )
      break
  if room_arm is not None:
    room = {
        "metric": spec.room_metric,
        "value": float(np.mean(room_per_seed)),
        "per_seed": room_per_seed,
        "threshold": spec.room_threshold,
        "arm": room_arm,
        "wall_s": room_s,
    }
    # Every seed's start must leave room (stats.room_record).
    checked = stats.room_record(spec, room_per_seed)
    room["ok"], room["failing"] = checked["ok"], checked["failing"]
    print(
        f"room check ({spec.room_metric}, start policy of {room_arm}): "
        f"{room['value']:.3f} (per seed {[round(v, 3) for v in room_per_seed]}"
        f"; threshold {spec.room_threshold}, every seed): "
        + (
            "room"
            if room["ok"]
            else f"NO room at seeds {[seeds[i] for i in room['failing']]}: "
            "untestable at this setup"
        ),
        flush=True,
    )
  analysis = None
  if spec is not None and room_only and room["ok"]:
    analysis = stats.room_only_analysis(spec, room["per_seed"])
  elif spec is not None:
    # No room check (no room_fn): no per-seed room values, so no room.
    analysis = stats.analyse(
        spec, rows, None if room is None else room["per_seed"]
    )
  meta = {
      "commit": commit,
      "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t_start)),
      "seeds": list(seeds),
      "config_hash": {
          arm: experiment_seeds.config_hash(c) for arm, c in arms.items()
      },
      "room": room,
      "analysis": analysis,
      "spec": None if spec is None else spec.to_json(),
      "rl_skipped": bool(skip_rl),
      "room_only": bool(room_only),
      # This process plus the earlier processes that trained these
      # workdirs (interrupted runs resumed here).
      "wall_total_s": time.time() - t_start + sum(earlier_s),
      # False when a workdir's earlier training time is unknown (trained
      # before wall.json existed): wall_total_s is then a lower bound.
      "wall_all_processes": all(wall_complete),
      "command": command,
      "seeds_per_call": seeds_per_call,
      "restarted_seeds": {str(s): d for s, d in sorted(variant_seeds.items())},
  }
  if spec is not None and not room_only:
    meta["ledger"] = carry_ledger(
        os.path.join(out_dir, f"{stem}.json"), ledger_entry(meta)
    )
  _write(
      title,
      rows,
      curves,
      seeds,
      out_dir,
      metrics,
      curve_keys,
      walls,
      meta,
      stem,
  )
  return {
      "rows": rows,
      "curves": curves,
      "wall_s": walls,
      "room": room,
      "analysis": analysis,
  }


# Folder (in a claim's out_dir) of the per-seed records of a sequential run.
RECORD_DIR = "seed_records"


def _safe_name(name: str) -> str:
  return re.sub(r"[^\w.-]", "_", name)


def _room_fn_name(spec) -> str:
  """The room function's name (file-name safe)."""
  return _safe_name(getattr(spec.room_fn, "__name__", "fn"))


def _room_key(spec) -> str:
  """Key of a claim's room values in an SFT workdir (room_<key>.json) and in
  the per-seed start records: the room function's name and 8 hex digits of
  the SHA-1 of the declared room metric's text, so that a room metric whose
  description changes (e.g. sampled on more groups) is computed anew, not
  read back under an unchanged function name."""
  digest = hashlib.sha1(spec.room_metric.encode()).hexdigest()[:8]
  return f"{_room_fn_name(spec)}_{digest}"


def _recorded_room(rec, spec):
  """A start record's room values for `spec` (None when absent): under
  _room_key, or under the function's name alone in records written before
  2026-12-06 (the committed smollm2_calc seed records)."""
  room = (rec or {}).get("room", {})
  if _room_key(spec) in room:
    return room[_room_key(spec)]
  return room.get(_room_fn_name(spec))


def _start_match(config, seeds) -> dict:
  """Fields a start record must match: what its SFT run and evaluation
  depend on (the SFT key's sections and the held-out set)."""
  return {
      "sft_key": _sft_key(config),
      "eval_hash": experiment_seeds.config_hash(
          ml_collections.ConfigDict({"eval": config.eval.to_dict()})
      ),
      "seeds": list(seeds),
  }


def _arm_record_name(arm: str, tag: str, config) -> str:
  """File stem of an arm's record: arm, seeds and config hash, so records of
  a changed setup (a new version of the claim) sit beside the old ones."""
  return f"{_safe_name(arm)}_{tag}_{experiment_seeds.config_hash(config)[:8]}"


def _arm_match(config) -> dict:
  return {"config_hash": experiment_seeds.config_hash(config)}


def read_record(rec_dir: str | None, name: str, match: Mapping) -> dict | None:
  """The record `rec_dir/name.json` if it exists and holds every (key, value)
  of `match`, else None (absent, unreadable, or of another config: then the
  seed is trained again and the record rewritten)."""
  if rec_dir is None:
    return None
  path = os.path.join(rec_dir, f"{name}.json")
  try:
    with open(path) as f:
      rec = json.load(f)
  except (OSError, ValueError):
    return None
  if any(rec.get(k) != v for k, v in match.items()):
    return None
  # write_strict_json stored NaN as null.
  rows = [
      {k: float("nan") if v is None else v for k, v in r.items()}
      for r in rec.get("rows", [])
  ]
  return dict(rec, rows=rows)


def start_differences(
    rec: Mapping, rows: Sequence[Mapping], seeds: Sequence[int]
) -> list[str]:
  """How a start trained again evaluates differently from its record.

  Args:
    rec: the start record (`read_record`: NaN restored in its rows).
    rows: the evaluation rows of the start just trained, one per seed.
    seeds: the seeds of `rows`, for the messages.

  Returns:
    One line per differing field ('seed 5 acc: recorded 0.25, now 0.3'),
    every field of the recorded rows compared exactly (NaN equal to NaN);
    [] when the start reproduces its record.
  """

  def same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
      return a == b or (math.isnan(a) and math.isnan(b))
    return a == b

  recorded = rec.get("rows", [])
  diffs = []
  if len(recorded) != len(rows):
    diffs.append(f"{len(recorded)} recorded rows, {len(rows)} now")
  for seed, old, new in zip(seeds, recorded, rows):
    for k, v in old.items():
      if k not in new or not same(v, new[k]):
        diffs.append(f"seed {seed} {k}: recorded {v}, now {new.get(k)}")
  return diffs


def start_digest(rows: Sequence[Mapping]) -> str:
  """8 hex digits naming a start by its evaluation rows (the records and
  workdirs of arms trained from a start that did not reproduce its record:
  `run_claim`)."""
  blob = json.dumps(
      [dict(sorted(r.items())) for r in rows], sort_keys=True, default=repr
  )
  return hashlib.sha256(blob.encode()).hexdigest()[:8]


def write_record(rec_dir: str, name: str, rec: Mapping) -> None:
  """Writes a per-seed record (strict JSON; replaced atomically)."""
  os.makedirs(rec_dir, exist_ok=True)
  path = os.path.join(rec_dir, f"{name}.json")
  write_strict_json(path + ".tmp", dict(rec))
  os.replace(path + ".tmp", path)


def _room_values(spec, config, out, seeds, sft_dir) -> list[float]:
  """Per-seed room values of the start policies in `out` (train_seeds' output
  of the SFT workdir `sft_dir`), read from `sft_dir/room_<fn>.json` when an
  earlier call recorded them for these seeds, else computed and recorded."""
  path = os.path.join(sft_dir, f"room_{_room_key(spec)}.json")
  stored: dict = {}
  if os.path.exists(path):
    try:
      with open(path) as f:
        stored = json.load(f)
    except ValueError:  # unreadable: computed again
      stored = {}
  if all(str(s) in stored for s in seeds):
    return [float(stored[str(s)]) for s in seeds]
  params = seeds_lib.unstack(out["params"], len(seeds))
  values = [float(spec.room_fn(config, p)) for p in params]
  stored.update({str(s): v for s, v in zip(seeds, values)})
  os.makedirs(sft_dir, exist_ok=True)
  write_strict_json(path, stored)
  return values


def _concat_seed_axis(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """[T1, S1] and [T2, S2] curves -> [max(T1, T2), S1 + S2], NaN-padded."""
  t = max(a.shape[0], b.shape[0])
  pad = lambda x: np.concatenate(
      [x, np.full((t - x.shape[0],) + x.shape[1:], np.nan)], axis=0
  )
  return np.concatenate(
      [pad(a.astype(np.float64)), pad(b.astype(np.float64))], axis=1
  )


def _with_extra(out, which, extra_eval, config, seeds):
  # With rl.steps = 0 (the shared SFT run) the final params are the SFT policy.
  reports = out[which]
  if extra_eval is None:
    return reports
  params = seeds_lib.unstack(out["params"], len(seeds))
  return [dict(r, **extra_eval(config, p)) for r, p in zip(reports, params)]


def _write(
    title,
    rows,
    curves,
    seeds,
    out_dir,
    metrics,
    curve_keys,
    walls,
    meta,
    stem="results",
):
  os.makedirs(out_dir, exist_ok=True)
  lines = [
      f"# {title}",
      "",
      "| arm | " + " | ".join(lbl for _, lbl in metrics) + " |",
      "|---" * (len(metrics) + 1) + "|",
  ]
  for label, reps in rows.items():
    cells = []
    for k, _ in metrics:
      m, se = mean_se([r.get(k, np.nan) for r in reps])
      cells.append(f"{m:.3f} +- {se:.3f}")
    lines.append(f"| {label} | " + " | ".join(cells) + " |")
  lines += [
      "",
      f"Mean +- standard error over seeds {list(seeds)}. Every seed:",
      "",
  ]
  for label, reps in rows.items():
    per = "; ".join(
        f"{lbl} " + "/".join(f"{r.get(k, np.nan):.3f}" for r in reps)
        for k, lbl in metrics
    )
    lines.append(f"- {label}: {per}")
  if meta.get("room_only"):
    lines += [
        "",
        "The RL arms were not run: only the start policy and its room check "
        "(--room_only).",
    ]
  elif meta.get("rl_skipped"):
    lines += [
        "",
        "The RL arms were not run: the start policy's room metric is "
        "below its threshold (--stop_without_room).",
    ]
  if meta.get("restarted_seeds"):
    lines += [
        "",
        "Seeds whose SFT start, trained again for this run, did not "
        "reproduce its record (another machine's compiler rounds "
        "differently): every arm of these seeds trained again from the new "
        "start (records `*_start<digest>`), so each seed's arms still share "
        "one start: "
        + ", ".join(
            f"seed {s} (start {d})" for s, d in meta["restarted_seeds"].items()
        )
        + ".",
    ]
  if meta.get("analysis") is not None:
    lines += [
        "",
        "## Verdict (declared before the run)",
        "",
        stats.format_analysis(meta["analysis"]),
    ]
  elif meta.get("room") is not None:
    lines += [
        "",
        f"Room metric `{meta['room']['metric']}` of the start policy: "
        f"{meta['room']['value']:.3f}.",
    ]
  lines += [
      "",
      "Wall time (s, "
      + (
          "all seeds vmapped"
          if not meta.get("seeds_per_call")
          else f"{meta['seeds_per_call']} seed(s) at a time, summed over seeds"
      )
      + "; per workdir the training, compilation "
      "and evaluation of this process plus the training of earlier processes "
      "on it): " + ", ".join(f"{k} {v:.0f}" for k, v in walls.items()),
      "",
      f"Commit {meta['commit']}; config hashes "
      + ", ".join(f"{k} {v}" for k, v in meta["config_hash"].items())
      + ".",
      "",
  ]
  with open(os.path.join(out_dir, f"{stem}.md"), "w") as f:
    f.write("\n".join(lines))
  # Strict JSON: a metric with no data (NaN) is written as null.
  write_strict_json(
      os.path.join(out_dir, f"{stem}.json"), dict(meta, rows=rows, wall_s=walls)
  )
  print("\n".join(lines))
  plot_grid(
      title,
      rows,
      curves,
      metrics,
      curve_keys,
      os.path.join(out_dir, f"{stem}.png"),
  )


# Metric names holding a share in [0, 1] (plot axes are capped at 1).
_SHARE_WORDS = (
    "acc",
    "pass@",
    "rate",
    "share",
    "horizon",
    "prob",
    "groups",
    "unanswered",
)


def _base(key: str) -> str:
  return key.split("/", 1)[1] if key.startswith(("rl/", "sft/")) else key


# Curve key (base) -> the start row's key measured the way the curve is
# (sampled at T = 1): a greedy held-out start line under a sampled training
# curve would show a gap that is only the decoding.
_CURVE_START = {"accuracy": "sample_accuracy"}


def plot_grid(
    title: str,
    rows: Mapping[str, Sequence[Mapping[str, float]]],
    curves: Mapping[str, Mapping[str, np.ndarray]],
    metrics: Sequence[tuple[str, str]],
    curve_keys: Sequence[str],
    path: str,
    ncols: int = 4,
) -> list[tuple[float, float]]:
  """Writes the claim's figure: a grid of panels, at most `ncols` per row.

  One bar panel per held-out metric (mean per row label with its 95% t
  interval, every seed as a dot) and one panel per training curve (mean over
  seeds per RL iteration with a 95% t band). Panels of the same metric (a
  held-out key and its 'rl/' / 'sft/' curve) share their y-limits (clipped at 0
  for non-negative metrics and at 1 for shares); the SFT start row's mean, when
  it has the metric, is drawn as a dashed reference line (on a curve panel,
  the start's sampled T = 1 value of `_CURVE_START`, e.g. 'sample_accuracy'
  under 'rl/accuracy'; no line where the start has no sampled value).

  Args:
    title: figure title.
    rows: row label -> per-seed metric dicts ('SFT (start)' = the start level).
    curves: arm -> {curve key: [steps, S] array}.
    metrics: (key, label) of the bar panels.
    curve_keys: keys of the curve panels.
    path: PNG path.
    ncols: panels per row.

  Returns:
    The y-limits of every panel in order (bar panels, then curve panels).
  """
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  panels = [("bar", k, lbl) for k, lbl in metrics] + [
      ("curve", k, k) for k in curve_keys
  ]
  n = len(panels)
  ncols = max(1, min(ncols, n))
  nrows = math.ceil(n / ncols)
  fig, axes = plt.subplots(
      nrows, ncols, figsize=(3.7 * ncols, 3.4 * nrows), squeeze=False
  )
  labels = list(rows)
  colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  start = rows.get("SFT (start)")
  ranges: dict[str, list[float]] = {}
  data: dict[str, list[float]] = (
      {}
  )  # min and max of the plotted values themselves

  def grow(key, lo, hi, vals):
    if np.isfinite(lo) and np.isfinite(hi):
      r = ranges.setdefault(_base(key), [lo, hi])
      r[0], r[1] = min(r[0], lo), max(r[1], hi)
      d = data.setdefault(_base(key), [np.inf, -np.inf])
      d[0], d[1] = min(d[0], float(np.min(vals))), max(
          d[1], float(np.max(vals))
      )

  for ax, (kind, k, lbl) in zip(axes.flat, panels):
    if kind == "bar":
      for j, label in enumerate(labels):
        v = np.asarray([r.get(k, np.nan) for r in rows[label]], np.float64)
        if not np.all(np.isfinite(v)):
          continue
        m, h = float(v.mean()), ci_halfwidth(v)
        ax.bar(
            j, m, yerr=h, color=colors[j % len(colors)], alpha=0.8, capsize=3
        )
        ax.scatter(np.full(len(v), j), v, color="k", s=8, zorder=3)
        grow(k, min(m - h, v.min(), 0.0), max(m + h, v.max()), v)
      ax.set_xticks(
          range(len(labels)), labels, rotation=35, ha="right", fontsize=7
      )
    else:
      for j, arm in enumerate(curves):
        if k not in curves[arm]:
          continue
        c = np.asarray(curves[arm][k], np.float64)
        x = np.arange(1, len(c) + 1)
        m = c.mean(1)
        h = np.array([ci_halfwidth(row) for row in c])
        color = colors[
            (labels.index(arm) if arm in labels else j) % len(colors)
        ]
        ax.plot(x, m, color=color, label=arm)
        ax.fill_between(x, m - h, m + h, color=color, alpha=0.2)
        grow(k, float(np.nanmin(m - h)), float(np.nanmax(m + h)), m)
      ax.set_xlabel("RL iteration", fontsize=8)
      if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=6)
    if start is not None:
      # Training curves are sampled (T = 1) on training tasks: their start
      # line is the start's sampled held-out value where one exists
      # (_CURVE_START), never its greedy one; bar panels use the same key.
      skey = _base(k) if kind == "bar" else _CURVE_START.get(_base(k), None)
      v = np.asarray(
          [r.get(skey, np.nan) if skey else np.nan for r in start],
          np.float64,
      )
      if np.all(np.isfinite(v)):
        ax.axhline(
            float(v.mean()), color="0.3", ls="--", lw=0.9, label="_start"
        )
        grow(k, float(v.mean()), float(v.mean()), v.mean())
    ax.set_title(lbl, fontsize=9)
  limits = []
  for ax, (_, k, _) in zip(axes.flat, panels):
    lo, hi = ranges.get(_base(k), (0.0, 1.0))
    dmin, dmax = data.get(_base(k), (0.0, 1.0))
    # Intervals of few seeds are wide: do not let them push the axis past the
    # metric's natural bounds (non-negative values; shares in [0, 1]).
    if dmin >= 0:
      lo = max(lo, 0.0)
    if dmin >= 0 and dmax <= 1 and any(w in _base(k) for w in _SHARE_WORDS):
      hi = min(hi, 1.0)
    hi = max(hi, lo)
    pad = 0.05 * (hi - lo) if hi > lo else 0.05 * max(abs(hi), 1.0)
    ax.set_ylim(lo - pad, hi + pad)
    limits.append((lo - pad, hi + pad))
  for ax in list(axes.flat)[n:]:
    ax.set_visible(False)
  fig.suptitle(
      title + " (dashed: SFT start; bars and bands: 95% t intervals)",
      fontsize=10,
  )
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return limits


# Folder (under a claim's workdir root) of its runs' persistent XLA
# compilation cache (`enable_compilation_cache`).
XLA_CACHE_DIR = "xla_cache"


def enable_compilation_cache(
    path: str, min_compile_time_secs: float = 0.0
) -> str:
  """Turns on JAX's persistent compilation cache in `path` for this process.

  Every program compiled from here on whose compilation took at least
  `min_compile_time_secs` (0: all, CPU programs included; any size) is
  written to `path`, and a later compilation of the same program (same
  lowered module, compile options, backend and jax version: the cache key)
  loads it instead of compiling, in this process or another one. An entry
  is the compiled program of that same module, so results do not change;
  what is saved is the compile time of the programs every seed, every
  evaluation and every later process (a resumed run, a further claim of the
  same folder) compile again: the jitted steps and rollouts are rebuilt per
  `train_seeds` call. A cache set up earlier in this process at another
  folder is replaced (jax initialises its cache once, at the first
  compilation). Prints one line with the folder.

  The cache key names the backend ('cpu') but not the host CPU's model or
  instruction set: do not carry a cache folder to another machine (delete
  `runs/<claim>/xla_cache` after moving a run's folder), since an entry
  compiled for another CPU could be loaded there.

  Returns:
    The folder's absolute path.
  """
  path = os.path.abspath(path)
  os.makedirs(path, exist_ok=True)
  if jax.config.jax_compilation_cache_dir not in (None, path):
    compilation_cache.reset_cache()
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update(
      "jax_persistent_cache_min_compile_time_secs", min_compile_time_secs
  )
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
  print(f"persistent XLA compilation cache: {path}", flush=True)
  return path


def parse_seeds(text: str) -> list[int]:
  """The seeds of a --seeds value: comma-separated, distinct, >= 0.

  Raises:
    UsageError (a ValueError): a value that is not an integer, no seed, a
      repeated seed (it would pair one run with itself in a verdict), or a
      negative one.
  """
  try:
    seeds = [int(s) for s in text.split(",") if s.strip()]
  except ValueError as e:
    raise UsageError(
        f"--seeds must be comma-separated integers, got {text!r}"
    ) from e
  if not seeds or len(set(seeds)) != len(seeds):
    raise UsageError(
        f"--seeds must name one or more distinct seeds, got {text!r}"
    )
  if min(seeds) < 0:
    raise UsageError(f"--seeds must be >= 0, got {text!r}")
  return seeds


def results_dir(
    smoke: bool, seeds: Sequence[int], root: str, here: str
) -> tuple[str, bool]:
  """Where a claim runner writes its results, and whether it is a decision run.

  A decision run (not --smoke, at least stats.MIN_DECISION_SEEDS seeds: below
  that the sign-flip floor 2 / 2^n is above 0.05, so it cannot decide)
  writes the claim folder's recorded results (`here`) and must start from a
  clean tree. Any other run writes beside its workdirs (`root`), so the
  recorded results and their ledger stay; a run too small to decide says so
  in one line.

  Returns:
    (out_dir, decision).
  """
  if smoke:
    return root, False
  if len(seeds) < stats.MIN_DECISION_SEEDS:
    print(
        f"{len(seeds)} seed(s) cannot decide a claim (fewer than "
        f"{stats.MIN_DECISION_SEEDS}): results written under {root}; the "
        f"recorded results in {here} stay",
        flush=True,
    )
    return root, False
  return here, True


def cli(
    argv: Sequence[str],
    *,
    here: str,
    title: str,
    arms_fn: Callable[[bool], Mapping[str, ml_collections.ConfigDict]],
    default_seeds: str = "0,1,2",
    after_run: Callable[[str, str, Sequence[int], bool], None] | None = None,
    prog: str | None = None,
    compilation_cache: bool = False,
    **run_kwargs,
) -> dict:
  """Command line of a claim folder (`python -m experiments.NAME [--smoke]`).

  Flags: --seeds=0,1,2, --smoke (shrunk arms, 2 seeds, outputs under ROOT so the
  committed results stay untouched), --root=DIR (default runs/<folder name>),
  --arms=a,b (a subset of the arms; the arms of the spec's parts and of its
  positive-control check are always kept),
  --stop_without_room (skip the RL arms when the room check fails),
  --room_only (the start policy and its room check only, written to
  room_check.md / .json / .png, so a recorded run's results.* stay).
  `after_run(root, out_dir, seeds, smoke)`, if given, runs after `run_claim`
  (extra tables of the same workdirs, so one command produces every output).
  `prog` is the module run (default experiments.<folder name>), recorded with
  the flags as results.json's command. With `compilation_cache` (a claim's
  own process: `claim_main`) the run keeps a persistent XLA compilation cache
  in ROOT/xla_cache (--compilation_cache=DIR elsewhere, '' for none;
  `enable_compilation_cache`), shared by the folder's claims and resumed runs;
  without it the run leaves jax's cache setting alone and refuses the flag.

  Without --smoke and with at least stats.MIN_DECISION_SEEDS seeds the run
  is a decision run: it writes the claim folder's results and needs a clean
  git tree (`require_clean_tree`; results files aside). With fewer seeds its
  results go under ROOT (as with --smoke), and the recorded ones stay.

  Raises:
    UsageError (a ValueError): malformed, repeated or negative --seeds, an
      unknown arm in --arms, a
    spec arm that is not an arm, --compilation_cache without
    `compilation_cache`, or (without --smoke) a dirty git tree.
  """
  import argparse  # pylint: disable=g-import-not-at-top

  name = os.path.basename(here)
  prog = prog or f"experiments.{name}"
  p = argparse.ArgumentParser(prog=f"python -m {prog}", description=title)
  p.add_argument("--seeds", default=None, help=f"default {default_seeds}")
  p.add_argument("--smoke", action="store_true", help="shrunk version (CI)")
  p.add_argument(
      "--root",
      default=None,
      help=f"workdirs (default runs/{name}[_smoke]); results.* are written "
      "here with --smoke, else into the claim's folder (the recorded run)",
  )
  p.add_argument(
      "--arms",
      default=None,
      help="comma-separated subset of the arms (default: all)",
  )
  p.add_argument(
      "--stop_without_room",
      action="store_true",
      help="skip the RL arms when the start policy leaves no room",
  )
  p.add_argument(
      "--room_only",
      action="store_true",
      help="train the start policy, report the room check, and stop",
  )
  p.add_argument(
      "--compilation_cache",
      default=None,
      help=f"persistent XLA compilation cache folder (default ROOT/"
      f"{XLA_CACHE_DIR}; '' for none): compiled programs are reused by later "
      "seeds, evaluations and runs",
  )
  args = p.parse_args(list(argv))
  if not compilation_cache and args.compilation_cache is not None:
    # Without `compilation_cache` the flag would be parsed and then ignored.
    raise UsageError(
        f"--compilation_cache={args.compilation_cache!r}: python -m {prog} "
        "keeps no persistent compilation cache (a claim folder's own "
        "process does); drop the flag"
    )
  if args.seeds is None:
    seeds_str = "0,1" if args.smoke else default_seeds
  else:
    seeds_str = args.seeds
  seeds = parse_seeds(seeds_str)
  root = args.root or os.path.join(
      REPO, "runs", name + ("_smoke" if args.smoke else "")
  )
  out_dir, decision = results_dir(args.smoke, seeds, root, here)
  arms = dict(arms_fn(args.smoke))
  spec = run_kwargs.get("spec")
  pc_arm = getattr(spec, "positive_control_arm", "")
  if pc_arm and pc_arm not in arms:
    raise UsageError(
        f"SPEC.positive_control_arm={pc_arm!r}: not an arm of this claim; "
        f"known: {list(arms)}"
    )
  # Every arm the verdict needs: the parts' arms and the positive-control
  # check's (the start row is trained anyway).
  needed = (
      []
      if spec is None or not hasattr(spec, "arms")
      else [a for a in spec.arms if a != "SFT (start)"]
  )
  absent = [a for a in needed if a not in arms]
  if absent:
    raise UsageError(
        f"SPEC names arm(s) {absent} that are not arms of this claim; known: "
        f"{list(arms)}"
    )
  if args.arms:
    keep = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in keep if a not in arms]
    if unknown:
      raise UsageError(f"--arms: unknown arm(s) {unknown}; known: {list(arms)}")
    # The verdict's arms (parts, positive control) are always kept: a
    # decision run without its positive control cannot contradict the claim.
    arms = {a: c for a, c in arms.items() if a in keep or a in needed}
  if decision:  # a decision run records the commit that ran
    require_clean_tree()
  if compilation_cache:
    cache = args.compilation_cache
    if cache is None:
      cache = os.path.join(root, XLA_CACHE_DIR)
    if cache:
      enable_compilation_cache(cache)
  command = shlex.join(["python", "-m", prog, *argv])
  stem = run_kwargs.pop("stem", "results")
  out = run_claim(
      title,
      arms,
      seeds,
      root=root,
      out_dir=out_dir,
      stop_without_room=args.stop_without_room,
      room_only=args.room_only,
      command=command,
      stem=room_stem(stem) if args.room_only else stem,
      **run_kwargs,
  )
  if after_run is not None and not args.arms and not args.room_only:
    # Extra tables need every arm's workdir: skipped for an --arms subset.
    after_run(root, out_dir, seeds, args.smoke)
  return out


class UsageError(ValueError):
  """A malformed claim-runner flag (`cli`); `claim_main` prints it in one
  line and exits 2."""


# Output stem of a --room_only run (experiments/summary.py reads it when a
# folder has no decided results.json).
ROOM_STEM = "room_check"


def room_stem(stem: str = "results") -> str:
  """Output stem of a --room_only run of the claim whose results stem is
  `stem`: 'room_check' for a folder's first claim ('results'), e.g.
  'results_faithful_room_check' for a further claim, so that one claim's
  room check never overwrites another's."""
  return ROOM_STEM if stem == "results" else f"{stem}_{ROOM_STEM}"


def claim_main(main_file: str, **kwargs) -> dict:
  """The body of a claim folder's `__main__.py`: `cli` on sys.argv with the
  folder of `main_file` (pass `__file__`) and the persistent compilation
  cache on; kwargs as for `cli` (title, arms_fn, spec, metrics, ...)."""
  import sys  # pylint: disable=g-import-not-at-top

  here = os.path.dirname(os.path.abspath(main_file))
  base = os.path.splitext(os.path.basename(main_file))[0]
  prog = f"experiments.{os.path.basename(here)}" + (
      "" if base == "__main__" else f".{base}"
  )
  try:
    return cli(
        sys.argv[1:], here=here, prog=prog, compilation_cache=True, **kwargs
    )
  except UsageError as e:  # bad flags (--seeds, --arms): one line, exit 2
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
