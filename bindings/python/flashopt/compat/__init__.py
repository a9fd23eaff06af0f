"""Compatibility modules: other optimizer packages' public APIs over flashopt.

flashopt.compat.flashoptim: FlashOptim 0.1.4's (docs/PYTHON.md "Switching
from FlashOptim").
"""
