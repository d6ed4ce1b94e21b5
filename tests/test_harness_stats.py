"""Paired statistics, verdict rule and ClaimSpec of experiments/stats.py, checked
against hand-computed values and a printed Student-t table."""

import dataclasses
import json
import math
import os
import types

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


def _effect(ci, n=8):
  """A paired effect whose n differences all equal the middle of `ci` (all
  on one side of any bound outside ci: sign-flip p = 2 / 2^n there)."""
  mid = (ci[0] + ci[1]) / 2
  return {"ci": list(ci), "diffs": [mid] * n}


@pytest.mark.parametrize(
    "ci,prediction,hib,margin,expected",
    [
        ((0.1, 0.5), "better", True, None, "supported"),
        ((0.1, 0.5), "higher", False, None, "supported"),
        ((-0.5, -0.1), "better", True, None, "contradicted"),
        ((-0.1, 0.5), "better", True, None, "inconclusive"),
        ((-0.5, -0.1), "better", False, None, "supported"),
        ((-0.5, -0.1), "lower", True, None, "supported"),
        ((0.1, 0.5), "worse", True, None, "contradicted"),
        # Directional claim whose effect is bounded inside the margin: no effect.
        ((-0.01, 0.02), "better", True, 0.05, "contradicted"),
        ((-0.01, 0.08), "better", True, 0.05, "inconclusive"),
        # Parity claims.
        ((-0.03, 0.04), "equivalent", True, 0.05, "supported"),
        ((-0.03, 0.06), "equivalent", True, 0.05, "inconclusive"),
        ((0.06, 0.2), "equivalent", True, 0.05, "contradicted"),
        ((-0.2, -0.07), "equivalent", True, 0.05, "contradicted"),
        # Non-inferiority: not worse by the margin or more.
        ((-0.04, 0.3), "noninferior", True, 0.05, "supported"),
        ((-0.3, 0.04), "noninferior", False, 0.05, "supported"),
        ((-0.3, -0.06), "noninferior", True, 0.05, "contradicted"),
        ((-0.06, 0.3), "noninferior", True, 0.05, "inconclusive"),
    ],
)
def test_part_verdict_rule(ci, prediction, hib, margin, expected):
  out = stats.part_verdict(_effect(ci), prediction, hib, margin)
  assert out["verdict"] == expected
  assert 0 < out["p"] <= 1


def test_part_verdict_errors():
  e = _effect((-0.1, 0.1))
  with pytest.raises(ValueError, match="needs a margin"):
    stats.part_verdict(e, "equivalent")
  with pytest.raises(ValueError, match="prediction='faster'"):
    stats.part_verdict(e, "faster")
  with pytest.raises(ValueError, match="ci="):
    stats.part_verdict({"ci": [0.3, 0.1], "diffs": [0.2, 0.2]}, "better")
  with pytest.raises(ValueError, match="margin=0"):
    stats.part_verdict(e, "better", margin=0)


def test_sign_flip_p_by_hand():
  # [1, 2, 3]: the 8 sign patterns sum to 6, 4, 2, 0, 0, -2, -4, -6; two
  # reach |6|: p = 2/8.
  assert stats.sign_flip_p([1.0, 2.0, 3.0]) == 0.25
  # [2, -1, 3]: sums 4, -2, 6, 0, 0, -6, 2, -4; four reach |4|: p = 4/8.
  assert stats.sign_flip_p([2.0, -1.0, 3.0]) == 0.5
  # An observed sum of 0 (or all differences at the null): p = 1.
  assert stats.sign_flip_p([1.0, -1.0]) == 1.0
  assert stats.sign_flip_p([1.0, 2.0, 3.0], shift=2.0) == 1.0
  # The floor 2 / 2^n: every difference on one side.
  assert stats.sign_flip_p([0.1] * 8) == 2 / 256
  assert stats.sign_flip_p([-5.0] * 5) == 2 / 32
  # Shifted null: [1, 2, 3] - 0.5 = [0.5, 1.5, 2.5], still one side.
  assert stats.sign_flip_p([1.0, 2.0, 3.0], shift=0.5) == 0.25
  with pytest.raises(ValueError, match="2\\^n"):
    stats.sign_flip_p([1.0] * (stats.MAX_SIGN_FLIP_N + 1))
  with pytest.raises(ValueError, match="non-finite"):
    stats.sign_flip_p([1.0, float("inf")])


def test_holm_by_hand():
  # Sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1: 0.02, 0.03, 0.06, 0.04;
  # the running maximum lifts the last to 0.06.
  assert stats.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx(
      [0.03, 0.06, 0.06, 0.02]
  )
  assert stats.holm([0.5, 0.9]) == [1.0, 1.0]  # capped at 1
  assert stats.holm([0.2]) == [0.2]
  assert stats.holm([]) == []
  with pytest.raises(ValueError, match="\\[0, 1\\]"):
    stats.holm([0.1, 1.5])


def test_t_interval_and_sign_flip_must_agree():
  # [1, 2, 3, 4, 5]: mean 3, SE sqrt(2.5 / 5) = 0.7071, t_4 = 2.776:
  # CI [1.037, 4.963] excludes 0, but 5 seeds cannot reach p <= 0.05 (floor
  # 2/32 = 0.0625): not supported.
  e = stats.paired_difference([1.0, 2.0, 3.0, 4.0, 5.0], [0.0] * 5)
  assert e["ci"][0] == pytest.approx(3 - 2.776445 * math.sqrt(0.5), abs=1e-5)
  assert e["sign_flip_p"] == 2 / 32 == e["sign_flip_floor"]
  assert stats.part_verdict(e, "better")["verdict"] == "inconclusive"
  # Zero variance (every difference 0.1): a zero-width interval at 0.1, but
  # with 4 seeds the sign-flip p is 2/16 = 0.125: not supported either;
  # with 8 seeds, 2/256: supported.
  e4 = stats.paired_difference([0.1, 0.6, 0.9, 0.4], [0.0, 0.5, 0.8, 0.3])
  assert e4["zero_variance"] and e4["se"] == 0.0
  assert e4["sign_flip_p"] == 2 / 16
  assert stats.part_verdict(e4, "better")["verdict"] == "inconclusive"
  e8 = stats.paired_difference([1.0] * 8, [0.0] * 8)
  assert e8["zero_variance"] and e8["ci"] == [1.0, 1.0]
  assert stats.part_verdict(e8, "better") == {
      "verdict": "supported",
      "p": 2 / 256,
      "tests": {"0": 2 / 256},
  }


