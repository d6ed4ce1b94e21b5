"""Each claim reproduction's `--smoke` version runs end to end (CI tier
`-m experiments`; minutes each, so not in the default run)."""

import contextlib
import fcntl
import json
import os
import subprocess
import sys
import tempfile

import pytest

from experiments import summary

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Every claim folder but rm_selection, whose runner takes other flags (its own
# smoke test below); the list itself lives in experiments/summary.py.
CLAIMS = tuple(c for c in summary.CLAIMS if c != "rm_selection")
# Claims whose runner declares a ClaimSpec (room check + paired verdict): all.
WITH_SPEC = CLAIMS


# The pretrained-model smokes (SmolLM2-135M, experiments.smollm2*) peak at
# ~12 GB of host memory each: two at once on the two xdist workers exceeded a
# 24 GB machine (the kernel killed one). They take this lock, so at most one
# runs at a time whatever the workers' scheduling; the others do not.
HEAVY_LOCK = os.path.join(
    tempfile.gettempdir(), "agentic_rl_smollm2_smoke.lock"
)


def _run_smoke(module: str, root: str) -> None:
  """`python -m <module> --smoke --root=<root>` from the repository root;
  asserts it exits 0 (stderr's tail in the message). A SmolLM2 module runs
  under HEAVY_LOCK (one at a time across processes)."""
  with contextlib.ExitStack() as stack:
    if module.startswith("experiments.smollm2"):
      lock = stack.enter_context(open(HEAVY_LOCK, "w"))
      fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
    proc = subprocess.run(
        [sys.executable, "-m", module, "--smoke", f"--root={root}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1800,
        env=dict(os.environ, PYTHONPATH=REPO),
    )
  assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.experiments
@pytest.mark.parametrize("name", CLAIMS)
def test_claim_smoke(name, tmp_path):
  root = str(tmp_path / name)
  _run_smoke(f"experiments.{name}", root)
  with open(os.path.join(root, "results.json")) as f:
    results = json.load(f)
  assert results["seeds"] == [0, 1]
  from importlib import import_module

  arms = import_module(f"experiments.{name}.config").ARMS
  assert set(results["rows"]) == {"SFT (start)", *arms}
  for rows in results["rows"].values():
    assert len(rows) == 2 and all(0.0 <= r["accuracy"] <= 1.0 for r in rows)
  assert os.path.getsize(os.path.join(root, "results.png")) > 10_000
  assert results["commit"] != "" and set(results["config_hash"]) == set(arms)
  # Wall time of every process on the workdirs (one process here).
  assert results["wall_all_processes"] is True
  assert results["wall_total_s"] >= sum(results["wall_s"].values()) > 0
  if name in WITH_SPEC:
    from experiments import stats

    analysis = results["analysis"]
    assert analysis["verdict"] in stats.VERDICTS
    # Shares lie in [0, 1]; length_bias's room is a token spread (>= 0).
    assert results["room"]["value"] >= 0.0
    if name != "length_bias":
      assert results["room"]["value"] <= 1.0
    assert results["spec"]["primary_metric"] == analysis["primary_metric"]
    assert len(results["room"]["per_seed"]) == 2
    # Every seed's start must leave room (stats.room_record).
    assert analysis["room"]["ok"] == all(
        v >= results["room"]["threshold"] for v in results["room"]["per_seed"]
    )
    assert results["ledger"][-1]["kind"] == "decision run"
    with open(os.path.join(root, "results.md")) as f:
      assert "**Verdict: " in f.read()
  if name == "dark_room":  # the second table comes from the same command
    assert os.path.exists(os.path.join(root, "curves_summary.md"))


@pytest.mark.experiments
def test_rm_selection_smoke(tmp_path):
  root = str(tmp_path / "rm_selection")
  _run_smoke("experiments.rm_selection", root)
  for suffix in ("", "_kv"):
    with open(os.path.join(root, f"results{suffix}.json")) as f:
      results = json.load(f)
    assert results["seeds"] == [0] and len(results["config_hash"]) == 12
    for rm in ("orm", "prm"):
      assert 0.0 <= results[f"{rm}_pairwise"]["overall"] <= 1.0
      assert 0.0 <= results["best_of_n"][rm]["rank1_accuracy"] <= 1.0
    with open(os.path.join(root, f"results{suffix}.md")) as f:
      md = f.read()
    # The table is the run's own report, not a copy typed by hand.
    overall = results["orm_pairwise"]["overall"]
    assert (
        f"| **overall** | {results['orm_pairwise']['n']} | {overall:.3f} |"
        in md
    )
  # The kv file is the kv claim's (its own spec, with the control check);
  # one seed decides nothing.
  from experiments.rm_selection import kv  # pylint: disable=g-import-not-at-top

  with open(os.path.join(root, "results_kv.json")) as f:
    results = json.load(f)
  assert results["spec"]["spec_hash"] == kv.SPEC.to_json()["spec_hash"]
  assert results["spec"]["positive_control_check"]["control"] == "random pick"


# rm_selection's kv claim: rm-mode runs, in test_rm_selection_smoke.
HARNESS_EXTRA = tuple(e for e in summary.EXTRA if e[0] != "rm_selection")


@pytest.mark.experiments
@pytest.mark.parametrize(
    "folder, stem, module",
    HARNESS_EXTRA,
    ids=[module for _, _, module in HARNESS_EXTRA],
)
def test_further_claim_smoke(folder, stem, module, tmp_path):
  # The further declared claims of a folder (step_hacking.delta,
  # trace_credit.faithful, smollm2_calc.otc / .turn_credit): their own
  # runners, writing <stem>.json/.md/.png beside the folder's results.
  root = str(tmp_path / folder)
  _run_smoke(module, root)
  with open(os.path.join(root, f"{stem}.json")) as f:
    results = json.load(f)
  from experiments import stats

  assert results["seeds"] == [0, 1]
  arms = set(results["config_hash"])
  assert arms and set(results["rows"]) == {"SFT (start)", *arms}
  for rows in results["rows"].values():
    assert len(rows) == 2 and all(0.0 <= r["accuracy"] <= 1.0 for r in rows)
  spec = summary._spec(folder, module)  # pylint: disable=protected-access
  analysis = results["analysis"]
  assert analysis["verdict"] in stats.VERDICTS
  assert results["spec"]["primary_metric"] == spec.primary_metric
  assert len(results["room"]["per_seed"]) == 2
  assert analysis["room"]["ok"] == all(
      v >= results["room"]["threshold"] for v in results["room"]["per_seed"]
  )
  assert results["ledger"][-1]["kind"] == "decision run"
  with open(os.path.join(root, f"{stem}.md")) as f:
    assert "**Verdict: " in f.read()
  assert os.path.getsize(os.path.join(root, f"{stem}.png")) > 10_000
