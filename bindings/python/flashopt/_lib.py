"""ctypes bindings of libflashopt's C ABI (runtime/include/flashopt/flashopt.h).

Only this module, _bundle.py and _comm.py talk to C: this one loads the
library, holds the signature table, names statuses and owns the per-device
contexts; _bundle.py calls the optimizer's functions; _comm.py makes a
communicator over a torch process group. tests/test_sigs.py checks the
table against flashopt.h.

The library is found, in this order, at $FLASHOPT_LIBRARY, inside this
package (flashopt/lib/, where a wheel puts it), in the source tree's build
directory (<repo>/build/lib/libflashopt.so, the layout of scripts/build.sh),
and by the dynamic loader (libflashopt.so on the library path). Bundles
(flashopt-gen output, one directory per spec) are found at $FLASHOPT_KERNELS,
inside this package (flashopt/kernels/), or in <repo>/build/kernels.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from pathlib import Path

ABI_VERSION = 3

# flashopt_status: only the codes the binding branches on. Names come from
# the library (flashopt_status_name).
OK = 0
ERROR_INVALID_ARGUMENT = 1
ERROR_NUMERICS = 14

# flashopt_dtype
BF16, F16, F32, I8, U8, I16 = 0, 1, 2, 3, 4, 5
# 4-bit state codes, packed two per byte, the even element in the low nibble
# (docs/KERNEL-ABI.md "Packed buffers"): flashopt_dtype_size is 0 for them.
I4, U4 = 6, 7
DTYPE_NAMES = {BF16: "bf16", F16: "f16", F32: "f32", I8: "i8", U8: "ui8", I16: "i16",
               I4: "i4", U4: "ui4"}

DEVICE_CPU, DEVICE_CUDA = 1, 2
CHECKPOINT_COMPRESSED, CHECKPOINT_F32 = 0, 1
NONFINITE_PROPAGATE, NONFINITE_SKIP = 0, 1


def status_name(status: int) -> str:
    """"FLASHOPT_ERROR_DTYPE", ...: the library's name of a flashopt_status."""
    try:
        name = lib().flashopt_status_name(int(status))
    except (OSError, ImportError):  # no library: still say something
        name = None
    return name.decode() if name else str(status)


class FlashOptError(RuntimeError):
    """A libflashopt call failed; `status` is the flashopt_status name."""

    def __init__(self, status: int, message: str):
        self.status = status_name(status)
        self.code = status
        super().__init__(f"{message} [{self.status}]")


class NumericsError(FlashOptError):
    """check_numerics() found a parameter its lr cannot move (or NaN/Inf)."""

    def __init__(self, code, message, report):
        super().__init__(code, message)
        self.report = report


class OptimizerInfo(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p), ("rule", ctypes.c_char_p), ("spec_hash", ctypes.c_char_p),
        ("param_dtype", ctypes.c_int), ("grad_dtype", ctypes.c_int),
        ("has_correction", ctypes.c_int), ("correction_dtype", ctypes.c_int),
        ("group_size", ctypes.c_int64), ("num_hypers", ctypes.c_int32),
        ("num_states", ctypes.c_int32), ("device_type", ctypes.c_int),
        ("device_id", ctypes.c_int32),
    ]


class BundleDesc(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char * 128), ("rule", ctypes.c_char * 128),
        ("param_dtype", ctypes.c_int), ("has_correction", ctypes.c_int32),
        ("correction_dtype", ctypes.c_int), ("quantized_states", ctypes.c_int32),
        ("plain_states", ctypes.c_int32), ("arithmetic", ctypes.c_char * 16),
        ("numerics", ctypes.c_char * 16), ("state_bits", ctypes.c_int32),
    ]


class BufferDesc(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("per_group", ctypes.c_int32),
                ("dtype", ctypes.c_int)]


class MemoryReport(ctypes.Structure):
    _fields_ = [
        ("numel", ctypes.c_int64), ("param_bytes", ctypes.c_int64),
        ("correction_bytes", ctypes.c_int64), ("grad_bytes", ctypes.c_int64),
        ("state_bytes", ctypes.c_int64), ("total_bytes", ctypes.c_int64),
        ("total_bytes_with_grad_release", ctypes.c_int64), ("allocated_bytes", ctypes.c_int64),
        ("bytes_per_param", ctypes.c_double),
        ("bytes_per_param_with_grad_release", ctypes.c_double),
        ("accumulator_bytes", ctypes.c_int64),
    ]


