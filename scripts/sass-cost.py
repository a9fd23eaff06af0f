#!/usr/bin/env python3
"""Static SASS issue-cost model of the shipped GPU kernels (issue 13, item 1).

For every bundle in a kernel directory (build/kernels after a build) and every
chip, reads the bundle's cubin with nvdisasm and reports, per element on the
main path of the grid-stride loop:

  - executed SASS instructions (thread-instructions per element),
  - MUFU, shared-memory, shuffle and global-memory instructions per element,
    and conversions from or to 64-bit types (F2F.F64.F32 ...: the same
    16-per-clock unit as MUFU),
  - registers and spills (ptxas's figures, recorded in the manifest),
  - the predicted step time for N parameters on the chip, issue-bound vs
    memory-bound (or bound by that 16-per-clock unit), and the % of copy
    bandwidth that prediction reaches.

The main path (see docs/PERFORMANCE.md, "GPU: static issue-cost model"): the
kernel's largest backward branch is the grid-stride loop; one iteration is
walked from its header to the back edge, choosing at every forward branch the
way a thread in the middle of a large tensor goes:
  - a branch that skips a region calling a slow-path subroutine
    (`$__internal_*_slowpath`, the rarely-taken arms of div.rn/sqrt.rn) is
    taken (the call is skipped); in an if/else whose one arm calls it, the
    other arm is counted (so is the fast arm of a flashopt.guarded, whose
    exact fallback divides: docs/NUMERICS.md §2c has how often it runs);
  - a branch that skips a region containing a loop (the binary search of the
    tensor table) is taken: one tensor per launch;
  - in any other if/else, the shorter arm is counted (the full-width vector
    access vs the masked tail path); any other if-then body is counted as run
    (e.g. the group's first lane storing the scales: the warp issues it);
  - an inner loop's body is counted once.
Instructions per element = instructions per iteration / elements per thread
(the manifest's `elements_per_thread`).

Modes:
  sass-cost.py --kernels build/kernels                 report (text table)
  sass-cost.py --kernels build/kernels --markdown      tables for PERFORMANCE.md
  sass-cost.py --kernels build/kernels --opcodes       the report, then each kernel's
      main-path opcodes per element (what the count is made of)
  sass-cost.py --kernels build/kernels --json out.json counts as JSON
  sass-cost.py --kernels build/kernels --check bench/sass-baseline.json
      exit 1 if any spec x arch executes more instructions per element (or more
      MUFU per element, registers or spills) than its baseline; also fails on a
      bundle missing from the baseline or a baseline entry without a bundle, and
      says to update the baseline (--write-baseline) when a count fell.
  sass-cost.py --kernels build/kernels --write-baseline bench/sass-baseline.json
  sass-cost.py --counts counts.json --measured gpu-bench.md [--ncu ncu.csv
               --ncu-params 1e8] [--markdown]
      calibration on a GPU machine (scripts/device-check.sh): the counts of a
      --json run made where the kernels were built, beside flashopt-gpu-bench's
      measured times (one row per bundle and size) and, when given, the
      dynamic counts Nsight Compute read for one launch of each bundle at
      --ncu-params elements (warp-instructions executed x 32 / elements, the
      DRAM bytes per element and the SM clock). Each prediction uses the
      bandwidth of the copy timed in the same row and the nominal clock (and,
      with --ncu, the clock measured), so measured / predicted says how far
      the model is off.

nvdisasm is looked up in $FLASHOPT_NVDISASM, PATH, /usr/local/cuda/bin and the
triton wheel of the Python environment (scripts/setup.sh installs torch, which
brings triton); without it the script exits 2 and says how to get it
(`pip install nvidia-cuda-nvdisasm`, or scripts/setup.sh).
"""

import argparse
import collections
import glob
import json
import os
import re
import shutil
import subprocess
import sys

