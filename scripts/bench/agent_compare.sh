#!/usr/bin/env bash
# The agent you bring against agl's own: the Python Spider agent (examples/python/spider_agent.py,
# same prompt and execution-match reward as LlmSqlAgent) trained by `agl train --algorithm grpo`,
# side by side with `agl train --agent llm` (LlmSqlAgent), same settings and seed; then the
# overhead per rollout of running the agent out of process.
#
# Usage: scripts/bench/agent_compare.sh [OUT_DIR]   (default /tmp/agl-agent-compare)
#
# Environment: STEPS (4), TASKS (2), GROUP (4), EVAL (20), MAX_TOKENS (128), WORKERS (8),
# MODEL (smollm2-135m-instruct), AGL_BIN (default: the debug build in CARGO_TARGET_DIR),
# VENV (/var/tmp/agl-train-agent-venv, built by scripts/ci/train_agent.sh).
#
# 1. Learning, one run each, governance audit (the reward is the task's alone in every run):
#    A `agl train --agent llm`; B the Python agent under Agent Lightning's runner (--runner none,
#    WORKERS runner processes); C the same agent under `--runner exec:` (one process per rollout).
#    B and C train on `agl spider tasks --split train` in the order A uses (--keep-order) and
#    validate on `agl spider tasks --split dev --limit EVAL` (A's --eval-limit subset).
# 2. Overhead: one step of 8 rollouts, one worker, one token per answer, for A, B, C and the
#    shell agent (examples/exec/sql_agent.sh); rollout seconds per rollout.
# Prints one table per part; the reports stay in OUT_DIR.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${1:-/tmp/agl-agent-compare}"
STEPS="${STEPS:-4}" TASKS="${TASKS:-2}" GROUP="${GROUP:-4}" EVAL="${EVAL:-20}"
MAX_TOKENS="${MAX_TOKENS:-128}" WORKERS="${WORKERS:-8}" MODEL="${MODEL:-smollm2-135m-instruct}"
VENV="${VENV:-/var/tmp/agl-train-agent-venv}"
AGL="${AGL_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/debug/agl}"
PY="$VENV/bin/python"
AGENT="$ROOT/examples/python/spider_agent.py"
export LITELLM_LOCAL_MODEL_COST_MAP=True PYTHONUNBUFFERED=1 AGL="$AGL"
mkdir -p "$OUT"
cd "$OUT"

# --messages: the shell agent sends the built-in agent's write prompt from the task (the Python
# agent builds the same prompt itself), so every run sends the same prompt.
"$AGL" spider tasks --split train --messages --out train.jsonl
"$AGL" spider tasks --split dev --limit "$EVAL" --out dev.jsonl

common=(--steps "$STEPS" --tasks-per-step "$TASKS" --group-size "$GROUP" --max-tokens "$MAX_TOKENS"
        --seed 0 --governance audit --model "$MODEL")
any=(--algorithm grpo --train-dataset train.jsonl --keep-order --val-dataset dev.jsonl
     --eval-limit "$EVAL" --workers "$WORKERS")

# Runs `agl train ARGS` with Agent Lightning's runner serving its store; $1 is the run's name.
with_al_runner() {
    local name="$1" n="$2"
    shift 2
    "$AGL" train "$@" > "$name.out" 2> "$name.err" &
    local train=$!
    local url=""
    for _ in $(seq 1 120); do
        url="$(grep -o 'http://[0-9.:]*' "$name.out" 2>/dev/null | head -n1 || true)"
        [ -n "$url" ] && break
        sleep 1
    done
    "$PY" "$AGENT" --store-url "$url" --n-runners "$n" --poll-interval 0.05 > "$name.runner.out" 2> "$name.runner.err" &
    local runner=$!
    wait "$train"
    kill -INT "$runner" 2> /dev/null || true
    wait "$runner" 2> /dev/null || true
}

echo "== 1. learning: A LlmSqlAgent, B Python agent (AL runner), C Python agent (exec)" >&2
"$AGL" train --agent llm "${common[@]}" --eval-limit "$EVAL" --workers "$WORKERS" \
    --checkpoint-dir ckpt-A --report A.json > A.out 2> A.err