def test_paired_difference_clips_to_the_metric_range():
  # Accuracies: diffs [-1, -1, 0.8], mean -0.4, sample std sqrt(1.08), SE
  # 0.6, t_2 = 4.3027: t interval [-2.982, 2.182], clipped to [-1, 1].
  e = stats.paired_difference(
      [0.0, 0.0, 0.9], [1.0, 1.0, 0.1], metric_range=(0.0, 1.0)
  )
  assert e["se"] == pytest.approx(0.6)
  half = 4.302653 * 0.6
  assert e["ci_t"] == pytest.approx([-0.4 - half, -0.4 + half], abs=1e-5)
  assert e["ci"] == [-1.0, 1.0] and e["ci_clipped"] is True
  assert e["diff_range"] == [-1.0, 1.0]
  # An end inside the range is kept; an unbounded range clips nothing.
  # diffs [-0.9, -0.6, -1.0]: mean -0.8333, SE 0.1202, t interval
  # [-1.350, -0.316].
  e = stats.paired_difference(
      [0.0, 0.3, 0.0], [0.9, 0.9, 1.0], metric_range=(0.0, 1.0)
  )
  assert e["ci_t"][0] == pytest.approx(-1.3505, abs=1e-3)
  assert e["ci"][1] == e["ci_t"][1] and e["ci"][0] == -1.0
  e = stats.paired_difference(
      [0.0, 0.0, 9.0], [5.0, 5.0, 1.0], metric_range=(0.0, None)
  )
  assert e["ci_clipped"] is False and e["diff_range"] is None


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
  a = stats.analyse(spec, rows, [0.3, 0.25, 0.35])
  assert a["effect"]["mean"] == pytest.approx(-0.5)
  assert a["effect"]["se"] == pytest.approx(0.1 / math.sqrt(3))
  assert a["effect"]["ci"][1] == pytest.approx(
      -0.5 + 4.302653 * 0.057735, abs=1e-4
  )
  assert a["room"] == {
      "metric": "zero_call_groups",
      "value": pytest.approx(0.3),
      "per_seed": [0.3, 0.25, 0.35],
      "threshold": 0.2,
      "ok": True,
      "failing": [],
  }
  # The t interval excludes 0, but 3 seeds cannot reach the sign-flip test's
  # level (floor 2/8 = 0.25): inconclusive.
  assert a["effect"]["ci"][1] < 0 and a["p_claim"] == 0.25
  assert a["verdict"] == "inconclusive"
  assert a["spec_hash"] == stats.spec_hash(spec.to_json())
  # Every seed must leave room: one seed below the threshold (mean 0.3 above
  # it) or one seed without a value is no room; so is no value at all.
  for per_seed, failing in (
      ([0.5, 0.3, 0.1], [2]),
      ([0.5, None, 0.4], [1]),
      (None, []),
  ):
    low_room = stats.analyse(spec, rows, per_seed)
    assert low_room["room"]["ok"] is False
    assert low_room["room"]["failing"] == failing
    assert low_room["verdict"] == "untestable at this setup"
  text = stats.format_analysis(stats.analyse(spec, rows, [0.5, 0.3, 0.1]))
  assert "-0.500" in text and "NO room" in text and "untestable" in text


def test_claimspec_errors():
  with pytest.raises(ValueError, match="prediction='faster'"):
    stats.ClaimSpec("acc", True, "r", 0.1, prediction="faster")
  with pytest.raises(ValueError, match="needs a margin"):
    stats.ClaimSpec("acc", True, "r", 0.1, prediction="equivalent")
  spec = stats.ClaimSpec("acc", True, "r", 0.1, treatment="a", control="b")
  with pytest.raises(ValueError, match="arm 'a'"):
    stats.analyse(spec, {"b": [{"acc": 1.0}]}, [0.5])
  with pytest.raises(ValueError, match="parts\\[0\\].metric='x'"):
    stats.ClaimSpec("acc", True, "r", 0.1, parts=(stats.Part("x"),))
  with pytest.raises(ValueError, match="needs a margin"):
    stats.Part("acc", "noninferior")
  with pytest.raises(ValueError, match="metric_range"):
    stats.Part("acc", metric_range=(1.0, 0.0))
  with pytest.raises(ValueError, match="positive_control_arm 'z'"):
    stats.ClaimSpec(
        "acc",
        True,
        "r",
        0.1,
        positive_control_arm="z",
        positive_control_check=stats.Part("acc", treatment="y", control="b"),
    )


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
  a = stats.analyse(
      spec, {"SFT (start)": [{"acc": 0.9}, {"acc": 0.95}]}, [0.1, 0.1]
  )
  assert a["effect"] is None and a["verdict"] == "untestable at this setup"
  assert a["room"] == {
      "metric": "headroom",
      "value": 0.1,
      "per_seed": [0.1, 0.1],
      "threshold": 0.3,
      "ok": False,
      "failing": [0, 1],
  }
  assert "not run" in stats.format_analysis(a)
  with pytest.raises(ValueError, match="arm 'a'"):
    stats.analyse(spec, {"b": [{"acc": 1.0}, {"acc": 1.0}]}, [0.5, 0.5])


def test_room_only_analysis_and_summary_row():
  spec = stats.ClaimSpec(
      "acc", True, "headroom", 0.3, treatment="a", control="b"
  )
  a = stats.room_only_analysis(spec, [0.45, 0.45])
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
  analysis = stats.analyse(spec, rows, [0.4, 0.4])
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
  assert r["room"] == (
      "headroom = 0.400, lowest seed 0.400 (threshold 0.3: room in every seed)"
  )
  # diffs [0.4, 0.2]: sign-flip p 2/4, the floor of 2 seeds.
  assert r["p"] == "0.5000 (floor 2/2^2)" and r["_p"] == 0.5
  # A run whose room has no per-seed values says so.
  no_per_seed = dict(results, analysis=None)
  assert "per-seed values not recorded" in (
      summary.row("x", no_per_seed, None)["room"]
  )
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
      "analysis": stats.analyse(spec, {}, [0.1, 0.1, 0.1]),
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
          [0.5, 0.5],
      ),
      room_only=False,
  )
  (folder / "results.json").write_text(json.dumps(decided))
  text = summary.table(claims=("dark_room",), root=str(tmp_path), extra=())
  assert "+0.500" in text and "room check only" not in text


def test_bad_runner_flags_are_one_line_errors(monkeypatch, capsys):
  import subprocess  # noqa: PLC0415
  import sys  # noqa: PLC0415

  from experiments import harness  # noqa: PLC0415

  # A claim's own process (python -m: the folder's __main__ through
  # claim_main): an unknown arm is one line on stderr, exit status 2.
  argv = ["-m", "experiments.dark_room", "--smoke", "--arms=bogus"]
  proc = subprocess.run(
      [sys.executable, *argv],
      capture_output=True,
      text=True,
      timeout=300,
      env=dict(os.environ, AGENTIC_RL_JEMALLOC="0"),
  )
  assert proc.returncode == 2, proc.stderr
  assert proc.stderr.strip().startswith(
      "error: --arms: unknown arm(s) ['bogus']"
  ), proc.stderr
  assert "Traceback" not in proc.stderr
  # A malformed --seeds through the same claim_main (sys.argv, the stderr
  # line, the exit status), in this process: a second interpreter start-up
  # (seconds of imports) would only repeat the path checked just above.
  monkeypatch.setattr(sys, "argv", ["dark_room", "--smoke", "--seeds=a,b"])
  with pytest.raises(SystemExit) as exit_info:
    harness.claim_main(
        os.path.join(harness.REPO, "experiments", "dark_room", "__main__.py"),
        title="t",
        arms_fn=lambda smoke: {"a": None},
    )
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert err.strip().startswith(
      "error: --seeds must be comma-separated integers"
  ), err
  assert "Traceback" not in err


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
  # A consistent gain over 4 seeds: its t interval excludes 0, but 4 seeds
  # cannot reach the sign-flip test's level (floor 2/16 = 0.125):
  # inconclusive; the same gain over 6 seeds is supported (p = 2/64).
  reports.append(_bon(0.35, 0.45, 0.40, 0.90))
  reports[0] = _bon(0.40, 0.48, 0.50, 0.90)
  _, a = rm_sel.analyse([rm_sel.seed_summary(r) for r in reports])
  assert a["effect"]["ci"][0] > 0 and a["p_claim"] == 2 / 16
  assert a["verdict"] == "inconclusive"
  reports += [_bon(0.35, 0.45, 0.40, 0.90), _bon(0.40, 0.49, 0.50, 0.90)]
  _, a = rm_sel.analyse([rm_sel.seed_summary(r) for r in reports])
  assert a["p_claim"] == 2 / 64 and a["verdict"] == "supported"


