"""Paired per-seed statistics, room checks and verdicts of the claim reproductions.

Every claim declares before its run a `ClaimSpec`: the arm the claim is about
(treatment), the arm it is compared with (control), one or more parts (each a
metric with what the claim predicts for it: treatment better, worse, higher,
lower, equivalent within a margin, or non-inferior within a margin), a room
metric with its threshold (computed from every seed's start policy: does the
setup leave room for the predicted effect at all?) and, where one exists, a
positive-control check (an arm that must show a known effect against a
baseline arm in the same run).

After the run, `analyse` forms per part the paired per-seed differences
treatment - control (every arm of a seed starts from the same SFT checkpoint
and sees the same task stream, so pairing by seed removes the shared part of
the seed-to-seed variance), their mean, a 95% Student-t confidence interval
clipped to the range a difference of the metric can take, and exact sign-flip
permutation p-values; `part_verdict` decides each part and `analyse` combines
them into one of five words: 'supported', 'contradicted', 'inconclusive',
'untestable at this setup', 'inconclusive: the setup cannot show the effect'.

Decision rules (version RULES; fixed before the runs they judge, except the
re-decisions of recorded runs that the ledger marks as such):

1. Room: every seed's start policy must reach the room threshold; a missing
   per-seed value counts as no room. Without room the claim is 'untestable at
   this setup', whatever the arms did.
2. An effect is established beyond a bound b (0, or a margin) only when both
   the t interval lies strictly beyond b and the exact sign-flip test of the
   differences shifted by b rejects at alpha = 0.05. A zero-variance
   difference (every seed's difference equal) has a zero-width t interval, so
   there the sign-flip test alone decides; its floor 2 / 2^n means at least 6
   seeds are needed to establish anything (2/32 = 0.0625 > 0.05 for n = 5).
3. A claim is 'supported' only if every part is supported; 'contradicted' only
   if a part is contradicted and the declared positive control, run in the
   same decision run, showed its effect; a contradicted part without that is
   'inconclusive: the setup cannot show the effect'. Anything else is
   'inconclusive'.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
from typing import Mapping, Sequence

import numpy as np
from scipy import stats as scipy_stats

CANNOT_SHOW = "inconclusive: the setup cannot show the effect"
UNTESTABLE = "untestable at this setup"
VERDICTS = (
    "supported",
    "contradicted",
    "inconclusive",
    UNTESTABLE,
    CANNOT_SHOW,
)
# A part whose arms the decision run did not train.
NOT_RUN = "not run"
# 'better' / 'worse' are in the sense of higher_is_better; 'higher' / 'lower'
# in the metric's raw units; 'equivalent' and 'noninferior' need a margin.
PREDICTIONS = (
    "better",
    "worse",
    "higher",
    "lower",
    "equivalent",
    "noninferior",
)
ALPHA = 0.05
# Fewest seeds that can decide a claim: the exact sign-flip test over n seeds
# cannot go below p = 2 / 2^n, which is above ALPHA for n <= 5 (2/32 = 0.0625)
# and 0.03125 at n = 6. A claim runner writes a run with fewer seeds beside
# its workdirs, never over the claim's recorded results (harness.cli).
MIN_DECISION_SEEDS = 6
# Version of the decision rules above (1: t interval only, mean room, no
# positive-control condition; the results of 2026-12-02 were decided by it).
RULES = 2
# The exact sign-flip test enumerates 2^n sign patterns: beyond this many
# paired values paired_difference leaves it out (None).
MAX_SIGN_FLIP_N = 20


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


def sign_flip_p(diffs: Sequence[float], shift: float = 0.0) -> float:
  """Exact two-sided sign-flip (paired permutation) p-value.

  Tests H0: the paired differences d_i are symmetric about `shift` (under H0
  each d_i - shift is as likely to carry either sign, seeds independent):

    p = #{s in {-1, +1}^n : |sum_i s_i (d_i - shift)| >= |sum_i (d_i - shift)|}
        / 2^n,

  enumerating all 2^n sign patterns (Fisher, The Design of Experiments, 1935,
  section 21; Good, Permutation, Parametric and Bootstrap Tests of
  Hypotheses, 2005, section 3.1). It assumes no distribution for the
  differences, unlike the t interval.

  Floor: when the observed sum is not 0, the identity pattern and its mirror
  both count, so p >= 2 / 2^n (0.25 for n = 3, 0.0625 for n = 5, 0.0078 for
  n = 8): fewer than 6 seeds can never reach p <= 0.05. All d_i equal to
  `shift` gives p = 1. Example: d = [1, 2, 3] gives the sums 6, 4, 2, 0, 0,
  -2, -4, -6, of which two reach |6|: p = 2/8 = 0.25.

  Args:
    diffs: paired differences d_i, [n] finite floats, 1 <= n <=
      MAX_SIGN_FLIP_N.
    shift: the null value of the centre, in the differences' units.

  Returns:
    p in (0, 1].

  Raises:
    ValueError: an empty or too long list, or non-finite values.
  """
  d = np.asarray(diffs, np.float64) - float(shift)
  if d.ndim != 1 or not 1 <= len(d) <= MAX_SIGN_FLIP_N:
    raise ValueError(
        f"sign_flip_p: {len(np.atleast_1d(d))} values: the exact test "
        f"enumerates 2^n patterns and takes 1 <= n <= {MAX_SIGN_FLIP_N}"
    )
  if not np.all(np.isfinite(d)):
    raise ValueError(f"sign_flip_p: non-finite values in {list(diffs)!r}")
  signs = np.array(list(itertools.product((1.0, -1.0), repeat=len(d))))
  sums = np.abs(signs @ d)
  observed = abs(float(d.sum()))
  # Sums that equal the observed one up to rounding count as reaching it.
  tol = 1e-9 * max(1.0, float(np.abs(d).sum()))
  return float(np.mean(sums >= observed - tol))


def holm(pvalues: Sequence[float]) -> list[float]:
  """Holm-Bonferroni adjusted p-values, in the order given.

  With the m p-values sorted ascending, p_(1) <= ... <= p_(m):

    adj_(i) = max_{j <= i} min(1, (m - j + 1) p_(j)).

  Rejecting every hypothesis with adj <= alpha controls the family-wise error
  rate at alpha under any dependence (Holm, "A simple sequentially rejective
  multiple test procedure", Scand. J. Statist. 6:65-70, 1979). Example:
  [0.01, 0.04, 0.03, 0.005] -> [0.03, 0.06, 0.06, 0.02].

  Args:
    pvalues: [m] floats in [0, 1].

  Returns:
    [m] adjusted p-values.

  Raises:
    ValueError: a value outside [0, 1] or not finite.
  """
  p = np.asarray(pvalues, np.float64)
  if p.ndim != 1 or not np.all((p >= 0) & (p <= 1)):
    raise ValueError(f"holm: p-values must lie in [0, 1], got {list(pvalues)}")
  m = len(p)
  order = np.argsort(p, kind="stable")
  adj = np.empty(m)
  running = 0.0
  for rank, i in enumerate(order):
    running = max(running, min(1.0, (m - rank) * p[i]))
    adj[i] = running
  return adj.tolist()


def _diff_range(metric_range) -> float | None:
  """R such that a difference of two values of the metric lies in [-R, R]
  (None when the metric's range is not bounded at both ends)."""
  if metric_range is None:
    return None
  lo, hi = metric_range
  if lo is None or hi is None or not (np.isfinite(lo) and np.isfinite(hi)):
    return None
  return float(hi) - float(lo)


def paired_difference(
    treatment: Sequence[float],
    control: Sequence[float],
    level: float = 0.95,
    metric_range: tuple | None = None,
) -> dict:
  """Mean of per-seed differences treatment - control, its t interval clipped
  to the range of a difference, and the exact sign-flip p-value.

  The interval is mean -+ t_{n-1} * SE (Student 1908). A metric declared in
  [a, b] has differences in [-(b - a), b - a], and a t interval of few seeds
  can reach past that (e.g. -0.892 [-1.101, -0.682] for an accuracy): the
  interval is clipped to the range and flagged ('ci_clipped'), 'ci_t' keeps
  the unclipped one. Clipping was chosen over a bootstrap or an inverted
  permutation interval because it keeps the t interval's coverage (it only
  removes impossible values, so it covers the true mean difference whenever
  the t interval does), never moves an end that is inside the range,
  and so never changes whether 0 or a margin m < b - a lies inside it; a
  percentile bootstrap of 8 values is known to under-cover, and an inverted
  sign-flip interval has coverage in steps of 2 / 2^n.

  Args:
    treatment: per-seed values of the metric in the treatment arm, [n] floats.
    control: per-seed values in the control arm, same seeds in the same order.
    level: confidence level of the interval.
    metric_range: (low, high) the metric can take (None ends: unbounded), or
      None.

  Returns:
    dict with 'diffs' (list, [n]), 'n', 'mean', 'se' (sample std with n - 1
    degrees of freedom / sqrt(n)), 't' (the multiplier), 'ci_t' ([low, high]
    = mean -+ t * se), 'ci' (ci_t clipped to 'diff_range'), 'ci_clipped'
    (bool), 'diff_range' ([-R, R] or None), 'level', 'zero_variance' (every
    difference equal, so the t interval has zero width and says nothing
    alone), 'sign_flip_p' (sign_flip_p(diffs); None for n > MAX_SIGN_FLIP_N)
    and 'sign_flip_floor' (2 / 2^n), all in the metric's units.

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
  n = len(d)
  mean = float(d.mean())
  zero_variance = bool(np.ptp(d) <= 1e-12 * max(1.0, float(np.abs(d).max())))
  se = 0.0 if zero_variance else float(d.std(ddof=1) / np.sqrt(n))
  t = t_multiplier(n, level)
  ci_t = [mean - t * se, mean + t * se]
  r = _diff_range(metric_range)
  ci = list(ci_t) if r is None else [max(ci_t[0], -r), min(ci_t[1], r)]
  return {
      "diffs": d.tolist(),
      "n": n,
      "mean": mean,
      "se": se,
      "t": t,
      "ci": ci,
      "ci_t": ci_t,
      "ci_clipped": ci != ci_t,
      "diff_range": None if r is None else [-r, r],
      "level": level,
      "zero_variance": zero_variance,
      "sign_flip_p": sign_flip_p(d) if n <= MAX_SIGN_FLIP_N else None,
      "sign_flip_floor": 2.0 / 2.0**n,
  }


def _direction(prediction: str, higher_is_better: bool) -> int:
  """Predicted sign of treatment - control in raw units (0: equivalence;
  for 'noninferior' the sign of 'better')."""
  better = 1 if higher_is_better else -1
  return {
      "better": better,
      "noninferior": better,
      "worse": -better,
      "higher": 1,
      "lower": -1,
      "equivalent": 0,
  }[prediction]


def part_verdict(
    effect: Mapping,
    prediction: str,
    higher_is_better: bool = True,
    margin: float | None = None,
    alpha: float = ALPHA,
) -> dict:
  """The verdict on one part of a claim from its paired effect.

  "Established beyond b on side s" means: the (range-clipped) t interval
  lies strictly beyond b on side s, and the exact sign-flip test of the
  differences shifted by b, sign_flip_p(diffs, b), is <= alpha. With d the
  predicted sign of treatment - control (`_direction`) and m the margin:

  - 'better' / 'worse' / 'higher' / 'lower': 'supported' if established
    beyond 0 on side d; 'contradicted' if established beyond 0 on side -d,
    or (with m) established above -m and below m (an effect, if any, too small
    to matter); else 'inconclusive'. Decisive p: sign_flip_p(diffs, 0).
  - 'equivalent' (TOST-like, both bounds): 'supported' if established above -m
    and below m; 'contradicted' if established above m or below -m; else
    'inconclusive'. Decisive p: the larger of the two tests at -m and m.
  - 'noninferior': 'supported' if established beyond -d m on side d (not worse
    than the control by m or more); 'contradicted' if established beyond
    -d m on side -d; else 'inconclusive'. Decisive p: the test at -d m.

  The interval and the test must agree: a zero-width interval of a
  zero-variance difference is decided by the test alone (its floor 2 / 2^n).

  Args:
    effect: paired_difference's dict ('diffs', 'ci').
    prediction: one of PREDICTIONS.
    higher_is_better: orientation for 'better' / 'worse' / 'noninferior'.
    margin: m > 0 in the metric's units; required by 'equivalent' and
      'noninferior'.
    alpha: level of the sign-flip tests.

  Returns:
    dict with 'verdict' ('supported', 'contradicted' or 'inconclusive'), 'p'
    (the decisive p-value above) and 'tests' ({bound: p} of every test made).

  Raises:
    ValueError: an unknown prediction, a missing or non-positive margin, or a
    malformed interval.
  """
  if prediction not in PREDICTIONS:
    raise ValueError(
        f"part_verdict: prediction={prediction!r}: must be one of "
        f"{PREDICTIONS}"
    )
  m = margin
  if m is not None and not m > 0:
    raise ValueError(f"part_verdict: margin={m!r}: must be > 0 or None")
  if prediction in ("equivalent", "noninferior") and m is None:
    raise ValueError(
        f"part_verdict: margin=None: prediction {prediction!r} needs a margin"
    )
  lo, hi = (float(x) for x in effect["ci"])
  if not (np.isfinite(lo) and np.isfinite(hi)) or lo > hi:
    raise ValueError(
        f"part_verdict: ci={list(effect['ci'])!r}: need finite low <= high"
    )
  tests: dict[float, float] = {}

  def beyond(side: int, bound: float) -> bool:
    if bound not in tests:
      tests[bound] = sign_flip_p(effect["diffs"], bound)
    inside = lo > bound if side > 0 else hi < bound
    return inside and tests[bound] <= alpha

  d = _direction(prediction, higher_is_better)
  if prediction == "equivalent":
    if beyond(+1, -m) and beyond(-1, m):
      out = "supported"
    elif beyond(+1, m) or beyond(-1, -m):
      out = "contradicted"
    else:
      out = "inconclusive"
    p = max(
        tests.setdefault(b, sign_flip_p(effect["diffs"], b)) for b in (-m, m)
    )
  elif prediction == "noninferior":
    bound = -d * m
    if beyond(d, bound):
      out = "supported"
    elif beyond(-d, bound):
      out = "contradicted"
    else:
      out = "inconclusive"
    p = tests[bound]
  else:
    if beyond(d, 0.0):
      out = "supported"
    elif beyond(-d, 0.0):
      out = "contradicted"
    elif m is not None and beyond(+1, -m) and beyond(-1, m):
      out = "contradicted"
    else:
      out = "inconclusive"
    p = tests[0.0]
  return {
      "verdict": out,
      "p": float(p),
      "tests": {f"{b:g}": float(v) for b, v in sorted(tests.items())},
  }


@dataclasses.dataclass(frozen=True)
class Part:
  """One prediction of a claim: treatment vs control on one metric.

  Attributes:
    metric: key of the per-seed held-out row.
    prediction: one of PREDICTIONS.
    higher_is_better: orientation of the metric ('better', 'worse',
      'noninferior').
    margin: m > 0 in the metric's units ('equivalent', 'noninferior'; for a
      directional part an effect bounded inside (-m, m) contradicts it).
    treatment: arm label; '' = the ClaimSpec's treatment.
    control: arm label; '' = the ClaimSpec's control.
    metric_range: (low, high) the metric can take (None ends: unbounded);
      the t interval is clipped to the range of a difference. It never
      changes a verdict (paired_difference), so it is not part of the spec
      hash.
  """

  metric: str
  prediction: str = "better"
  higher_is_better: bool = True
  margin: float | None = None
  treatment: str = ""
  control: str = ""
  metric_range: tuple | None = None

  def __post_init__(self):
    if self.prediction not in PREDICTIONS:
      raise ValueError(
          f"Part.prediction={self.prediction!r}: must be one of {PREDICTIONS}"
      )
    if self.margin is not None and not self.margin > 0:
      raise ValueError(f"Part.margin={self.margin!r}: must be > 0 or None")
    if self.prediction in ("equivalent", "noninferior") and self.margin is None:
      raise ValueError(
          f"Part.margin=None: prediction {self.prediction!r} needs a margin"
      )
    if self.metric_range is not None:
      lo, hi = self.metric_range
      if lo is not None and hi is not None and not lo < hi:
        raise ValueError(
            f"Part.metric_range={self.metric_range!r}: need low < high"
        )

  @property
  def direction(self) -> int:
    """Predicted sign of treatment - control in raw units (0: equivalence)."""
    return _direction(self.prediction, self.higher_is_better)

  def to_json(self) -> dict:
    d = dataclasses.asdict(self)
    d["metric_range"] = (
        None if self.metric_range is None else list(self.metric_range)
    )
    return d


_HASHED_PART_FIELDS = (
    "metric",
    "prediction",
    "higher_is_better",
    "margin",
    "treatment",
    "control",
)


def _parts_of_json(spec_json: Mapping) -> list[dict]:
  """The parts of a to_json dict, the primary one derived from the primary
  fields for a spec recorded before parts existed; arms resolved."""
  parts = spec_json.get("parts") or [
      {
          "metric": spec_json.get("primary_metric"),
          "prediction": spec_json.get("prediction", "better"),
          "higher_is_better": spec_json.get("higher_is_better", True),
          "margin": spec_json.get("equivalence_margin"),
      }
  ]
  out = []
  for p in parts:
    q = {k: p.get(k) for k in _HASHED_PART_FIELDS}
    q["treatment"] = q["treatment"] or spec_json.get("treatment", "")
    q["control"] = q["control"] or spec_json.get("control", "")
    out.append(q)
  return out


def spec_hash(spec_json: Mapping) -> str:
  """Version of a declared claim: 10 hex digits of the SHA-1 of what decides
  its verdict (every part's metric, prediction, orientation, margin and arms;
  the room metric and threshold; the positive-control check), not of its
  wording. A spec recorded before parts existed hashes like the same claim
  declared with one part. Two decision runs with different hashes are runs of
  two versions of the claim.

  Args:
    spec_json: ClaimSpec.to_json()'s dict, or one recorded in a results.json.
  """
  check = spec_json.get("positive_control_check")
  canon = {
      "parts": _parts_of_json(spec_json),
      "room_metric": spec_json.get("room_metric"),
      "room_threshold": spec_json.get("room_threshold"),
      "positive_control_check": None
      if not check
      else {k: check.get(k) for k in _HASHED_PART_FIELDS},
  }
  blob = json.dumps(canon, sort_keys=True)
  return hashlib.sha1(blob.encode()).hexdigest()[:10]


@dataclasses.dataclass(frozen=True)
class ClaimSpec:
  """What a claim predicts and how it is judged, declared before the run.

  Attributes:
    primary_metric: key of the per-seed held-out row (train.evaluate's keys or
      keys added by the runner) of the claim's first part.
    higher_is_better: orientation of the primary metric.
    room_metric: name of the room metric (computed from every seed's start
      policy by `room_fn`, stored and printed as 'room').
    room_threshold: every seed's room metric must be >= this for the claim to
      be testable; otherwise the verdict is 'untestable at this setup'.
    equivalence_margin: margin m (primary metric's units) of a parity claim, or
      of "no meaningful effect" for a directional one; None = no margin.
    treatment: arm label the claim is about.
    control: arm label it is compared with.
    prediction: the primary part's prediction (PREDICTIONS).
    room_fn: fn(config, params_of_one_seed) -> float, the room metric of one
      seed's start policy. None = no room check, so no room: untestable.
    claim: the claim in one sentence (summary table).
    paper: the source paper (name and arXiv id where it has one).
    departures: every way this setup departs from the paper's (model, task,
      formula, budget, arms not run), one short phrase each.
    positive_control: the arm or check that shows the setup can show the
      effect at all (e.g. a perfect answerer, a coefficient sweep), in words,
      or '' where none exists.
    positive_control_arm: the arm label of that control where it is an arm of
      this run (e.g. 'flip_0.4'); '' otherwise.
    metric_range: (low, high) of the primary metric (Part.metric_range).
    parts: the claim's parts when it makes more than one prediction (a
      compound claim: supported only if every part is); parts[0] must be on
      primary_metric. () = one part from the primary fields.
    positive_control_check: a Part whose treatment is the positive-control
      arm and whose control is the baseline it is compared with (e.g.
      Part('accuracy', 'worse', treatment='flip_0.4', control='clean')): the
      claim can be 'contradicted' only when this check is 'supported' in the
      same decision run. None = no check declared, so never 'contradicted'.
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
  metric_range: tuple | None = None
  parts: tuple = ()
  positive_control_check: Part | None = None

  def __post_init__(self):
    if self.prediction not in PREDICTIONS:
      raise ValueError(
          f"ClaimSpec.prediction={self.prediction!r}: must be one of "
          f"{PREDICTIONS}"
      )
    if (
        self.prediction in ("equivalent", "noninferior")
        and self.equivalence_margin is None
    ):
      raise ValueError(
          "ClaimSpec.equivalence_margin=None: prediction "
          f"{self.prediction!r} needs a margin"
      )
    if self.parts and self.parts[0].metric != self.primary_metric:
      raise ValueError(
          f"ClaimSpec.parts[0].metric={self.parts[0].metric!r}: must be the "
          f"primary_metric {self.primary_metric!r}"
      )
    check = self.positive_control_check
    if (
        check is not None
        and self.positive_control_arm
        and check.treatment != self.positive_control_arm
    ):
      raise ValueError(
          f"ClaimSpec.positive_control_check.treatment={check.treatment!r}: "
          f"must be the positive_control_arm {self.positive_control_arm!r}"
      )

  @property
  def all_parts(self) -> tuple[Part, ...]:
    """The parts with their arms resolved (one from the primary fields when
    `parts` is empty)."""
    parts = self.parts or (
        Part(
            self.primary_metric,
            self.prediction,
            self.higher_is_better,
            self.equivalence_margin,
            metric_range=self.metric_range,
        ),
    )
    return tuple(
        dataclasses.replace(
            p,
            treatment=p.treatment or self.treatment,
            control=p.control or self.control,
        )
        for p in parts
    )

  @property
  def arms(self) -> list[str]:
    """Every arm label the claim's verdict needs (parts and control check)."""
    out = []
    check = self.positive_control_check
    for p in self.all_parts + (() if check is None else (check,)):
      for a in (p.treatment, p.control):
        if a and a not in out:
          out.append(a)
    return out

  def to_json(self) -> dict:
    """The declaration as a JSON-ready dict (room_fn by name), with its
    resolved parts and its spec_hash."""
    d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
    fn = d.pop("room_fn")
    d["room_fn"] = None if fn is None else getattr(fn, "__name__", repr(fn))
    d["departures"] = list(self.departures)
    d["direction"] = self.direction
    d["metric_range"] = (
        None if self.metric_range is None else list(self.metric_range)
    )
    d["parts"] = [p.to_json() for p in self.all_parts]
    check = self.positive_control_check
    d["positive_control_check"] = None if check is None else check.to_json()
    d["spec_hash"] = spec_hash(d)
    return d

  @property
  def direction(self) -> int:
    """Predicted sign of treatment - control in the primary metric's raw
    units (0: equivalence)."""
    return _direction(self.prediction, self.higher_is_better)


