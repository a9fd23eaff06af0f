"""The one dtype table of the binding: flashopt_dtype codes (flashopt.h),
the manifests' and checkpoints' names, and torch dtypes."""

from __future__ import annotations

import torch

from . import _lib as L

# (flashopt_dtype, name, torch dtype)
TABLE = [
    (L.BF16, "bf16", torch.bfloat16),
    (L.F16, "f16", torch.float16),
    (L.F32, "f32", torch.float32),
    (L.I8, "i8", torch.int8),
    (L.U8, "ui8", torch.uint8),
    (L.I16, "i16", torch.int16),
]
CODE = {t: c for c, _, t in TABLE}  # torch -> flashopt_dtype
NAME = {t: n for _, n, t in TABLE}  # torch -> name
TORCH_OF_CODE = {c: t for c, _, t in TABLE}
TORCH_OF_NAME = {n: t for _, n, t in TABLE}
# Packed 4-bit codes (flashopt_dtype I4/U4, two per byte): held as their
# bytes, torch.uint8, outside TABLE (uint8 is ui8's torch dtype there). A
# buffer of n codes takes (n + 1) // 2 bytes (flashopt_buffer_size);
# _nibbles.py converts between the bytes and one code per element.
PACKED = {L.I4: "i4", L.U4: "ui4"}
TORCH_OF_CODE.update({c: torch.uint8 for c in PACKED})
# Parameter dtypes (the master weight's narrow part, or fp32).
PARAM = (torch.bfloat16, torch.float16, torch.float32)
# Correction-term dtypes (24- and 32-bit master weights).
CORRECTION = (torch.int8, torch.int16)
