"""Paired statistics, verdict rule and ClaimSpec of experiments/stats.py, checked
against hand-computed values and a printed Student-t table."""

import dataclasses
import json
import math

import numpy as np
import pytest

from experiments import stats


@pytest.mark.parametrize(
    "n,expected", [(2, 12.706), (3, 4.303), (5, 2.776), (8, 2.365), (11, 2.228)]
)
def test_t_multiplier_matches_textbook_table(n, expected):
  # Two-sided 95% t quantiles with n - 1 degrees of freedom (any t table).
  assert stats.t_multiplier(n) == pytest.approx(expected, abs=5e-4)


def test_t_multiplier_rejects_one_value():
  with pytest.raises(ValueError, match="n=1"):
    stats.t_multiplier(1)


def test_paired_difference_by_hand():
  # diffs [1, 2, 3]: mean 2, sample std 1, SE 1/sqrt(3) = 0.57735.
  out = stats.paired_difference([2.0, 4.0, 6.0], [1.0, 2.0, 3.0])
  assert out["diffs"] == [1.0, 2.0, 3.0]
  assert out["mean"] == pytest.approx(2.0)
  assert out["se"] == pytest.approx(1 / math.sqrt(3))
  half = 4.302653 / math.sqrt(3)  # 2.48414
  assert out["ci"][0] == pytest.approx(2 - half, abs=1e-4)
  assert out["ci"][1] == pytest.approx(2 + half, abs=1e-4)
  assert out["ci"][0] == pytest.approx(-0.4841, abs=1e-4)


def test_paired_difference_pairs_by_seed():
  # A large shared seed effect cancels in the pairing: diffs are all 0.1.
  out = stats.paired_difference([0.1, 0.6, 0.9, 0.4], [0.0, 0.5, 0.8, 0.3])
  assert out["mean"] == pytest.approx(0.1)
  assert out["se"] == pytest.approx(0.0, abs=1e-12)
  assert out["ci"] == pytest.approx([0.1, 0.1])


def test_paired_difference_errors():
  with pytest.raises(ValueError, match="equal-length"):
    stats.paired_difference([1.0, 2.0], [1.0])
  with pytest.raises(ValueError, match="n=1"):
    stats.paired_difference([1.0], [0.0])
  with pytest.raises(ValueError, match="non-finite"):
    stats.paired_difference([1.0, float("nan")], [0.0, 0.0])


@pytest.mark.parametrize(
    "ci,direction,margin,room,expected",
    [
        ((0.1, 0.5), 1, None, True, "supported"),
        ((0.1, 0.5), "greater", None, True, "supported"),
        ((-0.5, -0.1), 1, None, True, "contradicted"),
        ((-0.1, 0.5), 1, None, True, "inconclusive"),
        ((-0.5, -0.1), -1, None, True, "supported"),
        ((0.1, 0.5), "less", None, True, "contradicted"),
        # Directional claim whose effect is bounded inside the margin: no effect.
        ((-0.01, 0.02), 1, 0.05, True, "contradicted"),
        ((-0.01, 0.08), 1, 0.05, True, "inconclusive"),
        # Parity claims.
        ((-0.03, 0.04), 0, 0.05, True, "supported"),
        ((-0.03, 0.06), "equivalent", 0.05, True, "inconclusive"),
        ((0.06, 0.2), 0, 0.05, True, "contradicted"),
        ((-0.2, -0.07), 0, 0.05, True, "contradicted"),
        # No room: untestable whatever the interval.
        ((0.1, 0.5), 1, None, False, "untestable at this setup"),
        ((-0.03, 0.04), 0, 0.05, False, "untestable at this setup"),
    ],
)
def test_verdict_rule(ci, direction, margin, room, expected):
  assert stats.verdict(ci, direction, margin, room) == expected