def test_rm_selection_kv_needs_the_outcome_rm_above_random():
  from experiments.rm_selection import __main__ as rm_sel

  spec = rm_sel.SPEC_KV
  # 8 seeds, the process RM worse than the outcome RM on every seed (PRM -
  # ORM = -0.1 each: zero variance, sign-flip p = 2/256 <= 0.05, so the part
  # is contradicted).
  # (a) ORM above random on every seed (+0.2 each): the control is shown ->
  # contradicted.
  good = [rm_sel.seed_summary(_bon(0.5, 0.4, 0.3, 0.9)) for _ in range(8)]
  rows = rm_sel.rows_of(good, spec)
  assert set(rows) == {"process RM", "outcome RM", "random pick"}
  assert [r[spec.primary_metric] for r in rows["random pick"]] == [0.3] * 8
  _, a = rm_sel.analyse(good, spec)
  assert a["parts"][0]["verdict"] == "contradicted"
  assert a["positive_control"]["shown"] is True
  assert a["verdict"] == "contradicted"
  # (b) the same RMs picking below a random sample (0.5 vs 0.6): the control
  # is not shown -> the setup cannot show the effect.
  bad = [rm_sel.seed_summary(_bon(0.5, 0.4, 0.6, 0.9)) for _ in range(8)]
  _, a = rm_sel.analyse(bad, spec)
  assert a["positive_control"]["shown"] is False
  assert a["verdict"] == "inconclusive: the setup cannot show the effect"
  # The arithmetic claim declares no check: no 'random pick' rows, and the
  # same data is contradicted-free (no control: cannot be contradicted).
  assert "random pick" not in rm_sel.rows_of(good)
  assert rm_sel.analyse(good)[1]["verdict"] != "contradicted"
  assert spec.to_json()["spec_hash"] != rm_sel.SPEC.to_json()["spec_hash"]


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
  asked = []

  def fake_sample_groups(config, params, num_groups=None):
    asked.append(num_groups)
    return facts

  monkeypatch.setattr(harness, "sample_groups", fake_sample_groups)
  assert harness.room_direct_easy_accuracy(None, None) == pytest.approx(1 / 3)
  assert harness.room_correct_zero_call_groups(None, None) == 0.5
  # The 8x form: the same value from 8 x (num_tasks // 4) groups (512 at the
  # claims' full size, num_tasks 256).
  big = types.SimpleNamespace(eval=types.SimpleNamespace(num_tasks=256))
  assert harness.room_direct_easy_accuracy_8x(big, None) == pytest.approx(1 / 3)
  assert asked[-1] == 512
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


@pytest.mark.parametrize("seeds", ["0,0", ",", "1,2,1", ""])
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


def _compound_spec(check=None):
  """otc-like compound claim: calls lower, accuracy within 0.05."""
  return stats.ClaimSpec(
      "calls",
      False,
      "room",
      0.3,
      treatment="t",
      control="c",
      parts=(
          stats.Part("calls", "better", higher_is_better=False),
          stats.Part("acc", "equivalent", margin=0.05, metric_range=(0.0, 1.0)),
      ),
      positive_control_arm="" if check is None else check.treatment,
      positive_control_check=check,
  )


def _rows(acc_shift, n=8):
  """Control c: 1 call, accuracy 0.9; treatment t: 0 calls, accuracy 0.9 +
  acc_shift + a small zero-mean wiggle; z: 1 call less than c on 'hard'."""
  wiggle = [0.01, -0.01, 0.02, -0.02, 0.0, 0.01, -0.01, 0.0][:n]
  return {
      "c": [{"calls": 1.0, "acc": 0.9, "hard": 1.0} for _ in range(n)],
      "t": [{"calls": 0.0, "acc": 0.9 + acc_shift + w} for w in wiggle],
      "z": [{"calls": 1.0, "acc": 0.5, "hard": 0.0} for _ in range(n)],
  }


def test_compound_claim_needs_every_part_and_a_shown_control():
  room = [0.5] * 8
  spec = _compound_spec()
  # Calls: diffs all -1 (zero variance), sign-flip p 2/256. Accuracy: diffs
  # = the wiggle, mean 0, inside (-0.05, 0.05); the tests at -0.05 and 0.05
  # see one sign only: p 2/256 each. Both parts supported.
  a = stats.analyse(spec, _rows(0.0), room)
  assert [p["verdict"] for p in a["parts"]] == ["supported", "supported"]
  assert a["parts"][0]["effect"]["zero_variance"] is True
  assert a["p_claim"] == 2 / 256 and a["verdict"] == "supported"
  # Accuracy 0.2 lower: the equivalence part is contradicted; without a
  # declared positive control the claim is not contradicted.
  a = stats.analyse(spec, _rows(-0.2), room)
  assert [p["verdict"] for p in a["parts"]] == ["supported", "contradicted"]
  assert a["positive_control"] == {"declared": False, "shown": False}
  assert a["verdict"] == stats.CANNOT_SHOW
  # With a check whose arm ran and showed its effect: contradicted.
  check = stats.Part("hard", "lower", treatment="z", control="c")
  spec = _compound_spec(check)
  a = stats.analyse(spec, _rows(-0.2), room)
  assert a["positive_control"]["shown"] is True
  assert a["verdict"] == "contradicted"
  # The control arm not in the decision run: cannot show the effect.
  rows = _rows(-0.2)
  del rows["z"]
  a = stats.analyse(spec, rows, room)
  assert a["positive_control"]["verdict"] == stats.NOT_RUN
  assert a["verdict"] == stats.CANNOT_SHOW
  # A control that ran but did not show its effect (z = c): the same.
  rows["z"] = rows["c"]
  assert stats.analyse(spec, rows, room)["verdict"] == stats.CANNOT_SHOW
  # A part whose arm was not run: not supported, no claim p-value.
  spec3 = dataclasses.replace(
      spec,
      parts=spec.parts
      + (stats.Part("calls", "equivalent", margin=0.1, treatment="small"),),
  )
  a = stats.analyse(spec3, _rows(0.0), room)
  assert a["parts"][2]["verdict"] == stats.NOT_RUN
  assert a["parts"][2]["missing"] == ["small"]
  assert a["p_claim"] is None and a["verdict"] == "inconclusive"
  assert spec3.arms == ["t", "c", "small", "z"]
  text = stats.format_analysis(a)
  assert "Part 3" in text and "not run" in text and "zero variance" in text


def test_spec_hash_tracks_the_decision_not_the_wording():
  spec = _compound_spec()
  h = stats.spec_hash(spec.to_json())
  assert spec.to_json()["spec_hash"] == h and len(h) == 10
  # Wording, departures and metric ranges do not change the version ...
  same = dataclasses.replace(spec, claim="other words", departures=("d",))
  assert stats.spec_hash(same.to_json()) == h
  # ... a margin, a room threshold or a control check does.
  for changed in (
      dataclasses.replace(spec, room_threshold=0.4),
      dataclasses.replace(
          spec,
          parts=(spec.parts[0], dataclasses.replace(spec.parts[1], margin=0.1)),
      ),
      _compound_spec(stats.Part("hard", "lower", treatment="z", control="c")),
  ):
    assert stats.spec_hash(changed.to_json()) != h
  # A spec recorded before parts existed hashes like its one-part form.
  single = stats.ClaimSpec("acc", True, "r", 0.1, treatment="a", control="b")
  old = {
      k: v
      for k, v in single.to_json().items()
      if k not in ("parts", "positive_control_check", "metric_range")
  }
  assert stats.spec_hash(old) == stats.spec_hash(single.to_json())


