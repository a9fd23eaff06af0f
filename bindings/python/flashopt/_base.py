"""FlashOptimizer: what the five torch.optim drop-ins (optim.py) share.

Each optimizer keeps one libflashopt optimizer ("bundle", _bundle.py) per
(parameter dtype, device) it sees: usually one (a bf16 model), two with
cast_model (bf16 weights, fp32 norm layers). A step() is one flashopt_step
call per bundle (plus one flashopt_set_grads when gradient memory moved, and
one flashopt_set_hyper per changed hyper-parameter), whatever the number of
parameters. The class calls bundle methods only; the checkpoint format is
_state.py's.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Callable, Dict, List, NamedTuple, Optional

import torch
from torch.optim import Optimizer

from . import _lib as L
from . import _dtensor_state, _specs, _state
from ._bundle import _DTYPES, GRAD_SCALE, _Bundle, _device_key, _float, _is_dtensor
from ._views import ParamState


def spec_name(rule: str, dtype: torch.dtype, master_weight_bits: Optional[int],
              quantize: bool, arithmetic: str = "exact", numerics: str = "bounded") -> str:
    """The bundle of the kernels directory that runs for these options (the
    one whose manifest says it computes them: _specs.py), or a
    MissingBundleError.

    fp32 parameters are their own master weights: master_weight_bits does not
    apply to them. Unquantized states (quantize=False) are plain fp32.
    arithmetic="fast" is the portable fast mode (docs/NUMERICS.md §7);
    numerics="flashoptim" FlashOptim's numerics (docs/NUMERICS.md §8), which
    differ from the bounded ones in quantized states and Adam's bound (SGD
    and Lion with fp32 states compute the same bits either way).
    """
    return _specs.select(rule, dtype, master_weight_bits, quantize, arithmetic, numerics)


class Hyper(NamedTuple):
    """How param_groups spells one kernel hyper-parameter: group[key], or
    group[key][index] (betas), as a float or a bool (1.0/0.0); `default` is
    the key read when `key` is absent (initial_lr falls back to lr)."""

    key: str
    index: Optional[int] = None
    kind: type = float
    default: Optional[str] = None

    def read(self, group: Dict[str, Any]) -> float:
        v = group[self.key] if self.key in group or self.default is None else group[self.default]
        if self.index is not None:
            v = v[self.index]
        if self.kind is bool:
            return 1.0 if v else 0.0
        return _float(v)

    def write(self, group: Dict[str, Any], value: float) -> None:
        v = bool(value) if self.kind is bool else value
        if self.index is None:
            group[self.key] = v
            return
        cur = list(group.get(self.key, ()))
        cur += [0.0] * (self.index + 1 - len(cur))
        cur[self.index] = v
        group[self.key] = tuple(cur)


_OPTIONS_DOC = """
    Options every flashopt optimizer takes (keyword only):
        master_weight_bits (24, 32 or None): the master weight of bf16/fp16
            parameters: the parameter plus an 8-bit (24) or 16-bit (32)
            correction term, or the parameter alone (None). Ignored for
            fp32 parameters. Default 24.
        quantize (bool): 8-bit companded states (True, default) or fp32.
        check_numerics (bool): run check_numerics() before every step.
        arithmetic ("exact" or "fast"): the bundle's arithmetic
            (docs/NUMERICS.md §7).
        numerics ("bounded" or "flashoptim"): the state numerics
            (docs/NUMERICS.md §8). "bounded" (default): dithered 8-bit
            codes that decay like the exact states, Adam's update bounded
            by exact Adam's own bound, saturating scales. "flashoptim":
            FlashOptim's, bit-identical to its kernels (exact arithmetic
            only), to reproduce a FlashOptim run.
        maximize, differentiable, capturable: torch's; True is refused.
        foreach, fused: torch's; ignored with a warning (flashopt steps all
            parameters in one fused call).
