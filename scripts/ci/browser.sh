#!/usr/bin/env bash
# Browser test of the dashboard: headless Chromium (Debian's own package, driven by Python
# Playwright) opens every page of `agl store` over a store filled by a short real training run,
# checks its content, that the console shows no error, that no script threw, and that no request
# of the page failed or answered 4xx/5xx, and saves a full-page screenshot of each page.
#
# Usage: scripts/ci/browser.sh [--screenshots DIR] [--pages LIST]
#   --screenshots DIR  save the screenshots in DIR (e.g. to refresh the README's images);
#                      by default they are kept in /var/tmp/agl-browser-shots
#   --pages LIST       run only these entries, comma-separated (default: all):
#                      /  /rollouts  /runners  /training  /resources  /governance
#                      /governance/audit  live (the live-update check on /training)
#
# Environment:
#   AGL_BROWSER_VENV  virtual environment to create or reuse (default /var/tmp/agl-browser-venv;
#                     reused only when its marker records the same pinned requirements and Python)
#   PYTHON            interpreter that creates the venv (default python3; 3.10 or newer)
#   CARGO_TARGET_DIR  honoured when locating the built `agl` binary (default target)
#   AGL_BIN           an `agl` binary to use instead of building one
#
# Steps: Debian's chromium and chromium-driver (apt-get, only when missing; needs root or
# password-less sudo); the cached venv with scripts/ci/browser/requirements.txt; `cargo build -p
# agl-cli`; `agl train --limit 120 --epochs 2` into a SQLite store and a flight-recorder
# database; `agl store --db STORE --audit-db AUDIT --port 0` in the background;
# scripts/ci/browser/dashboard_test.py (which also runs a second `agl train --store-url` into the
# served store for the live-update check); the server is always stopped (SIGTERM, then SIGKILL
# after 10 s).
#
# Exit status: 0 when every check passed, 1 otherwise, 2 on a usage error. Needs network access
# to the Debian mirror only when chromium is missing, and to PyPI only when the venv has to be
# (re)built; the browser itself runs with its background networking off.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
REQS="$ROOT/scripts/ci/browser/requirements.txt"
TEST="$ROOT/scripts/ci/browser/dashboard_test.py"
VENV="${AGL_BROWSER_VENV:-/var/tmp/agl-browser-venv}"
PYTHON="${PYTHON:-python3}"
MARKER="$VENV/.agl-browser-requirements"
CHROMIUM=/usr/bin/chromium
DEFAULT_SHOTS=/var/tmp/agl-browser-shots

usage() {
    sed -n '7,13p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

SHOTS=""
PAGES=""
while [ "$#" -gt 0 ]; do
    case "$1" in
        --screenshots | --pages)
            [ "$#" -ge 2 ] || { echo "browser.sh: $1 needs a value" >&2; usage >&2; exit 2; }
            if [ "$1" = --pages ]; then PAGES="$2"; else SHOTS="$2"; fi
            shift 2
            ;;
        --screenshots=*) SHOTS="${1#*=}"; shift ;;
        --pages=*) PAGES="${1#*=}"; shift ;;
        -h | --help) usage; exit 0 ;;
        *) echo "browser.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
    esac
done
if [ -n "$SHOTS" ]; then
    mkdir -p "$SHOTS"
    SHOTS="$(cd "$SHOTS" && pwd)"
fi

export PYTHONUNBUFFERED=1
export PIP_DISABLE_PIP_VERSION_CHECK=1
# Playwright drives Debian's chromium; it must never fetch a browser build of its own.
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1
# With a token the dashboard sends the browser to its sign-in page: serve without one.
unset AGL_STORE_TOKEN

SCRIPT=browser.sh
# shellcheck source=scripts/lib/common.sh
source "$ROOT/scripts/lib/common.sh"

T_START=$SECONDS