def test_ledger_carries_runs_and_replaces_a_resumed_one(tmp_path):
  from experiments import harness  # noqa: PLC0415

  spec = stats.ClaimSpec("acc", True, "r", 0.1, treatment="t", control="c")
  rows = {"t": [{"acc": 1.0}, {"acc": 0.9}], "c": [{"acc": 0.5}] * 2}
  legacy = {
      "commit": "aaa",
      "seeds": [0, 1],
      "spec": spec.to_json(),
      "analysis": stats.analyse(spec, rows, [0.5, 0.5]),
      "command": "python -m experiments.x",
      "rows": rows,
  }
  path = tmp_path / "results.json"
  path.write_text(json.dumps(legacy))
  new = dict(legacy, commit="bbb", date="2026-12-04 10:00 UTC")
  ledger = harness.carry_ledger(str(path), harness.ledger_entry(new))
  # The file from before the ledger existed contributes its own run.
  assert [e["commit"] for e in ledger] == ["aaa", "bbb"]
  assert ledger[1] == {
      "kind": "decision run",
      "date": "2026-12-04 10:00 UTC",
      "commit": "bbb",
      "spec_hash": stats.spec_hash(spec.to_json()),
      "config_hash": None,
      "seeds": [0, 1],
      "verdict": "inconclusive",
      "rules": stats.RULES,
      "command": "python -m experiments.x",
  }
  path.write_text(json.dumps(dict(new, ledger=ledger)))
  # The same run again (resumed workdirs): replaced, not appended.
  again = harness.carry_ledger(str(path), harness.ledger_entry(new))
  assert [e["commit"] for e in again] == ["aaa", "bbb"]
  # Config hashes: recorded in the entry; a run whose arms ran another
  # setup is appended, the same setup again replaces it.
  v2 = dict(new, config_hash={"t": "x1"})
  path.write_text(json.dumps(dict(v2, ledger=again)))
  same = harness.carry_ledger(str(path), harness.ledger_entry(v2))
  assert [e["config_hash"] for e in same] == [None, {"t": "x1"}]
  path.write_text(json.dumps(dict(v2, ledger=same)))
  v3 = dict(new, config_hash={"t": "x2"})
  more = harness.carry_ledger(str(path), harness.ledger_entry(v3))
  assert [e["config_hash"] for e in more] == [None, {"t": "x1"}, {"t": "x2"}]
  # The attempts column numbers versions by spec and setup: the same spec
  # hash under three setups (one unrecorded) is three versions.
  from experiments import summary  # noqa: PLC0415

  h = stats.spec_hash(spec.to_json())
  assert summary.attempts(more, h) == (
      "3 decision runs: run 1 v1 (?): inconclusive; run 2 v2 (2026-12-04 "
      "10:00 UTC): inconclusive; run 3 v3 (2026-12-04 10:00 UTC): "
      "inconclusive"
  )


def _git(repo, *args):
  import subprocess  # noqa: PLC0415

  subprocess.run(
      ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
      cwd=repo,
      check=True,
      capture_output=True,
  )


def test_ledger_from_git_and_redecide(tmp_path):
  # Three committed versions of a results file: a room check (not a decision
  # run), a first decision run, the same run re-committed (counted once),
  # then a second run with another spec. redecide adds one re-decision entry
  # (replaced, not repeated, when run again) and keeps what was recorded.
  from experiments import harness  # noqa: PLC0415

  repo = tmp_path
  _git(repo, "init", "-q")
  folder = repo / "experiments" / "x"
  folder.mkdir(parents=True)
  path = folder / "results.json"
  spec1 = stats.ClaimSpec("acc", True, "r", 0.1, treatment="t", control="c")
  spec2 = dataclasses.replace(spec1, room_threshold=0.2)
  rows = {
      "t": [{"acc": 1.0}] * 8,
      "c": [{"acc": 0.5 + 0.01 * i} for i in range(8)],
  }

  def commit(d, msg):
    path.write_text(json.dumps(d))
    (folder / "results.md").write_text("# x\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", msg)

  base = {"seeds": list(range(8)), "rows": rows, "command": "c"}
  commit(
      dict(
          base,
          room_only=True,
          spec=spec1.to_json(),
          analysis=stats.room_only_analysis(spec1, [0.5] * 8),
          commit="r0",
      ),
      "room check",
  )
  run1 = dict(
      base,
      spec=spec1.to_json(),
      commit="c1",
      analysis=stats.analyse(spec1, rows, [0.5] * 8),
  )
  commit(run1, "run 1")
  commit(dict(run1, note="reformatted"), "run 1 again")
  run2 = dict(
      base,
      spec=spec2.to_json(),
      commit="c2",
      analysis=stats.analyse(spec2, rows, [0.15] + [0.5] * 7),
      room={"per_seed": [0.15] + [0.5] * 7},
  )
  commit(run2, "run 2")
  ledger = harness.ledger_from_git(str(path), str(repo))
  assert [(e["commit"], e["verdict"], e["date_of"]) for e in ledger] == [
      ("c1", "supported", "recording commit"),
      ("c2", "untestable at this setup", "recording commit"),
  ]
  assert ledger[0]["spec_hash"] != ledger[1]["spec_hash"]
  for _ in range(2):
    res = harness.redecide(str(path), spec1, note="why", repo=str(repo))
  assert [e["kind"] for e in res["ledger"]] == [
      "decision run",
      "decision run",
      "re-decision",
  ]
  redo = res["ledger"][-1]
  assert redo["data_of"] == 2 and redo["commit"] == "c2"
  assert redo["spec_hash"] == ledger[0]["spec_hash"]
  # spec1's threshold 0.1: seed 0's 0.15 is room now; diffs 0.5 - 0.01 i
  # all positive: p 2/256, supported.
  assert res["analysis"]["verdict"] == "supported"
  assert res["analysis_as_recorded"]["verdict"] == "untestable at this setup"
  assert res["spec_as_recorded"]["room_threshold"] == 0.2
  md = (folder / "results.md").read_text()
  assert md.count(harness.REDECIDED_MARKER) == 1 and "why" in md
  assert "**Verdict: supported.**" in md
  from experiments import summary  # noqa: PLC0415

  text = summary.attempts(res["ledger"], stats.spec_hash(spec2.to_json()))
  assert text == (
      "2 decision runs: run 1 v1 (2026-12-04): supported; run 2 v2 "
      f"({ledger[1]['date']}): untestable at this setup; re-decided "
      f"{redo['date']} as v1 (rules 2) from run 2's data: supported"
  ).replace("2026-12-04", ledger[0]["date"], 1)
  assert "not yet decided" in summary.attempts(res["ledger"], "0123456789")


def test_require_clean_tree(tmp_path, monkeypatch):
  from experiments import harness  # noqa: PLC0415

  repo = tmp_path
  _git(repo, "init", "-q")
  (repo / "experiments" / "x").mkdir(parents=True)
  (repo / "code.py").write_text("a = 1\n")
  (repo / "experiments" / "x" / "results.json").write_text("{}")
  _git(repo, "add", "-A")
  _git(repo, "commit", "-q", "-m", "init")
  harness.require_clean_tree(str(repo))
  # Results files may differ (a run rewrites them) ...
  (repo / "experiments" / "x" / "results.json").write_text('{"a": 1}')
  (repo / "experiments" / "x" / "room_check.md").write_text("x")
  harness.require_clean_tree(str(repo))
  assert not harness.git_commit(str(repo)).endswith("-dirty")
  # ... code may not, tracked or untracked.
  (repo / "code.py").write_text("a = 2\n")
  (repo / "new.py").write_text("b = 1\n")
  with pytest.raises(harness.UsageError, match="clean git tree.*code.py"):
    harness.require_clean_tree(str(repo))
  assert harness.dirty_paths(str(repo)) == ["code.py", "new.py"]
  with pytest.raises(harness.UsageError, match="git checkout"):
    harness.require_clean_tree(str(tmp_path / "nowhere"))
  # cli: a decision run (no --smoke) from a dirty tree is refused before any
  # work; --smoke is not.
  monkeypatch.setattr(harness, "dirty_paths", lambda repo=None: ["code.py"])
  ran = []
  monkeypatch.setattr(harness, "run_claim", lambda *a, **kw: ran.append(a))
  kwargs = _cli_kwargs(tmp_path)
  with pytest.raises(harness.UsageError, match="clean git tree"):
    harness.cli([f"--root={tmp_path}", "--seeds=0,1,2,3,4,5"], **kwargs)
  assert not ran
  harness.cli(["--smoke", f"--root={tmp_path}"], **kwargs)
  assert len(ran) == 1


