"""FlashOptimizer: what the five torch.optim drop-ins (optim.py) share.

The optimizer owns param_groups and the hyper-parameters (one table per
rule, Hyper, into every bundle's flashopt_set_hyper when they change;
GradScaler's scale folded into the kernels). Its parameters are a ParamSet
(_params.py), chosen once, at the first parameter: LocalParams (_local.py)
for plain tensors, ShardedParams (_dtensor.py) for DTensors (FSDP2). The
set registers, steps, reports, holds the master weights and opt.state's
views, and reads and writes the state; the optimizer only delegates.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Dict, List, NamedTuple, Optional

import torch
from torch.optim import Optimizer

from . import _lib as L
from . import _specs, _state
from ._bundle import GRAD_SCALE, _Bundle, _float, _is_dtensor
from ._dtensor import ShardedParams
from ._local import LocalParams
from ._params import Options, ParamSet, StepHooks
from ._views import ParamState


def spec_name(rule: str, dtype: torch.dtype, master_weight_bits: Optional[int],
              quantize: Optional[bool] = None, arithmetic: str = "exact",
              numerics: str = "bounded", *, state_bits: Optional[int] = None) -> str:
    """The bundle of the kernels directory that runs for these options (the
    one whose manifest says it computes them: _specs.py), or a
    MissingBundleError.

    fp32 parameters are their own master weights: master_weight_bits does not
    apply to them. state_bits: 8 (8-bit codes, the default), 4 (4-bit codes,
    docs/NUMERICS.md §2e) or 32 (plain fp32 states); the older `quantize`
    (positional, as before) is True for 8, False for 32, and a ValueError
    when it disagrees with state_bits. arithmetic="fast" is the portable
    fast mode (docs/NUMERICS.md §7); numerics="flashoptim" FlashOptim's
    numerics (docs/NUMERICS.md §8), which differ from the bounded ones in
    quantized states and Adam's bound (SGD and Lion with fp32 states
    compute the same bits either way).
    """
    bits = _specs.state_bits_of(state_bits, quantize)
    return _specs.select(rule, dtype, master_weight_bits, bits, arithmetic, numerics)


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
        state_bits (4, 8 or 32): the optimizer states: 8-bit companded
            codes (default), 4-bit codes (docs/NUMERICS.md §2e: AdamW bf16
            + 24-bit master weights 6.125 B/param against 7.125), or plain
            fp32 (32). 4-bit bundles ship for bf16 parameters with
            master_weight_bits=24 and for fp32 parameters, exact arithmetic
            and the bounded numerics; other combinations are a
            MissingBundleError naming what is missing.
        quantize (bool): the older spelling: True is state_bits=8, False
            state_bits=32. Both given and disagreeing is a ValueError.
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


def _choose_param_set(current: ParamSet, params: List[Any]) -> ParamSet:
    """The one choice of implementation (as torch's adam() picks fused,
    foreach or single-tensor once): an optimizer's parameters are
    LocalParams until its first parameter, which makes them ShardedParams
    for good when it is a DTensor. Each set refuses the other kind."""
    if (isinstance(current, LocalParams) and current.num_params == 0
            and any(_is_dtensor(p) for p in params)):
        return ShardedParams()
    return current


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
                 state_bits: Optional[int] = None, quantize: Optional[bool] = None,
                 check_numerics: bool = False, arithmetic: str = "exact",
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
        bits = _specs.state_bits_of(state_bits, quantize)
        if arithmetic not in ("exact", "fast"):
            raise ValueError(f"arithmetic must be 'exact' or 'fast', not {arithmetic!r}")
        if numerics not in ("bounded", "flashoptim"):
            raise ValueError(f"numerics must be 'bounded' or 'flashoptim', not {numerics!r}")
        if numerics == "flashoptim" and arithmetic == "fast":
            raise ValueError("numerics='flashoptim' reproduces FlashOptim's kernels bit for bit, "
                             "which have no fast arithmetic; use arithmetic='exact'")
        self.master_weight_bits = master_weight_bits
        self.state_bits = bits
        self.quantize = bits != 32  # quantized states (8- or 4-bit codes)
        self.arithmetic = arithmetic
        self.numerics = numerics
        self._check_numerics_each_step = bool(check_numerics)
        # The parameters (_params.py): LocalParams, or ShardedParams once the
        # first parameter is a DTensor (_choose_param_set).
        self._param_set: ParamSet = LocalParams()
        self._gradient_release = None
        self._kernel_grad_scale = 1.0  # 1/GradScaler's scale for the step at hand
        self._constructor_lr = defaults["lr"]
        super().__init__(params, defaults)

    # ---- parameters ----------------------------------------------------------------
    def _options(self) -> Options:
        return Options(type(self).__name__, self._rule, self.master_weight_bits, self.state_bits,
                       self.arithmetic, self.numerics)

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        params = param_group["params"]
        if isinstance(params, torch.Tensor):
            params = [params]
        elif isinstance(params, set):
            raise TypeError("optimizer parameters need to be organized in ordered collections")
        else:
            params = list(params)
        ps = _choose_param_set(self._param_set, params)
        # Every check before anything changes (DTensors: alike on every rank).
        prepared = ps.prepare(params, self.param_groups, self._options(),
                              self._gradient_release is not None)
        param_group = dict(param_group)
        param_group["params"] = params
        super().add_param_group(param_group)  # torch's checks: duplicates, defaults
        group = self.param_groups[-1]
        # Each group's own lr is its initial lr (a torch LR scheduler's
        # setdefault keeps it); decouple_lr divides by it.
        group.setdefault("initial_lr", _float(group["lr"]))
        gi = len(self.param_groups) - 1
        self._param_set = ps
        ps.add_group(prepared, group, gi, self._mark_state)
        self._sync_group(gi)

    def _mark_state(self, p) -> None:
        """opt.state[p]: a view of p's state in libflashopt with torch's
        keys, decoded when read (_views.ParamState; ShardedParamState for a
        DTensor). flashopt's states exist from registration, so `state` is
        never empty either (torch.distributed.checkpoint's
        get/set_optimizer_state_dict run a step with zero gradients when it
        is, to create torch.optim's lazy states, which would advance step
        counters)."""
        self.state[p] = self._param_set.state_view(p, self._plain_state_view)

    def _plain_state_view(self, bundle: _Bundle, index: int, p) -> ParamState:
        """opt.state[p] of a plain tensor (the compat module's has FlashOptim's keys)."""
        return ParamState(bundle, index, p)

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
        for b in self._param_set.bundles():
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
    def _before_step(self) -> None:
        self._sync_hypers()
        if self._check_numerics_each_step:
            self.check_numerics()

    def _step_hooks(self) -> StepHooks:
        return StepHooks(type(self).__name__, self._before_step, self._sync_group)

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
        self._param_set.step(self._take_amp_scaling(), self._step_hooks())
        return loss

    def _step_one(self, p: torch.Tensor):
        """Steps one parameter now (gradient release)."""
        self._param_set.step_one(p, self._step_hooks())

    def step_param(self, p: torch.Tensor, group: Optional[Dict[str, Any]] = None) -> None:
        """Steps parameter p alone now, with the hyper-parameters of its param
        group (`group`, if given, must be that group). Its gradient stays."""
        if p not in self._param_set:
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
        """Exact optimizer-side bytes (libflashopt's report summed over
        bundles; DTensor parameters: this rank's)."""
        return self._param_set.memory(self.param_groups)

    def specs(self) -> List[str]:
        """The bundles in use, one per (dtype, device)."""
        return [b.spec for b in self._param_set.bundles()]

    def check_numerics(self) -> List[L.NumericsReport]:
        """Raises NumericsError when some group's lr cannot move its largest
        weight at this master-weight precision (or a parameter is NaN/Inf).
        Collective for DTensor parameters."""
        self._sync_hypers()
        return self._param_set.check_numerics()

    # ---- master weights ----------------------------------------------------------------
    def export_master(self, p: torch.Tensor) -> torch.Tensor:
        """The fp32 master weight of parameter p (p plus its correction term);
        a DTensor placed like p for a DTensor parameter."""
        return self._param_set.export_master(p)

    def import_master(self, p: torch.Tensor, value: torch.Tensor) -> None:
        """Sets parameter p (and its correction term) from an fp32 master weight.
        DTensor parameters: `value` is a DTensor placed like p or the full
        tensor, and the call is collective (every rank, same order)."""
        self._param_set.import_master(p, value)

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
            if p in self._param_set:
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
        return self._param_set.bundles()

    def checkpoint_paths(self, path) -> List[str]:
        """The files of a checkpoint at `path`: `path` for the first bundle,
        `path.<spec>` for the others."""
        return self._param_set.checkpoint_paths(path)

    def save_checkpoint(self, path, compressed: bool = True) -> None:
        """A safetensors checkpoint written by libflashopt (atomic). With more
        than one bundle (mixed dtypes), one file per bundle
        (checkpoint_paths). Not for DTensor parameters (DCP's)."""
        self._param_set.save_checkpoint(path, L.CHECKPOINT_COMPRESSED if compressed
                                     else L.CHECKPOINT_F32)

    def load_checkpoint(self, path) -> None:
        """Loads what save_checkpoint wrote (same spec, same parameters);
        hyper-parameters come back into param_groups."""
        self._param_set.load_checkpoint(path)
        self._hypers_from_bundles()

    def _hypers_from_bundles(self):
        """param_groups[i] hyper-parameters from the first bundle (after a load)."""
        bundles = self._bundle_list()
        if not bundles:
            return
        b = bundles[0]
        for gi, group in enumerate(self.param_groups):
            self._group_from_hypers(group, {n: b.get_hyper(gi, n) for n in b.hyper_names})
        self._sync_hypers()

    # ---- state_dict ----------------------------------------------------------------------
    def state_dict(self, *, fp32_states: bool = False) -> Dict[str, Any]:
        """torch's layout ({'state', 'param_groups'}, parameters by index).
        Per parameter: "step", "flashopt.spec" and its exact compressed
        state in the library's own dtypes (correction term, codes, scales;
        AdamW bf16 + 24-bit: 3.125 B/param, 2.125 with state_bits=4, whose
        codes are uint8 packed two per byte along the last dimension, a code
        per byte for 1-D parameters; no parameters and no fp32 copies).
        Loading it resumes the run bit for bit, given the same
        parameters (the model's state dict holds those).

        fp32_states=True: torch.optim's form instead, "step" and the fp32
        states by torch's names ("exp_avg", "exp_avg_sq", "momentum_buffer"),
        which torch.optim loads; loading it here re-encodes the states.

        DTensor (FSDP2) parameters: the same entries as DTensors of global
        shapes, for torch.distributed.checkpoint (_dtensor_dcp.py)."""
        return self._param_set.state_dict(self.param_groups, fp32_states)

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Loads a state_dict() of this optimizer exactly (its per-parameter
        "flashopt.spec" entries; also the first format's top-level
        'flashopt' entry), or the fp32 states of a torch.optim state dict of
        the same parameters ('exp_avg', 'momentum_buffer', ...), encoded.
        Collective for DTensor parameters (checked on every rank first)."""
        groups = state_dict["param_groups"]
        _state.check_groups(self.param_groups, groups)
        self._param_set.load_state_dict(state_dict)
        self._groups_from(groups)

    def _groups_from(self, groups) -> None:
        """param_groups entries (not the parameters) from a loaded state dict."""
        for mine, theirs in zip(self.param_groups, groups):
            for k, v in theirs.items():
                if k != "params":
                    mine[k] = v
        self._sync_hypers()
