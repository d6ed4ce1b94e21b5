"""Evaluation metrics and metric logging (JSON lines, TensorBoard, tqdm, reports).

Pure metric math (`pass_at_k`) lives next to the side-effecting writers because
they are used together by the training and evaluation drivers. All file I/O of
metrics happens in this module.

Files written under a run's `workdir`:
  metrics.jsonl          one JSON object per `MetricsWriter.write` call.
  tensorboard/           TensorBoard event files (scalars only).
  eval_report.json/.md   from `write_eval_report`.
  learning_curves.png    from `plot_learning_curves`.
"""

from __future__ import annotations

import contextlib
import json
import math
import numbers
import os
import sys
import tempfile
import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import tqdm

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
EVAL_REPORT_JSON = "eval_report.json"
EVAL_REPORT_MD = "eval_report.md"


def strict_json(obj: Any) -> Any:
  """`obj` with only values that strict JSON parsers accept.

  Python's json writes NaN and Infinity as bare literals that strict parsers
  (JSON.parse, jq, serde_json) refuse, and a metric with no data is NaN here
  (tool productivity of a policy that made no calls, accuracy on an empty
  subset). Non-finite floats become None (null); numpy scalars and 0-d
  numpy / jax arrays become the Python bool, int or float of their dtype;
  larger arrays become (nested) lists; tuples become lists; mappings keep
  their keys.

  Args:
    obj: nested mappings / lists / tuples of numbers, arrays, strings, bools
      and None.

  Returns:
    The same structure, JSON-representable with `allow_nan=False`.
  """
  if isinstance(obj, Mapping):
    return {k: strict_json(v) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return [strict_json(v) for v in obj]
  if isinstance(obj, (bool, np.bool_)):
    return bool(obj)
  if isinstance(obj, (int, np.integer)):
    return int(obj)
  if isinstance(obj, (float, np.floating)):
    x = float(obj)
    return x if math.isfinite(x) else None
  if hasattr(obj, "shape") and hasattr(obj, "dtype"):  # numpy / jax arrays
    return strict_json(np.asarray(obj).tolist())
  return obj


def write_strict_json(path: str, obj: Any, indent: int = 2) -> None:
  """Writes `strict_json(obj)` to `path` (NaN / Infinity as null).

  Raises:
    TypeError: a value that is not JSON-representable (e.g. an object).
  """
  with open(path, "w", encoding="utf-8") as f:
    json.dump(strict_json(obj), f, indent=indent, allow_nan=False)
    f.write("\n")


def _summary_writer(**kwargs: Any):
  """Returns `tensorboardX.SummaryWriter(**kwargs)`, imported without torch.

  tensorboardX's writer module imports torch whenever it is installed (seconds
  of start-up and hundreds of MB, for isinstance checks on tensors we never
  log: we log Python floats). The import is deferred to the first writer and,
  unless torch is already loaded, made with torch hidden from `import`:
  tensorboardX catches the ImportError and works with numpy only.

  Raises:
    OSError: if the log directory cannot be created.
  """
  if "tensorboardX" not in sys.modules and "torch" not in sys.modules:
    sys.modules["torch"] = None  # `import torch` raises ImportError meanwhile.
    try:
      import tensorboardX  # pylint: disable=g-import-not-at-top
    finally:
      del sys.modules["torch"]
  import tensorboardX  # pylint: disable=g-import-not-at-top

  return tensorboardX.SummaryWriter(**kwargs)


# ----------------------------------------------------------------------------
# pass@k
# ----------------------------------------------------------------------------


def pass_at_k(
    num_samples: np.ndarray | int, num_correct: np.ndarray | int, k: int
) -> np.ndarray:
  """Unbiased pass@k estimator of Chen et al. 2021 (arXiv:2107.03374).

  pass@k = 1 - C(n - c, k) / C(n, k), the probability that at least one of k
  samples drawn without replacement from n samples (c of them correct) is
  correct. Computed in the numerically stable product form
  1 - prod_{i = n - c + 1}^{n} (1 - k / i), which never forms a binomial
  coefficient; when n - c < k the result is exactly 1.

  Args:
    num_samples: n, int scalar or array [T] (any shape) of samples per task.
    num_correct: c, int scalar or array broadcastable with `num_samples`;
      correct samples per task.
    k: number of draws, 1 <= k <= n for every task.

  Returns:
    float64 array with the broadcast shape of n and c (0-d for scalar inputs),
    values in [0, 1]. Average over tasks for the benchmark's pass@k.

  Raises:
    ValueError: if k < 1, any n or c is negative, any c > n, any k > n, or if
      n or c are not integral.
  """
  n = np.asarray(num_samples)
  c = np.asarray(num_correct)
  for name, arr in (("num_samples", n), ("num_correct", c)):
    if arr.dtype.kind not in "iub":
      if (
          arr.dtype.kind == "f"
          and np.all(np.isfinite(arr))
          and np.all(arr == np.round(arr))
      ):
        continue
      raise ValueError(f"{name} must be integral, got dtype {arr.dtype}.")
  n = n.astype(np.int64)
  c = c.astype(np.int64)
  n, c = np.broadcast_arrays(n, c)
  if isinstance(k, bool) or int(k) != k:
    raise ValueError(f"k must be an integer, got {k!r}.")
  k = int(k)
  if k < 1:
    raise ValueError(f"k must be >= 1, got {k}.")
  if np.any(n < 0) or np.any(c < 0):
    raise ValueError("num_samples and num_correct must be non-negative.")
  if np.any(c > n):
    raise ValueError("num_correct must be <= num_samples for every task.")
  if np.any(k > n):
    raise ValueError(
        f"k={k} exceeds num_samples (min {int(n.min()) if n.size else 0})."
    )

  shape = n.shape
  n_flat = n.reshape(-1)
  c_flat = c.reshape(-1)
  out = np.ones(n_flat.shape, np.float64)
  if n_flat.size == 0:
    return out.reshape(shape)
  # Terms i in (n - c, n]; masked product over a shared range [1, max n].
  i = np.arange(1, int(n_flat.max()) + 1, dtype=np.float64)[None, :]
  lo = (n_flat - c_flat)[:, None]
  mask = (i > lo) & (i <= n_flat[:, None])
  # Only tasks with n - c >= k use the product (then every factor is in (0, 1]).
  use = (n_flat - c_flat) >= k
  if np.any(use):
    factors = np.where(mask[use], 1.0 - k / i, 1.0)
    out[use] = 1.0 - np.prod(factors, axis=1)
  return out.reshape(shape)


# ----------------------------------------------------------------------------
# Metric logging
# ----------------------------------------------------------------------------


def _to_float(name: str, value: Any) -> float:
  """Converts a python / numpy / jax scalar (or size-1 array) to float.

  Raises:
    TypeError: for non-numeric values.
    ValueError: for arrays with more than one element.
  """
  if isinstance(value, numbers.Number):
    return float(value)
  try:
    arr = np.asarray(value)
  except Exception as e:  # pylint: disable=broad-except
    raise TypeError(f"Metric {name!r}: cannot convert {type(value)}.") from e
  if arr.dtype.kind not in "biuf":
    raise TypeError(f"Metric {name!r}: non-numeric dtype {arr.dtype}.")
  if arr.size != 1:
    raise ValueError(
        f"Metric {name!r} must be a scalar, got shape {arr.shape}."
    )
  return float(arr.reshape(()))


def _parse_lines(text: str) -> list[dict]:
  """Parses JSON lines, dropping blank, unparsable or step-less lines."""
  records = []
  for line in text.splitlines():
    line = line.strip()
    if not line:
      continue
    try:
      rec = json.loads(line)
    except json.JSONDecodeError:
      continue
    if not isinstance(rec, dict) or not isinstance(rec.get("step"), int):
      continue
    records.append(rec)
  return records


class MetricsWriter:
  """Appends scalar metrics to `{workdir}/metrics.jsonl` and TensorBoard.

  Each `write` call appends one JSON line
  `{"step": int, ["phase": str,] "<name>": float | null, ...}` (non-finite
  values become `null`) and one TensorBoard scalar per finite value, under
  `{workdir}/tensorboard`.

  Resuming: pass `resume_step` (the step of the restored checkpoint) so that
  steps the resumed run repeats are not duplicated: metrics.jsonl is rewritten
  atomically keeping only lines with step <= resume_step (unparsable lines,
  e.g. a truncated last line of a killed process, are dropped), and TensorBoard
  events with step > resume_step are purged (`purge_step`).

  Usable as a context manager; `close` flushes and closes both sinks.
  """

  def __init__(
      self,
      workdir: str,
      resume_step: int | None = None,
      enabled: bool = True,
  ):
    """Opens (creating if needed) the metric sinks under `workdir`.

    Args:
      workdir: run directory; created if missing.
      resume_step: if given, drop logged metrics with step > resume_step.
      enabled: False: a writer that touches no file (`write`, `flush`,
        `close` do nothing): the other processes of a multi-process run,
        where process 0 writes the metrics.

    Raises:
      OSError: if the directory or files cannot be created.
    """
    self.workdir = os.path.abspath(workdir)
    self.path = os.path.join(self.workdir, METRICS_FILE)
    self._closed = not enabled
    if not enabled:
      return
    os.makedirs(self.workdir, exist_ok=True)
    if resume_step is not None:
      self._truncate(int(resume_step))
    elif os.path.exists(self.path):
      self._terminate_last_line()
    self._file = open(self.path, "a", encoding="utf-8")
    self._tb = _summary_writer(
        logdir=os.path.join(self.workdir, TENSORBOARD_DIR),
        purge_step=None if resume_step is None else int(resume_step) + 1,
        flush_secs=30,
    )
    self._closed = False

  def _truncate(self, resume_step: int) -> None:
    """Atomically rewrites metrics.jsonl with lines of step <= resume_step."""
    if not os.path.exists(self.path):
      return
    with open(self.path, "r", encoding="utf-8", errors="replace") as f:
      records = _parse_lines(f.read())
    kept = [r for r in records if r["step"] <= resume_step]
    fd, tmp = tempfile.mkstemp(
        dir=self.workdir, prefix=".metrics.", suffix=".tmp"
    )
    try:
      with os.fdopen(fd, "w", encoding="utf-8") as f:
        for r in kept:
          f.write(json.dumps(r) + "\n")
        f.flush()
        os.fsync(f.fileno())
      os.chmod(tmp, 0o644)  # mkstemp creates 0600; keep the file team-readable
      os.replace(tmp, self.path)
    except BaseException:
      if os.path.exists(tmp):
        os.remove(tmp)
      raise

  def _terminate_last_line(self) -> None:
    """Ends a truncated last line so that appended lines stay parsable."""
    with open(self.path, "rb+") as f:
      f.seek(0, os.SEEK_END)
      if f.tell() == 0:
        return
      f.seek(-1, os.SEEK_END)
      if f.read(1) != b"\n":
        f.write(b"\n")

  def write(
      self, step: int, metrics: Mapping[str, Any], prefix: str = ""
  ) -> None:
    """Logs one record of scalar metrics.

    Args:
      step: global training step (int).
      metrics: name -> python/numpy/jax scalar (or size-1 array). Converted to
        python float; non-finite values are written as JSON null and are not
        sent to TensorBoard.
      prefix: optional phase name (e.g. "train", "eval"); when non-empty the
        record gets `"phase": prefix` and every name becomes `f"{prefix}/{name}"`.

    Raises:
      RuntimeError: if the writer is closed.
      TypeError: for non-numeric metric values.
      ValueError: for metric arrays with more than one element, or a metric
        named "step" / "phase".
    """
    if self._closed:
      if not hasattr(self, "_file"):  # enabled=False
        return
      raise RuntimeError("MetricsWriter is closed.")
    step = int(step)
    record: dict[str, Any] = {"step": step}
    if prefix:
      record["phase"] = prefix
    for name, value in metrics.items():
      if name in ("step", "phase"):
        raise ValueError(f"Metric name {name!r} is reserved.")
      full = f"{prefix}/{name}" if prefix else str(name)
      x = _to_float(full, value)
      if math.isfinite(x):
        record[full] = x
        self._tb.add_scalar(full, x, global_step=step)
      else:
        record[full] = None
    self._file.write(json.dumps(record) + "\n")
    self._file.flush()  # A killed process loses at most the line in flight.

  def flush(self) -> None:
    """Flushes metrics.jsonl (to the OS) and TensorBoard events."""
    if self._closed:
      return
    self._file.flush()
    self._tb.flush()

  def close(self) -> None:
    """Flushes and closes both sinks; idempotent."""
    if self._closed:
      return
    self._closed = True
    self._file.close()
    self._tb.close()

  def __enter__(self) -> "MetricsWriter":
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def read_metrics(workdir: str) -> list[dict]:
  """Reads `{workdir}/metrics.jsonl`.

  Args:
    workdir: run directory.

  Returns:
    The records in file order (each has int "step", optional str "phase" and
    float metric values; JSON nulls, i.e. non-finite values, become NaN).
    Unparsable lines (e.g. a truncated last line) are skipped; an empty list if
    the file does not exist.
  """
  path = os.path.join(workdir, METRICS_FILE)
  if not os.path.exists(path):
    return []
  with open(path, "r", encoding="utf-8", errors="replace") as f:
    records = _parse_lines(f.read())
  for r in records:
    for key, value in r.items():
      if value is None:
        r[key] = float("nan")
  return records


# ----------------------------------------------------------------------------
# Progress bar
# ----------------------------------------------------------------------------


class ProgressBar:
  """A tqdm step counter that shows selected metrics and an ETA in its postfix.

  The ETA is estimated per phase, not from one average rate: a run's phases
  (e.g. SFT, then the slower RL steps) each get the mean wall time of their own
  recent steps (a phase's first step in this process, which compiles, is left
  out), and every held-out evaluation still to come adds the measured time of
  an evaluation (`evaluating`). Until a phase's step (or an evaluation) has been
  timed, its steps count at the slowest step time measured so far and the ETA is
  shown as a lower bound, `eta>=1:23`.

  Writes to stderr. Redraws at most once per `mininterval` seconds, so when
  stderr is not a TTY (CI logs, where every redraw is a new line) the log grows
  by at most one line per `mininterval`.
  """

  _WINDOW = 20  # recent step times per phase in the mean

  def __init__(
      self,
      total: int,
      initial: int,
      desc: str,
      keys: Sequence[str],
      mininterval: float = 1.0,
      phase_ends: Sequence[int] = (),
      eval_steps: Sequence[int] = (),
      clock: Callable[[], float] = time.monotonic,
      disable: bool = False,
  ):
    """Creates the bar.

    Args:
      total: last step (bar length).
      initial: starting step (e.g. the resumed step).
      desc: label shown before the bar.
      keys: metric names to show in the postfix, in this order.
      mininterval: minimum seconds between redraws.
      phase_ends: last step of every phase but the final one, increasing; e.g.
        (sft_steps,): steps 1..sft_steps are phase 0, the rest phase 1.
      eval_steps: steps after which a held-out evaluation runs (each one not
        yet run counts in the ETA; `total` for an evaluation after the bar).
      clock: seconds, monotonic (tests pass a fake one).
      disable: draw nothing and let `write` print nothing (the other
        processes of a multi-process run; process 0 shows the bar).
    """
    self._keys = tuple(keys)
    self._ends = tuple(int(e) for e in phase_ends) + (int(total),)
    self._eval_steps = tuple(int(s) for s in eval_steps)
    self._evals_done: set[int] = set()
    self._eval_times: list[float] = []
    self._step_times: list[list[float]] = [[] for _ in self._ends]
    self._seen_phase = [False] * len(self._ends)
    self._clock = clock
    self._last = None  # clock at the last update / end of an evaluation
    self._postfix: dict[str, str] = {}
    self._disable = disable
    self._bar = tqdm.tqdm(
        disable=disable,
        total=int(total),
        initial=int(initial),
        desc=desc,
        mininterval=mininterval,
        maxinterval=max(10.0, mininterval),
        dynamic_ncols=sys.stderr.isatty(),
        file=sys.stderr,
        smoothing=0.1,
        # tqdm's own `remaining` assumes one rate for the whole run; the ETA
        # is in the postfix instead.
        bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}, {rate_fmt}{postfix}]",
    )

  def _phase(self, step: int) -> int:
    """Index of the phase that step `step` (1-based: the step just done) is in."""
    for i, end in enumerate(self._ends):
      if step <= end:
        return i
    return len(self._ends) - 1

  def eta(self) -> tuple[float | None, bool]:
    """(estimated seconds left, whether that is only a lower bound).

    Seconds: sum over phases of (steps left in the phase) * (its mean recent
    step time), plus (evaluations not yet run) * (mean evaluation time). None
    before any step time is known.
    """
    n = self._bar.n
    means = [sum(t) / len(t) if t else None for t in self._step_times]
    known = [m for m in means if m is not None]
    if not known:
      return None, True
    seconds, lower, start = 0.0, False, 0
    for end, mean in zip(self._ends, means):
      left = max(0, end - max(n, start))
      start = end
      if left:
        if mean is None:
          mean, lower = max(known), True
        seconds += left * mean
    evals_left = sum(
        1 for s in self._eval_steps if s >= n and s not in self._evals_done
    )
    if evals_left:
      if self._eval_times:
        seconds += evals_left * sum(self._eval_times) / len(self._eval_times)
      else:
        lower = True
    return seconds, lower

  def _eta_text(self) -> str:
    seconds, lower = self.eta()
    if seconds is None:
      return "?"
    return (">=" if lower else "") + tqdm.tqdm.format_interval(seconds)

  def update(self, step: int, metrics: Mapping[str, Any] | None = None) -> None:
    """Moves the bar to `step` and shows `keys` of `metrics` (4 sig. digits)
    and the ETA.

    Keys missing from `metrics` are left out; non-scalar values are ignored.
    """
    now = self._clock()
    step = int(step)
    delta = step - self._bar.n
    if self._last is not None and delta > 0:
      phase = self._phase(step)
      if self._seen_phase[phase]:  # its first step compiles: not a rate
        times = self._step_times[phase]
        times.append((now - self._last) / delta)
        del times[: -self._WINDOW]
      self._seen_phase[phase] = True
    elif delta > 0:
      self._seen_phase[self._phase(step)] = True
    self._last = now
    if metrics:
      postfix = {}
      for key in self._keys:
        if key in metrics:
          try:
            postfix[key] = f"{_to_float(key, metrics[key]):.4g}"
          except (TypeError, ValueError):
            continue
      self._postfix = postfix
    # Moved by hand, then drawn: tqdm's update(delta) could redraw before the
    # new postfix is set.
    self._bar.n = step
    self._bar.set_postfix(
        {"eta": self._eta_text(), **self._postfix}, refresh=False
    )
    if delta >= 0:
      self._bar.update(0)  # Respects mininterval.
    else:
      self._bar.refresh()

  @contextlib.contextmanager
  def evaluating(self):
    """Times the held-out evaluation run inside the block (after the current
    step) for the ETA; the next step's time does not include it."""
    start = self._clock()
    try:
      yield
    finally:
      end = self._clock()
      self._eval_times.append(end - start)
      self._evals_done.add(self._bar.n)
      if self._last is not None:
        self._last += end - start

  def write(self, message: str) -> None:
    """Prints a line above the bar without breaking it (nothing when the bar
    is disabled)."""
    if not self._disable:
      self._bar.write(message, file=sys.stderr)

  def close(self) -> None:
    """Draws the final state and releases the bar."""
    self._bar.close()

  def __enter__(self) -> "ProgressBar":
    return self

  def __exit__(self, *exc) -> None:
    self.close()


