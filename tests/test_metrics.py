"""Tests for agentic_rl.metrics."""

import itertools
import json
import math
import os

import jax.numpy as jnp
import numpy as np
import pytest

from agentic_rl import metrics

# ---------------------------------------------------------------- pass@k


@pytest.mark.parametrize(
    "n, c, k, expected",
    [
        (5, 2, 1, 0.4),
        (5, 2, 2, 1.0 - 3.0 / 10.0),  # 1 - C(3,2)/C(5,2) = 0.7
        (5, 0, 1, 0.0),
        (5, 0, 5, 0.0),
        (5, 5, 1, 1.0),
        (5, 5, 3, 1.0),
        (5, 1, 5, 1.0),  # k = n: any correct sample is drawn.
        (5, 2, 4, 1.0),  # n - c < k.
        (10, 3, 3, 1.0 - math.comb(7, 3) / math.comb(10, 3)),
    ],
)
def test_pass_at_k_hand_computed(n, c, k, expected):
  got = metrics.pass_at_k(n, c, k)
  assert got.shape == ()
  assert got.dtype == np.float64
  np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)


def _brute_force(n, c, k):
  correct = [True] * c + [False] * (n - c)
  subsets = list(itertools.combinations(range(n), k))
  return sum(any(correct[i] for i in s) for s in subsets) / len(subsets)


def test_pass_at_k_matches_enumeration_vectorised():
  ns, cs = [], []
  for n in range(1, 8):
    for c in range(n + 1):
      ns.append(n)
      cs.append(c)
  ns, cs = np.array(ns), np.array(cs)
  for k in (1, 2, 3):
    sel = ns >= k
    got = metrics.pass_at_k(ns[sel], cs[sel], k)
    want = [_brute_force(n, c, k) for n, c in zip(ns[sel], cs[sel])]
    assert got.shape == (int(sel.sum()),)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def test_pass_at_k_broadcast_and_large_n_stable():
  got = metrics.pass_at_k(
      np.array([[200], [200]]), np.array([[0, 1, 100, 200]]), 10
  )
  assert got.shape == (2, 4)
  want = [
      1 - math.comb(200 - c, 10) / math.comb(200, 10) for c in (0, 1, 100, 200)
  ]
  np.testing.assert_allclose(got[0], want, rtol=1e-12, atol=1e-15)
  np.testing.assert_allclose(got[0], got[1])
  assert np.all((got >= 0) & (got <= 1))


@pytest.mark.parametrize(
    "n, c, k",
    [
        (5, 2, 6),
        (5, 6, 1),
        (-1, 0, 1),
        (5, -1, 1),
        (5, 2, 0),
        (5, 2, -1),
        (np.array([5, 2]), np.array([1, 1]), 3),
        (np.array([5, 5]), np.array([1, 6]), 1),
    ],
)
def test_pass_at_k_invalid(n, c, k):
  with pytest.raises(ValueError):
    metrics.pass_at_k(n, c, k)


# ---------------------------------------------------------------- MetricsWriter


def test_metrics_writer_roundtrip_and_tensorboard(tmp_path):
  wd = str(tmp_path / "run")
  with metrics.MetricsWriter(wd) as w:
    w.write(1, {"loss": np.float32(0.5), "acc": jnp.asarray(0.25), "n": 3})
    w.write(2, {"loss": float("nan"), "acc": np.array([0.75])}, prefix="eval")
  recs = metrics.read_metrics(wd)
  assert len(recs) == 2
  assert recs[0] == {"step": 1, "loss": 0.5, "acc": 0.25, "n": 3.0}
  assert recs[1]["step"] == 2 and recs[1]["phase"] == "eval"
  assert recs[1]["eval/acc"] == 0.75
  assert math.isnan(recs[1]["eval/loss"])
  raw = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
  assert json.loads(raw[1])["eval/loss"] is None  # non-finite -> null
  tb = tmp_path / "run" / "tensorboard"
  events = [f for f in os.listdir(tb) if f.startswith("events.out.tfevents")]
  assert events and os.path.getsize(tb / events[0]) > 0