# Chips: SMs, clock (boost, GHz), HBM peak and the copy bandwidth: H200's
# measured (device-to-device copies of 12-28 GB moved read 4.13-4.27 TB/s on
# an H200, scripts/device-check.sh, 2026-12-04), the others assumed at ~90 %
# of peak.
CHIPS = {
    "H100-SXM": {"arch": "sm_90", "sms": 132, "ghz": 1.98, "peak_tbs": 3.35, "copy_tbs": 3.0},
    "H200": {"arch": "sm_90", "sms": 132, "ghz": 1.98, "peak_tbs": 4.8, "copy_tbs": 4.2},
    "B200": {"arch": "sm_100", "sms": 148, "ghz": 1.965, "peak_tbs": 8.0, "copy_tbs": 7.2},
}
ISSUE_PER_CLK_PER_SM = 4  # warp-instructions (one per SM sub-partition)
WARP = 32
STEP_PARAMS = 8e9  # the step time is predicted for 8B parameters in one tensor
# MUFU operations and conversions from or to 64-bit types run at 16 results per
# clock per SM on sm_80/sm_90/sm_100 (CUDA C++ Programming Guide, "Arithmetic
# Instructions" throughput table), an eighth of the issue rate. The model
# assumes they share one unit (the conservative reading) and bounds the step
# by it as well as by issue and memory.
XU_PER_CLK_PER_SM = 16

DTYPE_BYTES = {"f32": 4, "bf16": 2, "f16": 2, "i8": 1, "ui8": 1, "i16": 2, "ui16": 2,
               "u8": 1, "u16": 2, "i32": 4, "ui32": 4}

INSN_RE = re.compile(r"/\*([0-9a-f]+)\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")
LABEL_RE = re.compile(r"^\s*([.$\w][\w.$]*):\s*$")
TARGET_RE = re.compile(r"`\(([^)]+)\)")


def die(msg, code=2):
    print(f"sass-cost: {msg}", file=sys.stderr)
    sys.exit(code)


def find_nvdisasm():
    cands = []
    if os.environ.get("FLASHOPT_NVDISASM"):
        cands.append(os.environ["FLASHOPT_NVDISASM"])
    w = shutil.which("nvdisasm")
    if w:
        cands.append(w)
    cands.append("/usr/local/cuda/bin/nvdisasm")
    here = os.path.dirname(os.path.abspath(__file__))
    venvs = [sys.prefix, os.path.join(here, "..", ".venv"),
             os.path.expanduser(os.environ.get("FLASHOPT_VENV", "~/.cache/flashopt/venv"))]
    for v in venvs:
        cands += glob.glob(os.path.join(v, "lib", "python3*", "site-packages", "triton",
                                        "backends", "nvidia", "bin", "nvdisasm"))
        cands += glob.glob(os.path.join(v, "lib", "python3*", "site-packages", "nvidia",
                                        "cuda_nvdisasm", "bin", "nvdisasm"))
    for c in cands:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    die("nvdisasm not found (looked in $FLASHOPT_NVDISASM, PATH, /usr/local/cuda/bin and "
        "the triton/nvidia wheels of the Python environment); install it with "
        "`.venv/bin/pip install nvidia-cuda-nvdisasm` or run scripts/setup.sh (torch brings "
        "triton, which ships nvdisasm), or set FLASHOPT_NVDISASM")


def parse_sass(text, symbol):
    """Instructions of the kernel function `symbol` (not its subroutines):
    list of (opcode, predicated, target label or None, operands) and label->index."""
    insns, labels = [], {}
    inside = False
    for line in text.splitlines():
        m = LABEL_RE.match(line)
        if m:
            name = m.group(1)
            if name == symbol:
                inside = True
                continue
            if name.startswith(".text."):
                if inside and name != ".text." + symbol:
                    break
                continue
            if name.startswith("$"):  # a subroutine (slow path) starts: kernel ends
                if inside:
                    break
                continue
            if inside:
                labels[name] = len(insns)
            continue
        if not inside:
            continue
        m = INSN_RE.search(line)
        if not m:
            continue
        op, ops = m.group(3), m.group(4)
        t = TARGET_RE.search(ops)
        insns.append({"op": op, "pred": m.group(2) is not None,
                      "guard": (m.group(2) or "").strip(),
                      "target": t.group(1) if t else None, "ops": ops})
    if not insns:
        raise ValueError(f"no SASS for function {symbol}")
    return insns, labels


