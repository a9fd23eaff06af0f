"""The model's tables: text (one line per kernel) or markdown (the model table
of docs/PERFORMANCE.md), and the opcode breakdown of each main path."""

from .model import CHIPS, STEP_PARAMS, predict


def report(rows, chips, markdown):
    """Prints one line (or markdown row) per kernel with its counts and, per chip
    of its arch in `chips`, the predicted time, bound, % of copy and budget."""
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


def print_opcodes(rows):
    """Prints each kernel's main-path opcodes per element (SASS base names)."""
    for r in rows:
        ops = r.get("opcodes") or {}
        print(f"{r['bundle']} {r['arch']} opcodes/elt: " +
              ", ".join(f"{k} {v:.2f}" for k, v in ops.items()))
