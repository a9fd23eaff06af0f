#!/usr/bin/env bash
# Performance experiments and profiles on a GPU machine (docs/BENCHMARKING.md).
# Nothing here decides pass or fail: that is scripts/device-check.sh, whose
# runtime-only build (build-device/) this script reuses (or, without it,
# builds flashopt-gpu-bench there).
#
# Usage:
#   bash scripts/device-profile.sh --prepare        # on the build machine, after
#       # `device-check.sh --prepare`: the static SASS counts and the kernel
#       # variants of the experiments, into build/device-deps
#   bash scripts/device-profile.sh --experiments    # on the GPU machine:
#     Adam at 4 lanes, 1e9    AdamW-24 (exact, fast) at 4 elements per thread and
#                             64 registers, against the shipped 8 lanes at
#                             .maxnreg 104 (gpu-bench-narrow.md)
#     SGD/Lion at 16 lanes    SGD-24 and Lion-24 (exact, fast) at 16 elements per
#                             thread and 96 registers, against the shipped 8 lanes
#                             at 64 (gpu-bench-wide16.md)
#     ncu dynamic counts      Nsight Compute (if present): warp-instructions, DRAM
#                             bytes and SM clock of one steady-state launch of the
#                             key bundles (ncu.csv)
#     model vs measured       scripts/sass-cost.py --measured: the static model's
#                             prediction next to each bundle's time at 1e9
#                             (model-vs-measured.md; the times of device-check's
#                             gpu-bench-all.md when it ran, else measured here)
#   bash scripts/device-profile.sh BUNDLE [BUNDLE...]
#       # where a kernel's instructions go: one steady-state launch of each
#       # bundle's step at 1e8 parameters, profiled with the SourceCounters and
#       # InstructionStats sections; writes per-SASS-instruction execution
#       # counts (the source page, SASS view) and the per-opcode table, and
#       # prints the hottest opcodes
#
# On the GPU machine carry build/kernels and build/device-deps. Logs go to
# build-device/device-profile-logs; with OUT set, the tables and a tarball of
# the logs (or the profiles) come back there. Environment: FLASHOPT_KERNELS,
# FLASHOPT_DEVICE_DEPS, FLASHOPT_DEVICE_BUILD, FLASHOPT_PROFILE_PARAMS (1e8),
# FLASHOPT_NCU_BUNDLES (the bundles ncu counts), FLASHOPT_GEN (flashopt-gen
# for --prepare).
#
# Exit status: 0 when every step ran, 77 without a usable GPU, 1 otherwise
# (an experiment that fails is reported here and nowhere else).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
KERNELS=${FLASHOPT_KERNELS:-$ROOT/build/kernels}
BUILD=${FLASHOPT_DEVICE_BUILD:-$ROOT/build-device}
DEPS=${FLASHOPT_DEVICE_DEPS:-$ROOT/build/device-deps}
N=${FLASHOPT_PROFILE_PARAMS:-1e8}
[[ "$BUILD" == /* ]] || BUILD="$ROOT/$BUILD"
[[ "$KERNELS" == /* ]] || KERNELS="$ROOT/$KERNELS"
[[ "$DEPS" == /* ]] || DEPS="$ROOT/$DEPS"
if (($# == 0)); then
  echo "usage: device-profile.sh --prepare | --experiments | BUNDLE [BUNDLE...]" >&2
  exit 2
fi
count_bundles() { ls "$1"/*/manifest.json 2>/dev/null | wc -l; }

# ---- --prepare (on the build machine) -----------------------------------------
if [[ "$1" == "--prepare" ]]; then
  if [[ "$(count_bundles "$KERNELS")" -eq 0 ]]; then
    echo "device-profile --prepare: no bundles in $KERNELS; build them first" >&2
    exit 1
  fi
  mkdir -p "$DEPS"
  ok=1
  # The static counts, for the model-vs-measured table on the GPU machine.
  if python3 scripts/sass-cost.py --kernels "$KERNELS" --arch sm_90 --json "$DEPS/sass-cost.json" >/dev/null; then
    echo "device-profile --prepare: static SASS counts in $DEPS/sass-cost.json"
  else
    echo "device-profile --prepare: scripts/sass-cost.py failed (nvdisasm?); no model-vs-measured table" >&2
    ok=0
  fi
  GEN=${FLASHOPT_GEN:-$ROOT/build/bin/flashopt-gen}
  if [[ ! -x "$GEN" ]]; then
    echo "device-profile --prepare: no $GEN; no kernel variants to compare" >&2
    exit 1
  fi
  # The Adam family at 4 elements per thread and 64 registers (the shape
  # before 8 lanes at .maxnreg 104), so that the device times both shapes.
  rm -rf "$DEPS/kernels-narrow"
  mkdir -p "$DEPS/kernels-narrow"
  for s in adamw_bf16_m24 adamw_bf16_m24_fast; do
    "$GEN" "specs/$s.json" --target=sm_80,sm_90,sm_100 --gpu-bytes-per-thread=8 \
      -o "$DEPS/kernels-narrow" >/dev/null || {
      echo "device-profile --prepare: the 4-lane $s did not build" >&2
      ok=0
    }
  done
  echo "device-profile --prepare: 4-lane Adam bundles in $DEPS/kernels-narrow"
  # SGD and Lion at 16 lanes and 96 registers, against the shipped 8 lanes at 64.
  rm -rf "$DEPS/kernels-wide16"
  mkdir -p "$DEPS/kernels-wide16"
  for s in sgd_bf16_m24 sgd_bf16_m24_fast lion_bf16_m24 lion_bf16_m24_fast; do
    "$GEN" "specs/$s.json" --target=sm_80,sm_90,sm_100 --gpu-bytes-per-thread=32 \
      --gpu-max-registers=96 -o "$DEPS/kernels-wide16" >/dev/null || {
      echo "device-profile --prepare: the 16-lane $s did not build" >&2
      ok=0
    }
  done
  echo "device-profile --prepare: 16-lane SGD/Lion bundles in $DEPS/kernels-wide16"
  echo "On the GPU machine (carry $KERNELS and $DEPS): bash scripts/device-profile.sh --experiments"
  ((ok == 1)) && exit 0 || exit 1
fi

# ---- on the GPU machine ---------------------------------------------------------
BENCH=$BUILD/bin/flashopt-gpu-bench
if [[ ! -x "$BENCH" ]]; then
  mkdir -p "$BUILD"
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

# ---- --experiments --------------------------------------------------------------
if [[ "$1" == "--experiments" ]]; then
  LOGS=$BUILD/device-profile-logs
  rm -rf "$LOGS"
  mkdir -p "$LOGS"
  ROWS=()
  FAILED=0
  # step NAME LOGFILE CMD...: runs CMD, its output into LOGFILE and on screen.
  step() {
    local name=$1 log=$2
    shift 2
    echo "== $name: $*"
    local t0=$SECONDS
    "$@" 2>&1 | tee "$log"
    RC=${PIPESTATUS[0]}
    STEP_TIME=$((SECONDS - t0))
    if ((RC == 77)); then
      grep -q '^no NVIDIA GPU/driver:' "$log" || echo "no NVIDIA GPU/driver: $1 exited 77"
      exit 77
    fi
    local st=ok
    if ((RC != 0)); then
      st="FAILED (rc $RC)"
      FAILED=1
    fi
    ROWS+=("| $name | $st | ${STEP_TIME}s | $(basename "$log") |")
  }
  skip() { ROWS+=("| $1 | skipped | 0s | $2 |"); }

  if [[ "$(count_bundles "$DEPS/kernels-narrow")" -gt 0 ]]; then
    step "Adam at 4 lanes, 1e9" "$LOGS/gpu-bench-narrow.md" \
      "$BENCH" --kernels "$DEPS/kernels-narrow" \
      --bundle adamw_bf16_m24,adamw_bf16_m24_fast --sizes 1e9 --no-small --iters 10 --warmup 2
  else
    skip "Adam at 4 lanes, 1e9" "no $DEPS/kernels-narrow (run --prepare)"
  fi
  if [[ "$(count_bundles "$DEPS/kernels-wide16")" -gt 0 ]]; then
    step "SGD/Lion at 16 lanes, 1e9" "$LOGS/gpu-bench-wide16.md" \
      "$BENCH" --kernels "$DEPS/kernels-wide16" \
      --bundle sgd_bf16_m24,sgd_bf16_m24_fast,lion_bf16_m24,lion_bf16_m24_fast \
      --sizes 1e9 --no-small --iters 10 --warmup 2
  else
    skip "SGD/Lion at 16 lanes, 1e9" "no $DEPS/kernels-wide16 (run --prepare)"
  fi
  # The shipped kernels at 8 lanes, for the two lines above and the model:
  # device-check's table when it ran, else timed here.
  MEASURED=$BUILD/device-check-logs/gpu-bench-all.md
  if [[ ! -f "$MEASURED" ]]; then
    MEASURED=$LOGS/gpu-bench-all.md
    step "gpu-bench all 1e9" "$MEASURED" \
      "$BENCH" --kernels "$KERNELS" --bundle all --sizes 1e9 --no-small --iters 10 --warmup 2
  fi
  # Dynamic counts of the key bundles (one steady-state launch each at 1e8:
  # the third step, after two that fill the 8-bit states with real codes; the
  # first step, on all-zero states, runs the slow path of every division of a
  # zero code and is not representative).
  NCU_BUNDLES=${FLASHOPT_NCU_BUNDLES:-adamw_bf16_m24,adamw_bf16_m24_fast,sgd_bf16_m24,sgd_bf16_m24_fast,lion_bf16_m24,lion_bf16_m24_fast,adamw_f32,adamw_bf16,adamw_f32_f32states}
  if [[ -n "$NCU" ]]; then
    step "ncu dynamic counts" "$LOGS/ncu-run.txt" \
      "$NCU" --clock-control none --csv --print-units base --log-file "$LOGS/ncu.csv" \
      --metrics smsp__inst_executed.sum,smsp__thread_inst_executed.sum,dram__bytes.sum,gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,smsp__issue_active.avg.pct_of_peak_sustained_active \
      --kernel-name "regex:^(${NCU_BUNDLES//,/|})\$" \
      "$BENCH" --kernels "$KERNELS" --bundle "$NCU_BUNDLES" \
      --sizes 1e8 --no-small --iters 1 --warmup 2
  else
    skip "ncu dynamic counts" "ncu not found"
  fi
  if [[ -f "$DEPS/sass-cost.json" ]] && command -v python3 >/dev/null 2>&1; then
    step "model vs measured" "$LOGS/model-vs-measured.md" \
      python3 scripts/sass-cost.py --counts "$DEPS/sass-cost.json" --measured "$MEASURED" \
      --ncu "$LOGS/ncu.csv" --ncu-params 1e8 --markdown
  else
    skip "model vs measured" "no $DEPS/sass-cost.json (run --prepare) or no python3"
  fi
  {
    echo
    echo "## flashopt device experiments"
    echo
    echo "| step | status | time | detail |"
    echo "|---|---|---:|---|"
    printf '%s\n' "${ROWS[@]}"
  } | tee "$LOGS/summary.md"
  if [[ -n "${OUT:-}" ]]; then
    mkdir -p "$OUT"
    for f in summary.md gpu-bench-narrow.md gpu-bench-wide16.md gpu-bench-all.md model-vs-measured.md; do
      [[ -f "$LOGS/$f" ]] && cp "$LOGS/$f" "$OUT/"
    done
    tar czf "$OUT/device-profile-logs.tgz" -C "$LOGS" . && echo "logs also in \$OUT: device-profile-logs.tgz"
  fi
  exit $FAILED
fi

# ---- BUNDLE [BUNDLE...]: per-instruction counts ---------------------------------
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
