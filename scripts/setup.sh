#!/usr/bin/env bash
# Installs every Debian package that building, testing and the demo need.
# Non-interactive and idempotent: packages already present are not touched.
set -euo pipefail

PKGS=(
  cmake ninja-build ccache g++ git python3
  llvm-22-dev libmlir-22-dev mlir-22-tools llvm-22-tools
  nlohmann-json3-dev libfmt-dev doctest-dev libdlpack-dev
  libopenmpi-dev openmpi-bin
  python3-torch python3-numpy
)

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all packages present"
fi

# The CUDA toolkit (ptxas) is optional: tests that need it are reported unsupported without it.
if [[ -x "${CUDA_HOME:-/usr/local/cuda}/bin/ptxas" ]]; then
  echo "setup: ptxas found in ${CUDA_HOME:-/usr/local/cuda}/bin"
else
  echo "setup: no CUDA toolkit found; ptxas tests will be skipped"
fi

# Python for the tests: Debian's python3 (with python3-torch and numpy) plus
# the `safetensors` package, which Debian 12 does not ship, in a virtual
# environment that sees the system packages: .venv/ (git-ignored).
VENV="$(cd "$(dirname "$0")/.." && pwd)/.venv"
if ! "$VENV/bin/python" -c 'import safetensors, numpy' 2>/dev/null; then
  if ! /usr/bin/python3 -m venv --help >/dev/null 2>&1; then
    SUDO=""; if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; fi
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-venv
  fi
  /usr/bin/python3 -m venv --system-site-packages "$VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check 'safetensors>=0.4'
fi
echo "setup: python with safetensors in $VENV ($("$VENV/bin/python" -c 'import safetensors; print(safetensors.__version__)'))"
