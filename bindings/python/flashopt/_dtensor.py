"""DTensor parameters: FSDP2 (`torch.distributed.fsdp.fully_shard`, placement
Shard(0)) and Replicate, on a 1-D device mesh. This module holds
ShardedParams, the DTensor parameters of one optimizer (registration, the
step and its one collective, reports, master weights), and the optimizer's
DTensor entry points (check_param, add_group). The scheme (numerics that do
not depend on the world size, pieces, split groups) is described in
_dtensor_layout.py, the exact state format in _dtensor_state.py, DCP's state
dicts in _dtensor_dcp.py.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from . import _dtensor_dcp
from . import _lib as L
from ._bundle import _DTYPES, _Bundle, _device_key, _float, _is_dtensor
from ._collectives import on_every_rank, raise_on_every_rank
from ._dtensor_layout import (Layout, _bytes_of, _chunk_rows, _Packing, _Piece, _types,
                              placement_error)
from ._views import ShardedParamState

_HEADER = 256  # bytes of each rank's step header (flags, signature, error text)
_ERROR_BYTES = 200


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
        def register():
            for gid, p in enumerate(params, first_gid):
                self._register(p, gid, gi, make_bundle(p))

        on_every_rank(register, self.group, self.W,
                      lambda q, e: RuntimeError(f"flashopt: rank {q} could not register the "
                                                f"param group {gi}: {e}"))
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
        raise_on_every_rank(
            err, self.group, self.W,
            lambda q, e: L.NumericsError(code or L.ERROR_NUMERICS,
                                         f"flashopt: check_numerics failed on rank {q}: {e}",
                                         rep if q == self.rank else L.NumericsReport()))
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

    # ---- state dicts (_dtensor_dcp.py) -------------------------------------------------
    def state_dict(self, param_groups) -> Dict[str, Any]:
        """torch's layout: per parameter index "step", SPEC_KEY and the exact
        states as DTensors (_dtensor_dcp.state_dict). No communication."""
        return _dtensor_dcp.state_dict(self, param_groups)

    def load_state_dict(self, sd: Dict[str, Any]) -> None:
        """Loads a state_dict() of any world size, or DCP's full state
        (_dtensor_dcp.load_state_dict). Collective."""
        _dtensor_dcp.load_state_dict(self, sd)


# ---- the optimizer's DTensor entry points (FlashOptimizer, _base.py) -----------------------
def check_param(opt, p) -> None:
    """A DTensor parameter of optimizer `opt`: checks that depend only on its
    global metadata (the same verdict on every rank, so no rank waits for
    another in a collective)."""
    where = f"parameter {opt._num_params} (shape {tuple(p.shape)})"
    err = placement_error(p, where)
    if err is not None:
        raise TypeError(err)
    if p.dtype not in _DTYPES:
        raise TypeError(f"flashopt: {type(opt).__name__} supports bfloat16, float16 and "
                        f"float32 parameters, not {p.dtype} ({where})")
    _device_key(p.device)
    if p.numel() == 0:
        raise ValueError(f"flashopt: empty parameters are not supported ({where})")


def add_group(opt, param_group: Dict[str, Any], params,
              torch_add_param_group: Callable[[Dict[str, Any]], None]) -> None:
    """add_param_group of optimizer `opt` for DTensor parameters: every rank
    calls it alike; a mismatch across ranks is an error on every rank.
    `torch_add_param_group` is torch.optim.Optimizer's (torch's checks:
    duplicates, defaults)."""
    from . import _specs
    if not all(_is_dtensor(p) for p in params) or (opt._num_params and
                                                    opt._sharded is None):
        raise TypeError("flashopt: an optimizer steps either DTensor parameters (FSDP2's "
                        "fully_shard, Replicate) or plain tensors, not both")
    for p in params:
        opt._check_param(p)
    if opt._gradient_release is not None:
        raise RuntimeError("flashopt: add parameters before enabling gradient release")
    param_group = dict(param_group)
    param_group["params"] = params
    torch_add_param_group(param_group)
    group = opt.param_groups[-1]
    group.setdefault("initial_lr", _float(group["lr"]))
    gi = len(opt.param_groups) - 1
    if opt._sharded is None:
        opt._sharded = ShardedParams(opt)

    def bundle_of(p):
        local = p.to_local()
        key = opt._bundle_key(local)
        if key not in opt._bundles:
            spec = _specs.select(opt._rule, p.dtype, opt.master_weight_bits, opt.quantize,
                                 opt.arithmetic, opt.numerics, owner=type(opt).__name__)
            opt._bundles[key] = _Bundle(type(opt).__name__, spec, p.dtype, local.device,
                                        opt._mode(p.dtype))
        return opt._bundles[key]

    first = opt._num_params
    fresh = [p for p in params if id(p) not in opt._where]
    opt._sharded.add_group(fresh, group, gi, first, opt._bundles, bundle_of)
    for k, p in enumerate(fresh):
        opt._where[id(p)] = (opt._sharded.layouts[-len(fresh) + k].bundle, -1)
        opt.state[p] = ShardedParamState(opt._sharded.layouts[-len(fresh) + k])
    opt._num_params += len(fresh)
    for b in opt._bundles.values():
        b.ensure_groups(len(opt.param_groups))
    opt._sync_group(gi)