"""

_TORCH_REFUSED = ("maximize", "differentiable", "capturable")
_TORCH_IGNORED = ("foreach", "fused")


class FlashOptimizer(Optimizer):
    """The base of the five optimizers (not used directly).

    Subclasses set `_rule` (the spec's rule) and `_hyper_table` (kernel
    hyper-parameter -> Hyper), which drives both directions between
    param_groups and the library.

    torch.amp.GradScaler: `_step_supports_amp_scaling` is True, so the scaler
    passes `grad_scale` and `found_inf` to step() instead of unscaling the
    gradients itself (which it refuses for fp16). step() multiplies the
    gradients by 1/grad_scale inside the kernels (their "grad_scale"
    hyper-parameter: no extra pass over memory) and skips the whole step,
    counters included, when found_inf is non-zero.
    """

    _rule = ""
    _hyper_table: Dict[str, Hyper] = {}
    _step_supports_amp_scaling = True

    def __init__(self, params, defaults: Dict[str, Any], *, master_weight_bits: Optional[int] = 24,
                 quantize: bool = True, check_numerics: bool = False, arithmetic: str = "exact",
                 numerics: str = "bounded",
                 maximize: bool = False, foreach: Optional[bool] = None,
                 differentiable: bool = False, capturable: bool = False,
                 fused: Optional[bool] = None):
        for name, value in zip(_TORCH_REFUSED, (maximize, differentiable, capturable)):
            if value:
                raise NotImplementedError(f"flashopt: {name}=True is not supported")
        for name, value in zip(_TORCH_IGNORED, (foreach, fused)):
            if value:
                warnings.warn(f"flashopt: {name}={value} is ignored (flashopt steps fused over "
                              "all parameters)")
        if master_weight_bits not in (None, 24, 32):
            raise ValueError(f"master_weight_bits must be None, 24 or 32, not {master_weight_bits!r}")
        if arithmetic not in ("exact", "fast"):
            raise ValueError(f"arithmetic must be 'exact' or 'fast', not {arithmetic!r}")
        if numerics not in ("bounded", "flashoptim"):
            raise ValueError(f"numerics must be 'bounded' or 'flashoptim', not {numerics!r}")
        if numerics == "flashoptim" and arithmetic == "fast":
            raise ValueError("numerics='flashoptim' reproduces FlashOptim's kernels bit for bit, "
                             "which have no fast arithmetic; use arithmetic='exact'")
        self.master_weight_bits = master_weight_bits
        self.quantize = bool(quantize)
        self.arithmetic = arithmetic
        self.numerics = numerics
        self._check_numerics_each_step = bool(check_numerics)
        self._bundles: Dict[tuple, _Bundle] = {}
        self._where: Dict[int, tuple] = {}  # id(param) -> (bundle, index)
        self._num_params = 0
        self._gradient_release = None
        self._kernel_grad_scale = 1.0  # 1/GradScaler's scale for the step at hand
        self._constructor_lr = defaults["lr"]
        # DTensor parameters (FSDP2, Replicate): _dtensor.ShardedParams, once
        # the first is registered.
        self._sharded = None
        super().__init__(params, defaults)

    # ---- parameters ----------------------------------------------------------------
    def _mode(self, dtype) -> str:
        return (f"{dtype} parameters, master_weight_bits={self.master_weight_bits}, "
                f"quantize={self.quantize}, arithmetic={self.arithmetic!r}, "
                f"numerics={self.numerics!r}")

    def _check_param(self, p) -> None:
        if not isinstance(p, torch.Tensor):
            raise TypeError(f"flashopt: optimizer can only optimize Tensors, got {type(p).__name__}")
        if _is_dtensor(p):
            from ._dtensor import check_param
            check_param(self, p)
            return
        if p.layout is not torch.strided:
            raise TypeError(f"flashopt: parameters with layout {p.layout} are not supported")
        if p.dtype not in _DTYPES:
            raise TypeError(f"flashopt: {type(self).__name__} supports bfloat16, float16 and "
                            f"float32 parameters, not {p.dtype} (shape {tuple(p.shape)})")
        _device_key(p.device)
        if not p.is_contiguous():
            raise ValueError(f"flashopt: parameters must be contiguous (shape {tuple(p.shape)})")
        if p.numel() == 0:
            raise ValueError("flashopt: empty parameters are not supported")
        if p.data_ptr() % 16:
            raise ValueError(f"flashopt: parameter memory must be 16-byte aligned "
                             f"(shape {tuple(p.shape)} at {p.data_ptr():#x})")

    @staticmethod
    def _bundle_key(p: torch.Tensor) -> tuple:
        return (p.dtype, _device_key(p.device))

    def _mark_state(self, p, b: _Bundle, index: int) -> None:
        """opt.state[p]: a view of p's state in libflashopt with torch's
        keys, decoded when read (_views.ParamState). flashopt's states exist
        from registration, so `state` is never empty either
        (torch.distributed.checkpoint's get/set_optimizer_state_dict run a
        step with zero gradients when it is, to create torch.optim's lazy
        states, which would advance step counters)."""
        self.state[p] = ParamState(b, index, p)

    def _add_dtensor_group(self, param_group: Dict[str, Any], params) -> None:
        """add_param_group for DTensor parameters (_dtensor.add_group): every
        rank calls it alike; a mismatch across ranks is an error on every rank."""
        from . import _dtensor
        _dtensor.add_group(self, param_group, params, super().add_param_group)

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        params = param_group["params"]
        if isinstance(params, torch.Tensor):
            params = [params]
        elif isinstance(params, set):
            raise TypeError("optimizer parameters need to be organized in ordered collections")
        else:
            params = list(params)
        if self._sharded is not None or any(_is_dtensor(p) for p in params):
            return self._add_dtensor_group(param_group, params)
        for p in params:
            self._check_param(p)
        # Bundles for every (dtype, device) first: a missing one changes nothing.
        new_bundles = {}
        for p in params:
            key = self._bundle_key(p)
            if key not in self._bundles and key not in new_bundles:
                spec = _specs.select(self._rule, p.dtype, self.master_weight_bits,
                                     self.quantize, self.arithmetic, self.numerics,
                                     owner=type(self).__name__)
                new_bundles[key] = _Bundle(type(self).__name__, spec, p.dtype, p.device,
                                           self._mode(p.dtype))
        # Overlapping memory (two views of one storage) is refused by the library;
        # check here so that nothing is half registered (sorted spans: O(n log n)).
        # The same tensor twice is torch's business (a warning within a group,
        # an error across groups); it is registered once.
        spans = sorted({id(q): (self._bundle_key(q)[1], q.data_ptr(),
                                q.data_ptr() + q.numel() * q.element_size())
                        for q in [*(q for g in self.param_groups for q in g["params"]),
                                  *params]}.values())
        for (d0, _, e0), (d1, s1, _) in zip(spans, spans[1:]):
            if d0 == d1 and s1 < e0:
                raise ValueError("flashopt: two parameters share memory (views of one "
                                 "tensor, or one tensor given twice); register each tensor "
                                 "once")
        param_group = dict(param_group)
        param_group["params"] = params
        super().add_param_group(param_group)  # torch's checks: duplicates, defaults
        group = self.param_groups[-1]
        # Each group's own lr is its initial lr (a torch LR scheduler's
        # setdefault keeps it); decouple_lr divides by it.
        group.setdefault("initial_lr", _float(group["lr"]))
        gi = len(self.param_groups) - 1
        self._bundles.update(new_bundles)
        for p in params:
            if id(p) in self._where:
                continue
            b = self._bundles[self._bundle_key(p)]
            idx = b.add(p, gi, self._num_params)
            self._where[id(p)] = (b, idx)
            self._num_params += 1
            self._mark_state(p, b, idx)
        for b in self._bundles.values():
            b.ensure_groups(len(self.param_groups))
        self._sync_group(gi)

    # ---- hyper-parameters ----------------------------------------------------------
    def _hypers(self, group: Dict[str, Any]) -> Dict[str, float]:
        """The kernel hyper-parameters of a param group (from _hyper_table)."""
        return {name: h.read(group) for name, h in self._hyper_table.items()}

    def _group_from_hypers(self, group: Dict[str, Any], vals: Dict[str, float]) -> None:
        """param_groups entries from kernel hyper-parameters (after a load)."""
        for name, h in self._hyper_table.items():
            if name in vals:
                h.write(group, vals[name])

    def _sync_group(self, gi: int):
        values = self._hypers(self.param_groups[gi])
        for b in self._bundles.values():
            for name, v in values.items():
                if name in b.hyper_names:
                    b.set_hyper(gi, name, v)
            if GRAD_SCALE in b.hyper_names:
                b.set_hyper(gi, GRAD_SCALE, self._kernel_grad_scale)
            elif self._kernel_grad_scale != 1.0:
                raise RuntimeError(f"flashopt: the bundle {b.spec} has no \"{GRAD_SCALE}\" "
                                   "hyper-parameter, so GradScaler's scale cannot be folded "
                                   "into its step: rebuild it with this flashopt-gen")

    def _sync_hypers(self):
        for gi in range(len(self.param_groups)):
            self._sync_group(gi)

    def _take_amp_scaling(self) -> bool:
        """Reads what torch.amp.GradScaler set for this step: the factor the
        kernels multiply the gradients by (1/grad_scale), and whether to
        step at all (found_inf zero)."""
        found_inf = getattr(self, "found_inf", None)
        if found_inf is not None and _float(found_inf) != 0.0:
            return False
        grad_scale = getattr(self, "grad_scale", None)
        self._kernel_grad_scale = 1.0 if grad_scale is None else 1.0 / _float(grad_scale)
        return True

    # ---- stepping --------------------------------------------------------------------
    def _gather(self, b: _Bundle):
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
                raise RuntimeError(f"flashopt: {type(self).__name__} does not support sparse "
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

    @staticmethod
    def _stream(b: _Bundle):
        """torch's current stream on a CUDA bundle's device (None on the CPU)."""
        return torch.cuda.current_stream(b.device) if b.device.type == "cuda" else None

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], float]] = None):
        """One optimizer step over every parameter that has a gradient."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._gradient_release is not None:
            warnings.warn("flashopt: step() does nothing while gradient release is enabled "
                          "(parameters are stepped during backward)")
            return loss
        if self._sharded is not None:
            # Every rank steps, and the ranks agree on GradScaler's found_inf
            # in the step's one collective (_dtensor.py).
            go = self._take_amp_scaling()
            self._sync_hypers()
            if self._check_numerics_each_step:
                self.check_numerics()
            self._sharded.step(go, self._stream)
            return loss
        if not self._take_amp_scaling():
            return loss  # GradScaler found an inf: nothing changes, no counter moves
        self._sync_hypers()
        if self._check_numerics_each_step:
            self.check_numerics()
        plans = [(b, self._gather(b)) for b in self._bundles.values()]
        for b, (present, ch_i, ch_p, full) in plans:
            if not present:
                continue
            wait = b.order_after(self._stream(b))
            b.set_grads(ch_i, ch_p)
            if full:
                b.step()
            else:  # torch skips parameters without gradient
                for i in present:
                    b.step_param(i)
            if wait:
                b.synchronize()
        return loss

    def _step_one(self, p: torch.Tensor):
        """Steps one parameter now (gradient release)."""
        if self._sharded is not None:
            # FSDP2 calls the hook after the reduce-scatter, on every rank in
            # the same order: the parameter's split groups are exchanged.
            lay = self._sharded.layout_of(p)
            self._sync_group(lay.gi)
            self._sharded.step(True, self._stream, only=lay)
            return
        b, i = self._where[id(p)]
        g = p.grad
        if g is None:
            return
        self._sync_group(b.groups[i])
        if g.layout is not torch.strided:
            raise RuntimeError("flashopt: sparse gradients are not supported")
        b.set_grad(i, g)
        wait = b.order_after(self._stream(b))
        b.step_param(i)
        if wait:
            b.synchronize()

    def step_param(self, p: torch.Tensor, group: Optional[Dict[str, Any]] = None) -> None:
        """Steps parameter p alone now, with the hyper-parameters of its param
        group (`group`, if given, must be that group). Its gradient stays."""
        if id(p) not in self._where:
            raise ValueError(f"flashopt: step_param: the parameter (shape {tuple(p.shape)}) is "
                             "not in this optimizer")
        if group is not None and not any(q is p for q in group["params"]):
            raise ValueError("flashopt: step_param: the parameter is not in the given group "
                             "(its hyper-parameters are its own group's)")
        with torch.no_grad():
            self._step_one(p)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._gradient_release is not None:
            warnings.warn("flashopt: zero_grad() does nothing while gradient release is enabled")
            return
        super().zero_grad(set_to_none=set_to_none)

    # ---- reports ---------------------------------------------------------------------
    def memory_report(self) -> Dict[str, float]:
        """Exact optimizer-side bytes (libflashopt's report summed over bundles)."""
        if self._sharded is not None:
            return self._sharded.memory()  # this rank's
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
                                for g in self.param_groups for p in g["params"])
        out["total_bytes"] = out["param_bytes"] + out["correction_bytes"] + out["grad_bytes"] + \
            out["state_bytes"]
        out["total_bytes_with_grad_release"] = out["total_bytes"] - out["grad_bytes"]
        out["bytes_per_param"] = out["total_bytes"] / n
        out["bytes_per_param_with_grad_release"] = out["total_bytes_with_grad_release"] / n
        return out

    def specs(self) -> List[str]:
        """The bundles in use, one per (dtype, device)."""
        return [b.spec for b in self._bundles.values()]

    def check_numerics(self) -> List[L.NumericsReport]:
        """Raises NumericsError when some group's lr cannot move its largest
        weight at this master-weight precision (or a parameter is NaN/Inf)."""
        self._sync_hypers()
        if self._sharded is not None:
            return self._sharded.check_numerics()  # collective
        return [b.check_numerics() for b in self._bundles.values()]

    # ---- master weights ----------------------------------------------------------------
    def export_master(self, p: torch.Tensor) -> torch.Tensor:
        """The fp32 master weight of parameter p (p plus its correction term);
        a DTensor placed like p for a DTensor parameter."""
        if self._sharded is not None:
            return self._sharded.export_master(p)
        b, i = self._where[id(p)]
        return b.export_master(i).reshape(p.shape).to(p.device)

    def import_master(self, p: torch.Tensor, value: torch.Tensor) -> None:
        """Sets parameter p (and its correction term) from an fp32 master weight.
        DTensor parameters: `value` is a DTensor placed like p or the full
        tensor, and the call is collective (every rank, same order)."""
        if self._sharded is not None:
            return self._sharded.import_master(p, value)
        b, i = self._where[id(p)]
        b.import_master(i, value)

    def get_fp32_model_state_dict(self, model: torch.nn.Module) -> Dict[str, torch.Tensor]:
        """model.state_dict() with every optimized parameter as its fp32 master weight."""
        sd = model.state_dict()
        names = {id(p): n for n, p in model.named_parameters()}
        for g in self.param_groups:
            for p in g["params"]:
                n = names.get(id(p))
                if n is not None and n in sd:
                    sd[n] = self.export_master(p)
        return sd

    def set_fp32_model_state_dict(self, model: torch.nn.Module,
                                  state_dict: Dict[str, torch.Tensor]) -> None:
        """Loads fp32 master weights (and the model's other entries)."""
        optimized = {}
        for n, p in model.named_parameters():
            if id(p) in self._where:
                optimized[n] = p
        rest = {k: v for k, v in state_dict.items() if k not in optimized}
        missing = [n for n in optimized if n not in state_dict]
        if missing:
            raise KeyError(f"flashopt: set_fp32_model_state_dict: missing {missing[:5]}")
        model.load_state_dict(rest, strict=False)
        for n, p in optimized.items():
            self.import_master(p, state_dict[n])

    # ---- checkpoints -------------------------------------------------------------------
    def _bundle_list(self) -> List[_Bundle]:
        return list(self._bundles.values())

    def checkpoint_paths(self, path) -> List[str]:
        """The files of a checkpoint at `path`: `path` for the first bundle,
        `path.<spec>` for the others."""
        return [str(path) if k == 0 else f"{path}.{b.spec}"
                for k, b in enumerate(self._bundle_list())]

    def save_checkpoint(self, path, compressed: bool = True) -> None:
        """A safetensors checkpoint written by libflashopt (atomic). With more
        than one bundle (mixed dtypes), one file per bundle
        (checkpoint_paths)."""
        self._no_files_for_dtensors()
        fmt = L.CHECKPOINT_COMPRESSED if compressed else L.CHECKPOINT_F32
        for b, f in zip(self._bundle_list(), self.checkpoint_paths(path)):
            b.save(f, fmt)

    def load_checkpoint(self, path) -> None:
        """Loads what save_checkpoint wrote (same spec, same parameters);
        hyper-parameters come back into param_groups."""
        self._no_files_for_dtensors()
        files = self.checkpoint_paths(path)
        for f in files:
            if not os.path.isfile(f):
                raise FileNotFoundError(f"flashopt: checkpoint {f} not found")
        for b, f in zip(self._bundle_list(), files):
            b.load(f)
        self._hypers_from_bundles()

    def _no_files_for_dtensors(self):
        if self._sharded is not None:
            raise NotImplementedError(
                "flashopt: save_checkpoint/load_checkpoint write one process's files; with "
                "DTensor (FSDP2) parameters use torch.distributed.checkpoint: "
                "get_optimizer_state_dict / set_optimizer_state_dict with dcp.save / dcp.load")

    def _hypers_from_bundles(self):
        """param_groups[i] hyper-parameters from the first bundle (after a load)."""
        if not self._bundles:
            return
        b = self._bundle_list()[0]
        for gi, group in enumerate(self.param_groups):
            self._group_from_hypers(group, {n: b.get_hyper(gi, n) for n in b.hyper_names})
        self._sync_hypers()

    # ---- state_dict ----------------------------------------------------------------------
    def state_dict(self, *, fp32_states: bool = False) -> Dict[str, Any]:
        """torch's layout ({'state', 'param_groups'}, parameters by index).
        Per parameter: "step", "flashopt.spec" and its exact compressed
        state in the library's own dtypes (correction term, codes, scales;
        AdamW bf16 + 24-bit: 3.125 B/param, no parameters and no fp32
        copies). Loading it resumes the run bit for bit, given the same
        parameters (the model's state dict holds those).

        fp32_states=True: torch.optim's form instead, "step" and the fp32
        states by torch's names ("exp_avg", "exp_avg_sq", "momentum_buffer"),
        which torch.optim loads; loading it here re-encodes the states.

        DTensor (FSDP2) parameters: the same entries as DTensors of global
        shapes, for torch.distributed.checkpoint (_dtensor_dcp.py)."""
        if self._sharded is not None:
            if fp32_states:
                raise NotImplementedError(
                    "flashopt: state_dict(fp32_states=True) is not available for DTensor "
                    "(FSDP2) parameters; save the compact state dict with "
                    "torch.distributed.checkpoint, and export fp32 from a single process "
                    "(get_optimizer_state_dict(..., full_state_dict=True) loads into one)")
            return self._sharded.state_dict(self.param_groups)
        return _state.state_dict(self.param_groups, self._bundle_list(), fp32_states)

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Loads a state_dict() of this optimizer exactly (its per-parameter
        "flashopt.spec" entries; also the first format's top-level
        'flashopt' entry), or the fp32 states of a torch.optim state dict of
        the same parameters ('exp_avg', 'momentum_buffer', ...), encoded."""
        groups = state_dict["param_groups"]
        _state.check_groups(self.param_groups, groups)
        if self._sharded is not None:
            self._sharded.load_state_dict(state_dict)  # collective; checks first
            self._groups_from(groups)
            return
        bundles = self._bundle_list()
        # Every checkpoint is built and well-formed before any bundle changes;
        # the library validates each fully before it changes anything.
        if _dtensor_state.is_full_state(state_dict):  # DCP's full state of an FSDP2 run
            ckpts = _dtensor_state.plain_checkpoints(bundles, state_dict)
        else:
            ckpts = _state.checkpoints_from_state_dict(bundles, state_dict)
        for b, (data, buffers) in zip(bundles, ckpts):
            b.load_checkpoint_bytes(data)
            for (i, name), v in buffers.items():  # parameters and correction terms
                if name == "param":
                    b.params[i].detach().copy_(v)
                else:
                    b.write_buffer(i, name, v)
        self._groups_from(groups)

    def _groups_from(self, groups) -> None:
        """param_groups entries (not the parameters) from a loaded state dict."""
        for mine, theirs in zip(self.param_groups, groups):
            for k, v in theirs.items():
                if k != "params":
                    mine[k] = v
        self._sync_hypers()
