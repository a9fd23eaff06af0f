#!/usr/bin/env bash
# ctest: the GPU-independent part of scripts/device-check.sh.
#   1. every shipped bundle carries PTX for sm_80/sm_90/sm_100 whose widest
#      vector access matches the manifest's elements_per_thread and, when
#      ptxas is installed, a cubin per chip with 0 spills and registers
#      within the PTX's .maxnreg (64, or 104 for 8-lane Adam kernels);
#   2. device-check.sh, the pass/fail check, runs no performance experiment
#      (those are scripts/device-profile.sh, and cannot fail the check);
#   3. `device-check.sh --prepare` gathers the build dependencies, and
#      `device-profile.sh --prepare` (given FLASHOPT_GEN) the experiments' kernel
#      variants and static counts beside them, which a second
#      `device-check.sh --prepare` keeps;
#   4. `device-check.sh` builds the MLIR-free runtime (-DFLASHOPT_RUNTIME_ONLY)
#      from scratch, runs the runtime unit tests, and then either checks the GPU
#      (exit 0, on a machine with one) or stops with exit 77 and a message
#      naming the missing driver (here); `device-profile.sh --experiments` then
#      stops the same way.
# Usage: run-without-gpu.sh SOURCE_DIR KERNELS_DIR WORK_DIR [FLASHOPT_GEN]
set -uo pipefail
SRC=$1 KERNELS=$2 WORK=$3 GEN=${4:-}
fail() { echo "FAIL: $*" >&2; exit 1; }