class NumericsReport(ctypes.Structure):
    _fields_ = [
        ("params_checked", ctypes.c_int64), ("params_too_small", ctypes.c_int64),
        ("first_param", ctypes.c_int64), ("first_group", ctypes.c_int32),
        ("max_abs", ctypes.c_double), ("lr", ctypes.c_double), ("min_lr", ctypes.c_double),
        ("nonfinite_params", ctypes.c_int64),
    ]


# A communicator's engine (flashopt_comm_backend, flashopt_dist.h): the
# collectives as C function pointers; _comm.py fills it over a torch process
# group. Not in STRUCTS: tests/test_sigs.py does not parse function-pointer
# members (test_comm.py drives it instead).
COMM_COLLECTIVE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                   ctypes.c_void_p, ctypes.c_size_t)
COMM_BROADCAST = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                  ctypes.c_size_t, ctypes.c_int32)


class CommBackend(ctypes.Structure):
    _fields_ = [("abi_version", ctypes.c_int32), ("name", ctypes.c_char_p),
                ("rank", ctypes.c_int32), ("size", ctypes.c_int32), ("self", ctypes.c_void_p),
                ("all_gather", COMM_COLLECTIVE), ("all_to_all", COMM_COLLECTIVE),
                ("broadcast", COMM_BROADCAST), ("reduce_scatter_f32", ctypes.c_void_p),
                ("error_string", ctypes.c_void_p), ("destroy", ctypes.c_void_p),
                ("reduce_mean_device", ctypes.c_void_p)]


# The C struct each ctypes struct mirrors (checked field by field against
# flashopt.h by tests/test_sigs.py).
STRUCTS = {"flashopt_optimizer_info": OptimizerInfo,
           "flashopt_memory_report": MemoryReport,
           "flashopt_numerics_report": NumericsReport,
           "flashopt_bundle_desc": BundleDesc,
           "flashopt_buffer_desc": BufferDesc}


def _source_root() -> Path:
    # bindings/python/flashopt/_lib.py -> the repository root
    return Path(__file__).resolve().parents[3]


def _build_dir() -> Path:
    return Path(os.environ.get("FLASHOPT_BUILD_DIR", _source_root() / "build"))


def library_path() -> str:
    """The libflashopt that `lib()` loads (or would load)."""
    env = os.environ.get("FLASHOPT_LIBRARY")
    if env:
        if not Path(env).is_file():
            raise FileNotFoundError(f"flashopt: FLASHOPT_LIBRARY={env} is not a file")
        return env
    for cand in (Path(__file__).resolve().parent / "lib" / "libflashopt.so",
                 _build_dir() / "lib" / "libflashopt.so"):
        if cand.is_file():
            return str(cand)
    found = ctypes.util.find_library("flashopt")
    if found:
        return found
    raise FileNotFoundError(
        "flashopt: libflashopt.so not found: set FLASHOPT_LIBRARY, or build the project "
        f"(bash scripts/build.sh build) so that {_build_dir() / 'lib' / 'libflashopt.so'} exists")


def kernels_dir() -> Path:
    """The directory holding one bundle directory per spec."""
    env = os.environ.get("FLASHOPT_KERNELS")
    if env:
        return Path(env)
    local = Path(__file__).resolve().parent / "kernels"
    if local.is_dir():
        return local
    return _build_dir() / "kernels"


_lib = None
_lib_lock = threading.Lock()

