"""flashopt: memory-efficient PyTorch optimizers over libflashopt.

    import flashopt
    opt = flashopt.FlashAdamW(model.parameters(), lr=1e-3)   # bf16 params: 24-bit master, 8-bit states

FlashSGD, FlashSGDW, FlashAdam, FlashAdamW and FlashLion are torch.optim.Optimizer
subclasses (see docs/PYTHON.md). The library and the generated kernels come from
$FLASHOPT_LIBRARY / $FLASHOPT_KERNELS, or the source tree's build/ directory.
"""

from ._lib import FlashOptError, kernels_dir, library_path, set_cpu_threads, version
from .master import decode_master, encode_master
from .optim import (FlashAdam, FlashAdamW, FlashLion, FlashOptimizer, FlashSGD, FlashSGDW,
                    MissingBundleError, NumericsError, spec_name)
from .utils import GradientReleaseHandle, cast_model, enable_gradient_release

__version__ = "0.1.0"

__all__ = [
    "FlashSGD", "FlashSGDW", "FlashAdam", "FlashAdamW", "FlashLion", "FlashOptimizer",
    "FlashOptError", "MissingBundleError", "NumericsError", "spec_name",
    "cast_model", "enable_gradient_release", "GradientReleaseHandle",
    "decode_master", "encode_master",
    "kernels_dir", "library_path", "set_cpu_threads", "version",
]
