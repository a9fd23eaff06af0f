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
# The build generates the kernels: flashopt-gen, then one bundle per spec in
# specs/ (target flashopt-kernels, Ninja running them in parallel; only what
# changed is regenerated). By hand: ./build/bin/flashopt-gen specs/NAME.json -o build/kernels
bash scripts/build.sh build
n=0
for spec in specs/*.json; do
  name=$(basename "$spec" .json)
  [[ -f "build/kernels/$name/manifest.json" ]] || {
    echo "run-demo: no bundle for $spec in build/kernels (the build should have made it)" >&2
    exit 1
  }
  n=$((n + 1))
done
echo "run-demo: $n kernel bundles in build/kernels, one per spec in specs/"
FLASHOPT_LIBRARY="$PWD/build/lib/libflashopt.so" FLASHOPT_KERNELS="$PWD/build/kernels" \
  .venv/bin/python examples/python/digits.py "$@"
