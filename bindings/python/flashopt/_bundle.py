"""One libflashopt optimizer ("bundle") per (parameter dtype, device): the
ctypes side of the torch.optim drop-ins. Every optimizer-level C call of the
binding is a method here; the torch classes never build ctypes arguments."""

from __future__ import annotations

import ctypes
import os
import tempfile
from typing import Dict, List, Tuple

import torch

from . import _dtypes as D
from . import _lib as L
from ._specs import MissingBundleError

# Parameter dtypes the optimizers take: torch -> (flashopt_dtype, name).
_DTYPES = {t: (D.CODE[t], D.NAME[t]) for t in D.PARAM}
_TORCH_OF = D.TORCH_OF_CODE

# The hyper-parameter every step kernel has after the rule's own
# (abi/include/flashopt/abi/KernelAbi.h kGradScaleHyper): the gradient is
# multiplied by it inside the kernel.
GRAD_SCALE = "grad_scale"


def _device_key(dev: torch.device):
    if dev.type == "cpu":
        return (L.DEVICE_CPU, 0)
    if dev.type == "cuda":
        return (L.DEVICE_CUDA, dev.index if dev.index is not None else torch.cuda.current_device())
    raise TypeError(f"flashopt: parameters on {dev} are not supported (CPU and CUDA only)")


