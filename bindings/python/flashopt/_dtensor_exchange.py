"""How the ranks of a ShardedParams (_dtensor.py) exchange the elements of
their split groups and agree on a step (the scheme: _dtensor_layout.py).

Each rank sends one buffer (Packing): a header, then per halo parameter and
per field (gradient, parameter, or a state buffer when loading) its parts of
its first and last split groups as float32; one all_gather_into_tensor gives
every rank every buffer (Ranks.exchange), and fill() assembles a split group
from them. A step's header carries what the ranks must agree on before any
of them steps (GradScaler's found_inf, which parameters have gradients, a
signature of the hyper-parameters, a local error): agree() checks the
headers alike on every rank.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from ._dtensor_layout import Layout, Piece

HEADER = 256  # bytes of each rank's step header (flags, signature, error text)
_ERROR_BYTES = 200


def _align8(n: int) -> int:
    return (n + 7) // 8 * 8


class Packing:
    """Byte offsets of the buffer every rank sends in an exchange: a header
    of `header` bytes, then per halo layout and per field the rank's parts of
    its first and last split groups (<= G - 1 elements each), as float32 (it
    holds every param, gradient, code, scale and correction dtype exactly)."""

    def __init__(self, layouts: List[Layout], fields: int, header: int):
        self.offsets: Dict[Tuple[int, int, int], int] = {}
        at = header
        for li, lay in enumerate(layouts):
            if not lay.halo:
                continue
            for fi in range(fields):
                for k in (0, 1):
                    self.offsets[(li, fi, k)] = at
                    at += _align8(4 * (lay.G - 1))
        self.bytes = _align8(max(at, 8))


def _bytes_of(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


# ---- the step header -------------------------------------------------------------------
def _hyper_signature(hypers: Tuple[List[Dict[str, float]], float]) -> bytes:
    groups, grad_scale = hypers
    vals = [sorted(h.items()) for h in groups]
    return hashlib.blake2b(repr((vals, grad_scale)).encode(), digest_size=8).digest()


def header(go: bool, hypers: Tuple[List[Dict[str, float]], float], err: str,
           present: List[int]) -> bytes:
    """This rank's step header: whether it steps (GradScaler), the
    signature of `hypers` (every group's kernel hyper-parameters and the
    gradient scale: StepHooks.hypers), which parameters have a gradient,
    and its error text."""
    body = struct.pack("<q", 1 if go else 0) + _hyper_signature(hypers)
    pres = hashlib.blake2b(bytes(present), digest_size=8).digest()
    e = err.encode("utf-8", "replace")[:_ERROR_BYTES]
    out = body + pres + struct.pack("<q", sum(present)) + struct.pack("<q", len(e)) + e
    return out + b"\0" * (HEADER - len(out))


def _parse(h: bytes):
    go = struct.unpack_from("<q", h, 0)[0]
    hyp = h[8:16]
    pres = h[16:24]
    npres = struct.unpack_from("<q", h, 24)[0]
    ne = struct.unpack_from("<q", h, 32)[0]
    err = h[40:40 + ne].decode("utf-8", "replace")
    return go, hyp, pres, npres, err


class Ranks:
    """This rank's place on the optimizer's 1-D device mesh: the process
    group, this rank, the world size W, and the device of the local shards
    (where the exchange's buffers live; set at the first registration)."""

    def __init__(self, mesh):
        self.mesh = mesh
        self.group = mesh.get_group()
        self.rank, self.W = mesh.get_local_rank(), mesh.size()
        self.device: Optional[torch.device] = None

    def exchange(self, header: bytes, layouts: List[Layout],
                 fields: List[List[Optional[torch.Tensor]]], packing: Packing) -> torch.Tensor:
        """All ranks' buffers (W, bytes): the header, then each halo layout's
        split-group parts of each field (fields[layout][field]: its flat own
        elements, or None to send zeros). Collective."""
        dev = self.device if self.device is not None else torch.device("cpu")
        send = torch.zeros(packing.bytes, dtype=torch.uint8, device=dev)
        if header:
            send[:len(header)] = torch.frombuffer(bytearray(header), dtype=torch.uint8).to(dev)
        for li, lay in enumerate(layouts):
            if not lay.halo or lay.n == 0:
                continue
            for fi, own in enumerate(fields[li]):
                if own is None:
                    continue
                for k, part in enumerate(lay.parts[self.rank]):
                    if part is None:
                        continue
                    x, y = part
                    at = packing.offsets[(li, fi, k)]
                    send[at:at + 4 * (y - x)] = _bytes_of(own[x - lay.s:y - lay.s].float())
        recv = torch.empty(self.W * packing.bytes, dtype=torch.uint8, device=dev)
        if self.W == 1:
            recv.copy_(send)
        else:
            dist.all_gather_into_tensor(recv, send, group=self.group)
        return recv.view(self.W, packing.bytes)

    def fill(self, lay: Layout, li: int, fi: int, own: torch.Tensor, recv: torch.Tensor,
             packing: Packing, piece: Piece, dest: torch.Tensor):
        """dest (a split group's elements of field fi) from this rank's own
        elements and the other ranks' parts."""
        for q, x, y, slot in lay.segments(piece.start, piece.end):
            if q == self.rank:
                dest[x - piece.start:y - piece.start] = own[x - lay.s:y - lay.s]
            else:
                at = packing.offsets[(li, fi, slot)]
                dest[x - piece.start:y - piece.start] = recv[q, at:at + 4 * (y - x)].view(
                    torch.float32)

    def agree(self, recv: torch.Tensor):
        """The ranks' step headers, with the checks every rank makes alike."""
        heads = [_parse(recv[q, :HEADER].cpu().numpy().tobytes()) for q in range(self.W)]
        for q, h in enumerate(heads):
            if h[4]:
                raise RuntimeError(f"flashopt: rank {q} could not step: {h[4]}; nothing was "
                                   "stepped on any rank")
        for q in range(1, self.W):
            if heads[q][2] != heads[0][2] or heads[q][3] != heads[0][3]:
                raise RuntimeError(
                    f"flashopt: ranks 0 and {q} have gradients for different parameters "
                    f"({heads[0][3]} and {heads[q][3]} of them); every rank steps the same "
                    "parameters. Nothing was stepped on any rank")
            if heads[q][1] != heads[0][1]:
                raise RuntimeError(
                    f"flashopt: the hyper-parameters (lr, betas, weight decay, ..., "
                    f"GradScaler's scale) differ between ranks 0 and {q}; nothing was "
                    "stepped on any rank")
        return heads
