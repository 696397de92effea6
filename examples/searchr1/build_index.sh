#!/usr/bin/env bash
# Build retrieval indexes over a corpus.
#   bash examples/searchr1/build_index.sh CORPUS OUT_DIR [RETRIEVER] [extra build_index args]
# RETRIEVER: bm25, minilm (offline default), e5, bge, or hybrid (bm25 + a dense one; the default).
# For wiki-18 with e5 on GPUs: bash examples/searchr1/build_index.sh wiki-18.jsonl indexes e5 --index-type Flat
set -euo pipefail
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'
    echo "The extra args are those of \`rlinf-search index build --help\`."
    exit 0
fi
CORPUS="${1:?usage: build_index.sh CORPUS OUT_DIR [RETRIEVER] [args...] (--help for more)}"
OUT="${2:?usage: build_index.sh CORPUS OUT_DIR [RETRIEVER] [args...] (--help for more)}"
RETRIEVER="${3:-hybrid}"
shift $(( $# < 3 ? $# : 3 ))
PY="${PYTHON:-python}"
exec "$PY" -m rlinf_search.cli index build --corpus "$CORPUS" --out "$OUT" --retriever "$RETRIEVER" "$@"