def test_cli_keeps_every_arm_the_verdict_needs(tmp_path, monkeypatch):
  # --arms=t still trains c (the control), small (a part's arm) and z (the
  # positive control), not the unrelated arm u.
  from experiments import harness  # noqa: PLC0415

  seen = {}
  monkeypatch.setattr(
      harness, "run_claim", lambda title, arms, *a, **kw: seen.update(arms)
  )
  spec = _compound_spec(stats.Part("hard", "lower", treatment="z", control="c"))
  spec = dataclasses.replace(
      spec,
      parts=spec.parts
      + (stats.Part("calls", "equivalent", margin=0.1, treatment="small"),),
  )
  arms = {a: None for a in ("t", "c", "small", "z", "u")}
  harness.cli(
      ["--smoke", f"--root={tmp_path}", "--arms=t"],
      here=str(tmp_path),
      prog="experiments.x",
      title="t",
      arms_fn=lambda smoke: arms,
      spec=spec,
  )
  assert sorted(seen) == ["c", "small", "t", "z"]
  with pytest.raises(harness.UsageError, match=r"arm\(s\) \['small'\]"):
    harness.cli(
        ["--smoke", f"--root={tmp_path}"],
        here=str(tmp_path),
        prog="experiments.x",
        title="t",
        arms_fn=lambda smoke: {a: None for a in ("t", "c", "z")},
        spec=spec,
    )


def test_summary_holm_column_over_decided_rows(tmp_path):
  # Two decided claims with sign-flip p 2/256 and 2/16 and one untestable:
  # Holm over the two decided ones, 2 x 2/256 = 0.0156 and 0.125.
  from experiments import summary  # noqa: PLC0415

  spec = stats.ClaimSpec("acc", True, "r", 0.3, treatment="t", control="c")

  def results(n, room):
    rows = {"t": [{"acc": 1.0}] * n, "c": [{"acc": 0.5}] * n}
    return {
        "spec": spec.to_json(),
        "analysis": stats.analyse(spec, rows, [room] * n),
        "seeds": list(range(n)),
        "rows": rows,
    }

  for name, res in (
      ("dark_room", results(8, 0.5)),
      ("reward_noise", results(4, 0.5)),
      ("length_bias", results(8, 0.1)),
  ):
    (tmp_path / name).mkdir()
    (tmp_path / name / "results.json").write_text(json.dumps(res))
  text = summary.table(
      claims=("dark_room", "reward_noise", "length_bias"),
      root=str(tmp_path),
      extra=(),
  )
  lines = text.split("\n")[2:]
  assert "0.016 (of 2)" in lines[0] and "0.0078 (floor 2/2^8)" in lines[0]
  assert "0.125 (of 2)" in lines[1]
  assert "n/a (not decided)" in lines[2] and "untestable" in lines[2]


def test_committed_verdicts_follow_the_declared_specs():
  # Every committed decision of a claim is the declared spec's analysis of
  # its recorded per-seed rows under the current rules, and its ledger ends
  # with that decision.
  import os  # noqa: PLC0415

  from experiments import harness  # noqa: PLC0415
  from experiments import summary  # noqa: PLC0415

  entries = [(n, "results", None) for n in summary.CLAIMS] + list(summary.EXTRA)
  checked = 0
  for name, stem, module in entries:
    path = os.path.join(summary.HERE, name, f"{stem}.json")
    if not os.path.exists(path):  # a declared claim not yet run
      continue
    with open(path) as f:
      res = json.load(f)
    if not harness._is_decision(res):  # pylint: disable=protected-access
      continue
    spec = summary._spec(name, module)  # pylint: disable=protected-access
    rows = res.get("rows")
    if rows is None:
      import importlib  # noqa: PLC0415

      rows = importlib.import_module(f"experiments.{name}.__main__").rows_of(
          res["per_seed"], spec
      )
    fresh = stats.analyse(spec, rows, res["room"]["per_seed"])
    assert res["analysis"]["verdict"] == fresh["verdict"], name
    assert res["analysis"]["spec_hash"] == spec.to_json()["spec_hash"], name
    assert res["ledger"][-1]["verdict"] == fresh["verdict"], name
    checked += 1
  assert checked >= 12


def test_run_claim_seeds_per_call_runs_and_records_one_seed_at_a_time(
    tmp_path, monkeypatch
):
  # seeds_per_call=1 (the pretrained decision run): seed by seed, the start
  # (rl.steps = 0) then the arm, each in its own workdir; rows and curves
  # joined in seed order; the room is computed once per seed and read back
  # from the start's workdir on a re-run; progress.json after every seed.
  import ml_collections  # noqa: PLC0415
  import numpy as np  # noqa: PLC0415

  from experiments import harness  # noqa: PLC0415

  calls, room_calls = [], []

  def fake_train_seeds(config, seeds, workdir, resume_free=()):
    os.makedirs(workdir, exist_ok=True)
    calls.append((config.rl.steps, os.path.basename(workdir), list(seeds)))
    rl = config.rl.steps > 0
    return {
        "params": {"w": np.asarray(seeds, np.float64)[:, None]},
        "sft": [{"acc": 0.1 * s} for s in seeds],
        "rl": [{"acc": 0.1 * s + (0.25 if rl else 0.0)} for s in seeds],
        # Curve of 3 steps: step index + 10 * seed.
        "curves": {"rl/acc": np.arange(3.0)[:, None] + 10.0 * np.asarray(seeds)}
        if rl
        else {},
        "wall_call_s": 2.0,
        "wall_total_s": 2.0,
        "wall_complete": True,
    }

  def room_fn(config, params):
    room_calls.append(float(params["w"][0]))
    return 0.5

  monkeypatch.setattr(harness.seeds_lib, "train_seeds", fake_train_seeds)
  monkeypatch.setattr(harness, "_sft_key", lambda config: "k")
  cfg = ml_collections.ConfigDict(
      {"rl": {"steps": 3}, "sft": {"steps": 2}, "eval": {"num_tasks": 4}}
  )
  spec = stats.ClaimSpec(
      "acc",
      True,
      "mixed",
      0.1,
      treatment="GRPO",
      control="SFT (start)",
      prediction="better",
      metric_range=(0.0, 1.0),
      room_fn=room_fn,
  )
  kw = dict(
      root=str(tmp_path / "root"),
      out_dir=str(tmp_path / "out"),
      metrics=(("acc", "acc"),),
      curve_keys=("rl/acc",),
      spec=spec,
      seeds_per_call=1,
  )
  out = harness.run_claim("t", {"GRPO": cfg}, [0, 1, 2], **kw)
  assert calls == [
      (0, "sft_k_s0", [0]),
      (3, "GRPO_s0", [0]),
      (0, "sft_k_s1", [1]),
      (3, "GRPO_s1", [1]),
      (0, "sft_k_s2", [2]),
      (3, "GRPO_s2", [2]),
  ]
  assert room_calls == [0.0, 1.0, 2.0]
  assert [r["acc"] for r in out["rows"]["SFT (start)"]] == [0.0, 0.1, 0.2]
  np.testing.assert_allclose(
      [r["acc"] for r in out["rows"]["GRPO"]], [0.25, 0.35, 0.45]
  )
  np.testing.assert_array_equal(
      out["curves"]["GRPO"]["rl/acc"],
      [[0, 10, 20], [1, 11, 21], [2, 12, 22]],
  )
  assert out["room"]["per_seed"] == [0.5, 0.5, 0.5] and out["room"]["ok"]
  # Every paired difference is 0.25 (zero variance, flagged by analyse).
  effect = out["analysis"]["parts"][0]["effect"]
  assert effect["mean"] == pytest.approx(0.25) and effect["n"] == 3
  progress = _strict_loads((tmp_path / "root" / "progress.json").read_text())
  assert progress["seeds_done"] == [0, 1, 2]
  assert progress["room_per_seed"] == [0.5, 0.5, 0.5]
  # The arm's workdir copy of the start leaves the start's room file behind.
  assert not list((tmp_path / "root" / "GRPO_s0").glob("room_*.json"))
  # Re-run: the room values are read back, not recomputed.
  harness.run_claim("t", {"GRPO": cfg}, [0, 1, 2], **kw)
  assert room_calls == [0.0, 1.0, 2.0]
  # A room metric declared anew (same function, other text) is computed
  # anew, not read back under the function's name; its records keep both.
  kw2 = dict(kw, spec=dataclasses.replace(spec, room_metric="m, 8x groups"))
  harness.run_claim("t", {"GRPO": cfg}, [0, 1, 2], **kw2)
  assert room_calls == [0.0, 1.0, 2.0] * 2
  rec0 = _strict_loads(
      (tmp_path / "out" / "seed_records" / "sft_k_s0.json").read_text()
  )
  assert len(rec0["room"]) == 2
  # On another machine (no workdirs): every seed comes from the records in
  # the claim folder (out_dir/seed_records), nothing is trained or sampled.
  import shutil  # noqa: PLC0415

  recs = sorted(p.name for p in (tmp_path / "out" / "seed_records").iterdir())
  h = harness.experiment_seeds.config_hash(cfg)[:8]
  assert recs == [
      f"GRPO_s0_{h}.json",
      f"GRPO_s1_{h}.json",
      f"GRPO_s2_{h}.json",
      "sft_k_s0.json",
      "sft_k_s1.json",
      "sft_k_s2.json",
  ]
  shutil.rmtree(tmp_path / "root")
  calls.clear()
  again = harness.run_claim("t", {"GRPO": cfg}, [0, 1, 2], **kw)
  assert calls == [] and room_calls == [0.0, 1.0, 2.0] * 2
  for label in ("SFT (start)", "GRPO"):
    assert again["rows"][label] == out["rows"][label]
  np.testing.assert_array_equal(
      again["curves"]["GRPO"]["rl/acc"], out["curves"]["GRPO"]["rl/acc"]
  )
  assert again["analysis"]["verdict"] == out["analysis"]["verdict"]
  # A further claim declaring a curve mean the records' rows lack gets it
  # from the stored curves (steps 1..2 of step + 10 * seed), still with
  # nothing trained.
  means = harness.run_claim(
      "t",
      {"GRPO": cfg},
      [0, 1, 2],
      **kw,
      curve_means=(("acc_early", "rl/acc", 1, 3),),
  )
  assert calls == []
  assert [r["acc_early"] for r in means["rows"]["GRPO"]] == [1.5, 11.5, 21.5]
  assert "acc_early" not in again["rows"]["GRPO"][0]
  # A record of another config is not used: seed 1's arm is trained again.
  cfg2 = ml_collections.ConfigDict(cfg.to_dict())
  cfg2.rl.lr = 0.5
  harness.run_claim("t", {"GRPO": cfg2}, [1, 2], **kw)
  assert calls == [
      (0, "sft_k_s1", [1]),
      (3, "GRPO_s1", [1]),
      (0, "sft_k_s2", [2]),
      (3, "GRPO_s2", [2]),
  ]
  assert room_calls == [0.0, 1.0, 2.0] * 2  # the starts' records still hold
  # An arm workdir left by another setup of the arm (its config.json says
  # lr 0.5) is kept; the changed setup trains beside it, in a workdir named
  # by its config hash, instead of failing the resume check after the SFT.
  from agentic_rl import seeds as real_seeds  # noqa: PLC0415

  stale = tmp_path / "root" / "GRPO_s0"
  stale.mkdir(parents=True, exist_ok=True)
  (stale / "config.json").write_text(
      real_seeds.config_with_seeds(cfg2, [0]).to_json_best_effort()
  )
  cfg3 = ml_collections.ConfigDict(cfg.to_dict())
  cfg3.rl.lr = 0.25
  calls.clear()
  harness.run_claim("t", {"GRPO": cfg3}, [0], **kw)
  h3 = harness.experiment_seeds.config_hash(cfg3)[:8]
  assert calls == [(0, "sft_k_s0", [0]), (3, f"GRPO_s0_{h3}", [0])]
  assert (stale / "config.json").exists()


