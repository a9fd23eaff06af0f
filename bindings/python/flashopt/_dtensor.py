"""ShardedParams: an optimizer's DTensor parameters (the ParamSet of
_params.py for FSDP2's `torch.distributed.fsdp.fully_shard`, placement
Shard(0), and Replicate, on a 1-D device mesh): their registration as pieces,
the exchange of split groups before a step, the reports and the master
weights. The step itself is the library's Stepper (flashopt_step_external
over _comm.py's communicator: it agrees, decides, steps and counts). The
scheme (numerics that do not depend on the world size, pieces, split groups)
is described in _dtensor_layout.py, the exchange between the ranks in
_dtensor_exchange.py, the exact state format in _dtensor_state.py, DCP's
state dicts in _dtensor_dcp.py.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

import torch
import torch.distributed as dist

from . import _dtensor_dcp
from . import _lib as L
from ._bundle import _DTYPES, _Bundle, _device_key, _is_dtensor
from ._collectives import on_every_rank, raise_on_every_rank
from ._comm import ProcessGroupComm
from ._dtensor_exchange import Packing, Ranks
from ._dtensor_layout import Layout, Piece, chunk_rows, dtensor_types, placement_error
from ._params import MIXED_KINDS, Options, ParamSet, StepHooks, bundle_key, current_stream
from ._views import ShardedParamState


class _Prepared(NamedTuple):
    params: List[Any]
    opts: Options


class ShardedParams(ParamSet):
    """The DTensor parameters of one optimizer (all on one 1-D mesh)."""

    def __init__(self):
        super().__init__()
        self.layouts: List[Layout] = []
        self._by_id: Dict[int, Layout] = {}
        self.ranks: Optional[Ranks] = None  # the mesh's, from the first param group
        self._packings: Dict[Any, Packing] = {}
        self._peers: Optional[ProcessGroupComm] = None  # the steps' agreement
        self._attached: set = set()  # ids of the bundles attached to it

    def __contains__(self, p) -> bool:
        return id(p) in self._by_id

    def layout_of(self, p) -> Layout:
        lay = self._by_id.get(id(p))
        if lay is None or lay.p is not p:
            raise KeyError("flashopt: the parameter is not in this optimizer")
        return lay

    # ---- registration ----------------------------------------------------------------
    def check_param(self, p, opts: Options) -> None:
        """A DTensor parameter: checks that depend only on its global
        metadata (the same verdict on every rank, so no rank waits for
        another in a collective)."""
        where = f"parameter {self.num_params} (shape {tuple(p.shape)})"
        err = placement_error(p, where)
        if err is not None:
            raise TypeError(err)
        if p.dtype not in _DTYPES:
            raise TypeError(f"flashopt: {opts.owner} supports bfloat16, float16 and "
                            f"float32 parameters, not {p.dtype} ({where})")
        _device_key(p.device)
        if p.numel() == 0:
            raise ValueError(f"flashopt: empty parameters are not supported ({where})")

    def prepare(self, params, param_groups, opts: Options, gradient_release: bool) -> _Prepared:
        """Every rank calls it alike, and add_group after it; a mismatch
        across ranks is an error on every rank."""
        if not all(_is_dtensor(p) for p in params):
            raise TypeError(MIXED_KINDS)
        for p in params:
            self.check_param(p, opts)
        if gradient_release:
            raise RuntimeError("flashopt: add parameters before enabling gradient release")
        return _Prepared(params, opts)

    def add_group(self, prepared: _Prepared, group: Dict[str, Any], gi: int,
                  mark: Callable[[torch.Tensor], None]) -> None:
        opts = prepared.opts

        def bundle_of(p):
            local = p.to_local()
            key = bundle_key(local)
            if key not in self._bundles:
                self._bundles[key] = opts.new_bundle(p.dtype, local.device)
            return self._bundles[key]

        first = self.num_params
        fresh = [p for p in prepared.params if id(p) not in self._by_id]
        self._register_group(fresh, group, gi, first, opts, bundle_of)
        for p in fresh:
            mark(p)
        self.num_params += len(fresh)
        self._ensure_groups(gi + 1)

    def state_view(self, p, plain_view) -> ShardedParamState:
        return ShardedParamState(self.layout_of(p))

    def _collective_check(self, what: List[Any], where: str):
        """Every rank's `what` (picklable) against rank 0's: a ValueError on
        every rank naming the first difference."""
        got = [None] * self.ranks.W
        dist.all_gather_object(got, what, group=self.ranks.group)
        for q in range(1, self.ranks.W):
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

    def _register_group(self, params, group: Dict[str, Any], gi: int, first_gid: int,
                        opts: Options, make_bundle) -> None:
        """Registers a param group of DTensor parameters (called on every rank,
        in the same order). `make_bundle(p)` returns the bundle of a local
        dtype, creating it."""
        mesh = params[0].device_mesh
        if self.ranks is None:
            self.ranks = Ranks(mesh)
        for p in params:
            if p.device_mesh != self.ranks.mesh:
                raise ValueError("flashopt: DTensor parameters on different device meshes; "
                                 "one optimizer steps parameters of one mesh")
        sig = [opts.owner, opts.master_weight_bits, opts.state_bits, opts.arithmetic,
               opts.numerics, self.ranks.W, gi,
               sorted((k, repr(v)) for k, v in group.items() if k != "params")]
        sig += [(tuple(p.shape), str(p.dtype), str(p.placements[0])) for p in params]
        self._collective_check(sig, "the param group " + str(gi))

        # Registration can fail on one rank only (e.g. a piece the device
        # cannot address): every rank learns it.
        def register():
            for gid, p in enumerate(params, first_gid):
                self._register(p, gid, gi, make_bundle(p))

        on_every_rank(register, self.ranks.group, self.ranks.W,
                      lambda q, e: RuntimeError(f"flashopt: rank {q} could not register the "
                                                f"param group {gi}: {e}"))
        self._packings = {}

    @torch.no_grad()
    def _register(self, p, gid: int, gi: int, b: _Bundle) -> None:
        DTensor, Replicate, Shard = dtensor_types()
        G = int(b.info.group_size)
        N = p.numel()
        replicate = type(p.placements[0]) is Replicate
        shape = tuple(p.shape)
        W = self.ranks.W
        if replicate:
            ranges = [(0, N)] * W
        else:
            R = shape[0]
            rowlen = N // R if R else 0
            ranges = []
            for q in range(W):
                a, c = chunk_rows(R, W, q)
                ranges.append((a * rowlen, c * rowlen))
        lay = Layout(gid, gi, shape, N, G, ranges, self.ranks.rank)
        lay.p, lay.bundle = p, b
        local = p.to_local()
        if local.numel() != lay.n:
            raise RuntimeError(f"flashopt: p{gid}: the local shard has {local.numel()} "
                               f"elements where torch.chunk's split gives {lay.n}")
        if lay.n and not local.is_contiguous():
            raise ValueError(f"flashopt: p{gid}: the local shard is not contiguous")
        if self.ranks.device is None:
            self.ranks.device = local.device
        flat = local.reshape(-1)
        lay.local_ptr = local.data_ptr() if lay.n else 0
        for a, c, scratch in lay.piece_ranges():
            name = f"p{gid}@{a}"
            if scratch:
                prm = torch.zeros(c - a, dtype=p.dtype, device=local.device)
                x, y = max(a, lay.s), min(c, lay.e)
                prm[x - a:y - a] = flat[x - lay.s:y - lay.s]
                grd = torch.zeros(c - a, dtype=b.grad_dtype, device=local.device)
                piece = Piece(a, c, True, prm, grd, name)
                piece.index = b.add_piece(prm, grd.data_ptr(), gi, gid, name, a)
            else:
                prm = flat[a - lay.s:c - lay.s]
                piece = Piece(a, c, False, prm, None, name)
                piece.index = b.add_piece(prm, 0, gi, gid, name, a)
            lay.pieces.append(piece)
        self.layouts.append(lay)
        self._by_id[id(p)] = lay

    # ---- the step -----------------------------------------------------------------------
    def step(self, go: bool, hooks: StepHooks) -> None:
        # Every rank steps, and the ranks agree on GradScaler's found_inf in
        # the step's one collective.
        hooks.prepare()
        self._step(go, hooks)

    def step_one(self, p, hooks: StepHooks) -> None:
        # FSDP2 calls the gradient-release hook after the reduce-scatter, on
        # every rank in the same order: the parameter's split groups are
        # exchanged.
        lay = self.layout_of(p)
        hooks.sync_group(lay.gi)
        self._step(True, hooks, only=lay)

    def _local_grads(self, layouts: List[Layout]):
        """(error text, present flags, flat local gradients); checks only."""
        DTensor, _, _ = dtensor_types()
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

    def _comm(self) -> ProcessGroupComm:
        """The communicator of the steps' agreement (the mesh's process
        group), attached to every bundle (once each)."""
        if self._peers is None:
            self._peers = ProcessGroupComm(self.ranks.group, self.ranks.rank, self.ranks.W,
                                           self.ranks.device or torch.device("cpu"))
        for b in self.bundles():
            if id(b) not in self._attached:
                b.attach_external(self._peers)
                self._attached.add(id(b))
        return self._peers

    @torch.no_grad()
    def _step(self, go: bool, hooks: StepHooks, only: Optional[Layout] = None) -> bool:
        """One step of every DTensor parameter with a gradient, or of `only`
        (gradient release). Every rank calls it, for the same parameters.
        The split groups are exchanged here; the library's Stepper agrees
        (flashopt_step_external: an error on any rank raises on every rank,
        GradScaler's found_inf on any rank skips on every rank), steps each
        bundle's pieces and counts. Returns whether it stepped (False:
        skipped everywhere, nothing changed)."""
        layouts = self.layouts if only is None else [only]
        key = None if only is None else only.gid
        err, present, grads = self._local_grads(layouts)
        if key not in self._packings:
            self._packings[key] = Packing(layouts, 2)
        packing = self._packings[key]
        fields = []
        for li, lay in enumerate(layouts):
            own_p = lay.p.to_local().reshape(-1) if lay.n else None
            fields.append([grads[li], own_p])
        recv = self.ranks.exchange(layouts, fields, packing) if packing.offsets else None
        # Fill the split groups; point the middle pieces at the gradients.
        # Per bundle: (bundle, pieces, parameters, changed pieces, pointers).
        plans: Dict[int, Tuple[_Bundle, List[int], List[int], List[int], List[int]]] = {
            id(b): (b, [], [], [], []) for b in self.bundles()}
        for li, lay in enumerate(layouts):
            b = lay.bundle
            plan = plans[id(b)]
            if present[li]:
                plan[2].append(lay.gid)
            g = grads[li]
            if g is None:
                continue
            for pc in lay.pieces:
                plan[1].append(pc.index)
                if pc.scratch:
                    self.ranks.fill(lay, li, 0, g, recv, packing, pc, pc.grad)
                    self.ranks.fill(lay, li, 1, fields[li][1], recv, packing, pc, pc.param)
                else:
                    ptr = g.data_ptr() + (pc.start - lay.s) * g.element_size()
                    if b.grad_ptrs[pc.index] != ptr:
                        plan[3].append(pc.index)
                        plan[4].append(ptr)
        # Every bundle agrees and steps in the same order on every rank (a
        # bundle with nothing to step on this rank agrees all the same).
        self._comm()
        stepped = True
        for b, idx, params, ch_i, ch_p in plans.values():
            stepped = b.stepping(
                current_stream(b) if idx else None, [] if err else ch_i, ch_p,
                lambda b=b, idx=idx, params=params: b.step_external(idx, params, not go, err)
            ) and stepped
        if stepped:
            for li, lay in enumerate(layouts):
                if grads[li] is not None:
                    self._copy_back(lay)
        return stepped

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
    def memory(self, param_groups) -> Dict[str, float]:
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
            err, self.ranks.group, self.ranks.W,
            lambda q, e: L.NumericsError(code or L.ERROR_NUMERICS,
                                         f"flashopt: check_numerics failed on rank {q}: {e}",
                                         rep if q == self.ranks.rank else L.NumericsReport()))
        return reports

    @torch.no_grad()
    def export_master(self, p):
        """The fp32 master weights of DTensor parameter p, as a DTensor placed
        like p (this rank's elements; no communication)."""
        DTensor, _, _ = dtensor_types()
        lay = self.layout_of(p)
        self._refresh(lay)
        local = p.to_local()
        own = torch.empty(lay.n, dtype=torch.float32)
        for pc in lay.pieces:
            m = lay.bundle.export_master(pc.index)
            x, y = max(pc.start, lay.s), min(pc.end, lay.e)
            own[x - lay.s:y - lay.s] = m[x - pc.start:y - pc.start]
        return DTensor.from_local(own.reshape(local.shape).to(local.device), self.ranks.mesh,
                                  p.placements, run_check=False, shape=p.shape,
                                  stride=p.stride())

    @torch.no_grad()
    def import_master(self, p, value) -> None:
        """Sets DTensor parameter p from fp32 master weights: a DTensor placed
        like p, or the full tensor. Collective: every rank calls it for the
        same parameters in the same order (the split groups are exchanged)."""
        DTensor, _, _ = dtensor_types()
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
        packing = Packing([lay], 1)
        recv = self.ranks.exchange([lay], [[own]], packing).cpu() if lay.halo else None
        for pc in lay.pieces:
            vals = torch.empty(pc.end - pc.start, dtype=torch.float32)
            if pc.scratch:
                self.ranks.fill(lay, 0, 0, own, recv, packing, pc, vals)
            else:
                vals.copy_(own[pc.start - lay.s:pc.end - lay.s])
            lay.bundle.import_master(pc.index, vals)
        self._copy_back(lay)

    # ---- state dicts (_dtensor_dcp.py) and checkpoint files -------------------------------
    def state_dict(self, param_groups, fp32_states: bool) -> Dict[str, Any]:
        """torch's layout: per parameter index "step", SPEC_KEY and the exact
        states as DTensors (_dtensor_dcp.state_dict). No communication."""
        if fp32_states:
            raise NotImplementedError(
                "flashopt: state_dict(fp32_states=True) is not available for DTensor "
                "(FSDP2) parameters; save the compact state dict with "
                "torch.distributed.checkpoint, and export fp32 from a single process "
                "(get_optimizer_state_dict(..., full_state_dict=True) loads into one)")
        return _dtensor_dcp.state_dict(self, param_groups)

    def load_state_dict(self, sd: Dict[str, Any]) -> None:
        """Loads a state_dict() of any world size, or DCP's full state
        (_dtensor_dcp.load_state_dict). Collective."""
        _dtensor_dcp.load_state_dict(self, sd)

    @staticmethod
    def _no_files():
        raise NotImplementedError(
            "flashopt: save_checkpoint/load_checkpoint write one process's files; with "
            "DTensor (FSDP2) parameters use torch.distributed.checkpoint: "
            "get_optimizer_state_dict / set_optimizer_state_dict with dcp.save / dcp.load")

    def save_checkpoint(self, path, fmt: int) -> None:
        self._no_files()

    def load_checkpoint(self, path) -> None:
        self._no_files()
