"""Which bundle runs: the kernels directory's bundles by what they compute.

The library describes each bundle of the directory
(flashopt_describe_bundle: its rule, its parameter dtype and correction
term, the width of its state codes (8 or 4 bits) or fp32 states, its
arithmetic and its
numerics, from its manifest). The binding selects a bundle by these
attributes and never builds or parses a bundle's name (specs/generate.py
alone names the shipped specs), so a kernels directory of other names, or a
custom build holding a few bundles, works alike. The index of a directory is
read once per process (the shipped 192 bundles: about 10 ms).
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Dict, Optional

import torch

from . import _dtypes as D
from . import _lib as L

_PARAM_NAMES = {D.CODE[t]: D.NAME[t] for t in D.PARAM}


class MissingBundleError(FileNotFoundError):
    """No generated bundle for the requested (rule, dtype, master weight, states)."""


STATE_BITS = (4, 8, 32)

# The 4-bit bundles specs/generate.py ships (docs/design/4bit-states.md §6):
# bf16 parameters with 24-bit master weights (exact and fast arithmetic), or
# f32 ones (exact); the bounded numerics. Said in MissingBundleError's message only:
# selection goes by what the kernels directory's manifests compute.
_SHIPPED_4BIT = ("4-bit states ship for bf16 parameters with master_weight_bits=24 "
                 "(arithmetic='exact' or 'fast') and for f32 parameters (arithmetic='exact'), "
                 "with numerics='bounded' (<rule>_bf16_m24_4bit, <rule>_bf16_m24_4bit_fast, "
                 "<rule>_f32_4bit)")


def state_bits_of(state_bits=None, quantize=None) -> int:
    """The state width from the optimizers' options: state_bits (4, 8 or 32)
    and the older quantize (True: 8, False: 32), default 8. Both given and
    disagreeing is a ValueError naming both."""
    if state_bits is not None and (isinstance(state_bits, bool)
                                   or state_bits not in STATE_BITS):
        raise ValueError(f"state_bits must be 4, 8 or 32, not {state_bits!r}")
    if quantize is None:
        return 8 if state_bits is None else int(state_bits)
    from_quantize = 8 if quantize else 32
    if state_bits is None:
        return from_quantize
    if state_bits != from_quantize:
        raise ValueError(f"state_bits={state_bits!r} and quantize={quantize!r} disagree "
                         f"(quantize={bool(quantize)} means state_bits={from_quantize}); "
                         f"pass state_bits alone")
    return int(state_bits)


@dataclass(frozen=True)
class Attrs:
    """What a bundle computes, as the optimizers' options say it."""

    rule: str
    dtype: str  # "bf16", "f16", "f32"
    master_weight_bits: Optional[int]  # None, 24, 32 (None for f32)
    state_bits: int  # 4 or 8 (codes), 32 (fp32 states)
    arithmetic: str  # "exact", "fast"
    numerics: str  # "bounded", "flashoptim"


def attrs_of(d) -> Optional[Attrs]:
    """A bundle's attributes (flashopt_describe_bundle's flashopt_bundle_desc),
    or None for one the torch classes never select (no stored state, or both
    quantized and fp32 states, or no parameter dtype they take)."""
    if (d.quantized_states > 0) == (d.plain_states > 0) or d.param_dtype not in _PARAM_NAMES:
        return None
    bits = {L.I8: 24, L.I16: 32}.get(d.correction_dtype) if d.has_correction else None
    if d.has_correction and bits is None:
        return None
    return Attrs(rule=d.rule.decode(), dtype=_PARAM_NAMES[d.param_dtype], master_weight_bits=bits,
                 state_bits=int(d.state_bits) if d.quantized_states > 0 else 32,
                 arithmetic=d.arithmetic.decode(),
                 numerics=d.numerics.decode())


_lock = threading.Lock()
_cache: Dict[str, Dict[Attrs, str]] = {}


