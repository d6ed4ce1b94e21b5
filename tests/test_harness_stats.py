"""Paired statistics, verdict rule and ClaimSpec of experiments/stats.py, checked
against hand-computed values and a printed Student-t table."""

import math

import pytest

from experiments import stats


@pytest.mark.parametrize("n,expected", [(2, 12.706), (3, 4.303), (5, 2.776),
                                        (8, 2.365), (11, 2.228)])
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


@pytest.mark.parametrize("ci,direction,margin,room,expected", [
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
])
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
  spec = stats.ClaimSpec(primary_metric="calls", higher_is_better=False,
                         room_metric="zero_call_groups", room_threshold=0.2,
                         treatment="hdpo", control="correct", prediction="better")
  assert spec.direction == -1
  rows = {"correct": [{"calls": 1.0}, {"calls": 0.9}, {"calls": 1.0}],
          "hdpo": [{"calls": 0.5}, {"calls": 0.5}, {"calls": 0.4}]}
  # diffs [-0.5, -0.4, -0.6]: mean -0.5, SE 0.1 / sqrt(3) = 0.057735.
  a = stats.analyse(spec, rows, room_value=0.3)
  assert a["effect"]["mean"] == pytest.approx(-0.5)
  assert a["effect"]["se"] == pytest.approx(0.1 / math.sqrt(3))
  assert a["effect"]["ci"][1] == pytest.approx(-0.5 + 4.302653 * 0.057735, abs=1e-4)
  assert a["room"] == {"metric": "zero_call_groups", "value": 0.3,
                       "threshold": 0.2, "ok": True}
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
