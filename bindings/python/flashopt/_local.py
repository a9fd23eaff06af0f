"""LocalParams: an optimizer's plain-tensor parameters (the ParamSet of
_params.py for one process's tensors).

Each parameter is registered whole with the bundle (_bundle.py) of its
(dtype, device): usually one (a bf16 model), two with cast_model (bf16
weights, fp32 norm layers). A step is one flashopt_step call per bundle
(plus one flashopt_set_grads when gradient memory moved), whatever the number
of parameters. The state dicts are _state.py's; checkpoint files are the
library's.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, NamedTuple, Tuple

import torch

from . import _dtensor_state, _state
from ._bundle import _DTYPES, _Bundle, _device_key, _is_dtensor
from ._params import MIXED_KINDS, Options, ParamSet, StepHooks, bundle_key, current_stream
from ._views import ParamState


class _Prepared(NamedTuple):
    params: List[torch.Tensor]
    new_bundles: Dict[tuple, _Bundle]


class LocalParams(ParamSet):
    """Plain tensors, each registered whole with its (dtype, device)'s bundle."""

    def __init__(self):
        super().__init__()
        self._where: Dict[int, Tuple[_Bundle, int]] = {}  # id(param) -> (bundle, index)

    def __contains__(self, p) -> bool:
        return id(p) in self._where

    # ---- registration ------------------------------------------------------------
    @staticmethod
    def check_param(p, opts: Options) -> None:
        if not isinstance(p, torch.Tensor):
            raise TypeError(f"flashopt: optimizer can only optimize Tensors, got {type(p).__name__}")
        if p.layout is not torch.strided:
            raise TypeError(f"flashopt: parameters with layout {p.layout} are not supported")
        if p.dtype not in _DTYPES:
            raise TypeError(f"flashopt: {opts.owner} supports bfloat16, float16 and "
                            f"float32 parameters, not {p.dtype} (shape {tuple(p.shape)})")
        _device_key(p.device)
        if not p.is_contiguous():
            raise ValueError(f"flashopt: parameters must be contiguous (shape {tuple(p.shape)})")
        if p.numel() == 0:
            raise ValueError("flashopt: empty parameters are not supported")
        if p.data_ptr() % 16:
            raise ValueError(f"flashopt: parameter memory must be 16-byte aligned "
                             f"(shape {tuple(p.shape)} at {p.data_ptr():#x})")

    def prepare(self, params, param_groups, opts: Options, gradient_release: bool) -> _Prepared:
        if any(_is_dtensor(p) for p in params):
            raise TypeError(MIXED_KINDS)
        for p in params:
            self.check_param(p, opts)
        # Bundles for every (dtype, device) first: a missing one changes nothing.
        new_bundles = {}
        for p in params:
            key = bundle_key(p)
            if key not in self._bundles and key not in new_bundles:
                new_bundles[key] = opts.new_bundle(p.dtype, p.device)
        # Overlapping memory (two views of one storage) is refused by the library;
        # check here so that nothing is half registered (sorted spans: O(n log n)).
        # The same tensor twice is torch's business (a warning within a group,
        # an error across groups); it is registered once.
        spans = sorted({id(q): (bundle_key(q)[1], q.data_ptr(),
                                q.data_ptr() + q.numel() * q.element_size())
                        for q in [*(q for g in param_groups for q in g["params"]),
                                  *params]}.values())
        for (d0, _, e0), (d1, s1, _) in zip(spans, spans[1:]):
            if d0 == d1 and s1 < e0:
                raise ValueError("flashopt: two parameters share memory (views of one "
                                 "tensor, or one tensor given twice); register each tensor "
                                 "once")
        return _Prepared(params, new_bundles)

    def add_group(self, prepared: _Prepared, group, gi: int,
                  mark: Callable[[torch.Tensor], None]) -> None:
        self._bundles.update(prepared.new_bundles)
        for p in prepared.params:
            if id(p) in self._where:
                continue
            b = self._bundles[bundle_key(p)]
            idx = b.add(p, gi, self.num_params)
            self._where[id(p)] = (b, idx)
            self.num_params += 1
            mark(p)
        self._ensure_groups(gi + 1)

    def state_view(self, p, plain_view) -> ParamState:
        b, i = self._where[id(p)]
        return plain_view(b, i, p)

    # ---- stepping ----------------------------------------------------------------
    @staticmethod
    def _gather(b: _Bundle, owner: str):
        """Checks every gradient of a bundle; returns (present indices, changed
        indices, changed pointers, all present)."""
        present, ch_i, ch_p = [], [], []
        gd = b.grad_dtype
        ptrs = b.grad_ptrs
        for i, p in enumerate(b.params):
            g = p.grad
            if g is None:
                continue
            if g.layout is not torch.strided:
                raise RuntimeError(f"flashopt: {owner} does not support sparse "
                                   f"gradients (parameter p{b.global_ids[i]}, shape "
                                   f"{tuple(p.shape)}); nothing was stepped")
            if g.dtype is not gd:
                raise TypeError(f"flashopt: gradient of p{b.global_ids[i]} is {g.dtype}, "
                                f"{b.spec} takes {gd}; nothing was stepped")
            if g.device != p.device:
                raise ValueError(f"flashopt: gradient of p{b.global_ids[i]} is on {g.device}, "
                                 f"its parameter on {p.device}; nothing was stepped")
            if not g.is_contiguous():
                raise ValueError(f"flashopt: gradient of p{b.global_ids[i]} is not contiguous; "
                                 "nothing was stepped")
            ptr = g.data_ptr()
            if ptr % 16:
                raise ValueError(f"flashopt: gradient of p{b.global_ids[i]} is not 16-byte "
                                 "aligned; nothing was stepped")
            present.append(i)
            if ptr != ptrs[i]:
                ch_i.append(i)
                ch_p.append(ptr)
        return present, ch_i, ch_p, len(present) == len(b.params)

    def step(self, go: bool, hooks: StepHooks) -> None:
        if not go:
            return  # GradScaler found an inf: nothing changes, no counter moves
        hooks.prepare()
        plans = [(b, self._gather(b, hooks.owner)) for b in self._bundles.values()]
        for b, (present, ch_i, ch_p, full) in plans:
            if not present:
                continue

            def run(b=b, present=present, full=full):
                if full:
                    b.step()
                else:  # torch skips parameters without gradient
                    for i in present:
                        b.step_param(i)
            b.stepping(current_stream(b), ch_i, ch_p, run)

    def step_one(self, p, hooks: StepHooks) -> None:
        b, i = self._where[id(p)]
        g = p.grad
        if g is None:
            return
        hooks.sync_group(b.groups[i])
        if g.layout is not torch.strided:
            raise RuntimeError("flashopt: sparse gradients are not supported")
        b.set_grad(i, g)
        b.stepping(current_stream(b), [], [], lambda: b.step_param(i))

    # ---- reports, master weights -------------------------------------------------
    def memory(self, param_groups) -> Dict[str, float]:
        """libflashopt's report summed over bundles."""
        keys = ["numel", "param_bytes", "correction_bytes", "grad_bytes", "state_bytes",
                "total_bytes", "total_bytes_with_grad_release", "allocated_bytes"]
        out = {k: 0 for k in keys}
        for b in self._bundles.values():
            r = b.memory()
            for k in keys:
                out[k] += getattr(r, k)
        n = max(out["numel"], 1)
        # The library counts grad bytes only for registered gradients; count the
        # gradient of every parameter (what backward allocates).
        out["grad_bytes"] = sum(p.numel() * p.element_size()
                                for g in param_groups for p in g["params"])
        out["total_bytes"] = out["param_bytes"] + out["correction_bytes"] + out["grad_bytes"] + \
            out["state_bytes"]
        out["total_bytes_with_grad_release"] = out["total_bytes"] - out["grad_bytes"]
        out["bytes_per_param"] = out["total_bytes"] / n
        out["bytes_per_param_with_grad_release"] = out["total_bytes_with_grad_release"] / n
        return out

    def check_numerics(self) -> list:
        return [b.check_numerics() for b in self._bundles.values()]

    def export_master(self, p) -> torch.Tensor:
        b, i = self._where[id(p)]
        return b.export_master(i).reshape(p.shape).to(p.device)

    def import_master(self, p, value: torch.Tensor) -> None:
        b, i = self._where[id(p)]
        b.import_master(i, value)

    # ---- state dicts and checkpoint files ----------------------------------------
    def state_dict(self, param_groups, fp32_states: bool) -> Dict[str, Any]:
        return _state.state_dict(param_groups, self.bundles(), fp32_states)

    def load_state_dict(self, sd: Dict[str, Any]) -> None:
        bundles = self.bundles()
        # Every checkpoint is built and well-formed before any bundle changes;
        # the library validates each fully before it changes anything.
        if _dtensor_state.is_full_state(sd):  # DCP's full state of an FSDP2 run
            ckpts = _dtensor_state.plain_checkpoints(bundles, sd)
        else:
            ckpts = _state.checkpoints_from_state_dict(bundles, sd)
        for b, (data, buffers) in zip(bundles, ckpts):
            b.load_checkpoint_bytes(data)
            for (i, name), v in buffers.items():  # parameters and correction terms
                if name == "param":
                    b.params[i].detach().copy_(v)
                else:
                    b.write_buffer(i, name, v)

    def save_checkpoint(self, path, fmt: int) -> None:
        for b, f in zip(self.bundles(), self.checkpoint_paths(path)):
            b.save(f, fmt)

    def load_checkpoint(self, path) -> None:
        files = self.checkpoint_paths(path)
        for f in files:
            if not os.path.isfile(f):
                raise FileNotFoundError(f"flashopt: checkpoint {f} not found")
        for b, f in zip(self.bundles(), files):
            b.load(f)
