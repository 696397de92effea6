# Sourced by distill_demo.sh and distill_compare.sh (after setup_env.sh): the retrieval server over the demo's
# BM25 index and the teacher (python -m rlinf_search.serve) on free loopback ports, both stopped on exit.
# start_distill_servers DEMO_DIR OUT_DIR TEACHER_MODEL sets ADDR and TEACHER_ADDR.
start_distill_servers() {
    local demo="$1" out="$2" teacher="$3"
    rm -f "$out/server.addr" "$out/teacher.addr"
    "$PY" -m rlinf_search.retrieval.server --index-dir "$demo/index" --corpus "$demo/data/corpus.jsonl" \
        --retriever bm25 --host 127.0.0.1 --port 0 --save-address-to "$out/server.addr" > "$out/server.log" 2>&1 &
    SERVER_PID=$!
    "$PY" -m rlinf_search.serve --model "$teacher" --served-model-name teacher --port 0 \
        --save-address-to "$out/teacher.addr" > "$out/teacher.log" 2>&1 &
    TEACHER_PID=$!
    trap 'kill $SERVER_PID $TEACHER_PID 2>/dev/null || true; wait 2>/dev/null || true' EXIT
    ADDR=$("$PY" -m rlinf_search.retrieval.launch --wait-for "$out/server.addr" --timeout 120)
    TEACHER_ADDR=$("$PY" -m rlinf_search.retrieval.launch --wait-for "$out/teacher.addr" --timeout 120)
}
