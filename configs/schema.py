"""The config schema: every field's default, type and meaning, in one place.

The schema IS the reference config file of each mode: configs/default.py for
mode 'rl' (every RL run's config derives from it) and configs/rm_arithmetic.py
for mode 'rm' (reward-model training). A field's default is the value that file
sets, its type is the type of that value, and its meaning is the comment above
the assignment there (or in configs/common.py for the shared blocks, or in
agentic_rl/models/transformer.py for the model's shape fields). No library code
repeats a default: it reads `config.a.b` after `with_defaults` has filled every
field a config left out.

Blocks in OPEN_BLOCKS hold free-form keys checked by their owners (environment
fields, reward names and parameters, loader fields, rm-mode negative types);
the schema types the block but not its keys.

`python -m configs.schema [rl|rm]` prints the table (path, type, default, meaning).
"""

from __future__ import annotations

import copy
import dataclasses
import os
import re
import sys
from typing import Any

import ml_collections

MODES = ("rl", "rm")
# Blocks whose keys are checked by their owner, not against the schema:
# environment fields (the environment's dataclass), loader fields
# (data.validate_data_config), reward names and parameters (rewards/components.py) and
# rm-mode negative types (rm_train.validate_rm_config).
OPEN_BLOCKS = (
    "env",
    "data",
    "rl.rewards",
    "rl.reward_params",
    "rl.reward_schedules",
    "rl.reward_noise",
    "rm.imperfect",
)
_BLOCK_TYPES = (ml_collections.ConfigDict, dict)


@dataclasses.dataclass(frozen=True)
class Field:
  """One schema entry.

  Attributes:
    path: dotted path, e.g. 'rl.value_clip'.
    default: the reference config's value (a ConfigDict for a block).
    type: one of bool, int, float, str, tuple, ml_collections.ConfigDict.
  """

  path: str
  default: Any
  type: type


def mode_of(config) -> str:
  """The config's mode ('rl' or 'rm'); a config without the field is 'rl'."""
  return config["mode"] if "mode" in config else "rl"


def reference(mode: str = "rl") -> ml_collections.ConfigDict:
  """A fresh copy of the reference config of `mode` (the schema's defaults).

  Raises:
    ValueError: unknown mode.
  """
  if mode == "rl":
    from configs import default  # noqa: PLC0415 -- default.py imports common.py

    return default.get_config()
  if mode == "rm":
    from configs import rm_arithmetic  # noqa: PLC0415

    return rm_arithmetic.get_config()
  raise ValueError(f"config.mode={mode!r}: must be one of {MODES}")


def _type_of(value) -> type:
  if isinstance(value, _BLOCK_TYPES):
    return ml_collections.ConfigDict
  if isinstance(value, list):
    return tuple
  return type(value)


def flatten(node, prefix: str = "") -> dict[str, Any]:
  """{dotted path: value} of every field and sub-block of a ConfigDict / dict,
  not looking inside OPEN_BLOCKS."""
  out = {}
  for key, value in node.items():
    path = f"{prefix}{key}"
    out[path] = value
    if isinstance(value, _BLOCK_TYPES) and path not in OPEN_BLOCKS:
      out.update(flatten(value, path + "."))
  return out


def fields(mode: str = "rl") -> dict[str, Field]:
  """{dotted path: Field} of every field and block of the schema of `mode`
  (the keys inside OPEN_BLOCKS are not listed).

  Raises:
    ValueError: unknown mode.
  """
  return {
      path: Field(path, value, _type_of(value))
      for path, value in flatten(reference(mode)).items()
  }


def type_error(path: str, value, expected: type) -> str | None:
  """Why `value` is not of the schema type `expected`, or None if it is.

  Accepts an int for a float, a list for a tuple and a dict for a block; a bool
  is never taken for a number.
  """
  ok = {
      bool: lambda v: isinstance(v, bool),
      int: lambda v: isinstance(v, int) and not isinstance(v, bool),
      float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
      str: lambda v: isinstance(v, str),
      tuple: lambda v: isinstance(v, (tuple, list)),
      ml_collections.ConfigDict: lambda v: isinstance(v, _BLOCK_TYPES),
  }.get(expected, lambda v: isinstance(v, expected))
  if ok(value):
    return None
  name = expected.__name__
  want = (
      "a block of fields"
      if expected is ml_collections.ConfigDict
      else (f"{'an' if name[0] in 'aeiou' else 'a'} {name}")
  )
  return f"must be {want}, not {type(value).__name__}"