def test_verdict_errors():
  with pytest.raises(ValueError, match="needs a margin"):
    stats.verdict((-0.1, 0.1), 0)
  with pytest.raises(ValueError, match="direction=2"):
    stats.verdict((-0.1, 0.1), 2)
  with pytest.raises(ValueError, match="effect_ci"):
    stats.verdict((0.3, 0.1), 1)
  with pytest.raises(ValueError, match="equivalence_margin=0"):
    stats.verdict((0.1, 0.3), 1, 0)


def test_claimspec_direction_and_analyse():
  spec = stats.ClaimSpec(
      primary_metric="calls",
      higher_is_better=False,
      room_metric="zero_call_groups",
      room_threshold=0.2,
      treatment="hdpo",
      control="correct",
      prediction="better",
  )
  assert spec.direction == -1
  rows = {
      "correct": [{"calls": 1.0}, {"calls": 0.9}, {"calls": 1.0}],
      "hdpo": [{"calls": 0.5}, {"calls": 0.5}, {"calls": 0.4}],
  }
  # diffs [-0.5, -0.4, -0.6]: mean -0.5, SE 0.1 / sqrt(3) = 0.057735.
  a = stats.analyse(spec, rows, room_value=0.3)
  assert a["effect"]["mean"] == pytest.approx(-0.5)
  assert a["effect"]["se"] == pytest.approx(0.1 / math.sqrt(3))
  assert a["effect"]["ci"][1] == pytest.approx(
      -0.5 + 4.302653 * 0.057735, abs=1e-4
  )
  assert a["room"] == {
      "metric": "zero_call_groups",
      "value": 0.3,
      "threshold": 0.2,
      "ok": True,
  }
  assert a["verdict"] == "supported"
  low_room = stats.analyse(spec, rows, room_value=0.1)
  assert low_room["room"]["ok"] is False
  assert low_room["verdict"] == "untestable at this setup"
  text = stats.format_analysis(low_room)
  assert "-0.500" in text and "NO room" in text and "untestable" in text


def test_claimspec_errors():
  with pytest.raises(ValueError, match="prediction='faster'"):
    stats.ClaimSpec("acc", True, "r", 0.1, prediction="faster")
  with pytest.raises(ValueError, match="needs a margin"):
    stats.ClaimSpec("acc", True, "r", 0.1, prediction="equivalent")
  spec = stats.ClaimSpec("acc", True, "r", 0.1, treatment="a", control="b")
  with pytest.raises(ValueError, match="arm 'a'"):
    stats.analyse(spec, {"b": [{"acc": 1.0}]}, None)


def test_plot_grid_shares_limits_per_metric(tmp_path):
  import matplotlib.image as mpimg
  import numpy as np
  from experiments import harness

  rows = {
      "SFT (start)": [
          {"accuracy": 0.4, "calls": 0.3},
          {"accuracy": 0.4, "calls": 0.3},
      ],
      "a": [{"accuracy": 0.8, "calls": 1.0}, {"accuracy": 0.8, "calls": 1.0}],
      "b": [{"accuracy": 0.6, "calls": 2.0}, {"accuracy": 0.6, "calls": 2.2}],
  }
  curves = {
      "a": {"rl/accuracy": np.array([[0.3, 0.3], [1.1, 1.1]])},
      "b": {"rl/accuracy": np.array([[0.5, 0.5], [0.6, 0.6]])},
  }
  metrics = [
      ("accuracy", "acc"),
      ("calls", "calls"),
      ("accuracy", "acc 2"),
      ("calls", "calls 2"),
      ("accuracy", "acc 3"),
  ]
  path = str(tmp_path / "p.png")
  limits = harness.plot_grid("t", rows, curves, metrics, ["rl/accuracy"], path)
  # 6 panels in a 4-column grid: 2 rows, so the figure is at most 2.2:1.
  img = mpimg.imread(path)
  assert img.shape[1] / img.shape[0] < 2.2
  # accuracy bars and the rl/accuracy curve share limits; their range covers the
  # curve's 1.1 mean and the bars' 0 base: [0, 1.1] padded by 5%.
  acc = [limits[i] for i in (0, 2, 4, 5)]
  assert all(lim == acc[0] for lim in acc)
  assert acc[0][0] == pytest.approx(-0.055) and acc[0][1] == pytest.approx(
      1.155
  )
  # calls: bar b [2.0, 2.2]: mean 2.1, SE 0.1, t(1 dof) 12.706 -> upper CI end
  # 3.3706; range [0, 3.3706] padded by 5% = 0.16853.
  assert limits[1] == limits[3]
  assert limits[1][0] == pytest.approx(-0.16853, abs=1e-4)
  assert limits[1][1] == pytest.approx(3.53913, abs=1e-4)


