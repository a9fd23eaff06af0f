"""DTensor parameters: FSDP2 (`torch.distributed.fsdp.fully_shard`, placement
Shard(0)) and Replicate, on a 1-D device mesh.

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

Distributed checkpoints (torch.distributed.checkpoint, DCP): state_dict()
gives, per parameter, "step", "flashopt.spec" (the bundle) and the exact
compressed states as DTensors with the parameter's global shape and
placement (codes, correction terms, fp32 states), built with
DTensor.from_local(shape=, stride=) so uneven shards work, and no gather.
Scales are per group of the full tensor, which torch.chunk does not split
like the rows; they are saved as a table with one row per parameter row (K
columns: the scales of the groups that row touches, zero-padded), sharded
like the rows, so DCP reshards it exactly to any world size. Loading takes
each rank's rows, exchanges the split groups' codes, and loads the library
pieces. docs/PYTHON.md "FSDP2 and DCP" has the costs.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from . import _lib as L
from . import _state
from ._bundle import _DTYPES, _Bundle, _float

# A parameter's entries in the state dict besides its states.
SPEC_KEY = "flashopt.spec"
STEP_KEY = "step"

_HEADER = 256  # bytes of each rank's step header (flags, signature, error text)
_ERROR_BYTES = 200


def _types():
    from torch.distributed.tensor import DTensor, Replicate, Shard
    return DTensor, Replicate, Shard


def placement_error(p, where: str) -> Optional[str]:
    """Why DTensor parameter `p` cannot be stepped (None: it can). Depends on
    global metadata only (mesh, placements, dtype), so every rank reaches the
    same verdict without communicating."""
    DTensor, Replicate, Shard = _types()
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


def _chunk_rows(R: int, W: int, q: int) -> Tuple[int, int]:
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


def _align8(n: int) -> int:
    return (n + 7) // 8 * 8


class _Piece:
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
        self.pieces: List[_Piece] = []
        self.step = 0
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


# ---- the exchange --------------------------------------------------------------------
class _Packing:
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


class ShardedParams:
    """The DTensor parameters of one optimizer (all on one 1-D mesh)."""

    def __init__(self, owner):
        self.owner = owner
        self.layouts: List[Layout] = []
        self._by_id: Dict[int, Layout] = {}
        self.mesh = None
        self.group = None
        self.rank, self.W = 0, 1
        self.device = None
        self._packings: Dict[Any, _Packing] = {}

    # ---- registration ----------------------------------------------------------------
    def _collective_check(self, what: List[Any], where: str):
        """Every rank's `what` (picklable) against rank 0's: a ValueError on
        every rank naming the first difference."""
        got = [None] * self.W
        dist.all_gather_object(got, what, group=self.group)
        for q in range(1, self.W):
            if got[q] != got[0]:
                a, b = got[0], got[q]
                detail = ""
                if isinstance(a, list) and isinstance(b, list):
                    for x, y in zip(a, b):
                        if x != y:
                            detail = f": rank 0 has {x!r}, rank {q} has {y!r}"
                            break
                    else:
                        detail = f": rank 0 has {len(a)} entries, rank {q} {len(b)}"
                raise ValueError(f"flashopt: {where} differs across ranks{detail}. Every "
                                 "rank must build the optimizer with the same parameters "
                                 "and options; nothing was registered")

    def add_group(self, params, group: Dict[str, Any], gi: int, first_gid: int,
                  bundles: Dict[tuple, _Bundle], make_bundle) -> None:
        """Registers a param group of DTensor parameters (called on every rank,
        in the same order). `make_bundle(p)` returns the bundle of a local
        dtype, creating it."""
        DTensor, Replicate, Shard = _types()
        mesh = params[0].device_mesh
        if self.mesh is None:
            self.mesh = mesh
            self.group = mesh.get_group()
            self.rank, self.W = mesh.get_local_rank(), mesh.size()
        for p in params:
            if p.device_mesh != self.mesh:
                raise ValueError("flashopt: DTensor parameters on different device meshes; "
                                 "one optimizer steps parameters of one mesh")
        o = self.owner
        sig = [type(o).__name__, o.master_weight_bits, o.quantize, o.arithmetic, o.numerics,
               self.W, gi, sorted((k, repr(v)) for k, v in group.items() if k != "params")]
        sig += [(tuple(p.shape), str(p.dtype), str(p.placements[0])) for p in params]
        self._collective_check(sig, "the param group " + str(gi))
        # Registration can fail on one rank only (e.g. a piece the device
        # cannot address): every rank learns it.
        err = ""
        try:
            gid = first_gid
            for p in params:
                self._register(p, gid, gi, make_bundle(p))
                gid += 1
        except Exception as e:
            err = f"{type(e).__name__}: {e}"
        got = [None] * self.W
        dist.all_gather_object(got, err, group=self.group)
        for q, e in enumerate(got):
            if e:
                raise RuntimeError(f"flashopt: rank {q} could not register the param group "
                                   f"{gi}: {e}")
        self._packings = {}

    @torch.no_grad()
    def _register(self, p, gid: int, gi: int, b: _Bundle) -> None:
        DTensor, Replicate, Shard = _types()
        G = int(b.info.group_size)
        N = p.numel()
        replicate = type(p.placements[0]) is Replicate
        shape = tuple(p.shape)
        if replicate:
            ranges = [(0, N)] * self.W
        else:
            R = shape[0]
            rowlen = N // R if R else 0
            ranges = []
            for q in range(self.W):
                a, c = _chunk_rows(R, self.W, q)
                ranges.append((a * rowlen, c * rowlen))
        lay = Layout(gid, gi, shape, N, G, ranges, self.rank)
        lay.p, lay.bundle = p, b
        local = p.to_local()
        if local.numel() != lay.n:
            raise RuntimeError(f"flashopt: p{gid}: the local shard has {local.numel()} "
                               f"elements where torch.chunk's split gives {lay.n}")
        if lay.n and not local.is_contiguous():
            raise ValueError(f"flashopt: p{gid}: the local shard is not contiguous")
        if self.device is None:
            self.device = local.device
        flat = local.reshape(-1)
        lay.local_ptr = local.data_ptr() if lay.n else 0
        for a, c, scratch in lay.piece_ranges():
            name = f"p{gid}@{a}"
            if scratch:
                prm = torch.zeros(c - a, dtype=p.dtype, device=local.device)
                x, y = max(a, lay.s), min(c, lay.e)
                prm[x - a:y - a] = flat[x - lay.s:y - lay.s]
                grd = torch.zeros(c - a, dtype=b.grad_dtype, device=local.device)
                piece = _Piece(a, c, True, prm, grd, name)
                piece.index = b.add_piece(prm, grd.data_ptr(), gi, gid, name, a)
            else:
                prm = flat[a - lay.s:c - lay.s]
                piece = _Piece(a, c, False, prm, None, name)
                piece.index = b.add_piece(prm, 0, gi, gid, name, a)
            lay.pieces.append(piece)
        self.layouts.append(lay)
        self._by_id[id(p)] = lay

    # ---- the step -----------------------------------------------------------------------
    def _hyper_signature(self) -> bytes:
        o = self.owner
        vals = [sorted(o._hypers(g).items()) for g in o.param_groups]
        return hashlib.blake2b(repr((vals, o._kernel_grad_scale)).encode(),
                               digest_size=8).digest()

    def _local_grads(self, layouts: List[Layout]):
        """(error text, present flags, flat local gradients); checks only."""
        DTensor, _, _ = _types()
        present, grads = [], []
        err = ""
        for lay in layouts:
            p = lay.p
            g = p.grad
            if g is None:
                present.append(0)
                grads.append(None)
                continue
            try:
                if not isinstance(g, DTensor):
                    raise TypeError(f"the gradient of p{lay.gid} is a {type(g).__name__}, "
                                    "not a DTensor like its parameter")
                if tuple(g.placements) != tuple(p.placements):
                    raise ValueError(f"the gradient of p{lay.gid} is placed {g.placements}, "
                                     f"its parameter {p.placements}")
                gl = g.to_local()
                if gl.dtype is not lay.bundle.grad_dtype:
                    raise TypeError(f"the gradient of p{lay.gid} is {gl.dtype}, "
                                    f"{lay.bundle.spec} takes {lay.bundle.grad_dtype}")
                if gl.numel() != lay.n or (lay.n and not gl.is_contiguous()):
                    raise ValueError(f"the local gradient of p{lay.gid} is not a contiguous "
                                     f"tensor of {lay.n} elements")
                if gl.layout is not torch.strided:
                    raise RuntimeError(f"sparse gradients are not supported (p{lay.gid})")
                loc = p.to_local()
                if lay.n and loc.data_ptr() != lay.local_ptr:
                    raise RuntimeError(
                        f"the local shard of p{lay.gid} moved (its storage was replaced, "
                        "e.g. by load_state_dict(assign=True) after the optimizer was "
                        "built); build the optimizer after the model's storage is final")
            except Exception as e:  # reported to every rank through the header
                err = err or f"{type(e).__name__}: {e}"
                present.append(1)
                grads.append(None)
                continue
            present.append(1)
            grads.append(gl.reshape(-1))
        return err, present, grads

    def _header(self, go: bool, err: str, present: List[int]) -> bytes:
        body = struct.pack("<q", 1 if go else 0) + self._hyper_signature()
        pres = hashlib.blake2b(bytes(present), digest_size=8).digest()
        e = err.encode("utf-8", "replace")[:_ERROR_BYTES]
        out = body + pres + struct.pack("<q", sum(present)) + struct.pack("<q", len(e)) + e
        return out + b"\0" * (_HEADER - len(out))

    @staticmethod
    def _parse(h: bytes):
        go = struct.unpack_from("<q", h, 0)[0]
        hyp = h[8:16]
        pres = h[16:24]
        npres = struct.unpack_from("<q", h, 24)[0]
        ne = struct.unpack_from("<q", h, 32)[0]
        err = h[40:40 + ne].decode("utf-8", "replace")
        return go, hyp, pres, npres, err

    def _exchange(self, header: bytes, layouts: List[Layout],
                  fields: List[List[Optional[torch.Tensor]]], packing: _Packing) -> torch.Tensor:
        """All ranks' buffers (W, bytes): the header, then each halo layout's
        split-group parts of each field (fields[layout][field]: its flat own
        elements, or None to send zeros)."""
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

    def _fill(self, lay: Layout, li: int, fi: int, own: torch.Tensor, recv: torch.Tensor,
              packing: _Packing, piece: _Piece, dest: torch.Tensor):
        """dest (a split group's elements of field fi) from this rank's own
        elements and the other ranks' parts."""
        for q, x, y, slot in lay.segments(piece.start, piece.end):
            if q == self.rank:
                dest[x - piece.start:y - piece.start] = own[x - lay.s:y - lay.s]
            else:
                at = packing.offsets[(li, fi, slot)]
                dest[x - piece.start:y - piece.start] = recv[q, at:at + 4 * (y - x)].view(
                    torch.float32)

    def _agree(self, recv: torch.Tensor):
        """The ranks' headers, with the checks every rank makes alike."""
        heads = [self._parse(recv[q, :_HEADER].cpu().numpy().tobytes()) for q in range(self.W)]
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

    @torch.no_grad()
    def step(self, go: bool, stream_of, only: Optional[Layout] = None) -> bool:
        """One step of every DTensor parameter with a gradient, or of `only`
        (gradient release). Every rank calls it, for the same parameters.
        Returns whether it stepped (False: GradScaler found an inf on some
        rank; nothing changed anywhere)."""
        layouts = self.layouts if only is None else [only]
        key = None if only is None else only.gid
        err, present, grads = self._local_grads(layouts)
        if key not in self._packings:
            self._packings[key] = _Packing(layouts, 2, _HEADER)
        packing = self._packings[key]
        fields = []
        for li, lay in enumerate(layouts):
            own_p = lay.p.to_local().reshape(-1) if lay.n else None
            fields.append([grads[li], own_p])
        recv = self._exchange(self._header(go, err, present), layouts, fields, packing)
        heads = self._agree(recv)
        if not all(h[0] for h in heads):
            return False
        # Fill the split groups; point the middle pieces at the gradients.
        plans: Dict[int, Tuple[_Bundle, List[int], List[int], List[int]]] = {}
        for li, lay in enumerate(layouts):
            b = lay.bundle
            plan = plans.setdefault(id(b), (b, [], [], []))
            g = grads[li]
            if g is None:
                continue
            for pc in lay.pieces:
                plan[1].append(pc.index)
                if pc.scratch:
                    self._fill(lay, li, 0, g, recv, packing, pc, pc.grad)
                    self._fill(lay, li, 1, fields[li][1], recv, packing, pc, pc.param)
                else:
                    ptr = g.data_ptr() + (pc.start - lay.s) * g.element_size()
                    if b.grad_ptrs[pc.index] != ptr:
                        plan[2].append(pc.index)
                        plan[3].append(ptr)
        for b, idx, ch_i, ch_p in plans.values():
            if not idx:
                continue
            wait = b.order_after(stream_of(b))
            b.set_grads(ch_i, ch_p)
            if len(idx) == len(b.params):
                b.step()
            else:
                for i in idx:
                    b.step_param(i)
            if wait:
                b.synchronize()
        for li, lay in enumerate(layouts):
            if grads[li] is None:
                continue
            lay.step += 1
            self._copy_back(lay)
        return True

    @staticmethod
    @torch.no_grad()
    def _refresh(lay: Layout):
        """This rank's elements of its split groups, from the shard into the
        scratch (the user may have written the parameter since the last
        step; the other ranks' elements are refreshed by the next step)."""
        own = None
        for pc in lay.pieces:
            if pc.scratch:
                if own is None:
                    own = lay.p.to_local().reshape(-1)
                x, y = max(pc.start, lay.s), min(pc.end, lay.e)
                pc.param[x - pc.start:y - pc.start] = own[x - lay.s:y - lay.s]

    @staticmethod
    def _copy_back(lay: Layout):
        """This rank's elements of its split groups, back into the shard."""
        own = None
        for pc in lay.pieces:
            if pc.scratch:
                if own is None:
                    own = lay.p.to_local().reshape(-1)
                x, y = max(pc.start, lay.s), min(pc.end, lay.e)
                own[x - lay.s:y - lay.s] = pc.param[x - pc.start:y - pc.start]

    # ---- reports, master weights ----------------------------------------------------------
    def bundles(self) -> List[_Bundle]:
        out, seen = [], set()
        for lay in self.layouts:
            if id(lay.bundle) not in seen:
                seen.add(id(lay.bundle))
                out.append(lay.bundle)
        return out

    def memory(self) -> Dict[str, float]:
        """This rank's bytes: its shard (owned elements), the split groups'
        scratch parameters and gradients, and the library's correction terms
        and states (split groups counted on every rank that holds them)."""
        out = {k: 0 for k in ("numel", "param_bytes", "correction_bytes", "grad_bytes",
                              "state_bytes", "allocated_bytes")}
        for b in self.bundles():
            if not b.params:
                continue
            r = b.memory()
            for k in ("correction_bytes", "state_bytes", "allocated_bytes"):
                out[k] += getattr(r, k)
        scratch = 0
        for lay in self.layouts:
            pes = lay.p.element_size()
            ges = torch.empty((), dtype=lay.bundle.grad_dtype).element_size()
            out["numel"] += lay.n
            out["param_bytes"] += lay.n * pes
            out["grad_bytes"] += lay.n * ges
            for pc in lay.pieces:
                if pc.scratch:
                    scratch += (pc.end - pc.start) * (pes + ges)
        out["scratch_bytes"] = scratch
        out["total_bytes"] = (out["param_bytes"] + out["correction_bytes"] + out["grad_bytes"]
                              + out["state_bytes"] + scratch)
        out["total_bytes_with_grad_release"] = out["total_bytes"] - out["grad_bytes"]
        n = max(out["numel"], 1)
        out["bytes_per_param"] = out["total_bytes"] / n
        out["bytes_per_param_with_grad_release"] = out["total_bytes_with_grad_release"] / n
        return out

    def check_numerics(self) -> List[L.NumericsReport]:
        """libflashopt's check on this rank's pieces, agreed: a NumericsError
        on every rank when any rank's check fails."""
        reports, err, code, rep = [], "", 0, None
        for lay in self.layouts:
            self._refresh(lay)
        for b in self.bundles():
            if not b.params:
                continue
            try:
                reports.append(b.check_numerics())
            except L.NumericsError as e:
                msg, suffix = str(e), f" [{e.status}]"
                err = err or (msg[:-len(suffix)] if msg.endswith(suffix) else msg)
                code, rep = e.code, e.report
                reports.append(e.report)
        got = [None] * self.W
        dist.all_gather_object(got, err, group=self.group)
        for q, e in enumerate(got):
            if e:
                raise L.NumericsError(code or L.ERROR_NUMERICS,
                                      f"flashopt: check_numerics failed on rank {q}: {e}",
                                      rep if q == self.rank else L.NumericsReport())
        return reports

    def layout_of(self, p) -> Layout:
        lay = self._by_id.get(id(p))
        if lay is None or lay.p is not p:
            raise KeyError("flashopt: the parameter is not in this optimizer")
        return lay

    @torch.no_grad()
    def export_master(self, p):
        """The fp32 master weights of DTensor parameter p, as a DTensor placed
        like p (this rank's elements; no communication)."""
        DTensor, _, _ = _types()
        lay = self.layout_of(p)
        self._refresh(lay)
        local = p.to_local()
        own = torch.empty(lay.n, dtype=torch.float32)
        for pc in lay.pieces:
            m = lay.bundle.export_master(pc.index)
            x, y = max(pc.start, lay.s), min(pc.end, lay.e)
            own[x - lay.s:y - lay.s] = m[x - pc.start:y - pc.start]
        return DTensor.from_local(own.reshape(local.shape).to(local.device), self.mesh,
                                  p.placements, run_check=False, shape=p.shape,
                                  stride=p.stride())

    @torch.no_grad()
    def import_master(self, p, value) -> None:
        """Sets DTensor parameter p from fp32 master weights: a DTensor placed
        like p, or the full tensor. Collective: every rank calls it for the
        same parameters in the same order (the split groups are exchanged)."""
        DTensor, _, _ = _types()
        lay = self.layout_of(p)
        if isinstance(value, DTensor):
            own = value.to_local().detach().reshape(-1)
        else:
            full = value.detach().reshape(-1)
            if full.numel() != lay.N:
                raise ValueError(f"flashopt: import_master: {full.numel()} values for a "
                                 f"parameter of {lay.N}")
            own = full[lay.s:lay.e]
        if own.numel() != lay.n:
            raise ValueError(f"flashopt: import_master: {own.numel()} local values where "
                             f"this rank holds {lay.n}")
        own = own.to(device="cpu", dtype=torch.float32)
        packing = _Packing([lay], 1, 0)
        recv = self._exchange(b"", [lay], [[own]], packing).cpu() if lay.halo else None
        for pc in lay.pieces:
            vals = torch.empty(pc.end - pc.start, dtype=torch.float32)
            if pc.scratch:
                self._fill(lay, 0, 0, own, recv, packing, pc, vals)
            else:
                vals.copy_(own[pc.start - lay.s:pc.end - lay.s])
            lay.bundle.import_master(pc.index, vals)
        self._copy_back(lay)

    # ---- state dicts ---------------------------------------------------------------------
    @torch.no_grad()
    def state_dict(self, param_groups) -> Dict[str, Any]:
        """torch's layout: per parameter index "step", SPEC_KEY and the exact
        states as DTensors with the parameter's global shape (per-element
        buffers) or the scale table's (per-group buffers). No communication."""
        DTensor, _, _ = _types()
        groups, _ = _state._torch_groups(param_groups)
        ckpt = {}
        for b in self.bundles():
            if b.params:
                ckpt[id(b)] = _state.read(b.checkpoint_bytes(L.CHECKPOINT_COMPRESSED))[0]
        state: Dict[int, Dict[str, Any]] = {}
        for lay in self.layouts:
            b = lay.bundle
            own = own_states(lay, ckpt.get(id(b), {}), state_buffers(b))
            local = lay.p.to_local()
            dev = local.device
            entry: Dict[str, Any] = {STEP_KEY: torch.tensor(float(lay.step)), SPEC_KEY: b.spec}
            for name, per, dt in state_buffers(b):
                v = own[name]
                if per == "element":
                    entry[name] = DTensor.from_local(
                        v.reshape(local.shape).to(dev), self.mesh, lay.p.placements,
                        run_check=False, shape=lay.p.shape, stride=lay.p.stride())
                else:
                    t = scale_table(lay, v)
                    K = t.shape[1]
                    entry[name] = DTensor.from_local(
                        t.to(dev), self.mesh, lay.p.placements, run_check=False,
                        shape=torch.Size((lay.R, K)), stride=(K, 1))
            state[lay.gid] = entry
        return {"state": state, "param_groups": groups}

    @torch.no_grad()
    def load_state_dict(self, sd: Dict[str, Any]) -> None:
        """Loads a state_dict() of any world size (DCP resharded it to this
        rank's placement), or DCP's full state (plain tensors). Collective.
        Everything is checked on every rank before any bundle changes."""
        keys = [k for g in sd["param_groups"] for k in g["params"]]
        st = sd["state"]
        err, owns = "", []
        try:
            for lay in self.layouts:
                key = keys[lay.gid]
                entry = st.get(key, st.get(str(key)))
                if entry is None:
                    raise ValueError(f"flashopt: the state dict has no state for parameter "
                                     f"{key!r} (p{lay.gid})")
                owns.append(entry_states(lay, entry, lay.bundle))
        except Exception as e:
            err = f"{type(e).__name__}: {e}"
        got = [None] * self.W
        dist.all_gather_object(got, err, group=self.group)
        for q, e in enumerate(got):
            if e:
                raise ValueError(f"flashopt: loading the optimizer state failed on rank {q}: "
                                 f"{e}; nothing was loaded on any rank")
        # The split groups' other elements come from their ranks.
        nf = max((len(elem_buffers(lay.bundle)) for lay in self.layouts), default=0)
        packing = _Packing(self.layouts, nf, 0)
        fields = []
        for lay, (own, _) in zip(self.layouts, owns):
            names = elem_buffers(lay.bundle)
            fields.append([own[n] for n in names] + [None] * (nf - len(names)))
        recv = self._exchange(b"", self.layouts, fields, packing).cpu() if nf else None
        datas = []
        for b in self.bundles():
            if not b.params:
                continue
            tensors, meta = _state.read(b.checkpoint_bytes(L.CHECKPOINT_COMPRESSED))
            steps = {}
            for li, lay in enumerate(self.layouts):
                if lay.bundle is not b:
                    continue
                own, step = owns[li]
                fill_pieces(lay, own, tensors, b,
                            lambda fi, pc, dest, lay=lay, li=li, own=own: self._fill(
                                lay, li, fi, own[elem_buffers(b)[fi]], recv, packing, pc, dest))
                for pc in lay.pieces:
                    steps[pc.name] = step
            datas.append((b, _state.write(tensors, _state.without_checksums(
                _state.with_steps(meta, steps)))))
        for b, data in datas:
            b.load_checkpoint_bytes(data)
        for lay, (_, step) in zip(self.layouts, owns):
            lay.step = step


# ---- the exact per-parameter state format (shared with single-process loads) -----------
_TORCH_DTYPE = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32,
                "i8": torch.int8, "ui8": torch.uint8, "i16": torch.int16}


