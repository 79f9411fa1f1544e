#!/usr/bin/env bash
# APO side by side: agl's `agl train --algorithm apo` and Agent Lightning 0.3's own APO
# (`agentlightning[apo]`, scripts/bench/al_apo.py) on the same tasks, the same agent, the same
# model and engine settings, the same beam settings, one after the other on this machine.
#
# Usage: scripts/bench/apo_side_by_side.sh [OUT_DIR]   (default /tmp/agl-apo-side-by-side)
#
# Environment: MODEL (qwen2.5-coder-1.5b-instruct), WEIGHTS (hybrid), BEAM (2), BRANCH (2),
# ROUNDS (2), GRAD (4: rollouts per critique), VAL_BATCH (8), VAL (16: the validation tasks
# the leader is re-scored on), MAX_TOKENS (128: per answer of the agent), OPT_MAX_TOKENS (1024:
# per optimiser answer), RUNNERS (4: Agent Lightning runner processes), SEED (0), AGL_BIN (default:
# the release build in CARGO_TARGET_DIR), VENV (/var/tmp/agl-apo-venv: created from
# examples/python/requirements.txt plus agentlightning[apo]==0.3.0 when missing).
#
# The tasks: 72 Spider train questions (every 97th), the first 40 to train on, the last 32 to
# validate on (the first VAL of them), as docs/agents.md shows. The seed: the SQL agent's own
# write template. The agent in both runs: examples/python/spider_agent.py --prompt-template
# under Agent Lightning's runner (RUNNERS processes), greedy, MAX_TOKENS tokens, reward 1 for an
# execution match, else 0; `--governance audit` on agl's side and `--llm-governance audit` on
# the gateway of Agent Lightning's side, so both scores are the mean task reward (a missing
# reward counts 0 in both).
#
# A. Agent Lightning: `agl llm serve --weights WEIGHTS` (the optimiser, and the model behind the
#    gateway), `agl store --llm-upstream` (store and governed gateway), al_apo.py (APO in the
#    algorithm role against that store) and the runners with --llm-endpoint (its candidates
#    carry no LLM resource).
# B. agl: `agl train --algorithm apo --runner none --weights WEIGHTS` (its own store, gateway and
#    engine, which is also the optimiser: the same binary, model and weights as A's server,
#    loaded once instead of twice so both fit in memory) and the runners reading `main_llm`.
# Prints one table; the reports (A.json, B.json), best prompts and logs stay in OUT_DIR.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${1:-/tmp/agl-apo-side-by-side}"
MODEL="${MODEL:-qwen2.5-coder-1.5b-instruct}" WEIGHTS="${WEIGHTS:-hybrid}"
BEAM="${BEAM:-2}" BRANCH="${BRANCH:-2}" ROUNDS="${ROUNDS:-2}" GRAD="${GRAD:-4}"
VAL_BATCH="${VAL_BATCH:-8}" VAL="${VAL:-16}" MAX_TOKENS="${MAX_TOKENS:-128}"
OPT_MAX_TOKENS="${OPT_MAX_TOKENS:-1024}" RUNNERS="${RUNNERS:-4}" SEED="${SEED:-0}"
VENV="${VENV:-/var/tmp/agl-apo-venv}"
AGL="${AGL_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/agl}"
AGENT="$ROOT/examples/python/spider_agent.py"
export LITELLM_LOCAL_MODEL_COST_MAP=True PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
unset AGL_STORE_TOKEN AGL_LLM_API_KEY
[ -x "$AGL" ] || { echo "apo_side_by_side.sh: no agl binary at $AGL (cargo build --release, or AGL_BIN)" >&2; exit 1; }
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet -r "$ROOT/examples/python/requirements.txt" "agentlightning[apo]==0.3.0"
fi
PY="$VENV/bin/python"
mkdir -p "$OUT"
cd "$OUT"

PIDS=()
stop_all() {
    for pid in "${PIDS[@]}"; do kill -INT "$pid" 2>/dev/null || true; done
    sleep 2
    for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
    PIDS=()
}
trap stop_all EXIT

# start NAME CMD...: runs CMD in the background (NAME.out, NAME.err) and sets URL to the first
# `http://…` address it prints within 300 s.
start() {
    local name="$1"
    shift
    echo "+ $* &" >&2
    "$@" > "$name.out" 2> "$name.err" &
    PIDS+=("$!")
    URL=""
    for _ in $(seq 1 1500); do
        URL="$(cat "$name.out" "$name.err" 2>/dev/null | grep -m1 -oE 'listening on http://[0-9.:]+' | sed 's/listening on //' || true)"
        [ -n "$URL" ] && return 0
        kill -0 "${PIDS[-1]}" 2>/dev/null || { tail -n 20 "$name.err" >&2; exit 1; }
        sleep 0.2
    done
    echo "apo_side_by_side.sh: $name printed no address" >&2
    exit 1
}