# ----------------------------------------------------------------------------
# Evaluation reports
# ----------------------------------------------------------------------------


def _report_rows(
    reports: Mapping[str, Mapping[str, Any]],
) -> tuple[list[str], list[str], list[list[float]], list[float] | None]:
  """Returns (columns, metric names, values[row][col], deltas or None)."""
  columns = list(reports.keys())
  names: list[str] = []
  for metrics in reports.values():
    for name in metrics:
      if name not in names:
        names.append(name)
  values = [
      [
          _to_float(name, reports[col][name])
          if name in reports[col]
          else math.nan
          for col in columns
      ]
      for name in names
  ]
  deltas = None
  if len(columns) >= 2:
    deltas = [row[-1] - row[0] for row in values]
  return columns, names, values, deltas


def _fmt(x: float, signed: bool = False) -> str:
  if not math.isfinite(x):
    return "n/a" if math.isnan(x) else str(x)
  return f"{x:+.4f}" if signed else f"{x:.4f}"


def _table(
    reports: Mapping[str, Mapping[str, Any]],
) -> tuple[list[str], list[list[str]]]:
  columns, names, values, deltas = _report_rows(reports)
  header = ["metric"] + columns
  if deltas is not None:
    header.append(f"delta ({columns[-1]} - {columns[0]})")
  rows = []
  for r, name in enumerate(names):
    row = [name] + [_fmt(v) for v in values[r]]
    if deltas is not None:
      row.append(_fmt(deltas[r], signed=True))
    rows.append(row)
  return header, rows


