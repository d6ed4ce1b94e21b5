"""Paired per-seed statistics, room checks and verdicts of the claim reproductions.

Every claim declares before its run a `ClaimSpec`: one primary metric, the arm
the claim is about (treatment) and the arm it is compared with (control), what
the claim predicts (treatment better, worse, or equivalent within a margin), and
a room metric with its threshold (computed from the start policy: does the setup
leave room for the predicted effect at all?). After the run, `analyse` forms the
paired per-seed differences treatment - control (every arm of a seed starts from
the same SFT checkpoint and sees the same task stream, so pairing by seed removes
the shared part of the seed-to-seed variance), their mean and 95% Student-t
confidence interval, and `verdict` turns them into one of four words:
'supported', 'contradicted', 'inconclusive', 'untestable at this setup'.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import numpy as np
from scipy import stats as scipy_stats

VERDICTS = (
    "supported",
    "contradicted",
    "inconclusive",
    "untestable at this setup",
)
PREDICTIONS = ("better", "worse", "equivalent")


def t_multiplier(n: int, level: float = 0.95) -> float:
  """Two-sided Student-t quantile t_{(1+level)/2, n-1} for n paired values.

  Args:
    n: number of values (seeds); needs n >= 2.
    level: confidence level in (0, 1).

  Returns:
    The multiplier of the standard error, e.g. 4.303 for n = 3 and 2.365 for
    n = 8 at level 0.95 (Student 1908; any t table).

  Raises:
    ValueError: n < 2 or level outside (0, 1).
  """
  if int(n) < 2:
    raise ValueError(f"t_multiplier: n={n!r}: needs at least 2 values")
  if not 0.0 < level < 1.0:
    raise ValueError(f"t_multiplier: level={level!r}: must be in (0, 1)")
  return float(scipy_stats.t.ppf(0.5 + level / 2.0, int(n) - 1))


def paired_difference(
    treatment: Sequence[float], control: Sequence[float], level: float = 0.95
) -> dict:
  """Mean of per-seed differences treatment - control with a t confidence interval.

  Args:
    treatment: per-seed values of the metric in the treatment arm, [n] floats.
    control: per-seed values in the control arm, same seeds in the same order.
    level: confidence level of the interval.

  Returns:
    dict with 'diffs' (list, [n]), 'n', 'mean', 'se' (sample std with n - 1
    degrees of freedom / sqrt(n)), 't' (the multiplier), 'ci' ([low, high] =
    mean -+ t * se), all in the metric's units.

  Raises:
    ValueError: different lengths, fewer than 2 seeds, or non-finite values.
  """
  a = np.asarray(treatment, np.float64)
  b = np.asarray(control, np.float64)
  if a.shape != b.shape or a.ndim != 1:
    raise ValueError(
        f"paired_difference: treatment has shape {a.shape} and control "
        f"{b.shape}: need two equal-length lists (one value per seed)"
    )
  if len(a) < 2:
    raise ValueError(f"paired_difference: n={len(a)}: needs at least 2 seeds")
  d = a - b
  if not np.all(np.isfinite(d)):
    raise ValueError(f"paired_difference: non-finite values in {d.tolist()}")
  mean = float(d.mean())
  se = float(d.std(ddof=1) / np.sqrt(len(d)))
  t = t_multiplier(len(d), level)
  return {
      "diffs": d.tolist(),
      "n": len(d),
      "mean": mean,
      "se": se,
      "t": t,
      "ci": [mean - t * se, mean + t * se],
      "level": level,
  }


def verdict(
    effect_ci: Sequence[float],
    direction,
    equivalence_margin: float | None = None,
    room_ok: bool = True,
) -> str:
  """The verdict on a claim from the confidence interval of its effect.

  Decision rule (fixed before any run; `effect_ci` = [low, high] of the mean
  paired difference treatment - control in the primary metric's units):

  1. room_ok False (the start policy's room metric is below its threshold):
     'untestable at this setup', whatever the interval says.
  2. direction +1 (the claim predicts an increase) or -1 (a decrease):
     'supported' if the whole interval lies on the predicted side of 0;
     'contradicted' if the whole interval lies on the other side of 0, or, with
     an equivalence margin m, inside (-m, m) (the effect, if any, is too small
     to matter); otherwise 'inconclusive'.
  3. direction 0 (a parity claim; needs a margin m > 0): 'supported' if the
     interval lies inside (-m, m); 'contradicted' if it lies entirely above m or
     entirely below -m; otherwise 'inconclusive'.

  Args:
    effect_ci: (low, high), low <= high.
    direction: +1, -1 or 0 (or 'greater', 'less', 'equivalent').
    equivalence_margin: m > 0 in the metric's units, or None.
    room_ok: whether the setup leaves room for the effect.

  Returns:
    One of VERDICTS.

  Raises:
    ValueError: a malformed interval, an unknown direction, a parity claim
    without a margin, or a margin <= 0.
  """
  lo, hi = (float(x) for x in effect_ci)
  if not (np.isfinite(lo) and np.isfinite(hi)) or lo > hi:
    raise ValueError(
        f"verdict: effect_ci={list(effect_ci)!r}: need finite low <= high"
    )
  names = {"greater": 1, "less": -1, "equivalent": 0}
  d = (
      names.get(direction, direction)
      if isinstance(direction, str)
      else direction
  )
  if d not in (1, -1, 0):
    raise ValueError(
        f"verdict: direction={direction!r}: must be +1, -1, 0 or one of "
        f"{tuple(names)}"
    )
  m = equivalence_margin
  if m is not None and not m > 0:
    raise ValueError(f"verdict: equivalence_margin={m!r}: must be > 0 or None")
  if d == 0 and m is None:
    raise ValueError(
        "verdict: equivalence_margin=None: a parity claim (direction 0) "
        "needs a margin"
    )
  if not room_ok:
    return "untestable at this setup"
  if d == 0:
    if -m < lo and hi < m:
      return "supported"
    if lo > m or hi < -m:
      return "contradicted"
    return "inconclusive"
  if (d == 1 and lo > 0) or (d == -1 and hi < 0):
    return "supported"
  if (d == 1 and hi < 0) or (d == -1 and lo > 0):
    return "contradicted"
  if m is not None and -m < lo and hi < m:
    return "contradicted"
  return "inconclusive"


@dataclasses.dataclass(frozen=True)
class ClaimSpec:
  """What a claim predicts and how it is judged, declared before the run.

  Attributes:
    primary_metric: key of the per-seed held-out row (train.evaluate's keys or
      keys added by the runner) the verdict is decided on.
    higher_is_better: orientation of the primary metric.
    room_metric: name of the room metric (computed from the start policy by
      `room_fn`, stored and printed as 'room').
    room_threshold: the room metric must be >= this for the claim to be
      testable; below it the verdict is 'untestable at this setup'.
    equivalence_margin: margin m (primary metric's units) of a parity claim, or
      of "no meaningful effect" for a directional one; None = no margin.
    treatment: arm label the claim is about.
    control: arm label it is compared with.
    prediction: 'better', 'worse' (treatment vs control, in the sense of
      higher_is_better) or 'equivalent'.
    room_fn: fn(config, params_of_one_seed) -> float, the room metric of one
      seed's start policy; the room is the mean over seeds. None = no room check.
    claim: the claim in one sentence (summary table).
    paper: the source paper (name and arXiv id where it has one).
    departures: every way this setup departs from the paper's (model, task,
      formula, budget), one short phrase each (summary table column).
    positive_control: the arm or check that shows the setup can show the
      effect at all (e.g. a perfect answerer, a coefficient sweep), or ''
      where none exists.
    positive_control_arm: the arm label of that control where it is an arm of
      this run (e.g. 'flip_0.4'), so the summary can say whether the recorded
      run included it; '' otherwise.
  """

  primary_metric: str
  higher_is_better: bool
  room_metric: str
  room_threshold: float
  equivalence_margin: float | None = None
  treatment: str = ""
  control: str = ""
  prediction: str = "better"
  room_fn: object = None
  claim: str = ""
  paper: str = ""
  departures: tuple = ()
  positive_control: str = ""
  positive_control_arm: str = ""

  def __post_init__(self):
    if self.prediction not in PREDICTIONS:
      raise ValueError(
          f"ClaimSpec.prediction={self.prediction!r}: must be one of "
          f"{PREDICTIONS}"
      )
    if self.prediction == "equivalent" and self.equivalence_margin is None:
      raise ValueError(
          "ClaimSpec.equivalence_margin=None: prediction 'equivalent' "
          "needs a margin"
      )

  def to_json(self) -> dict:
    """The declaration as a JSON-ready dict (room_fn by name)."""
    d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
    fn = d.pop("room_fn")
    d["room_fn"] = None if fn is None else getattr(fn, "__name__", repr(fn))
    d["departures"] = list(self.departures)
    d["direction"] = self.direction
    return d

  @property
  def direction(self) -> int:
    """Predicted sign of treatment - control in the metric's raw units."""
    if self.prediction == "equivalent":
      return 0
    better = 1 if self.higher_is_better else -1
    return better if self.prediction == "better" else -better


def _analysis_head(spec: ClaimSpec) -> dict:
  """The spec fields every analysis dict starts with."""
  return {
      "primary_metric": spec.primary_metric,
      "higher_is_better": spec.higher_is_better,
      "treatment": spec.treatment,
      "control": spec.control,
      "prediction": spec.prediction,
      "equivalence_margin": spec.equivalence_margin,
  }


def analyse(
    spec: ClaimSpec,
    rows: Mapping[str, Sequence[Mapping[str, float]]],
    room_value: float | None,
    level: float = 0.95,
) -> dict:
  """Paired effect, room check and verdict of one claim.

  Args:
    spec: the declared ClaimSpec.
    rows: arm label -> per-seed metric dicts (same seed order in every arm).
    room_value: the start policy's room metric (None: not computed, counted as
      room available).
    level: confidence level.

  Returns:
    dict with 'primary_metric', 'treatment', 'control', 'prediction',
    'effect' (paired_difference's dict), 'room' ({'metric', 'value',
    'threshold', 'ok'}), 'verdict'.

  When the room check failed and the runner skipped the RL arms (no rows for
  an arm of the spec), 'effect' is None and the verdict is 'untestable at this
  setup'.

  Raises:
    ValueError: an arm missing from rows (while the room check passed), or the
    primary metric missing.
  """
  room_ok = room_value is None or room_value >= spec.room_threshold
  room = {
      "metric": spec.room_metric,
      "value": room_value,
      "threshold": spec.room_threshold,
      "ok": bool(room_ok),
  }
  head = _analysis_head(spec)
  missing = [arm for arm in (spec.treatment, spec.control) if arm not in rows]
  if missing and not room_ok:
    return dict(head, effect=None, room=room, verdict=VERDICTS[3])
  for arm in missing:
    raise ValueError(
        f"analyse: arm {arm!r} of the ClaimSpec is not among the "
        f"results' arms {sorted(rows)}"
    )
  try:
    a = [r[spec.primary_metric] for r in rows[spec.treatment]]
    b = [r[spec.primary_metric] for r in rows[spec.control]]
  except KeyError as e:
    raise ValueError(
        f"analyse: primary_metric={spec.primary_metric!r} missing from "
        "the per-seed rows"
    ) from e
  effect = paired_difference(a, b, level)
  return dict(
      head,
      effect=effect,
      room=room,
      verdict=verdict(
          effect["ci"], spec.direction, spec.equivalence_margin, room_ok
      ),
  )


ROOM_ONLY = "not run (room check only)"


def room_only_analysis(spec: ClaimSpec, room_value: float) -> dict:
  """`analyse`'s dict for a run that stopped after a passed room check
  (`harness.run_claim(room_only=True)`): no effect, verdict ROOM_ONLY."""
  return {
      **_analysis_head(spec),
      "effect": None,
      "room": {
          "metric": spec.room_metric,
          "value": room_value,
          "threshold": spec.room_threshold,
          "ok": bool(room_value >= spec.room_threshold),
      },
      "verdict": ROOM_ONLY,
  }


def format_analysis(a: dict) -> str:
  """One Markdown paragraph of `analyse`'s result (for results.md)."""
  e, r = a["effect"], a["room"]
  room = (
      "not computed"
      if r["value"] is None
      else f"{r['value']:.3f} (threshold {r['threshold']:.3f}: "
      f"{'room' if r['ok'] else 'NO room'})"
  )
  margin = (
      ""
      if a["equivalence_margin"] is None
      else f", equivalence margin {a['equivalence_margin']:g}"
  )
  if e is None:
    why = (
        "only the room check was run (--room_only)"
        if a["verdict"] == ROOM_ONLY
        else "the RL arms were skipped because the start policy leaves no room"
    )
    return (
        f"Primary metric `{a['primary_metric']}`, {a['treatment']} - "
        f"{a['control']}: not run ({why}); predicted: {a['prediction']}{margin}. Room "
        f"metric `{r['metric']}` of the start policy: {room}. "
        f"**Verdict: {a['verdict']}.**"
    )
  return (
      f"Primary metric `{a['primary_metric']}` "
      f"({'higher' if a['higher_is_better'] else 'lower'} is better), "
      f"{a['treatment']} - {a['control']} paired over {e['n']} seeds: "
      f"{e['mean']:+.3f} [{int(round(100 * e['level']))}% CI {e['ci'][0]:+.3f}, "
      f"{e['ci'][1]:+.3f}] ({int(round(100 * e['level']))}% t multiplier {e['t']:.3f}, SE {e['se']:.3f}); predicted: "
      f"{a['prediction']}{margin}. Room metric `{r['metric']}` of the start "
      f"policy: {room}. **Verdict: {a['verdict']}.**"
  )
