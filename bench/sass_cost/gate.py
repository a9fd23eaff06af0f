"""The CI gate: the counts pinned in bench/sass-baseline.json (ctest
sass-cost/baseline) may only fall. A rise fails; a fall says how to lock the
gain in."""

import json
import sys

PINNED = ("insns_per_elt", "mufu_per_elt", "shared_per_elt", "registers", "spill_stores",
          "spill_loads")


def check(rows, baseline_path):
    """0 when no pinned count of `rows` rose above the baseline and both name the
    same kernels; 1 otherwise. Prints the regressions, and the command that
    locks a gain in when a count fell."""
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


def write_baseline(rows, path):
    """Writes the pinned counts of `rows` to `path` (bench/sass-baseline.json)."""
    with open(path, "w") as f:
        json.dump({"about": "Static SASS counts per element of the main path (scripts/sass-cost.py). "
                   "The test sass-cost/baseline fails when a count rises above these; "
                   "rewrite with --write-baseline when it falls.",
                   "entries": [{k: r[k] for k in ("bundle", "arch", "elements_per_thread") + PINNED}
                               for r in rows]}, f, indent=1)
        f.write("\n")
