#!/usr/bin/env bash
# Train the agent you bring: `agl train --algorithm grpo` and `apo` on agents agl did not write, end to end.
#
# Usage: scripts/ci/train_agent.sh [MODEL]
#   MODEL  the model to pull and train (default smollm2-135m-instruct)
#
# Environment:
#   AGL_TRAIN_AGENT_VENV  virtual environment to create or reuse (default
#                         /var/tmp/agl-train-agent-venv; reused only when its marker records the
#                         same pinned requirements, examples/python/requirements.txt, and Python)
#   PYTHON                interpreter that creates the venv (default python3; 3.11 or newer)
#   CARGO_TARGET_DIR      honoured when locating the built `agl` binary (default target)
#   AGL_BIN               an `agl` binary to use instead of building one
#   AGL_TRAIN_AGENT_TIMEOUT  seconds each training run may take (default 1800)
#
# Steps (each prints what it runs; the servers and the runner are always stopped):
#   (0) examples/python/test_match.py: the Python execution match agrees with `agl spider score`
#       on every (gold, predicted) pair, and the Python prompt is agl's;
#   (a) `agl spider tasks --split train --limit 4 --messages --out $WORK/train.jsonl`;
#   (b) `agl store --port 0` in the background;
#   (c) `agl train --algorithm grpo --train-dataset … --store-url STORE --port 0 --runner none
#       --steps 1 --tasks-per-step 2 --group-size 2 --max-tokens 48 --checkpoint-dir $WORK/ckpt`
#       in the background, its rollouts served by examples/python/spider_agent.py (Agent
#       Lightning's runner role against STORE); train must exit 0 and write ckpt/final/;
#       the runner is then stopped with SIGINT (a runner-only process never stops by itself);
#   (g) `agl train --algorithm apo … --store-url STORE --runner none --beam-rounds 1
#       --beam-width 1 --branch-factor 1` (the built-in engine as agent model and optimiser),
#       its rollouts served by examples/python/spider_agent.py --prompt-template (a `@rollout`
#       agent taking Agent Lightning's `prompt_template` resource): exit 0, every rollout read
#       the template of the candidate its resources id names, best_prompt.txt is the best;
#   (d) `agl llm serve --model MODEL --adapter policy=$WORK/ckpt/final --port 0` answers one
#       chat completion for the model `policy` (the adapter's name);
#   (f) `agl store --llm MODEL --port 0` and examples/python/langchain_agent.py --check: a
#       LangChain tool-calling agent under `@rollout` whose calls become trainable triplets
#       (`agl triplets --for-training`);
#   (e) `agl train --algorithm grpo … --runner exec:'examples/exec/sql_agent.sh' --steps 1` with
#       its own in-process store: exit 0 and ckpt-exec/final/ exists (last: it needs the exec
#       runner of `agl train`).
#
# Exit status: 0 when every step passed, 1 otherwise. Needs network access to PyPI only when the
# venv has to be (re)built or the model has not been pulled yet.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
EXAMPLES="$ROOT/examples/python"
REQS="$EXAMPLES/requirements.txt"
VENV="${AGL_TRAIN_AGENT_VENV:-/var/tmp/agl-train-agent-venv}"
PYTHON="${PYTHON:-python3}"
MARKER="$VENV/.agl-train-agent-requirements"
MODEL="${1:-smollm2-135m-instruct}"
TRAIN_TIMEOUT="${AGL_TRAIN_AGENT_TIMEOUT:-1800}"

export LITELLM_LOCAL_MODEL_COST_MAP=True
export PYTHONUNBUFFERED=1
export PIP_DISABLE_PIP_VERSION_CHECK=1
unset AGL_STORE_TOKEN AGL_LLM_API_KEY

SCRIPT=train_agent.sh
# shellcheck source=scripts/lib/common.sh
source "$ROOT/scripts/lib/common.sh"

# More background processes than common.sh's one server: each is stopped on exit.
PIDS=()
stop_all() {
    local pid
    for pid in ${PIDS[@]+"${PIDS[@]}"}; do
        kill -INT "$pid" 2>/dev/null || true
    done
    for pid in ${PIDS[@]+"${PIDS[@]}"}; do
        for _ in $(seq 1 100); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    PIDS=()
}
trap 'stop_all; cleanup' EXIT

fail() {
    echo "$SCRIPT: FAILED: $*" >&2
    exit 1
}

