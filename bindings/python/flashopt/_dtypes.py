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
# Parameter dtypes (the master weight's narrow part, or fp32).
PARAM = (torch.bfloat16, torch.float16, torch.float32)
# Correction-term dtypes (24- and 32-bit master weights).
CORRECTION = (torch.int8, torch.int16)