def state_buffers(b: _Bundle) -> List[Tuple[str, str, torch.dtype]]:
    """The bundle's library-owned buffers (correction, codes, scales, fp32
    states): (name, "element" or "group", dtype), from its manifest."""
    cached = getattr(b, "_state_buffers", None)
    if cached is None:
        with open(b.path / "manifest.json") as f:
            m = json.load(f)
        cached = [(x["name"], x["per"], _TORCH_DTYPE[x["dtype"]]) for x in m["buffers"]
                  if x["name"] not in ("param", "grad")]
        b._state_buffers = cached
    return cached


def elem_buffers(b: _Bundle) -> List[str]:
    return [n for n, per, _ in state_buffers(b) if per == "element"]


def own_states(lay: Layout, tensors: Dict[str, torch.Tensor], bufs) -> Dict[str, torch.Tensor]:
    """This rank's part of each state buffer, from a bundle checkpoint's
    tensors: per-element buffers flat over its elements [s, e); per-group
    ones over its groups [kf, kl]."""
    out = {}
    for name, per, dt in bufs:
        parts = []
        for pc in lay.pieces:
            t = tensors[f"{pc.name}.{name}"].reshape(-1)
            if per == "element":
                x, y = max(pc.start, lay.s), min(pc.end, lay.e)
                parts.append(t[x - pc.start:y - pc.start])
            else:
                parts.append(t)
        out[name] = torch.cat(parts) if parts else torch.empty(0, dtype=dt)
    return out