def write_eval_report(
    workdir: str, reports: Mapping[str, Mapping[str, Any]], title: str
) -> tuple[str, str]:
  """Writes an evaluation comparison as JSON and as a Markdown table.

  Args:
    workdir: output directory (created if missing).
    reports: checkpoint name (e.g. "sft", "rl") -> {metric name: scalar}. Column
      order follows the mapping's order.
    title: Markdown heading.

  Returns:
    (path of eval_report.json, path of eval_report.md). The Markdown table has
    one row per metric, one column per checkpoint (4 decimals; "n/a" where a
    checkpoint lacks the metric) and, with >= 2 checkpoints, a last column
    "delta (last - first)". The JSON holds {"title", "reports", "delta"?}, with
    non-finite values as null.

  Raises:
    TypeError, ValueError: for non-scalar metric values.
  """
  os.makedirs(workdir, exist_ok=True)
  columns, names, values, deltas = _report_rows(reports)

  payload: dict[str, Any] = {
      "title": title,
      "reports": {
          col: {
              name: values[r][c]
              for r, name in enumerate(names)
              if name in reports[col]
          }
          for c, col in enumerate(columns)
      },
  }
  if deltas is not None:
    payload["delta"] = {
        "from": columns[0],
        "to": columns[-1],
        "values": dict(zip(names, deltas)),
    }
  json_path = os.path.join(workdir, EVAL_REPORT_JSON)
  write_strict_json(json_path, payload)

  header, rows = _table(reports)
  lines = [f"# {title}", ""]
  lines.append("| " + " | ".join(header) + " |")
  lines.append("|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|")
  for row in rows:
    lines.append("| " + " | ".join(row) + " |")
  md_path = os.path.join(workdir, EVAL_REPORT_MD)
  with open(md_path, "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
  return json_path, md_path


def format_eval_table(reports: Mapping[str, Mapping[str, Any]]) -> str:
  """Plain-text, column-aligned version of the `write_eval_report` table.

  Args:
    reports: checkpoint name -> {metric name: scalar}.

  Returns:
    A multi-line string (no trailing newline): header, a rule, one row per
    metric; the metric column is left-aligned, numbers right-aligned.
  """
  header, rows = _table(reports)
  widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]

  def _line(cells: Sequence[str]) -> str:
    parts = [cells[0].ljust(widths[0])]
    parts += [cell.rjust(w) for cell, w in zip(cells[1:], widths[1:])]
    return "  ".join(parts).rstrip()

  out = [_line(header), "  ".join("-" * w for w in widths)]
  out += [_line(r) for r in rows]
  return "\n".join(out)