with_al_runner B "$WORKERS" "${any[@]}" "${common[@]}" --runner none --checkpoint-dir ckpt-B --report B.json
"$AGL" train "${any[@]}" "${common[@]}" --runner "exec:$PY $AGENT --exec" \
    --checkpoint-dir ckpt-C --report C.json > C.out 2> C.err

echo "== 2. overhead: 8 rollouts, 1 worker, 1 token per answer" >&2
one=(--steps 1 --tasks-per-step 4 --group-size 2 --max-tokens 1 --seed 0 --governance audit
     --model "$MODEL" --workers 1)
oany=(--algorithm grpo --train-dataset train.jsonl --keep-order)
"$AGL" train --agent llm "${one[@]}" --eval-limit 1 --checkpoint-dir ckpt-oA --report oA.json > oA.out 2> oA.err
with_al_runner oB 1 "${oany[@]}" "${one[@]}" --runner none --checkpoint-dir ckpt-oB --report oB.json
"$AGL" train "${oany[@]}" "${one[@]}" --runner "exec:$PY $AGENT --exec" \
    --checkpoint-dir ckpt-oC --report oC.json > oC.out 2> oC.err
"$AGL" train "${oany[@]}" "${one[@]}" --runner "exec:$ROOT/examples/exec/sql_agent.sh" \
    --checkpoint-dir ckpt-oD --report oD.json > oD.out 2> oD.err

python3 - <<'EOF'
import json

def load(n):
    return json.load(open(f"{n}.json"))

def llm(r):
    run = next(iter(r["runs"].values()))
    c = run["curve"]
    return dict(before=r["untrained"]["dev"]["accuracy"], after=run["dev"]["accuracy"],
                n=run["dev"]["questions"], toks=sum(p["completion_tokens"] for p in c),
                rs=sum(p["rollout_seconds"] for p in c), step=sum(p["step_seconds"] for p in c) / len(c),
                upd=sum(p["update_seconds"] for p in c) / len(c), rollouts=run["train"]["rollouts"],
                reward=sum(p["reward"] for p in c) / len(c))

def any_(r):
    c = r["curve"]
    b, a = r.get("before") or {}, r.get("after") or {}
    return dict(before=b.get("mean_reward"), after=a.get("mean_reward"), n=a.get("tasks"),
                toks=sum(p["completion_tokens"] for p in c), rs=sum(p["rollout_seconds"] for p in c),
                step=sum(p["step_seconds"] for p in c) / len(c),
                upd=sum(p["update_seconds"] for p in c) / len(c),
                rollouts=sum(p["rewarded"] + p["unrewarded"] for p in c),
                reward=sum(p["reward"] for p in c) / len(c))

rows = [("A LlmSqlAgent (in process)", llm(load("A"))),
        ("B Python agent, AL runner", any_(load("B"))),
        ("C Python agent, exec", any_(load("C")))]
print(f"{'run':30} {'dev before':>10} {'dev after':>10} {'train reward':>12} {'tok/s':>7} {'s/step':>7} {'update s':>8}")
for name, m in rows:
    fmt = lambda x: "-" if x is None else f"{x:.3f}"
    print(f"{name:30} {fmt(m['before']):>10} {fmt(m['after']):>10} {m['reward']:>12.3f} "
          f"{m['toks'] / max(m['rs'], 1e-9):>7.1f} {m['step']:>7.1f} {m['upd']:>8.1f}")
print()
orows = [("A LlmSqlAgent (in process)", llm(load("oA"))),
         ("B Python agent, AL runner", any_(load("oB"))),
         ("C Python agent, exec", any_(load("oC"))),
         ("D shell agent (curl+jq), exec", any_(load("oD")))]
base = orows[0][1]["rs"] / orows[0][1]["rollouts"]
print(f"{'run (1 worker, 1 token)':30} {'rollouts':>8} {'s/rollout':>10} {'overhead s':>10}")
for name, m in orows:
    per = m["rs"] / m["rollouts"]
    print(f"{name:30} {m['rollouts']:>8} {per:>10.3f} {per - base:>10.3f}")
EOF
