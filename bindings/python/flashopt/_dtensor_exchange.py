"""How the ranks of a ShardedParams (_dtensor.py) exchange the elements of
their split groups (the scheme: _dtensor_layout.py).

Each rank sends one buffer (Packing): per halo parameter and per field
(gradient, parameter, or a state buffer when loading) its parts of its first
and last split groups as float32; one all_gather_into_tensor gives every
rank every buffer (Ranks.exchange), and fill() assembles a split group from
them. What the ranks must agree on before a step is not here: the library's
Stepper agrees on it (flashopt_step_external, over _comm.py).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from ._dtensor_layout import Layout, Piece

def _align8(n: int) -> int:
    return (n + 7) // 8 * 8


class Packing:
    """Byte offsets of the buffer every rank sends in an exchange: per halo
    layout and per field the rank's parts of its first and last split groups
    (<= G - 1 elements each), as float32 (it holds every param, gradient,
    code, scale and correction dtype exactly)."""

    def __init__(self, layouts: List[Layout], fields: int):
        self.offsets: Dict[Tuple[int, int, int], int] = {}
        at = 0
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


class Ranks:
    """This rank's place on the optimizer's 1-D device mesh: the process
    group, this rank, the world size W, and the device of the local shards
    (where the exchange's buffers live; set at the first registration)."""

    def __init__(self, mesh):
        self.mesh = mesh
        self.group = mesh.get_group()
        self.rank, self.W = mesh.get_local_rank(), mesh.size()
        self.device: Optional[torch.device] = None

    def exchange(self, layouts: List[Layout], fields: List[List[Optional[torch.Tensor]]],
                 packing: Packing) -> torch.Tensor:
        """All ranks' buffers (W, bytes): each halo layout's split-group
        parts of each field (fields[layout][field]: its flat own elements,
        or None to send zeros). Collective."""
        dev = self.device if self.device is not None else torch.device("cpu")
        send = torch.zeros(packing.bytes, dtype=torch.uint8, device=dev)
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