def test_git_commit(tmp_path):
  from experiments import harness

  c = harness.git_commit()
  assert c == "unknown" or len(c.split("-")[0]) == 40
  assert harness.git_commit(str(tmp_path)) == "unknown"


def test_dark_room_curves_summary_from_workdirs(tmp_path):
  import numpy as np
  from experiments.dark_room import curves_summary

  keys = [k for k, _ in curves_summary.KEYS]
  # Arm 'outcome': 6 iterations x 2 seeds; accuracy rises 0.0 .. 0.5 in seed 0
  # and is 1.0 in seed 1. First window (it. 1-5) seed 0: mean(0..0.4) = 0.2;
  # last window (it. 2-6): mean(0.1..0.5) = 0.3.
  acc = np.stack([np.arange(6) / 10, np.ones(6)], axis=1)
  for arm in ("outcome", "pred_zscore"):
    (tmp_path / f"{arm}_s0-1").mkdir()  # harness.run_dir's name for seeds 0, 1
    np.savez(
        tmp_path / f"{arm}_s0-1" / "curves.npz",
        **{k: (acc if k == "rl/accuracy" else np.zeros((6, 2))) for k in keys},
    )
  curves_summary.write_summary(
      str(tmp_path), str(tmp_path / "out"), seeds=[0, 1]
  )
  md = (tmp_path / "out" / "curves_summary.md").read_text()
  # Seed means 0.2 / 1.0 -> 0.600 +- 0.400; 0.3 / 1.0 -> 0.650 +- 0.350.
  assert "| outcome | 0.600 +- 0.400 | 0.650 +- 0.350 |" in md
  assert "accuracy (last 5) 0.300/1.000" in md and "seeds 0, 1" in md
  assert (tmp_path / "out" / "curves_summary.png").stat().st_size > 10_000


def test_analyse_untestable_without_rl_rows():
  # The runner skipped the RL arms because the room check failed: no effect,
  # verdict untestable; with room, a missing arm is still an error.
  spec = stats.ClaimSpec(
      "acc", True, "headroom", 0.3, treatment="a", control="b"
  )
  a = stats.analyse(spec, {"SFT (start)": [{"acc": 0.9}, {"acc": 0.95}]}, 0.1)
  assert a["effect"] is None and a["verdict"] == "untestable at this setup"
  assert a["room"] == {
      "metric": "headroom",
      "value": 0.1,
      "threshold": 0.3,
      "ok": False,
  }
  assert "not run" in stats.format_analysis(a)
  with pytest.raises(ValueError, match="arm 'a'"):
    stats.analyse(spec, {"b": [{"acc": 1.0}, {"acc": 1.0}]}, 0.5)


def test_room_only_analysis_and_summary_row():
  spec = stats.ClaimSpec(
      "acc", True, "headroom", 0.3, treatment="a", control="b"
  )
  a = stats.room_only_analysis(spec, 0.45)
  assert a["effect"] is None and a["verdict"] == stats.ROOM_ONLY
  assert a["room"]["ok"] is True and a["room"]["value"] == 0.45
  text = stats.format_analysis(a)
  assert "only the room check was run" in text and "0.450" in text


