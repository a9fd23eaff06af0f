"""The parameters of one optimizer, behind one interface (ParamSet).

A FlashOptimizer (_base.py) steps either plain tensors (LocalParams,
_local.py: each parameter registered whole with the bundle of its dtype and
device) or DTensors on one 1-D device mesh (ShardedParams, _dtensor.py:
FSDP2's shards and Replicate, each registered as pieces, stepped with one
collective per step). The optimizer chooses one set at its first parameter,
as torch's adam() picks its fused, foreach or single-tensor implementation
once, and then only delegates. param_groups and the hyper-parameters are the
optimizer's; the bundles, the registration, the step, the reports, the
master weights, opt.state's views and the state formats are the set's.

A set never reads the optimizer: what it needs comes as arguments, the
optimizer's options (Options, which also creates bundles) and what a step
asks of the optimizer (StepHooks).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, NamedTuple, Optional

import torch

from . import _specs
from ._bundle import _Bundle, _device_key
from ._views import ParamState

# An optimizer's parameters are of one kind (the set chosen at the first).
MIXED_KINDS = ("flashopt: an optimizer steps either DTensor parameters (FSDP2's fully_shard, "
               "Replicate) or plain tensors, not both")


@dataclass(frozen=True)
class Options:
    """The optimizer's options that choose its bundles (FlashOptimizer's
    constructor checked them)."""

    owner: str  # the optimizer class's name, for messages
    rule: str
    master_weight_bits: Optional[int]
    state_bits: int  # 4, 8 (codes) or 32 (fp32 states)
    arithmetic: str
    numerics: str

    def mode(self, dtype: torch.dtype) -> str:
        return (f"{dtype} parameters, master_weight_bits={self.master_weight_bits}, "
                f"state_bits={self.state_bits}, arithmetic={self.arithmetic!r}, "
                f"numerics={self.numerics!r}")

    def new_bundle(self, dtype: torch.dtype, device: torch.device) -> _Bundle:
        """The bundle for parameters of `dtype` on `device` (a
        MissingBundleError when the kernels directory has none)."""
        spec = _specs.select(self.rule, dtype, self.master_weight_bits, self.state_bits,
                             self.arithmetic, self.numerics, owner=self.owner)
        return _Bundle(self.owner, spec, dtype, device, self.mode(dtype))


class StepHooks(NamedTuple):
    """What a set's step asks of its optimizer (FlashOptimizer passes them
    with each call)."""

    owner: str  # the optimizer class's name, for messages
    # Before anything steps: every group's hyper-parameters into the
    # bundles, and check_numerics() when the optimizer checks every step.
    prepare: Callable[[], None]
    # Param group gi's hyper-parameters into the bundles.
    sync_group: Callable[[int], None]


def bundle_key(t: torch.Tensor) -> tuple:
    """The bundle a tensor of this dtype and device goes to."""
    return (t.dtype, _device_key(t.device))


def current_stream(b: _Bundle):
    """torch's current stream on a CUDA bundle's device (None on the CPU)."""
    return torch.cuda.current_stream(b.device) if b.device.type == "cuda" else None


class ParamSet(ABC):
    """The parameters of one optimizer and the bundles that step them (one
    per parameter dtype and device, in creation order)."""

    def __init__(self):
        self._bundles: Dict[tuple, _Bundle] = {}
        self.num_params = 0  # registered parameters (each once)

    def bundles(self) -> List[_Bundle]:
        return list(self._bundles.values())

    def _ensure_groups(self, n: int) -> None:
        for b in self._bundles.values():
            b.ensure_groups(n)

    @abstractmethod
    def __contains__(self, p) -> bool:
        """Whether tensor p is registered."""

    # ---- registration ------------------------------------------------------------
    @abstractmethod
    def prepare(self, params: List[Any], param_groups, opts: Options,
                gradient_release: bool) -> Any:
        """Checks a new param group's parameters before anything changes
        (`param_groups`: the optimizer's groups so far); returns what
        add_group takes. Refuses parameters of the other kind (MIXED_KINDS)."""

    @abstractmethod
    def add_group(self, prepared: Any, group: Dict[str, Any], gi: int,
                  mark: Callable[[torch.Tensor], None]) -> None:
        """Registers the parameters prepare() checked as param group `gi`
        (`group`, already in the optimizer's param_groups), calling mark(p)
        for each newly registered one."""

    @abstractmethod
    def state_view(self, p, plain_view: Callable[[_Bundle, int, torch.Tensor], ParamState]
                   ) -> ParamState:
        """opt.state[p] for registered parameter p; a plain tensor's is
        plain_view(bundle, index, p)."""

    # ---- stepping ----------------------------------------------------------------
    @abstractmethod
    def step(self, go: bool, hooks: StepHooks) -> None:
        """optimizer.step(): every parameter with a gradient. `go` is False
        when GradScaler found an inf: nothing changes."""

    @abstractmethod
    def step_one(self, p, hooks: StepHooks) -> None:
        """Steps parameter p now with its gradient (gradient release,
        step_param)."""

    # ---- reports, master weights -------------------------------------------------
    @abstractmethod
    def memory(self, param_groups) -> Dict[str, float]:
        """memory_report()."""

    @abstractmethod
    def check_numerics(self) -> list:
        """The bundles' numerics reports (a NumericsError when one fails)."""

    @abstractmethod
    def export_master(self, p) -> torch.Tensor:
        ...

    @abstractmethod
    def import_master(self, p, value: torch.Tensor) -> None:
        ...

    # ---- state dicts and checkpoint files ----------------------------------------
    @abstractmethod
    def state_dict(self, param_groups, fp32_states: bool) -> Dict[str, Any]:
        ...

    @abstractmethod
    def load_state_dict(self, sd: Dict[str, Any]) -> None:
        """Loads the state of a state dict whose param_groups the optimizer
        checked; its param_groups entries are the optimizer's business."""

    def checkpoint_paths(self, path) -> List[str]:
        """`path` for the first bundle, `path.<spec>` for the others."""
        return [str(path) if k == 0 else f"{path}.{b.spec}"
                for k, b in enumerate(self.bundles())]

    @abstractmethod
    def save_checkpoint(self, path, fmt: int) -> None:
        ...

    @abstractmethod
    def load_checkpoint(self, path) -> None:
        ...
