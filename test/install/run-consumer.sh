#!/usr/bin/env bash
# ctest install/consumer: the installed tree is usable on its own.
#   1. `cmake --install` of the build into a fresh prefix: public headers only,
#      libflashopt, flashopt-gen (runs from there: RUNPATH keeps the system
#      libMLIR/libLLVM directory; built-in rules compiled in), the CMake package;
#   2. examples/consumer, copied out of the source tree, configured against the
#      prefix (find_package(flashopt), flashopt_add_kernels: one bundle
#      embedded, one from a directory), built with Ninja and run;
#   3. its compile commands name no header directory of the source or build
#      tree, and editing a spec makes the next build regenerate the bundle.
# Usage: run-consumer.sh SOURCE_DIR BUILD_DIR WORK_DIR [CMAKE]
set -uo pipefail
SRC=$1 BUILD=$2 WORK=$3 CMAKE=${4:-cmake}
fail() { echo "FAIL: $*" >&2; exit 1; }
step() { echo "== $*"; }

rm -rf "$WORK"
mkdir -p "$WORK"
PREFIX="$WORK/prefix"

step "install $BUILD into $PREFIX"
"$CMAKE" --install "$BUILD" --prefix "$PREFIX" >"$WORK/install.log" 2>&1 ||
  { cat "$WORK/install.log"; fail "cmake --install failed"; }
for f in include/flashopt/flashopt.h include/flashopt/flashopt.hpp bin/flashopt-gen \
         lib/cmake/flashopt/flashoptConfig.cmake lib/cmake/flashopt/flashoptConfigVersion.cmake \
         lib/cmake/flashopt/flashoptTargets.cmake lib/cmake/flashopt/FlashoptAddKernels.cmake \
         lib/cmake/flashopt/flashopt-embed.cmake; do
  [[ -f "$PREFIX/$f" ]] || fail "not installed: $f"
done
ls "$PREFIX"/lib/libflashopt.so.* >/dev/null 2>&1 || fail "not installed: lib/libflashopt.so.*"
[[ -e "$PREFIX/lib/libflashopt.so" ]] || fail "not installed: lib/libflashopt.so"
[[ ! -e "$PREFIX/include/flashopt/host" ]] || fail "internal headers installed: include/flashopt/host"
echo "installed: $(cd "$PREFIX" && find . -type f -o -type l | sort | tr '\n' ' ')"

step "the installed flashopt-gen runs on its own"
readelf -d "$PREFIX/bin/flashopt-gen" | grep -E 'RUNPATH|RPATH'
(cd / && env -u LD_LIBRARY_PATH "$PREFIX/bin/flashopt-gen" --list-rules) >"$WORK/rules.txt" 2>&1 ||
  { cat "$WORK/rules.txt"; fail "the installed flashopt-gen does not run"; }
grep -q adamw "$WORK/rules.txt" || fail "the installed flashopt-gen lists no built-in adamw rule"
# The built-in rules are compiled in: nothing points back into the tree.
grep -aq -- "$SRC/" "$PREFIX/bin/flashopt-gen" && fail "the installed flashopt-gen names $SRC"
GEN_LDD=$(env -u LD_LIBRARY_PATH ldd "$PREFIX/bin/flashopt-gen")
grep -q 'not found' <<<"$GEN_LDD" &&
  fail "unresolved libraries: $(grep 'not found' <<<"$GEN_LDD")"

step "configure examples/consumer against $PREFIX"
cp -r "$SRC/examples/consumer" "$WORK/consumer"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
"$CMAKE" -S "$WORK/consumer" -B "$WORK/consumer-build" "${generator[@]}" \
  -DCMAKE_PREFIX_PATH="$PREFIX" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_EXPORT_COMPILE_COMMANDS=ON >"$WORK/configure.log" 2>&1 ||
  { cat "$WORK/configure.log"; fail "configuring the consumer failed"; }
