#!/usr/bin/env bash
# The demo on several seeds, one after another, and one table: warm-start EM, after-RL EM, gain,
# searches before and after, minutes. A seed named twice runs twice (the determinism check).
#   bash scripts/demo_seeds.sh                          # seeds 0 1 2, outputs in outputs/demo_seeds
#   DEMO_SEEDS="0 1 2 0" bash scripts/demo_seeds.sh     # and seed 0 again
# Each run's log is RUN_DIR.log beside its outputs; the table is also written to table.md.
set -euo pipefail
source "$(dirname "$0")/setup_env.sh"
cd "$ROOT"
BASE="${DEMO_SEEDS_OUT:-outputs/demo_seeds}"
mkdir -p "$BASE"
runs=()
i=0
for seed in ${DEMO_SEEDS:-0 1 2}; do
    i=$((i + 1))
    run="$BASE/run${i}_seed${seed}"
    echo "== run $i: seed $seed -> $run (log: $run.log)"
    started=$(date +%s)
    if DEMO_SEED="$seed" DEMO_OUT="$run" bash scripts/demo.sh > "$run.log" 2>&1; then
        echo "$(( $(date +%s) - started ))" > "$run/seconds"
        tail -n 1 "$run.log"
    else
        echo "run $i (seed $seed) failed; see $run.log" >&2
    fi
    runs+=("$run")
done
"$PY" examples/searchr1/demo_seeds_table.py "${runs[@]}" | tee "$BASE/table.md"
