"""Which bundle runs: the kernels directory's bundles by what they compute.

The library describes each bundle of the directory
(flashopt_describe_bundle: its rule, its parameter dtype and correction
term, whether its states are 8-bit codes or fp32, its arithmetic and its
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


@dataclass(frozen=True)
class Attrs:
    """What a bundle computes, as the optimizers' options say it."""

    rule: str
    dtype: str  # "bf16", "f16", "f32"
    master_weight_bits: Optional[int]  # None, 24, 32 (None for f32)
    quantize: bool  # 8-bit states (else fp32)
    arithmetic: str  # "exact", "fast"
    numerics: str  # "bounded", "flashoptim"


def attrs_of(d) -> Optional[Attrs]:
    """A bundle's attributes (flashopt_describe_bundle's flashopt_bundle_desc),
    or None for one the torch classes never select (no stored state, or both
    8-bit and fp32 states, or no parameter dtype they take)."""
    if (d.quantized_states > 0) == (d.plain_states > 0) or d.param_dtype not in _PARAM_NAMES:
        return None
    bits = {L.I8: 24, L.I16: 32}.get(d.correction_dtype) if d.has_correction else None
    if d.has_correction and bits is None:
        return None
    return Attrs(rule=d.rule.decode(), dtype=_PARAM_NAMES[d.param_dtype], master_weight_bits=bits,
                 quantize=d.quantized_states > 0, arithmetic=d.arithmetic.decode(),
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


def _attrs(rule, dtype, master_weight_bits, quantize, arithmetic, numerics) -> Attrs:
    d = D.NAME[dtype]
    return Attrs(rule, d, None if d == "f32" else master_weight_bits, bool(quantize),
                 arithmetic, numerics)


def find(rule: str, dtype: torch.dtype, master_weight_bits: Optional[int], quantize: bool,
         arithmetic: str = "exact", numerics: str = "bounded") -> Optional[str]:
    """The bundle computing these options, or None. FlashOptim's numerics
    differ from the bounded ones only in quantized states and Adam's bound
    (docs/NUMERICS.md §8): elsewhere the one bundle serves both."""
    idx = index()
    a = _attrs(rule, dtype, master_weight_bits, quantize, arithmetic, numerics)
    name = idx.get(a)
    if name is None and numerics == "flashoptim" and not quantize and \
            rule not in ("adam", "adamw"):
        name = idx.get(replace(a, numerics="bounded"))
    return name


def select(rule: str, dtype: torch.dtype, master_weight_bits: Optional[int], quantize: bool,
           arithmetic: str = "exact", numerics: str = "bounded", owner: str = "flashopt") -> str:
    """find(), or a MissingBundleError describing what is missing."""
    name = find(rule, dtype, master_weight_bits, quantize, arithmetic, numerics)
    if name is not None:
        return name
    idx = index()
    have = sorted(n for a, n in idx.items() if a.rule == rule)
    raise MissingBundleError(
        f"flashopt: {owner} with {dtype} parameters, master_weight_bits={master_weight_bits}, "
        f"quantize={quantize}, arithmetic={arithmetic!r}, numerics={numerics!r} needs a bundle "
        f"of rule {rule!r} that computes this, and none of the {len(idx)} bundles in "
        f"{L.kernels_dir()} does (each manifest.json says what its bundle computes). Choose "
        f"other options, or generate it: specs/generate.py writes a spec for every "
        f"combination the constructors accept (docs/SPEC.md), then rebuild. Bundles of this "
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