# start_server NAME CMD…: CMD in the background (stdout $WORK/NAME.out, stderr $WORK/NAME.err);
# waits for its `listening on http://…` line and sets URL.
start_server() {
    local name="$1"
    shift
    echo "+ $* &" >&2
    "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" &
    SERVER_PID=$!
    PIDS+=("$SERVER_PID")
    local deadline=$((SECONDS + 300))
    URL=""
    while [ "$SECONDS" -lt "$deadline" ]; do
        URL="$(grep -m1 -oE 'listening on http://[^ ]+' "$WORK/$name.out" 2>/dev/null | sed 's/listening on //' || true)"
        [ -n "$URL" ] && return 0
        kill -0 "$SERVER_PID" 2>/dev/null || { tail -n 30 "$WORK/$name.err" >&2; fail "$name exited before listening"; }
        sleep 0.2
    done
    tail -n 30 "$WORK/$name.err" >&2
    fail "$name did not print its address within 300 s"
}

T_START=$SECONDS
ensure_venv "$PYTHON" "$VENV" "$REQS" "$MARKER" 11
PY="$VENV/bin/python"
find_agl
export AGL
run "$AGL" model pull "$MODEL"

# (0) The Python execution match and prompt agree with agl's.
run "$PY" "$EXAMPLES/test_match.py" --agl "$AGL" || fail "test_match.py"

# (a) The tasks.
run "$AGL" spider tasks --split train --limit 4 --messages --out "$WORK/train.jsonl"
[ "$(wc -l <"$WORK/train.jsonl")" -eq 4 ] || fail "expected 4 task lines"

# (b) A store of its own.
start_server store "$AGL" store --port 0
STORE_URL="$URL"
echo "$SCRIPT: store at $STORE_URL" >&2

# (c) agl trains through that store; Agent Lightning's runner serves the rollouts.
T_TRAIN=$SECONDS
echo "+ $PY $EXAMPLES/spider_agent.py --store-url $STORE_URL &" >&2
"$PY" "$EXAMPLES/spider_agent.py" --store-url "$STORE_URL" >"$WORK/runner.out" 2>"$WORK/runner.err" &
RUNNER_PID=$!
PIDS+=("$RUNNER_PID")
PORT="$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
status=0
run timeout --kill-after=10 "$TRAIN_TIMEOUT" "$AGL" train --algorithm grpo \
    --train-dataset "$WORK/train.jsonl" --model "$MODEL" \
    --store-url "$STORE_URL" --port "$PORT" --advertise-url "http://127.0.0.1:$PORT" --runner none \
    --steps 1 --tasks-per-step 2 --group-size 2 --max-tokens 48 \
    --checkpoint-dir "$WORK/ckpt" --report "$WORK/report.json" >"$WORK/train.out" 2>"$WORK/train.err" || status=$?
if [ "$status" -ne 0 ]; then
    tail -n 30 "$WORK/train.err" >&2
    echo "--- runner" >&2
    tail -n 30 "$WORK/runner.err" >&2
    fail "agl train --runner none exited $status"
fi
cat "$WORK/train.out"
[ -d "$WORK/ckpt/final" ] || fail "no $WORK/ckpt/final"
kill -0 "$RUNNER_PID" 2>/dev/null || fail "the Agent Lightning runner died early: $(tail -n 5 "$WORK/runner.err")"
kill -INT "$RUNNER_PID"
runner_status=0
wait "$RUNNER_PID" || runner_status=$?
echo "$SCRIPT: the runner stopped on SIGINT with status $runner_status; its rollouts:" >&2
grep -E '^\{"id"' "$WORK/runner.err" >&2 || true
[ "$(grep -cE '^\{"id"' "$WORK/runner.err" || true)" -ge 4 ] || fail "the Python agent ran fewer than 4 rollouts"
echo "$SCRIPT: (c) passed in $((SECONDS - T_TRAIN)) s" >&2

# (g) APO: `agl train --algorithm apo` through the same store; the rollouts are served by
# Agent Lightning's runner with spider_agent.py --prompt-template, a @rollout agent taking the
# prompt_template resource. Every rollout's template must be the candidate its resources id
# names in the report, and the best prompt on disk the report's best.
T_APO=$SECONDS
echo "+ $PY $EXAMPLES/spider_agent.py --store-url $STORE_URL --prompt-template &" >&2
"$PY" "$EXAMPLES/spider_agent.py" --store-url "$STORE_URL" --prompt-template >"$WORK/apo-runner.out" 2>"$WORK/apo-runner.err" &
RUNNER_PID=$!
PIDS+=("$RUNNER_PID")
PORT="$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
SEED=$'Question: {question}\nAnswer with one SQLite query in a ```sql block.'
status=0
run timeout --kill-after=10 "$TRAIN_TIMEOUT" "$AGL" train --algorithm apo \
    --train-dataset "$WORK/train.jsonl" --val-dataset "$WORK/train.jsonl" --model "$MODEL" \
    --store-url "$STORE_URL" --port "$PORT" --advertise-url "http://127.0.0.1:$PORT" --runner none \
    --prompt-template-text "$SEED" --beam-rounds 1 --beam-width 1 --branch-factor 1 \
    --gradient-batch-size 2 --val-batch-size 2 --max-tokens 48 \
    --checkpoint-dir "$WORK/apo" --report "$WORK/apo.json" >"$WORK/apo.out" 2>"$WORK/apo.err" || status=$?
