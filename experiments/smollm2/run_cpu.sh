#!/bin/bash
# The CPU runs of experiments/smollm2/README.md, one after the other (two
# SmolLM2 runs side by side ran this 23 GB machine out of memory alongside
# other jobs), each under /usr/bin/time -v (peak RSS, wall-clock), then the
# summaries. Usage: bash experiments/smollm2/run_cpu.sh RUNS_DIR [CONFIG...]
set -u
runs=${1:-runs/smollm2}
shift || true
configs=${@:-bfcl gsm_tool}
mkdir -p "$runs"
for c in $configs; do
  nice -n 10 /usr/bin/time -v python main.py --config=configs/smollm2_$c.py \
    --workdir="$runs/$c" > "$runs/$c.log" 2>&1
  python -m experiments.smollm2.report "$runs/$c" --log="$runs/$c.log" \
    > "$runs/$c.summary.md" 2>&1
done
