#!/usr/bin/env bash
# Checks that the rooms listed in scripts/clang-format-clean.txt stay as
# clang-format 14 formats them with the repository's .clang-format (LLVM
# style): every .cpp and .h below each listed path. A room joins the list
# once it is clean (clang-format -i, then keep the one-line file banners at
# 80 columns). Other clang-format versions wrap differently, so with one the
# check is skipped (exit 77, which ctest reports as skipped).
# Usage: scripts/check-format.sh [clang-format]
set -euo pipefail
cd "$(dirname "$0")/.."
CLANG_FORMAT="${1:-clang-format}"
version=$({ "$CLANG_FORMAT" --version 2>/dev/null || true; } |
  sed -n 's/.*version \([0-9]*\)\..*/\1/p')
if [[ "$version" != 14 ]]; then
  echo "check-format: skipped: $CLANG_FORMAT is version '${version:-?}', not 14"
  exit 77
fi
files=()
while read -r path; do
  [[ -z "$path" || "$path" == \#* ]] && continue
  if [[ -d "$path" ]]; then
    while IFS= read -r f; do files+=("$f"); done < <(
      find "$path" -type f \( -name '*.cpp' -o -name '*.h' \) | sort)
  else
    files+=("$path")
  fi
done < scripts/clang-format-clean.txt
if ! "$CLANG_FORMAT" --dry-run --Werror "${files[@]}"; then
  echo "check-format: run $CLANG_FORMAT -i on the files above"
  exit 1
fi
echo "check-format: ${#files[@]} files clean"
