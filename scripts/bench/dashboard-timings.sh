#!/usr/bin/env bash
# Page-load times of the dashboard over a store: serves DB with `agl store --db DB --port 0`,
# times each page with curl (one warm-up, then RUNS runs; median, min and max of time_total,
# seconds) while the dashboard's tally catches up, then again once it has read every finished
# rollout. Used for the table in docs/benchmarks.md at 100,000 rollouts / 1,000,000 spans:
#
#   cargo run --release -p agl-store --example fill_store -- /tmp/big.db   # about 20 s, 1.7 GB
#   scripts/bench/dashboard-timings.sh /tmp/big.db
#
# Usage: scripts/bench/dashboard-timings.sh DB [RUNS]   (RUNS default 9)
# Environment: AGL (the binary; default $CARGO_TARGET_DIR/release/agl, else target/release/agl).
# The database is opened as `agl store --db` opens it (an older schema is migrated).
set -euo pipefail
db=${1:?usage: scripts/bench/dashboard-timings.sh DB [RUNS]}
runs=${2:-9}
AGL=${AGL:-${CARGO_TARGET_DIR:-target}/release/agl}
[ -x "$AGL" ] || { echo "dashboard-timings.sh: no agl binary at $AGL (cargo build --release)" >&2; exit 1; }
[ -f "$db" ] || { echo "dashboard-timings.sh: no database at $db" >&2; exit 1; }
log=$(mktemp)
"$AGL" store --db "$db" --port 0 >"$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; rm -f "$log"' EXIT
for _ in $(seq 300); do grep -q "listening on" "$log" && break; sleep 0.1; done
base=$(grep -o 'listening on http://[^ ]*' "$log" | sed 's/listening on //')
[ -n "$base" ] || { echo "dashboard-timings.sh: the server did not start:" >&2; cat "$log" >&2; exit 1; }
rid=$(curl -s "$base/v1/agl/rollouts?limit=1&status_in=succeeded" | python3 -c 'import json,sys; print(json.load(sys.stdin)["items"][0]["rollout_id"])')
time_page() {
    local path=$1 code ts
    code=$(curl -s -o /dev/null -w '%{http_code}' "$base$path")
    ts=$(for _ in $(seq "$runs"); do curl -s -o /dev/null -w '%{time_total}\n' "$base$path"; done | sort -n)
    printf "%-48s HTTP %s  median %s s  min %s  max %s\n" "$path" "$code" \
        "$(echo "$ts" | sed -n "$(((runs + 1) / 2))p")" "$(echo "$ts" | head -1)" "$(echo "$ts" | tail -1)"
}
echo "-- while the tally catches up"
for path in "/" "/training" "/governance"; do time_page "$path"; done
start=$SECONDS
until curl -s "$base/training" | grep -q "up to date"; do sleep 1; done
echo "-- the tally caught up $((SECONDS - start)) s later: $(curl -s "$base/training" | grep -o 'tally-rollouts">[0-9]*</strong> of [0-9]*' | sed 's/tally-rollouts">//; s/<\/strong>//') finished rollouts"
for path in "/" "/?status=succeeded" "/?mode=val" "/?id=abc" "/?offset=90000" "/?sort=status&order=asc" \
    "/?sort=status" "/?sort=end_time" "/?status=succeeded&sort=end_time&offset=80000" "/runners" \
    "/rollouts/$rid" "/training" "/resources" "/governance"; do
    time_page "$path"
done
