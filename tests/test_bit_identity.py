"""experiments/bit_identity.py: the comparison of records (hand-made records),
every variant's config validates, and (slow) one variant recorded, then
checked, end to end in a temporary folder."""

import copy
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from experiments import bit_identity as bi

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _record():
  return {
      "metrics": {
          "1": {"sft/loss": bi.value_hex(np.float32(2.5))},
          "2": {"rl/loss": bi.value_hex(np.float32(0.25)), "rl/kl": "null"},
      },
      "eval": {"eval_sft/accuracy": bi.value_hex(0.5)},
      "state": {
          "['params']['w']": bi.leaf_fingerprint(
              np.arange(6, dtype=np.float32).reshape(2, 3)
          ),
          "['opt_state'][0]['mu']": bi.leaf_fingerprint(np.ones(3, np.float32)),
          "['dual_coef']": bi.leaf_fingerprint(np.float32(0.5)),
      },
      "checkpoint_step": 2,
      "config_sha256": "abc",
      "warnings": [],
      "env": {},
  }


def test_identical_records_pass():
  ref = _record()
  r = bi.compare_variant("v", ref, copy.deepcopy(ref))
  assert r.status == "ok", r.diffs
  assert r.metrics == (3, 3) and r.evals == (1, 1)
  assert r.state == {"opt_state": (1, 1), "other": (1, 1), "params": (1, 1)}


def test_one_bit_in_a_metric_or_a_leaf_is_a_difference():
  ref = _record()
  new = copy.deepcopy(ref)
  new["metrics"]["2"]["rl/loss"] = bi.value_hex(
      np.nextafter(np.float32(0.25), np.float32(1))
  )
  r = bi.compare_variant("v", ref, new)
  assert r.status == "DIFF" and r.metrics == (2, 3)
  assert r.diffs[0].startswith("step 2 rl/loss: 0x1.0000000000000p-2 ->")
  new = copy.deepcopy(ref)
  w = np.arange(6, dtype=np.float32).reshape(2, 3)
  w.view(np.uint32)[1, 2] ^= 1  # the last mantissa bit of one weight
  new["state"]["['params']['w']"] = bi.leaf_fingerprint(w)
  r = bi.compare_variant("v", ref, new)
  assert r.status == "DIFF" and r.state["params"] == (0, 1)
  assert "['params']['w']: sum" in r.diffs[0]


def test_a_relocated_leaf_matches_by_content():
  ref = _record()
  new = copy.deepcopy(ref)
  new["state"]["['features']['dual']['coef']"] = new["state"].pop(
      "['dual_coef']"
  )
  r = bi.compare_variant("v", ref, new)
  assert r.status == "ok", r.diffs
  assert any("relocated" in n for n in r.notes)
  # Moved and changed: a difference.
  new["state"]["['features']['dual']['coef']"] = bi.leaf_fingerprint(
      np.float32(0.75)
  )
  r = bi.compare_variant("v", ref, new)
  assert r.status == "DIFF"
  assert any("['dual_coef']: missing" in d for d in r.diffs)


def test_new_metrics_and_leaves_fail_unless_allowed():
  ref = _record()
  new = copy.deepcopy(ref)
  new["metrics"]["2"]["rl/extra"] = bi.value_hex(1.0)
  new["state"]["['spa']['w']"] = bi.leaf_fingerprint(np.zeros(2, np.float32))
  r = bi.compare_variant("v", ref, new)
  assert r.status == "DIFF" and len(r.diffs) == 2
  assert bi.compare_variant("v", ref, new, allow_new=True).status == "ok"
  # A metric the new run lacks always fails.
  new = copy.deepcopy(ref)
  del new["metrics"]["2"]["rl/kl"]
  r = bi.compare_variant("v", ref, new, allow_new=True)
  assert r.diffs == ["step 2 rl/kl: missing"]


def test_skipped_failed_and_missing_variants():
  ref = _record()
  assert bi.compare_variant("v", None, ref).status == "NO-REF"
  assert bi.compare_variant("v", {"skipped": "x"}, ref).status == "SKIPPED"
  assert bi.compare_variant("v", ref, {"skipped": "x"}).status == "UNCHECKED"
  r = bi.compare_variant("v", ref, {"error": "Traceback\nValueError: bad"})
  assert r.status == "ERROR" and r.diffs == ["ValueError: bad"]