def with_defaults(config) -> ml_collections.ConfigDict:
  """A copy of `config` with every schema field it leaves out set to its default.

  Fills sub-blocks recursively, except the keys of OPEN_BLOCKS (their owners
  hold their defaults). Never changes a field the config sets, nor `config`
  itself (which may be locked). Idempotent.

  Args:
    config: a ConfigDict (or dict) of mode 'rl' or 'rm'.

  Returns:
    A new, unlocked ConfigDict.

  Raises:
    ValueError: an unknown config.mode.
  """
  out = ml_collections.ConfigDict(
      copy.deepcopy(
          config.to_dict() if hasattr(config, "to_dict") else dict(config)
      )
  )

  def fill(node, ref, prefix):
    for key, value in ref.items():
      path = f"{prefix}{key}"
      if key not in node:
        node[key] = copy.deepcopy(value)
      elif (
          path not in OPEN_BLOCKS
          and isinstance(value, _BLOCK_TYPES)
          and isinstance(node[key], _BLOCK_TYPES)
      ):
        fill(node[key], value, path + ".")

  fill(out, reference(mode_of(out)), "")
  return out


_SOURCES = {
    "rl": ("configs/common.py", "configs/default.py"),
    "rm": ("configs/common.py", "configs/rm_arithmetic.py"),
}
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _comment_meanings(relpath: str, owner: str) -> dict[str, str]:
  """{path: comment} for each `owner.PATH = ...` line of a config source file.

  The comment is the block of `#` lines above the assignment, found by walking
  up over the sibling assignments it heads (a blank line or an `if` / `def`
  line ends the walk), or the assignment's own trailing comment. The first
  assignment of a path wins (later ones, e.g. in a 'smoke' branch, change the
  value, not the meaning).
  """
  with open(os.path.join(_ROOT, relpath)) as f:
    lines = f.read().splitlines()
  out: dict[str, str] = {}
  for i, line in enumerate(lines):
    m = re.match(rf"^\s*{owner}\.([\w.]+)\s*=[^=]", line)
    if not m or m.group(1) in out:
      continue
    trailing = re.search(r"\s#\s*(.+)$", line)
    if trailing:
      out[m.group(1)] = trailing.group(1).strip()
      continue
    j = i - 1
    while j >= 0:
      text = lines[j].strip()
      if not text or re.match(r"^(if|elif|else|def|for|with|return)\b", text):
        break
      if text.startswith("#"):
        block = []
        while j >= 0 and lines[j].strip().startswith("#"):
          block.insert(0, lines[j].strip().lstrip("#").strip())
          j -= 1
        out[m.group(1)] = " ".join(block)
        break
      j -= 1
  return out


def _dict_meanings(
    relpath: str, openers: dict[str, tuple[str, ...]]
) -> dict[str, str]:
  """{path: comment} of the `key=value,` lines of dict literals in a source file.

  `openers` maps a regex matching the line that opens a dict (e.g.
  `config.eval = ml_collections.ConfigDict(dict(`; group 1, if any, is the
  block's path) to the block paths its keys belong to (used when the regex has
  no group). A key's comment is the `#` block above its line, or above the
  nearest key line before it in the same dict.
  """
  with open(os.path.join(_ROOT, relpath)) as f:
    lines = f.read().splitlines()
  out: dict[str, str] = {}
  parents: tuple[str, ...] = ()
  comment: list[str] = []
  last = ""
  for line in lines:
    text = line.strip()
    opened = False
    for pattern, blocks in openers.items():
      m = re.match(pattern, line)
      if m:
        parents, comment, last, opened = (
            (m.group(1),) if m.groups() else blocks,
            [],
            "",
            True,
        )
    if opened:
      continue
    if not parents:
      continue
    if text.startswith(")"):
      parents = ()
    elif text.startswith("#"):
      if last:  # a new comment after key lines starts a new group
        comment, last = [], ""
      comment.append(text.lstrip("#").strip())
    else:
      keys = re.findall(r"(?:^|,\s*)(\w+)=", text)
      if keys:
        last = " ".join(comment)
        for block in parents:
          for key in keys:
            out.setdefault(f"{block}.{key}", last)
  return {k: v for k, v in out.items() if v}


