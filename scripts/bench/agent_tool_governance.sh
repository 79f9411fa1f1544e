#!/usr/bin/env bash
# Governance of the agent you bring where agl sees its actions: the Python Spider agent with a
# `run_sql` tool (examples/python/spider_agent.py --tool), so its SQL reaches agl's gateway as a
# tool call that the policy file marks as SQL (examples/policies/agent-tools.yaml:
# `sql_arguments: run_sql.query`), side by side with agl's own LlmSqlAgent on the same dev
# questions and the same policies.
#
# Usage: scripts/bench/agent_tool_governance.sh [OUT_DIR]   (default /tmp/agl-agent-tools)
#
# Environment: EVAL (50 dev questions), EVERY (20: every 20th dev question), MODEL (smollm2-135m-instruct), MAX_TOKENS (128),
# WORKERS (8), AGL_BIN (default: the debug build in CARGO_TARGET_DIR), VENV
# (/var/tmp/agl-train-agent-venv, built by scripts/ci/train_agent.sh).
#
# 1. The tool agent: one `agl train --algorithm grpo --compare audit,enforce` run whose
#    validation before training (greedy, the untrained model) is the measurement: per mode, the
#    share of dev tasks with a violation and the mean reward (under enforce every violation on a
#    run_sql call is a block, which the gateway answers with a refusal: the agent runs nothing). One minimal training step per mode (1 task, G = 2) is needed by the
#    command and not measured.
# 2. LlmSqlAgent: `agl eval --agent llm` on the same questions (every EVERY-th dev question, the
#    first EVAL of them), one turn, greedy, the same policy file: its violation rate (the kernel
#    checks the SQL it runs) and accuracy.
# Prints one table; the reports stay in OUT_DIR.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${1:-/tmp/agl-agent-tools}"
EVAL="${EVAL:-50}" EVERY="${EVERY:-20}" MODEL="${MODEL:-smollm2-135m-instruct}" MAX_TOKENS="${MAX_TOKENS:-128}"
WORKERS="${WORKERS:-8}" VENV="${VENV:-/var/tmp/agl-train-agent-venv}"
AGL="${AGL_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/debug/agl}"
PY="$VENV/bin/python"
POLICY="$ROOT/examples/policies/agent-tools.yaml"
export LITELLM_LOCAL_MODEL_COST_MAP=True PYTHONUNBUFFERED=1
mkdir -p "$OUT"
cd "$OUT"

"$AGL" spider tasks --split dev --every "$EVERY" --limit "$EVAL" --out dev.jsonl
"$AGL" spider tasks --split train --limit 1 --out train.jsonl

echo "== 1. the Python agent, SQL through a run_sql tool call, audit and enforce" >&2
"$AGL" train --algorithm grpo --train-dataset train.jsonl --val-dataset dev.jsonl \
    --eval-limit "$EVAL" --runner "exec:$PY $ROOT/examples/python/spider_agent.py --exec --tool" \
    --policy "$POLICY" --compare audit,enforce --steps 1 --tasks-per-step 1 --group-size 2 \
    --max-tokens "$MAX_TOKENS" --workers "$WORKERS" --model "$MODEL" --seed 0 \
    --checkpoint-dir ckpt --report tool.json > tool.out 2> tool.err

echo "== 2. LlmSqlAgent on the same questions" >&2
"$AGL" eval --agent llm --model "$MODEL" --every "$EVERY" --limit "$EVAL" --policy "$POLICY" --max-turns 1 \
    --max-tokens "$MAX_TOKENS" --workers "$WORKERS" --report llm.json > llm.out 2> llm.err

python3 - "$EVAL" <<'PY'
import json, sys
tool = json.load(open("tool.json"))
llm = json.load(open("llm.json"))
print(f"{'agent (dev questions: ' + sys.argv[1] + ')':44} {'mode':8} {'violation rate':>14} {'reward':>8}")
for run in tool["runs"]:
    b = run["before"]
    print(f"{'Python agent, SQL in a run_sql tool call':44} {run['config']['governance']:8} "
          f"{b['violation_rate']:>14.3f} {b['mean_reward']:>8.3f}")
d = llm["dev"]
print(f"{'LlmSqlAgent (in process), SQL checked as run':44} {'enforce':8} {d['violation_rate']:>14.3f} "
      f"{d['accuracy']:>8.3f}")
PY
