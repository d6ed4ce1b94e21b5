"""Cheap proxy of the bit-identity harness: the lowered RL iteration's text.

    python -m experiments.hlo_identity list
    python -m experiments.hlo_identity record --out=F.json [--only=a,b*]
    python -m experiments.hlo_identity check --ref=F.json [--only=...]
        [--out=G.json] [--diff_dir=D]

For every variant of `experiments.bit_identity.VARIANTS` (same names, same
configs: each variant's `build`), this builds the jitted RL iteration the way
the training code does and LOWERS it (`jit(...).lower(state)`, no XLA
compile, no training step), then records a canonical text of the lowered
StableHLO module and its SHA-256. Two commits whose texts agree for a variant
run the same program for it: given the same inputs (and the same jax / jaxlib
/ backend), the results are bit-identical. A difference is not yet a wrong
result (e.g. two independent ops emitted in another order) but shows where
to look; `check` prints a short unified diff of the canonical texts.

How each kind of variant is built (the training code's own functions, as
`agentic_rl/loop.py`'s callers use them; nothing of the step itself is
re-implemented here):

  rl     as `train.train_and_evaluate` up to its first RL step:
         `schema.with_defaults`, `validation.validate_config`, the mesh of
         `config.mesh` (set as the current mesh), `train.setup` (env, model
         config, `train.init_state`, the frozen RM of `rl.reward_model_dir`),
         `train.make_phases(config, *train.make_steps(...))`, the RL phase's
         `enter` (`train.start_rl`: the state the first RL step sees has this
         structure; only its values differ, which a lowering does not read),
         then the RL phase's `step.lower(state)`.
         Host environments: `make_rl_step` returns the Python `host_step`
         (rollout on the host, then one jitted program of the rest); it is
         called once with `host_memory.CompileThenRelease` replaced by a
         stand-in that lowers the jitted program on the arguments host_step
         passes (the real host rollout of the start state, trimmed as
         training trims it) instead of compiling and running it.
  seeds  as `seeds.train_seeds`: `seeds.init_states` (the per-seed
         `train.init_state` stacked), `seeds.make_phases(config,
         *seeds.make_steps(...))`, the RL phase's `enter`
         (`jit(vmap(start_rl))`), then its `step` (`jit(vmap(
         learner.make_rl_step(...)), donate_argnums=0)`) lowered on the
         stacked state.
  rm     skipped: rm_train has no RL iteration.

Fixtures (no training): the learned-RM variants read a reward-model folder;
instead of the rm_train variant's trained one, the child writes the same
rm-mode config.json (`bit_identity._rm_train`) and a checkpoint of the fresh
rm-mode state (`reward_model_loader.init_rm_state`) at the step the trained
one ends on: the loader reads the same structure, and the weights' values do
not enter the lowered program. The HF chat checkpoint of host_gsm_tool_hf is
written by tests/chat_fixtures.py, as the bit-identity harness does.

Canonical text (what is compared and hashed):
  1. `Lowered.as_text(debug_info=False)`: StableHLO without source locations;
     any `loc(...)` attribute or `#loc` alias line left is removed as well;
  2. private functions (`func.func private @name`, the nested jits and
     helpers JAX emits as calls) are renamed `@fn0`, `@fn1`, ... in the order
     of their definitions in the module, every reference renamed with them.
     Nothing else is changed (public @main, constants, attributes such as
     jax.result_info / mhlo.sharding, op order all kept). This renaming is a
     bijection on the symbols, so equal canonical texts are the same program
     up to the names of its functions. The raw text's SHA-256 (step 1 only)
     is recorded as well; `check` reports when only the names differed.

The reference comes from the base commit, e.g. in a second worktree (the
script copied there when the base commit predates it):

    git worktree add --detach ../wt_base <base>
    cp experiments/hlo_identity.py ../wt_base/experiments/
    (cd ../wt_base &&
     python -m experiments.hlo_identity record --out=/tmp/ref.json)
    python -m experiments.hlo_identity check --ref=/tmp/ref.json

About 30 s per variant on one idle core (lowering only; the host variants
run their host rollout once, about 1 minute).

Each variant is lowered in its own Python process (one at a time), so a
variant's text does not depend on what ran before it in the same process.
The record holds the versions of the libraries that produce the text; `check`
refuses a reference made with others (--force compares anyway).
"""