def _analysis_head(spec: ClaimSpec) -> dict:
  """The spec fields every analysis dict starts with."""
  return {
      "primary_metric": spec.primary_metric,
      "higher_is_better": spec.higher_is_better,
      "treatment": spec.treatment,
      "control": spec.control,
      "prediction": spec.prediction,
      "equivalence_margin": spec.equivalence_margin,
      "spec_hash": spec_hash(spec.to_json()),
      "rules": RULES,
      "alpha": ALPHA,
  }


def room_record(spec: ClaimSpec, per_seed: Sequence | None) -> dict:
  """The room check of a run from every seed's start-policy room value.

  Args:
    spec: the declared ClaimSpec (room_metric, room_threshold).
    per_seed: [n] room values, one per seed (None entries: not computed), or
      None (no per-seed values).

  Returns:
    {'metric', 'value' (mean over seeds, None unless every seed has a value),
    'per_seed', 'threshold', 'ok' (every seed has a finite value >= the
    threshold; a missing value counts as no room), 'failing' (indices into
    the seed list of the seeds without room)}.
  """
  vals = (
      None
      if per_seed is None
      else [None if v is None else float(v) for v in per_seed]
  )
  present = vals is not None and all(
      v is not None and math.isfinite(v) for v in vals
  )
  failing = (
      []
      if vals is None
      else [
          i
          for i, v in enumerate(vals)
          if v is None or not math.isfinite(v) or v < spec.room_threshold
      ]
  )
  return {
      "metric": spec.room_metric,
      "value": float(np.mean(vals)) if present and vals else None,
      "per_seed": vals,
      "threshold": spec.room_threshold,
      "ok": bool(vals) and not failing,
      "failing": failing,
  }


