"""torch.optim drop-ins over libflashopt: FlashSGD, FlashSGDW, FlashAdam,
FlashAdamW, FlashLion.

Each optimizer keeps one libflashopt optimizer ("bundle") per (parameter
dtype, device) it sees: usually one (a bf16 model), two with cast_model
(bf16 weights, fp32 norm layers). A step() is one flashopt_step call per
bundle (plus one flashopt_set_grads when gradient memory moved, and one
flashopt_set_hyper per changed hyper-parameter), whatever the number of
parameters.
"""

from __future__ import annotations

import ctypes
import json
import os
import tempfile
import warnings
from typing import Any, Callable, Dict, List, Optional

import torch
from torch.optim import Optimizer

from . import _lib as L
from ._lib import FlashOptError

from ._bundle import (_DTYPES, MissingBundleError, _Bundle, _device_key,
                      _float, _is_dtensor)

__all__ = [
    "FlashOptimizer", "FlashSGD", "FlashSGDW", "FlashAdam", "FlashAdamW", "FlashLion",
    "MissingBundleError", "NumericsError", "spec_name",
]


class NumericsError(FlashOptError):
    """check_numerics() found a parameter its lr cannot move (or NaN/Inf)."""

    def __init__(self, code, message, report):
        super().__init__(code, message)
        self.report = report


def spec_name(rule: str, dtype: torch.dtype, master_weight_bits: Optional[int],
              quantize: bool, arithmetic: str = "exact", numerics: str = "bounded") -> str:
    """The shipped spec (specs/<name>.json) for a parameter dtype and mode.

    fp32 parameters are their own master weights: master_weight_bits does not
    apply to them. Unquantized states (quantize=False) are plain fp32.
    arithmetic="fast" selects the spec of the portable fast mode
    (docs/NUMERICS.md §7), `<name>_fast`. numerics="flashoptim" selects
    FlashOptim's numerics (docs/NUMERICS.md §8), `<name>_flashoptim`, where
    they differ from the bounded ones: quantized states, and Adam's bound.
    """
    d = _DTYPES[dtype][1]
    master = "" if dtype == torch.float32 else {None: "", 24: "_m24", 32: "_m32"}[master_weight_bits]
    fast = "_fast" if arithmetic == "fast" else ""
    differs = quantize or rule in ("adam", "adamw")
    fo = "_flashoptim" if numerics == "flashoptim" and differs else ""
    return f"{rule}_{d}{master}{'' if quantize else '_f32states'}{fast}{fo}"