def test_run_claim_seeds_per_call_stops_at_the_first_seed_without_room(
    tmp_path, monkeypatch
):
  # stop_without_room with sequential seeds: seed 0 has room and trains its
  # arm; seed 1 has none, so the run stops there (seed 2 is never started),
  # the table holds the two starts only and the verdict is untestable.
  import ml_collections  # noqa: PLC0415
  import numpy as np  # noqa: PLC0415

  from experiments import harness  # noqa: PLC0415

  calls = []

  def fake_train_seeds(config, seeds, workdir, resume_free=()):
    os.makedirs(workdir, exist_ok=True)
    calls.append((config.rl.steps, os.path.basename(workdir)))
    return {
        "params": {"w": np.asarray(seeds, np.float64)[:, None]},
        "sft": [{"acc": 0.5} for _ in seeds],
        "rl": [{"acc": 0.9} for _ in seeds],
        "curves": {"rl/acc": np.zeros((2, len(seeds)))},
        "wall_call_s": 1.0,
        "wall_total_s": 1.0,
        "wall_complete": True,
    }

  monkeypatch.setattr(harness.seeds_lib, "train_seeds", fake_train_seeds)
  monkeypatch.setattr(harness, "_sft_key", lambda config: "k")
  cfg = ml_collections.ConfigDict(
      {"rl": {"steps": 3}, "sft": {"steps": 2}, "eval": {"num_tasks": 4}}
  )
  spec = stats.ClaimSpec(
      "acc",
      True,
      "headroom",
      0.2,
      treatment="GRPO",
      control="SFT (start)",
      prediction="better",
      metric_range=(0.0, 1.0),
      room_fn=lambda config, params: 0.5 if float(params["w"][0]) == 0 else 0.0,
  )
  out = harness.run_claim(
      "t",
      {"GRPO": cfg},
      [0, 1, 2],
      root=str(tmp_path / "root"),
      out_dir=str(tmp_path / "out"),
      metrics=(("acc", "acc"),),
      curve_keys=("rl/acc",),
      spec=spec,
      seeds_per_call=1,
      stop_without_room=True,
  )
  assert calls == [(0, "sft_k_s0"), (3, "GRPO_s0"), (0, "sft_k_s1")]
  assert (
      list(out["rows"]) == ["SFT (start)"]
      and len(out["rows"]["SFT (start)"]) == 2
  )
  assert out["room"]["per_seed"] == [0.5, 0.0] and not out["room"]["ok"]
  assert out["analysis"]["verdict"] == stats.UNTESTABLE
  saved = _strict_loads((tmp_path / "out" / "results.json").read_text())
  assert saved["seeds"] == [0, 1] and saved["rl_skipped"] is True
  assert list((tmp_path / "out" / "seed_records").glob("GRPO_s0_*.json"))


def test_with_curve_means_by_hand():
  from experiments import harness  # noqa: PLC0415

  curves = {"rl/acc": np.array([[0.0, 1.0], [0.5, 0.25], [1.0, 0.75]])}
  rows = [{"a": 1.0, "m": 9.0}, {"a": 2.0}]
  out = harness._with_curve_means(  # pylint: disable=protected-access
      rows,
      curves,
      (
          ("m", "rl/acc", 1, None),
          ("first", "rl/acc", 0, 1),
          ("gone", "rl/missing", 0, None),
          ("empty", "rl/acc", 5, 9),
      ),
  )
  # Seed 0: steps 1-2 mean (0.5 + 1.0) / 2; seed 1: (0.25 + 0.75) / 2. A key
  # already in a row is recomputed; the input rows are not changed.
  assert [r["m"] for r in out] == [0.75, 0.5]
  assert [r["first"] for r in out] == [0.0, 1.0]
  assert all(math.isnan(r["gone"]) and math.isnan(r["empty"]) for r in out)
  assert rows[0]["m"] == 9.0 and "first" not in rows[1]


