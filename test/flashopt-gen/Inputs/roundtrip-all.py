#!/usr/bin/env python3
"""For every spec: flashopt-gen --emit=mlir | flashopt-opt | flashopt-opt
gives identical text twice, and mentions the spec's name."""
import glob
import os
import subprocess
import sys

bindir, specs = sys.argv[1], sys.argv[2]
gen = os.path.join(bindir, "flashopt-gen")
opt = os.path.join(bindir, "flashopt-opt")
bad = 0
paths = sorted(glob.glob(os.path.join(specs, "*.json")))
for spec in paths:
    name = os.path.splitext(os.path.basename(spec))[0]
    mlir = subprocess.run([gen, spec, "--emit=mlir"], capture_output=True, text=True)
    if mlir.returncode != 0 or f"@{name} " not in mlir.stdout:
        print("FAIL emit", name, mlir.stderr)
        bad += 1
        continue
    once = subprocess.run([opt], input=mlir.stdout, capture_output=True, text=True)
    twice = subprocess.run([opt], input=once.stdout, capture_output=True, text=True)
    if once.returncode or twice.returncode or once.stdout != twice.stdout:
        print("FAIL roundtrip", name, once.stderr, twice.stderr)
        bad += 1
print(f"{len(paths)} specs, {bad} failures")
sys.exit(1 if bad or not paths else 0)
