"""The exact per-parameter state format of DTensor parameters (shared with
single-process loads of DCP's full state): the bundle's state buffers, a
rank's part of each, the scale tables, checking a state-dict entry, and
writing it into the pieces' checkpoint tensors. _dtensor_dcp.py builds and
loads the state dicts from them.

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

from typing import Any, Dict, List, Optional, Tuple

import torch

from . import _lib as L
from . import _nibbles, _specs, _state
from ._bundle import _Bundle, _float
from ._dtensor_layout import Layout, Piece, dtensor_types
from ._views import SPEC_KEY, STEP_KEY


def elem_buffers(b: _Bundle) -> List[str]:
    return [n for n, per, _ in b.buffers() if per == "element"]


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
    DTensor, _, _ = dtensor_types()
    spec = entry.get(SPEC_KEY)
    if spec is None:
        raise ValueError(f"flashopt: the state of p{lay.gid} has no {SPEC_KEY!r} entry (keys "
                         f"{sorted(entry)}): it is not a flashopt state")
    if spec != b.spec:
        if _specs.other_numerics(b.spec) == spec:
            theirs = _specs.numerics_of(spec)
            raise ValueError(
                f"flashopt: the state was written with numerics={theirs!r} (bundle {spec}), "
                f"but this optimizer runs bundle {b.spec}. Build the optimizer with "
                f"numerics={theirs!r} to resume the run bit for bit (docs/NUMERICS.md §8), "
                f"or load its fp32 states (state_dict(fp32_states=True)) as a conversion")
        raise ValueError(f"flashopt: the state of p{lay.gid} is of bundle {spec}, this "
                         f"optimizer runs {b.spec}")
    own = {}
    r0, r1 = lay.own_rows()
    for name, per, dt in b.buffers():
        if name not in entry:
            raise ValueError(f"flashopt: the state of p{lay.gid} has no {name!r}")
        v = entry[name]
        if not isinstance(v, torch.Tensor):
            raise TypeError(f"flashopt: the state {name!r} of p{lay.gid} is a "
                            f"{type(v).__name__}")
        if v.dtype != dt:
            raise TypeError(f"flashopt: the state {name!r} of p{lay.gid} is {v.dtype}, "
                            f"{b.spec} holds {dt}")
        packed = name in b.packed and per == "element"
        if isinstance(v, DTensor):
            local = v.to_local().detach().cpu()
            if packed:  # this rank's rows, packed per row: one code per element
                rows = lay.n // lay.L if lay.L else 0
                local = _unpack_entry(lay, name, local,
                                      (rows, *lay.shape[1:]) if lay.shape else ())
        elif per == "group" and v.dim() == 1:
            # A single-process state dict's flat scales, one per group of the
            # full tensor: this rank's groups [kf, kl].
            ng = -(-lay.N // lay.G)
            if v.numel() != ng:
                raise ValueError(f"flashopt: the state {name!r} of p{lay.gid} holds "
                                 f"{v.numel()} scales, its {lay.N} elements make {ng} "
                                 f"groups of {lay.G}")
            if r1 > r0:
                kf, kl = lay.own_groups()
                own[name] = v.detach().cpu()[kf:kl + 1].contiguous()
            else:
                own[name] = torch.empty(0, dtype=dt)
            continue
        else:  # a full tensor: this rank's part
            full = v.detach().cpu()
            if packed:
                full = _unpack_entry(lay, name, full, lay.shape)
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


def _unpack_entry(lay: Layout, name: str, t: torch.Tensor, shape) -> torch.Tensor:
    """One code per element (flat) from a packed 4-bit entry (or a rank's
    local part of one) of a tensor of `shape` (_nibbles.entry_shape)."""
    try:
        return _nibbles.unpack_rows(t, shape)
    except ValueError as e:
        raise ValueError(f"flashopt: the state {name!r} of p{lay.gid}: {e}") from None


def fill_pieces(lay: Layout, own: Dict[str, torch.Tensor], tensors: Dict[str, torch.Tensor],
                b: _Bundle, fill_split) -> None:
    """Writes a parameter's states into its pieces' checkpoint tensors: the
    middle from this rank's elements, split groups through `fill_split(field,
    piece, dest)` (the exchange), scales from its groups."""
    kf = lay.s // lay.G
    names = elem_buffers(b)
    for pc in lay.pieces:
        for name, per, dt in b.buffers():
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
    tensors, meta = _state.read_codes(b, b.checkpoint_bytes(L.CHECKPOINT_COMPRESSED))
    G = int(b.info.group_size)
    steps = {}
    for i, entry in enumerate(entries):
        if entry is None:
            continue
        p = b.params[i]
        lay = Layout.from_plain(b.global_ids[i], tuple(p.shape), p.numel(), G)
        lay.pieces = [Piece(0, lay.N, False, None, None, b.names[i])]
        try:
            own, step = entry_states(lay, entry, b)
        except (TypeError, ValueError) as e:
            raise type(e)(f"{e}; nothing was loaded") from None
        fill_pieces(lay, own, tensors, b, None)
        steps[b.names[i]] = step
    return _state.write_codes(b, tensors,
                              _state.without_checksums(_state.with_steps(meta, steps)))


def is_full_state(sd: Dict[str, Any]) -> bool:
    """Whether state dict `sd` is DCP's full state of an FSDP2 run (exact
    per-parameter entries: SPEC_KEY and the compressed buffers), which
    plain_checkpoints loads into a single-process optimizer."""
    return sd.get(_state.KEY) is None and any(isinstance(v, dict) and SPEC_KEY in v
                                              for v in (sd.get("state") or {}).values())


def _entries_by_position(b: _Bundle, sd: Dict[str, Any]) -> List[Optional[Dict[str, Any]]]:
    """The state entry of each of b's parameters: the state dict's
    parameters are matched by position in param_groups, as torch.optim does
    (keys may be indices or, from get_optimizer_state_dict, names)."""
    keys = [k for g in sd["param_groups"] for k in g["params"]]
    st = sd["state"]
    return [st.get(keys[gid]) if gid < len(keys) else None for gid in b.global_ids]


def plain_checkpoints(bundles: List[_Bundle], sd: Dict[str, Any]
                      ) -> List[Tuple[bytes, Dict[Tuple[int, str], torch.Tensor]]]:
    """_state.checkpoints_from_state_dict's answer for DCP's full state
    (is_full_state): one checkpoint per bundle, no buffers to write after
    it. Everything is built and checked before the caller loads any."""
    return [(plain_checkpoint(b, _entries_by_position(b, sd)), {}) for b in bundles]
