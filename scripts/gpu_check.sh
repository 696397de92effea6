#!/usr/bin/env bash
# The GPU checks, in one go, on a single-GPU machine that has torch and transformers but no network, vLLM or Ray
# (the machine this project borrows for 15 minutes at a time). 5 min 45 s on an H200; each step has its own timeout, so
# one that hangs or fails leaves the others' results. Everything printed also goes to $OUT/gpu_check.log.
#
#   here:  bash scripts/gpu_wheels.sh                       # the wheels it carries (.whl/, ignored by git)
#   there: bash scripts/gpu_check.sh                        # from the repository root, with .whl/ beside it
#
# Steps: the machine and versions; tests/test_gpu.py (FSDP2 bf16 update, packed vs padded rows through the GPU
# attention kernels: sdpa_varlen, flex, flash; 0.5B peak memory against toolkits.memory_plan); benchmarks/gpu_actor_step.py at the
# Qwen2.5-3B shape for FSDP2 (packed rows through sdpa_varlen, and a 16k-token micro-batch) and for Megatron (peak memory vs plan, tokens/s, MFU); benchmarks/matmul_dtypes.py
# (the dtype of every matmul of a Megatron update with full recompute, forward and backward apart);
# benchmarks/offload_memory.py for FSDP2 and Megatron at the 0.5B shape (device memory before, during and after
# actor.offload_*); benchmarks/ipc_sync.py at the 3B shape (a CUDA IPC weight sync into an HF engine on the same
# GPU: seconds, host RSS, bit-exact); benchmarks/grpo_step.py (a whole GRPO step in one process, no Ray);
# benchmarks/weight_sync.py at the 1.5B shape (the actor's gather for a weight
# sync, fp32 against bf16). The step timeouts add up to about 30 minutes, three times what one call may run: pick a
# named set below (each fits one call) or steps with GPU_CHECK_STEPS. Results go into docs/benchmarks.md (a row of its table and a section with the output).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-outputs/gpu_check}"
mkdir -p "$OUT"
LOG="$OUT/gpu_check.log"
: > "$LOG"
export PYTHONUNBUFFERED=1 PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
PY="${PY:-python3}"

STEPS="${GPU_CHECK_STEPS:-all}"  # e.g. GPU_CHECK_STEPS="machine offload_fsdp" runs just those (a short loan)
# Named sets, each under one 10-minute call by its timeouts:
#   packing (470 s): packed rows through sdpa_varlen, flex and flash against padded sdpa (log-probs and gradients),
#   the 3B FSDP2 update with packed rows (MFU), and a 16k-token packed micro-batch at the 3B shape.
#   mfu (550 s): the 3B update's levers side by side: FSDP2 eager and with compiled layers, Megatron with SDPA core
#   attention (MFU, HFU, gather s; toolkits/update_flops.py's count).
#   megatron (560 s): Megatron at 3B with its local and its SDPA core attention, and the dtype of every matmul.
#   grpo (about 240 s): a whole GRPO step in one process at the 0.5B shape (HF engine rollout, FSDP2 update, the
#   bucket sync device to device: benchmarks/grpo_step.py) and the CUDA IPC sync between two processes.
#   sync (about 300 s): the CUDA IPC sync at the 3B shape (sender and HF engine on one GPU: seconds, host RSS, exact)
#   and the actor's gather for a sync (fp32 against bf16); tests/test_gpu.py holds the IPC correctness test.
case "$STEPS" in
    packing) STEPS="machine test_gpu gpu_actor_step_fsdp packed_16k" ;;
    sync) STEPS="machine ipc_sync weight_sync" ;;
    grpo) STEPS="machine grpo_step ipc_sync" ;;
    mfu) STEPS="machine gpu_actor_step_fsdp gpu_actor_step_fsdp_compile gpu_actor_step_megatron_sdpa" ;;
    megatron) STEPS="machine gpu_actor_step_megatron gpu_actor_step_megatron_sdpa matmul_dtypes" ;;
esac
step() {  # step NAME SECONDS COMMAND...: run one check under its own timeout, its output in the log
    local name="$1" seconds="$2"
    shift 2
    [[ "$STEPS" == all || " $STEPS " == *" $name "* ]] || return 0
    echo "== $name (timeout ${seconds} s): $*" | tee -a "$LOG"
    local started=$SECONDS
    timeout --kill-after=10 "$seconds" "$@" 2>&1 | grep -v "warnings.warn\|UserWarning" | tee -a "$LOG"
    local rc=${PIPESTATUS[0]}
    echo "== $name: exit $rc after $((SECONDS - started)) s" | tee -a "$LOG"
}

if ls .whl/*.whl > /dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gpu_check_site \
        .whl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/gpu_check_site"
fi
step machine 60 bash -c "nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; \
    $PY -c 'import sys, torch, transformers; print(sys.version.split()[0], \"torch\", torch.__version__, \
\"cuda\", torch.version.cuda, \"transformers\", transformers.__version__)'; \
    $PY -c 'import megatron.core, faiss, bm25s; print(\"megatron-core\", megatron.core.__version__)'"
step test_gpu 130 "$PY" -m pytest -q -p no:cacheprovider tests/test_gpu.py
step gpu_actor_step_fsdp 130 "$PY" benchmarks/gpu_actor_step.py --shape qwen2.5-3b
step packed_16k 150 "$PY" benchmarks/gpu_actor_step.py --shape qwen2.5-3b --mbs-tokens 16384 --rows 8 --updates 1
step gpu_actor_step_fsdp_compile 160 "$PY" benchmarks/gpu_actor_step.py --shape qwen2.5-3b --compile-layers
step gpu_actor_step_megatron 200 "$PY" benchmarks/gpu_actor_step.py --shape qwen2.5-3b --backend megatron
step gpu_actor_step_megatron_sdpa 200 "$PY" benchmarks/gpu_actor_step.py --shape qwen2.5-3b --backend megatron \
    --core-attention sdpa
step matmul_dtypes 100 "$PY" benchmarks/matmul_dtypes.py --shape qwen2.5-0.5b --backends megatron --recompute full
step offload_fsdp 90 "$PY" benchmarks/offload_memory.py --shape qwen2.5-0.5b --backend fsdp
step offload_megatron 90 "$PY" benchmarks/offload_memory.py --shape qwen2.5-0.5b --backend megatron
step ipc_sync 150 "$PY" benchmarks/ipc_sync.py --shape qwen2.5-3b
step grpo_step 150 "$PY" benchmarks/grpo_step.py --shape qwen2.5-0.5b --prompts 16 --group 4
step weight_sync 150 "$PY" benchmarks/weight_sync.py --ranks 1 --shape qwen2.5-1.5b --dtypes float32,bfloat16
echo "gpu_check: done; log in $LOG" | tee -a "$LOG"