def test_one_seed_analysis_is_inconclusive_without_an_interval():
  # A run stopped after one seed (or a claim run on one seed) gets a verdict
  # and a readable paragraph instead of a crash in paired_difference.
  spec = stats.ClaimSpec("acc", True, "r", 0.1, treatment="t", control="c")
  a = stats.analyse(spec, {"t": [{"acc": 0.9}], "c": [{"acc": 0.5}]}, [0.5])
  assert a["verdict"] == "inconclusive" and a["effect"] is None
  assert a["parts"][0]["too_few_seeds"] == 1 and a["p_claim"] is None
  text = stats.format_analysis(a)
  assert "1 seed, no paired interval" in text
  assert "**Verdict: inconclusive.**" in text


def _cli_kwargs(tmp_path):
  """harness.cli's keyword arguments for a claim 'experiments.x' with one arm
  (run_claim is patched out by the tests that use it)."""
  return dict(
      here=str(tmp_path),
      prog="experiments.x",
      title="t",
      arms_fn=lambda smoke: {"a": None},
  )


def test_claim_process_keeps_a_compilation_cache_under_its_root(
    tmp_path, monkeypatch
):
  # claim_main's cli turns the persistent XLA cache on in ROOT/xla_cache
  # (or --compilation_cache=DIR; '' for none) before any training; cli
  # called from elsewhere (tests, other tools) leaves jax's setting alone.
  from experiments import harness  # noqa: PLC0415

  monkeypatch.setattr(harness, "run_claim", lambda *a, **kw: {})
  cached = []
  monkeypatch.setattr(harness, "enable_compilation_cache", cached.append)
  kwargs = _cli_kwargs(tmp_path)
  root = ["--smoke", f"--root={tmp_path}"]
  harness.cli(root, compilation_cache=True, **kwargs)
  harness.cli(
      root + [f"--compilation_cache={tmp_path / 'c'}"],
      compilation_cache=True,
      **kwargs,
  )
  harness.cli(root + ["--compilation_cache="], compilation_cache=True, **kwargs)
  harness.cli(root, **kwargs)
  assert cached == [
      os.path.join(str(tmp_path), "xla_cache"),
      str(tmp_path / "c"),
  ]


_CACHE_PROBE = """
import sys

import jax
import jax.numpy as jnp

from experiments import harness

harness.enable_compilation_cache(sys.argv[1])
events = []
jax.monitoring.register_event_listener(lambda e, **kw: events.append(e))
f = jax.jit(lambda x: jnp.tanh(x @ x.T).sum(0) * 3.0 + 1.0)
y = f(jnp.arange(64.0).reshape(8, 8) / 64)
print(y.tobytes().hex(), events.count("/jax/compilation_cache/cache_hits"))
"""