# One Python process for every spec (a process per spec took ~50 s).
n=$(python3 - "$KERNELS" "$SRC"/specs/*.json <<'PY'
import json, os, re, shutil, sys
kernels, specs = sys.argv[1], sys.argv[2:]
SIZES = {"f32": 4, "bf16": 2, "f16": 2, "i8": 1, "ui8": 1, "u8": 1, "i16": 2, "u16": 2, "ui16": 2,
         "i4": 0.5, "ui4": 0.5}  # packed 4-bit codes: half a byte
has_ptxas = bool(shutil.which("ptxas")) or os.path.exists("/usr/local/cuda/bin/ptxas")
for spec in specs:
    name = json.load(open(spec))["name"]
    path = os.path.join(kernels, name, "manifest.json")
    if not os.path.isfile(path):
        sys.exit(f"FAIL: no bundle for {spec} in {kernels}")
    d = os.path.dirname(path)
    m = json.load(open(path))
    chips = {k["target"]: k for k in m["kernels"] if k["target"].startswith("sm_")}
    missing = {"sm_80", "sm_90", "sm_100"} - set(chips)
    assert not missing, f"{path}: no GPU kernel for {sorted(missing)}"
    widest = max(SIZES[b["dtype"]] for b in m["buffers"] if b["per"] == "element")
    for chip, k in chips.items():
        assert os.path.isfile(os.path.join(d, k["file"])), f"{path}: {chip}: PTX {k['file']} missing"
        # The manifest's elements per thread is what the PTX handles: the widest
        # per-element stream moves W x its size per vector access.
        ptx = open(os.path.join(d, k["file"])).read()
        vec = max((int(n) * int(b) // 8 for n, b in re.findall(r"ld\.global\.v(\d)\.b(\d+)", ptx)), default=0)
        assert vec == k["elements_per_thread"] * widest, \
            f"{path}: {chip}: the manifest says {k['elements_per_thread']} elements per thread, " \
            f"but the PTX's widest access is {vec} bytes for {widest}-byte elements"
        if has_ptxas:
            assert k.get("cubin") and os.path.isfile(os.path.join(d, k["cubin"])), f"{path}: {chip}: no cubin"
            assert k["spill_stores"] == 0 and k["spill_loads"] == 0, f"{path}: {chip}: spills"
            # Within the PTX's cap: 64, or 104 for the kernels flashopt-to-gpu
            # gave 8 elements per thread over its 64-register budget.
            cap = int(re.search(r"\.maxnreg (\d+)", ptx).group(1))
            assert cap in (64, 104), f"{path}: {chip}: .maxnreg {cap}"
            assert 0 < k["registers"] <= cap, f"{path}: {chip}: {k['registers']} registers over .maxnreg {cap}"
print(len(specs))
PY
) || fail "bad GPU entries (above)"
((n >= 26)) || fail "expected the bundles of every shipped spec in $KERNELS, found $n"
# (examples/custom-rules bundles are CPU-only; they are not checked here.)
echo "ok: $n bundles with PTX (and cubins) for sm_80, sm_90, sm_100"

# The check runs no experiment: other lane widths and register caps, Nsight
# Compute's counts and the model calibration are device-profile.sh's.
if grep -nE 'kernels-narrow|kernels-wide16|gpu-max-registers|gpu-bytes-per-thread|(^|[^a-z])ncu([^a-z]|$)|sass-cost' \
  "$SRC/scripts/device-check.sh"; then
  fail "scripts/device-check.sh runs an experiment (above); it belongs in scripts/device-profile.sh"
fi
grep -q -- '--experiments' "$SRC/scripts/device-profile.sh" ||
  fail "scripts/device-profile.sh has no --experiments"

HAS_PTXAS=0
{ command -v ptxas >/dev/null || [[ -x /usr/local/cuda/bin/ptxas ]]; } && HAS_PTXAS=1
rm -rf "$WORK"
mkdir -p "$WORK"
FLASHOPT_DEVICE_DEPS="$WORK/deps" FLASHOPT_KERNELS="$KERNELS" \
  bash "$SRC/scripts/device-check.sh" --prepare || fail "--prepare failed"
if [[ -n "$GEN" ]]; then
  FLASHOPT_DEVICE_DEPS="$WORK/deps" FLASHOPT_KERNELS="$KERNELS" FLASHOPT_GEN="$GEN" \
    bash "$SRC/scripts/device-profile.sh" --prepare
  prc=$?
  # device-check --prepare renews only its own folders.
  FLASHOPT_DEVICE_DEPS="$WORK/deps" FLASHOPT_KERNELS="$KERNELS" \
    bash "$SRC/scripts/device-check.sh" --prepare >/dev/null || fail "a second --prepare failed"
  nn=$(ls "$WORK"/deps/kernels-narrow/*/manifest.json 2>/dev/null | wc -l)
  nw=$(ls "$WORK"/deps/kernels-wide16/*/manifest.json 2>/dev/null | wc -l)
  ((nn == 2)) || fail "device-profile.sh --prepare: $nn 4-lane Adam bundles, expected 2"
  ((nw == 4)) || fail "device-profile.sh --prepare: $nw 16-lane SGD/Lion bundles, expected 4"
  if ((HAS_PTXAS)); then
    ((prc == 0)) || fail "device-profile.sh --prepare exited $prc"
    python3 - "$WORK/deps/sass-cost.json" <<'PY' || fail "no static counts from device-profile.sh --prepare"
import json, sys
rows = json.load(open(sys.argv[1]))
assert rows and all(r["arch"] == "sm_90" and r["insns_per_elt"] > 0 for r in rows), rows[:1]
PY
  fi
  echo "ok: device-profile.sh --prepare built the experiments' variants ($nn + $nw bundles)"
fi

# (On a 2-core machine running the rest of the suite beside it, the
# from-scratch runtime build can take minutes: a generous build limit.)
FLASHOPT_DEVICE_DEPS="$WORK/deps" FLASHOPT_KERNELS="$KERNELS" \
  FLASHOPT_DEVICE_BUILD="$WORK/build" OUT="$WORK/logs" FLASHOPT_DEVICE_BUILD_LIMIT=700 \
  FLASHOPT_DEVICE_CHECK_BUDGET=850 \
  bash "$SRC/scripts/device-check.sh" >"$WORK/out.txt" 2>&1
rc=$?
cat "$WORK/out.txt"
S="$WORK/logs/summary.md"
[[ -f "$S" ]] || fail "no summary table"
grep -q '^| build | ok |' "$S" || fail "the runtime-only build did not succeed"
# The GPU run's NCCL smoke test needs its program: built whenever nccl.h is.
if grep -q '^device-check: nccl.h in /' "$WORK/out.txt"; then
  [[ -x "$WORK/build/unittests/NcclTests" ]] ||
    fail "nccl.h was found but the NCCL smoke test (unittests/NcclTests) was not built"
fi
grep -q '^| CudaTests (unit) | ok |' "$S" || fail "the CUDA runtime unit tests did not pass"
grep -q '^| RuntimeTests (unit) | ok |' "$S" || fail "the host runtime unit tests did not pass"
case $rc in
0) echo "ok: a GPU is present and every GPU check passed" ;;
77)
  grep -q '^no NVIDIA GPU/driver: .*libcuda.so.1' "$WORK/out.txt" ||
    fail "exit 77 without the 'no NVIDIA GPU/driver' message"
  echo "ok: no GPU here; the script stops with 77 and says why (the GPU part needs a device)"
  if [[ -n "$GEN" ]]; then
    FLASHOPT_DEVICE_DEPS="$WORK/deps" FLASHOPT_KERNELS="$KERNELS" \
      FLASHOPT_DEVICE_BUILD="$WORK/build" bash "$SRC/scripts/device-profile.sh" --experiments \
      >"$WORK/profile.txt" 2>&1
    prc=$?
    cat "$WORK/profile.txt"
    ((prc == 77)) || fail "device-profile.sh --experiments exited $prc without a GPU (expected 77)"
    grep -q '^no NVIDIA GPU/driver: ' "$WORK/profile.txt" ||
      fail "device-profile.sh --experiments: exit 77 without the 'no NVIDIA GPU/driver' message"
    echo "ok: device-profile.sh --experiments stops with 77 and says why"
  fi ;;
*) fail "device-check.sh exited $rc" ;;
esac
