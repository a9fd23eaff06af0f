"""ProcessGroupComm: a libflashopt communicator (flashopt_comm_backend,
flashopt_dist.h) whose collectives are a torch.distributed process group's.
The externally reduced data parallelism of FSDP2 (_dtensor.py) uses it for
the steps' agreement, which the library's train::Stepper makes
(flashopt_step_external): the binding agrees, decides and counts nothing.

The library calls the collectives from flashopt_step_external, on the
calling thread (ctypes takes the GIL back for the callback); a failure is
kept and re-raised by the caller after the library returns the error."""

from __future__ import annotations

import ctypes
from typing import Optional

import torch
import torch.distributed as dist

from . import _lib as L


class ProcessGroupComm:
    """A communicator handle over `group` (rank `rank` of `size`); host bytes
    move through tensors on `device` (the group's: CPU for gloo, CUDA for
    NCCL)."""

    def __init__(self, group, rank: int, size: int, device: torch.device):
        self.group, self.rank, self.size = group, rank, size
        self.device = device
        self.error: Optional[BaseException] = None  # of the last failed collective
        # The callbacks and the table must outlive the handle.
        self._all_gather = L.COMM_COLLECTIVE(self._gather)
        self._all_to_all = L.COMM_COLLECTIVE(self._to_all)
        self._broadcast = L.COMM_BROADCAST(self._bcast)
        self._backend = L.CommBackend(
            abi_version=L.ABI_VERSION, name=b"torch.distributed", rank=rank, size=size,
            self=None, all_gather=self._all_gather, all_to_all=self._all_to_all,
            broadcast=self._broadcast)
        h = ctypes.c_void_p()
        L.check(L.lib().flashopt_comm_create(ctypes.byref(self._backend), ctypes.byref(h)),
                "flashopt_comm_create")
        self.handle = h

    def close(self):
        if self.handle is not None and self.handle.value:
            L.lib().flashopt_comm_destroy(self.handle)
            self.handle = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # ---- the collectives (called by the library) -------------------------------------
    def _tensor(self, ptr: int, nbytes: int) -> torch.Tensor:
        host = torch.empty(nbytes, dtype=torch.uint8)
        if nbytes:
            ctypes.memmove(host.data_ptr(), ptr, nbytes)
        return host.to(self.device)

    @staticmethod
    def _copy_out(t: torch.Tensor, ptr: int):
        host = t.cpu().contiguous()
        if host.numel():
            ctypes.memmove(ptr, host.data_ptr(), host.numel())

    def _guarded(self, fn) -> int:
        try:
            fn()
            return 0
        except BaseException as e:  # noqa: BLE001 (reported through the library)
            self.error = e
            return 1

    def _gather(self, _self, send, recv, nbytes) -> int:
        def run():
            out = torch.empty(self.size * nbytes, dtype=torch.uint8, device=self.device)
            if self.size == 1:
                out.copy_(self._tensor(send, nbytes))
            else:
                dist.all_gather_into_tensor(out, self._tensor(send, nbytes), group=self.group)
            self._copy_out(out, recv)
        return self._guarded(run)

    def _to_all(self, _self, send, recv, nbytes) -> int:
        def run():
            out = torch.empty(self.size * nbytes, dtype=torch.uint8, device=self.device)
            src = self._tensor(send, self.size * nbytes)
            if self.size == 1:
                out.copy_(src)
            else:
                dist.all_to_all_single(out, src, group=self.group)
            self._copy_out(out, recv)
        return self._guarded(run)

    def _bcast(self, _self, buf, nbytes, root) -> int:
        def run():
            t = self._tensor(buf, nbytes)
            if self.size > 1:
                dist.broadcast(t, group=self.group,
                               src=dist.get_global_rank(self.group, int(root)))
            self._copy_out(t, buf)
        return self._guarded(run)
