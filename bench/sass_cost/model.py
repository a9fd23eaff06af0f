"""The static model: nvdisasm, the SASS parser, the main-path walk of the
grid-stride loop (the rules are in the package's docstring), the opcode
classes, bytes per parameter and the per-chip prediction. No output, no exit:
errors are exceptions (ValueError, NvdisasmNotFound)."""

import collections
import concurrent.futures
import glob
import hashlib
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

DTYPE_BYTES = {"f32": 4, "bf16": 2, "f16": 2, "i8": 1, "ui8": 1, "i4": 0.5, "ui4": 0.5,
               "i16": 2, "ui16": 2,
               "u8": 1, "u16": 2, "i32": 4, "ui32": 4}

INSN_RE = re.compile(r"/\*([0-9a-f]+)\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")
LABEL_RE = re.compile(r"^\s*([.$\w][\w.$]*):\s*$")
TARGET_RE = re.compile(r"`\(([^)]+)\)")


class NvdisasmNotFound(RuntimeError):
    """No nvdisasm binary where find_nvdisasm looks."""


def find_nvdisasm():
    """The nvdisasm binary to use; raises NvdisasmNotFound without one."""
    cands = []
    if os.environ.get("FLASHOPT_NVDISASM"):
        cands.append(os.environ["FLASHOPT_NVDISASM"])
    w = shutil.which("nvdisasm")
    if w:
        cands.append(w)
    cands.append("/usr/local/cuda/bin/nvdisasm")
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    venvs = [sys.prefix, os.path.join(root, ".venv"),
             os.path.expanduser(os.environ.get("FLASHOPT_VENV", "~/.cache/flashopt/venv"))]
    for v in venvs:
        cands += glob.glob(os.path.join(v, "lib", "python3*", "site-packages", "triton",
                                        "backends", "nvidia", "bin", "nvdisasm"))
        cands += glob.glob(os.path.join(v, "lib", "python3*", "site-packages", "nvidia",
                                        "cuda_nvdisasm", "bin", "nvdisasm"))
    for c in cands:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    raise NvdisasmNotFound(
        "nvdisasm not found (looked in $FLASHOPT_NVDISASM, PATH, /usr/local/cuda/bin and "
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
    """Counts of the walked opcodes by class (MUFU, 64-bit conversions, shared,
    shuffle, global, branch) and in total."""
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


def _model_key(nvdisasm):
    """What a cached walk depends on besides the cubin: this file's text and
    the nvdisasm binary (path, size, modification time)."""
    with open(__file__, "rb") as f:
        h = hashlib.sha256(f.read())
    st = os.stat(nvdisasm)
    h.update(f"{os.path.realpath(nvdisasm)}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def walk_cubin(nvdisasm, cubin, symbol, cache_dir=None):
    """(main-path opcodes, static instruction count) of `symbol` in `cubin`.
    With cache_dir, the result is kept there under the cubin's sha256, the
    symbol and this model's source hash, so a second run over the same
    kernels (sass-cost/baseline, then device-profile.sh --prepare) does not
    disassemble again. nvdisasm runs without its dataflow analysis (-ndf):
    it only annotates branch-stack jumps (BRX/JMX), which the walk does not
    follow, and takes a quarter of the time; the walked paths are the same."""
    path = None
    if cache_dir:
        with open(cubin, "rb") as f:
            h = hashlib.sha256(f.read())
        h.update(symbol.encode())
        h.update(_model_key(nvdisasm).encode())
        path = os.path.join(cache_dir, h.hexdigest() + ".json")
        try:
            with open(path) as f:
                d = json.load(f)
            return d["ops"], d["static_insns"]
        except (OSError, ValueError, KeyError):
            pass
    r = subprocess.run([nvdisasm, "-c", "-ndf", cubin], capture_output=True, text=True)
    if r.returncode != 0:
        raise ValueError(f"nvdisasm failed on {cubin}: {r.stderr.strip()}")
    try:
        insns, labels = parse_sass(r.stdout, symbol)
        ops = main_path(insns, labels)
    except ValueError as e:
        raise ValueError(f"{cubin}: {e}")
    if path:
        os.makedirs(cache_dir, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump({"ops": ops, "static_insns": len(insns)}, f)
        os.replace(tmp, path)  # atomic: a concurrent run reads old or new, never half
    return ops, len(insns)


def analyse(kernels_dir, nvdisasm, archs, cache_dir=None, jobs=None):
    """One row of counts per bundle and chip in `archs` (those with a cubin);
    raises ValueError on a missing cubin or an unreadable kernel. The cubins
    are disassembled `jobs` at a time (default: the CPU count)."""
    work = []
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
            work.append((man, bpp, k, cubin))
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as ex:
        walks = list(ex.map(lambda t: walk_cubin(nvdisasm, t[3], t[2]["symbol"], cache_dir), work))
    rows = []
    for (man, bpp, k, _), (ops, static_insns) in zip(work, walks):
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
            "static_insns": static_insns,
            "opcodes": {op: round(n / w, 2) for op, n in
                        collections.Counter(o.split(".")[0] for o in ops).most_common()},
        })
    return rows


def predict(row, chip):
    """The step time of STEP_PARAMS parameters on `chip`: issue-, memory- or
    MUFU/conversion-bound, with the % of copy bandwidth and of the issue budget."""
    ch = CHIPS[chip]
    issue_rate = ISSUE_PER_CLK_PER_SM * WARP * ch["sms"] * ch["ghz"] * 1e9  # thread-insns/s
    t_issue = STEP_PARAMS * row["insns_per_elt"] / issue_rate
    t_mem = STEP_PARAMS * row["bytes_per_param"] / (ch["copy_tbs"] * 1e12)
    budget = issue_rate * row["bytes_per_param"] / (ch["copy_tbs"] * 1e12)  # insns/elt at memory speed
    xu_rate = XU_PER_CLK_PER_SM * ch["sms"] * ch["ghz"] * 1e9  # results/s
    t_xu = STEP_PARAMS * (row["mufu_per_elt"] + row.get("conv64_per_elt", 0.0)) / xu_rate
    t = max(t_issue, t_mem, t_xu)
    bound = "issue" if t == t_issue and t > t_mem else ("memory" if t == t_mem else "MUFU/conversion")
    return {"chip": chip, "ms_issue": t_issue * 1e3, "ms_mem": t_mem * 1e3, "ms_xu": t_xu * 1e3,
            "ms": t * 1e3, "bound": bound,
            "pct_copy": 100.0 * t_mem / t, "budget_insns_per_elt": budget,
            "issue_pct_of_budget": 100.0 * row["insns_per_elt"] / budget}
