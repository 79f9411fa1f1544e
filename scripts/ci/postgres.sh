#!/usr/bin/env bash
# PostgreSQL test harness: a throwaway PostgreSQL cluster (Debian's own server packages) for the
# store's PostgreSQL backend, started on a free port of 127.0.0.1, handed to a command as
# AGL_TEST_POSTGRES_URL, and always stopped and removed afterwards.
#
# Usage: scripts/ci/postgres.sh                   run the default test command (DEFAULT_CMD below)
#        scripts/ci/postgres.sh -- CMD [ARG...]   run any command with AGL_TEST_POSTGRES_URL set, e.g.
#            scripts/ci/postgres.sh -- bash -c 'psql "$AGL_TEST_POSTGRES_URL" -c "select version()"'
#        scripts/ci/postgres.sh --shell           start the cluster, print its URL on stdout and wait
#                                              (for manual use) until Ctrl-C
#
# AGL_TEST_POSTGRES_URL is postgres://agl@127.0.0.1:PORT/agl_test: the superuser `agl`, no
# password (trust authentication, loopback and the cluster's own Unix socket only), an empty
# database agl_test, UTF8 with the C locale. The default command runs in the repository root,
# one given after -- in the current directory.
#
# Environment:
#   TMPDIR  where the cluster's directory is made (default /tmp); when run as root it must be
#           reachable by the `postgres` user
#
# Steps: Debian's postgresql package (apt-get install, only when no server is installed; needs
# root); the highest version under /usr/lib/postgresql/VERSION/bin; initdb as the `postgres`
# user when run as root (runuser or su), else as the current user, into a fresh directory under
# $TMPDIR, with fsync, synchronous_commit and full_page_writes off and max_connections=200; the
# server (pg_ctl) listening on 127.0.0.1 only, on a free port (retried on a collision), its Unix
# socket in the cluster's directory; pg_isready (30 s at most); createdb agl_test; the command.
# On exit, Ctrl-C included, the cluster is stopped (pg_ctl stop -m immediate) and its directory
# removed. No other cluster is ever touched (Debian's `main` cluster, if any, is left as it is).
#
# Exit status: the command's (--shell: 130 on Ctrl-C); 1 when the cluster could not be set up,
# 2 on a usage error. Needs network access to the Debian mirror only when the server is missing.
set -euo pipefail

# The tests of the store's PostgreSQL backend (the default command; .ci/run runs it).
DEFAULT_CMD=(bash -c 'cargo test --locked -p agl-store --features postgres-tests --lib --test postgres \
    && cargo test --locked -p agl-store --features postgres-tests --test properties --test sqlite_queries postgres_ \
    && cargo test --locked -p agl-cli --features postgres-tests --test postgres_servers \
    && cargo test --locked -p agl-cli --features postgres-tests --test bench_server postgres_')

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PG_LIB=/usr/lib/postgresql
DB=agl_test
DB_USER=agl
READY_TIMEOUT=30
PORT_TRIES=5

usage() {
    sed -n '6,10p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

SHELL_MODE=0
CMD=()
case "${1:-}" in
    "") ;;
    --)
        shift
        CMD=("$@")
        [ "${#CMD[@]}" -gt 0 ] || { echo "postgres.sh: no command after --" >&2; exit 2; }
        ;;
    --shell) [ "$#" -eq 1 ] || { echo "postgres.sh: --shell takes no argument" >&2; exit 2; }; SHELL_MODE=1 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "postgres.sh: unknown argument '$1' (a command goes after --)" >&2; usage >&2; exit 2 ;;
esac

SCRIPT=postgres.sh
# shellcheck source=scripts/lib/common.sh
source "$ROOT/scripts/lib/common.sh"

ms() { echo $(($(date +%s%N) / 1000000)); }
secs() { local d=$(($(ms) - $1)); printf '%d.%02d s' $((d / 1000)) $((d % 1000 / 10)); }
T_START="$(ms)"

# ---------------------------------------------------------------------------------------------
# 1. The server, from Debian's packages (installed once, when missing).
# ---------------------------------------------------------------------------------------------
# find_pg_bin: sets PGBIN to the highest /usr/lib/postgresql/VERSION/bin with the server in it.
find_pg_bin() {
    PGBIN="$(for d in "$PG_LIB"/*/bin; do
        if [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ] && [ -x "$d/postgres" ]; then echo "$d"; fi
    done | sort -V | tail -n 1)"
}

