#!/usr/bin/env bash
# OpenAI-compatibility test: the official `openai` Python client against `agl llm serve`.
#
# Usage: scripts/ci/llm.sh [MODEL]
#   MODEL  the model to pull and serve (default smollm2-135m-instruct)
#
# Environment:
#   AGL_LLM_OPENAI_VENV  virtual environment to create or reuse (default
#                        /var/tmp/agl-llm-openai-venv; reused only when its marker records the
#                        same pinned requirements and Python)
#   PYTHON               interpreter that creates the venv (default python3; 3.9 or newer)
#   CARGO_TARGET_DIR     honoured when locating the built `agl` binary (default target)
#   AGL_BIN              an `agl` binary to use instead of building one
#
# Steps: the cached venv with scripts/ci/llm/requirements-openai.txt; `cargo build -p agl-cli`;
# `agl model pull MODEL` (a no-op when cached); `agl llm serve --port 0` in the background (its
# first stdout line gives the address); scripts/ci/llm/openai_test.py; the server is always
# stopped (SIGTERM, then SIGKILL after 10 s).
#
# Exit status: 0 when the test passed, 1 otherwise. Needs network access to PyPI only when the
# venv has to be (re)built or the model has not been pulled yet.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
REQS="$ROOT/scripts/ci/llm/requirements-openai.txt"
TEST="$ROOT/scripts/ci/llm/openai_test.py"
VENV="${AGL_LLM_OPENAI_VENV:-/var/tmp/agl-llm-openai-venv}"
PYTHON="${PYTHON:-python3}"
MARKER="$VENV/.agl-llm-openai-requirements"
MODEL="${1:-smollm2-135m-instruct}"

export PYTHONUNBUFFERED=1
export PIP_DISABLE_PIP_VERSION_CHECK=1
# The test sends a dummy key: make sure the server does not require a real one.
unset AGL_LLM_API_KEY

SCRIPT=llm.sh
# shellcheck source=scripts/lib/common.sh
source "$ROOT/scripts/lib/common.sh"

# ---------------------------------------------------------------------------------------------
# 1. The Python environment (cached across runs).
# ---------------------------------------------------------------------------------------------
ensure_venv "$PYTHON" "$VENV" "$REQS" "$MARKER" 9
PY="$VENV/bin/python"

# ---------------------------------------------------------------------------------------------
# 2. The agl binary and the model.
# ---------------------------------------------------------------------------------------------
find_agl
run "$AGL" model pull "$MODEL"

# ---------------------------------------------------------------------------------------------
# 3. The server and the Python program.
# ---------------------------------------------------------------------------------------------
echo "+ $AGL llm serve --model $MODEL --port 0 &" >&2
"$AGL" llm serve --model "$MODEL" --port 0 >"$WORK/server.out" 2>"$WORK/server.err" &
SERVER_PID=$!
wait_for_listening 180
echo "llm.sh: server at $URL" >&2

status=0
run "$PY" "$TEST" --url "$URL" --model "$MODEL" || status=1
stop_server
if [ "$status" -ne 0 ]; then
    echo "llm.sh: FAILED; last lines of the server log:" >&2
    tail -n 20 "$WORK/server.err" >&2 || true
    exit 1
fi
echo "llm.sh: passed" >&2
