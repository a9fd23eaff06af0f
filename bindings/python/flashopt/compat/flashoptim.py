"""FlashOptim 0.1.4's public API over flashopt: a one-line switch.

    import flashopt.compat.flashoptim as flashoptim     # was: import flashoptim

Every public name of FlashOptim 0.1.4 (its __init__.py) with its signature:
FlashSGD, FlashSGDW, FlashAdam, FlashAdamW, FlashLion, FlashOptimizer,
GradientReleaseHandle, NumericsError, cast_model, compute_ecc_bits,
enable_gradient_release, reconstruct_fp32_param. The optimizers are
flashopt's (isinstance(opt, flashopt.FlashOptimizer) holds), taking
FlashOptim's arguments in FlashOptim's positional order. An argument flashopt
cannot honour raises an error naming the argument and the flashopt way;
nothing is ignored silently. docs/PYTHON.md has the mapping table.

What differs by design: flashopt runs on CPUs as well as GPUs, with its own
fused kernels (fused=False is refused), and with the bounded 8-bit numerics
unless numerics="flashoptim" is passed (FlashOptim's kernels bit for bit).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Optional

import torch
from torch import nn

from .. import optim as _optim
from .._base import FlashOptimizer
from .._lib import NumericsError
from .._views import ParamState
from ..master import decode_master, encode_master
from ..utils import GradientReleaseHandle
from ..utils import cast_model as _cast_model
from ..utils import enable_gradient_release as _enable_gradient_release

__version__ = "0.1.4"

__all__ = [
    "FlashAdam", "FlashAdamW", "FlashLion", "FlashOptimizer", "FlashSGD", "FlashSGDW",
    "GradientReleaseHandle", "NumericsError", "compute_ecc_bits", "cast_model",
    "enable_gradient_release", "reconstruct_fp32_param",
]

_BYTEWIDTH = {None: 0, 24: 3, 32: 4}


class _StateTensor(torch.Tensor):
    """A decoded state as FlashOptim users read it: a tensor that also has
    FlashOptim's `materialize()` (itself)."""

    def materialize(self) -> torch.Tensor:
        return self.as_subclass(torch.Tensor)


class _CompatParamState(ParamState):
    """opt.state[p] with FlashOptim's reading habits: the states also answer
    materialize(), and "error_bits" is the correction term (int8 for 24-bit
    masters, int16 for 32-bit), for reconstruct_fp32_param(p,
    opt.state[p]["error_bits"])."""

    __slots__ = ("_opt", "_param")

    def __init__(self, opt, bundle, index, param):
        super().__init__(bundle, index, param)
        self._opt = opt
        self._param = param

    def _names(self):
        names = super()._names()
        return names + ("error_bits",) if self._bundle.info.has_correction else names

    def __getitem__(self, key):
        if key == "error_bits" and self._bundle.info.has_correction:
            # The stored correction term (a copy), paired with the parameter.
            c = self._bundle.read_buffer(self._index, "correction").reshape(self._shape)
            return c if self._device.type == "cpu" else c.to(self._device)
        v = super().__getitem__(key)
        if isinstance(v, torch.Tensor) and key != "step":
            return v.as_subclass(_StateTensor)
        return v

    def __setitem__(self, key, value):
        if key == "error_bits":
            if not self._bundle.info.has_correction:
                raise KeyError("flashopt: this parameter has no correction term "
                               "(master_weight_bits=None or fp32)")
            master = decode_master(self._param.detach(), value)
            self._opt.import_master(self._param, master)
            return
        if hasattr(value, "materialize") and not isinstance(value, torch.Tensor):
            value = value.materialize()
        super().__setitem__(key, value)