"$AGL" spider tasks --split train --every 97 --limit 72 --out pool.jsonl
head -n 40 pool.jsonl > train.jsonl
tail -n 32 pool.jsonl > val.jsonl
printf 'Question: {question}\nAnswer with one SQLite query in a ```sql block.' > seed.txt
beam=(--beam-width "$BEAM" --branch-factor "$BRANCH" --beam-rounds "$ROUNDS"
      --gradient-batch-size "$GRAD" --val-batch-size "$VAL_BATCH")

echo "== A. Agent Lightning 0.3's APO" >&2
start llm "$AGL" llm serve --model "$MODEL" --weights "$WEIGHTS" --max-tokens-default "$OPT_MAX_TOKENS" --port 0
LLM_URL="$URL"
start storeA "$AGL" store --port 0 --llm-upstream "$LLM_URL/v1" --llm-governance audit --llm-timeout 1800
STORE_A="$URL"
"$PY" "$AGENT" --store-url "$STORE_A" --prompt-template --llm-endpoint "$STORE_A/v1" --llm-model "$MODEL" \
    --max-tokens "$MAX_TOKENS" --n-runners "$RUNNERS" --poll-interval 0.2 > runnerA.out 2> runnerA.err &
PIDS+=("$!")
/usr/bin/time -v "$PY" "$ROOT/scripts/bench/al_apo.py" --store-url "$STORE_A" --optimizer-base-url "$LLM_URL/v1" \
    --model "$MODEL" --train train.jsonl --val val.jsonl --val-limit "$VAL" --seed-template seed.txt \
    "${beam[@]}" --seed "$SEED" --best-out A-best.txt --report A.json > A.out 2> A.err
stop_all

echo "== B. agl's APO" >&2
start B /usr/bin/time -v "$AGL" train --algorithm apo --runner none --model "$MODEL" --weights "$WEIGHTS" \
    --governance audit --train-dataset train.jsonl --val-dataset val.jsonl --eval-limit "$VAL" \
    --prompt-template seed.txt "${beam[@]}" --max-tokens "$MAX_TOKENS" --request-timeout 1800 \
    --seed "$SEED" --checkpoint-dir B-ckpt --report B.json
B_URL="$URL"
"$PY" "$AGENT" --store-url "$B_URL" --prompt-template --n-runners "$RUNNERS" --poll-interval 0.2 \
    > runnerB.out 2> runnerB.err &
RUNNER_B=$!
wait "${PIDS[0]}"
kill -INT "$RUNNER_B" 2>/dev/null || true
wait "$RUNNER_B" 2>/dev/null || true
PIDS=()
cp B-ckpt/best_prompt.txt B-best.txt

"$PY" - <<'PYEOF'
import json
a = json.load(open("A.json"))
b = json.load(open("B.json"))
s = b["search"]
seed_b = next(c for c in s["candidates"] if c["parent"] is None)
seed_b_score = next((v["score"] for v in seed_b.get("val_full", [])), None)
seed_a = a["versions"].get("v0", {}).get("mean_reward")
print(f"{'':28}{'Agent Lightning 0.3 APO':>26}{'agl APO':>14}")
print(f"{'seed score (first pass)':28}{seed_a if seed_a is None else round(seed_a, 3):>26}{seed_b_score if seed_b_score is None else round(seed_b_score, 3):>14}")
print(f"{'best score':28}{a['best_score']:>26.3f}{s['best_score']:>14.3f}")
print(f"{'best version':28}{a['best_version']:>26}{s['best'].rsplit('-', 1)[-1]:>14}")
skipped = sum(s["skips"].values())
print(f"{'candidates (agl: + skipped)':28}{len(a['versions']):>26}{str(len(s['candidates'])) + ' + ' + str(skipped):>14}")
ta = a["optimizer_tokens"]
tb = {k: sum(r["optimizer_tokens"][k] for r in s["rounds"]) for k in ("prompt", "completion")}
print(f"{'optimiser calls':28}{a['optimizer_calls']:>26}{'':>14}")
print(f"{'optimiser tokens (in/out)':28}{str(ta['prompt']) + '/' + str(ta['completion']):>26}{str(tb['prompt']) + '/' + str(tb['completion']):>14}")
print(f"{'wall time (s)':28}{a['seconds']:>26.0f}{b['seconds']:>14.0f}")
PYEOF
