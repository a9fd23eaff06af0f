"""The model against a GPU: flashopt-gpu-bench's measured times and Nsight
Compute's dynamic counts beside the static prediction (run on the GPU machine
by scripts/device-profile.sh, from the counts `--json` wrote where the kernels
were built)."""

import csv

from .model import CHIPS, ISSUE_PER_CLK_PER_SM, WARP


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
    """Prints the H200 model next to each measured single-tensor time: static
    and (with `ncu`) executed SASS per element, issue activity, SM clock, bytes
    per parameter from the manifest and from DRAM, and measured / predicted."""
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
