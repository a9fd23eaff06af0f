"""DCP (torch.distributed.checkpoint) state dicts of a ShardedParams
(_dtensor.py): per parameter, the exact states (_dtensor_state.py) as
DTensors placed like the parameter; loading any world size's, or DCP's full
state. Functions of the ShardedParams `sp`; its state_dict and
load_state_dict methods call them.
"""

from __future__ import annotations

from typing import Any, Dict

import torch

from . import _lib as L
from . import _nibbles, _state
from ._collectives import on_every_rank
from ._dtensor_exchange import Packing
from ._dtensor_layout import dtensor_types
from ._dtensor_state import elem_buffers, entry_states, fill_pieces, own_states, scale_table
from ._views import SPEC_KEY, STEP_KEY


def _contiguous_stride(shape) -> tuple:
    return torch.empty(tuple(shape), device="meta").stride()


@torch.no_grad()
def state_dict(sp, param_groups) -> Dict[str, Any]:
    """torch's layout: per parameter index "step", SPEC_KEY and the exact
    states as DTensors with the parameter's global shape (per-element
    buffers; 4-bit codes packed per row, _nibbles.entry_shape, so Shard(0)
    splits them like the parameter) or the scale table's (per-group
    buffers). No communication."""
    DTensor, _, _ = dtensor_types()
    groups, _ = _state.torch_groups(param_groups)
    ckpt = {}
    for b in sp.bundles():
        if b.params:
            ckpt[id(b)] = _state.read_codes(b, b.checkpoint_bytes(L.CHECKPOINT_COMPRESSED))[0]
    state: Dict[int, Dict[str, Any]] = {}
    for lay in sp.layouts:
        b = lay.bundle
        own = own_states(lay, ckpt.get(id(b), {}), b.buffers())
        local = lay.p.to_local()
        dev = local.device
        entry: Dict[str, Any] = {STEP_KEY: torch.tensor(float(lay.step)), SPEC_KEY: b.spec}
        for name, per, dt in b.buffers():
            v = own[name]
            if name in b.packed:  # 4-bit codes: this rank's rows packed per row
                shape = _nibbles.entry_shape(lay.p.shape)
                entry[name] = DTensor.from_local(
                    _nibbles.pack_rows(v, local.shape).to(dev), sp.ranks.mesh,
                    lay.p.placements, run_check=False, shape=torch.Size(shape),
                    stride=_contiguous_stride(shape))
            elif per == "element":
                entry[name] = DTensor.from_local(
                    v.reshape(local.shape).to(dev), sp.ranks.mesh, lay.p.placements,
                    run_check=False, shape=lay.p.shape, stride=lay.p.stride())
            else:
                t = scale_table(lay, v)
                K = t.shape[1]
                entry[name] = DTensor.from_local(
                    t.to(dev), sp.ranks.mesh, lay.p.placements, run_check=False,
                    shape=torch.Size((lay.R, K)), stride=(K, 1))
        state[lay.gid] = entry
    return {"state": state, "param_groups": groups}



@torch.no_grad()
def load_state_dict(sp, sd: Dict[str, Any]) -> None:
    """Loads a state_dict() of any world size (DCP resharded it to this
    rank's placement), or DCP's full state (plain tensors). Collective.
    Everything is checked on every rank before any bundle changes."""
    keys = [k for g in sd["param_groups"] for k in g["params"]]
    st = sd["state"]

    def check():
        owns = []
        for lay in sp.layouts:
            key = keys[lay.gid]
            entry = st.get(key, st.get(str(key)))
            if entry is None:
                raise ValueError(f"flashopt: the state dict has no state for parameter "
                                 f"{key!r} (p{lay.gid})")
            owns.append(entry_states(lay, entry, lay.bundle))
        return owns

    owns = on_every_rank(check, sp.ranks.group, sp.ranks.W,
                         lambda q, e: ValueError(f"flashopt: loading the optimizer state failed "
                                                 f"on rank {q}: {e}; nothing was loaded on any "
                                                 f"rank"))
    # The split groups' other elements come from their ranks.
    nf = max((len(elem_buffers(lay.bundle)) for lay in sp.layouts), default=0)
    packing = Packing(sp.layouts, nf)
    fields = []
    for lay, (own, _) in zip(sp.layouts, owns):
        names = elem_buffers(lay.bundle)
        fields.append([own[n] for n in names] + [None] * (nf - len(names)))
    recv = sp.ranks.exchange(sp.layouts, fields, packing).cpu() if nf else None
    datas = []
    for b in sp.bundles():
        if not b.params:
            continue
        tensors, meta = _state.read_codes(b, b.checkpoint_bytes(L.CHECKPOINT_COMPRESSED))
        steps = {}
        for li, lay in enumerate(sp.layouts):
            if lay.bundle is not b:
                continue
            own, step = owns[li]
            fill_pieces(lay, own, tensors, b,
                        lambda fi, pc, dest, lay=lay, li=li, own=own: sp.ranks.fill(
                            lay, li, fi, own[elem_buffers(b)[fi]], recv, packing, pc, dest))
            for pc in lay.pieces:
                steps[pc.name] = step
        datas.append((b, _state.write_codes(b, tensors, _state.without_checksums(
            _state.with_steps(meta, steps)))))
    for b, data in datas:
        b.load_checkpoint_bytes(data)
    for lay, (_, step) in zip(sp.layouts, owns):
        lay.bundle.set_external_step(lay.gid, step)
