#!/usr/bin/env python3
"""Checks every bundle generated from specs/: one PTX + cubin per chip the
spec lists, 0 spill stores/loads, registers within the PTX's .maxnreg (64,
or 104 for the kernels flashopt-to-gpu gives 8 lanes over its 64-register
budget), 256 threads per block, and a manifest ABI whose arguments match the
PTX entry's."""
import glob
import json
import os
import re
import sys

kernels, specs = sys.argv[1], sys.argv[2]
failures = []
count = 0
for spec_path in sorted(glob.glob(os.path.join(specs, "*.json"))):
    spec = json.load(open(spec_path))
    name = spec["name"]
    manifest = json.load(open(os.path.join(kernels, name, "manifest.json")))
    chips = [t for t in spec.get("targets", ["cpu"]) if t != "cpu"]
    entries = {k["target"]: k for k in manifest["kernels"] if k["target"] != "cpu"}
    for chip in chips:
        k = entries.get(chip)
        if k is None:
            failures.append(f"{name}: no {chip} kernel")
            continue
        count += 1
        ptx = open(os.path.join(kernels, name, k["file"])).read()
        cap = re.search(r"\.maxnreg (\d+)", ptx)
        cap = int(cap.group(1)) if cap else None
        if cap not in (64, 104):
            failures.append(f"{name} {chip}: .maxnreg {cap}")
        elif k.get("registers", -1) < 0 or k["registers"] > cap:
            failures.append(f"{name} {chip}: {k.get('registers')} registers over .maxnreg {cap}")
        if k.get("spill_stores") != 0 or k.get("spill_loads") != 0:
            failures.append(f"{name} {chip}: spills {k.get('spill_stores')}/{k.get('spill_loads')}")
        if k.get("threads_per_block") != 256:
            failures.append(f"{name} {chip}: threads_per_block {k.get('threads_per_block')}")
        cubin = os.path.join(kernels, name, k.get("cubin", "missing"))
        if not os.path.isfile(cubin) or os.path.getsize(cubin) == 0:
            failures.append(f"{name} {chip}: no cubin")
        ptx = open(os.path.join(kernels, name, k["file"])).read()
        m = re.search(r"\.entry\s+(\w+)\(([^)]*)\)", ptx)
        if not m or m.group(1) != k["symbol"]:
            failures.append(f"{name} {chip}: entry {m.group(1) if m else None} != symbol {k['symbol']}")
            continue
        params = re.findall(r"\.param\s+\.(\w+)\s+\w+", m.group(2))
        # The manifest ABI: six 64-bit arguments.
        abi_args = manifest["abi"].split("(", 1)[1].rstrip(")").split(",")
        if params != ["u64"] * len(abi_args) or len(abi_args) != 6:
            failures.append(f"{name} {chip}: PTX params {params} vs ABI {manifest['abi']}")
        if f".target {chip}" not in ptx:
            failures.append(f"{name} {chip}: wrong .target")
for f in failures:
    print("FAIL:", f)
print(f"checked {count} kernels, {len(failures)} problems")
sys.exit(1 if failures or count == 0 else 0)