def test_metrics_writer_rejects_bad_values(tmp_path):
  with metrics.MetricsWriter(str(tmp_path)) as w:
    with pytest.raises(ValueError):
      w.write(0, {"v": np.zeros(3)})
    with pytest.raises(TypeError):
      w.write(0, {"v": "abc"})
    with pytest.raises(ValueError):
      w.write(0, {"step": 1.0})
  with pytest.raises(RuntimeError):
    w.write(1, {"v": 1.0})


def test_metrics_writer_resume_truncates(tmp_path):
  wd = str(tmp_path)
  with metrics.MetricsWriter(wd) as w:
    for s in range(1, 6):
      w.write(s, {"loss": float(s)})
  path = tmp_path / "metrics.jsonl"
  with open(path, "a") as f:
    f.write('{"step": 6, "loss": 6.')  # Process killed mid-line.
  with metrics.MetricsWriter(wd, resume_step=3) as w:
    w.write(4, {"loss": 40.0})
  recs = metrics.read_metrics(wd)
  assert [r["step"] for r in recs] == [1, 2, 3, 4]
  assert recs[-1]["loss"] == 40.0
  assert all(json.loads(l) for l in path.read_text().splitlines())


def test_metrics_writer_append_after_truncated_line(tmp_path):
  wd = str(tmp_path)
  with metrics.MetricsWriter(wd) as w:
    w.write(1, {"loss": 1.0})
  with open(tmp_path / "metrics.jsonl", "a") as f:
    f.write('{"step": 2, "lo')
  with metrics.MetricsWriter(wd) as w:  # No resume_step: plain append.
    w.write(2, {"loss": 2.0})
  assert [r["step"] for r in metrics.read_metrics(wd)] == [1, 2]


def test_read_metrics_missing(tmp_path):
  assert metrics.read_metrics(str(tmp_path)) == []


# ---------------------------------------------------------------- ProgressBar


def test_progress_bar_non_tty(capsys):
  bar = metrics.ProgressBar(
      total=10, initial=2, desc="train", keys=["loss", "acc"]
  )
  for s in range(3, 11):
    bar.update(s, {"loss": 1.0 / 3.0, "acc": jnp.asarray(0.5), "other": 1.0})
  assert bar._bar.n == 10  # pylint: disable=protected-access
  bar.close()
  err = capsys.readouterr().err
  assert "train" in err and "loss=0.3333" in err and "other" not in err
  assert err.count("\n") <= 3  # Not one line per update.


def test_disabled_writer_and_bar_touch_nothing(tmp_path, capsys):
  # The other processes of a multi-process run: process 0 writes and draws.
  writer = metrics.MetricsWriter(
      str(tmp_path / "w"), resume_step=3, enabled=False
  )
  writer.write(1, {"loss": 1.0})
  writer.flush()
  writer.close()
  writer.write(2, {"loss": 1.0})  # also after close: nothing, no error
  assert not (tmp_path / "w").exists()
  bar = metrics.ProgressBar(
      total=4, initial=0, desc="train", keys=["loss"], disable=True
  )
  for s in range(1, 5):
    bar.update(s, {"loss": 0.5})
  with bar.evaluating():
    pass
  bar.write("evaluating...")
  bar.close()
  captured = capsys.readouterr()
  assert captured.err == "" and captured.out == ""


class _Clock:
  """A fake monotonic clock advanced by hand."""

  def __init__(self):
    self.t = 100.0

  def __call__(self):
    return self.t


def test_progress_bar_eta_per_phase_and_evaluations():
  # 4 SFT steps at 1 s, an evaluation after step 4 (10 s) and one after step 10,
  # 6 RL steps at 3 s; each phase's first step compiles (20 s, not a rate).
  clock = _Clock()
  bar = metrics.ProgressBar(
      total=10,
      initial=0,
      desc="t",
      keys=(),
      phase_ends=(4,),
      eval_steps=(4, 10),
      clock=clock,
  )
  bar.update(0)
  assert bar.eta() == (None, True)
  clock.t += 20.0
  bar.update(1)  # compile step: no rate yet
  assert bar.eta() == (None, True)
  clock.t += 1.0
  bar.update(2)
  # SFT: 2 steps left at 1 s; RL: 6 steps at >= 1 s (unmeasured: the slowest
  # rate known); 2 evaluations of unknown time: a lower bound.
  assert bar.eta() == (2 * 1.0 + 6 * 1.0, True)
  assert "eta=>=00:08" in bar._bar.postfix  # pylint: disable=protected-access
  clock.t += 1.0
  bar.update(3)
  clock.t += 1.0
  bar.update(4)
  assert bar.eta() == (6 * 1.0, True)
  with bar.evaluating():
    clock.t += 10.0
  assert bar.eta() == (6 * 1.0 + 10.0, True)  # RL rate still unknown
  clock.t += 20.0
  bar.update(5)  # first RL step compiles; the evaluation is not in its time
  clock.t += 3.0
  bar.update(6)
  # 4 RL steps at 3 s + the final evaluation at 10 s: an estimate, not a bound.
  assert bar.eta() == (4 * 3.0 + 10.0, False)
  clock.t += 6.0
  bar.update(8)  # two steps at once: 3 s each
  assert bar.eta() == (2 * 3.0 + 10.0, False)
  assert "eta=00:16" in bar._bar.postfix  # pylint: disable=protected-access
  bar.close()