find_pg_bin
T_INSTALL=""
if [ -z "$PGBIN" ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "postgres.sh: no PostgreSQL server in $PG_LIB/*/bin, and installing it needs root (apt-get install postgresql)" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    APT_INSTALL=(apt-get install -y --no-install-recommends postgresql)
    # The package lists are refreshed only when the install fails with the ones already there.
    # apt's output goes to a log, shown when the install fails. Where services may start (no
    # policy-rc.d forbidding it), the package starts Debian's own `main` cluster on port 5432:
    # it is left as it is, this script never uses it.
    echo "postgres.sh: installing the PostgreSQL server from Debian's packages" >&2
    if ! run "${APT_INSTALL[@]}" >"$WORK/apt.log" 2>&1; then
        if ! { run apt-get update && run "${APT_INSTALL[@]}"; } >"$WORK/apt.log" 2>&1; then
            echo "postgres.sh: installing postgresql failed; apt's output:" >&2
            tail -n 30 "$WORK/apt.log" >&2
            exit 1
        fi
    fi
    find_pg_bin
    [ -n "$PGBIN" ] || { echo "postgres.sh: postgresql installed, yet no server in $PG_LIB/*/bin" >&2; exit 1; }
    T_INSTALL="$(secs "$T_START")"
fi
echo "postgres.sh: $("$PGBIN/postgres" --version) in $PGBIN" >&2

# ---------------------------------------------------------------------------------------------
# 2. A throwaway cluster, owned by an unprivileged user.
# ---------------------------------------------------------------------------------------------
CLUSTER="$WORK/cluster"
DATA="$CLUSTER/data"
LOG="$CLUSTER/server.log"
PORT=""
STARTED=0

# as_pg CMD...: runs CMD as the cluster's owner (from within the cluster's directory, which that
# user can read).
if [ "$(id -u)" -eq 0 ]; then
    PG_USER=postgres
    id -u "$PG_USER" >/dev/null 2>&1 || { echo "postgres.sh: there is no '$PG_USER' user to run the server as" >&2; exit 1; }
    if command -v runuser >/dev/null 2>&1; then
        as_pg() { (cd "$CLUSTER" && runuser -u "$PG_USER" -- "$@"); }
    else
        as_pg() { (cd "$CLUSTER" && su -s /bin/bash "$PG_USER" -c "$(printf '%q ' "$@")"); }
    fi
else
    PG_USER="$(id -un)"
    as_pg() { (cd "$CLUSTER" && "$@"); }
fi
# run_pg LOG CMD...: echoes CMD, then runs it as the cluster's owner with its output in LOG.
run_pg() {
    local log="$1"
    shift
    echo "+ [$PG_USER] $* >$log 2>&1" >&2
    as_pg "$@" >"$log" 2>&1
}

# stop_cluster: stops our server (never any other) at once, SIGKILL when pg_ctl cannot; its
# directory goes with $WORK.
stop_cluster() {
    local pid
    if [ "$STARTED" -eq 1 ] && [ -f "$DATA/postmaster.pid" ]; then
        pid="$(head -n 1 "$DATA/postmaster.pid" 2>/dev/null || true)"
        if ! as_pg "$PGBIN/pg_ctl" -D "$DATA" -m immediate -w -t 10 stop >/dev/null 2>&1 &&
            [ -n "$pid" ] && [ "$(ps -o comm= -p "$pid" 2>/dev/null)" = postgres ]; then
            kill -KILL "$pid" 2>/dev/null || true
        fi
    fi
    STARTED=0
}

SLEEP_PID=""
# shellcheck disable=SC2317  # run by the EXIT trap
pg_cleanup() {
    if [ -n "$SLEEP_PID" ]; then kill "$SLEEP_PID" 2>/dev/null || true; fi
    stop_cluster
    cleanup
}
# Replaces common.sh's `trap cleanup EXIT` (pg_cleanup calls it); its INT/TERM trap stays.
trap pg_cleanup EXIT

# free_port: a port of 127.0.0.1 that nothing listens on now (the kernel's pick; a random one
# checked against `ss` without python3). The server may still lose it: start_cluster retries.
free_port() {
    if command -v python3 >/dev/null 2>&1; then
        python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
    else
        local p
        while :; do
            p=$((20000 + RANDOM % 40000))
            ss -Htan "sport = :$p" 2>/dev/null | grep -q . || { echo "$p"; return; }
        done
    fi
}

# Owned by the server's user; $WORK (0700) must let it through.
chmod 711 "$WORK"
mkdir -m 700 "$CLUSTER"
if [ "$(id -u)" -eq 0 ]; then chown "$PG_USER:" "$CLUSTER"; fi
if ! as_pg test -w "$CLUSTER"; then
    echo "postgres.sh: the '$PG_USER' user cannot write to $CLUSTER; set TMPDIR to a directory it can reach" >&2
    exit 1
fi

if ! run_pg "$WORK/initdb.log" "$PGBIN/initdb" -D "$DATA" -U "$DB_USER" -A trust -E UTF8 \
    --locale=C --no-sync --no-instructions; then
    echo "postgres.sh: initdb failed; its output:" >&2
    tail -n 30 "$WORK/initdb.log" >&2
    exit 1
fi
# A throwaway test cluster: durability off. pg_hba.conf (from -A trust) lets in only the Unix
# socket and loopback connections; the server listens on 127.0.0.1 alone.
as_pg tee -a "$DATA/postgresql.conf" >/dev/null <<EOF

# scripts/ci/postgres.sh: a throwaway test cluster
listen_addresses = '127.0.0.1'
unix_socket_directories = '$CLUSTER'
max_connections = 200
fsync = off
synchronous_commit = off
full_page_writes = off
EOF

# start_cluster: starts the server on a free port, retried when another process took the port
# first; exits 1 with the server's log on any other failure.
start_cluster() {
    local try
    for try in $(seq 1 "$PORT_TRIES"); do
        PORT="$(free_port)"
        STARTED=1
        if run_pg "$WORK/pg_ctl.log" "$PGBIN/pg_ctl" -D "$DATA" -l "$LOG" -o "-p $PORT" -w \
            -t "$READY_TIMEOUT" start; then
            return 0
        fi
        stop_cluster
        if grep -q 'Address already in use' "$LOG" 2>/dev/null && [ "$try" -lt "$PORT_TRIES" ]; then
            echo "postgres.sh: port $PORT was taken meanwhile; trying another" >&2
            as_pg truncate -s 0 "$LOG"
            continue
        fi
        echo "postgres.sh: the server did not start; pg_ctl's output and the server's log:" >&2
        cat "$WORK/pg_ctl.log" >&2
        tail -n 40 "$LOG" >&2 2>/dev/null || true
        exit 1
    done
}

start_cluster
# pg_ctl -w saw the server ready; wait until it answers on 127.0.0.1:PORT as well.
DEADLINE=$((SECONDS + READY_TIMEOUT))
until "$PGBIN/pg_isready" -q -h 127.0.0.1 -p "$PORT" -U "$DB_USER" -d postgres; do
    if [ "$SECONDS" -ge "$DEADLINE" ]; then
        echo "postgres.sh: the server did not answer on 127.0.0.1:$PORT within $READY_TIMEOUT s; its log:" >&2
        tail -n 40 "$LOG" >&2
        exit 1
    fi
    sleep 0.1
done
if ! run "$PGBIN/createdb" -h 127.0.0.1 -p "$PORT" -U "$DB_USER" "$DB" >"$WORK/createdb.log" 2>&1; then
    echo "postgres.sh: createdb $DB failed:" >&2
    cat "$WORK/createdb.log" >&2
    exit 1
fi

export AGL_TEST_POSTGRES_URL="postgres://$DB_USER@127.0.0.1:$PORT/$DB"
echo "postgres.sh: cluster ready at $AGL_TEST_POSTGRES_URL in $(secs "$T_START")${T_INSTALL:+ (the install took $T_INSTALL)}; data in $DATA, owned by $PG_USER" >&2

# ---------------------------------------------------------------------------------------------
# 3. The command (or, with --shell, a wait until Ctrl-C).
# ---------------------------------------------------------------------------------------------
if [ "$SHELL_MODE" -eq 1 ]; then
    echo "$AGL_TEST_POSTGRES_URL"
    echo "postgres.sh: e.g. psql '$AGL_TEST_POSTGRES_URL'; press Ctrl-C to stop and remove the cluster" >&2
    sleep infinity &
    SLEEP_PID=$!
    wait "$SLEEP_PID" || true
    exit 0
fi

status=0
if [ "${#CMD[@]}" -eq 0 ]; then
    (cd "$ROOT" && run "${DEFAULT_CMD[@]}") || status=$?
else
    run "${CMD[@]}" || status=$?
fi
if [ "$status" -ne 0 ]; then
    echo "postgres.sh: the command exited with status $status" >&2
fi
exit "$status"