def is_slow_call(ins):
    return ins["op"].startswith("CALL") and ins["target"] and "slowpath" in ins["target"]


def main_path(insns, labels):
    """Walks one iteration of the grid-stride loop; returns the executed opcodes."""
    def tgt(i):
        t = insns[i]["target"]
        if t not in labels:
            raise ValueError(f"branch at {i} to unknown label {t}")
        return labels[t]

    # The grid-stride loop: the backward branch with the largest span.
    best = None
    for i, ins in enumerate(insns):
        if ins["op"].startswith("BRA") and ins["target"] in labels and tgt(i) <= i:
            span = i - tgt(i)
            if best is None or span > best[1] - best[0]:
                best = (tgt(i), i)
    if best is None:
        raise ValueError("no loop (backward branch) in the kernel")
    head, back = best

    def region_has(lo, hi, pred):
        return any(pred(k, insns[k]) for k in range(lo, hi))

    def narrow_access(x):
        return x["op"][:3] in ("LDG", "STG") and any(
            w in x["op"].split(".") for w in ("U8", "S8", "U16", "S16"))

    def vector_path_done(pc):
        """Whether the branch at pc, `@P BRA`, skips the masked alternative of
        a vector access that ptxas if-converted: wide (64- or 128-bit) global
        loads or stores guarded by the same @P right before it (since the last
        label or branch), or a 32-bit one (four packed 8-bit codes) when the
        skipped region accesses 8- or 16-bit elements one by one. A thread in
        the middle of a tensor took them, so it takes the branch."""
        guard = insns[pc]["guard"]
        if not guard or guard.startswith("@!"):
            return False
        t = insns[pc]["target"]
        skipped_narrow = t in labels and region_has(
            pc + 1, labels[t], lambda k, x: narrow_access(x))
        label_at = set(labels.values())
        k = pc - 1
        while k >= head and insns[k]["op"][:3] != "BRA":
            x = insns[k]
            if (x["guard"] == guard and x["op"][:3] in ("LDG", "STG")
                    and (".64" in x["op"] or ".128" in x["op"]
                         or (skipped_narrow and not narrow_access(x)))):
                return True
            if k in label_at:
                break
            k -= 1
        return False

    def has_loop(lo, hi):
        return region_has(lo, hi, lambda k, x: x["op"].startswith("BRA") and x["target"] in labels
                          and lo <= labels[x["target"]] <= k)

    executed = []
    pc, steps = head, 0
    while True:
        steps += 1
        if steps > 100000:
            raise ValueError("main-path walk does not terminate")
        ins = insns[pc]
        executed.append(ins["op"])
        if pc == back:
            break
        op = ins["op"]
        if op == "EXIT" and not ins["pred"]:
            break
        if op.startswith("BRA") and ins["target"] in labels:
            t = tgt(pc)
            if not ins["pred"]:
                if t <= pc:
                    raise ValueError(f"unconditional backward branch at {pc} inside the loop")
                pc = t
                continue
            if t <= pc:  # inner loop: its body counted once, fall through
                pc += 1
                continue
            lo, hi = pc + 1, t  # fall-through region [lo, hi)
            last = insns[hi - 1]
            diamond = (last["op"].startswith("BRA") and not last["pred"]
                       and last["target"] in labels and labels[last["target"]] > t)
            if diamond:
                join = labels[last["target"]]
                then_slow = region_has(lo, hi, lambda k, x: is_slow_call(x))
                else_slow = region_has(t, join, lambda k, x: is_slow_call(x))
                if then_slow and not else_slow:
                    pc = t
                elif else_slow and not then_slow:
                    pc += 1
                elif (hi - lo) <= (join - t):
                    pc += 1
                else:
                    pc = t
                continue
            if (region_has(lo, hi, lambda k, x: is_slow_call(x)) or has_loop(lo, hi)
                    or vector_path_done(pc)):
                pc = t
                continue
            pc += 1
            continue
        pc += 1
    return executed


