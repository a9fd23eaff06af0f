#!/usr/bin/env bash
# The main job: set up, build, generate the kernels for every spec in specs/,
# and train a small MLP on the CPU with FlashAdamW next to a plain fp32 AdamW.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh build
./build/bin/flashopt-gen specs/*.json -o build/kernels
./build/bin/flashopt-train-mlp --bundle build/kernels/adamw_bf16_m24 "$@"
