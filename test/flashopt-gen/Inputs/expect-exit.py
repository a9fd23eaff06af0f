#!/usr/bin/env python3
"""expect-exit.py CODE CMD...: runs CMD (stdout and stderr pass through) and
succeeds only if it exits with exactly CODE."""
import subprocess
import sys

code = int(sys.argv[1])
rc = subprocess.call(sys.argv[2:])
if rc != code:
    sys.stderr.write(f"expect-exit: expected exit status {code}, got {rc}\n")
    sys.exit(1)
