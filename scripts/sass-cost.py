#!/usr/bin/env python3
"""The command line of the static SASS issue-cost model, bench/sass_cost
(`scripts/sass-cost.py --help` lists its modes; docs/BENCHMARKING.md says what
it counts). The same as `python3 -m sass_cost` with bench/ on the path."""
import os
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))

from sass_cost.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
