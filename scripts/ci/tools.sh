#!/usr/bin/env bash
# Tool calls and structured outputs of `agl llm serve` through unchanged agent frameworks:
# langchain-openai, the OpenAI Agents SDK, LiteLLM and the official `openai` client (issue 29);
# then a LangChain agent under the governed gateway of `agl store --llm`, whose policy denies the
# one tool the model is forced to call: the tool never runs and the agent reads the refusal
# (issue 31).
#
# Usage: scripts/ci/tools.sh [MODEL]
#   MODEL  the model to pull and serve (default smollm2-135m-instruct)
#
# Environment:
#   AGL_TOOLS_VENV    virtual environment to create or reuse (default /var/tmp/agl-tools-venv;
#                     reused only when its marker records the same pinned requirements and Python)
#   PYTHON            interpreter that creates the venv (default python3; 3.11 or newer, as
#                     langchain-core needs)
#   CARGO_TARGET_DIR  honoured when locating the built `agl` binary (default target)
#   AGL_BIN           an `agl` binary to use instead of building one
#   AGL_TOOLS_TIMEOUT seconds the Python checks may take in all (default 1200)
#
# Steps: the cached venv with scripts/ci/tools/requirements.txt; `cargo build -p agl-cli`;
# `agl model pull MODEL` (a no-op when cached); `agl llm serve --port 0` in the background (its
# first stdout line gives the address); scripts/ci/tools/tools_test.py, which prints PASS or FAIL
# and the reason for each check; the server is always stopped (SIGTERM, then SIGKILL after 10 s),
# and its log's last lines are printed when a check failed. Then `agl store --llm MODEL --port 0
# --llm-policy POLICY --llm-audit-log DB` (POLICY denies the tool `delete_all_rows`, `on_block:
# refuse`), scripts/ci/tools/governed_test.py against it (see its docs), and, once that server has
# stopped, `agl audit verify DB` and its blocked `tool_call` entries of `delete_all_rows`.
#
# Exit status: 0 when every check passed, 1 otherwise. Needs network access to PyPI only when the
# venv has to be (re)built or the model has not been pulled yet.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
REQS="$ROOT/scripts/ci/tools/requirements.txt"
TEST="$ROOT/scripts/ci/tools/tools_test.py"
VENV="${AGL_TOOLS_VENV:-/var/tmp/agl-tools-venv}"
PYTHON="${PYTHON:-python3}"
MARKER="$VENV/.agl-tools-requirements"
MODEL="${1:-smollm2-135m-instruct}"
TEST_TIMEOUT="${AGL_TOOLS_TIMEOUT:-1200}"

export PYTHONUNBUFFERED=1
export PIP_DISABLE_PIP_VERSION_CHECK=1
# LiteLLM fetches its price list from GitHub at import unless told to use its bundled copy.
export LITELLM_LOCAL_MODEL_COST_MAP=True
# The test sends a dummy key: make sure the server does not require a real one.
unset AGL_LLM_API_KEY

SCRIPT=tools.sh
# shellcheck source=scripts/lib/common.sh
source "$ROOT/scripts/lib/common.sh"

# ---------------------------------------------------------------------------------------------
# 1. The Python environment (cached across runs).
# ---------------------------------------------------------------------------------------------
ensure_venv "$PYTHON" "$VENV" "$REQS" "$MARKER" 11
PY="$VENV/bin/python"

# ---------------------------------------------------------------------------------------------
# 2. The agl binary and the model.
# ---------------------------------------------------------------------------------------------
find_agl
run "$AGL" model pull "$MODEL"

# ---------------------------------------------------------------------------------------------
# 3. The server and the Python checks.
# ---------------------------------------------------------------------------------------------
echo "+ $AGL llm serve --model $MODEL --port 0 &" >&2
"$AGL" llm serve --model "$MODEL" --port 0 >"$WORK/server.out" 2>"$WORK/server.err" &
SERVER_PID=$!
wait_for_listening 180
echo "tools.sh: server at $URL" >&2

status=0
run timeout --kill-after=10 "$TEST_TIMEOUT" "$PY" "$TEST" --url "$URL" --model "$MODEL" || status=$?
stop_server
if [ "$status" -ne 0 ]; then
    if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
        echo "tools.sh: the checks did not finish within $TEST_TIMEOUT s" >&2
    fi
    echo "tools.sh: FAILED; last lines of the server log:" >&2
    tail -n 40 "$WORK/server.err" >&2 || true
    exit 1
fi

# ---------------------------------------------------------------------------------------------
# 4. A LangChain agent under the governed gateway (agl store --llm with a policy).
# ---------------------------------------------------------------------------------------------
GOVERNED_TEST="$ROOT/scripts/ci/tools/governed_test.py"
cat >"$WORK/policy.yaml" <<'YAML'
version: 1
mode: enforce
on_block: refuse
policies:
  - type: tool_policy
    config: {deny: [delete_all_rows]}
YAML
T_GOV=$SECONDS
echo "+ $AGL store --llm $MODEL --port 0 --llm-policy $WORK/policy.yaml --llm-audit-log $WORK/audit.db &" >&2
"$AGL" store --llm "$MODEL" --port 0 --llm-policy "$WORK/policy.yaml" --llm-audit-log "$WORK/audit.db" \
    >"$WORK/server.out" 2>"$WORK/server.err" &
SERVER_PID=$!
wait_for_listening 180
echo "tools.sh: governed store at $URL" >&2
run timeout --kill-after=10 300 "$PY" "$GOVERNED_TEST" --url "$URL" --model "$MODEL" || status=$?
stop_server
if [ "$status" -eq 0 ]; then
    run "$AGL" audit verify "$WORK/audit.db" || status=1
    run "$AGL" audit export --format jsonl --out "$WORK/audit.jsonl" "$WORK/audit.db" || status=1
    # The gateway's two refused calls and the agent's own check: three blocked tool calls.
    "$PY" - "$WORK/audit.jsonl" <<'PY' || status=1
import json, sys
entries = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
blocked = [e for e in entries if e["action_type"] == "tool_call" and e["verdict"] == "block"
           and e["action"]["kind"].get("name") == "delete_all_rows"]
ok = len(blocked) >= 3 and all("tool_policy" in e["policies"] and e["rollout_id"] for e in blocked)
print(f"{'PASS' if ok else 'FAIL'}: the flight recorder has {len(blocked)} blocked delete_all_rows calls "
      f"({len(entries)} entries)")
sys.exit(0 if ok else 1)
PY
fi
echo "tools.sh: governed agent took $((SECONDS - T_GOV)) s" >&2
if [ "$status" -ne 0 ]; then
    echo "tools.sh: FAILED (governed agent); last lines of the server log:" >&2
    tail -n 40 "$WORK/server.err" >&2 || true
    exit 1
fi
echo "tools.sh: passed" >&2