def test_setup_mismatches_are_listed():
  a = {
      "harness_version": 1,
      "backend": "cpu",
      "versions": {"jax": "0.10.2", "flax": "0.12.8"},
      "env_vars": {},
  }
  b = copy.deepcopy(a)
  assert not bi.env_mismatches(a, b)
  b["versions"]["jax"] = "0.10.3"
  b["env_vars"]["XLA_FLAGS"] = "--xla_cpu_enable_fast_math=true"
  assert bi.env_mismatches(a, b) == [
      "env_vars.XLA_FLAGS: None -> '--xla_cpu_enable_fast_math=true'",
      "versions.jax: '0.10.2' -> '0.10.3'",
  ]


def test_only_selects_names_and_patterns_in_order():
  names = [v.name for v in bi.select("host_*,grpo_default")]
  assert names == ["grpo_default", "host_bfcl", "host_gsm_tool_hf"]
  assert len(bi.select("")) == len(bi.VARIANTS)
  with pytest.raises(SystemExit, match="matches no variant"):
    bi.select("no_such_variant")


def test_every_variant_without_fixtures_builds_a_valid_config():
  """What `record` would refuse minutes into a run, refused here at once."""
  import importlib.util  # pylint: disable=g-import-not-at-top

  from agentic_rl import rm_train  # pylint: disable=g-import-not-at-top
  from agentic_rl import validation  # pylint: disable=g-import-not-at-top

  checked = 0
  for v in bi.VARIANTS:
    if v.needs or any(importlib.util.find_spec(m) is None for m in v.requires):
      continue
    config = v.build({})
    if v.kind == "rm":
      rm_train.validate_rm_config(config)
    else:
      validation.validate_config(config)
    checked += 1
  assert checked >= 20


@pytest.mark.slow
def test_one_variant_records_then_checks_bit_identical(tmp_path):
  ref, new = str(tmp_path / "ref.json"), str(tmp_path / "new.json")

  def run(*args):
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.bit_identity", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    return proc.returncode, proc.stdout + proc.stderr

  rc, out = run(
      "record",
      "--only=grpo_default",
      f"--out={ref}",
      f"--workdir={tmp_path / 'record'}",
  )
  assert rc == 0, out
  with open(ref) as f:
    recorded = json.load(f)
  assert recorded["header"]["backend"] and recorded["header"]["versions"]["jax"]
  r = recorded["variants"]["grpo_default"]
  assert r["metrics"] and r["state"] and r["eval"]
  assert any(k.startswith("['params']") for k in r["state"])
  rc, out = run(
      "check",
      f"--ref={ref}",
      "--only=grpo_default",
      f"--out={new}",
      f"--workdir={tmp_path / 'check'}",
  )
  assert rc == 0, out
  assert "1/1 variants without a difference" in out
  # The same record with one metric changed in its last bit is caught.
  with open(new) as f:
    rerun = json.load(f)["variants"]["grpo_default"]
  step = max(r["metrics"], key=int)
  x = float.fromhex(rerun["metrics"][step]["rl/loss"])
  rerun["metrics"][step]["rl/loss"] = bi.value_hex(
      np.nextafter(np.float32(x), np.float32(np.inf))
  )
  assert bi.compare_variant("grpo_default", r, rerun).status == "DIFF"


def test_compilation_cache_with_no_cache_is_refused(tmp_path, capsys):
  # --no_cache would silently ignore the --compilation_cache folder: one
  # error line naming both flags, exit status 2, nothing run or written.
  out = tmp_path / "ref.json"
  cache = tmp_path / "c"
  for command in ("record", "check"):
    extra = ["--ref", str(out)] if command == "check" else ["--out", str(out)]
    status = bi.main(
        [command, *extra, "--no_cache", f"--compilation_cache={cache}"]
    )
    assert status == 2
    err = capsys.readouterr().err
    assert err == (
        f"error: --compilation_cache={cache} with --no_cache: pass one of them\n"
    )
  assert not out.exists() and not cache.exists()