if [ "$status" -ne 0 ]; then
    tail -n 30 "$WORK/apo.err" >&2
    echo "--- runner" >&2
    tail -n 30 "$WORK/apo-runner.err" >&2
    fail "agl train --algorithm apo exited $status"
fi
cat "$WORK/apo.out"
kill -INT "$RUNNER_PID" 2>/dev/null || true
wait "$RUNNER_PID" || true
"$PY" - "$WORK/apo.json" "$WORK/apo-runner.err" "$WORK/apo/best_prompt.txt" <<'PYEOF' || fail "APO: the agent did not read the candidates' templates"
import json, sys
report = json.load(open(sys.argv[1]))
templates = {c["version"]: c["template"] for c in report["search"]["candidates"]}
lines = [json.loads(l) for l in open(sys.argv[2]) if l.startswith('{"id"')]
assert len(lines) >= 4 + 2 + 1, f"too few rollouts: {len(lines)}"
for l in lines:
    assert templates.get(l["resources_id"]) == l["template"], l
best = report["search"]["best"]
assert open(sys.argv[3]).read() == templates[best], "best_prompt.txt is not the best candidate"
print(f"train_agent.sh: (g) {len(lines)} rollouts read their candidate's template; "
      f"{len(templates)} candidates, best {best.rsplit('-', 1)[-1]} "
      f"({report['search']['best_score']:.3f})", file=sys.stderr)
PYEOF
echo "$SCRIPT: (g) passed in $((SECONDS - T_APO)) s" >&2

# (d) The trained adapter serves.
start_server serve "$AGL" llm serve --model "$MODEL" --adapter "policy=$WORK/ckpt/final" --port 0
answer="$(curl -sS --fail-with-body --max-time 300 -H 'Content-Type: application/json' \
    -d '{"model": "policy", "messages": [{"role": "user", "content": "How many singers are there?"}], "max_tokens": 16}' \
    "$URL/v1/chat/completions")" || fail "chat completion with the adapter: $answer"
echo "$SCRIPT: (d) the adapter answered: $(jq -c '{model, content: .choices[0].message.content}' <<<"$answer")" >&2
[ "$(jq -r .model <<<"$answer")" = "policy" ] || fail "the answer is not from the adapter: $answer"
kill -TERM "$SERVER_PID" 2>/dev/null || true

# (f) A LangChain tool-calling agent: its calls through the gateway are trainable triplets.
start_server llmstore "$AGL" store --llm "$MODEL" --port 0
head -n 2 "$WORK/train.jsonl" >"$WORK/lc.jsonl"
run "$PY" "$EXAMPLES/langchain_agent.py" --check --store-url "$URL" --tasks "$WORK/lc.jsonl" --agl "$AGL" \
    --model "$MODEL" --max-tokens 48 || fail "langchain_agent.py --check"
kill -TERM "$SERVER_PID" 2>/dev/null || true


# (e) The shell agent under agl's exec runner, in-process store.
T_EXEC=$SECONDS
status=0
run timeout --kill-after=10 "$TRAIN_TIMEOUT" "$AGL" train --algorithm grpo \
    --train-dataset "$WORK/train.jsonl" --model "$MODEL" \
    --runner "exec:$ROOT/examples/exec/sql_agent.sh" \
    --steps 1 --tasks-per-step 2 --group-size 2 --max-tokens 48 \
    --checkpoint-dir "$WORK/ckpt-exec" --report "$WORK/report-exec.json" >"$WORK/exec.out" 2>"$WORK/exec.err" || status=$?
if [ "$status" -ne 0 ]; then
    tail -n 30 "$WORK/exec.err" >&2
    fail "agl train --runner exec: exited $status"
fi
cat "$WORK/exec.out"
[ -d "$WORK/ckpt-exec/final" ] || fail "no $WORK/ckpt-exec/final"
echo "$SCRIPT: (e) passed in $((SECONDS - T_EXEC)) s" >&2

echo "$SCRIPT: passed in $((SECONDS - T_START)) s" >&2
