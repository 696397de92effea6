#!/usr/bin/env bash
# RLinf's converter command, at RLinf's path and with its positional arguments, so RLinf's Search-R1 docs
# work as written:
#   bash toolkits/ckpt_convertor/megatron_convertor/mg2hf_3b.sh MEGATRON_CKPT HF_OUT ORIGINAL_HF
# MEGATRON_CKPT: a Megatron torch-format checkpoint (its root, an iter_N folder, or mp_rank_* shards);
# HF_OUT: where the Hugging Face model goes; ORIGINAL_HF: the model the run started from (Qwen2.5-3B-Instruct),
# whose config.json and tokenizer go beside the weights. Any Qwen2 size converts: the shapes come from
# ORIGINAL_HF/config.json, so the name's "3b" is only RLinf's.
set -euo pipefail
if [ "$#" -ne 3 ]; then
    echo "usage: $0 MEGATRON_CKPT HF_OUT ORIGINAL_HF" >&2
    exit 2
fi
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
PY="${PYTHON:-python}"
cd "$ROOT"
exec "$PY" -m toolkits.convert_megatron_to_hf --ckpt-path "$1" --save-path "$2" --hf-model-path "$3"