def classify(ops):
    c = {"total": len(ops), "mufu": 0, "conv64": 0, "shared": 0, "shfl": 0, "global": 0,
         "branch": 0}
    for op in ops:
        parts = op.split(".")
        base = parts[0]
        if base == "MUFU":
            c["mufu"] += 1
        elif base in ("F2F", "I2F", "F2I") and any(t in ("F64", "S64", "U64") for t in parts[1:]):
            c["conv64"] += 1
        elif base in ("LDS", "STS", "ATOMS", "LDSM", "STSM", "REDS"):
            c["shared"] += 1
        elif base == "SHFL":
            c["shfl"] += 1
        elif base in ("LDG", "STG", "ATOMG", "RED", "LD", "ST"):
            c["global"] += 1
        elif base in ("BRA", "BSSY", "BSYNC", "EXIT", "CALL", "RET", "WARPSYNC"):
            c["branch"] += 1
    return c


def bytes_moved(manifest):
    """Bytes per parameter through memory: every buffer read once, every
    writable one written once, per-group buffers amortized over the group."""
    g = manifest["group_size"]
    total = 0.0
    for b in manifest["buffers"]:
        size = DTYPE_BYTES.get(b["dtype"])
        if size is None:
            raise ValueError(f"{manifest['name']}: unknown dtype {b['dtype']} of buffer {b['name']}")
        per = size / g if b["per"] == "group" else size
        total += per * (2 if b["access"] == "readwrite" else 1)
    return total


def analyse(kernels_dir, nvdisasm, archs):
    rows = []
    for mpath in sorted(glob.glob(os.path.join(kernels_dir, "*", "manifest.json"))):
        bdir = os.path.dirname(mpath)
        with open(mpath) as f:
            man = json.load(f)
        bpp = bytes_moved(man)
        for k in man["kernels"]:
            if k.get("target") not in archs or "cubin" not in k:
                continue
            cubin = os.path.join(bdir, k["cubin"])
            if not os.path.isfile(cubin):
                raise ValueError(f"{man['name']}: {cubin} listed in the manifest is missing")
            r = subprocess.run([nvdisasm, "-c", cubin], capture_output=True, text=True)
            if r.returncode != 0:
                raise ValueError(f"nvdisasm failed on {cubin}: {r.stderr.strip()}")
            try:
                insns, labels = parse_sass(r.stdout, k["symbol"])
                ops = main_path(insns, labels)
            except ValueError as e:
                raise ValueError(f"{cubin}: {e}")
            w = k["elements_per_thread"]
            c = classify(ops)
            rows.append({
                "bundle": man["name"], "arch": k["target"], "elements_per_thread": w,
                "threads_per_block": k.get("threads_per_block"),
                "loop_insns": c["total"],
                "insns_per_elt": round(c["total"] / w, 2),
                "mufu_per_elt": round(c["mufu"] / w, 2),
                "conv64_per_elt": round(c["conv64"] / w, 2),
                "shared_per_elt": round(c["shared"] / w, 2),
                "shfl_per_elt": round(c["shfl"] / w, 2),
                "global_per_elt": round(c["global"] / w, 2),
                "registers": k.get("registers"), "spill_stores": k.get("spill_stores"),
                "spill_loads": k.get("spill_loads"), "bytes_per_param": round(bpp, 4),
                "static_insns": len(insns),
                "opcodes": {op: round(n / w, 2) for op, n in
                            collections.Counter(o.split(".")[0] for o in ops).most_common()},
            })
    return rows


def predict(row, chip):
    ch = CHIPS[chip]
    issue_rate = ISSUE_PER_CLK_PER_SM * WARP * ch["sms"] * ch["ghz"] * 1e9  # thread-insns/s
    t_issue = STEP_PARAMS * row["insns_per_elt"] / issue_rate
    t_mem = STEP_PARAMS * row["bytes_per_param"] / (ch["copy_tbs"] * 1e12)
    budget = ch["copy_tbs"] * 0  # placeholder for clarity below
    budget = issue_rate * row["bytes_per_param"] / (ch["copy_tbs"] * 1e12)  # insns/elt at memory speed
    xu_rate = XU_PER_CLK_PER_SM * ch["sms"] * ch["ghz"] * 1e9  # results/s
    t_xu = STEP_PARAMS * (row["mufu_per_elt"] + row.get("conv64_per_elt", 0.0)) / xu_rate
    t = max(t_issue, t_mem, t_xu)
    bound = "issue" if t == t_issue and t > t_mem else ("memory" if t == t_mem else "MUFU/conversion")
    return {"chip": chip, "ms_issue": t_issue * 1e3, "ms_mem": t_mem * 1e3, "ms_xu": t_xu * 1e3,
            "ms": t * 1e3, "bound": bound,
            "pct_copy": 100.0 * t_mem / t, "budget_insns_per_elt": budget,
            "issue_pct_of_budget": 100.0 * row["insns_per_elt"] / budget}


