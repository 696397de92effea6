#!/usr/bin/env bash
# Serve a distillation teacher with vLLM's OpenAI-compatible server and wait until it answers.
#   bash examples/searchr1/start_teacher_server.sh MODEL_DIR [PORT] [extra vllm serve args...]
# The name requests use is the folder's name (algorithm.distill.teacher.model). Without vLLM (a CPU
# machine), the project's own server speaks the same API:
#   python -m rlinf_search.serve --model MODEL_DIR --served-model-name NAME --port PORT
set -euo pipefail
MODEL="${1:?usage: start_teacher_server.sh MODEL_DIR [PORT] [vllm serve args...]}"
PORT="${2:-8001}"
shift $(( $# >= 2 ? 2 : 1 ))
NAME="$(basename "$MODEL")"
HOST="${TEACHER_HOST:-0.0.0.0}"
LOG="${TEACHER_LOG:-teacher_server.log}"
if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then
    echo "port $PORT is in use; pick another port (second argument) or stop what listens there" >&2
    exit 1
fi
command -v vllm >/dev/null || { echo "vllm is not installed here (pip install vllm), or use python -m rlinf_search.serve" >&2; exit 1; }
# The API key: set TEACHER_API_KEY in the environment of both the server and the trainer. It reaches vLLM as
# its VLLM_API_KEY environment variable, never as --api-key: a command line is visible to every user in
# `ps`, and some vLLM versions print their arguments at start-up.
if [ -n "${TEACHER_API_KEY:-}" ]; then export VLLM_API_KEY="$TEACHER_API_KEY"; fi
vllm serve "$MODEL" --served-model-name "$NAME" --host "$HOST" --port "$PORT" "$@" > "$LOG" 2>&1 &
PID=$!
echo "vllm serve $NAME on port $PORT (pid $PID, log $LOG); waiting for /health"
for _ in $(seq 1 600); do
    if ! kill -0 "$PID" 2>/dev/null; then
        echo "vllm serve exited; the end of $LOG:" >&2
        tail -n 20 "$LOG" >&2
        exit 1
    fi
    if curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; then
        echo "teacher ready: algorithm.distill.teacher.base_url=http://$(hostname):$PORT/v1 algorithm.distill.teacher.model=$NAME"
        exit 0
    fi
    sleep 2
done
echo "vllm serve did not answer /health within 20 minutes; see $LOG" >&2
exit 1
