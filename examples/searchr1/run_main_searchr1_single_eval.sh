#!/usr/bin/env bash
# Score a checkpoint on this node with an eval config of examples/searchr1/config (Ray starts inside the run):
#   bash examples/searchr1/run_main_searchr1_single_eval.sh CONFIG_NAME [key=value ...]
#   bash examples/searchr1/run_main_searchr1_single_eval.sh qwen2.5-3b-tool-1node-eval \
#       rollout.model.model_path=results/RUN/checkpoints/global_step_N/hf_model
# It runs `rlinf-search eval CONFIG_NAME ...` through the training launcher: same environment and overrides.
set -euo pipefail
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'
    exit 0
fi
CONFIG_NAME="${1:-qwen2.5-3b-tool-1node-eval}"
shift $(( $# > 0 ? 1 : 0 ))
COMMAND=eval exec bash "$(dirname "${BASH_SOURCE[0]}")/run_main_searchr1_single.sh" "$CONFIG_NAME" "$@"
