"""python -m experiments.rm_selection.kv [--seeds=0,1,...] [--smoke]

The folder's second declared claim (SPEC_KV of __main__.py), on key-value
chains: a process reward model selects correct episodes at best-of-8 more
often than an outcome reward model, decided only with the positive-control
check that the outcome RM picks better than a random sample in the same
decision run. The same rm-mode runs as `python -m experiments.rm_selection
--tasks=kv_chain` (that command is this one); writes results_kv.*.
"""

import sys

from experiments.rm_selection import __main__ as rm_main

SPEC = rm_main.SPEC_KV

if __name__ == "__main__":
  rm_main.main(["--tasks=kv_chain", *sys.argv[1:]])