class FlashOptimizer(Optimizer):
    """The base of the five optimizers (not used directly)."""

    _rule = ""

    def __init__(self, params, defaults: Dict[str, Any], *, master_weight_bits: Optional[int] = 24,
                 quantize: bool = True, check_numerics: bool = False, arithmetic: str = "exact",
                 numerics: str = "bounded"):
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
        self._constructor_lr = defaults["lr"]
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
            raise TypeError("flashopt: DTensor parameters (FSDP2 / tensor parallel) are not "
                            "supported; use DistributedDataParallel or ZeroRedundancyOptimizer")
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

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        params = param_group["params"]
        if isinstance(params, torch.Tensor):
            params = [params]
        elif isinstance(params, set):
            raise TypeError("optimizer parameters need to be organized in ordered collections")
        else:
            params = list(params)
        for p in params:
            self._check_param(p)
        # Bundles for every (dtype, device) first: a missing one changes nothing.
        new_bundles = {}
        for p in params:
            key = (p.dtype, str(p.device))
            if key not in self._bundles and key not in new_bundles:
                spec = spec_name(self._rule, p.dtype, self.master_weight_bits, self.quantize,
                                 self.arithmetic, self.numerics)
                new_bundles[key] = _Bundle(type(self).__name__, spec, p.dtype, p.device,
                                           self._mode(p.dtype))
        # Overlapping memory (two views of one storage) is refused by the library;
        # check here so that nothing is half registered (sorted spans: O(n log n)).
        # The same tensor twice is torch's business (a warning within a group,
        # an error across groups); it is registered once.
        spans = sorted({id(q): (str(q.device), q.data_ptr(),
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
            b = self._bundles[(p.dtype, str(p.device))]
            idx = b.add(p, gi, self._num_params)
            self._where[id(p)] = (b, idx)
            self._num_params += 1
        for b in self._bundles.values():
            b.ensure_groups(len(self.param_groups))
        self._sync_group(gi)

    # ---- hyper-parameters ----------------------------------------------------------
    def _hypers(self, group: Dict[str, Any]) -> Dict[str, float]:  # pragma: no cover
        raise NotImplementedError

    def _sync_group(self, gi: int):
        values = self._hypers(self.param_groups[gi])
        for b in self._bundles.values():
            for name, v in values.items():
                if name in b.hyper_names:
                    b.set_hyper(gi, name, v)

    def _sync_hypers(self):
        for gi in range(len(self.param_groups)):
            self._sync_group(gi)

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

    def _set_grads(self, b: _Bundle, idx: List[int], ptrs: List[int]):
        if not idx:
            return
        n = len(idx)
        L.check(b._lib.flashopt_set_grads(b.handle, n, (ctypes.c_int64 * n)(*idx),
                                          (ctypes.c_void_p * n)(*ptrs), b.grad_code),
                "flashopt_set_grads")
        for i, p in zip(idx, ptrs):
            b.grad_ptrs[i] = p

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
        self._sync_hypers()
        if self._check_numerics_each_step:
            self.check_numerics()
        plans = [(b, self._gather(b)) for b in self._bundles.values()]
        for b, (present, ch_i, ch_p, full) in plans:
            if not present:
                continue
            if b.device.type == "cuda":
                # libflashopt launches on its own stream: the gradients torch
                # wrote on its current stream must be complete first.
                torch.cuda.current_stream(b.device).synchronize()
            self._set_grads(b, ch_i, ch_p)
            if full:
                L.check(b._lib.flashopt_step(b.handle), "flashopt_step")
            else:  # torch skips parameters without gradient
                for i in present:
                    L.check(b._lib.flashopt_step_param(b.handle, i), "flashopt_step_param")
            if b.device.type == "cuda":
                L.check(b._lib.flashopt_synchronize(b.handle), "flashopt_synchronize")
        return loss

    def _step_one(self, p: torch.Tensor):
        """Steps one parameter now (gradient release)."""
        b, i = self._where[id(p)]
        g = p.grad
        if g is None:
            return
        self._sync_group(b.groups[i])
        if g.layout is not torch.strided:
            raise RuntimeError("flashopt: sparse gradients are not supported")
        ptr = g.data_ptr()
        if ptr != b.grad_ptrs[i]:
            L.call("flashopt_set_grad", b.handle, i, ctypes.c_void_p(ptr), b.grad_code, g.numel())
            b.grad_ptrs[i] = ptr
        if b.device.type == "cuda":
            torch.cuda.current_stream(b.device).synchronize()
        L.call("flashopt_step_param", b.handle, i)
        if b.device.type == "cuda":
            L.call("flashopt_synchronize", b.handle)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._gradient_release is not None:
            warnings.warn("flashopt: zero_grad() does nothing while gradient release is enabled")
            return
        super().zero_grad(set_to_none=set_to_none)

    # ---- reports ---------------------------------------------------------------------
    def memory_report(self) -> Dict[str, float]:
        """Exact optimizer-side bytes (libflashopt's report summed over bundles)."""
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
        reports = []
        for b in self._bundles.values():
            r = L.NumericsReport()
            st = b._lib.flashopt_check_numerics(b.handle, ctypes.byref(r))
            if st == L.ERROR_NUMERICS:
                msg = b._lib.flashopt_last_error().decode()
                raise NumericsError(st, msg, r)
            L.check(st, "flashopt_check_numerics")
            reports.append(r)
        return reports

    # ---- master weights ----------------------------------------------------------------
    def export_master(self, p: torch.Tensor) -> torch.Tensor:
        """The fp32 master weight of parameter p (p plus its correction term)."""
        b, i = self._where[id(p)]
        out = torch.empty(p.shape, dtype=torch.float32)
        L.call("flashopt_export_master_f32", b.handle, i, ctypes.c_void_p(out.data_ptr()),
               out.numel())
        return out.to(p.device)

    def import_master(self, p: torch.Tensor, value: torch.Tensor) -> None:
        """Sets parameter p (and its correction term) from an fp32 master weight."""
        b, i = self._where[id(p)]
        v = value.detach().to(device="cpu", dtype=torch.float32).contiguous()
        if v.numel() != p.numel():
            raise ValueError(f"flashopt: import_master: {v.numel()} values for a parameter of "
                             f"{p.numel()}")
        L.call("flashopt_import_master_f32", b.handle, i, ctypes.c_void_p(v.data_ptr()),
               v.numel())

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

    def save_checkpoint(self, path, compressed: bool = True) -> None:
        """A safetensors checkpoint written by libflashopt (atomic). With more
        than one bundle (mixed dtypes), one file per bundle: <path> holds the
        first, <path>.<spec> the others."""
        fmt = L.CHECKPOINT_COMPRESSED if compressed else L.CHECKPOINT_F32
        for k, b in enumerate(self._bundle_list()):
            b.save(str(path) if k == 0 else f"{path}.{b.spec}", fmt)

    def load_checkpoint(self, path) -> None:
        """Loads what save_checkpoint wrote (same spec, same parameters);
        hyper-parameters come back into param_groups."""
        bs = self._bundle_list()
        files = [str(path) if k == 0 else f"{path}.{b.spec}" for k, b in enumerate(bs)]
        for f in files:
            if not os.path.isfile(f):
                raise FileNotFoundError(f"flashopt: checkpoint {f} not found")
        for b, f in zip(bs, files):
            b.load(f)
        self._hypers_from_bundles()

    def checkpoint_paths(self, path) -> List[str]:
        return [str(path) if k == 0 else f"{path}.{b.spec}"
                for k, b in enumerate(self._bundle_list())]

    def _hypers_from_bundles(self):
        """param_groups[i] hyper-parameters from the first bundle (after a load)."""
        if not self._bundles:
            return
        b = self._bundle_list()[0]
        for gi, group in enumerate(self.param_groups):
            vals = {}
            for name in b.hyper_names:
                d = ctypes.c_double()
                L.call("flashopt_get_hyper", b.handle, gi, name.encode(), ctypes.byref(d))
                vals[name] = d.value
            self._group_from_hypers(group, vals)
        self._sync_hypers()

    def _group_from_hypers(self, group, vals):  # pragma: no cover - per class
        pass

    # ---- state_dict ----------------------------------------------------------------------
    def state_dict(self) -> Dict[str, Any]:
        """torch's layout ({'state', 'param_groups'}) with fp32 states per
        parameter index ('step', 'exp_avg', ...), plus 'flashopt': the exact
        compressed tensors (codes, scales, correction terms, parameters) and
        metadata of every bundle, as libflashopt checkpoints them."""
        from safetensors import safe_open
        groups = []
        ids = {}
        for g in self.param_groups:
            d = {k: v for k, v in g.items() if k != "params"}
            d["params"] = []
            for p in g["params"]:
                ids[id(p)] = len(ids)
                d["params"].append(ids[id(p)])
            groups.append(d)
        state: Dict[int, Dict[str, torch.Tensor]] = {}
        bundles = {}
        with tempfile.TemporaryDirectory(prefix="flashopt-sd-") as tmp:
            for b in self._bundle_list():
                exact, f32 = os.path.join(tmp, "c.safetensors"), os.path.join(tmp, "f.safetensors")
                b.save(exact, L.CHECKPOINT_COMPRESSED)
                b.save(f32, L.CHECKPOINT_F32)
                with safe_open(exact, framework="pt") as f:
                    bundles[b.spec] = {"metadata": dict(f.metadata()),
                                       "tensors": {k: f.get_tensor(k).clone() for k in f.keys()}}
                with safe_open(f32, framework="pt") as f:
                    keys = set(f.keys())
                    for i, p in enumerate(b.params):
                        gid = b.global_ids[i]
                        name = f"p{gid}"
                        st = {"step": torch.tensor(float(b.get_step(i)))}
                        for k in keys:
                            if k.startswith(name + ".") and "." not in k[len(name) + 1:]:
                                st[k[len(name) + 1:]] = f.get_tensor(k).reshape(p.shape).clone()
                        state[gid] = st
        return {"state": state, "param_groups": groups,
                "flashopt": {"version": 1, "bundles": bundles}}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Loads a state_dict() of this optimizer exactly (its 'flashopt'
        entry), or, without one, the fp32 states of a torch.optim state dict of
        the same parameters ('exp_avg', 'momentum_buffer', ...)."""
        from safetensors.torch import save_file
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        for mine, theirs in zip(self.param_groups, groups):
            if len(mine["params"]) != len(theirs["params"]):
                raise ValueError("loaded state dict contains a parameter group that doesn't "
                                 "match the size of optimizer's group")
        fo = state_dict.get("flashopt")
        with tempfile.TemporaryDirectory(prefix="flashopt-sd-") as tmp:
            files = []
            for b in self._bundle_list():
                path = os.path.join(tmp, b.spec + ".safetensors")
                if fo is not None:
                    if b.spec not in fo["bundles"]:
                        raise ValueError(f"flashopt: the state dict has no state for {b.spec} "
                                         f"(it has {sorted(fo['bundles'])})")
                    e = fo["bundles"][b.spec]
                    save_file({k: v.contiguous() for k, v in e["tensors"].items()}, path,
                              metadata=e["metadata"])
                else:
                    self._f32_file_from_torch_state(b, state_dict["state"], path, tmp)
                files.append((b, path))
            # Everything is written and well-formed before any bundle changes;
            # the library validates each file fully before it changes anything.
            for b, path in files:
                b.load(path)
        for mine, theirs in zip(self.param_groups, groups):
            for k, v in theirs.items():
                if k != "params":
                    mine[k] = v
        self._sync_hypers()

    def _f32_file_from_torch_state(self, b: _Bundle, state, path, tmp):
        from safetensors import safe_open
        from safetensors.torch import save_file
        cur = os.path.join(tmp, "current.safetensors")
        b.save(cur, L.CHECKPOINT_F32)
        with safe_open(cur, framework="pt") as f:
            meta = dict(f.metadata())
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        steps = {}
        for i, p in enumerate(b.params):
            gid = b.global_ids[i]
            st = state.get(gid, state.get(str(gid)))
            if st is None:
                continue
            name = f"p{gid}"
            for k, v in st.items():
                if k == "step":
                    steps[name] = int(_float(v))
                    continue
                key = f"{name}.{k}"
                if key not in tensors:
                    raise KeyError(f"flashopt: {b.spec} has no state {k!r} (parameter {gid})")
                tensors[key] = v.detach().to("cpu", torch.float32).reshape(-1).contiguous()
        if steps:
            meta = _with_steps(meta, steps)
        # The tensors are torch's now: the library's per-tensor checksums of
        # the file it wrote no longer apply (a file without them loads).
        meta.pop("checksums", None)
        meta.pop("metadata_checksum", None)  # and the metadata changed
        save_file(tensors, path, metadata=meta)


def _with_steps(meta: Dict[str, str], steps: Dict[str, int]) -> Dict[str, str]:
    """The checkpoint metadata with per-parameter step counters replaced."""
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


def _check_common(lr, weight_decay, kw):
    if not isinstance(lr, torch.Tensor) and lr < 0.0:
        raise ValueError(f"Invalid learning rate: {lr}")
    if weight_decay < 0.0:
        raise ValueError(f"Invalid weight_decay value: {weight_decay}")
    for k in ("maximize", "differentiable", "capturable"):
        if kw.get(k):
            raise NotImplementedError(f"flashopt: {k}=True is not supported")
    for k in ("foreach", "fused"):
        if kw.get(k):
            warnings.warn(f"flashopt: {k}={kw[k]} is ignored (flashopt steps fused over all "
                          "parameters)")


def _check_betas(betas, eps=None):
    if not 0.0 <= betas[0] < 1.0:
        raise ValueError(f"Invalid beta parameter at index 0: {betas[0]}")
    if not 0.0 <= betas[1] < 1.0:
        raise ValueError(f"Invalid beta parameter at index 1: {betas[1]}")
    if eps is not None and not 0.0 <= eps:
        raise ValueError(f"Invalid epsilon value: {eps}")


class _DecoupledDecay:
    """The hyper-parameters of decoupled weight decay (SGDW, AdamW; Lion
    spells them in its own flat list):
    decouple_lr and the initial_lr that weight decay is scaled by."""

    def _hypers(self, g):
        h = super()._hypers(g)
        h["decouple_lr"] = 1.0 if g["decouple_lr"] else 0.0
        h["initial_lr"] = _float(g.get("initial_lr", g["lr"]))
        return h

    def _group_from_hypers(self, g, v):
        super()._group_from_hypers(g, v)
        g["decouple_lr"], g["initial_lr"] = bool(v["decouple_lr"]), v["initial_lr"]


class FlashSGD(FlashOptimizer):
    """torch.optim.SGD (coupled L2 weight decay, momentum, dampening, Nesterov)."""

    _rule = "sgd"

    def __init__(self, params, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0,
                 nesterov=False, *, master_weight_bits=24, quantize=True, check_numerics=False,
                 arithmetic="exact", numerics="bounded", maximize=False, foreach=None, differentiable=False,
                 fused=None):
        _check_common(lr, weight_decay, dict(maximize=maximize, foreach=foreach,
                                             differentiable=differentiable, fused=fused))
        if momentum < 0.0:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening,
                        weight_decay=weight_decay, nesterov=nesterov)
        defaults.update(self._extra_defaults())
        super().__init__(params, defaults, master_weight_bits=master_weight_bits,
                         quantize=quantize, check_numerics=check_numerics,
                         arithmetic=arithmetic, numerics=numerics)

    def _extra_defaults(self):
        return {}

    def _hypers(self, g):
        return {"lr": _float(g["lr"]), "momentum": float(g["momentum"]),
                "dampening": float(g["dampening"]), "weight_decay": float(g["weight_decay"]),
                "nesterov": 1.0 if g["nesterov"] else 0.0}

    def _group_from_hypers(self, g, v):
        g["lr"], g["momentum"], g["dampening"] = v["lr"], v["momentum"], v["dampening"]
        g["weight_decay"], g["nesterov"] = v["weight_decay"], bool(v["nesterov"])


class FlashSGDW(_DecoupledDecay, FlashSGD):
    """SGD with decoupled weight decay: θ ← θ·(1 − lr·wd) (or (1 − lr/initial_lr·wd)
    with decouple_lr=True), then the SGD update without L2 term."""

    _rule = "sgdw"

    def __init__(self, params, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0,
                 nesterov=False, *, decouple_lr=False, **kw):
        self._decouple_lr = bool(decouple_lr)
        super().__init__(params, lr, momentum, dampening, weight_decay, nesterov, **kw)

    def _extra_defaults(self):
        return {"decouple_lr": self._decouple_lr}



class FlashAdam(FlashOptimizer):
    """torch.optim.Adam (coupled L2 weight decay; no amsgrad)."""

    _rule = "adam"
    _default_wd = 0.0

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=None,
                 amsgrad=False, *, master_weight_bits=24, quantize=True, check_numerics=False,
                 arithmetic="exact", numerics="bounded", maximize=False, foreach=None, capturable=False,
                 differentiable=False, fused=None, **extra):
        if weight_decay is None:
            weight_decay = self._default_wd
        _check_common(lr, weight_decay, dict(maximize=maximize, foreach=foreach,
                                             capturable=capturable,
                                             differentiable=differentiable, fused=fused))
        _check_betas(betas, eps)
        if amsgrad:
            raise NotImplementedError("flashopt: amsgrad=True is not supported")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)
        defaults.update(extra)
        super().__init__(params, defaults, master_weight_bits=master_weight_bits,
                         quantize=quantize, check_numerics=check_numerics,
                         arithmetic=arithmetic, numerics=numerics)

    def _hypers(self, g):
        b1, b2 = g["betas"]
        return {"lr": _float(g["lr"]), "beta1": _float(b1), "beta2": _float(b2),
                "eps": float(g["eps"]), "weight_decay": float(g["weight_decay"])}

    def _group_from_hypers(self, g, v):
        g["lr"], g["betas"], g["eps"] = v["lr"], (v["beta1"], v["beta2"]), v["eps"]
        g["weight_decay"] = v["weight_decay"]


class FlashAdamW(_DecoupledDecay, FlashAdam):
    """torch.optim.AdamW (decoupled weight decay θ·(1 − lr·wd), default 1e-2;
    decouple_lr=True: θ·(1 − lr/initial_lr·wd), FlashOptim's option)."""

    _rule = "adamw"
    _default_wd = 1e-2

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 amsgrad=False, *, decouple_lr=False, **kw):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad,
                         decouple_lr=bool(decouple_lr), **kw)



class FlashLion(FlashOptimizer):
    """Lion (Chen et al. 2023): u = sign(β1·m + (1−β1)·g); θ ← θ·(1 − lr·wd) − lr·u;
    m ← β2·m + (1−β2)·g. Defaults as FlashOptim's FlashLion."""

    _rule = "lion"

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.0, *,
                 decouple_lr=False, master_weight_bits=24, quantize=True, check_numerics=False,
                 arithmetic="exact", numerics="bounded", maximize=False, foreach=None, differentiable=False,
                 fused=None):
        _check_common(lr, weight_decay, dict(maximize=maximize, foreach=foreach,
                                             differentiable=differentiable, fused=fused))
        _check_betas(betas)
        defaults = dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay,
                        decouple_lr=bool(decouple_lr))
        super().__init__(params, defaults, master_weight_bits=master_weight_bits,
                         quantize=quantize, check_numerics=check_numerics,
                         arithmetic=arithmetic, numerics=numerics)

    def _hypers(self, g):
        b1, b2 = g["betas"]
        return {"lr": _float(g["lr"]), "beta1": _float(b1), "beta2": _float(b2),
                "weight_decay": float(g["weight_decay"]),
                "decouple_lr": 1.0 if g["decouple_lr"] else 0.0,
                "initial_lr": _float(g.get("initial_lr", g["lr"]))}

    def _group_from_hypers(self, g, v):
        g["lr"], g["betas"] = v["lr"], (v["beta1"], v["beta2"])
        g["weight_decay"], g["decouple_lr"] = v["weight_decay"], bool(v["decouple_lr"])
        g["initial_lr"] = v["initial_lr"]
