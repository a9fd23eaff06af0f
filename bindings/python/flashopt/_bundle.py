"""One libflashopt optimizer ("bundle") per (parameter dtype, device): the
ctypes side of the torch.optim drop-ins in optim.py."""

from __future__ import annotations

import ctypes
from typing import Dict, List

import torch

from . import _lib as L

_DTYPES = {
    torch.bfloat16: (L.BF16, "bf16"),
    torch.float16: (L.F16, "f16"),
    torch.float32: (L.F32, "f32"),
}
_TORCH_OF = {L.BF16: torch.bfloat16, L.F16: torch.float16, L.F32: torch.float32,
             L.I8: torch.int8, L.U8: torch.uint8, L.I16: torch.int16}


class MissingBundleError(FileNotFoundError):
    """No generated bundle for the requested (rule, dtype, master weight, states)."""


def _device_key(dev: torch.device):
    if dev.type == "cpu":
        return (L.DEVICE_CPU, 0)
    if dev.type == "cuda":
        return (L.DEVICE_CUDA, dev.index if dev.index is not None else torch.cuda.current_device())
    raise TypeError(f"flashopt: parameters on {dev} are not supported (CPU and CUDA only)")


class _Bundle:
    """One libflashopt optimizer: the parameters of one dtype on one device."""

    def __init__(self, owner: str, spec: str, dtype: torch.dtype, device: torch.device,
                 mode: str):
        self.spec = spec
        self.dtype = dtype
        self.device = device
        path = L.kernels_dir() / spec
        if not (path / "manifest.json").is_file():
            rule = spec.split("_", 1)[0]
            have = sorted(p.name for p in L.kernels_dir().glob(rule + "_*")
                          if (p / "manifest.json").is_file())
            raise MissingBundleError(
                f"flashopt: {owner} with {mode} needs the bundle '{spec}' "
                f"(specs/{spec}.json), which is not in {L.kernels_dir()}: there is no such "
                f"generated optimizer. Choose another master_weight_bits/quantize, or write "
                f"specs/{spec}.json (docs/SPEC.md) and rebuild. Bundles of this rule: "
                f"{', '.join(have) if have else 'none'}")
        self.path = path
        dk = _device_key(device)
        ctx = L.context(*dk)
        h = ctypes.c_void_p()
        L.call("flashopt_optimizer_create", ctx, str(path).encode(), ctypes.byref(h))
        self.handle = h
        info = L.OptimizerInfo()
        L.call("flashopt_optimizer_get_info", h, ctypes.byref(info))
        self.info = info
        self.grad_dtype = _TORCH_OF[info.grad_dtype]
        self.grad_code = info.grad_dtype
        self.hyper_names = set()
        for i in range(info.num_hypers):
            s = ctypes.c_char_p()
            L.call("flashopt_hyper_name", h, i, ctypes.byref(s))
            self.hyper_names.add(s.value.decode())
        self.num_groups = 1
        self.params: List[torch.Tensor] = []
        self.global_ids: List[int] = []
        self.groups: List[int] = []
        self.grad_ptrs: List[int] = []
        self.hyper_cache: Dict[tuple, float] = {}
        self._lib = L.lib()

    def close(self):
        if self.handle is not None and L._lib is not None:
            L._lib.flashopt_optimizer_destroy(self.handle)
            self.handle = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def ensure_groups(self, n: int):
        while self.num_groups < n:
            g = ctypes.c_int32()
            L.call("flashopt_add_param_group", self.handle, ctypes.byref(g))
            self.num_groups += 1

    def set_hyper(self, group: int, name: str, value: float):
        key = (group, name)
        if self.hyper_cache.get(key) != value:
            L.check(self._lib.flashopt_set_hyper(self.handle, group, name.encode(), value),
                    "flashopt_set_hyper")
            self.hyper_cache[key] = value

    def add(self, p: torch.Tensor, group: int, gid: int) -> int:
        self.ensure_groups(group + 1)
        idx = ctypes.c_int64()
        L.call("flashopt_add_param", self.handle, group, f"p{gid}".encode(),
               ctypes.c_void_p(p.data_ptr()), _DTYPES[p.dtype][0], p.numel(),
               None, self.grad_code, ctypes.byref(idx))
        self.params.append(p)
        self.global_ids.append(gid)
        self.groups.append(group)
        self.grad_ptrs.append(0)
        return idx.value

    def get_step(self, index: int) -> int:
        t = ctypes.c_int64()
        L.call("flashopt_get_step", self.handle, index, ctypes.byref(t))
        return t.value

    def memory(self) -> L.MemoryReport:
        r = L.MemoryReport()
        L.call("flashopt_memory_report_get", self.handle, ctypes.byref(r))
        return r

    def save(self, path: str, fmt: int):
        L.call("flashopt_save_checkpoint", self.handle, str(path).encode(), fmt)

    def load(self, path: str):
        L.call("flashopt_load_checkpoint", self.handle, str(path).encode())
        self.hyper_cache.clear()  # the checkpoint set them
        self.grad_ptrs = [0] * len(self.params)


def _is_dtensor(t) -> bool:
    try:
        from torch.distributed.tensor import DTensor  # torch >= 2.4
    except Exception:  # pragma: no cover
        try:
            from torch.distributed._tensor import DTensor
        except Exception:
            return False
    return isinstance(t, DTensor)


def _float(v) -> float:
    if isinstance(v, torch.Tensor):
        return float(v.item())
    return float(v)
