"""opt.state[p] as torch.optim shows it: a view of one parameter's state in
libflashopt.

torch.optim keeps each parameter's state in `opt.state[p]`, a dict of
tensors ("step", "exp_avg", "exp_avg_sq", "momentum_buffer", ...). flashopt
keeps its states compressed inside libflashopt (8- or 4-bit codes and group
scales); `opt.state[p]` is a ParamState, a mapping with torch's keys whose
values are decoded when read:

- `opt.state[p]["exp_avg"]`: a fresh fp32 tensor shaped like p, on p's
  device, decoded from the compressed state of that one parameter
  (flashopt_export_state_f32). It is a copy: changing it in place changes
  nothing in the optimizer.
- `opt.state[p]["exp_avg"] = t`: encodes t into the state exactly as
  load_state_dict() encodes an fp32 state dict (flashopt_import_state_f32).
- `opt.state[p]["step"]`: the parameter's step counter as a float32 tensor,
  as torch keeps it. It is read-only here (load_state_dict sets it).
- `opt.state[p]["flashopt.spec"]`: the bundle (spec) holding the parameter.

Nothing is decoded for `len(opt.state)`, iterating over `opt.state`, over a
ParamState's keys, or `"exp_avg" in opt.state[p]`: only reading a state's
value decodes it, and only that parameter's.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any, Iterator

import torch

# A parameter's entries besides its states (shared with the state dicts).
SPEC_KEY = "flashopt.spec"
STEP_KEY = "step"


class ParamState(MutableMapping):
    """opt.state[p] of a flashopt optimizer (module docstring)."""

    __slots__ = ("_bundle", "_index", "_shape", "_device")

    def __init__(self, bundle, index: int, param: torch.Tensor):
        self._bundle = bundle
        self._index = index
        self._shape = tuple(param.shape)
        self._device = param.device

    def _names(self):
        return (STEP_KEY, *self._bundle.state_names, SPEC_KEY)

    def __getitem__(self, key: str) -> Any:
        b = self._bundle
        if key == STEP_KEY:
            return torch.tensor(float(b.get_step(self._index)), dtype=torch.float32)
        if key == SPEC_KEY:
            return b.spec
        if key in b.state_names:
            v = b.export_state(self._index, key).reshape(self._shape)
            return v if self._device.type == "cpu" else v.to(self._device)
        raise KeyError(key)

    def __setitem__(self, key: str, value: Any) -> None:
        b = self._bundle
        if key in b.state_names:
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"flashopt: opt.state[p][{key!r}] takes a tensor, not "
                                f"{type(value).__name__}")
            n = 1
            for d in self._shape:
                n *= d
            if value.numel() != n:
                raise ValueError(f"flashopt: opt.state[p][{key!r}] takes {n} values (shape "
                                 f"{self._shape}), got shape {tuple(value.shape)}; nothing "
                                 f"was changed")
            b.import_state(self._index, key, value)
            return
        if key == STEP_KEY:
            raise TypeError("flashopt: opt.state[p]['step'] is read-only (the library keeps "
                            "the step counters); set it with load_state_dict()")
        if key == SPEC_KEY:
            raise TypeError(f"flashopt: opt.state[p][{SPEC_KEY!r}] is read-only")
        raise KeyError(f"flashopt: {b.spec} keeps no state {key!r} (it keeps "
                       f"{list(b.state_names)}); opt.state[p] holds only the library's "
                       f"states")

    def __delitem__(self, key: str) -> None:
        raise TypeError(f"flashopt: the states of opt.state[p] cannot be deleted (key {key!r}); "
                        "the library keeps them for every registered parameter")

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())

    def __contains__(self, key: object) -> bool:
        return key in self._names()

    def __repr__(self) -> str:
        # Keys only: a repr must not decode the states.
        return f"ParamState({self._bundle.spec}, keys={list(self._names())})"


class ShardedParamState(ParamState):
    """opt.state[p] of a DTensor parameter (FSDP2): the states as DTensors
    placed like p (this rank's shard decoded from its pieces: no
    communication). Read-only: a quantization group split across ranks is
    encoded on each of them, so a write needs them all; load states with
    load_state_dict / DCP's set_optimizer_state_dict."""

    __slots__ = ("_layout",)

    def __init__(self, layout):
        super().__init__(layout.bundle, -1, layout.p)
        self._layout = layout

    def __getitem__(self, key: str) -> Any:
        lay = self._layout
        b = lay.bundle
        if key == STEP_KEY:
            return torch.tensor(float(lay.step), dtype=torch.float32)
        if key == SPEC_KEY:
            return b.spec
        if key not in b.state_names:
            raise KeyError(key)
        from torch.distributed.tensor import DTensor
        parts = []
        for pc in lay.pieces:
            x, y = max(pc.start, lay.s), min(pc.end, lay.e)
            if y > x:
                parts.append(b.export_state(pc.index, key)[x - pc.start:y - pc.start])
        local_shape = lay.p.to_local().shape
        local = (torch.cat(parts) if parts else torch.empty(0)).reshape(local_shape)
        local = local.to(lay.p.to_local().device)
        return DTensor.from_local(local, lay.p.device_mesh, lay.p.placements, run_check=False,
                                  shape=lay.p.shape, stride=lay.p.stride())

    def __setitem__(self, key: str, value: Any) -> None:
        raise TypeError(
            f"flashopt: opt.state[p][{key!r}] cannot be written for a DTensor (FSDP2) "
            "parameter: a quantization group split across ranks is encoded on each of them. "
            "Load states with load_state_dict or set_optimizer_state_dict")
