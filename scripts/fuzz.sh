#!/usr/bin/env bash
# Runs one libFuzzer target for SECONDS (default 60):
#   scripts/fuzz.sh manifest|spec|checkpoint|dialect SECONDS [libFuzzer flags...]
# Builds build-fuzz/ first (MLIR-free parts only, clang-22 with libFuzzer,
# ASan and UBSan: FLASHOPT_RUNTIME_ONLY=ON FLASHOPT_FUZZ=ON); the dialect
# target builds build-fuzz-mlir/ instead (a full configure, but only the
# dialect library and the target are compiled; libMLIR itself is Debian's,
# uninstrumented, so coverage guides through flashopt's parsers and
# verifiers, while ASan still sees every access from them). The checkpoint
# target loads the adamw_bf16_m24 bundle of a full build (build/kernels, or
# FLASHOPT_FUZZ_KERNELS). Seeds: fuzz/corpus/TARGET (read only); what the run
# adds goes to build-fuzz/fuzz-corpus/TARGET, crashes to
# build-fuzz/fuzz-artifacts/TARGET/ -- copy a crash into fuzz/corpus/TARGET
# as a regression (ctest fuzz/replay/TARGET then runs it) once it is fixed.
# SECONDS 0 only builds. ctest runs every target for 10 seconds (fuzz/run/*,
# building into the build tree first: fuzz/build/*), so regressions show.
# Needs: apt-get install clang-22 libclang-rt-22-dev (scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET="${1:?usage: scripts/fuzz.sh manifest|spec|checkpoint|dialect SECONDS [flags...]}"
SECONDS_TO_RUN="${2:-60}"
shift $(( $# >= 2 ? 2 : 1 ))
BUILD="${FLASHOPT_FUZZ_BUILD:-build-fuzz}"
KERNELS="${FLASHOPT_FUZZ_KERNELS:-$PWD/build/kernels}"
CXX_BIN="${FLASHOPT_FUZZ_CXX:-clang++-22}"
CC_BIN="${FLASHOPT_FUZZ_CC:-clang-22}"
case "$TARGET" in
  manifest|spec|checkpoint) ;;
  dialect) BUILD="${FLASHOPT_FUZZ_MLIR_BUILD:-build-fuzz-mlir}" ;;
  *) echo "fuzz.sh: unknown target '$TARGET' (manifest, spec, checkpoint, dialect)" >&2; exit 2 ;;
esac
command -v "$CXX_BIN" >/dev/null || {
  echo "fuzz.sh: $CXX_BIN not found (apt-get install clang-22 libclang-rt-22-dev)" >&2; exit 2; }
RUNTIME_ONLY=ON
[[ "$TARGET" == dialect ]] && RUNTIME_ONLY=OFF
if [[ ! -f "$BUILD/build.ninja" ]]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_COMPILER="$CC_BIN" -DCMAKE_CXX_COMPILER="$CXX_BIN" \
    -DFLASHOPT_RUNTIME_ONLY=$RUNTIME_ONLY -DFLASHOPT_FUZZ=ON -DFLASHOPT_BUILD_UNITTESTS=OFF \
    -DFLASHOPT_BUILD_BENCH=OFF -DFLASHOPT_BUILD_EXAMPLES=OFF \
    -DFLASHOPT_FUZZ_KERNELS="$KERNELS" >/dev/null
fi
if [[ "$SECONDS_TO_RUN" == 0 ]]; then
  # Build only (ctest's fuzz/build fixtures): every target of this build.
  if [[ "$TARGET" == dialect ]]; then
    TARGETS=(dialect-fuzzer)
  else
    TARGETS=(manifest-fuzzer spec-fuzzer checkpoint-fuzzer)
  fi
  exec cmake --build "$BUILD" -j "${FLASHOPT_JOBS:-2}" --target "${TARGETS[@]}"
fi
cmake --build "$BUILD" -j "${FLASHOPT_JOBS:-2}" --target "$TARGET-fuzzer"
if [[ "$TARGET" == checkpoint && ! -f "$KERNELS/adamw_bf16_m24/manifest.json" ]]; then
  echo "fuzz.sh: no $KERNELS/adamw_bf16_m24 (build the full tree first: scripts/build.sh)" >&2
  exit 2
fi
export FLASHOPT_FUZZ_BUNDLE="$KERNELS/adamw_bf16_m24"
WORK="$BUILD/fuzz-corpus/$TARGET"
ART="$BUILD/fuzz-artifacts/$TARGET"
mkdir -p "$WORK" "$ART"
DICT=()
[[ -f "fuzz/$TARGET.dict" ]] && DICT=(-dict="fuzz/$TARGET.dict")
if [[ "$TARGET" == dialect ]]; then
  # libMLIR is uninstrumented, but LLVM's BumpPtrAllocator is partly inline:
  # a slab that this instrumented target starts (an attribute's storage) is
  # poisoned past its first object, and libMLIR's own allocations from the
  # same slab (a location's storage) never unpoison it, so ASan reports a
  # false use-after-poison in libMLIR's memmove. Manual poisoning is ignored;
  # ASan's own checks (heap, stack, globals) stay.
  export ASAN_OPTIONS="allow_user_poisoning=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
fi
exec "$BUILD/fuzz/$TARGET-fuzzer" -max_total_time="$SECONDS_TO_RUN" \
  -print_final_stats=1 -timeout=10 -rss_limit_mb=4096 \
  -artifact_prefix="$ART/" "${DICT[@]}" "$@" "$WORK" "fuzz/corpus/$TARGET"