# Imports inside the child functions keep the parent process free of jax;
# the harness's private helpers are reused on purpose.
# pylint: disable=g-import-not-at-top,protected-access

from __future__ import annotations

import argparse
import contextlib
import datetime
import difflib
import hashlib
import importlib.util
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any

from experiments import bit_identity

REPO = bit_identity.REPO
# Bump when what is recorded or how it is canonicalised changes.
HLO_IDENTITY_VERSION = 1
# The libraries whose versions decide the lowered text.
_LOWERING_LIBRARIES = ("jax", "jaxlib", "flax", "optax", "numpy", "ml-dtypes")


# ---------------------------------------------------------------------------
# Canonical text
# ---------------------------------------------------------------------------

_LOC_ATTR = re.compile(r"\s*loc\((?:[^()]|\((?:[^()]|\([^()]*\))*\))*\)")
_LOC_ALIAS = re.compile(r"^#loc\d*\s*=.*$\n?", re.M)
_PRIVATE_DEF = re.compile(r"func\.func\s+private\s+@(\"[^\"]+\"|[\w.$-]+)")
_SYMBOL = re.compile(r"@(\"[^\"]+\"|[\w.$-]+)")


def canonical_text(raw: str) -> tuple[str, list[str]]:
  """(canonical text, the private function names in definition order) of a
  lowered module's text (see the module docstring)."""
  text = _LOC_ALIAS.sub("", raw)
  text = _LOC_ATTR.sub("", text)
  names: list[str] = []
  for m in _PRIVATE_DEF.finditer(text):
    if m.group(1) not in names:
      names.append(m.group(1))
  mapping = {n: f"fn{i}" for i, n in enumerate(names)}

  def rename(m):
    return "@" + mapping.get(m.group(1), m.group(1))

  return _SYMBOL.sub(rename, text), names


def sha256(text: str) -> str:
  return hashlib.sha256(text.encode()).hexdigest()


# ---------------------------------------------------------------------------
# Lowering one variant (child process)
# ---------------------------------------------------------------------------


class _Lowered(Exception):
  """Carries the lowered program out of host_step."""

  def __init__(self, lowered):
    super().__init__("lowered")
    self.lowered = lowered


class _LowerOnly:
  """Stand-in for host_memory.CompileThenRelease: lowers, never runs."""

  def __init__(self, jitted):
    self._jitted = jitted

  def __call__(self, *args):
    raise _Lowered(self._jitted.lower(*args))

  def lower(self, *args):
    return self._jitted.lower(*args)


def _write_rm_fixture(path: str) -> None:
  """An rm-mode folder with the rm_train variant's config.json and a fresh
  (untrained) rm state saved at the step the trained run ends on."""
  import jax.numpy as jnp

  from agentic_rl import checkpoint as checkpoint_lib
  from agentic_rl import reward_model_loader
  from configs import schema

  config = schema.with_defaults(bit_identity._rm_train({}))
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, "config.json"), "w") as f:
    f.write(config.to_json_best_effort(indent=2))
  model_cfg = reward_model_loader.model_config(config)
  _, _, state = reward_model_loader.init_rm_state(config, model_cfg)
  total = config.sft.steps + 2 * config.rm.steps
  state["step"] = jnp.int32(total)
  ckpt = checkpoint_lib.Checkpointer(os.path.join(path, "checkpoints"))
  ckpt.save(total, state, force=True)
  ckpt.wait()
  ckpt.close()


def _fixtures(v: bit_identity.Variant, workdir: str) -> dict[str, str]:
  fixtures: dict[str, str] = {}
  if "rm_dir" in v.needs:
    fixtures["rm_dir"] = os.path.join(workdir, "rm_dir")
    _write_rm_fixture(fixtures["rm_dir"])
  if "chat_ckpt" in v.needs:
    spec = importlib.util.spec_from_file_location(
        "chat_fixtures", os.path.join(REPO, "tests", "chat_fixtures.py")
    )
    chat_fixtures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(chat_fixtures)
    fixtures["chat_ckpt"] = os.path.join(workdir, "chat_ckpt")
    chat_fixtures.write_chat_checkpoint(fixtures["chat_ckpt"])
  return fixtures


@contextlib.contextmanager
def _replaced(module, name: str, value):
  old = getattr(module, name)
  setattr(module, name, value)
  try:
    yield
  finally:
    setattr(module, name, old)