def test_run_claim_room_only_stops_after_the_room_check(tmp_path, monkeypatch):
  # train_seeds replaced by a recorder: run_claim trains the control arm's
  # start only (rl.steps = 0), computes the room, trains no RL arm, and
  # writes results.json with the room-only verdict.

  import ml_collections  # noqa: PLC0415
  import numpy as np  # noqa: PLC0415

  from experiments import harness  # noqa: PLC0415

  calls = []

  def fake_train_seeds(config, seeds, workdir, resume_free=()):
    calls.append((config.rl.steps, workdir))
    params = {"w": np.zeros((len(seeds), 2))}
    return {
        "params": params,
        "eval_sft": [{"acc": 0.5}] * len(seeds),
        "eval_final": [{"acc": 0.5}] * len(seeds),
        "curves": {},
        # train_seeds' wall-time keys (read by run_claim).
        "wall_call_s": 1.0,
        "wall_total_s": 1.0,
        "wall_complete": True,
    }

  monkeypatch.setattr(harness.seeds_lib, "train_seeds", fake_train_seeds)
  monkeypatch.setattr(
      harness,
      "_with_extra",
      lambda out, phase, extra, config, seeds: [{"acc": 0.5} for _ in seeds],
  )
  cfg = lambda steps: ml_collections.ConfigDict(
      {"rl": {"steps": steps, "lr": steps}, "sft": {"steps": 3}}
  )
  spec = stats.ClaimSpec(
      "acc",
      True,
      "headroom",
      0.3,
      treatment="a",
      control="b",
      room_fn=lambda config, params: 0.4,
  )
  monkeypatch.setattr(harness, "_sft_key", lambda config: "k")
  out = harness.run_claim(
      "t",
      {"a": cfg(5), "b": cfg(6)},
      [0, 1],
      root=str(tmp_path / "root"),
      out_dir=str(tmp_path / "out"),
      metrics=(("acc", "acc"),),
      curve_keys=(),
      spec=spec,
      room_only=True,
  )
  assert [c[0] for c in calls] == [0]  # one start policy, no RL arm
  assert calls[0][1] == str(tmp_path / "root" / "sft_k_s0-1")
  assert out["analysis"]["verdict"] == stats.ROOM_ONLY
  saved = _strict_loads((tmp_path / "out" / "results.json").read_text())
  assert saved["room_only"] is True and saved["rl_skipped"] is True
  assert saved["room"]["value"] == 0.4
  md = (tmp_path / "out" / "results.md").read_text()
  assert "only the start policy and its room check (--room_only)" in md
  assert "--stop_without_room" not in md


def test_claimspec_to_json_names_room_fn():
  def my_room(config, params):
    del config, params
    return 0.5

  spec = stats.ClaimSpec(
      "calls",
      False,
      "r",
      0.2,
      treatment="t",
      control="c",
      room_fn=my_room,
      departures=("x", "y"),
      paper="P",
  )
  d = stats.ClaimSpec.to_json(spec)
  assert d["room_fn"] == "my_room" and d["departures"] == ["x", "y"]
  assert d["direction"] == -1 and d["paper"] == "P"
  json.dumps(d)  # JSON-ready


