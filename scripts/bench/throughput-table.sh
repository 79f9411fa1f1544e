#!/usr/bin/env bash
# The README's throughput table: `agl bench server` over every backend and Agent Lightning
# v0.3.0's own server, side by side in ONE invocation (same machine, same load), as Markdown.
#
# Usage: scripts/bench/throughput-table.sh [extra `agl bench server` arguments]
#   Without arguments: --rollouts 5000 --agentlightning-rollouts 500 (the README's run, a few
#   minutes on 2 cores); any arguments replace these two, e.g. --rollouts 2000 --json.
#
# Rows, each at 8 and 64 clients, each over a fresh store: memory, sqlite, postgres (one
# in-process server over a throwaway PostgreSQL cluster from scripts/ci/postgres.sh), postgres ×2
# (two in-process servers on one partition, the clients split between them), and
# agentlightning (v0.3.0's `python -m agentlightning.cli.store`, its in-memory store, from the
# virtual environment of scripts/ci/interop.sh; fewer cycles, see --agentlightning-rollouts).
#
# Environment:
#   AGL_INTEROP_VENV  the venv with agentlightning 0.3.0 (default /var/tmp/agl-interop-venv;
#                     created or reused exactly as scripts/ci/interop.sh does)
#   PYTHON            interpreter that creates the venv (default python3)
#   CARGO_TARGET_DIR  honoured when building and locating `agl`
#
# Prints Markdown unless the arguments include --json. Needs network access only to build the venv or install PostgreSQL the first time. Takes a few
# minutes; never run in CI.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
REQS="$ROOT/scripts/ci/interop/requirements.txt"
VENV="${AGL_INTEROP_VENV:-/var/tmp/agl-interop-venv}"
PYTHON="${PYTHON:-python3}"
MARKER="$VENV/.agl-interop-requirements"
export PIP_DISABLE_PIP_VERSION_CHECK=1
unset AGL_STORE_TOKEN

SCRIPT=throughput-table.sh
# shellcheck source=scripts/lib/common.sh
source "$ROOT/scripts/lib/common.sh"

EXTRA=("$@")
if [ "${#EXTRA[@]}" -eq 0 ]; then
    EXTRA=(--rollouts 5000 --agentlightning-rollouts 500)
fi
case " ${EXTRA[*]} " in
    *" --json "*) ;;
    *) EXTRA+=(--markdown) ;;
esac

ensure_venv "$PYTHON" "$VENV" "$REQS" "$MARKER" 10

(cd "$ROOT" && run cargo build --release --locked -p agl-cli)
AGL="${CARGO_TARGET_DIR:-$ROOT/target}/release/agl"
[ -x "$AGL" ] || { echo "throughput-table.sh: no agl binary at $AGL" >&2; exit 1; }

# shellcheck disable=SC2016 # expanded by the inner shell, once postgres.sh has set the URL
run "$ROOT/scripts/ci/postgres.sh" -- bash -c '
    agl="$1" python="$2"
    shift 2
    set -x
    "$agl" bench server \
        --backend memory,sqlite,postgres,postgres-2,agentlightning \
        --postgres-url "$AGL_TEST_POSTGRES_URL" \
        --agentlightning-python "$python" \
        --clients 8,64 "$@"
' throughput-table "$AGL" "$VENV/bin/python" "${EXTRA[@]}"