def _analyse_part(part: Part, rows, level, alpha) -> dict:
  out = {
      "metric": part.metric,
      "prediction": part.prediction,
      "higher_is_better": part.higher_is_better,
      "margin": part.margin,
      "treatment": part.treatment,
      "control": part.control,
  }
  missing = [a for a in (part.treatment, part.control) if a not in rows]
  if missing:
    return dict(out, effect=None, verdict=NOT_RUN, p=None, missing=missing)
  try:
    a = [r[part.metric] for r in rows[part.treatment]]
    b = [r[part.metric] for r in rows[part.control]]
  except KeyError as e:
    raise ValueError(
        f"analyse: metric {part.metric!r} missing from the per-seed rows"
    ) from e
  if len(a) < 2:
    # One seed (a stopped or partial run): no paired interval, no decision.
    return dict(
        out, effect=None, verdict="inconclusive", p=None, too_few_seeds=len(a)
    )
  effect = paired_difference(a, b, level, part.metric_range)
  decided = part_verdict(
      effect, part.prediction, part.higher_is_better, part.margin, alpha
  )
  return dict(out, effect=effect, **decided)


def analyse(
    spec: ClaimSpec,
    rows: Mapping[str, Sequence[Mapping[str, float]]],
    room_per_seed: Sequence | None,
    level: float = 0.95,
    alpha: float = ALPHA,
) -> dict:
  """Paired effects, room check, positive control and verdict of one claim.

  Rules in the module docstring: room per seed; each part decided by
  `part_verdict`; 'supported' only if every part is; 'contradicted' only if a
  part is and the positive-control check is supported in the same rows, else
  CANNOT_SHOW; otherwise 'inconclusive'. A part whose arms are not in `rows`
  is NOT_RUN (a later decision run must train them), so the claim cannot be
  supported.

  Args:
    spec: the declared ClaimSpec.
    rows: arm label -> per-seed metric dicts (same seed order in every arm).
    room_per_seed: every seed's room value in seed order, or None (not
      computed: no room).
    level: confidence level of the t intervals.
    alpha: level of the sign-flip tests.

  Returns:
    dict with the spec's head fields ('primary_metric', 'treatment',
    'control', 'prediction', 'equivalence_margin', 'spec_hash', 'rules',
    'alpha'), 'parts' (per part: arms, metric, prediction, 'effect'
    (paired_difference's dict or None), 'verdict', 'p' (part_verdict's
    decisive p)), 'effect' (the first part's effect), 'positive_control'
    ({'declared', 'shown', ...the check's part fields}), 'room'
    (room_record), 'p_claim' (the largest decisive p of the parts, the
    p-value of the intersection-union test that every part holds; None when
    a part was not run), 'verdict'.

  Raises:
    ValueError: an arm of the primary part missing from rows while there is
    room, or a metric missing from the rows.
  """
  room = room_record(spec, room_per_seed)
  head = _analysis_head(spec)
  parts_spec = spec.all_parts
  first = parts_spec[0]
  missing = [a for a in (first.treatment, first.control) if a not in rows]
  if missing and room["ok"]:
    raise ValueError(
        f"analyse: arm {missing[0]!r} of the ClaimSpec is not among the "
        f"results' arms {sorted(rows)}"
    )
  parts = [_analyse_part(p, rows, level, alpha) for p in parts_spec]
  check = spec.positive_control_check
  if check is None:
    control = {"declared": False, "shown": False}
  else:
    control = dict(_analyse_part(check, rows, level, alpha), declared=True)
    control["shown"] = control["verdict"] == "supported"
  words = [p["verdict"] for p in parts]
  if not room["ok"]:
    out = UNTESTABLE
  elif all(w == "supported" for w in words):
    out = "supported"
  elif "contradicted" in words:
    out = "contradicted" if control["shown"] else CANNOT_SHOW
  else:
    out = "inconclusive"
  ps = [p["p"] for p in parts]
  return dict(
      head,
      effect=parts[0]["effect"],
      parts=parts,
      positive_control=control,
      room=room,
      p_claim=None if any(p is None for p in ps) else max(ps),
      verdict=out,
  )