def index(kdir: Optional[Path] = None) -> Dict[Attrs, str]:
    """The bundles of kernels directory `kdir` by their attributes."""
    kdir = Path(kdir or L.kernels_dir())
    key = str(kdir.resolve())
    with _lock:
        if key not in _cache:
            out: Dict[Attrs, str] = {}
            for m in sorted(kdir.glob("*/manifest.json")):
                d = L.BundleDesc()
                if L.lib().flashopt_describe_bundle(str(m.parent).encode(),
                                                    ctypes.byref(d)) != 0:
                    continue  # not a bundle; creating its optimizer would say why
                a = attrs_of(d)
                if a is not None:
                    out.setdefault(a, m.parent.name)
            _cache[key] = out
        return _cache[key]


def _bits(state_bits) -> int:
    """state_bits, also given as the older quantize bool (True: 8, False: 32)."""
    if isinstance(state_bits, bool):
        return 8 if state_bits else 32
    return int(state_bits)


def _attrs(rule, dtype, master_weight_bits, state_bits, arithmetic, numerics) -> Attrs:
    d = D.NAME[dtype]
    return Attrs(rule, d, None if d == "f32" else master_weight_bits, _bits(state_bits),
                 arithmetic, numerics)


def find(rule: str, dtype: torch.dtype, master_weight_bits: Optional[int], state_bits: int,
         arithmetic: str = "exact", numerics: str = "bounded") -> Optional[str]:
    """The bundle computing these options, or None (state_bits 4, 8 or 32;
    a bool is the older quantize). FlashOptim's numerics differ from the
    bounded ones only in quantized states and Adam's bound (docs/NUMERICS.md
    §8): elsewhere the one bundle serves both."""
    idx = index()
    a = _attrs(rule, dtype, master_weight_bits, state_bits, arithmetic, numerics)
    name = idx.get(a)
    if name is None and numerics == "flashoptim" and a.state_bits == 32 and \
            rule not in ("adam", "adamw"):
        name = idx.get(replace(a, numerics="bounded"))
    return name


def select(rule: str, dtype: torch.dtype, master_weight_bits: Optional[int], state_bits: int,
           arithmetic: str = "exact", numerics: str = "bounded", owner: str = "flashopt") -> str:
    """find(), or a MissingBundleError describing what is missing."""
    name = find(rule, dtype, master_weight_bits, state_bits, arithmetic, numerics)
    if name is not None:
        return name
    bits = _bits(state_bits)
    idx = index()
    have = sorted(n for a, n in idx.items() if a.rule == rule)
    four = (f" {_SHIPPED_4BIT}; other 4-bit combinations are built from a spec with "
            f"\"states\": \"quantized4\" (docs/SPEC.md)." if bits == 4 else "")
    raise MissingBundleError(
        f"flashopt: {owner} with {dtype} parameters, master_weight_bits={master_weight_bits}, "
        f"state_bits={bits}, arithmetic={arithmetic!r}, numerics={numerics!r} needs a bundle "
        f"of rule {rule!r} that computes this, and none of the {len(idx)} bundles in "
        f"{L.kernels_dir()} does (each manifest.json says what its bundle computes).{four} "
        f"Choose other options, or generate it: specs/generate.py writes the spec of every "
        f"shipped combination (docs/SPEC.md), then rebuild. Bundles of this "
        f"rule: {', '.join(have) if have else 'none'}")


def other_numerics(name: str) -> Optional[str]:
    """The bundle computing what bundle `name` does in the other numerics
    (bounded <-> flashoptim), if the kernels directory has one."""
    idx = index()
    mine = next((a for a, n in idx.items() if n == name), None)
    if mine is None:
        return None
    other = "bounded" if mine.numerics == "flashoptim" else "flashoptim"
    found = idx.get(replace(mine, numerics=other))
    return found if found != name else None


def numerics_of(name: str) -> str:
    """The numerics bundle `name` computes ("bounded" when the kernels
    directory does not describe it)."""
    return next((a.numerics for a, n in index().items() if n == name), "bounded")