def test_summary_row_from_results():
  from experiments import summary

  spec = stats.ClaimSpec(
      "acc",
      True,
      "headroom",
      0.3,
      treatment="t",
      control="c",
      claim="C",
      paper="P",
      departures=("d1",),
  )
  rows = {"t": [{"acc": 0.9}, {"acc": 0.8}], "c": [{"acc": 0.5}, {"acc": 0.6}]}
  analysis = stats.analyse(spec, rows, 0.4)
  results = {
      "spec": spec.to_json(),
      "room": {"metric": "headroom", "value": 0.4, "threshold": 0.3},
      "analysis": analysis,
      "seeds": [0, 1],
      "wall_total_s": 600.0,
      "command": "python -m experiments.x --seeds=0,1",
  }
  r = summary.row("x", results, None)
  # diffs [0.4, 0.2]: mean 0.3, SE 0.1, t_1 = 12.706 -> CI [-0.971, +1.571].
  assert r["effect"] == "+0.300 [-0.971, +1.571]"
  assert r["verdict"] == "inconclusive"
  assert r["room"] == "headroom = 0.400 (threshold 0.3: room)"
  # A run recorded before the harness summed resumed processes: lower bound.
  assert r["wall"] == ">= 10 min (last process)"
  assert r["seeds"] == "2" and r["paper"] == "P"
  assert (
      summary.row("x", dict(results, wall_all_processes=True), None)["wall"]
      == "10 min"
  )
  assert summary.row("x", None, spec)["verdict"] == "not run"
  # A machine-local --root is left out of the command shown (it only places
  # the workdirs); every other flag stays.
  results["command"] = (
      "python -m experiments.x --seeds=0,1 --root=/tmp/elsewhere/x --arms=c,t"
  )
  assert summary.row("x", results, None)["command"] == (
      "`python -m experiments.x --seeds=0,1 --arms=c,t`"
  )
  # --root in its two-word form, and a quoted path with a space.
  results["command"] = (
      "python -m experiments.x --root '/tmp/my dir/x' --seeds=0,1 --arms=c,t"
  )
  assert summary.row("x", results, None)["command"] == (
      "`python -m experiments.x --seeds=0,1 --arms=c,t`"
  )
  # No recorded command: said so, not made up.
  assert summary.row("x", dict(results, command=None), None)["command"] == (
      "not recorded"
  )
  # A positive-control arm missing from the recorded rows is flagged.
  with_pc = dataclasses.replace(
      spec, positive_control="z arm (must fail)", positive_control_arm="z"
  )
  results["spec"] = with_pc.to_json()
  assert summary.row("x", results, None)["departures"] == (
      "d1 (positive control: z arm (must fail); not run in the recorded run)"
  )
  # Never run: no claim about the recorded run's arms.
  assert "not run in the recorded run" not in (
      summary.row("x", None, with_pc)["departures"]
  )
  results["rows"] = {"t": [], "c": [], "z": []}
  assert summary.row("x", results, None)["departures"] == (
      "d1 (positive control: z arm (must fail))"
  )


def test_curve_start_line_is_the_sampled_start(tmp_path):
  # The rl/accuracy curve is sampled at T = 1: its start line is the start's
  # sample_accuracy (0.2), not its greedy accuracy (0.9); the line widens the
  # panel's limits, so they show which one was drawn.
  import numpy as np
  from experiments import harness

  rows = {
      "SFT (start)": [
          {"accuracy": 0.9, "sample_accuracy": 0.2, "calls": 1.0},
          {"accuracy": 0.9, "sample_accuracy": 0.2, "calls": 1.0},
      ],
      "a": [{"calls": 1.0}, {"calls": 1.0}],
  }
  curves = {"a": {"rl/accuracy": np.array([[0.5, 0.5], [0.6, 0.6]])}}
  path = str(tmp_path / "p.png")
  limits = harness.plot_grid(
      "t", rows, curves, [("calls", "calls")], ["rl/accuracy"], path
  )
  lo, hi = limits[1]
  assert lo < 0.2 < hi < 0.9
  # Without a sampled start value no start line is drawn: the limits follow
  # the curve alone.
  del rows["SFT (start)"][0]["sample_accuracy"]
  limits = harness.plot_grid(
      "t", rows, curves, [("calls", "calls")], ["rl/accuracy"], path
  )
  assert limits[1][0] > 0.2 and limits[1][1] < 0.9