ROOM_ONLY = "not run (room check only)"


def room_only_analysis(spec: ClaimSpec, room_per_seed: Sequence) -> dict:
  """`analyse`'s dict for a run that stopped after a passed room check
  (`harness.run_claim(room_only=True)`): no effect, verdict ROOM_ONLY."""
  return {
      **_analysis_head(spec),
      "effect": None,
      "parts": [],
      "room": room_record(spec, room_per_seed),
      "p_claim": None,
      "verdict": ROOM_ONLY,
  }


def format_effect(e: dict) -> str:
  """One effect as 'mean [CI low, high]' with its flags, e.g.
  '-1.000 [-1.000, -1.000] (zero variance), sign-flip p vs 0 0.0078' (the
  exact test of a zero mean difference; a part's decisive p tests the bound
  of its prediction instead, see `part_verdict`)."""
  flags = []
  if e.get("zero_variance"):
    flags.append("zero variance: every seed's difference equal")
  if e.get("ci_clipped"):
    r = e["diff_range"][1]
    flags.append(f"CI clipped to [-{r:g}, {r:g}]")
  p = e.get("sign_flip_p")
  text = f"{e['mean']:+.3f} [{e['ci'][0]:+.3f}, {e['ci'][1]:+.3f}]"
  if flags:
    text += " (" + "; ".join(flags) + ")"
  if p is not None:
    text += f", sign-flip p vs 0 {p:.4f}"
  return text


