#!/usr/bin/env bash
# The README's main-job table over several seeds: runs `agl train --compare
# audit,shield,screen,enforce --seed S` for each seed (default 0 1 2 3 4), keeps each report
# under runs/seeds/, and prints every cell as mean [min–max] (scripts/bench/seed_table.py).
#
# Usage: scripts/bench/main-table.sh [SEED ...]    (env OUT=DIR changes runs/seeds)
# One seed takes a few minutes on a 2-core machine; the build is the release profile.
set -euo pipefail
cd "$(dirname "$0")/../.."
seeds=("$@")
[ ${#seeds[@]} -gt 0 ] || seeds=(0 1 2 3 4)
out=${OUT:-runs/seeds}
mkdir -p "$out"
cargo build --release --locked -q -p agl-cli
agl=${CARGO_TARGET_DIR:-target}/release/agl
reports=()
for s in "${seeds[@]}"; do
  echo "seed $s: $agl train --compare audit,shield,screen,enforce --seed $s" >&2
  "$agl" train --compare audit,shield,screen,enforce --seed "$s" \
    --report "$out/report-$s.json" --audit-log "$out/audit-$s.db" --plot "$out/curves-$s.svg" \
    > "$out/out-$s.txt" 2>&1 || { echo "seed $s failed: see $out/out-$s.txt" >&2; exit 1; }
  reports+=("$out/report-$s.json")
done
python3 scripts/bench/seed_table.py "${reports[@]}"