# The signature of every entry point the binding calls: name -> (restype,
# argtypes). Handles and data pointers are c_void_p.
_c = ctypes
_vp = ctypes.c_void_p
_SIGS = {
    "flashopt_last_error": (_c.c_char_p, []),
    "flashopt_status_name": (_c.c_char_p, [_c.c_int]),
    "flashopt_version": (_c.c_char_p, []),
    "flashopt_abi_version": (_c.c_int, []),
    "flashopt_context_create": (_c.c_int, [_c.c_int, _c.c_int, _c.POINTER(_vp)]),
    "flashopt_context_set_threads": (_c.c_int, [_vp, _c.c_int]),
    "flashopt_context_destroy": (_c.c_int, [_vp]),
    "flashopt_optimizer_create": (_c.c_int, [_vp, _c.c_char_p, _c.POINTER(_vp)]),
    "flashopt_optimizer_destroy": (_c.c_int, [_vp]),
    "flashopt_optimizer_get_info": (_c.c_int, [_vp, _c.POINTER(OptimizerInfo)]),
    "flashopt_hyper_name": (_c.c_int, [_vp, _c.c_int32, _c.POINTER(_c.c_char_p)]),
    "flashopt_describe_bundle": (_c.c_int, [_c.c_char_p, _c.POINTER(BundleDesc)]),
    "flashopt_num_buffers": (_c.c_int, [_vp, _c.POINTER(_c.c_int32)]),
    "flashopt_get_buffer_desc": (_c.c_int, [_vp, _c.c_int32, _c.POINTER(BufferDesc)]),
    "flashopt_state_name": (_c.c_int, [_vp, _c.c_int32, _c.POINTER(_c.c_char_p)]),
    "flashopt_add_param_group": (_c.c_int, [_vp, _c.POINTER(_c.c_int32)]),
    "flashopt_num_param_groups": (_c.c_int, [_vp, _c.POINTER(_c.c_int32)]),
    "flashopt_set_hyper": (_c.c_int, [_vp, _c.c_int32, _c.c_char_p, _c.c_double]),
    "flashopt_get_hyper": (_c.c_int, [_vp, _c.c_int32, _c.c_char_p, _c.POINTER(_c.c_double)]),
    "flashopt_add_param": (_c.c_int, [_vp, _c.c_int32, _c.c_char_p, _vp, _c.c_int, _c.c_int64,
                                      _vp, _c.c_int, _c.POINTER(_c.c_int64)]),
    # A piece of a larger tensor (an FSDP2 shard's pieces: _dtensor.py).
    "flashopt_add_param_piece": (_c.c_int, [_vp, _c.c_int32, _c.c_char_p, _vp, _c.c_int,
                                            _c.c_int64, _vp, _c.c_int, _c.c_int64,
                                            _c.POINTER(_c.c_int64)]),
    "flashopt_set_grad": (_c.c_int, [_vp, _c.c_int64, _vp, _c.c_int, _c.c_int64]),
    "flashopt_set_grads": (_c.c_int, [_vp, _c.c_int64, _c.POINTER(_c.c_int64),
                                      _c.POINTER(_vp), _c.c_int]),
    "flashopt_num_params": (_c.c_int, [_vp, _c.POINTER(_c.c_int64)]),
    "flashopt_step": (_c.c_int, [_vp]),
    "flashopt_step_param": (_c.c_int, [_vp, _c.c_int64]),
    # Externally reduced data parallelism (FSDP2: _dtensor.py, _comm.py).
    "flashopt_comm_create": (_c.c_int, [_c.POINTER(CommBackend), _c.POINTER(_vp)]),
    "flashopt_comm_destroy": (_c.c_int, [_vp]),
    "flashopt_optimizer_attach_comm_external": (_c.c_int, [_vp, _vp]),
    "flashopt_step_external": (_c.c_int, [_vp, _c.POINTER(_c.c_int64), _c.c_int64,
                                          _c.POINTER(_c.c_int64), _c.c_int64, _c.c_int32,
                                          _c.c_int, _c.c_char_p, _c.POINTER(_c.c_int32)]),
    "flashopt_get_external_step": (_c.c_int, [_vp, _c.c_int64, _c.POINTER(_c.c_int64)]),
    "flashopt_set_external_step": (_c.c_int, [_vp, _c.c_int64, _c.c_int64]),
    "flashopt_get_step": (_c.c_int, [_vp, _c.c_int64, _c.POINTER(_c.c_int64)]),
    "flashopt_set_nonfinite_policy": (_c.c_int, [_vp, _c.c_int]),
    "flashopt_get_skipped_steps": (_c.c_int, [_vp, _c.POINTER(_c.c_int64)]),
    "flashopt_synchronize": (_c.c_int, [_vp]),
    "flashopt_memory_report_get": (_c.c_int, [_vp, _c.POINTER(MemoryReport)]),
    "flashopt_export_master_f32": (_c.c_int, [_vp, _c.c_int64, _vp, _c.c_int64]),
    "flashopt_import_master_f32": (_c.c_int, [_vp, _c.c_int64, _vp, _c.c_int64]),
    "flashopt_dtype_bits": (_c.c_size_t, [_c.c_int]),
    "flashopt_buffer_size": (_c.c_int, [_vp, _c.c_int64, _c.c_char_p, _c.POINTER(_c.c_size_t)]),
    "flashopt_read_buffer": (_c.c_int, [_vp, _c.c_int64, _c.c_char_p, _vp, _c.c_size_t]),
    "flashopt_write_buffer": (_c.c_int, [_vp, _c.c_int64, _c.c_char_p, _vp, _c.c_size_t]),
    "flashopt_decode_master_f32": (_c.c_int, [_c.c_int, _vp, _c.c_int, _vp, _c.c_int64, _vp]),
    "flashopt_encode_master_f32": (_c.c_int, [_vp, _c.c_int64, _c.c_int, _vp, _c.c_int, _vp]),
    "flashopt_export_state_f32": (_c.c_int, [_vp, _c.c_int64, _c.c_char_p, _vp, _c.c_int64]),
    "flashopt_import_state_f32": (_c.c_int, [_vp, _c.c_int64, _c.c_char_p, _vp, _c.c_int64]),
    "flashopt_check_numerics": (_c.c_int, [_vp, _c.POINTER(NumericsReport)]),
    "flashopt_save_checkpoint": (_c.c_int, [_vp, _c.c_char_p, _c.c_int]),
    "flashopt_load_checkpoint": (_c.c_int, [_vp, _c.c_char_p]),
}