# ---------------------------------------------------------------- reports


REPORTS = {
    "sft": {"pass@1": 0.25, "reward": 0.5},
    "rl": {"pass@1": 0.625, "reward": 0.75, "turns": 2.5},
}


def test_write_eval_report(tmp_path):
  jpath, mpath = metrics.write_eval_report(str(tmp_path), REPORTS, "Eval")
  assert jpath == str(tmp_path / "eval_report.json")
  assert mpath == str(tmp_path / "eval_report.md")
  data = json.loads(open(jpath).read())
  assert data["reports"] == REPORTS
  assert data["delta"]["values"]["pass@1"] == pytest.approx(0.375)
  assert data["delta"]["values"]["turns"] is None
  md = open(mpath).read()
  assert md.startswith("# Eval")
  lines = md.splitlines()
  assert "| metric | sft | rl | delta (rl - sft) |" in lines
  assert "| pass@1 | 0.2500 | 0.6250 | +0.3750 |" in lines
  assert "| reward | 0.5000 | 0.7500 | +0.2500 |" in lines
  assert "| turns | n/a | 2.5000 | n/a |" in lines


def test_eval_report_single_checkpoint_has_no_delta(tmp_path):
  _, mpath = metrics.write_eval_report(str(tmp_path), {"sft": {"a": 1.0}}, "T")
  assert "delta" not in open(mpath).read()
  assert "delta" not in metrics.format_eval_table({"sft": {"a": 1.0}})


def test_format_eval_table():
  table = metrics.format_eval_table(REPORTS)
  lines = table.splitlines()
  assert len(lines) == 2 + 3
  assert lines[0].split() == [
      "metric",
      "sft",
      "rl",
      "delta",
      "(rl",
      "-",
      "sft)",
  ]
  assert lines[2].split() == ["pass@1", "0.2500", "0.6250", "+0.3750"]
  # Right-aligned numeric columns end at the same offset.
  assert len({len(l) for l in lines[2:4]}) == 1


# ---------------------------------------------------------------- plot


def test_plot_learning_curves(tmp_path):
  wd = str(tmp_path)
  assert metrics.plot_learning_curves(wd, ["loss"]) is None
  with metrics.MetricsWriter(wd) as w:
    for s in range(5):
      w.write(s, {"loss": 1.0 / (s + 1)}, prefix="train")
    w.write(5, {"pass@1": 0.5}, prefix="eval")
  assert metrics.plot_learning_curves(wd, ["missing"]) is None
  path = metrics.plot_learning_curves(
      wd, ["train/loss", "eval/pass@1", "missing"]
  )
  assert path == os.path.join(wd, "learning_curves.png")
  with open(path, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  held = metrics.held_out_points(
      {
          "initial": {"accuracy": 0.1},
          "sft": {"accuracy": 0.5},
          "rl": {"accuracy": float("nan")},
          "other": {"accuracy": 1.0},
      },
      {"initial": 0, "sft": 4, "rl": 9},
  )
  assert held == [
      ("initial", 0, 0.1),
      ("sft", 4, 0.5),
  ]  # NaN and step-less left out
  path = metrics.plot_learning_curves(
      wd,
      ["train/loss"],
      filename="c.png",
      held_out=held,
      held_out_key="rl/accuracy",
  )
  with open(path, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
