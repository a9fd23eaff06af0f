#!/usr/bin/env python3
"""Interoperability of flashopt's safetensors code with Python's `safetensors`.

Driven by the doctest case "python interop" of unittests/Runtime/SafetensorsTest.cpp
(ctest: SafetensorsTests.python_interop):

  safetensors_interop.py check FILE   FILE was written by flashopt::host::safetensors::write_file;
                                      load it with safetensors.torch.load_file and safe_open and
                                      compare names, dtypes, shapes, values and metadata with
                                      expected_tensors() / CPP_METADATA.
  safetensors_interop.py write FILE   write expected_tensors() and PY_METADATA with
                                      safetensors.torch.save_file, for File::read to check.

Both sides build the same tensors (keep expected_tensors() in sync with interopTensors() in
SafetensorsTest.cpp). Exit status 0 on success, 1 with a message otherwise.
"""

import sys

try:
    import torch
    import safetensors
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file
except ImportError as e:  # pragma: no cover - environment problem
    print(f"safetensors_interop.py: cannot import torch/safetensors ({e}); "
          "run scripts/setup.sh to create .venv", file=sys.stderr)
    sys.exit(1)

CPP_METADATA = {"format": "flashopt-interop", "step": "42", "unicode": "\u03b8'\u2248\u03c1"}
PY_METADATA = {"writer": "python", "step": "7", "empty": ""}


def expected_tensors():
    return {
        "bf16": torch.tensor([[-1.875, -1.125, -0.375], [0.375, 1.125, 1.875]],
                             dtype=torch.bfloat16),
        "f16": torch.tensor([-2.5, -0.5, 0.0, 0.25, 65504.0], dtype=torch.float16),
        "f32": torch.tensor([[1.5, -2.25], [1024.125, -0.0078125]], dtype=torch.float32),
        "i8": torch.tensor([-128, -1, 0, 127], dtype=torch.int8),
        "u8": torch.tensor([[0, 1], [128, 255]], dtype=torch.uint8),
        "i16": torch.tensor([-32768, -1, 0, 32767, 12345], dtype=torch.int16),
        "nested.name/with.dots": torch.tensor(7.0, dtype=torch.float32),  # shape []
        "empty": torch.zeros((0, 4), dtype=torch.float32),
    }


def fail(msg):
    print(f"safetensors_interop.py: {msg}", file=sys.stderr)
    sys.exit(1)


def check(path):
    want = expected_tensors()
    got = load_file(path)
    if set(got) != set(want):
        fail(f"{path}: tensor names {sorted(got)} != expected {sorted(want)}")
    for name, w in want.items():
        g = got[name]
        if g.dtype != w.dtype:
            fail(f"{path}: tensor {name!r}: dtype {g.dtype} != expected {w.dtype}")
        if tuple(g.shape) != tuple(w.shape):
            fail(f"{path}: tensor {name!r}: shape {tuple(g.shape)} != expected {tuple(w.shape)}")
        if not torch.equal(g, w):
            fail(f"{path}: tensor {name!r}: values {g.tolist()} != expected {w.tolist()}")
    with safe_open(path, framework="pt") as f:
        meta = f.metadata()
        if meta != CPP_METADATA:
            fail(f"{path}: metadata {meta!r} != expected {CPP_METADATA!r}")
        if set(f.keys()) != set(want):
            fail(f"{path}: safe_open keys {sorted(f.keys())} != expected {sorted(want)}")
        # One tensor through the lazy path too.
        if not torch.equal(f.get_tensor("i16"), want["i16"]):
            fail(f"{path}: safe_open get_tensor('i16') differs")
    print(f"safetensors_interop.py: {path}: {len(want)} tensors and metadata OK "
          f"(safetensors {safetensors.__version__}, torch {torch.__version__})")


def write(path):
    save_file(expected_tensors(), path, metadata=PY_METADATA)
    print(f"safetensors_interop.py: wrote {path}")


def main(argv):
    if len(argv) != 3 or argv[1] not in ("check", "write"):
        fail("usage: safetensors_interop.py check|write FILE")
    (check if argv[1] == "check" else write)(argv[2])


if __name__ == "__main__":
    main(sys.argv)