def _lower_rl(config):
  """The lowered RL step of train.train_and_evaluate for `config`."""
  import jax

  from agentic_rl import host_memory
  from agentic_rl import sharding
  from agentic_rl import train
  from agentic_rl import validation
  from configs import schema

  config = schema.with_defaults(config)
  validation.validate_config(config)
  mesh = sharding.make_mesh(config.mesh)
  with jax.set_mesh(mesh):
    run = train.setup(config, mesh)
    with _replaced(host_memory, "CompileThenRelease", _LowerOnly):
      _, rl = train.make_phases(config, *train.make_steps(config, run, mesh))
    # The state the first RL step sees has start_rl's structure (only its
    # values differ, which a lowering does not read).
    state = rl.enter(run.state)
    rl_step = rl.step
    if hasattr(rl_step, "lower"):
      return rl_step.lower(state), "jit(step).lower(state)"
    # Host environment: host_step(state) rolls out on the host, trims, then
    # calls the (replaced) CompileThenRelease wrapper of jit(step).
    if "learn_jit" not in inspect.getclosurevars(rl_step).nonlocals:
      raise RuntimeError("make_rl_step returned neither a jit nor host_step")
    try:
      rl_step(state)
    except _Lowered as e:
      return e.lowered, "host_step(state): jit(step).lower(state, traj)"
    raise RuntimeError("host_step returned without calling its jitted step")


def _lower_seeds(config):
  """The lowered vmapped RL step of seeds.train_seeds for `config`."""
  from agentic_rl import seeds
  from agentic_rl import train
  from agentic_rl import validation
  from configs import schema

  config = schema.with_defaults(config)
  validation.validate_config(config)
  env = train.make_env(config)
  model_cfg = train.make_model_config(config)
  graphdef, state = seeds.init_states(config, bit_identity.SEEDS, model_cfg)
  _, rl = seeds.make_phases(
      config, *seeds.make_steps(config, env, graphdef, model_cfg)
  )
  return rl.step.lower(rl.enter(state)), "jit(vmap(step)).lower(stacked state)"


def lower_variant(name: str, workdir: str) -> dict[str, Any]:
  """Lowers one variant in this process; returns its record."""
  v = bit_identity.VARIANTS_BY_NAME[name]
  missing = [m for m in v.requires if importlib.util.find_spec(m) is None]
  if missing:
    return {"skipped": f"missing module(s) {', '.join(missing)}"}
  if v.kind == "rm":
    return {"skipped": "rm_train has no RL iteration"}
  t0 = time.time()
  os.makedirs(workdir, exist_ok=True)
  config = v.build(_fixtures(v, workdir))
  config.name = f"bit_identity_{name}"
  t1 = time.time()
  if v.kind == "rl":
    lowered, how = _lower_rl(config)
  elif v.kind == "seeds":
    lowered, how = _lower_seeds(config)
  else:
    raise ValueError(f"{name}: unknown kind {v.kind!r}")
  t2 = time.time()
  raw = lowered.as_text(debug_info=False)
  text, names = canonical_text(raw)
  return {
      "how": how,
      "sha256": sha256(text),
      "raw_sha256": sha256(raw),
      "private_functions": names,
      "chars": len(text),
      "text": text,
      "setup_s": round(t1 - t0, 1),
      "build_lower_s": round(t2 - t1, 1),
      "env": bit_identity.runtime_env(),
  }


# ---------------------------------------------------------------------------
# Orchestration
# ---------------------------------------------------------------------------


def _versions() -> dict[str, str | None]:
  return {
      k: v
      for k, v in bit_identity._versions().items()
      if k in _LOWERING_LIBRARIES
  }


def _header(records: dict[str, dict]) -> dict[str, Any]:
  envs = [r["env"] for r in records.values() if "env" in r]
  return {
      "hlo_identity_version": HLO_IDENTITY_VERSION,
      "python": sys.version.split()[0],
      "versions": _versions(),
      "env": envs[0] if envs else {},
      "env_vars": {
          k: v
          for k, v in sorted(os.environ.items())
          if k.startswith(("XLA_", "JAX_")) and "CACHE" not in k
      },
      "created": datetime.datetime.now(datetime.timezone.utc).isoformat(
          timespec="seconds"
      ),
      "git_commit": bit_identity._git("rev-parse", "HEAD"),
      "git_dirty": bool(bit_identity._git("status", "--porcelain")),
  }