def _docstring_attributes(doc: str) -> dict[str, str]:
  """{name: text} of a Google-style docstring's `Attributes:` section."""
  out, name = {}, None
  section = doc.split("Attributes:", 1)[1] if "Attributes:" in doc else ""
  for line in section.splitlines():
    m = re.match(r"^    (\w+): (.*)$", line)
    if m:
      name = m.group(1)
      out[name] = m.group(2).strip()
    elif name and line.startswith("      "):
      out[name] += " " + line.strip()
    elif line.strip():
      name = None
  return out


def meanings(mode: str = "rl") -> dict[str, str]:
  """{path: one-line meaning} of the schema's fields of `mode`.

  From the comments above the assignments in the reference config files
  (configs/common.py, configs/default.py or configs/rm_arithmetic.py), the
  model's TransformerConfig docstring (model.*), the comments of
  agentic_rl.sharding.MESH_DEFAULTS (mesh.*) and of the lora block in
  configs/common.py (model.lora.*); a field with none of these (e.g. the
  optimizer fields of `sft` / `rl`, the fields of `eval`) takes its block's
  meaning, prefixed 'in: '.

  Raises:
    ValueError: unknown mode.
  """
  from agentic_rl.models import transformer  # noqa: PLC0415

  known = fields(mode)
  found: dict[str, str] = {}
  for rel in _SOURCES[mode]:
    found.update(_comment_meanings(rel, "config"))
  found.update(
      {
          f"model.{k}": v
          for k, v in _comment_meanings("configs/common.py", "cfg").items()
      }
  )
  found.update(
      {
          f"model.{k}": v
          for k, v in _docstring_attributes(
              transformer.TransformerConfig.__doc__
          ).items()
          if k != "lora"
      }
  )
  dict_sources = {
      "configs/common.py": {
          r"^\s*cfg\.(lora) = ml_collections\.ConfigDict\((?:dict\()?$": (),
          r"^\s*config\.(checkpoint) = ml_collections\.ConfigDict\((?:dict\()?$": (),
          r"^  return ml_collections\.ConfigDict\((?:dict\()?$": (
              "sft",
              "rl",
              "rm",
          ),
      },
      "configs/default.py": {
          r"^\s*config\.(eval) = ml_collections\.ConfigDict\((?:dict\()?$": ()
      },
      "configs/rm_arithmetic.py": {
          r"^\s*config\.(rm_eval) = ml_collections\.ConfigDict\((?:dict\()?$": ()
      },
      "agentic_rl/sharding.py": {r"^MESH_DEFAULTS = dict\($": ("mesh",)},
  }
  for rel, openers in dict_sources.items():
    for path, text in _dict_meanings(rel, openers).items():
      path = (
          path.replace("lora.", "model.lora.", 1)
          if path.startswith("lora.")
          else path
      )
      if path in known:
        found.setdefault(path, text)
  out = {}
  for path in known:
    if path in found:
      out[path] = found[path]
      continue
    parent = path.rpartition(".")[0]
    while parent and parent not in found:
      parent = parent.rpartition(".")[0]
    out[path] = f"in: {found[parent]}" if parent else ""
  return out


def main(argv) -> int:
  """Prints the schema of a mode: one line per field, `path type default meaning`."""
  mode = argv[1] if len(argv) > 1 else "rl"
  if mode not in MODES or len(argv) > 2:
    print(
        f"usage: python -m configs.schema [{'|'.join(MODES)}]", file=sys.stderr
    )
    return 2
  about = meanings(mode)
  for f in fields(mode).values():
    if f.type is ml_collections.ConfigDict:
      shown = "{...}" if f.path in OPEN_BLOCKS else "(block)"
    else:
      shown = repr(f.default)
    text = about[f.path]
    text = text if len(text) <= 100 else text[:97] + "..."
    print(f"{f.path:36s} {f.type.__name__:10s} {shown:12s} {text}")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