# Entry points newer than ABI_VERSION 2's first release: bound when the
# loaded library has them (`has(name)`), else the binding takes the older
# way (_bundle.py says which).
_OPTIONAL_SIGS = {
    # In-memory checkpoints (the `runtime` branch): no temporary files.
    "flashopt_save_checkpoint_buffer": (_c.c_int, [_vp, _c.c_int, _c.POINTER(_vp),
                                                   _c.POINTER(_c.c_size_t)]),
    "flashopt_load_checkpoint_buffer": (_c.c_int, [_vp, _vp, _c.c_size_t]),
    "flashopt_buffer_free": (None, [_vp]),
    # The CUDA stream an optimizer launches on (proposed; see docs/PYTHON.md).
    "flashopt_set_stream": (_c.c_int, [_vp, _vp]),
}


def lib():
    """The loaded library (ctypes.CDLL), with argument types set."""
    global _lib
    if _lib is None:
        with _lib_lock:
            if _lib is None:
                path = library_path()
                handle = ctypes.CDLL(path)
                for name, (res, args) in _SIGS.items():
                    fn = getattr(handle, name, None)
                    if fn is None:
                        raise ImportError(f"flashopt: {path} has no {name} (an older library?)")
                    fn.restype = res
                    fn.argtypes = args
                for name, (res, args) in _OPTIONAL_SIGS.items():
                    fn = getattr(handle, name, None)
                    if fn is not None:
                        fn.restype = res
                        fn.argtypes = args
                abi = handle.flashopt_abi_version()
                if abi != ABI_VERSION:
                    raise ImportError(f"flashopt: {path} has ABI version {abi}, "
                                      f"this binding needs {ABI_VERSION}")
                _lib = handle
    return _lib


def has(name: str) -> bool:
    """Whether the loaded library exports the optional entry point `name`."""
    return name in _OPTIONAL_SIGS and hasattr(lib(), name)


def last_error() -> str:
    return lib().flashopt_last_error().decode("utf-8", "replace")


def check(status: int, what: str = ""):
    """Raises FlashOptError for a failed call, with the library's message."""
    if status != OK:
        raise FlashOptError(status, last_error() or what)


def call(name: str, *args):
    check(getattr(lib(), name)(*args), name)


def version() -> str:
    return lib().flashopt_version().decode()


_contexts: dict = {}


def context(device_type: int, device_id: int):
    """One flashopt context per device, for the life of the process."""
    key = (device_type, device_id)
    ctx = _contexts.get(key)
    if ctx is None:
        h = ctypes.c_void_p()
        call("flashopt_context_create", device_type, device_id, ctypes.byref(h))
        ctx = _contexts[key] = h
    return ctx


def set_cpu_threads(threads: int):
    """Threads a CPU step uses (0 = every hardware thread)."""
    call("flashopt_context_set_threads", context(DEVICE_CPU, 0), int(threads))
