#!/usr/bin/env bash
# The Python wheel in CI: build agl-rl (scripts/build_wheel.sh), install it into a brand-new
# virtual environment, and run the Python tests (crates/agl-py/tests) there, outside the clone, so
# that `import agl_rl` can only find the installed wheel.
#
# Usage: scripts/ci/python_wheel.sh
# Environment: as scripts/build_wheel.sh; PYTHON (python3) creates the test venv.
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
pytest_req="$(grep -E '^pytest==' "$ROOT/scripts/ci/python_wheel/requirements.txt")"
run "$PY" -m pip install --quiet "$pytest_req"
start=$(date +%s.%N)
run "$PY" -m pip install --quiet --no-index "$WHEEL"
end=$(date +%s.%N)
echo "$SCRIPT: pip install of the wheel took $("$PY" -c "print(round($end - $start, 2))") s" >&2
cd "$WORK"
run "$PY" -X importtime -c "import agl_rl" 2> "$WORK/importtime.txt"
echo "$SCRIPT: import agl_rl: $(tail -n 1 "$WORK/importtime.txt" | awk -F'|' '{print $2}' | tr -d ' ') us cumulative" >&2
run "$PY" -m pytest -q -p no:cacheprovider "$ROOT/crates/agl-py/tests"
echo "$SCRIPT: passed" >&2
