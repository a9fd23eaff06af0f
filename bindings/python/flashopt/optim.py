"""torch.optim drop-ins over libflashopt: FlashSGD, FlashSGDW, FlashAdam,
FlashAdamW, FlashLion.

Each class validates its arguments with torch's messages, builds `defaults`
for the base (_base.FlashOptimizer, which holds everything generic) and
names, in one table, how its param_groups entries map onto the kernel's
hyper-parameters.
"""

from __future__ import annotations

from ._base import _OPTIONS_DOC, FlashOptimizer, Hyper, spec_name
from ._specs import MissingBundleError
from ._lib import NumericsError

__all__ = [
    "FlashOptimizer", "FlashSGD", "FlashSGDW", "FlashAdam", "FlashAdamW", "FlashLion",
    "MissingBundleError", "NumericsError", "spec_name",
]


def _check_lr_wd(lr, weight_decay):
    import torch
    if not isinstance(lr, torch.Tensor) and lr < 0.0:
        raise ValueError(f"Invalid learning rate: {lr}")
    if weight_decay < 0.0:
        raise ValueError(f"Invalid weight_decay value: {weight_decay}")


def _check_betas(betas, eps=None):
    if not 0.0 <= betas[0] < 1.0:
        raise ValueError(f"Invalid beta parameter at index 0: {betas[0]}")
    if not 0.0 <= betas[1] < 1.0:
        raise ValueError(f"Invalid beta parameter at index 1: {betas[1]}")
    if eps is not None and not 0.0 <= eps:
        raise ValueError(f"Invalid epsilon value: {eps}")


# Kernel hyper-parameter -> its param_groups entry, shared by the rules.
_LR = {"lr": Hyper("lr")}
_BETAS = {"beta1": Hyper("betas", 0), "beta2": Hyper("betas", 1)}
_WD = {"weight_decay": Hyper("weight_decay")}
# Decoupled weight decay (SGDW, AdamW, Lion): decouple_lr divides lr by the
# group's initial lr.
_DECOUPLED = {"decouple_lr": Hyper("decouple_lr", kind=bool),
              "initial_lr": Hyper("initial_lr", default="lr")}


class FlashSGD(FlashOptimizer):
    """torch.optim.SGD (coupled L2 weight decay, momentum, dampening, Nesterov).

    Args: params, lr=1e-3, momentum=0, dampening=0, weight_decay=0,
        nesterov=False: as torch.optim.SGD.
    """

    _rule = "sgd"
    _hyper_table = {**_LR, "momentum": Hyper("momentum"), "dampening": Hyper("dampening"),
                    **_WD, "nesterov": Hyper("nesterov", kind=bool)}

    def __init__(self, params, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0,
                 nesterov=False, **options):
        _check_lr_wd(lr, weight_decay)
        if momentum < 0.0:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening,
                        weight_decay=weight_decay, nesterov=nesterov)
        defaults.update(self._extra_defaults())
        super().__init__(params, defaults, **options)

    def _extra_defaults(self):
        return {}


class FlashSGDW(FlashSGD):
    """SGD with decoupled weight decay: θ ← θ·(1 − lr·wd) (or (1 − lr/initial_lr·wd)
    with decouple_lr=True), then the SGD update without L2 term.

    Args: as FlashSGD, and decouple_lr=False.
    """

    _rule = "sgdw"
    _hyper_table = {**FlashSGD._hyper_table, **_DECOUPLED}

    def __init__(self, params, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0,
                 nesterov=False, *, decouple_lr=False, **options):
        self._decouple_lr = bool(decouple_lr)
        super().__init__(params, lr, momentum, dampening, weight_decay, nesterov, **options)

    def _extra_defaults(self):
        return {"decouple_lr": self._decouple_lr}


class FlashAdam(FlashOptimizer):
    """torch.optim.Adam (coupled L2 weight decay; no amsgrad).

    Args: params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0:
        as torch.optim.Adam; amsgrad=True is refused.
    """

    _rule = "adam"
    _default_wd = 0.0
    _hyper_table = {**_LR, **_BETAS, "eps": Hyper("eps"), **_WD}

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=None,
                 amsgrad=False, **options):
        if weight_decay is None:
            weight_decay = self._default_wd
        _check_lr_wd(lr, weight_decay)
        _check_betas(betas, eps)
        if amsgrad:
            raise NotImplementedError("flashopt: amsgrad=True is not supported")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)
        defaults.update(self._extra_defaults())
        super().__init__(params, defaults, **options)

    def _extra_defaults(self):
        return {}


class FlashAdamW(FlashAdam):
    """torch.optim.AdamW (decoupled weight decay θ·(1 − lr·wd), default 1e-2;
    decouple_lr=True: θ·(1 − lr/initial_lr·wd), FlashOptim's option).

    Args: as torch.optim.AdamW, and decouple_lr=False.
    """

    _rule = "adamw"
    _default_wd = 1e-2
    _hyper_table = {**FlashAdam._hyper_table, **_DECOUPLED}

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 amsgrad=False, *, decouple_lr=False, **options):
        self._decouple_lr = bool(decouple_lr)
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, **options)

    def _extra_defaults(self):
        return {"decouple_lr": self._decouple_lr}


class FlashLion(FlashOptimizer):
    """Lion (Chen et al. 2023): u = sign(β1·m + (1−β1)·g); θ ← θ·(1 − lr·wd) − lr·u;
    m ← β2·m + (1−β2)·g. Defaults as FlashOptim's FlashLion.

    Args: params, lr=1e-3, betas=(0.9, 0.99), weight_decay=0, decouple_lr=False.
    """

    _rule = "lion"
    _hyper_table = {**_LR, **_BETAS, **_WD, **_DECOUPLED}

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.0, *,
                 decouple_lr=False, **options):
        _check_lr_wd(lr, weight_decay)
        _check_betas(betas)
        defaults = dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay,
                        decouple_lr=bool(decouple_lr))
        super().__init__(params, defaults, **options)


for _cls in (FlashSGD, FlashSGDW, FlashAdam, FlashAdamW, FlashLion):
    _cls.__doc__ += _OPTIONS_DOC
del _cls