# ----------------------------------------------------------------------------
# Plots
# ----------------------------------------------------------------------------


def held_out_points(
    reports: Mapping[str, Mapping[str, Any]],
    steps: Mapping[str, int],
    metric: str = "accuracy",
) -> list[tuple[str, int, float]]:
  """[(checkpoint name, step, value)] of `metric` in held-out eval reports.

  Args:
    reports: checkpoint name ('initial', 'sft', 'rl') -> its eval metrics.
    steps: checkpoint name -> the global step it was evaluated at; checkpoints
      without a step, or whose `metric` is missing or not finite, are left out.
    metric: the eval metric to plot.
  """
  out = []
  for name, report in reports.items():
    value = report.get(metric)
    if (
        name in steps
        and isinstance(value, numbers.Real)
        and math.isfinite(float(value))
    ):
      out.append((name, int(steps[name]), float(value)))
  return out


def plot_learning_curves(
    workdir: str,
    keys: Sequence[str],
    filename: str = "learning_curves.png",
    held_out: Sequence[tuple[str, int, float]] = (),
    held_out_key: str | None = None,
) -> str | None:
  """Plots metrics from `{workdir}/metrics.jsonl` against step.

  One subplot per key that has at least one finite value (NaN / null points
  are skipped). Uses matplotlib's non-interactive Agg backend. Held-out
  evaluation points (e.g. `held_out_points(reports, steps)`) are drawn as
  labelled markers on the subplot of `held_out_key`, next to the training
  metric of the same name (training batches sample at temperature; the
  held-out points are greedy on fixed tasks).

  Args:
    workdir: run directory containing metrics.jsonl; the PNG is written there.
    keys: full metric names as stored (e.g. "train/loss", "eval/pass@1").
    filename: output file name inside `workdir`.
    held_out: [(label, step, value)] points of the held-out evaluation.
    held_out_key: the key whose subplot shows them (added if it has no data).

  Returns:
    Path of the PNG, or None if none of `keys` has data (and there are no
    held-out points).
  """
  records = read_metrics(workdir)
  series = {}
  for key in keys:
    pts = [
        (r["step"], r[key])
        for r in records
        if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])
    ]
    if pts:
      series[key] = pts
  if held_out and held_out_key is not None and held_out_key not in series:
    series[held_out_key] = []
  if not series:
    return None

  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  n = len(series)
  ncols = min(n, 3)
  nrows = -(-n // ncols)
  fig, axes = plt.subplots(
      nrows, ncols, figsize=(4.5 * ncols, 3.2 * nrows), squeeze=False
  )
  try:
    for ax, (key, pts) in zip(axes.flat, series.items()):
      if pts:
        pts.sort(key=lambda p: p[0])
        xs, ys = zip(*pts)
        ax.plot(
            xs,
            ys,
            marker="." if len(xs) < 50 else None,
            linewidth=1.2,
            label="training batches" if key == held_out_key else None,
        )
      if key == held_out_key and held_out:
        hx = [p[1] for p in held_out]
        hy = [p[2] for p in held_out]
        # Markers only: nothing was measured between the evaluations.
        ax.plot(
            hx,
            hy,
            linestyle="none",
            marker="*",
            markersize=11,
            color="C3",
            label="held-out (greedy)",
        )
        for label, x, y in held_out:
          ax.annotate(
              f"{label} {y:.3f}",
              (x, y),
              textcoords="offset points",
              xytext=(4, -12),
              fontsize=8,
              color="C3",
          )
        ax.legend(fontsize=8, loc="best")
      ax.set_title(key, fontsize=10)
      ax.set_xlabel("step")
      ax.grid(True, alpha=0.3)
    for ax in list(axes.flat)[n:]:
      ax.axis("off")
    fig.tight_layout()
    path = os.path.join(workdir, filename)
    fig.savefig(path, dpi=100)
  finally:
    plt.close(fig)
  return path