def _mismatches(ref: dict, new: dict) -> list[str]:
  out = []
  for k in ("hlo_identity_version", "versions", "env", "env_vars"):
    a, b = ref.get(k), new.get(k)
    if isinstance(a, dict) and isinstance(b, dict):
      if not a or not b:  # no variant lowered on one side
        continue
      out += [
          f"{k}.{s}: {a.get(s)!r} -> {b.get(s)!r}"
          for s in sorted(set(a) | set(b))
          if a.get(s) != b.get(s)
      ]
    elif a != b:
      out.append(f"{k}: {a!r} -> {b!r}")
  return out


def _run_child(name: str, root: str, timeout: int) -> dict[str, Any]:
  """Lowers one variant in a fresh Python process; returns its record."""
  out = os.path.join(root, f"{name}.json")
  log = os.path.join(root, f"{name}.log")
  cmd = [
      sys.executable,
      "-m",
      "experiments.hlo_identity",
      "_child",
      f"--variant={name}",
      f"--workdir={os.path.join(root, name)}",
      f"--out={out}",
  ]
  t0 = time.time()
  with open(log, "w") as f:
    try:
      rc = subprocess.run(
          cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, timeout=timeout
      ).returncode
    except subprocess.TimeoutExpired:
      rc = "timeout"
  if rc == 0 and os.path.exists(out):
    with open(out) as f:
      record = json.load(f)
  else:
    with open(log, errors="replace") as f:
      record = {"error": f"exit {rc}; log {log}:\n{f.read()[-3000:]}"}
  record["wall_s"] = round(time.time() - t0, 1)
  status = next((k for k in ("error", "skipped") if k in record), "done")
  extra = f" {record['sha256'][:12]}" if "sha256" in record else ""
  print(
      f"  {name:<28} {status:<8} {record['wall_s']:6.0f} s{extra}", flush=True
  )
  return record


def _run_all(args) -> tuple[dict[str, dict], str]:
  variants = bit_identity.select(args.only)
  root = os.path.abspath(args.workdir or tempfile.mkdtemp(prefix="hlo_id_"))
  os.makedirs(root, exist_ok=True)
  print(f"lowering {len(variants)} variant(s) in {root}", flush=True)
  return {
      v.name: _run_child(v.name, root, args.timeout) for v in variants
  }, root


def _write(path: str, obj) -> None:
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(obj, f, indent=1, sort_keys=True)
  os.replace(tmp, path)


def _merge_into(path: str, header: dict, records: dict[str, dict]) -> None:
  """Writes the records to `path`, keeping the other variants of an existing
  file there (so a reference can be recorded in several --only calls)."""
  variants = {}
  if os.path.exists(path):
    with open(path) as f:
      old = json.load(f)
    if _mismatches(old["header"], header):
      raise SystemExit(f"{path} was recorded under another setup")
    variants = old["variants"]
  variants.update(records)
  _write(path, {"header": header, "variants": variants})


def _failures(records: dict[str, dict]) -> list[str]:
  return [n for n, r in records.items() if "error" in r]


def cmd_record(args) -> int:
  records, root = _run_all(args)
  _merge_into(args.out, _header(records), records)
  for n in _failures(records):
    print(f"FAILED: {n}: {records[n]['error'][-1500:]}")
  print(f"wrote {args.out} (work folder {root})")
  return 1 if _failures(records) else 0


def short_diff(
    a: str, b: str, context: int = 2, max_lines: int = 80, width: int = 200
) -> str:
  """The first `max_lines` lines of a unified diff of two texts, each line
  cut at `width` characters."""
  lines = [
      line if len(line) <= width else line[:width] + " ..."
      for line in difflib.unified_diff(
          a.splitlines(), b.splitlines(), "ref", "new", n=context, lineterm=""
      )
  ]
  more = (
      f"\n... {len(lines) - max_lines} more diff lines"
      if (len(lines) > max_lines)
      else ""
  )
  return "\n".join(lines[:max_lines]) + more


