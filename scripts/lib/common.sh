# Shared by scripts/ci/interop.sh, scripts/ci/llm.sh and scripts/ci/agent.sh (sourced, not run): command echo, a server
# process stopped on exit, and a cached virtual environment keyed by its pinned requirements.
#
# The sourcing script sets SCRIPT (its name for messages) before sourcing, and SERVER_PID when it
# starts a server; WORK is a fresh temporary directory removed on exit.

run() {
    echo "+ $*" >&2
    "$@"
}

WORK="$(mktemp -d "${TMPDIR:-/tmp}/agl-$SCRIPT.XXXXXX")"
SERVER_PID=""

# Stops the server: SIGTERM, then SIGKILL after 10 s.
stop_server() {
    if [ -n "$SERVER_PID" ]; then
        if kill -0 "$SERVER_PID" 2>/dev/null; then
            kill -TERM "$SERVER_PID" 2>/dev/null || true
            for _ in $(seq 1 100); do
                kill -0 "$SERVER_PID" 2>/dev/null || break
                sleep 0.1
            done
            kill -KILL "$SERVER_PID" 2>/dev/null || true
        fi
        wait "$SERVER_PID" 2>/dev/null || true
        SERVER_PID=""
    fi
}

cleanup() {
    stop_server
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ensure_venv PYTHON VENV REQS MARKER MIN_MINOR
# Creates (or reuses) the venv VENV with the pinned requirements REQS, made by PYTHON 3.MIN_MINOR
# or newer. It is reused only when MARKER records the same interpreter version and requirements
# hash; a non-venv directory at VENV is refused, never overwritten.
ensure_venv() {
    local python="$1" venv="$2" reqs="$3" marker="$4" min_minor="$5" want
    "$python" -c "import sys; sys.exit(0 if sys.version_info >= (3, $min_minor) else 1)" || {
        echo "$SCRIPT: $python is older than 3.$min_minor" >&2
        exit 1
    }
    want="$("$python" -c 'import hashlib, sys
print(sys.version.split()[0])
print(hashlib.sha256(open(sys.argv[1], "rb").read()).hexdigest())' "$reqs")"
    if [ -f "$marker" ] && [ "$(cat "$marker")" = "$want" ] && [ -x "$venv/bin/python" ]; then
        echo "$SCRIPT: reusing the virtual environment $venv" >&2
        return 0
    fi
    if [ -e "$venv" ] && [ ! -f "$venv/pyvenv.cfg" ] && [ -n "$(ls -A "$venv" 2>/dev/null)" ]; then
        echo "$SCRIPT: $venv exists and is not a virtual environment; refusing to touch it" >&2
        exit 1
    fi
    rm -f "$marker"
    run "$python" -m venv --clear "$venv"
    run "$venv/bin/python" -m pip install --quiet --upgrade pip
    run "$venv/bin/python" -m pip install --quiet -r "$reqs"
    run "$venv/bin/python" -m pip check
    printf '%s\n' "$want" >"$marker"
}

# wait_for_listening TIMEOUT_S
# Waits until the server (SERVER_PID, stdout in $WORK/server.out, stderr in $WORK/server.err)
# prints its first line with `listening on http://…`; sets URL and LINE. Exits 1 with the
# server's log when it dies first or stays silent for TIMEOUT_S seconds.
wait_for_listening() {
    local deadline=$((SECONDS + $1))
    URL=""
    LINE=""
    while [ "$SECONDS" -lt "$deadline" ]; do
        LINE="$(head -n 1 "$WORK/server.out" 2>/dev/null || true)"
        case "$LINE" in
            *"listening on http://"*)
                URL="$(printf '%s\n' "$LINE" | sed -E 's/.*listening on (http:\/\/[^ ]+).*/\1/')"
                return 0
                ;;
        esac
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            echo "$SCRIPT: the server exited before listening; its log:" >&2
            tail -n 40 "$WORK/server.err" >&2
            SERVER_PID=""
            exit 1
        fi
        sleep 0.2
    done
    echo "$SCRIPT: the server did not print its address within $1 s; its log:" >&2
    tail -n 40 "$WORK/server.err" >&2
    exit 1
}

# find_agl
# Sets AGL: $AGL_BIN when given, else the debug `agl` built now with `cargo build -p agl-cli`
# (in $CARGO_TARGET_DIR, default $ROOT/target). Exits 1 when there is no such binary.
find_agl() {
    if [ -n "${AGL_BIN:-}" ]; then
        AGL="$AGL_BIN"
    else
        (cd "$ROOT" && run cargo build --locked -p agl-cli)
        local target_dir="${CARGO_TARGET_DIR:-$ROOT/target}"
        case "$target_dir" in
            /*) ;;
            *) target_dir="$ROOT/$target_dir" ;;
        esac
        AGL="$target_dir/debug/agl"
    fi
    [ -x "$AGL" ] || { echo "$SCRIPT: no agl binary at $AGL" >&2; exit 1; }
}
