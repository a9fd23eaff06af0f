"""cast_model and gradient release."""

from __future__ import annotations

import fnmatch
import weakref
from typing import Any, Callable, Dict, Iterable, Optional

import torch
from torch import nn

__all__ = ["cast_model", "enable_gradient_release", "GradientReleaseHandle"]

_NORM_TYPES = (nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm,
               nn.LocalResponseNorm) + ((nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ())


def _to_f32_inputs(module, args):
    return tuple(a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                 for a in args)


def _make_output_cast(dtype):
    def hook(module, args, output):
        if isinstance(output, torch.Tensor) and output.is_floating_point():
            return output.to(dtype)
        if isinstance(output, tuple):
            return tuple(o.to(dtype) if isinstance(o, torch.Tensor) and o.is_floating_point()
                         else o for o in output)
        return output
    return hook


def cast_model(model: nn.Module, dtype: torch.dtype = torch.bfloat16, *,
               full_precision_layers: Optional[Iterable] = None,
               keep_norms_fp32: bool = True) -> nn.Module:
    """Casts the model's floating parameters and buffers to `dtype` in place,
    except normalization layers (BatchNorm, SyncBatchNorm, InstanceNorm,
    LayerNorm, GroupNorm, RMSNorm; unless keep_norms_fp32=False) and the
    modules named in `full_precision_layers` (fnmatch patterns on dotted
    names, or modules), which stay float32. Those fp32 modules get their
    floating positional inputs cast to float32 and their floating outputs
    cast back to `dtype`, so a bf16 model runs end to end. Returns the
    model."""
    patterns, objs = [], set()
    for x in full_precision_layers or ():
        if isinstance(x, str):
            patterns.append(x)
        else:
            objs.add(id(x))

    def keep_fp32(name, m):
        return ((keep_norms_fp32 and isinstance(m, _NORM_TYPES)) or id(m) in objs
                or any(fnmatch.fnmatchcase(name, p) for p in patterns))

    fp32_modules = []
    for name, m in model.named_modules():
        if keep_fp32(name, m):
            fp32_modules.append(m)
    inside = set()
    for m in fp32_modules:
        for sub in m.modules():
            inside.add(id(sub))
    for m in model.modules():
        if id(m) in inside:
            continue
        for pname, p in list(m.named_parameters(recurse=False)):
            if p.is_floating_point() and p.dtype != dtype:
                p.data = p.data.to(dtype)
        for bname, b in list(m.named_buffers(recurse=False)):
            if b is not None and b.is_floating_point() and b.dtype != dtype:
                setattr(m, bname, b.to(dtype))
    for m in fp32_modules:
        m.float()
        m.register_forward_pre_hook(_to_f32_inputs)
        m.register_forward_hook(_make_output_cast(dtype))
    return model


class GradientReleaseHandle:
    """Returned by enable_gradient_release; remove() restores normal stepping."""

    def __init__(self, optimizer, hooks):
        self._opt = weakref.ref(optimizer)
        self._hooks = hooks

    @property
    def active(self) -> bool:
        """Whether the hooks are still attached (remove() not yet called)."""
        return bool(self._hooks)

    def remove(self):
        for h in self._hooks:
            h.remove()
        self._hooks = []
        opt = self._opt()
        if opt is not None:
            opt._gradient_release = None


def enable_gradient_release(model: nn.Module, optimizer, *,
                            pre_step: Optional[Callable[[torch.Tensor, Dict[str, Any]], bool]]
                            = None) -> GradientReleaseHandle:
    """Steps each parameter as soon as its gradient is accumulated during
    backward (register_post_accumulate_grad_hook), then frees the gradient:
    gradients of the whole model never exist at once. optimizer.step() and
    zero_grad() become no-ops (with a warning) until handle.remove().
    Numerically identical to backward() followed by step(). Not with
    DistributedDataParallel (gradients must be averaged first) or with
    gradient accumulation. With FSDP2 (fully_shard) each parameter is
    stepped when its reduce-scattered gradient shard is assigned (FSDP2 calls
    the hook then, on every rank in the same order), and that shard is freed
    (a collective per parameter for its shared groups).

    pre_step(param, group), if given, runs before each parameter's step with
    its param group (as at enable time); returning False skips that step and
    keeps the gradient (e.g. to freeze a layer for a while)."""
    from .optim import FlashOptimizer
    if not isinstance(optimizer, FlashOptimizer):
        raise TypeError("enable_gradient_release needs a flashopt optimizer")
    if isinstance(model, nn.parallel.DistributedDataParallel):
        raise TypeError("flashopt: gradient release does not work with "
                        "DistributedDataParallel (gradients are averaged after backward)")
    if optimizer._gradient_release is not None:
        raise RuntimeError("flashopt: gradient release is already enabled")
    opt_ref = weakref.ref(optimizer)
    group_of = {id(q): g for g in optimizer.param_groups for q in g["params"]}

    def hook(p):
        opt = opt_ref()
        if opt is None or p.grad is None:
            return
        if pre_step is not None and not pre_step(p, group_of[id(p)]):
            return
        with torch.no_grad():
            opt._step_one(p)
        p.grad = None

    hooks, seen = [], set()
    for p in model.parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        if p not in optimizer._param_set:
            raise ValueError("flashopt: a parameter of the model is not in the optimizer")
        hooks.append(p.register_post_accumulate_grad_hook(hook))
    handle = GradientReleaseHandle(optimizer, hooks)
    optimizer._gradient_release = handle
    return handle
