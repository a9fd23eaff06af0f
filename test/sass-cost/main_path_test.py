#!/usr/bin/env python3
"""Unit test of the static SASS model's main-path walk (bench/sass_cost/model.py)
on hand-written SASS (no nvdisasm needed): which arm of each branch a thread in
the middle of a large tensor takes. Exit status 0 when every case holds."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from sass_cost import model as sc  # noqa: E402


def listing(lines):
    """nvdisasm -c style text of kernel `k`: labels end in ':', instructions
    are `/*addr*/ [@P] OP operands ;`."""
    out = ["k:"]
    addr = 0
    for ln in lines:
        if ln.endswith(":"):
            out.append(ln)
        else:
            out.append(f"        /*{addr:04x}*/ {ln} ;")
            addr += 16
    return "\n".join(out) + "\n"


def walk(lines):
    insns, labels = sc.parse_sass(listing(lines), "k")
    return sc.main_path(insns, labels)


failures = []


def expect(name, got, want):
    if got != want:
        failures.append(f"{name}: walked {got}, expected {want}")


# A 32-bit store of four packed 8-bit codes, then a branch over the masked
# alternative (byte stores one by one): the vector path takes the branch.
packed = [
    ".L_top:",
    "FADD R1, R1, R2",
    "@P2 STG.E desc[UR6][R2.64], R47",
    "@P2 BRA `(.L_done)",
    "@P3 STG.E.U8 desc[UR6][R2.64], R4",
    "@P4 STG.E.U8 desc[UR6][R2.64+0x1], R5",
    ".L_done:",
    "IADD3 R0, R0, 0x1, RZ",
    "@P0 BRA `(.L_top)",
]
expect("packed codes", walk(packed), ["FADD", "STG.E", "BRA", "IADD3", "BRA"])

# A 32-bit store before a branch over other 32-bit work is not the masked
# alternative of a vector access: the if-then body is counted as run.
plain = list(packed)
plain[4] = "@P3 STG.E desc[UR6][R2.64], R4"
plain[5] = "@P4 FMUL R5, R5, R6"
expect("plain 32-bit", walk(plain),
       ["FADD", "STG.E", "BRA", "STG.E", "FMUL", "IADD3", "BRA"])

# The wide case: a 64-bit store guarded the same way skips the masked stores.
wide = list(packed)
wide[2] = "@P2 STG.E.64 desc[UR6][R2.64], R46"
wide[4] = "@P3 STG.E desc[UR6][R2.64], R4"
expect("wide", walk(wide), ["FADD", "STG.E.64", "BRA", "IADD3", "BRA"])

for f in failures:
    print("FAIL", f)
print(f"{3 - len(failures)}/3 main-path cases hold")
sys.exit(1 if failures else 0)