def scale_table(lay: Layout, gs: torch.Tensor) -> torch.Tensor:
    """This rank's rows of the scale table: row i holds the scales of the
    groups row i touches (first first), zero-padded to K columns."""
    r0, r1 = lay.own_rows()
    K = lay.table_width()
    out = torch.zeros((r1 - r0, K), dtype=gs.dtype)
    if r1 > r0:
        first, count = lay.row_groups(r0, r1)
        j = torch.arange(K)
        valid = j[None, :] < count[:, None]
        idx = first[:, None] + j[None, :] - lay.s // lay.G
        out[valid] = gs[idx[valid]]
    return out


def scales_from_table(lay: Layout, table: torch.Tensor) -> torch.Tensor:
    """This rank's group scales [kf, kl] from its rows of the scale table."""
    r0, r1 = lay.own_rows()
    if r1 <= r0:
        return torch.empty(0, dtype=table.dtype)
    kf, kl = lay.own_groups()
    gs = torch.zeros(kl - kf + 1, dtype=table.dtype)
    first, count = lay.row_groups(r0, r1)
    K = table.shape[1]
    j = torch.arange(K)
    valid = j[None, :] < count[:, None]
    idx = first[:, None] + j[None, :] - kf
    gs[idx[valid]] = table[valid]
    return gs