def test_summary_reads_room_check_when_results_are_undecided(tmp_path):
  # A folder whose results.json predates its spec (no analysis) and which has
  # a --room_only record: the row shows the room check's verdict; a decided
  # results.json wins over a room_check.json.
  import json  # noqa: PLC0415

  from experiments import summary

  spec = stats.ClaimSpec(
      "acc", True, "headroom", 0.3, treatment="t", control="c", claim="C"
  )
  folder = tmp_path / "dark_room"  # a real claim: its SPEC is imported
  folder.mkdir()
  (folder / "results.json").write_text(json.dumps({"seeds": [0, 1, 2]}))
  room = {
      "spec": spec.to_json(),
      "room": {"metric": "headroom", "value": 0.1, "threshold": 0.3},
      "analysis": stats.analyse(spec, {}, 0.1),
      "seeds": [0, 1, 2],
      "room_only": True,
      "wall_total_s": 60.0,
      "command": "python -m experiments.x --room_only",
  }
  (folder / "room_check.json").write_text(json.dumps(room))
  text = summary.table(claims=("dark_room",), root=str(tmp_path), extra=())
  assert "untestable at this setup" in text and "room check only" in text
  decided = dict(
      room,
      analysis=stats.analyse(
          spec,
          {
              "t": [{"acc": 1.0}, {"acc": 0.9}],
              "c": [{"acc": 0.5}, {"acc": 0.4}],
          },
          0.5,
      ),
      room_only=False,
  )
  (folder / "results.json").write_text(json.dumps(decided))
  text = summary.table(claims=("dark_room",), root=str(tmp_path), extra=())
  assert "+0.500" in text and "room check only" not in text


def test_bad_runner_flags_are_one_line_errors():
  import subprocess  # noqa: PLC0415
  import sys  # noqa: PLC0415

  for flag, want in (
      ("--arms=bogus", "error: --arms: unknown arm(s) ['bogus']"),
      ("--seeds=a,b", "error: --seeds must be comma-separated integers"),
  ):
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.dark_room", "--smoke", flag],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().startswith(want), proc.stderr
    assert "Traceback" not in proc.stderr


def _bon(orm, prm, random, oracle):
  """An rm report's best_of_n block (only the fields the runner reads)."""
  return {
      "best_of_n": {
          "orm": {"rank1_accuracy": orm},
          "prm": {
              "rank1_accuracy": prm,
              "random_accuracy": random,
              "oracle_accuracy": oracle,
          },
      }
  }


def test_rm_selection_pairs_the_two_rms_by_seed():
  from experiments.rm_selection import __main__ as rm_sel

  reports = [
      _bon(0.40, 0.50, 0.50, 0.90),
      _bon(0.45, 0.50, 0.50, 0.90),
      _bon(0.30, 0.50, 0.40, 0.90),
  ]
  room, a = rm_sel.analyse([rm_sel.seed_summary(r) for r in reports])
  # Room: oracle - random per seed 0.4, 0.4, 0.5 -> mean 0.43333.
  assert room["per_seed"] == pytest.approx([0.4, 0.4, 0.5])
  assert room["value"] == pytest.approx(1.3 / 3)
  # Paired diffs PRM - ORM: 0.10, 0.05, 0.20; mean 0.11667, sample std
  # 0.076376, SE 0.044096, t(2) = 4.303 -> CI [-0.0731, +0.3064].
  e = a["effect"]
  assert e["diffs"] == pytest.approx([0.10, 0.05, 0.20])
  assert e["mean"] == pytest.approx(0.35 / 3)
  assert e["ci"][0] == pytest.approx(0.35 / 3 - 4.3027 * 0.0440959, abs=1e-4)
  assert a["verdict"] == "inconclusive"
  # A consistent gain over 4 seeds is supported.
  reports.append(_bon(0.35, 0.45, 0.40, 0.90))
  reports[0] = _bon(0.40, 0.48, 0.50, 0.90)
  _, a = rm_sel.analyse([rm_sel.seed_summary(r) for r in reports])
  assert a["effect"]["ci"][0] > 0 and a["verdict"] == "supported"


def test_rm_selection_one_seed_or_no_room_forms_no_interval():
  from experiments.rm_selection import __main__ as rm_sel

  room, a = rm_sel.analyse([rm_sel.seed_summary(_bon(0.4, 0.5, 0.5, 0.9))])
  assert a["effect"] is None and a["verdict"] == rm_sel.NOT_DECIDED
  assert room["value"] == pytest.approx(0.4)
  # Oracle - random 0.1 < threshold 0.2: untestable, even with two seeds.
  low = [rm_sel.seed_summary(_bon(0.4, 0.5, 0.8, 0.9))] * 2
  _, a = rm_sel.analyse(low)
  assert a["verdict"] == "untestable at this setup"


