#!/usr/bin/env bash
# Serve a built index on this machine (foreground; Ctrl-C stops it).
#   bash examples/searchr1/launch_local_server.sh INDEX_DIR CORPUS [RETRIEVER] [extra server args]
# Then point the trainer at it: tools.search.server_addr=127.0.0.1:8000
# On GPUs with a wiki-18 e5 Flat index: ... e5 --faiss-gpu   (or --mmap-index to keep RAM free)
# HOST=0.0.0.0 serves other machines too (a multi-node run's other nodes); the default listens on loopback only.
# REPLICAS=N starts N servers of the same index on PORT, PORT+1, ... (one per GPU with --faiss-gpu: server i sees
# GPU i); the trainer then lists them all: tools.search.server_addr='[127.0.0.1:8000,127.0.0.1:8001]'.
set -euo pipefail
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'
    echo "The extra args are those of \`rlinf-search index serve --help\`."
    exit 0
fi
INDEX_DIR="${1:?usage: launch_local_server.sh INDEX_DIR CORPUS [RETRIEVER] [args...] (--help for more)}"
CORPUS="${2:?usage: launch_local_server.sh INDEX_DIR CORPUS [RETRIEVER] [args...] (--help for more)}"
RETRIEVER="${3:-hybrid}"
shift $(( $# < 3 ? $# : 3 ))
PY="${PYTHON:-python}"
REPLICAS="${REPLICAS:-1}"
PORT="${PORT:-8000}"
serve() {
    "$PY" -m rlinf_search.cli index serve --index-dir "$INDEX_DIR" --corpus "$CORPUS" \
        --retriever "$RETRIEVER" --host "${HOST:-127.0.0.1}" --port "$1" --topk "${TOPK:-3}" "${@:2}"
}
if [ "$REPLICAS" -le 1 ]; then
    exec "$PY" -m rlinf_search.cli index serve --index-dir "$INDEX_DIR" --corpus "$CORPUS" \
        --retriever "$RETRIEVER" --host "${HOST:-127.0.0.1}" --port "$PORT" --topk "${TOPK:-3}" "$@"
fi
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; wait' EXIT INT TERM
addrs=()
for ((i = 0; i < REPLICAS; i++)); do
    CUDA_VISIBLE_DEVICES="$i" serve $((PORT + i)) "$@" &
    pids+=($!)
    addrs+=("${HOST:-127.0.0.1}:$((PORT + i))")
done
echo "serving $REPLICAS replicas: tools.search.server_addr='[$(IFS=,; echo "${addrs[*]}")]'"
wait -n "${pids[@]}"  # the first replica to exit stops the others (the trap), as Ctrl-C does