def report(rows, chips, markdown):
    if markdown:
        print(f"Predicted for {STEP_PARAMS:.0e} parameters in one tensor; budget = thread-"
              "instructions per element that the issue rate allows at copy speed.\n")
        print("| bundle | arch | elt/thread | SASS/elt | MUFU/elt | cvt64/elt | shared/elt | SHFL/elt | regs | spills |"
              + "".join(f" {c} ms (bound) | {c} % of copy | {c} % of budget |" for c in chips))
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|" + "---:|---:|---:|" * len(chips))
    for r in rows:
        preds = [predict(r, c) for c in chips if CHIPS[c]["arch"] == r["arch"]]
        if not preds:
            continue
        if markdown:
            cells = []
            for c in chips:
                p = next((p for p in preds if p["chip"] == c), None)
                cells += ["—"] * 3 if p is None else [f"{p['ms']:.1f} ({p['bound']})",
                                                      f"{p['pct_copy']:.0f} %",
                                                      f"{p['issue_pct_of_budget']:.0f} %"]
            print(f"| {r['bundle']} | {r['arch']} | {r['elements_per_thread']} | {r['insns_per_elt']:.1f} | "
                  f"{r['mufu_per_elt']:.2f} | {r.get('conv64_per_elt', 0.0):.2f} | "
                  f"{r['shared_per_elt']:.2f} | {r['shfl_per_elt']:.2f} | "
                  f"{r['registers']} | {r['spill_stores']}/{r['spill_loads']} | " + " | ".join(cells) + " |")
        else:
            s = (f"{r['bundle']:28s} {r['arch']:6s} W={r['elements_per_thread']} "
                 f"SASS/elt={r['insns_per_elt']:7.1f} MUFU/elt={r['mufu_per_elt']:5.2f} "
                 f"cvt64/elt={r.get('conv64_per_elt', 0.0):4.2f} "
                 f"shared/elt={r['shared_per_elt']:4.2f} SHFL/elt={r['shfl_per_elt']:4.2f} "
                 f"regs={r['registers']} spills={r['spill_stores']}/{r['spill_loads']} "
                 f"B/param={r['bytes_per_param']:.3f}")
            for p in preds:
                s += (f" | {p['chip']}: {p['ms']:.1f} ms {p['bound']}-bound, "
                      f"{p['pct_copy']:.0f}% of copy, budget {p['budget_insns_per_elt']:.0f}/elt")
            print(s)


def parse_measured(path):
    """flashopt-gpu-bench's table: {(bundle, params): (ms, copy_gbs)} for the
    single-tensor rows."""
    out = {}
    with open(path) as f:
        for line in f:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) < 8 or cells[2] != "1" or " " in cells[0]:
                continue
            try:
                n, ms, copy = float(cells[1]), float(cells[4]), float(cells[6])
            except ValueError:
                continue
            out[(cells[0], n)] = (ms, copy)
    return out


NCU_METRICS = {
    "smsp__inst_executed.sum": "warp_insns",
    "smsp__thread_inst_executed.sum": "thread_insns",
    "dram__bytes.sum": "dram_bytes",
    "gpu__time_duration.sum": "ns",
    "sm__cycles_elapsed.avg.per_second": "sm_hz",
    "smsp__issue_active.avg.pct_of_peak_sustained_active": "issue_pct",
}


