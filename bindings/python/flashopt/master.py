"""fp32 master weights from a 16-bit parameter and its correction term, and
back, without an optimizer (docs/NUMERICS.md §1): the library's codec
(flashopt_decode_master_f32 / flashopt_encode_master_f32), the same bits as
the kernels and opt.export_master().

    w32 = flashopt.decode_master(param, correction)     # e.g. for an inference export
    param, correction = flashopt.encode_master(w32, torch.bfloat16, master_weight_bits=24)

The correction term of a parameter in a flashopt state dict is its
"correction" entry (state_dict()["state"][i]["correction"]).
"""

from __future__ import annotations

import ctypes
from typing import Optional, Tuple

import torch

from . import _dtypes as D
from . import _lib as L

_PARAM = {t: D.CODE[t] for t in D.PARAM}
_CORR = {t: D.CODE[t] for t in D.CORRECTION}


def _host(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu").contiguous()


def decode_master(param: torch.Tensor, correction: Optional[torch.Tensor]) -> torch.Tensor:
    """The fp32 master weight of `param` (bf16, f16 or f32) and its
    correction term (int8 for 24-bit masters, int16 for 32-bit; None: the
    parameter alone), shaped like `param`, on its device."""
    if param.dtype not in _PARAM:
        raise TypeError(f"flashopt: decode_master: the parameter is {param.dtype}, not bf16, "
                        f"f16 or f32")
    p = _host(param)
    c = None
    if correction is not None:
        if correction.dtype not in _CORR:
            raise TypeError(f"flashopt: decode_master: the correction term is "
                            f"{correction.dtype}, not int8 (24-bit masters) or int16 (32-bit)")
        if correction.numel() != param.numel():
            raise ValueError(f"flashopt: decode_master: {correction.numel()} correction values "
                             f"for a parameter of {param.numel()}")
        c = _host(correction)
    out = torch.empty(p.shape, dtype=torch.float32)
    L.call("flashopt_decode_master_f32", _PARAM[p.dtype], ctypes.c_void_p(p.data_ptr()),
           _CORR[c.dtype] if c is not None else L.I8,
           ctypes.c_void_p(c.data_ptr()) if c is not None else None, p.numel(),
           ctypes.c_void_p(out.data_ptr()))
    return out.to(param.device)


def encode_master(master: torch.Tensor, dtype: torch.dtype = torch.bfloat16,
                  master_weight_bits: Optional[int] = 24
                  ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(parameter, correction term) of fp32 master weights: the parameter is
    their round-to-nearest-even narrowing to `dtype`, the correction term
    (int8 for master_weight_bits=24, int16 for 32, None for None or an fp32
    `dtype`) encodes the rest. On the master's device."""
    if dtype not in _PARAM:
        raise TypeError(f"flashopt: encode_master: dtype {dtype} is not bf16, f16 or f32")
    if master_weight_bits not in (None, 24, 32):
        raise ValueError(f"flashopt: encode_master: master_weight_bits must be None, 24 or 32, "
                         f"not {master_weight_bits!r}")
    m = master.detach().to("cpu", torch.float32).contiguous()
    p = torch.empty(m.shape, dtype=dtype)
    c = None
    if dtype != torch.float32 and master_weight_bits is not None:
        c = torch.empty(m.shape, dtype=torch.int8 if master_weight_bits == 24 else torch.int16)
    L.call("flashopt_encode_master_f32", ctypes.c_void_p(m.data_ptr()), m.numel(),
           _PARAM[dtype], ctypes.c_void_p(p.data_ptr()),
           _CORR[c.dtype] if c is not None else L.I8,
           ctypes.c_void_p(c.data_ptr()) if c is not None else None)
    dev = master.device
    return p.to(dev), (c.to(dev) if c is not None else None)