def entry_states(lay: Layout, entry: Dict[str, Any], b: _Bundle):
    """Checks a parameter's state-dict entry against bundle b and returns
    (this rank's part of each buffer, step). Entries hold DTensors (this
    rank's shard, as DCP loaded them) or full tensors (DCP's full state)."""
    DTensor, _, _ = _types()
    spec = entry.get(SPEC_KEY)
    if spec is None:
        raise ValueError(f"flashopt: the state of p{lay.gid} has no {SPEC_KEY!r} entry (keys "
                         f"{sorted(entry)}): it is not a flashopt state")
    if spec != b.spec:
        other = _state._other_numerics(b.spec, [spec])
        if other is not None:
            theirs = "flashoptim" if spec.endswith("_flashoptim") else "bounded"
            raise ValueError(
                f"flashopt: the state was written with numerics={theirs!r} (bundle {spec}), "
                f"but this optimizer runs bundle {b.spec}. Build the optimizer with "
                f"numerics={theirs!r} to resume the run bit for bit (docs/NUMERICS.md §8)")
        raise ValueError(f"flashopt: the state of p{lay.gid} is of bundle {spec}, this "
                         f"optimizer runs {b.spec}")
    own = {}
    r0, r1 = lay.own_rows()
    for name, per, dt in state_buffers(b):
        if name not in entry:
            raise ValueError(f"flashopt: the state of p{lay.gid} has no {name!r}")
        v = entry[name]
        if not isinstance(v, torch.Tensor):
            raise TypeError(f"flashopt: the state {name!r} of p{lay.gid} is a "
                            f"{type(v).__name__}")
        if v.dtype != dt:
            raise TypeError(f"flashopt: the state {name!r} of p{lay.gid} is {v.dtype}, "
                            f"{b.spec} holds {dt}")
        if isinstance(v, DTensor):
            local = v.to_local().detach().cpu()
        else:  # a full tensor: this rank's part
            full = v.detach().cpu()
            local = (full.reshape(-1)[lay.s:lay.e] if per == "element"
                     else full[r0:r1] if full.dim() == 2 else full)
        if per == "element":
            if local.numel() != lay.n:
                raise ValueError(f"flashopt: the state {name!r} of p{lay.gid} has "
                                 f"{local.numel()} local elements, this rank holds {lay.n}")
            own[name] = local.reshape(-1).contiguous()
        else:
            K = lay.table_width()
            if tuple(local.shape) != (r1 - r0, K):
                raise ValueError(f"flashopt: the scale table {name!r} of p{lay.gid} has "
                                 f"local shape {tuple(local.shape)}, expected "
                                 f"{(r1 - r0, K)}")
            own[name] = scales_from_table(lay, local)
    step = int(_float(entry.get(STEP_KEY, 0)))
    return own, step