class _Bundle:
    """One libflashopt optimizer: the parameters of one dtype on one device.

    Every call goes through `self._lib` (tests count them there)."""

    def __init__(self, owner: str, spec: str, dtype: torch.dtype, device: torch.device,
                 mode: str):
        self.spec = spec
        self.dtype = dtype
        self.device = device
        path = L.kernels_dir() / spec
        if not (path / "manifest.json").is_file():
            raise MissingBundleError(f"flashopt: {owner} with {mode}: the bundle {spec!r} "
                                     f"is not in {L.kernels_dir()}")
        self.path = path
        self._lib = L.lib()
        self.handle = None
        h = ctypes.c_void_p()
        self._call("flashopt_optimizer_create", L.context(*_device_key(device)),
                   str(path).encode(), ctypes.byref(h))
        self.handle = h
        info = L.OptimizerInfo()
        self._call("flashopt_optimizer_get_info", h, ctypes.byref(info))
        self.info = info
        self.grad_dtype = _TORCH_OF[info.grad_dtype]
        self.grad_code = info.grad_dtype
        self.hyper_names = set()
        for i in range(info.num_hypers):
            s = ctypes.c_char_p()
            self._call("flashopt_hyper_name", h, i, ctypes.byref(s))
            self.hyper_names.add(s.value.decode())
        self.state_names: List[str] = []  # stored states, torch's names for the shipped rules
        for i in range(info.num_states):
            s = ctypes.c_char_p()
            self._call("flashopt_state_name", h, i, ctypes.byref(s))
            self.state_names.append(s.value.decode())
        self.num_groups = 1
        self.params: List[torch.Tensor] = []
        self.names: List[str] = []  # each parameter's name in checkpoints
        self.global_ids: List[int] = []
        self.groups: List[int] = []
        self.grad_ptrs: List[int] = []
        self.hyper_cache: Dict[tuple, float] = {}
        self._stream = None  # the CUDA stream handle set with flashopt_set_stream
        self._buffers = None  # buffers(), asked of the library once
        self._packed: frozenset = frozenset()  # their packed 4-bit ones

    def _call(self, name: str, *args):
        L.check(getattr(self._lib, name)(*args), name)

    # ---- life --------------------------------------------------------------------
    def close(self):
        if self.handle is not None:
            self._lib.flashopt_optimizer_destroy(self.handle)
            self.handle = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # ---- groups and hyper-parameters -----------------------------------------------
    def ensure_groups(self, n: int):
        while self.num_groups < n:
            g = ctypes.c_int32()
            self._call("flashopt_add_param_group", self.handle, ctypes.byref(g))
            self.num_groups += 1

    def set_hyper(self, group: int, name: str, value: float):
        """flashopt_set_hyper, only when the value changed."""
        key = (group, name)
        if self.hyper_cache.get(key) != value:
            self._call("flashopt_set_hyper", self.handle, group, name.encode(), value)
            self.hyper_cache[key] = value

    def get_hyper(self, group: int, name: str) -> float:
        d = ctypes.c_double()
        self._call("flashopt_get_hyper", self.handle, group, name.encode(), ctypes.byref(d))
        return d.value

    # ---- parameters and gradients ----------------------------------------------------
    def add(self, p: torch.Tensor, group: int, gid: int) -> int:
        self.ensure_groups(group + 1)
        idx = ctypes.c_int64()
        name = f"p{gid}"
        self._call("flashopt_add_param", self.handle, group, name.encode(),
                   ctypes.c_void_p(p.data_ptr()), _DTYPES[p.dtype][0], p.numel(),
                   None, self.grad_code, ctypes.byref(idx))
        self.params.append(p)
        self.names.append(name)
        self.global_ids.append(gid)
        self.groups.append(group)
        self.grad_ptrs.append(0)
        return idx.value

    def add_piece(self, param: torch.Tensor, grad_ptr: int, group: int, gid: int, name: str,
                  element_offset: int) -> int:
        """Registers `param` (flat, contiguous: a view of a shard or a scratch
        buffer) as elements [element_offset, element_offset + numel) of
        parameter `gid` (flashopt_add_param_piece: any address on the CPU)."""
        self.ensure_groups(group + 1)
        idx = ctypes.c_int64()
        self._call("flashopt_add_param_piece", self.handle, group, name.encode(),
                   ctypes.c_void_p(param.data_ptr()), _DTYPES[param.dtype][0], param.numel(),
                   ctypes.c_void_p(grad_ptr) if grad_ptr else None, self.grad_code,
                   int(element_offset), ctypes.byref(idx))
        self.params.append(param)
        self.names.append(name)
        self.global_ids.append(gid)
        self.groups.append(group)
        self.grad_ptrs.append(grad_ptr)
        return idx.value

    def set_grads(self, idx: List[int], ptrs: List[int]):
        """Re-points the gradients of parameters `idx` (one call for all)."""
        if not idx:
            return
        n = len(idx)
        self._call("flashopt_set_grads", self.handle, n, (ctypes.c_int64 * n)(*idx),
                   (ctypes.c_void_p * n)(*ptrs), self.grad_code)
        for i, p in zip(idx, ptrs):
            self.grad_ptrs[i] = p

    def set_grad(self, i: int, g: torch.Tensor):
        ptr = g.data_ptr()
        if ptr != self.grad_ptrs[i]:
            self._call("flashopt_set_grad", self.handle, i, ctypes.c_void_p(ptr),
                       self.grad_code, g.numel())
            self.grad_ptrs[i] = ptr

    # ---- stepping --------------------------------------------------------------------
    def order_after(self, stream) -> bool:
        """Orders this bundle's next launches after the work queued on `stream`
        (torch.cuda.current_stream of the bundle's device; None on the CPU).
        Returns whether the caller must synchronize() after stepping, so that
        torch's later work on `stream` sees the step.

        libflashopt launches on the legacy default stream unless told
        otherwise: that is torch's default stream, so the common case needs
        no synchronization at all. On a side stream, with a library that can
        launch on it (flashopt_set_stream), the launches go there; otherwise
        the stream is drained before and the step awaited after."""
        if stream is None:
            return False
        handle = stream.cuda_stream
        if L.has("flashopt_set_stream"):
            if handle != self._stream:
                self._call("flashopt_set_stream", self.handle, ctypes.c_void_p(handle))
                self._stream = handle
            return False
        if handle == 0:
            return False
        stream.synchronize()
        return True

    def stepping(self, stream, ch_i: List[int], ch_p: List[int], run):
        """The tail of every step, written once: this bundle's launches
        ordered after `stream` (order_after), the gradients of parameters
        `ch_i` re-pointed to `ch_p`, `run()` (the step's calls), then a wait
        where torch's stream must see the step. Returns run()'s result."""
        wait = self.order_after(stream)
        self.set_grads(ch_i, ch_p)
        result = run()
        if wait:
            self.synchronize()
        return result

    def step(self):
        """Steps every parameter (flashopt_step)."""
        self._call("flashopt_step", self.handle)

    def step_param(self, i: int):
        self._call("flashopt_step_param", self.handle, i)

    # ---- externally reduced data parallelism (FSDP2: _dtensor.py) -------------------
    def attach_external(self, comm) -> None:
        """Every step of this bundle agrees over `comm` (a _comm.ProcessGroupComm)."""
        self._call("flashopt_optimizer_attach_comm_external", self.handle, comm.handle)
        self._comm = comm

    def step_external(self, idx: List[int], params: List[int], found_inf: bool,
                      error: str) -> bool:
        """One collective step of this rank's pieces `idx` of the optimizer's
        parameters `params` (global ids; all ranks call it with the same):
        the library's Stepper agrees (an error on any rank raises on every
        rank; found_inf on any rank skips on every rank), steps and counts.
        Returns whether it stepped."""
        n, m = len(idx), len(params)
        stepped = ctypes.c_int32()
        status = self._lib.flashopt_step_external(
            self.handle, (ctypes.c_int64 * max(n, 1))(*idx), n,
            (ctypes.c_int64 * max(m, 1))(*params), m, int(found_inf),
            L.ERROR_INVALID_ARGUMENT if error else L.OK,
            error.encode("utf-8", "replace") if error else None, ctypes.byref(stepped))
        comm = getattr(self, "_comm", None)
        if status != L.OK and comm is not None and comm.error is not None:
            e, comm.error = comm.error, None
            raise RuntimeError(f"flashopt: a collective of the step failed: {e}") from e
        L.check(status, "flashopt_step_external")
        return bool(stepped.value)

    def external_step(self, param: int) -> int:
        """The steps the optimizer's parameter `param` (a global id) took."""
        t = ctypes.c_int64()
        self._call("flashopt_get_external_step", self.handle, param, ctypes.byref(t))
        return t.value

    def set_external_step(self, param: int, step: int) -> None:
        self._call("flashopt_set_external_step", self.handle, param, step)

    def synchronize(self):
        self._call("flashopt_synchronize", self.handle)

    def get_step(self, index: int) -> int:
        t = ctypes.c_int64()
        self._call("flashopt_get_step", self.handle, index, ctypes.byref(t))
        return t.value

    # ---- reports -----------------------------------------------------------------------
    def memory(self) -> L.MemoryReport:
        r = L.MemoryReport()
        self._call("flashopt_memory_report_get", self.handle, ctypes.byref(r))
        return r

    def check_numerics(self) -> L.NumericsReport:
        """The report; raises NumericsError (with it) when the library flags a
        parameter."""
        r = L.NumericsReport()
        st = self._lib.flashopt_check_numerics(self.handle, ctypes.byref(r))
        if st == L.ERROR_NUMERICS:
            raise L.NumericsError(st, L.last_error(), r)
        L.check(st, "flashopt_check_numerics")
        return r

    # ---- master weights ------------------------------------------------------------------
    def export_master(self, i: int) -> torch.Tensor:
        """Parameter i's fp32 master weight, flat, in host memory."""
        out = torch.empty(self.params[i].numel(), dtype=torch.float32)
        self._call("flashopt_export_master_f32", self.handle, i,
                   ctypes.c_void_p(out.data_ptr()), out.numel())
        return out

    def buffers(self) -> List[Tuple[str, str, torch.dtype]]:
        """The library-owned buffers of each parameter (correction term,
        codes, scales, unquantized states) as (name, "element" or "group",
        dtype), in the manifest's order, as the library describes them.
        Packed 4-bit codes (FLASHOPT_I4/U4: `packed`) are torch.uint8 here,
        their bytes; one code per element wherever the binding holds them
        unpacked (_nibbles.py)."""
        if self._buffers is None:
            n = ctypes.c_int32()
            self._call("flashopt_num_buffers", self.handle, ctypes.byref(n))
            out, packed = [], set()
            for k in range(n.value):
                d = L.BufferDesc()
                self._call("flashopt_get_buffer_desc", self.handle, k, ctypes.byref(d))
                name = d.name.decode()
                if d.dtype in D.PACKED:
                    packed.add(name)
                out.append((name, "group" if d.per_group else "element",
                            D.TORCH_OF_CODE[d.dtype]))
            self._packed = frozenset(packed)
            self._buffers = out
        return self._buffers

    @property
    def packed(self) -> frozenset:
        """The names of the buffers holding packed 4-bit codes."""
        self.buffers()
        return self._packed

    def buffer_size(self, i: int, name: str) -> int:
        """Bytes of parameter i's buffer `name` (flashopt_buffer_size: packed
        4-bit codes take (n + 1) // 2)."""
        size = ctypes.c_size_t()
        self._call("flashopt_buffer_size", self.handle, i, name.encode(), ctypes.byref(size))
        return size.value

    def read_buffer(self, i: int, name: str) -> torch.Tensor:
        """Parameter i's buffer `name` (buffers()) as stored, flat, in host
        memory: its elements in their dtype, or for packed 4-bit codes their
        (n + 1) // 2 bytes (_nibbles.unpack gives one code per element)."""
        for n, _, dt in self.buffers():
            if n == name:
                size = self.buffer_size(i, name)
                esize = torch.empty((), dtype=dt).element_size()
                out = torch.empty(size // esize, dtype=dt)
                self._call("flashopt_read_buffer", self.handle, i, name.encode(),
                           ctypes.c_void_p(out.data_ptr()), size)
                return out
        raise KeyError(f"flashopt: {self.spec} has no buffer {name!r}")

    def write_buffer(self, i: int, name: str, value: torch.Tensor):
        """Overwrites parameter i's buffer `name` with `value`'s bits (its
        dtype and size: packed bytes for 4-bit codes, whose pad nibble the
        library clears)."""
        v = value.detach().to("cpu").contiguous()
        self._call("flashopt_write_buffer", self.handle, i, name.encode(),
                   ctypes.c_void_p(v.data_ptr()), v.numel() * v.element_size())

    def export_state(self, i: int, name: str) -> torch.Tensor:
        """Parameter i's state `name` decoded to fp32, flat, in host memory."""
        out = torch.empty(self.params[i].numel(), dtype=torch.float32)
        self._call("flashopt_export_state_f32", self.handle, i, name.encode(),
                   ctypes.c_void_p(out.data_ptr()), out.numel())
        return out

    def import_state(self, i: int, name: str, value: torch.Tensor):
        """Encodes fp32 values (any shape of parameter i's numel) into its state `name`."""
        v = value.detach().to(device="cpu", dtype=torch.float32).contiguous().reshape(-1)
        self._call("flashopt_import_state_f32", self.handle, i, name.encode(),
                   ctypes.c_void_p(v.data_ptr()), v.numel())

    def import_master(self, i: int, value: torch.Tensor):
        v = value.detach().to(device="cpu", dtype=torch.float32).contiguous()
        n = self.params[i].numel()
        if v.numel() != n:
            raise ValueError(f"flashopt: import_master: {v.numel()} values for a parameter of "
                             f"{n}")
        self._call("flashopt_import_master_f32", self.handle, i,
                   ctypes.c_void_p(v.data_ptr()), v.numel())

    # ---- checkpoints ---------------------------------------------------------------------
    def save(self, path: str, fmt: int):
        self._call("flashopt_save_checkpoint", self.handle, str(path).encode(), fmt)

    def load(self, path: str):
        self._call("flashopt_load_checkpoint", self.handle, str(path).encode())
        self._after_load()

    def _after_load(self):
        self.hyper_cache.clear()  # the checkpoint set them
        self.grad_ptrs = [0] * len(self.params)

    # The one place that chooses between in-memory checkpoints (the C entry
    # points flashopt_{save,load}_checkpoint_buffer, when the library has
    # them) and a temporary file.
    def checkpoint_bytes(self, fmt: int) -> bytes:
        """A checkpoint of this bundle (safetensors bytes) in format `fmt`."""
        if L.has("flashopt_save_checkpoint_buffer"):
            data, size = ctypes.c_void_p(), ctypes.c_size_t()
            self._call("flashopt_save_checkpoint_buffer", self.handle, fmt,
                       ctypes.byref(data), ctypes.byref(size))
            try:
                return ctypes.string_at(data, size.value)
            finally:
                self._lib.flashopt_buffer_free(data)
        with tempfile.TemporaryDirectory(prefix="flashopt-sd-") as tmp:
            path = os.path.join(tmp, "bundle.safetensors")
            self.save(path, fmt)
            with open(path, "rb") as f:
                return f.read()

    def load_checkpoint_bytes(self, data: bytes):
        """Loads checkpoint bytes (validated fully before anything changes)."""
        if L.has("flashopt_load_checkpoint_buffer"):
            self._call("flashopt_load_checkpoint_buffer", self.handle, data, len(data))
            self._after_load()
            return
        with tempfile.TemporaryDirectory(prefix="flashopt-sd-") as tmp:
            path = os.path.join(tmp, "bundle.safetensors")
            with open(path, "wb") as f:
                f.write(data)
            self.load(path)


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
