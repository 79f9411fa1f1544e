#!/usr/bin/env bash
# Builds the agl-rl wheel into OUT_DIR: the Python module agl_rl (agl's kernel, flight recorder,
# reward shaping and seed API; PyO3, stable ABI from CPython 3.10) and, as the wheel's data, the
# `agl` command (installed into the environment's bin/, on PATH) with the vendored Spider data
# and its licence (installed into <env>/share/agl/spider, where that `agl` looks for it), so the
# README's main job runs from the wheel alone. The binary is built with AGL_PORTABLE_BUILD set:
# it never falls back to this source tree's data.
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
#   AGL_WHEEL_NO_CLI       1: leave the `agl` command and the data out (a module-only wheel, for
#                          quick iteration on agl-py; not what CI builds)
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
# maturin puts the contents of crates/agl-py/wheel-data (pyproject's `data`) into the wheel's
# .data directory: scripts/ goes to the environment's bin/, data/ to its root.
STAGE="$ROOT/crates/agl-py/wheel-data"
rm -rf "$STAGE"
mkdir -p "$STAGE"
if [ "${AGL_WHEEL_NO_CLI:-0}" != 1 ]; then
    RUSTFLAGS="-C target-cpu=$CPU" CARGO_TARGET_DIR="$TARGET_DIR" AGL_PORTABLE_BUILD=1 \
        cargo build --release --locked -p agl-cli >&2
    mkdir -p "$STAGE/scripts" "$STAGE/data/share/agl"
    strip -o "$STAGE/scripts/agl" "$TARGET_DIR/release/agl"
    cp -r "$ROOT/data/spider" "$STAGE/data/share/agl/spider"
fi
# RUSTFLAGS replaces .cargo/config.toml's build.rustflags (target-cpu=native) for this build.
RUSTFLAGS="-C target-cpu=$CPU" CARGO_TARGET_DIR="$TARGET_DIR" \
    "$VENV/bin/maturin" build --release --strip --locked -m "$ROOT/crates/agl-py/Cargo.toml" --out "$OUT" >&2
ls "$OUT"/agl_rl-*.whl