def fill_pieces(lay: Layout, own: Dict[str, torch.Tensor], tensors: Dict[str, torch.Tensor],
                b: _Bundle, fill_split) -> None:
    """Writes a parameter's states into its pieces' checkpoint tensors: the
    middle from this rank's elements, split groups through `fill_split(field,
    piece, dest)` (the exchange), scales from its groups."""
    kf = lay.s // lay.G
    names = elem_buffers(b)
    for pc in lay.pieces:
        for name, per, dt in state_buffers(b):
            key = f"{pc.name}.{name}"
            dest = tensors[key].reshape(-1).clone()
            if per == "element":
                if pc.scratch:
                    fill_split(names.index(name), pc, dest)
                else:
                    dest.copy_(own[name][pc.start - lay.s:pc.end - lay.s])
            else:
                g0, g1 = pc.start // lay.G, -(-pc.end // lay.G)
                dest.copy_(own[name][g0 - kf:g1 - kf])
            tensors[key] = dest


def plain_checkpoint(b: _Bundle, entries: List[Optional[Dict[str, Any]]]) -> bytes:
    """A single-process bundle's compressed checkpoint from exact
    per-parameter entries (DCP's full state of an FSDP run): entries[i] is
    the entry of the bundle's parameter i (None: keep its state)."""
    tensors, meta = _state.read(b.checkpoint_bytes(L.CHECKPOINT_COMPRESSED))
    G = int(b.info.group_size)
    steps = {}
    for i, entry in enumerate(entries):
        if entry is None:
            continue
        p = b.params[i]
        lay = Layout.from_plain(b.global_ids[i], tuple(p.shape), p.numel(), G)
        lay.pieces = [_Piece(0, lay.N, False, None, None, b.names[i])]
        own, step = entry_states(lay, entry, b)
        fill_pieces(lay, own, tensors, b, None)
        steps[b.names[i]] = step
    return _state.write(tensors, _state.without_checksums(_state.with_steps(meta, steps)))
