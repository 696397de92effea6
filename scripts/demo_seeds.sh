#!/usr/bin/env bash
# The demo on several seeds and CPU kernel sets, one run after another, and one table: the machine, warm-start EM,
# after-RL EM, gain, searches, the probes at the end of each warm-start stage, and minutes per stage.
#   bash scripts/demo_seeds.sh                                   # seeds 0 1 2, this machine's kernels
#   DEMO_KERNELS="native avx2" bash scripts/demo_seeds.sh        # and each again with ATEN_CPU_CAPABILITY=avx2
#   DEMO_SEEDS="0 1 2 0" bash scripts/demo_seeds.sh              # a seed named twice runs twice (determinism)
# DEMO_KERNELS: `native` leaves PyTorch's choice; any other word is an ATEN_CPU_CAPABILITY value (avx2, avx512,
# default: the kernels of another CPU, summing in another order). Each run's log is RUN_DIR.log beside its
# outputs; the table is also written to table.md.
set -euo pipefail
source "$(dirname "$0")/setup_env.sh"
cd "$ROOT"
BASE="${DEMO_SEEDS_OUT:-outputs/demo_seeds}"
mkdir -p "$BASE"
runs=()
i=0
for seed in ${DEMO_SEEDS:-0 1 2}; do
    for kernels in ${DEMO_KERNELS:-native}; do
        i=$((i + 1))
        run="$BASE/run${i}_seed${seed}_${kernels}"
        echo "== run $i: seed $seed, kernels $kernels -> $run (log: $run.log)"
        mkdir -p "$run"
        started=$(date +%s)
        (
            [ "$kernels" != native ] && export ATEN_CPU_CAPABILITY="$kernels"
            DEMO_SEED="$seed" DEMO_OUT="$run" bash scripts/demo.sh
        ) > "$run.log" 2>&1 && ok=1 || ok=0
        echo "$(( $(date +%s) - started ))" > "$run/seconds"
        if [ "$ok" = 1 ]; then
            tail -n 1 "$run.log"
        else
            echo "run $i (seed $seed, kernels $kernels) failed: $(grep -v '^\s*$' "$run.log" | tail -n 1)" >&2
        fi
        runs+=("$run")
    done
done
"$PY" examples/searchr1/demo_seeds_table.py "${runs[@]}" | tee "$BASE/table.md"
