#!/usr/bin/env bash
# Train on this node with one config of examples/searchr1/config (Ray starts inside the run):
#   bash examples/searchr1/run_main_searchr1_single.sh CONFIG_NAME [key=value ...]
#   bash examples/searchr1/run_main_searchr1_single.sh qwen2.5-3b-tool-fsdp-1node \
#       rollout.model.model_path=/models/Qwen2.5-3B-Instruct
# The retrieval server must be up first (examples/searchr1/launch_local_server.sh). It runs
# `rlinf-search train CONFIG_NAME ...`; check a config first with `rlinf-search check CONFIG_NAME ... --no-files`.
# PYTHON picks the interpreter. The log is runner.output_dir/driver.log; nothing is written to the current folder
# but the run's output_dir where the config puts it there (the GPU recipes: results/<experiment_name>).
set -euo pipefail
EXAMPLE_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$EXAMPLE_DIR/../.." && pwd)"
COMMAND="${COMMAND:-train}"  # run_main_searchr1_single_eval.sh sets eval
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'
    echo
    echo "recipes: $(cd "$EXAMPLE_DIR/config" && ls ./*.yaml | sed 's|^\./||; s|\.yaml$||' | tr '\n' ' ')"
    exit 0
fi
CONFIG_NAME="${1:-qwen2.5-3b-tool-fsdp-1node}"
shift $(( $# > 0 ? 1 : 0 ))
PYTHON="${PYTHON:-python}"

# Ray workers import rlinf_search by module name: the checkout must be on their path too.
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
# Tokenizers' own thread pool would fight the agent loop's threads (and warns after a fork).
export TOKENIZERS_PARALLELISM=false
exec "$PYTHON" -m rlinf_search.cli "$COMMAND" "$CONFIG_NAME" "$@"