def parse_ncu(path):
    """Nsight Compute's --csv --print-units base output: {kernel: {metric: value}}
    (the last launch of each kernel name)."""
    import csv
    out = {}
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    for rec in csv.DictReader(lines):
        name, metric = rec.get("Kernel Name", ""), rec.get("Metric Name", "")
        if metric not in NCU_METRICS:
            continue
        try:
            v = float(rec.get("Metric Value", "").replace(",", ""))
        except ValueError:
            continue
        name = name.split("(")[0].strip()
        out.setdefault(name, {})[NCU_METRICS[metric]] = v
    return out


def calibrate(rows, measured, ncu, ncu_params, markdown):
    ch = CHIPS["H200"]
    nominal = ISSUE_PER_CLK_PER_SM * WARP * ch["sms"] * ch["ghz"] * 1e9
    by = {(r["bundle"]): r for r in rows if r["arch"] == ch["arch"]}
    hdr = ["bundle", "params", "SASS/elt static", "SASS/elt dynamic", "dyn/static",
           "issue active %", "SM GHz", "B/param manifest", "B/param DRAM", "measured ms",
           "copy GB/s", "% of copy", "predicted ms", "bound", "measured/predicted"]
    print("Model vs measured (H200 issue rate: 4 warp-instructions/clk/SM, 132 SMs, "
          f"{ch['ghz']} GHz unless the SM clock was measured; memory time at the copy "
          "bandwidth timed in the same row).\n")
    if markdown:
        print("| " + " | ".join(hdr) + " |")
        print("|---|---:|" + "---:|" * (len(hdr) - 2))
    else:
        print("  ".join(hdr))
    for (bundle, n), (ms, copy) in sorted(measured.items()):
        r = by.get(bundle)
        if r is None:
            continue
        k = ncu.get(bundle, {})
        dyn = k["warp_insns"] * WARP / ncu_params if "warp_insns" in k and ncu_params else None
        dram = k["dram_bytes"] / ncu_params if "dram_bytes" in k and ncu_params else None
        ghz = k["sm_hz"] / 1e9 if "sm_hz" in k else None
        rate = nominal if ghz is None else ISSUE_PER_CLK_PER_SM * WARP * ch["sms"] * ghz * 1e9
        insns = dyn if dyn is not None else r["insns_per_elt"]
        t_issue = n * insns / rate * 1e3
        t_mem = n * r["bytes_per_param"] / (copy * 1e9) * 1e3 if copy > 0 else 0.0
        pred = max(t_issue, t_mem)
        f = lambda v, fmt: "—" if v is None else format(v, fmt)
        cells = [bundle, f"{n:.0e}", f"{r['insns_per_elt']:.1f}", f(dyn, ".1f"),
                 f(None if dyn is None else dyn / r["insns_per_elt"], ".2f"),
                 f(k.get("issue_pct"), ".0f"), f(ghz, ".2f"), f"{r['bytes_per_param']:.3f}",
                 f(dram, ".2f"), f"{ms:.3f}", f"{copy:.0f}",
                 f"{100.0 * t_mem / ms:.0f} %" if t_mem else "—", f"{pred:.3f}",
                 "issue" if t_issue > t_mem else "memory", f"{ms / pred:.2f}"]
        print(("| " + " | ".join(cells) + " |") if markdown else "  ".join(cells))
    return 0


PINNED = ("insns_per_elt", "mufu_per_elt", "shared_per_elt", "registers", "spill_stores",
          "spill_loads")


