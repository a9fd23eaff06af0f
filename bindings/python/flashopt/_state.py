"""The checkpoint format as state_dict()/load_state_dict() see it.

libflashopt writes and reads checkpoints (runtime/src/checkpoint, safetensors:
docs/RUNTIME.md); this module (and, for the exact per-parameter entries of
DTensor parameters, _dtensor_state.py above it) is the Python code that
knows their layout: the tensor names ("<param>", "<param>.<state>", ...),
the __metadata__ entries ("params" with each parameter's "step", "step",
"checksums", "metadata_checksum") and how a torch.optim state dict becomes
an fp32 checkpoint. tests/test_state.py pins what it relies on.

state_dict() (docs/PYTHON.md "The optimizer state"): torch's layout, and per
parameter its "step", "flashopt.spec" and the exact compressed buffers in
their own dtypes, named as the library names them ("correction",
"exp_avg.codes", "exp_avg.scales", ...; an unquantized state under its own
name): per-element buffers shaped like the parameter, per-group ones flat.
4-bit codes are packed two per byte along the parameter's last dimension,
uint8 (*shape[:-1], ceil(shape[-1]/2)), a zero pad nibble per row when it
is odd; a 1-D or 0-D parameter's one code per byte, uint8 (numel,)
(_nibbles.py). The library's own checkpoints pack them flat; read_codes /
write_codes convert at that boundary.
No parameter and no fp32 state: AdamW bf16 + 24-bit is 3.125 B/param (4-bit
states: 2.125), and
the entries survive every tool that keeps only "state" and "param_groups"
(DCP's get_optimizer_state_dict). The FSDP2 form (_dtensor_dcp.py) is the
same entries as DTensors, its scales as row tables. fp32_states=True gives
torch.optim's form instead (fp32 states by torch's names, nothing else).
State dicts of the first format (fp32 states plus a top-level "flashopt"
entry of whole compressed checkpoints) still load.

A checkpoint crosses this module as bytes (_Bundle.checkpoint_bytes /
load_checkpoint_bytes), never as a file.
"""

from __future__ import annotations

import json
import struct
from typing import Any, Dict, List, Tuple

import torch

from . import _lib as L
from . import _nibbles, _specs
from ._bundle import _TORCH_OF, _float
from ._views import SPEC_KEY, STEP_KEY
from .master import decode_master

# The top-level entry of the first state-dict format (whole compressed
# checkpoints per bundle), still loaded.
KEY = "flashopt"


