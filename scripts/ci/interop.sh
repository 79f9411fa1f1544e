#!/usr/bin/env bash
# Interoperability test: Agent Lightning 0.3.0's own Python client and runner against `agl store`.
#
# Usage: scripts/ci/interop.sh [TARGET...]
#   TARGET  memory     `agl store` with the in-memory backend                      (default)
#           sqlite     `agl store --db DIR/store.sqlite`, then a restart on the same
#                      database to check that everything survived                    (default)
#           reference  agentlightning's own `agl store` (validates the test program itself;
#                      expects v0.3.0's behaviour where agl deliberately deviates)
#
# Environment:
#   AGL_INTEROP_VENV  virtual environment to create or reuse (default /var/tmp/agl-interop-venv;
#                     reused only when its marker records the same pinned requirements and Python)
#   PYTHON            interpreter that creates the venv (default python3; 3.10 or newer)
#   CARGO_TARGET_DIR  honoured when locating the built `agl` binary
#   AGL_INTEROP_SLOW  set to 1 to also run the 25 s wait-cap check (deviation Q16)
#
# Exit status: 0 when every target passed, 1 otherwise. Needs network access to PyPI only when
# the venv has to be (re)built.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
REQS="$ROOT/scripts/ci/interop/requirements.txt"
TEST="$ROOT/scripts/ci/interop/interop_test.py"
VENV="${AGL_INTEROP_VENV:-/var/tmp/agl-interop-venv}"
PYTHON="${PYTHON:-python3}"
MARKER="$VENV/.agl-interop-requirements"

TARGETS=("$@")
if [ "${#TARGETS[@]}" -eq 0 ]; then
    TARGETS=(memory sqlite)
fi
for t in "${TARGETS[@]}"; do
    case "$t" in
        memory | sqlite | reference) ;;
        *) echo "interop.sh: unknown target '$t' (memory, sqlite, reference)" >&2; exit 2 ;;
    esac
done

# Keep litellm (imported by agentlightning) from fetching its cost map over the network.
export LITELLM_LOCAL_MODEL_COST_MAP=True
export PYTHONUNBUFFERED=1
export PIP_DISABLE_PIP_VERSION_CHECK=1
# The Python client sends no bearer token: make sure `agl store` does not require one.
unset AGL_STORE_TOKEN

SCRIPT=interop.sh
# shellcheck source=scripts/lib/common.sh
source "$ROOT/scripts/lib/common.sh"

# ---------------------------------------------------------------------------------------------
# 1. The Python environment (cached across runs).
# ---------------------------------------------------------------------------------------------
ensure_venv "$PYTHON" "$VENV" "$REQS" "$MARKER" 10
PY="$VENV/bin/python"

# ---------------------------------------------------------------------------------------------
# 2. The agl binary.
# ---------------------------------------------------------------------------------------------
AGL=""
if [ "${TARGETS[*]}" != "reference" ]; then
    (cd "$ROOT" && run cargo build --locked -p agl-cli)
    TARGET_DIR="$(cd "$ROOT" && cargo metadata --format-version 1 --no-deps --locked |
        "$PY" -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')"
    AGL="$TARGET_DIR/debug/agl"
    [ -x "$AGL" ] || { echo "interop.sh: no agl binary at $AGL" >&2; exit 1; }
fi

# ---------------------------------------------------------------------------------------------
# 3. Servers and the Python program.
# ---------------------------------------------------------------------------------------------
free_port() {
    "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

# start_server LOG CMD...: starts CMD in the background and waits for GET /v1/agl/health.
start_server() {
    local log="$1"
    shift
    echo "+ $* >$log 2>&1 &" >&2
    "$@" >"$log" 2>&1 &
    SERVER_PID=$!
    local deadline=$((SECONDS + 90))
    while [ "$SECONDS" -lt "$deadline" ]; do
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            echo "interop.sh: the server exited before answering /v1/agl/health; its log:" >&2
            tail -n 40 "$log" >&2
            SERVER_PID=""
            return 1
        fi
        if "$PY" -c 'import sys, urllib.request
try:
    r = urllib.request.urlopen(sys.argv[1], timeout=2)
    sys.exit(0 if r.status == 200 else 1)
except Exception:
    sys.exit(1)' "$URL/v1/agl/health"; then
            return 0
        fi
        sleep 0.2
    done
    echo "interop.sh: the server did not answer /v1/agl/health within 90 s; its log:" >&2
    tail -n 40 "$log" >&2
    return 1
}

# run_target NAME: one server lifetime (two for sqlite), returns non-zero on any failure.
run_target() {
    local name="$1" kind=agl status=0
    local port
    port="$(free_port)"
    URL="http://127.0.0.1:$port"
    local slow=()
    if [ "${AGL_INTEROP_SLOW:-0}" = 1 ]; then slow=(--slow); fi
    echo "=== interop: $name ($URL) ===" >&2
    case "$name" in
        memory) start_server "$WORK/server-memory.log" "$AGL" store --port "$port" || return 1 ;;
        sqlite) start_server "$WORK/server-sqlite.log" "$AGL" store --port "$port" --db "$WORK/store.sqlite" || return 1 ;;
        reference)
            kind=python
            start_server "$WORK/server-reference.log" "$VENV/bin/agl" store --host 127.0.0.1 --port "$port" || return 1
            ;;
    esac
    local state=()
    if [ "$name" = sqlite ]; then state=(--state-out "$WORK/state.json"); fi
    # ${a[@]+"${a[@]}"}: empty arrays under `set -u` on bash < 4.4 too.
    run "$PY" "$TEST" --url "$URL" --server "$kind" ${slow[@]+"${slow[@]}"} ${state[@]+"${state[@]}"} || status=1
    stop_server
    if [ "$name" = sqlite ] && [ -f "$WORK/state.json" ]; then
        port="$(free_port)"
        URL="http://127.0.0.1:$port"
        echo "=== interop: sqlite restart on the same database ($URL) ===" >&2
        start_server "$WORK/server-sqlite-2.log" "$AGL" store --port "$port" --db "$WORK/store.sqlite" || return 1
        run "$PY" "$TEST" --url "$URL" --server agl --verify-state "$WORK/state.json" || status=1
        stop_server
    fi
    if [ "$status" -ne 0 ]; then
        echo "interop.sh: target $name FAILED; last lines of the server log:" >&2
        tail -n 20 "$WORK"/server-"$name"*.log >&2 || true
    fi
    return "$status"
}

FAILED=()
for t in "${TARGETS[@]}"; do
    run_target "$t" || FAILED+=("$t")
done

if [ "${#FAILED[@]}" -ne 0 ]; then
    echo "interop.sh: FAILED: ${FAILED[*]}" >&2
    exit 1
fi
echo "interop.sh: all targets passed: ${TARGETS[*]}" >&2
