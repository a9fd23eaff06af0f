#!/usr/bin/env bash
# Where a GPU kernel's instructions go, read on a GPU machine with Nsight
# Compute: for each named bundle, one steady-state launch of its step (after
# two warm-up steps, so that the 8-bit states hold real codes) at 1e8
# parameters, profiled with the SourceCounters and InstructionStats sections;
# writes per-SASS-instruction execution counts (the source page, SASS view)
# and the per-opcode table, and prints the hottest instructions.
#
# Usage (on the GPU machine, from the repository root, after
# `bash scripts/device-check.sh --prepare` on the build machine and with
# build/kernels and build/device-deps carried):
#   bash scripts/device-profile.sh BUNDLE [BUNDLE...]
# Reuses build-device/ from scripts/device-check.sh, else builds
# flashopt-gpu-bench there. With OUT set, the reports come back as
# $OUT/profile.tgz. Environment: FLASHOPT_KERNELS, FLASHOPT_DEVICE_BUILD,
# FLASHOPT_PROFILE_PARAMS (1e8).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
KERNELS=${FLASHOPT_KERNELS:-$ROOT/build/kernels}
BUILD=${FLASHOPT_DEVICE_BUILD:-$ROOT/build-device}
DEPS=${FLASHOPT_DEVICE_DEPS:-$ROOT/build/device-deps}
N=${FLASHOPT_PROFILE_PARAMS:-1e8}
if (($# == 0)); then
  echo "usage: device-profile.sh BUNDLE [BUNDLE...]" >&2
  exit 2
fi
BENCH=$BUILD/bin/flashopt-gpu-bench
if [[ ! -x "$BENCH" ]]; then
  G=()
  command -v ninja >/dev/null && G=(-G Ninja)
  cmake -S . -B "$BUILD" "${G[@]}" -DCMAKE_BUILD_TYPE=Release -DFLASHOPT_RUNTIME_ONLY=ON \
    -DCMAKE_PREFIX_PATH="$DEPS" >"$BUILD.cmake.log" 2>&1 &&
    cmake --build "$BUILD" --target flashopt-gpu-bench -j "$(nproc)" >>"$BUILD.cmake.log" 2>&1 ||
    {
      tail -30 "$BUILD.cmake.log"
      exit 1
    }
fi
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[[ -n "$NCU" ]] || {
  echo "device-profile: ncu (Nsight Compute) not found" >&2
  exit 1
}
W=$(mktemp -d)
rc=0
for b in "$@"; do
  echo "== $b"
  "$NCU" --clock-control none --section SourceCounters --section InstructionStats \
    --kernel-name "$b" --launch-skip 2 --launch-count 1 -f -o "$W/$b" \
    "$BENCH" --kernels "$KERNELS" --bundle "$b" --sizes "$N" --no-small --iters 1 --warmup 2 \
    >"$W/$b.run.txt" 2>&1 || {
    echo "ncu failed on $b:"
    tail -5 "$W/$b.run.txt"
    rc=1
    continue
  }
  "$NCU" -i "$W/$b.ncu-rep" --page source --csv --print-source sass >"$W/$b.sass.csv" 2>"$W/$b.sass.err" ||
    "$NCU" -i "$W/$b.ncu-rep" --page source --csv >"$W/$b.sass.csv" 2>>"$W/$b.sass.err"
  "$NCU" -i "$W/$b.ncu-rep" --page details --csv --print-details all >"$W/$b.details.csv" 2>&1
  "$NCU" -i "$W/$b.ncu-rep" --page raw --csv >"$W/$b.raw.csv" 2>&1
  python3 - "$W/$b.sass.csv" "$N" <<'PY' || true
import csv, sys
path, n = sys.argv[1], float(sys.argv[2])
rows = list(csv.reader(l for l in open(path, errors="replace") if l.strip()))
hdr = next((i for i, r in enumerate(rows) if any("Instructions Executed" in c for c in r)), None)
if hdr is None:
    print("  (no 'Instructions Executed' column in the source page; see the CSV)")
    sys.exit(0)
h = rows[hdr]
ci = next(i for i, c in enumerate(h) if c.startswith("Instructions Executed"))
si = next((i for i, c in enumerate(h) if c in ("Source", "# Source")), 1)
recs = []
for r in rows[hdr + 1:]:
    try:
        recs.append((float(r[ci].replace(",", "")), r[si] if si < len(r) else "?"))
    except (ValueError, IndexError):
        pass
tot = sum(c for c, _ in recs)
print(f"  {len(recs)} SASS lines, {tot:.4g} warp-instructions executed = {tot * 32 / n:.1f} per element")
ops = {}
for c, s in recs:
    op = s.split()[0] if s.split() else "?"
    if op.startswith("@"):
        op = s.split()[1] if len(s.split()) > 1 else op
    ops[op] = ops.get(op, 0) + c
for op, c in sorted(ops.items(), key=lambda x: -x[1])[:12]:
    print(f"    {op:24s} {c * 32 / n:7.1f}/elt")
PY
done
if [[ -n "${OUT:-}" ]]; then
  tar czf "$OUT/profile.tgz" -C "$W" . && echo "reports: \$OUT/profile.tgz"
fi
exit $rc
