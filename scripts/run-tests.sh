#!/usr/bin/env bash
# The whole test suite: set up, build, then ctest (lit tests, unit tests,
# numerics conformance, tool tests). ctest's closing line counts every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh build
cd build
ctest --output-on-failure -j "${FLASHOPT_JOBS:-$(nproc)}" "$@"