# ---- safetensors bytes ----------------------------------------------------------------
def read(data: bytes) -> Tuple[Dict[str, torch.Tensor], Dict[str, str]]:
    """The tensors (copies) and __metadata__ of safetensors bytes."""
    from safetensors.torch import load
    (n,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(bytes(data[8:8 + n]))
    meta = dict(header.get("__metadata__") or {})
    tensors = {k: v.clone() for k, v in load(bytes(data)).items()}
    return tensors, meta


def write(tensors: Dict[str, torch.Tensor], metadata: Dict[str, str]) -> bytes:
    from safetensors.torch import save
    return save({k: v.contiguous() for k, v in tensors.items()}, metadata=metadata)


def _numels(b) -> Dict[str, int]:
    return {n: p.numel() for n, p in zip(b.names, b.params)}


def read_codes(b, data: bytes) -> Tuple[Dict[str, torch.Tensor], Dict[str, str]]:
    """read() of bundle b's compressed checkpoint bytes, with its packed
    4-bit codes ("<param>.<state>.codes", U8 [ceil(n/2)]) as one code per
    element (uint8 [n], _nibbles.py): the form the binding slices, exchanges
    and reassembles (_dtensor_state.py). write_codes() is the inverse."""
    tensors, meta = read(data)
    if b.packed:
        numels = _numels(b)
        for k, v in tensors.items():
            pname, _, buf = k.partition(".")
            if buf in b.packed and pname in numels:
                tensors[k] = _nibbles.unpack(v, numels[pname])
    return tensors, meta


def write_codes(b, tensors: Dict[str, torch.Tensor], metadata: Dict[str, str]) -> bytes:
    """write() of bundle b's compressed checkpoint tensors holding one code
    per element (read_codes), packed back as the library stores them."""
    if b.packed:
        tensors = dict(tensors)
        numels = _numels(b)
        for k, v in tensors.items():
            pname, _, buf = k.partition(".")
            if buf in b.packed and pname in numels:
                if v.numel() != numels[pname]:
                    raise ValueError(f"flashopt: {k} holds {v.numel()} codes, its parameter "
                                     f"{numels[pname]} elements")
                tensors[k] = _nibbles.pack(v)
    return write(tensors, metadata)


def with_steps(meta: Dict[str, str], steps: Dict[str, int]) -> Dict[str, str]:
    """The checkpoint metadata with per-parameter step counters replaced
    (`steps`: parameter name -> step); "step" becomes the largest."""
    m = dict(meta)
    if "params" in m:
        params = json.loads(m["params"])
        for e in params:
            if isinstance(e, dict) and e.get("name") in steps:
                e["step"] = steps[e["name"]]
        m["params"] = json.dumps(params)
        if steps:
            m["step"] = str(max(steps.values()))
    return m


def without_checksums(meta: Dict[str, str]) -> Dict[str, str]:
    """Metadata for tensors the library did not write: its per-tensor
    checksums no longer apply (a file without them loads), and the metadata
    checksum covers entries that changed."""
    m = dict(meta)
    m.pop("checksums", None)
    m.pop("metadata_checksum", None)
    return m


# ---- state_dict -------------------------------------------------------------------------
def torch_groups(param_groups) -> Tuple[List[Dict[str, Any]], Dict[int, int]]:
    """torch's param_groups layout (parameters as indices) and id(p) -> index."""
    groups, ids = [], {}
    for g in param_groups:
        d = {k: v for k, v in g.items() if k != "params"}
        d["params"] = []
        for p in g["params"]:
            ids[id(p)] = len(ids)
            d["params"].append(ids[id(p)])
        groups.append(d)
    return groups, ids


def state_dict(param_groups, bundles, fp32_states: bool = False) -> Dict[str, Any]:
    """torch's layout ({'state', 'param_groups'}); per parameter index its
    'step', 'flashopt.spec' and exact compressed buffers, or with
    `fp32_states` its 'step' and fp32 states by torch's names (module
    docstring)."""
    groups, _ = torch_groups(param_groups)
    state: Dict[int, Dict[str, Any]] = {}
    for b in bundles:
        if fp32_states:
            for i, p in enumerate(b.params):
                st: Dict[str, Any] = {STEP_KEY: torch.tensor(float(b.get_step(i)))}
                for name in b.state_names:
                    st[name] = b.export_state(i, name).reshape(p.shape)
                state[b.global_ids[i]] = st
            continue
        for i, p in enumerate(b.params):
            st = {STEP_KEY: torch.tensor(float(b.get_step(i))), SPEC_KEY: b.spec}
            for name, per, _ in b.buffers():
                t = b.read_buffer(i, name)
                if name in b.packed:  # 4-bit codes: packed per row (_nibbles.py)
                    st[name] = _nibbles.pack_rows(_nibbles.unpack(t, p.numel()), p.shape)
                else:
                    st[name] = t.reshape(p.shape) if per == "element" else t
            state[b.global_ids[i]] = st
    return {"state": state, "param_groups": groups}


def check_groups(param_groups, groups) -> None:
    """torch's checks of a loaded state dict's param_groups."""
    if len(groups) != len(param_groups):
        raise ValueError("loaded state dict has a different number of parameter groups")
    for mine, theirs in zip(param_groups, groups):
        if len(mine["params"]) != len(theirs["params"]):
            raise ValueError("loaded state dict contains a parameter group that doesn't "
                             "match the size of optimizer's group")


def checkpoints_from_state_dict(bundles, sd: Dict[str, Any]
                                ) -> List[Tuple[bytes, Dict[Tuple[int, str], torch.Tensor]]]:
    """One checkpoint per bundle from a state dict: its KEY entry (exact), or
    without one the fp32 states of a torch.optim state dict of the same
    parameters; each with the buffers to write after it ((parameter index,
    buffer name) -> bits: a FlashOptim state dict's correction terms).
    Everything is built and checked before the caller loads any. (DCP's
    full state of an FSDP2 run, exact per-parameter entries, is
    _dtensor_state.plain_checkpoints'.)"""
    fo = sd.get(KEY)
    out = []
    for b in bundles:
        if fo is not None:
            if b.spec not in fo["bundles"]:
                other = _other_numerics(b.spec, fo["bundles"])
                if other is not None:
                    theirs = _specs.numerics_of(other)
                    raise ValueError(
                        f"flashopt: the state dict was written with numerics={theirs!r} "
                        f"(bundle {other}), but this optimizer runs bundle {b.spec}; "
                        f"nothing was loaded. Build the optimizer with numerics={theirs!r} "
                        f"to resume the run bit for bit (docs/NUMERICS.md §8), or drop the "
                        f"{KEY!r} entry to load only its fp32 states into these numerics")
                raise ValueError(f"flashopt: the state dict has no state for {b.spec} "
                                 f"(it has {sorted(fo['bundles'])})")
            e = fo["bundles"][b.spec]
            out.append((write(e["tensors"], e["metadata"]), {}))
        else:
            out.append(f32_checkpoint_from_torch_state(b, sd["state"], sd.get("param_groups")))
    return out


def _other_numerics(spec: str, have) -> "str | None":
    """The bundle of `have` that computes what `spec` does in the other
    numerics, if any (by the bundles' manifests: _specs.py)."""
    other = _specs.other_numerics(spec)
    return other if other in have else None


def _correction_of(v: torch.Tensor, gid: int, groups) -> torch.Tensor:
    """A FlashOptim state dict's "error_bits" (the correction term) as int8 or
    int16: torch.optim's load casts states to the parameter's dtype, so
    FlashOptim saves an int8 term as its numeric bf16/fp16 value and an int16
    one bit-viewed; the param group's "master_bytewidth" says which."""
    if v.dtype in (torch.int8, torch.int16):
        return v
    width = None
    if groups:
        at = 0
        for g in groups:
            n = len(g["params"])
            if gid < at + n:
                width = g.get("master_bytewidth")
                break
            at += n
    if width == 3:
        return v.to(torch.int8)
    if width == 4 and v.element_size() == 2:
        return v.view(torch.int16)
    raise ValueError(f"flashopt: the 'error_bits' of parameter {gid} are {v.dtype} and its "
                     f"param group gives master_bytewidth {width!r}: not a correction term "
                     f"(int8, int16, or FlashOptim's cast of one with master_bytewidth 3 or 4)")


def f32_checkpoint_from_torch_state(b, state, groups=None):
    """Bundle b's F32 checkpoint with the states and steps of a torch.optim
    state dict (keyed by parameter index) in place of its own, and the
    buffers to write after it. A FlashOptim state dict's "error_bits" are the
    correction term of the parameter as it is now (the model's, loaded
    beside): written as they are when the bundle's term has their width, else
    through the master weight they decode to. compress_state_dict=True ones
    ("<state>::quantized") are refused by name."""
    tensors, meta = read(b.checkpoint_bytes(L.CHECKPOINT_F32))
    mine = _TORCH_OF[b.info.correction_dtype] if b.info.has_correction else None
    steps = {}
    # The f32 form carries the states and steps; the parameters and their
    # correction terms are put back as they are after it (its master weights
    # re-encode to the same values, but not always to the same pair: a
    # correction near half an ulp may move the parameter to its neighbour).
    buffers: Dict[Tuple[int, str], torch.Tensor] = {}
    for i, p in enumerate(b.params):
        buffers[(i, "param")] = p.detach().clone()
        if mine is not None:
            buffers[(i, "correction")] = b.read_buffer(i, "correction")
    for i, gid in enumerate(b.global_ids):
        st = state.get(gid, state.get(str(gid)))
        if st is None:
            continue
        name = b.names[i]
        for k, v in st.items():
            if k == "step":
                steps[name] = int(_float(v))
                continue
            if k.endswith("::quantized") or k.endswith("::scales"):
                raise ValueError(
                    f"flashopt: parameter {gid}'s state {k!r} is FlashOptim's compressed form "
                    f"(compress_state_dict=True), whose codes flashopt does not read; save it "
                    f"from FlashOptim with compress_state_dict=False (dequantized states, which "
                    f"load here); nothing was loaded")
            if k == "error_bits":
                p = b.params[i]
                if v.numel() != p.numel():
                    raise ValueError(f"flashopt: parameter {gid}'s 'error_bits' hold "
                                     f"{v.numel()} values, the parameter {p.numel()}")
                corr = _correction_of(v.detach().cpu(), gid, groups).reshape(-1)
                master = decode_master(p.detach().reshape(-1), corr).cpu()
                if corr.dtype == mine:
                    buffers[(i, "correction")] = corr.contiguous()
                tensors[name] = master
                continue
            key = f"{name}.{k}"
            if key not in tensors:
                raise KeyError(f"flashopt: {b.spec} has no state {k!r} (parameter {gid})")
            tensors[key] = v.detach().to("cpu", torch.float32).reshape(-1).contiguous()
    if steps:
        meta = with_steps(meta, steps)
    # The tensors are torch's now.
    return write(tensors, without_checksums(meta)), buffers