def test_compilation_cache_reloads_a_cpu_program_in_a_new_process(tmp_path):
  # XLA CPU programs are written to the cache by the first process (any
  # compile time, any size) and loaded, not compiled, by the next one, with
  # the same result bit for bit.
  import subprocess  # noqa: PLC0415
  import sys  # noqa: PLC0415

  from experiments import harness  # noqa: PLC0415

  cache = tmp_path / "xla_cache"

  def run():
    proc = subprocess.run(
        [sys.executable, "-c", _CACHE_PROBE, str(cache)],
        cwd=harness.REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, PYTHONPATH=harness.REPO, JAX_PLATFORMS="cpu"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"persistent XLA compilation cache: {cache}" in proc.stdout
    return proc.stdout.split("\n")[-2].split()

  first = run()
  assert first[1] == "0" and len(os.listdir(cache)) > 0
  second = run()
  assert int(second[1]) >= 1 and second[0] == first[0]


def test_start_differences_compare_every_recorded_field_exactly():
  from experiments import harness  # noqa: PLC0415

  rec = {
      "commit": "abc",
      "rows": [
          {"accuracy": 0.49, "tool_productivity": float("nan")},
          {"accuracy": 0.5, "tool_productivity": 0.25},
      ],
  }
  same = [
      {"accuracy": 0.49, "tool_productivity": float("nan"), "extra": 1.0},
      {"accuracy": 0.5, "tool_productivity": 0.25},
  ]
  # NaN == NaN; keys the record lacks are not compared.
  assert harness.start_differences(rec, same, [0, 1]) == []
  moved = [dict(same[0]), dict(same[1], accuracy=0.5 + 2**-40)]
  assert harness.start_differences(rec, moved, [0, 1]) == [
      f"seed 1 accuracy: recorded 0.5, now {0.5 + 2**-40}"
  ]
  assert harness.start_differences(
      rec, [{"accuracy": 0.49}, same[1]], [0, 1]
  ) == ["seed 0 tool_productivity: recorded nan, now None"]
  assert harness.start_differences(rec, same[:1], [0]) == [
      "2 recorded rows, 1 now"
  ]


def test_compilation_cache_flag_is_refused_where_no_cache_is_kept(
    tmp_path, monkeypatch
):
  # cli without `compilation_cache` (called from tests or other tools, not a
  # claim's own process) would parse --compilation_cache and ignore it: a
  # one-line UsageError naming the flag, before anything runs.
  from experiments import harness  # noqa: PLC0415

  ran, cached = [], []
  monkeypatch.setattr(harness, "run_claim", lambda *a, **kw: ran.append(a))
  monkeypatch.setattr(harness, "enable_compilation_cache", cached.append)
  kwargs = _cli_kwargs(tmp_path)
  root = ["--smoke", f"--root={tmp_path}"]
  for flag in (f"--compilation_cache={tmp_path / 'c'}", "--compilation_cache="):
    with pytest.raises(harness.UsageError) as err:
      harness.cli(root + [flag], **kwargs)
    msg = str(err.value)
    assert msg.startswith(f"--compilation_cache={flag.split('=', 1)[1]!r}: ")
    assert (
        "python -m experiments.x keeps no persistent compilation cache" in msg
    )
    assert "\n" not in msg
  assert ran == [] and cached == []
  harness.cli(root, **kwargs)  # without the flag: runs, no cache
  assert len(ran) == 1 and cached == []


def test_run_claim_trains_every_arm_again_from_a_start_that_differs(
    tmp_path, monkeypatch
):
  # The path users hit: seed 0's start and GRPO arm are recorded
  # (seed_records); on another machine (no workdirs) a second claim needs an
  # OTC arm, so the start is trained again. One that evaluates 2**-40 away
  # from its record cannot pair with the recorded GRPO arm: both arms train
  # from the new start under records and workdirs named by its digest, the
  # old records stay as they were, and a rerun reads the new ones. A start
  # that reproduces its record pairs with the recorded arm (only OTC trains).
  import shutil  # noqa: PLC0415

  import ml_collections  # noqa: PLC0415

  from experiments import harness  # noqa: PLC0415

  calls = []
  start_acc = [0.25]

  def fake_train_seeds(config, seeds, workdir, resume_free=()):
    os.makedirs(workdir, exist_ok=True)
    calls.append((config.rl.steps, os.path.basename(workdir)))
    return {
        "params": {"w": np.zeros((len(seeds), 1))},
        "sft": [{"acc": start_acc[0]} for _ in seeds],
        "rl": [{"acc": 0.5 + config.rl.lr} for _ in seeds],
        "curves": {"rl/acc": np.zeros((2, len(seeds)))}
        if config.rl.steps
        else {},
        "wall_call_s": 1.0,
        "wall_total_s": 1.0,
        "wall_complete": True,
    }

  monkeypatch.setattr(harness.seeds_lib, "train_seeds", fake_train_seeds)
  monkeypatch.setattr(harness, "_sft_key", lambda config: "k")
  grpo = ml_collections.ConfigDict(
      {"rl": {"steps": 3, "lr": 0.125}, "sft": {"steps": 2}, "eval": {"n": 4}}
  )
  otc = ml_collections.ConfigDict(grpo.to_dict())
  otc.rl.lr = 0.25
  root, out_dir = tmp_path / "root", tmp_path / "out"
  recs = out_dir / "seed_records"
  kw = dict(
      root=str(root),
      out_dir=str(out_dir),
      metrics=(("acc", "acc"),),
      curve_keys=("rl/acc",),
      seeds_per_call=1,
  )
  h = {
      a: harness.experiment_seeds.config_hash(c)[:8]
      for a, c in (("GRPO", grpo), ("OTC", otc))
  }
  harness.run_claim("t", {"GRPO": grpo}, [0], **kw)
  assert calls == [(0, "sft_k_s0"), (3, "GRPO_s0")]
  before = {p.name: p.read_text() for p in recs.iterdir()}
  assert sorted(before) == [f"GRPO_s0_{h['GRPO']}.json", "sft_k_s0.json"]

  shutil.rmtree(root)  # another machine: only the records
  calls.clear()
  start_acc[0] = 0.25 + 2**-40
  d = harness.start_digest([{"acc": 0.25 + 2**-40}])
  assert len(d) == 8 and d != harness.start_digest([{"acc": 0.25}])
  out = harness.run_claim("t", {"GRPO": grpo, "OTC": otc}, [0], **kw)
  assert calls == [
      (0, "sft_k_s0"),
      (3, f"GRPO_s0_start{d}"),
      (3, f"OTC_s0_start{d}"),
  ]
  assert out["rows"]["SFT (start)"] == [{"acc": 0.25 + 2**-40}]
  assert out["rows"]["GRPO"] == [{"acc": 0.625}]
  assert out["rows"]["OTC"] == [{"acc": 0.75}]
  for name, text in before.items():  # the old records are untouched
    assert (recs / name).read_text() == text
  new = json.loads((recs / f"sft_k_s0_start{d}.json").read_text())
  assert new["rows"] == [{"acc": 0.25 + 2**-40}]
  assert new["start_digest"] == d
  for arm in ("GRPO", "OTC"):
    rec = json.loads((recs / f"{arm}_s0_{h[arm]}_start{d}.json").read_text())
    assert rec["start_digest"] == d and rec["arm"] == arm
  results = json.loads((out_dir / "results.json").read_text())
  assert results["restarted_seeds"] == {"0": d}
  assert f"seed 0 (start {d})" in (out_dir / "results.md").read_text()

  calls.clear()  # a rerun on this machine: the start resumed, arms read
  out2 = harness.run_claim("t", {"GRPO": grpo, "OTC": otc}, [0], **kw)
  assert calls == [(0, "sft_k_s0")] and out2["rows"] == out["rows"]

  shutil.rmtree(root)  # a machine that reproduces the recorded start
  calls.clear()
  start_acc[0] = 0.25
  out3 = harness.run_claim("t", {"GRPO": grpo, "OTC": otc}, [0], **kw)
  assert calls == [(0, "sft_k_s0"), (3, "OTC_s0")]
  assert out3["rows"]["GRPO"] == [{"acc": 0.625}]
  assert (recs / f"OTC_s0_{h['OTC']}.json").exists()
  assert (
      json.loads((out_dir / "results.json").read_text())["restarted_seeds"]
      == {}
  )


def test_step_hacking_bound_claims_share_one_declared_form():
  # Each bound of experiments/step_hacking is its own claim (bounds.py):
  # accuracy of the bounded arm within 0.05 of success-only, room as the
  # sum-form claim, and the positive-control check that the unbounded sum
  # arm ends below success-only; Clip's eta departure only on Clip's row.
  import pytest  # noqa: PLC0415

  from experiments.step_hacking import __main__ as step_main  # noqa: PLC0415
  from experiments.step_hacking import bounds  # noqa: PLC0415
  from experiments.step_hacking import clip  # noqa: PLC0415
  from experiments.step_hacking import delta  # noqa: PLC0415
  from experiments.step_hacking import delta_paper  # noqa: PLC0415
  from experiments.step_hacking import gated  # noqa: PLC0415
  from experiments.step_hacking import min_form  # noqa: PLC0415

  with pytest.raises(ValueError, match="not a bounded arm"):
    bounds.bound_spec("sum", claim="x", paper="y")
  arms = {
      clip: "clip",
      delta: "delta",
      delta_paper: "delta_drop",
      gated: "gated",
      min_form: "min",
  }
  hashes = set()
  for module, arm in arms.items():
    spec = module.SPEC
    assert spec.treatment == arm and spec.control == "success_only"
    assert spec.prediction == "equivalent" and spec.equivalence_margin == 0.05
    assert spec.room_metric == step_main.SPEC.room_metric
    check = spec.positive_control_check
    assert (check.treatment, check.control) == ("sum", "success_only")
    assert check.prediction == "worse"
    assert set(spec.arms) == {arm, "success_only", "sum"}
    has_eta = any(d.startswith("Clip threshold") for d in spec.departures)
    assert has_eta == (arm == "clip"), arm
    assert step_main.REPLICATION not in spec.departures
    assert bounds.REPLICATION in spec.departures
    hashes.add(spec.to_json()["spec_hash"])
  assert len(hashes) == len(arms)


def test_cli_run_with_too_few_seeds_to_decide_keeps_the_recorded_results(
    tmp_path, monkeypatch
):
  # Fewer than stats.MIN_DECISION_SEEDS seeds cannot decide a claim: the run
  # writes its results under ROOT (no clean tree needed), never over the
  # claim folder's recorded results and ledger; 6 seeds write the folder's.
  from experiments import harness  # noqa: PLC0415

  assert stats.MIN_DECISION_SEEDS == 6
  assert 2 / 2**5 > stats.ALPHA >= 2 / 2**6  # the sign-flip floor
  monkeypatch.setattr(harness, "dirty_paths", lambda repo=None: ["code.py"])
  seen = []
  monkeypatch.setattr(
      harness, "run_claim", lambda *a, **kw: seen.append(kw["out_dir"])
  )
  here, root = tmp_path / "claim", tmp_path / "runs"
  kwargs = dict(_cli_kwargs(tmp_path), here=str(here))
  harness.cli([f"--root={root}", "--seeds=0,1,2"], **kwargs)
  harness.cli([f"--root={root}"], **kwargs)  # the default seeds 0,1,2
  assert seen == [str(root), str(root)]
  with pytest.raises(harness.UsageError, match="clean git tree"):
    harness.cli([f"--root={root}", "--seeds=0,1,2,3,4,5"], **kwargs)
  monkeypatch.setattr(harness, "dirty_paths", lambda repo=None: [])
  harness.cli([f"--root={root}", "--seeds=0,1,2,3,4,5"], **kwargs)
  assert seen[-1] == str(here)
  with pytest.raises(harness.UsageError, match=">= 0"):
    harness.cli([f"--root={root}", "--seeds=-1,0"], **kwargs)


def test_rm_selection_run_with_too_few_seeds_writes_beside_its_workdirs(
    tmp_path, monkeypatch
):
  # The rm-mode runner: its default single seed (and any run below
  # MIN_DECISION_SEEDS) writes under --root, never over results_kv.json and
  # its ledger; 6 seeds need a clean tree and write the folder's files.
  from experiments import harness  # noqa: PLC0415
  from experiments.rm_selection import __main__ as rm_main  # noqa: PLC0415

  calls = []
  monkeypatch.setattr(
      rm_main, "run_task", lambda t, smoke, root, out, seeds: calls.append(out)
  )
  monkeypatch.setattr(harness, "dirty_paths", lambda repo=None: ["code.py"])
  rm_main.main(["--tasks=kv_chain", f"--root={tmp_path}"])
  rm_main.main(["--tasks=kv_chain", f"--root={tmp_path}", "--seeds=8,9"])
  assert calls == [str(tmp_path), str(tmp_path)]
  with pytest.raises(SystemExit):  # dirty tree: refused before any work
    rm_main.main(["--tasks=kv_chain", "--seeds=0,1,2,3,4,5"])
  with pytest.raises(SystemExit):
    rm_main.main(["--tasks=kv_chain", "--seeds=-1"])
  assert len(calls) == 2
  monkeypatch.setattr(harness, "dirty_paths", lambda repo=None: [])
  rm_main.main(["--tasks=kv_chain", "--seeds=0,1,2,3,4,5"])
  assert calls[-1] == rm_main.HERE
