#!/usr/bin/env bash
# `agl bench llm` side by side with llama.cpp (llama-cpp-python) on the same GGUF and threads.
#
# Usage: scripts/bench/bench-llm.sh [extra `agl bench llm` arguments, e.g. --json]
#
# Environment:
#   AGL_BENCH_VENV    virtual environment with llama-cpp-python (default /var/tmp/agl-bench-venv;
#                     reused when its marker records the same pinned version). The first build
#                     compiles llama.cpp from source: 15-40 minutes on 2 cores. Never run in CI.
#   CARGO_TARGET_DIR  honoured when building and locating `agl`
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${AGL_BENCH_VENV:-/var/tmp/agl-bench-venv}"
PIN="llama-cpp-python==0.3.36"
MARKER="$VENV/.agl-bench-requirements"
export PIP_DISABLE_PIP_VERSION_CHECK=1

if [ ! -f "$MARKER" ] || [ "$(cat "$MARKER")" != "$PIN" ]; then
    echo "+ creating $VENV with $PIN (builds llama.cpp from source; this takes a while)" >&2
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet "$PIN"
    echo "$PIN" > "$MARKER"
fi

cd "$ROOT"
cargo build --release --locked -p agl-cli
AGL="${CARGO_TARGET_DIR:-$ROOT/target}/release/agl"
"$AGL" model pull smollm2-135m-instruct
exec "$AGL" bench llm --llama-cpp-python "$VENV/bin/python" "$@"
