"""Where a DTensor parameter's elements are: the placement checks, the rows
torch.chunk gives each rank, and the pieces a rank registers with libflashopt
(Layout). ShardedParams (_dtensor.py) steps them; _dtensor_exchange.py moves
the split groups' elements between the ranks.

Numerics that do not depend on the world size. A parameter's quantization
groups are those of one process: groups of G (32) consecutive elements of the
FULL flattened tensor, and every element's dither index is its index in the
full tensor (docs/NUMERICS.md §8.3). FSDP2 gives each rank whole rows (split
as torch.chunk splits dim 0), so a shard starts and ends anywhere in the flat
index. Each rank registers its shard with libflashopt as at most three pieces
(flashopt_add_param_piece, each with its offset in the full tensor):

- the group-aligned middle: a zero-copy view of the local shard (parameter
  and gradient);
- at each end whose group other ranks hold part of (a "split" group), that
  whole group: scratch parameter and gradient buffers of <= G elements, with
  their own correction and state slices in the library.

A split group is stepped redundantly, by every rank that holds part of it,
from the same inputs: before each step the ranks exchange the <= G - 1
elements (gradient and parameter) they hold of their split groups, in one
all_gather_into_tensor of a packed buffer for all parameters (plus a small
header through which the ranks agree on the step: GradScaler's found_inf,
which parameters have gradients, the hyper-parameters, local errors). The
correction terms and states of a split group are identical on its ranks by
construction (same inputs, same bits); after the step each rank copies back
only its own elements. A step is then the single-process step, bit for bit,
for any world size and any shard boundaries (uneven shards and ranks holding
zero rows included); the cost is <= 2 groups of scratch per parameter per
rank and one small collective per step (none for the halo when every
boundary falls on a group boundary, e.g. rows of a multiple of 32 elements).
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch

from ._bundle import _Bundle


def dtensor_types():
    from torch.distributed.tensor import DTensor, Replicate, Shard
    return DTensor, Replicate, Shard


def placement_error(p, where: str) -> Optional[str]:
    """Why DTensor parameter `p` cannot be stepped (None: it can). Depends on
    global metadata only (mesh, placements, dtype), so every rank reaches the
    same verdict without communicating."""
    DTensor, Replicate, Shard = dtensor_types()
    mesh = p.device_mesh
    if mesh.ndim != 1:
        return (f"flashopt: {where} is a DTensor on a {mesh.ndim}-D device mesh "
                f"(placements {tuple(p.placements)!r}); flashopt steps DTensor parameters on a "
                "1-D mesh only (FSDP2's fully_shard over one mesh dimension, or Replicate). "
                "HSDP and tensor + data parallelism are not supported")
    pl = p.placements[0]
    if type(pl) is Shard and pl.dim == 0:
        if p.ndim == 0:
            return f"flashopt: {where} is a 0-dim DTensor sharded on dim 0"
        return None
    if type(pl) is Replicate:
        return None
    return (f"flashopt: {where} has placement {pl!r}; flashopt steps "
            "DTensor parameters placed Shard(0) (FSDP2's fully_shard) or Replicate only. "
            "Other shardings (e.g. Shard(1) or a strided shard from tensor parallelism) "
            "would split quantization groups across ranks in ways flashopt does not "
            "reconstruct; they are not supported")


def chunk_rows(R: int, W: int, q: int) -> Tuple[int, int]:
    """Rows [a, b) of rank q when torch.chunk splits R rows into W pieces
    (chunks of ceil(R / W); the last ranks may get fewer or none)."""
    cs = -(-R // W) if R else 0
    return min(q * cs, R), min((q + 1) * cs, R)


def _split_parts(s: int, e: int, N: int, G: int):
    """A rank's elements [s, e): its parts of its first and last groups when
    other ranks hold part of them ((a, b) global ranges, or None)."""
    if e <= s:
        return None, None
    kf, kl = s // G, (e - 1) // G
    gf, gl = min(kf * G + G, N), min(kl * G + G, N)
    first = (s, min(e, gf)) if (s > kf * G or e < gf) else None
    last = (max(s, kl * G), e) if (kl != kf and (e < gl or s > kl * G)) else None
    return first, last


class Piece:
    """One library tensor of a parameter: elements [start, end) of the full
    tensor; `scratch`: a split group held whole (param and grad are scratch
    buffers), else a view of the local shard."""

    __slots__ = ("index", "start", "end", "scratch", "param", "grad", "name")

    def __init__(self, start, end, scratch, param, grad, name):
        self.index = -1
        self.start, self.end, self.scratch = start, end, scratch
        self.param, self.grad, self.name = param, grad, name


class Layout:
    """Where a parameter's elements are on every rank, and this rank's pieces.

    Also used for a plain (single-process) parameter: one rank holding all
    of it as one piece (from_plain), to load DCP's full-state exports."""

    def __init__(self, gid: int, gi: int, shape, N: int, G: int, ranges, rank: int):
        self.gid, self.gi, self.G = gid, gi, G
        self.shape, self.N = tuple(shape), N
        self.R = self.shape[0] if self.shape else 1
        self.L = N // self.R if self.R else 1  # elements per row of dim 0
        self.ranges, self.rank = ranges, rank
        self.s, self.e = ranges[rank]
        self.n = self.e - self.s
        self.parts = [_split_parts(a, b, N, G) for a, b in ranges]
        self.halo = any(f is not None or l is not None for f, l in self.parts)
        self.pieces: List[Piece] = []
        self.p = None
        self.bundle: Optional[_Bundle] = None
        self.local_ptr = 0

    @classmethod
    def from_plain(cls, gid, shape, N, G):
        return cls(gid, 0, shape, N, G, [(0, N)], 0)

    # ---- geometry ------------------------------------------------------------
    def group_end(self, k: int) -> int:
        return min(k * self.G + self.G, self.N)

    def own_groups(self) -> Tuple[int, int]:
        """The groups [kf, kl] this rank holds elements of."""
        return self.s // self.G, (self.e - 1) // self.G

    @property
    def step(self) -> int:
        """The steps this parameter took: the library's count
        (flashopt_get_external_step), also on a rank that holds none of it."""
        return self.bundle.external_step(self.gid)

    def piece_ranges(self) -> List[Tuple[int, int, bool]]:
        """(start, end, scratch) of this rank's pieces, in order."""
        if self.n == 0:
            return []
        first, last = self.parts[self.rank]
        kf, kl = self.own_groups()
        out = []
        if first is not None:
            out.append((kf * self.G, self.group_end(kf), True))
        m0 = self.group_end(kf) if first is not None else self.s
        m1 = kl * self.G if (last is not None or (first is not None and kl == kf)) else self.e
        if m1 > m0:
            out.append((m0, m1, False))
        if last is not None:
            out.append((kl * self.G, self.group_end(kl), True))
        return out

    def segments(self, a: int, b: int):
        """The ranks holding elements of [a, b): (rank, x, y, slot) with slot
        0 (the rank's first split group) or 1 (its last)."""
        out = []
        for q, (sq, eq) in enumerate(self.ranges):
            x, y = max(a, sq), min(b, eq)
            if x >= y:
                continue
            first, last = self.parts[q]
            slot = 0 if first is not None and first[0] == x else 1
            out.append((q, x, y, slot))
        return out

    def row_groups(self, r0: int, r1: int):
        """For rows [r0, r1): each row's first group and group count."""
        i = torch.arange(r0, r1, dtype=torch.int64)
        first = (i * self.L) // self.G
        last = ((i + 1) * self.L - 1) // self.G
        return first, last - first + 1

    def table_width(self) -> int:
        """K: the most groups any row touches (the scale table's columns)."""
        _, count = self.row_groups(0, min(self.R, self.G))
        return int(count.max()) if count.numel() else 1

    def own_rows(self) -> Tuple[int, int]:
        return self.s // self.L if self.L else 0, self.e // self.L if self.L else 0
