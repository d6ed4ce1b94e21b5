"""Argument parsing and summaries shared by the benchmark scripts.

Kept apart from the scripts because each script defines its absl flags at
import, and two scripts imported into one test process would define the same
flag twice.
"""

from __future__ import annotations

import ast
import functools
import os
import sys

from absl import app
import ml_collections


def one_line_usage_errors(main):
  """Wraps an absl `main` so that an `app.UsageError` it raises is printed
  as one line ('<script>: error: <message>') with exit code 2, instead of
  absl's whole usage text (the module docstring) above it. Flag-parsing
  errors are absl's own and unchanged."""

  @functools.wraps(main)
  def wrapped(argv):
    try:
      return main(argv)
    except app.UsageError as e:
      print(f"{os.path.basename(sys.argv[0])}: error: {e}", file=sys.stderr)
      sys.exit(2)

  return wrapped


def _parse_per_engine(
    flag: str, text: str, engines: tuple[str, ...], num_prompts: int, why: str
) -> dict[str, int]:
  """{engine: N} of a per-engine integer flag: 'N' for every engine, or
  'engine=N,...' (engines not named get 1); each N an integer >= 1 that
  divides `num_prompts` (`why` says why, in the error)."""
  text = text.strip()
  out = dict.fromkeys(engines, 1)
  if "=" not in text:
    items = [(e, text) for e in engines]
  else:
    items = []
    for part in text.split(","):
      engine, _, value = part.partition("=")
      if engine.strip() not in engines:
        raise app.UsageError(
            f"--{flag}: unknown engine {engine.strip()!r} in {text!r}; "
            f"choose from {engines}"
        )
      items.append((engine.strip(), value))
  for engine, value in items:
    try:
      n = int(value)
    except ValueError:
      n = 0
    if n < 1:
      raise app.UsageError(
          f"--{flag}={text}: {value.strip()!r} is not an integer >= 1"
      )
    if num_prompts % n:
      raise app.UsageError(
          f"--{flag}={text}: {n} must divide the {num_prompts} prompts ({why})"
      )
    out[engine] = n
  return out


def parse_micro_batches(
    text: str, num_prompts: int, engines: tuple[str, ...]
) -> dict[str, int]:
  """{engine: micro-batches} of --micro_batches: 'N' for every engine, or
  'engine=N,...' (engines not named get 1).

  Raises:
    app.UsageError: on an unknown engine, a value that is not an integer >= 1,
      or one that does not divide `num_prompts` (tunix counts micro-batches in
      prompts).
  """
  return _parse_per_engine(
      "micro_batches",
      text,
      engines,
      num_prompts,
      "tunix counts micro-batches in prompts",
  )


def parse_cpu_devices(
    text: str, num_prompts: int, engines: tuple[str, ...]
) -> dict[str, int]:
  """{engine: XLA CPU devices} of bench_peers' --cpu_devices: 'N' for every
  engine of `engines` (the JAX engines), or 'engine=N,...' (engines not
  named get 1).

  Raises:
    app.UsageError: on an engine not in `engines`, a value that is not an
      integer >= 1, or one that does not divide `num_prompts` (each device
      holds whole prompt groups).
  """
  return _parse_per_engine(
      "cpu_devices",
      text,
      engines,
      num_prompts,
      "each device holds whole prompt groups",
  )


def parse_values(text: str) -> list:
  """The '|'-separated Python literals of --values.

  Raises:
    app.UsageError: on an empty list or a value that is not a literal.
  """
  out = []
  for part in text.split("|"):
    try:
      out.append(ast.literal_eval(part.strip()))
    except (ValueError, SyntaxError) as e:
      raise app.UsageError(
          f"--values: {part!r} is not a Python literal ({e})"
      ) from e
  return out


def set_config_path(config, path: str, value) -> None:
  """config.<path> = value for a dotted path to an existing leaf field.

  Raises:
    app.UsageError: if a component of the path is not in the config, the path
      names a group of fields rather than one, or the value's type does not
      fit the field (ml_collections' type check).
  """
  *parents, leaf = path.split(".")
  node = config
  for p in parents + [leaf]:
    if p not in node:
      raise app.UsageError(f"--target=config:{path}: no field {p!r}")
    if p != leaf:
      node = node[p]
  if isinstance(node[leaf], ml_collections.ConfigDict):
    raise app.UsageError(
        f"--target=config:{path}: a group of fields, not one field"
    )
  try:
    node[leaf] = value
  except TypeError as e:
    raise app.UsageError(f"--target=config:{path}={value!r}: {e}") from e


def paired_summary(first: list[float], second: list[float]) -> dict:
  """Median, mean and sample sd of second - first (pairs by index), and the
  ratio of the medians."""
  import numpy as np  # pylint: disable=g-import-not-at-top

  a, b = np.asarray(first), np.asarray(second)
  d = b - a
  return dict(
      median=float(np.median(d)),
      mean=float(d.mean()),
      sd=float(d.std(ddof=1)) if len(d) > 1 else float("nan"),
      ratio=float(np.median(b) / np.median(a)),
  )
