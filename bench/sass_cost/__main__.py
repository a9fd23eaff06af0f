"""python3 -m sass_cost (with bench/ on sys.path): the command line."""
import sys

from .cli import main

sys.exit(main())