grep -q "flashopt_DIR:PATH=$PREFIX/lib/cmake/flashopt" "$WORK/consumer-build/CMakeCache.txt" ||
  fail "find_package(flashopt) did not find the installed package: $(grep flashopt_DIR "$WORK/consumer-build/CMakeCache.txt")"

step "build the consumer"
"$CMAKE" --build "$WORK/consumer-build" >"$WORK/build.log" 2>&1 ||
  { cat "$WORK/build.log"; fail "building the consumer failed"; }
cat "$WORK/build.log"
# Every include directory is in the prefix or the consumer's own build tree.
incs=$(grep -o -- '-I[^ "]*\|-isystem [^ "]*' "$WORK/consumer-build/compile_commands.json" |
       sed 's/^-I//; s/^-isystem //' | sort -u)
echo "include directories: $(echo $incs)"
# MPI's own headers are the system's (the MPI example only).
mpi_incs=$(mpicc --showme:incdirs 2>/dev/null || true)
for d in $incs; do
  case "$d" in
  "$PREFIX"/* | "$WORK/consumer-build"/*) ;;
  *) grep -qxF -- "$d" <<<"$(tr ' ' '\n' <<<"$mpi_incs")" ||
       fail "the consumer compiled against $d, not the installed tree" ;;
  esac
done
grep -q -- "$PREFIX/include" "$WORK/consumer-build/compile_commands.json" ||
  fail "the consumer did not compile against $PREFIX/include"
[[ -f "$WORK/consumer-build/kernels/consumer_sgd/manifest.json" ]] ||
  fail "no bundle kernels/consumer_sgd (flashopt_add_kernels without EMBED)"
ls "$WORK"/consumer-build/flashopt-embed/flashopt-consumer/flashopt_bundle_consumer_adamw.c >/dev/null ||
  fail "no embedded bundle source for consumer_adamw"
# (ldd's output is captured first: `ldd | grep -q` under pipefail fails
# whenever grep exits before ldd has written everything.)
LDD_OUT=$(env -u LD_LIBRARY_PATH ldd "$WORK/consumer-build/flashopt-consumer")
grep libflashopt <<<"$LDD_OUT"
grep -q "libflashopt.so.* => $PREFIX/lib/" <<<"$LDD_OUT" ||
  fail "the consumer does not load libflashopt from $PREFIX/lib"

step "run the consumer (from another directory)"
(cd "$WORK" && env -u LD_LIBRARY_PATH "$WORK/consumer-build/flashopt-consumer") ||
  fail "flashopt-consumer failed"

if [[ -x "$WORK/consumer-build/flashopt-consumer-mpi" ]]; then
  step "run the MPI consumer on 2 ranks (flashopt::mpi)"
  root=(); [[ $(id -u) == 0 ]] && root=(--allow-run-as-root)
  (cd "$WORK" && env -u LD_LIBRARY_PATH OMPI_MCA_btl_vader_single_copy_mechanism=none \
    timeout 60 mpirun --oversubscribe "${root[@]}" -np 2 "$WORK/consumer-build/flashopt-consumer-mpi") ||
    fail "flashopt-consumer-mpi failed"
elif command -v mpicc >/dev/null; then
  fail "MPI is installed but the package has no flashopt::mpi"
fi

step "editing a spec regenerates its bundle"
touch "$WORK/consumer/consumer_sgd.json"
"$CMAKE" --build "$WORK/consumer-build" >"$WORK/rebuild.log" 2>&1 ||
  { cat "$WORK/rebuild.log"; fail "rebuilding the consumer failed"; }
grep -q "flashopt-gen consumer_sgd" "$WORK/rebuild.log" ||
  { cat "$WORK/rebuild.log"; fail "touching consumer_sgd.json did not re-run flashopt-gen"; }
grep -q "flashopt-gen consumer_adamw" "$WORK/rebuild.log" &&
  fail "touching consumer_sgd.json re-ran flashopt-gen for consumer_adamw"
echo "ok: installed tree, find_package(flashopt), flashopt_add_kernels (embedded and directory bundles), consumer ran"
