"""Static SASS issue-cost model of the shipped GPU kernels (bench/sass_cost;
what it counts and how the main path is walked: docs/BENCHMARKING.md).

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
  (any mode measuring cubins: --cache DIR or $FLASHOPT_SASS_CACHE keeps each
  cubin's walk by its sha256, so a second run disassembles nothing; --jobs N)
  sass-cost.py --counts counts.json --measured gpu-bench.md [--ncu ncu.csv
               --ncu-params 1e8] [--markdown]
      calibration on a GPU machine (scripts/device-profile.sh --experiments): the
      counts of a --json run made where the kernels were built, beside
      flashopt-gpu-bench's measured times (one row per bundle and size) and,
      when given, the dynamic counts Nsight Compute read for one launch of each
      bundle at --ncu-params elements (warp-instructions executed x 32 /
      elements, the DRAM bytes per element and the SM clock). Each prediction
      uses the bandwidth of the copy timed in the same row and the nominal clock
      (and, with --ncu, the clock measured), so measured / predicted says how
      far the model is off.

nvdisasm is looked up in $FLASHOPT_NVDISASM, PATH, /usr/local/cuda/bin and the
triton wheel of the Python environment (scripts/setup.sh installs torch, which
brings triton); without it the command exits 2 and says how to get it
(`pip install nvidia-cuda-nvdisasm`, or scripts/setup.sh).
"""

import argparse
import json
import os
import sys

from .calibrate import calibrate, parse_measured, parse_ncu
from .gate import check, write_baseline
from .model import CHIPS, NvdisasmNotFound, analyse, find_nvdisasm
from .report import print_opcodes, report


def die(msg, code=2):
    print(f"sass-cost: {msg}", file=sys.stderr)
    sys.exit(code)


def load_rows(a, archs):
    """The counts: from an earlier --json run, or measured from the cubins."""
    if a.counts:
        try:
            with open(a.counts) as f:
                return json.load(f)
        except (OSError, ValueError) as e:
            die(f"cannot read the counts {a.counts}: {e}", 1)
    if not a.kernels:
        die("--kernels DIR (or --counts JSON) is required")
    if not os.path.isdir(a.kernels):
        die(f"kernel directory {a.kernels} does not exist (build first)")
    try:
        nvdisasm = find_nvdisasm()
    except NvdisasmNotFound as e:
        die(str(e))
    try:
        return analyse(a.kernels, nvdisasm, archs, a.cache or None, a.jobs)
    except ValueError as e:
        die(str(e), 1)


def main(argv=None):
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
    ap.add_argument("--cache", default=os.environ.get("FLASHOPT_SASS_CACHE"),
                    help="folder keeping each cubin's walk (by sha256), so a second run "
                         "over the same kernels does not disassemble again "
                         "(default $FLASHOPT_SASS_CACHE; none without it)")
    ap.add_argument("--jobs", type=int, help="nvdisasm processes at once (default: CPU count)")
    ap.add_argument("--opcodes", action="store_true",
                    help="also print each kernel's main-path opcodes per element (SASS base names)")
    a = ap.parse_args(argv)
    archs = a.arch or ["sm_90", "sm_100"]
    chips = [c for c in a.chips.split(",") if c]
    for c in chips:
        if c not in CHIPS:
            die(f"unknown chip {c} (known: {', '.join(CHIPS)})")
    rows = load_rows(a, archs)
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
        write_baseline(rows, a.write_baseline)
        print(f"sass-cost: wrote {a.write_baseline} ({len(rows)} kernels)")
    if a.check:
        return check(rows, a.check)
    if not a.json and not a.write_baseline:
        report(rows, chips, a.markdown)
        if a.opcodes:
            print_opcodes(rows)
    return 0
