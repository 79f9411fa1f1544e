#!/usr/bin/env bash
# The Python wheel in CI: build agl-rl (scripts/build_wheel.sh), install it into a brand-new
# virtual environment with the test requirements (pytest, gymnasium, agentlightning:
# scripts/ci/python_wheel/requirements-test.txt), and run the Python tests (crates/agl-py/tests)
# there, outside the clone, so that `import agl_rl` can only find the installed wheel. The
# tests that run Agent Lightning's Trainer against `agl store` use the debug `agl` (find_agl).
#
# Usage: scripts/ci/python_wheel.sh
# Environment: as scripts/build_wheel.sh; PYTHON (python3) creates the test venv; AGL_BIN.
# Prints the wheel's size, the install time and the import time; exit status 0 when the tests pass.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SCRIPT=python_wheel.sh
# shellcheck source=scripts/lib/common.sh
source "$ROOT/scripts/lib/common.sh"
export PIP_DISABLE_PIP_VERSION_CHECK=1

WHEEL="$(run "$ROOT/scripts/build_wheel.sh" "$WORK/dist" | tail -n 1)"
echo "$SCRIPT: built $(basename "$WHEEL") ($(du -k "$WHEEL" | cut -f1) KiB)" >&2
run "${PYTHON:-python3}" -m venv "$WORK/venv"
PY="$WORK/venv/bin/python"
start=$(date +%s.%N)
run "$PY" -m pip install --quiet -r "$ROOT/scripts/ci/python_wheel/requirements-test.txt"
end=$(date +%s.%N)
echo "$SCRIPT: the test requirements took $("$PY" -c "print(round($end - $start, 1))") s to install" >&2
find_agl
start=$(date +%s.%N)
run "$PY" -m pip install --quiet --no-index "$WHEEL"
end=$(date +%s.%N)
echo "$SCRIPT: pip install of the wheel took $("$PY" -c "print(round($end - $start, 2))") s" >&2
cd "$WORK"
run "$PY" -X importtime -c "import agl_rl" 2> "$WORK/importtime.txt"
echo "$SCRIPT: import agl_rl: $(tail -n 1 "$WORK/importtime.txt" | awk -F'|' '{print $2}' | tr -d ' ') us cumulative" >&2
export AGL_BIN="$AGL" AGL_RL_REQUIRE_EXTRAS=1 LITELLM_LOCAL_MODEL_COST_MAP=True
run "$PY" -m pytest -q -p no:cacheprovider "$ROOT/crates/agl-py/tests"

# The `agl` command from the wheel alone: the README's main job in an empty temporary directory,
# AGL_DATA unset, with the venv's bin/ first on PATH. The wheel's agl is a portable build, which
# never looks at a source tree: it must find the Spider data the wheel installed.
unset AGL_DATA
MAIN_JOB="$WORK/main-job"
mkdir -p "$MAIN_JOB"
cd "$MAIN_JOB"
export PATH="$WORK/venv/bin:$PATH"
[ "$(command -v agl)" = "$WORK/venv/bin/agl" ] || { echo "$SCRIPT: the wheel put no agl on PATH" >&2; exit 1; }
db_path="$(agl spider tasks --split dev --limit 1 | "$PY" -c 'import json, sys; print(json.loads(sys.stdin.readline())["db_path"])')"
case "$db_path" in
    "$WORK/venv/share/agl/spider/"*) ;;
    *) echo "$SCRIPT: the wheel's agl read the Spider data from $db_path, not from the wheel" >&2; exit 1 ;;
esac
start=$(date +%s)
run agl train --compare audit,shield,screen,enforce --report runs/report.json --audit-log runs/audit.db --plot runs/curves.svg
echo "$SCRIPT: the README's main job ran from the wheel in $(( $(date +%s) - start )) s" >&2
"$PY" -c 'import json; r = json.load(open("runs/report.json")); assert r, "empty report"'
test -s runs/curves.svg
echo "$SCRIPT: passed" >&2