def check(rows, baseline_path):
    with open(baseline_path) as f:
        base = json.load(f)
    entries = {(e["bundle"], e["arch"]): e for e in base["entries"]}
    seen, worse, better = set(), [], []
    for r in rows:
        key = (r["bundle"], r["arch"])
        seen.add(key)
        b = entries.get(key)
        if b is None:
            worse.append(f"{key[0]} {key[1]}: not in the baseline {baseline_path}")
            continue
        for f_ in PINNED:
            now, was = r[f_], b[f_]
            if now is None or was is None:
                continue
            if now > was + 1e-9:
                worse.append(f"{key[0]} {key[1]}: {f_} rose from {was} to {now}")
            elif now < was - 1e-9:
                better.append(f"{key[0]} {key[1]}: {f_} fell from {was} to {now}")
    for key in entries:
        if key not in seen:
            worse.append(f"{key[0]} {key[1]}: in the baseline but no such bundle/cubin was built")
    upd = (f"scripts/sass-cost.py --kernels <build>/kernels --write-baseline {baseline_path}")
    for m in better:
        print(f"sass-cost: improved: {m}")
    if better:
        print(f"sass-cost: counts fell; lock the gain in: {upd} (and update docs/PERFORMANCE.md)")
    if worse:
        for m in worse:
            print(f"sass-cost: REGRESSION: {m}", file=sys.stderr)
        print(f"sass-cost: {len(worse)} regression(s) against {baseline_path}. If the rise is "
              f"intended, say why in the commit and run: {upd}", file=sys.stderr)
        return 1
    print(f"sass-cost: {len(rows)} kernels within the baseline {baseline_path}")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernels", help="directory of bundles (build/kernels)")
    ap.add_argument("--counts", help="counts from an earlier --json run (no nvdisasm needed)")
    ap.add_argument("--measured", help="flashopt-gpu-bench's table (calibration)")
    ap.add_argument("--ncu", help="Nsight Compute CSV of one launch per bundle (calibration)")
    ap.add_argument("--ncu-params", type=float, help="elements of each profiled launch")
    ap.add_argument("--arch", action="append", help="sm_80, sm_90, sm_100 (default sm_90, sm_100)")
    ap.add_argument("--chips", default="H100-SXM,H200,B200")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--check")
    ap.add_argument("--write-baseline")
    ap.add_argument("--only", action="append", help="bundle name (repeatable)")
    ap.add_argument("--opcodes", action="store_true",
                    help="also print each kernel's main-path opcodes per element (SASS base names)")
    a = ap.parse_args()
    archs = a.arch or ["sm_90", "sm_100"]
    chips = [c for c in a.chips.split(",") if c]
    for c in chips:
        if c not in CHIPS:
            die(f"unknown chip {c} (known: {', '.join(CHIPS)})")
    if a.counts:
        try:
            with open(a.counts) as f:
                rows = json.load(f)
        except (OSError, ValueError) as e:
            die(f"cannot read the counts {a.counts}: {e}", 1)
    else:
        if not a.kernels:
            die("--kernels DIR (or --counts JSON) is required")
        if not os.path.isdir(a.kernels):
            die(f"kernel directory {a.kernels} does not exist (build first)")
        nvdisasm = find_nvdisasm()
        try:
            rows = analyse(a.kernels, nvdisasm, archs)
        except ValueError as e:
            die(str(e), 1)
    if a.measured:
        try:
            measured = parse_measured(a.measured)
            ncu = parse_ncu(a.ncu) if a.ncu and os.path.isfile(a.ncu) else {}
        except OSError as e:
            die(str(e), 1)
        if not measured:
            die(f"no single-tensor rows in {a.measured}", 1)
        return calibrate(rows, measured, ncu, a.ncu_params, a.markdown)
    if a.only:
        rows = [r for r in rows if r["bundle"] in a.only]
    if not rows:
        die(f"no cubins for {archs} under {a.kernels}", 1)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    if a.write_baseline:
        with open(a.write_baseline, "w") as f:
            json.dump({"about": "Static SASS counts per element of the main path (scripts/sass-cost.py). "
                       "The test sass-cost/baseline fails when a count rises above these; "
                       "rewrite with --write-baseline when it falls.",
                       "entries": [{k: r[k] for k in ("bundle", "arch", "elements_per_thread") + PINNED}
                                   for r in rows]}, f, indent=1)
            f.write("\n")
        print(f"sass-cost: wrote {a.write_baseline} ({len(rows)} kernels)")
    if a.check:
        return check(rows, a.check)
    if not a.json and not a.write_baseline:
        report(rows, chips, a.markdown)
        if a.opcodes:
            for r in rows:
                ops = r.get("opcodes") or {}
                print(f"{r['bundle']} {r['arch']} opcodes/elt: " +
                      ", ".join(f"{k} {v:.2f}" for k, v in ops.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
