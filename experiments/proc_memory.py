"""Resident-memory readings of this process from Linux's /proc (benchmarks).

Flag-free and dependency-free, shared by the benchmark scripts that report
a peak RSS per measured section (experiments/bench_real.py,
experiments/bench_smollm2_calc.py).
"""

from __future__ import annotations


def proc_status_kb(field: str) -> float:
  """A /proc/self/status field in kB ('VmRSS', 'VmHWM'), or NaN where the
  file or the field is missing (not Linux)."""
  try:
    with open("/proc/self/status") as f:
      for line in f:
        if line.startswith(field + ":"):
          return float(line.split()[1])
  except OSError:
    pass
  return float("nan")


def reset_hwm() -> bool:
  """Resets VmHWM (the peak RSS /proc reports, which ru_maxrss reads too) to
  the current RSS: '5' written to /proc/self/clear_refs (Linux >= 4.0).
  Returns False where the kernel refuses it."""
  try:
    with open("/proc/self/clear_refs", "w") as f:
      f.write("5")
    return True
  except OSError:
    return False
