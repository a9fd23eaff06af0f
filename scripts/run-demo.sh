#!/usr/bin/env bash
# The main job: set up, build, generate the kernels for every spec in specs/,
# then train a small CNN on scikit-learn's digits with FlashAdamW (bf16, 24-bit
# master weights, 8-bit states) next to torch.optim.AdamW (fp32) from the same
# initialization: a table, and a PNG (loss curves, memory per parameter) at the
# path it prints. Extra arguments go to examples/python/digits.py (--steps,
# --lr, --out, --threads). The C++ API example is build/bin/flashopt-train-mlp.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh build
./build/bin/flashopt-gen specs/*.json -o build/kernels
FLASHOPT_LIBRARY="$PWD/build/lib/libflashopt.so" FLASHOPT_KERNELS="$PWD/build/kernels" \
  .venv/bin/python examples/python/digits.py "$@"