def test_run_dir_keeps_seed_lists_apart(tmp_path):
  from experiments import harness  # noqa: PLC0415

  assert harness.seeds_tag(range(8)) == "s0-7"
  assert harness.seeds_tag([0, 2, 5]) == "s0_2_5"
  assert harness.seeds_tag([3]) == "s3"
  root = str(tmp_path)
  # No workdir yet: the tagged name.
  assert harness.run_dir(root, "arm", [0, 1, 2]) == f"{root}/arm_s0-2"
  # A workdir from before the tag holding seeds 0-2 is reused for 0-2 only;
  # an 8-seed run gets its own directory instead of a refused resume.
  (tmp_path / "arm").mkdir()
  (tmp_path / "arm" / "config.json").write_text('{"seeds": [0, 1, 2]}')
  assert harness.run_dir(root, "arm", [0, 1, 2]) == f"{root}/arm"
  assert harness.run_dir(root, "arm", range(8)) == f"{root}/arm_s0-7"


def test_legacy_workdirs_with_unreadable_config_are_not_reused(tmp_path):
  from experiments import harness  # noqa: PLC0415
  from experiments.rm_selection import __main__ as rm_sel  # noqa: PLC0415

  (tmp_path / "arm").mkdir()
  (tmp_path / "arm" / "config.json").write_text('{"seeds": [0, 1')  # cut off
  assert harness.run_dir(str(tmp_path), "arm", [0, 1]).endswith("arm_s0-1")
  # rm_selection: a single-run workdir ROOT/<task> is reused for its seed.
  (tmp_path / "arithmetic").mkdir()
  (tmp_path / "arithmetic" / "config.json").write_text('{"seed": 0}')
  root = str(tmp_path)
  assert rm_sel.seed_workdir(root, "arithmetic", 0) == f"{root}/arithmetic"
  assert rm_sel.seed_workdir(root, "arithmetic", 1) == (
      f"{root}/arithmetic/seed_1"
  )
  assert rm_sel.seed_workdir(root, "kv_chain", 0) == f"{root}/kv_chain/seed_0"


def test_cli_refuses_a_positive_control_arm_that_is_not_an_arm(tmp_path):
  from experiments import harness  # noqa: PLC0415

  spec = stats.ClaimSpec(
      "accuracy",
      True,
      "headroom",
      0.3,
      treatment="t",
      control="c",
      positive_control="z arm",
      positive_control_arm="zz",  # misspelt: the arms are t, c, z
  )
  with pytest.raises(harness.UsageError, match="positive_control_arm='zz'"):
    harness.cli(
        ["--root", str(tmp_path)],
        here=str(tmp_path),
        title="x",
        arms_fn=lambda smoke: {"t": None, "c": None, "z": None},
        spec=spec,
    )
  assert not list(tmp_path.iterdir())  # refused before any work


def test_room_metrics_on_hand_made_groups(monkeypatch):
  # Two groups of four episodes. Group 0 (easy): calls [0, 0, 1, 0], correct
  # [1, 0, 1, 0]; group 1 (hard): calls [1, 0, 1, 1], correct [1, 0, 1, 1].
  # Easy zero-call episodes: 3, one correct -> direct easy accuracy 1/3 (the
  # hard group's zero-call episode does not count). Groups with a correct
  # zero-call episode: group 0 only -> 1/2.
  from experiments import harness  # pylint: disable=g-import-not-at-top

  facts = {
      "correct": [[1, 0, 1, 0], [1, 0, 1, 1]],
      "num_tool_calls": [[0, 0, 1, 0], [1, 0, 1, 1]],
      "hard": [[0, 0, 0, 0], [1, 1, 1, 1]],
  }
  facts = {k: np.asarray(v, float) for k, v in facts.items()}
  monkeypatch.setattr(harness, "sample_groups", lambda config, params: facts)
  assert harness.room_direct_easy_accuracy(None, None) == pytest.approx(1 / 3)
  assert harness.room_correct_zero_call_groups(None, None) == 0.5
  # No easy episode without a call: no room (0), not a division by zero.
  facts["num_tool_calls"][0] = 1
  assert harness.room_direct_easy_accuracy(None, None) == 0.0


