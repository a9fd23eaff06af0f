"""Which bundle runs: the kernels directory's bundles by what they compute.

Each bundle's manifest.json says what it is: its rule, its parameter dtype
and correction term, whether its states are 8-bit codes or fp32, its
arithmetic and its numerics. The binding selects a bundle by these
attributes and never builds or parses a bundle's name (specs/generate.py
alone names the shipped specs), so a kernels directory of other names, or a
custom build holding a few bundles, works alike. The index of a directory is
read once per process (the shipped 192 manifests: tens of milliseconds).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Dict, Optional

import torch

from . import _dtypes as D
from . import _lib as L

_CORRECTION_BITS = {"none": None, "i8": 24, "i16": 32}


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


def attrs_of(manifest: dict) -> Optional[Attrs]:
    """A manifest's attributes, or None for a bundle the torch classes never
    select (no stored state of either kind, an unknown correction)."""
    kinds = {s["encoding"]["kind"] for s in manifest.get("states", [])}
    kinds.discard("elided")
    param = manifest.get("param", {})
    if len(kinds) != 1 or param.get("correction", "none") not in _CORRECTION_BITS:
        return None
    return Attrs(rule=manifest["rule"], dtype=param["dtype"],
                 master_weight_bits=_CORRECTION_BITS[param.get("correction", "none")],
                 quantize=kinds == {"quantized"},
                 arithmetic=manifest.get("arithmetic", "exact"),
                 numerics=manifest.get("numerics", "flashoptim"))


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
                try:
                    with open(m) as f:
                        a = attrs_of(json.load(f))
                except (OSError, ValueError, KeyError, TypeError):
                    continue  # not a bundle this binding selects; the library says why
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