def compare(name: str, ref: dict | None, new: dict) -> tuple[str, str]:
  """(status, detail) of one variant: 'identical', 'names-only' (raw texts
  differ in private function names only), 'DIFFERENT', 'ERROR', 'SKIPPED',
  'NO-REF'."""
  if ref is None:
    return "NO-REF", ""
  if "skipped" in ref or "skipped" in new:
    return "SKIPPED", (ref.get("skipped") or new.get("skipped") or "")
  if "error" in ref:
    return "SKIPPED", "failed when recorded"
  if "error" in new:
    return "ERROR", new["error"].strip().splitlines()[-1]
  if ref["sha256"] == new["sha256"]:
    if ref["raw_sha256"] == new["raw_sha256"]:
      return "identical", ""
    return "names-only", (
        f"private functions ref {ref['private_functions']} -> new "
        f"{new['private_functions']}"
    )
  return "DIFFERENT", short_diff(ref["text"], new["text"])


def cmd_check(args) -> int:
  with open(args.ref) as f:
    ref = json.load(f)
  records, root = _run_all(args)
  header = _header(records)
  refused = _mismatches(ref["header"], header)
  if refused and not args.force:
    print("refused: the reference was made under another setup:")
    print("  " + "\n  ".join(refused))
    return 2
  if args.out:
    _write(args.out, {"header": header, "variants": records})
  diff_dir = os.path.abspath(args.diff_dir or os.path.join(root, "diffs"))
  bad = 0
  print(f"{'variant':<28} status")
  for name, new in records.items():
    status, detail = compare(name, ref["variants"].get(name), new)
    print(f"{name:<28} {status}")
    if status == "DIFFERENT":
      bad += 1
      os.makedirs(diff_dir, exist_ok=True)
      full = os.path.join(diff_dir, f"{name}.diff")
      with open(full, "w") as f:
        f.write(
            "\n".join(
                difflib.unified_diff(
                    ref["variants"][name]["text"].splitlines(),
                    new["text"].splitlines(),
                    "ref",
                    "new",
                    lineterm="",
                )
            )
        )
      print("    " + detail.replace("\n", "\n    "))
      print(f"    full diff: {full}")
    elif status == "ERROR":
      bad += 1
      print(f"    {detail}")
    elif detail:
      print(f"    {detail}")
  print(
      f"{len(records) - bad}/{len(records)} variants without a difference"
      + (" (setup differs from the reference's)" if refused else "")
  )
  return 1 if bad else 0


def cmd_list(args) -> int:
  del args
  for v in bit_identity.VARIANTS:
    print(f"{v.name:<28} {v.kind}")
  return 0


def cmd_child(args) -> int:
  try:
    record = lower_variant(args.variant, args.workdir)
  except Exception:  # pylint: disable=broad-except
    record = {"error": traceback.format_exc()}
  _write(args.out, record)
  return 0


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
      prog="python -m experiments.hlo_identity",
      description=__doc__.split("\n\n")[1],
      formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  sub = parser.add_subparsers(dest="command", required=True)
  run_args = argparse.ArgumentParser(add_help=False)
  run_args.add_argument(
      "--only", default="", help="comma-separated names or fnmatch patterns"
  )
  run_args.add_argument(
      "--workdir", default="", help="work folder (default: a temporary one)"
  )
  run_args.add_argument(
      "--timeout", type=int, default=1800, help="seconds per variant"
  )
  p = sub.add_parser("record", parents=[run_args], help="record a reference")
  p.add_argument(
      "--out", required=True, help="JSON file (existing variants are kept)"
  )
  p.set_defaults(fn=cmd_record)
  p = sub.add_parser("check", parents=[run_args], help="compare with one")
  p.add_argument("--ref", required=True)
  p.add_argument("--out", default="", help="also write this run's record")
  p.add_argument("--diff_dir", default="", help="full diffs (default: work)")
  p.add_argument("--force", action="store_true", help="compare across setups")
  p.set_defaults(fn=cmd_check)
  p = sub.add_parser("list", help="the variants")
  p.set_defaults(fn=cmd_list)
  p = sub.add_parser("_child", help=argparse.SUPPRESS)
  p.add_argument("--variant", required=True)
  p.add_argument("--workdir", required=True)
  p.add_argument("--out", required=True)
  p.set_defaults(fn=cmd_child)
  args = parser.parse_args(argv)
  return args.fn(args)


if __name__ == "__main__":
  sys.exit(main())
