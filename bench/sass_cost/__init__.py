"""Static SASS issue-cost model of the shipped GPU kernels.

For every bundle in a kernel directory (build/kernels after a build) and every
chip, reads the bundle's cubin with nvdisasm and counts, per element on the
main path of the grid-stride loop:

  - executed SASS instructions (thread-instructions per element),
  - MUFU, shared-memory, shuffle and global-memory instructions per element,
    and conversions from or to 64-bit types (F2F.F64.F32 ...: the same
    16-per-clock unit as MUFU),
  - registers and spills (ptxas's figures, recorded in the manifest),
  - the predicted step time for N parameters on the chip, issue-bound vs
    memory-bound (or bound by that 16-per-clock unit), and the % of copy
    bandwidth that prediction reaches.

Modules:
  model      nvdisasm lookup, the SASS parser, the main-path walk, the opcode
             classes, bytes per parameter and the per-chip prediction
  report     the text and markdown tables, the opcode breakdown
  gate       the pinned baseline (bench/sass-baseline.json): --check and
             --write-baseline, the ctest sass-cost/baseline
  calibrate  the model next to measured times and Nsight Compute's counts
             (scripts/device-profile.sh runs it on a GPU machine)
  cli        the command line (scripts/sass-cost.py, or python3 -m sass_cost
             with bench/ on the path)

The main path (docs/BENCHMARKING.md, "sass-cost"): the kernel's largest
backward branch is the grid-stride loop; one iteration is walked from its
header to the back edge, choosing at every forward branch the way a thread in
the middle of a large tensor goes:
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
"""

from .model import (CHIPS, NvdisasmNotFound, analyse, bytes_moved, classify, find_nvdisasm,
                    main_path, parse_sass, predict)

__all__ = ["CHIPS", "NvdisasmNotFound", "analyse", "bytes_moved", "classify", "find_nvdisasm",
           "main_path", "parse_sass", "predict"]
