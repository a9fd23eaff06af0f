#!/usr/bin/env bash
# Configures and builds flashopt (Ninja, Release, shared libMLIR/libLLVM).
# Usage: scripts/build.sh [build-dir]   (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${1:-build}"
JOBS="${FLASHOPT_JOBS:-$(nproc)}"
if [[ ! -f "$BUILD_DIR/build.ninja" ]]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release
fi
cmake --build "$BUILD_DIR" -j "$JOBS"
