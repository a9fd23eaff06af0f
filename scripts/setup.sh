#!/usr/bin/env bash
# Installs every Debian package that building, testing and the demo need.
# Non-interactive and idempotent: packages already present are not touched.
set -euo pipefail

PKGS=(
  cmake ninja-build ccache g++ git python3
  llvm-22-dev libmlir-22-dev mlir-22-tools llvm-22-tools
  nlohmann-json3-dev libfmt-dev doctest-dev libdlpack-dev
  libopenmpi-dev openmpi-bin
  clang-22 libclang-rt-22-dev
  python3-venv
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

# Python for the tests, the binding (bindings/python) and the demo: a virtual
# environment with torch 2.x from the package index (not Debian's torch 1.13),
# numpy, safetensors, scikit-learn (the bundled digits data set), matplotlib,
# pytest and tqdm; transformers and accelerate (the binding's Trainer tests)
# and scikit-build-core (the wheel's build backend, for the wheel test). torch with its CUDA libraries is ~4 GB, so the environment
# lives outside the checkout, in ${FLASHOPT_VENV:-$HOME/.cache/flashopt/venv},
# shared by every clone on this machine (CI runs in a fresh clone); .venv in the
# checkout is a symlink to it. Only missing packages are installed.
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${FLASHOPT_VENV:-$HOME/.cache/flashopt/venv}"
if [[ ! -x "$VENV/bin/python" ]]; then
  echo "setup: creating the Python virtual environment $VENV"
  mkdir -p "$(dirname "$VENV")"
  /usr/bin/python3 -m venv "$VENV"
fi
# import name -> pip requirement
PY_REQS=(
  "numpy:numpy"
  "safetensors:safetensors>=0.4"
  "torch:torch>=2.1"
  "sklearn:scikit-learn"
  "matplotlib:matplotlib"
  "pytest:pytest"
  "tqdm:tqdm"
  "transformers:transformers>=4.40"
  "accelerate:accelerate>=1.1"
  "scikit_build_core:scikit-build-core>=0.10"
)
# One interpreter start checks them all (importing torch takes seconds).
mapfile -t py_missing < <("$VENV/bin/python" - "${PY_REQS[@]}" <<'PY'
import importlib, sys
for r in sys.argv[1:]:
    mod, req = r.split(":", 1)
    try:
        m = importlib.import_module(mod)
        if mod == "torch" and int(m.__version__.split(".")[0]) < 2:
            raise ImportError("torch 1.x")
    except Exception:
        print(req)
import platform
try:
    import torch, safetensors
    print(f"#python {platform.python_version()} torch {torch.__version__} "
          f"safetensors {safetensors.__version__}")
except Exception:
    pass
PY
)
py_versions=""
for i in "${!py_missing[@]}"; do
  if [[ ${py_missing[$i]} == "#"* ]]; then
    py_versions=${py_missing[$i]#\#}
    unset 'py_missing[i]'
  fi
done
if ((${#py_missing[@]})); then
  echo "setup: installing into $VENV: ${py_missing[*]}"
  case " ${py_missing[*]} " in
    *" torch>=2.1 "*) echo "setup: torch is large (~4 GB with its CUDA libraries); this takes a few minutes once";;
  esac
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "${py_missing[@]}"
else
  echo "setup: Python packages present in $VENV"
fi
# .venv in the checkout -> the shared environment (an old .venv directory made by
# an earlier setup.sh is replaced).
if [[ ! "$ROOT/.venv" -ef "$VENV" ]]; then
  if [[ -e "$ROOT/.venv" && ! -L "$ROOT/.venv" ]]; then
    echo "setup: replacing the old $ROOT/.venv directory by a link to $VENV"
    rm -rf "$ROOT/.venv"
  fi
  ln -sfn "$VENV" "$ROOT/.venv"
fi
if [[ -z $py_versions ]]; then
  py_versions=$("$ROOT/.venv/bin/python" -c 'import platform, torch, safetensors; print("python", platform.python_version(), "torch", torch.__version__, "safetensors", safetensors.__version__)')
fi
echo "setup: $py_versions in $ROOT/.venv -> $VENV"