# ---------------------------------------------------------------------------------------------
# 1. Headless Chromium from Debian's packages (installed once, when missing).
# ---------------------------------------------------------------------------------------------
if [ ! -x "$CHROMIUM" ] || ! command -v chromedriver >/dev/null 2>&1; then
    SUDO=()
    if [ "$(id -u)" -ne 0 ]; then
        command -v sudo >/dev/null 2>&1 || {
            echo "browser.sh: chromium is missing and installing it needs root" >&2
            exit 1
        }
        SUDO=(sudo -n)
    fi
    export DEBIAN_FRONTEND=noninteractive
    APT_INSTALL=(${SUDO[@]+"${SUDO[@]}"} apt-get install -y --no-install-recommends chromium chromium-driver)
    # The package lists are refreshed only when the install fails with the ones already there.
    # apt's output goes to a log, shown when the install fails.
    echo "browser.sh: installing chromium and chromium-driver from Debian's packages" >&2
    if ! run "${APT_INSTALL[@]}" >"$WORK/apt.log" 2>&1; then
        if ! { run ${SUDO[@]+"${SUDO[@]}"} apt-get update && run "${APT_INSTALL[@]}"; } >"$WORK/apt.log" 2>&1; then
            echo "browser.sh: installing chromium failed; apt's output:" >&2
            tail -n 30 "$WORK/apt.log" >&2
            exit 1
        fi
    fi
fi
[ -x "$CHROMIUM" ] || { echo "browser.sh: no chromium at $CHROMIUM" >&2; exit 1; }
echo "browser.sh: $("$CHROMIUM" --version 2>/dev/null || echo "chromium at $CHROMIUM")" >&2

# ---------------------------------------------------------------------------------------------
# 2. The Python environment (cached across runs) and the agl binary.
# ---------------------------------------------------------------------------------------------
ensure_venv "$PYTHON" "$VENV" "$REQS" "$MARKER" 10
PY="$VENV/bin/python"
if [ -n "$PAGES" ]; then
    # Refuses an unknown entry before anything is built or trained.
    "$PY" "$TEST" --list --pages "$PAGES" >/dev/null || exit 2
fi
find_agl
T_READY=$SECONDS

# ---------------------------------------------------------------------------------------------
# 3. A store and a flight recorder filled by a short real training run.
# ---------------------------------------------------------------------------------------------
if ! run "$AGL" train --limit 120 --epochs 2 --store "$WORK/store.sqlite" \
    --audit-log "$WORK/audit.db" >"$WORK/train.out" 2>"$WORK/train.err"; then
    echo "browser.sh: the training run failed; its output:" >&2
    tail -n 20 "$WORK/train.out" "$WORK/train.err" >&2
    exit 1
fi
grep -hE '^(store|audit log|total time):' "$WORK/train.out" "$WORK/train.err" >&2 || true
T_TRAINED=$SECONDS

# ---------------------------------------------------------------------------------------------
# 4. The server.
# ---------------------------------------------------------------------------------------------
STORE_ARGS=(--db "$WORK/store.sqlite" --audit-db "$WORK/audit.db")
TEST_ARGS=(--audit)
echo "+ $AGL store ${STORE_ARGS[*]} --port 0 &" >&2
"$AGL" store "${STORE_ARGS[@]}" --port 0 >"$WORK/server.out" 2>"$WORK/server.err" &
SERVER_PID=$!
wait_for_listening 60
echo "browser.sh: $LINE" >&2

# ---------------------------------------------------------------------------------------------
# 5. The browser.
# ---------------------------------------------------------------------------------------------
SHOT_DIR="${SHOTS:-$WORK/shots}"
mkdir -p "$SHOT_DIR"
if [ -n "$PAGES" ]; then
    TEST_ARGS+=(--pages "$PAGES")
fi
T_BROWSER=$SECONDS
status=0
run "$PY" "$TEST" --url "$URL" --agl "$AGL" --work "$WORK" --chromium "$CHROMIUM" \
    --screenshots "$SHOT_DIR" ${TEST_ARGS[@]+"${TEST_ARGS[@]}"} || status=$?
T_END=$SECONDS
stop_server

if [ -z "$SHOTS" ]; then
    rm -rf "$DEFAULT_SHOTS"
    mkdir -p "$DEFAULT_SHOTS"
    cp -a "$SHOT_DIR"/. "$DEFAULT_SHOTS"/
    SHOT_DIR="$DEFAULT_SHOTS"
fi
echo "browser.sh: screenshots in $SHOT_DIR" >&2
TIMES="setup $((T_READY - T_START)) s, training $((T_TRAINED - T_READY)) s, browser $((T_END - T_BROWSER)) s, $((T_END - T_START)) s in all"

if [ "$status" -ne 0 ]; then
    if [ "$status" -eq 2 ]; then
        echo "browser.sh: the test refused its arguments" >&2
        exit 2
    fi
    echo "browser.sh: FAILED ($TIMES); last lines of the server's stderr:" >&2
    tail -n 30 "$WORK/server.err" >&2 || true
    exit 1
fi
echo "browser.sh: passed ($TIMES)" >&2
