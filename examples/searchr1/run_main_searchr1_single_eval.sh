#!/usr/bin/env bash
# Score a checkpoint on this node with an eval config of examples/searchr1/config (Ray starts inside the run):
#   bash examples/searchr1/run_main_searchr1_single_eval.sh CONFIG_NAME [key=value ...]
#   bash examples/searchr1/run_main_searchr1_single_eval.sh qwen2.5-3b-tool-1node-eval \
#       rollout.model.model_path=results/RUN/checkpoints/global_step_N/hf_model
# The retrieval server must be up first (examples/searchr1/launch_local_server.sh). PYTHON picks the
# interpreter; the log goes to logs/<time>-<config>.log as well as the terminal.
set -euo pipefail
EXAMPLE_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$EXAMPLE_DIR/../.." && pwd)"
CONFIG_NAME="${1:-qwen2.5-3b-tool-1node-eval}"
shift $(( $# > 0 ? 1 : 0 ))
PYTHON="${PYTHON:-python}"

# Ray workers import rlinf_search by module name: the checkout must be on their path too.
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
# Tokenizers' own thread pool would fight the agent loop's threads (and warns after a fork).
export TOKENIZERS_PARALLELISM=false

LOG_DIR="${LOG_DIR:-$REPO/logs}"
mkdir -p "$LOG_DIR"
LOG="$LOG_DIR/$(date +%Y%m%d-%H%M%S)-$CONFIG_NAME.log"
echo "config $CONFIG_NAME, log $LOG"
"$PYTHON" "$EXAMPLE_DIR/main_searchr1_eval.py" --config-name "$CONFIG_NAME" "$@" 2>&1 | tee "$LOG"