class _Compat:
    """What the five FlashOptim-signature classes share: FlashOptim's
    options mapped onto flashopt's."""

    def _flashoptim_options(self, quantize, compress_state_dict, master_weight_bits,
                            check_numerics, fused, numerics) -> Dict[str, Any]:
        if compress_state_dict and not quantize:
            raise ValueError("compress_state_dict=True requires quantize=True")
        if not fused:
            raise ValueError(
                "flashopt: fused=False is not available: flashopt steps every parameter with "
                "its generated fused kernels (on the CPU too), and has no unfused Python path. "
                "Drop the argument; for fp32 states use quantize=False")
        if master_weight_bits not in _BYTEWIDTH:
            raise ValueError(f"Master weight bits {master_weight_bits} invalid; must be one of "
                             f"(None, 24, 32)")
        self._compress_state_dict = bool(compress_state_dict)
        self._master_bytewidth = _BYTEWIDTH[master_weight_bits]
        return dict(quantize=quantize, master_weight_bits=master_weight_bits,
                    check_numerics=check_numerics, numerics=numerics)

    # FlashOptim's param-group keys.
    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        for key, mine in (("quantize", self.quantize),
                          ("master_bytewidth", getattr(self, "_master_bytewidth", None))):
            if key in param_group and mine is not None and param_group[key] != mine:
                raise ValueError(
                    f"flashopt: a param group sets {key}={param_group[key]!r}, but flashopt "
                    f"chooses the state encoding per optimizer, not per group ({key} is "
                    f"{mine!r} here). Put these parameters in a second optimizer built with "
                    f"{'quantize' if key == 'quantize' else 'master_weight_bits'}=...")
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        group.setdefault("quantize", self.quantize)
        if hasattr(self, "_master_bytewidth"):
            group.setdefault("master_bytewidth", self._master_bytewidth)

    def _plain_state_view(self, b, index: int, p) -> ParamState:
        return _CompatParamState(self, b, index, p)

    def state_dict(self, *, fp32_states: Optional[bool] = None) -> Dict[str, Any]:
        """compress_state_dict=True: flashopt's compact state dict (the
        compressed states per parameter). False (FlashOptim's default): the
        dequantized states (fp32 here; FlashOptim writes bf16) with each
        parameter's correction term as "error_bits", as FlashOptim saves it."""
        if fp32_states is None:
            fp32_states = not self._compress_state_dict
        sd = super().state_dict(fp32_states=fp32_states)
        if fp32_states:  # plain tensors (DTensor parameters have no fp32 form)
            for b in self._bundle_list():
                if not b.info.has_correction:
                    continue
                for i, p in enumerate(b.params):
                    sd["state"][b.global_ids[i]]["error_bits"] = self.state[p]["error_bits"]
        return sd

    def recompute_param_stats(self) -> None:
        """FlashOptim caches each parameter's max |w| for check_numerics;
        flashopt's check reads the current master weights at every check, so
        there is nothing to recompute."""


class FlashSGD(_Compat, _optim.FlashSGD):
    """FlashOptim's FlashSGD signature over flashopt.FlashSGD."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float = 0.001, momentum: float = 0.0,
                 dampening: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False,
                 quantize: bool = True, compress_state_dict: bool = False,
                 master_weight_bits: Optional[int] = 24, check_numerics: bool = False,
                 fused: bool = True, *, numerics: str = "bounded"):
        opts = self._flashoptim_options(quantize, compress_state_dict, master_weight_bits,
                                        check_numerics, fused, numerics)
        _optim.FlashSGD.__init__(self, params, lr, momentum, dampening, weight_decay, nesterov,
                                 **opts)


class FlashSGDW(_Compat, _optim.FlashSGDW):
    """FlashOptim's FlashSGDW signature over flashopt.FlashSGDW."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float = 0.001, momentum: float = 0.0,
                 dampening: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False,
                 decouple_lr: bool = False, quantize: bool = True,
                 compress_state_dict: bool = False, master_weight_bits: Optional[int] = 24,
                 check_numerics: bool = False, fused: bool = True, *, numerics: str = "bounded"):
        opts = self._flashoptim_options(quantize, compress_state_dict, master_weight_bits,
                                        check_numerics, fused, numerics)
        _optim.FlashSGDW.__init__(self, params, lr, momentum, dampening, weight_decay, nesterov,
                                  decouple_lr=decouple_lr, **opts)


class FlashAdam(_Compat, _optim.FlashAdam):
    """FlashOptim's FlashAdam signature over flashopt.FlashAdam."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float = 1e-3,
                 betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0,
                 quantize: bool = True, compress_state_dict: bool = False,
                 master_weight_bits: Optional[int] = 24, check_numerics: bool = False,
                 fused: bool = True, *, numerics: str = "bounded"):
        opts = self._flashoptim_options(quantize, compress_state_dict, master_weight_bits,
                                        check_numerics, fused, numerics)
        _optim.FlashAdam.__init__(self, params, lr, betas, eps, weight_decay, **opts)


class FlashAdamW(_Compat, _optim.FlashAdamW):
    """FlashOptim's FlashAdamW signature over flashopt.FlashAdamW."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float = 1e-3,
                 betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 1e-2,
                 decouple_lr: bool = False, quantize: bool = True,
                 compress_state_dict: bool = False, master_weight_bits: Optional[int] = 24,
                 check_numerics: bool = False, fused: bool = True, *,
                 numerics: str = "bounded"):
        opts = self._flashoptim_options(quantize, compress_state_dict, master_weight_bits,
                                        check_numerics, fused, numerics)
        _optim.FlashAdamW.__init__(self, params, lr, betas, eps, weight_decay,
                                   decouple_lr=decouple_lr, **opts)