def _part_text(p: dict) -> str:
  margin = "" if p.get("margin") is None else f" (margin {p['margin']:g})"
  head = (
      f"`{p['metric']}` {p['treatment']} - {p['control']}, predicted "
      f"{p['prediction']}{margin}"
  )
  if p.get("too_few_seeds") is not None:
    return (
        f"{head}: {p['too_few_seeds']} seed, no paired interval (needs 2 or "
        f"more): {p['verdict']}"
    )
  if p.get("effect") is None:
    return f"{head}: not run (arms {p.get('missing')} not in this run)"
  e = p["effect"]
  return (
      f"{head}: {format_effect(e)} over {e['n']} seeds "
      f"({int(round(100 * e['level']))}% t multiplier {e['t']:.3f}, SE "
      f"{e['se']:.3f}; decisive sign-flip p {p['p']:.4f}, against the "
      f"prediction's bound): {p['verdict']}"
  )


def format_analysis(a: dict) -> str:
  """One Markdown paragraph of `analyse`'s result (for results.md)."""
  r = a["room"]
  per = r.get("per_seed")
  if per is None:
    room = (
        "not computed"
        if r.get("value") is None
        else f"mean {r['value']:.3f}; per-seed values not recorded"
    )
  else:
    room = (
        f"per seed {'/'.join('n/a' if v is None else f'{v:.3f}' for v in per)}"
        f" (threshold {r['threshold']:.3f}, every seed must reach it: "
        + (
            "room"
            if r["ok"]
            else f"NO room, seed positions {r.get('failing')} below"
        )
        + ")"
    )
  parts = a.get("parts")
  if parts is None:  # an analysis written under rules 1
    return _format_rules1(a, room)
  if not parts or all(
      p.get("effect") is None and p.get("too_few_seeds") is None for p in parts
  ):
    why = (
        "only the room check was run (--room_only)"
        if a["verdict"] == ROOM_ONLY
        else "the RL arms were skipped because the start policy leaves no room"
    )
    return (
        f"Primary metric `{a['primary_metric']}`, {a['treatment']} - "
        f"{a['control']}: not run ({why}); predicted: {a['prediction']}. "
        f"Room metric `{r['metric']}` of the start policy: {room}. "
        f"**Verdict: {a['verdict']}.**"
    )
  lines = [f"Part {i + 1}: " + _part_text(p) + "." for i, p in enumerate(parts)]
  pc = a.get("positive_control") or {}
  if pc.get("declared"):
    lines.append(
        "Positive control: " + _part_text(pc) + f" (shown: {pc['shown']})."
    )
  else:
    lines.append("Positive control: none declared as a check.")
  lines.append(f"Room metric `{r['metric']}` of the start policy: {room}.")
  if a.get("p_claim") is not None:
    lines.append(
        f"Claim p (largest decisive sign-flip p of the parts): "
        f"{a['p_claim']:.4f}."
    )
  lines.append(f"**Verdict: {a['verdict']}.**")
  return " ".join(lines)


def _format_rules1(a: dict, room: str) -> str:
  e = a["effect"]
  margin = (
      ""
      if a.get("equivalence_margin") is None
      else f", equivalence margin {a['equivalence_margin']:g}"
  )
  if e is None:
    return (
        f"Primary metric `{a['primary_metric']}`: not run; room {room}. "
        f"**Verdict: {a['verdict']}.**"
    )
  return (
      f"Primary metric `{a['primary_metric']}`, {a['treatment']} - "
      f"{a['control']} paired over {e['n']} seeds: {e['mean']:+.3f} "
      f"[{e['ci'][0]:+.3f}, {e['ci'][1]:+.3f}]; predicted: "
      f"{a['prediction']}{margin}. Room: {room}. **Verdict: {a['verdict']}.**"
  )
