#!/usr/bin/env bash
# A Python agent, unchanged: an ordinary Agent Lightning 0.3.0 agent (the official `openai`
# client, run by agentlightning's own LitAgentRunner) whose model calls go through
# `agl store --llm` (the store and the governed LLM gateway on one port), then agl's span →
# triplet adapter (`agl triplets --for-training`) on what the gateway recorded.
#
# Usage: scripts/ci/agent.sh [MODEL]
#   MODEL  the model to pull and serve (default smollm2-135m-instruct)
#
# Environment:
#   AGL_AGENT_VENV    virtual environment to create or reuse (default /var/tmp/agl-agent-venv;
#                     reused only when its marker records the same pinned requirements and Python)
#   PYTHON            interpreter that creates the venv (default python3; 3.10 or newer)
#   CARGO_TARGET_DIR  honoured when locating the built `agl` binary (default target)
#   AGL_BIN           an `agl` binary to use instead of building one
#   AGL_AGENT_STORE_ARGS  extra arguments for `agl store` (e.g. "--llm-policy strict")
#
# Steps: the cached venv with scripts/ci/agent/requirements.txt; `cargo build -p agl-cli`;
# `agl model pull MODEL` (a no-op when cached); `agl store --llm MODEL --port 0` in the
# background (its stdout line 'agl store listening on URL (…)' gives the address once the model
# is loaded); scripts/ci/agent/agent_test.py; the server is always stopped (SIGTERM, then SIGKILL
# after 10 s).
#
# Exit status: 0 when the test passed, 1 otherwise. Needs network access to PyPI only when the
# venv has to be (re)built or the model has not been pulled yet.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
REQS="$ROOT/scripts/ci/agent/requirements.txt"
TEST="$ROOT/scripts/ci/agent/agent_test.py"
VENV="${AGL_AGENT_VENV:-/var/tmp/agl-agent-venv}"
PYTHON="${PYTHON:-python3}"
MARKER="$VENV/.agl-agent-requirements"
MODEL="${1:-smollm2-135m-instruct}"

# Keep litellm (imported by agentlightning) from fetching its cost map over the network.
export LITELLM_LOCAL_MODEL_COST_MAP=True
export PYTHONUNBUFFERED=1
export PIP_DISABLE_PIP_VERSION_CHECK=1
# The Python client sends no bearer token and the agent a dummy key: make sure `agl store`
# requires neither.
unset AGL_STORE_TOKEN AGL_LLM_API_KEY

SCRIPT=agent.sh
# shellcheck source=scripts/lib/common.sh
source "$ROOT/scripts/lib/common.sh"

T_START=$SECONDS

# ---------------------------------------------------------------------------------------------
# 1. The Python environment (cached across runs).
# ---------------------------------------------------------------------------------------------
ensure_venv "$PYTHON" "$VENV" "$REQS" "$MARKER" 10
PY="$VENV/bin/python"

# ---------------------------------------------------------------------------------------------
# 2. The agl binary and the model.
# ---------------------------------------------------------------------------------------------
find_agl
run "$AGL" model pull "$MODEL"

# ---------------------------------------------------------------------------------------------
# 3. The store with its LLM gateway, and the Python agent.
# ---------------------------------------------------------------------------------------------
T_SERVER=$SECONDS
# shellcheck disable=SC2206 # word splitting of the extra arguments is intended
EXTRA=(${AGL_AGENT_STORE_ARGS:-})
echo "+ $AGL store --llm $MODEL --port 0 ${EXTRA[*]+${EXTRA[*]}} &" >&2
"$AGL" store --llm "$MODEL" --port 0 ${EXTRA[@]+"${EXTRA[@]}"} >"$WORK/server.out" 2>"$WORK/server.err" &
SERVER_PID=$!
wait_for_listening 180
echo "agent.sh: $LINE (ready after $((SECONDS - T_SERVER)) s)" >&2

T_AGENT=$SECONDS
status=0
run "$PY" "$TEST" --url "$URL" --agl "$AGL" --model "$MODEL" || status=1
T_END=$SECONDS
stop_server
if [ "$status" -ne 0 ]; then
    echo "agent.sh: FAILED; last lines of the server log:" >&2
    tail -n 30 "$WORK/server.err" >&2 || true
    exit 1
fi
echo "agent.sh: passed (server ready in $((T_AGENT - T_SERVER)) s, agent and checks $((T_END - T_AGENT)) s, $((T_END - T_START)) s in all)" >&2
