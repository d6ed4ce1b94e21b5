"""Compares an `hlo_identity` record with a reference, up to renamed outputs.

    python experiments/hlo_result_info_renames.py REF.json NEW.json

Moving the feature states into `TrainState.features` (kl coefficient,
replay buffer, dual coefficient, log Z, SPA head) changed the jitted RL
step's output NAMES only: the `jax.result_info`
strings of the state's leaves (e.g. "result[0].kl_coef" ->
"result[0].features['kl']"). This applies those renames (RENAMES) to the
REFERENCE's result_info strings and then requires the whole canonical text
to be equal character for character; any other difference (an op, an
operand, a shape, a sharding, the argument order, donation) is reported.
No jax import: it reads the two JSON records (`hlo_identity check --out`).
"""

import json
import re
import sys

RENAMES = (
    ("kl_coef", "features['kl']"),
    ("replay", "features['replay']"),
    ("dual_coef", "features['dual']"),
    ("log_partition_opt_state", "features['flowrl'].opt_state"),
    ("log_partition", "features['flowrl'].params"),
    ("spa", "features['spa']"),
)
_INFO = re.compile(r'jax\.result_info = "([^"]*)"')


def _rename(m: re.Match) -> str:
  """One result_info attribute with its TrainState field renamed."""
  s = m.group(1)
  for old, new in RENAMES:
    pat = r"^(result\[0\])\." + re.escape(old) + r"(?=$|[.\[])"
    s2 = re.sub(pat, lambda g, new=new: g.group(1) + "." + new, s)
    if s2 != s:
      s = s2
      break
  return f'jax.result_info = "{s}"'


def main(argv) -> int:
  ref = json.load(open(argv[1]))["variants"]
  new = json.load(open(argv[2]))["variants"]
  bad = 0
  for name in sorted(new):
    a, b = ref.get(name, {}).get("text"), new[name].get("text")
    if a is None or b is None:
      print(f"{name:28s} skipped (no text)")
      continue
    if a == b:
      print(f"{name:28s} identical")
      continue
    if _INFO.sub(_rename, a) == b:
      n = sum(x != y for x, y in zip(_INFO.findall(a), _INFO.findall(b)))
      print(f"{name:28s} identical up to {n} renamed result_info path(s)")
      continue
    bad += 1
    print(f"{name:28s} DIFFERENT")
  print(f"{bad} variant(s) different")
  return 1 if bad else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