@pytest.mark.parametrize(
    "stem,room_only,want",
    [
        (None, False, "results"),
        (None, True, "room_check"),
        ("results_faithful", False, "results_faithful"),
        ("results_faithful", True, "results_faithful_room_check"),
    ],
)
def test_cli_output_stem_of_first_and_further_claims(
    tmp_path, monkeypatch, stem, room_only, want
):
  # A further claim of a folder (its runner passes stem=...) with
  # --room_only gets its own room-check stem; before, cli passed 'stem'
  # twice (TypeError) and would have overwritten the first claim's file.
  from experiments import harness  # noqa: PLC0415

  seen = {}
  monkeypatch.setattr(
      harness, "run_claim", lambda *a, **kw: seen.update(kw) or {}
  )
  kwargs = dict(title="t", arms_fn=lambda smoke: {"a": None, "b": None})
  if stem:
    kwargs["stem"] = stem
  argv = ["--smoke", f"--root={tmp_path}"] + (
      ["--room_only"] if room_only else []
  )
  harness.cli(argv, here=str(tmp_path), prog="experiments.x", **kwargs)
  assert seen["stem"] == want


@pytest.mark.parametrize("seeds", ["0,0", ",", "1,2,1"])
def test_cli_refuses_empty_or_repeated_seeds(tmp_path, seeds):
  from experiments import harness  # noqa: PLC0415

  with pytest.raises(harness.UsageError, match="distinct seeds"):
    harness.cli(
        [f"--seeds={seeds}", f"--root={tmp_path}"],
        here=str(tmp_path),
        prog="experiments.x",
        title="t",
        arms_fn=lambda smoke: {"a": None},
    )


def _strict_loads(text):
  """json.loads that refuses NaN / Infinity literals, as strict parsers do."""

  def refuse(name):
    raise ValueError(f"non-standard JSON literal {name}")

  return json.loads(text, parse_constant=refuse)


def test_strict_json_writes_missing_metrics_as_null():
  import jax.numpy as jnp  # noqa: PLC0415

  from agentic_rl import metrics  # noqa: PLC0415

  obj = {
      "rows": {
          "a": {
              "tool_productivity": float("nan"),
              "acc": np.float32(0.25),
              "n": np.int64(3),
              "ok": np.bool_(True),
              "ci": (-np.inf, 1.5),
              "k": jnp.int32(2),
              "flag": jnp.array(True),
              "curve": np.array([0.5, np.nan]),
          }
      },
      "note": "x",
      "none": None,
  }
  text = json.dumps(metrics.strict_json(obj), allow_nan=False)
  assert _strict_loads(text) == {
      "rows": {
          "a": {
              "tool_productivity": None,
              "acc": 0.25,
              "n": 3,
              "ok": True,
              "ci": [None, 1.5],
              "k": 2,
              "flag": True,
              "curve": [0.5, None],
          }
      },
      "note": "x",
      "none": None,
  }
  with pytest.raises(ValueError, match="NaN"):
    _strict_loads(json.dumps({"x": float("nan")}))


def test_committed_experiment_json_files_are_strict_json():
  import glob  # noqa: PLC0415
  import os  # noqa: PLC0415

  root = os.path.join(os.path.dirname(os.path.dirname(__file__)), "experiments")
  paths = glob.glob(os.path.join(root, "*", "*.json"))
  assert len(paths) >= 15
  for path in paths:
    with open(path) as f:
      _strict_loads(f.read())
