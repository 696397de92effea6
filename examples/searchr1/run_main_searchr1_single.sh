#!/usr/bin/env bash
# Train on this node with one config of examples/searchr1/config (Ray starts inside the run):
#   bash examples/searchr1/run_main_searchr1_single.sh CONFIG_NAME [key=value ...]
#   bash examples/searchr1/run_main_searchr1_single.sh qwen2.5-3b-tool-fsdp-1node \
#       rollout.model.model_path=/models/Qwen2.5-3B-Instruct
# The retrieval server must be up first (examples/searchr1/launch_local_server.sh). PYTHON picks the
# interpreter; the log goes to logs/<time>-<config>.log as well as the terminal.
set -euo pipefail
EXAMPLE_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$EXAMPLE_DIR/../.." && pwd)"
CONFIG_NAME="${1:-qwen2.5-3b-tool-fsdp-1node}"
shift $(( $# > 0 ? 1 : 0 ))
PYTHON="${PYTHON:-python}"
ENTRY="${ENTRY:-main_searchr1.py}"  # run_main_searchr1_single_eval.sh sets main_searchr1_eval.py

# Ray workers import rlinf_search by module name: the checkout must be on their path too.
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
# Tokenizers' own thread pool would fight the agent loop's threads (and warns after a fork).
export TOKENIZERS_PARALLELISM=false

LOG_DIR="${LOG_DIR:-$REPO/logs}"
mkdir -p "$LOG_DIR"
LOG="$LOG_DIR/$(date +%Y%m%d-%H%M%S)-$CONFIG_NAME.log"
echo "config $CONFIG_NAME, log $LOG"
"$PYTHON" "$EXAMPLE_DIR/$ENTRY" --config-name "$CONFIG_NAME" "$@" 2>&1 | tee "$LOG"
