#!/usr/bin/env bash
# Builds the agl-rl wheel (the Python module agl_rl: agl's kernel, flight recorder and reward
# shaping, PyO3, stable ABI from CPython 3.10) into OUT_DIR.
#
# Usage: scripts/build_wheel.sh [OUT_DIR]   (default target/wheels)
#
# Environment:
#   AGL_WHEEL_TARGET_DIR   cargo's target directory for the wheel (default /var/tmp/agl-wheel-target):
#                          separate from the workspace's, whose builds are for this CPU only
#   AGL_WHEEL_CPU          the -C target-cpu of the wheel (default x86-64: any x86-64 CPU; the
#                          workspace's .cargo/config.toml says `native`, which a wheel must never
#                          use: it dies with SIGILL on an older CPU)
#   AGL_WHEEL_BUILD_VENV   virtual environment holding maturin (default /var/tmp/agl-wheel-build-venv;
#                          created from scripts/ci/python_wheel/requirements.txt when missing)
#   PYTHON                 interpreter that creates the venv (default python3)
# Prints the wheel's path as its last line.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-$ROOT/target/wheels}"
TARGET_DIR="${AGL_WHEEL_TARGET_DIR:-/var/tmp/agl-wheel-target}"
CPU="${AGL_WHEEL_CPU:-x86-64}"
VENV="${AGL_WHEEL_BUILD_VENV:-/var/tmp/agl-wheel-build-venv}"
REQS="$ROOT/scripts/ci/python_wheel/requirements.txt"
MARKER="$VENV/.agl-requirements"
export PIP_DISABLE_PIP_VERSION_CHECK=1

want="$(sha256sum "$REQS" | cut -d' ' -f1)"
if [ ! -x "$VENV/bin/maturin" ] || [ "$(cat "$MARKER" 2>/dev/null)" != "$want" ]; then
    "${PYTHON:-python3}" -m venv --clear "$VENV"
    "$VENV/bin/pip" install --quiet -r "$REQS"
    echo "$want" > "$MARKER"
fi
mkdir -p "$OUT"
rm -f "$OUT"/agl_rl-*.whl
# RUSTFLAGS replaces .cargo/config.toml's build.rustflags (target-cpu=native) for this build.
RUSTFLAGS="-C target-cpu=$CPU" CARGO_TARGET_DIR="$TARGET_DIR" \
    "$VENV/bin/maturin" build --release --strip --locked -m "$ROOT/crates/agl-py/Cargo.toml" --out "$OUT" >&2
ls "$OUT"/agl_rl-*.whl