class FlashLion(_Compat, _optim.FlashLion):
    """FlashOptim's FlashLion signature over flashopt.FlashLion."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float = 1e-3, betas=(0.9, 0.99),
                 weight_decay: float = 0.0, decouple_lr: bool = False, quantize: bool = True,
                 compress_state_dict: bool = False, master_weight_bits: Optional[int] = 24,
                 check_numerics: bool = False, fused: bool = True, *,
                 numerics: str = "bounded"):
        opts = self._flashoptim_options(quantize, compress_state_dict, master_weight_bits,
                                        check_numerics, fused, numerics)
        _optim.FlashLion.__init__(self, params, lr, betas, weight_decay,
                                  decouple_lr=decouple_lr, **opts)


def cast_model(model: nn.Module, dtype: torch.dtype = torch.bfloat16, selective: bool = True,
               full_precision_keywords: Optional[List[str]] = None) -> None:
    """FlashOptim's cast_model over flashopt.cast_model. selective=True keeps
    normalization layers in fp32 (flashopt keeps LayerNorm, GroupNorm and
    RMSNorm too, and casts fp32 layers' outputs back to `dtype`); False casts
    them as well. full_precision_keywords: module names matched by dotted
    segment, as FlashOptim matches them, kept in fp32."""
    patterns = []
    for k in full_precision_keywords or ():
        patterns += [k, f"*.{k}"]
    _cast_model(model, dtype, full_precision_layers=patterns, keep_norms_fp32=selective)


def enable_gradient_release(model: nn.Module, optimizer: FlashOptimizer, *,
                            grad_scaler: Optional[torch.amp.GradScaler] = None,
                            pre_step: Optional[Callable[[torch.Tensor, Dict[str, Any]], bool]]
                            = None) -> GradientReleaseHandle:
    """FlashOptim's enable_gradient_release over flashopt's (pre_step as
    FlashOptim's: return False to skip a parameter's step)."""
    if grad_scaler is not None:
        raise NotImplementedError(
            "flashopt: enable_gradient_release(grad_scaler=...) is not supported (nor in "
            "FlashOptim): each parameter steps during backward, before a GradScaler could "
            "see every gradient for inf. Use GradScaler with optimizer.step() instead "
            "(flashopt folds its scale into the kernels)")
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP1
    except ImportError:  # pragma: no cover
        FSDP1 = ()
    if FSDP1 and isinstance(model, FSDP1):
        raise TypeError("enable_gradient_release() does not support FullyShardedDataParallel "
                        "(FSDP1) models; use FSDP2 (fully_shard)")
    return _enable_gradient_release(model, optimizer, pre_step=pre_step)


def reconstruct_fp32_param(param: torch.Tensor, error_bits: torch.Tensor) -> torch.Tensor:
    """The fp32 master weight of a bf16/fp16 parameter and its correction
    term (flashopt.decode_master): FlashOptim's bits."""
    if error_bits.dtype.is_floating_point:
        raise ValueError(f"error_bits must be int8 or int16, got {error_bits.dtype}. ")
    return decode_master(param, error_bits)


def compute_ecc_bits(fp32_param: torch.Tensor, narrow_param: torch.Tensor) -> torch.Tensor:
    """The correction term of fp32 master weights against `narrow_param`,
    their bf16/fp16 rounding: int16 (a 32-bit master: FlashOptim 0.1.4's
    width for 2-byte parameters). flashopt.encode_master computes both the
    parameter and the term, with 24-bit masters too."""
    if narrow_param.element_size() != 2 or not narrow_param.is_floating_point():
        raise ValueError(f"Unsupported dtype combination: fp32 (4 bytes) to "
                         f"{narrow_param.dtype} ({narrow_param.element_size()} bytes). Error "
                         f"byte width {4 - narrow_param.element_size()} must be 1 or 2.")
    param, corr = encode_master(fp32_param, narrow_param.dtype, 32)
    differ = int((param.view(torch.int16) != narrow_param.view(torch.int16)).sum())
    if differ:
        raise ValueError(
            f"flashopt: compute_ecc_bits: narrow_param is not the round-to-nearest-even of "
            f"fp32_param at {differ} elements, and flashopt's correction terms are defined "
            f"against that rounding; set narrow_param.copy_(fp32_param.to(narrow_param.dtype)) "
            f"first, or use flashopt.encode_master(fp32_param, dtype, 32)")
    return corr

