"""The binding's CUDA path without a GPU: bundles on a CUDA context of the
emulated driver (unittests/Runtime/Inputs/mock_cuda.cpp built with the PTX
interpreter: "device memory" is host memory the stand-in allocated, and
every launch runs the bundle's PTX, each access checked). ctest points
FLASHOPT_CUDA_DRIVER at it; without it these tests skip.

torch itself sees no GPU here, so the tests drive _Bundle (every C call of
the CUDA path) with tensors over the stand-in's allocations; the
optimizer-level CUDA tests are test_cuda.py's, on a GPU."""

import ctypes
import os

import pytest
import torch

from flashopt import _lib as L
from flashopt._bundle import _Bundle

DRIVER = os.environ.get("FLASHOPT_CUDA_DRIVER", "")
pytestmark = pytest.mark.skipif(
    not os.path.isfile(DRIVER),
    reason="FLASHOPT_CUDA_DRIVER is not the emulated driver (ctest sets it where it is built)")

SIZES = (1000, 300, 64)


@pytest.fixture(scope="module")
def drv():
    d = ctypes.CDLL(DRIVER)  # the very library libflashopt loads (same path)
    d.mockcuda_last_error.restype = ctypes.c_char_p
    d.mockcuda_lane_instructions.restype = ctypes.c_uint64
    return d


def launches(drv) -> int:
    n = ctypes.c_int64()
    drv.mockcuda_stats(ctypes.byref(n), None, None)
    return n.value


class DeviceMemory:
    """Tensors over the stand-in's device allocations (freed at close)."""

    def __init__(self, drv):
        self.drv, self.ptrs = drv, []

    def tensor(self, n, dtype):
        nbytes = n * torch.empty((), dtype=dtype).element_size()
        p = ctypes.c_ulonglong()
        assert self.drv.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(nbytes)) == 0
        self.ptrs.append(p.value)
        buf = (ctypes.c_uint8 * nbytes).from_address(p.value)
        return torch.frombuffer(buf, dtype=torch.uint8).view(dtype)

    def close(self):
        for p in self.ptrs:
            self.drv.cuMemFree_v2(ctypes.c_ulonglong(p))


@pytest.fixture
def mem(drv):
    m = DeviceMemory(drv)
    yield m
    m.close()


def pair(spec, dtype, mem, seed=0):
    """The same parameters in a CUDA bundle (device memory) and a CPU one."""
    cuda = _Bundle("test", spec, dtype, torch.device("cuda", 0), "test")
    cpu = _Bundle("test", spec, dtype, torch.device("cpu"), "test")
    g = torch.Generator().manual_seed(seed)
    dev, host = [], []
    for i, n in enumerate(SIZES):
        x = torch.randn(n, generator=g).to(dtype)
        d = mem.tensor(n, dtype)
        d.copy_(x)
        dev.append(d)
        host.append(x)
        cuda.add(d, 0, i)
        cpu.add(x, 0, i)
    for b in (cuda, cpu):
        b.set_hyper(0, "lr", 1e-2)
    return cuda, cpu, dev, host


@pytest.mark.parametrize("spec,dtype", [("adamw_bf16_m24", torch.bfloat16),
                                        ("sgd_f16_m24", torch.float16),
                                        ("lion_f32", torch.float32)])
def test_cuda_bundle_equals_cpu_bundle(spec, dtype, mem, drv):
    cuda, cpu, dev, host = pair(spec, dtype, mem)
    assert cuda.info.device_type == L.DEVICE_CUDA and cpu.info.device_type == L.DEVICE_CPU
    gen = torch.Generator().manual_seed(1)
    grads_dev = [mem.tensor(n, cuda.grad_dtype) for n in SIZES]
    for step in range(4):
        # New gradient memory every other step (zero_grad(set_to_none=True)).
        if step == 2:
            grads_dev = [mem.tensor(n, cuda.grad_dtype) for n in SIZES]
        grads_host = [torch.randn(n, generator=gen).to(cuda.grad_dtype) for n in SIZES]
        for d, h in zip(grads_dev, grads_host):
            d.copy_(h)
        idx = list(range(len(SIZES)))
        cuda.set_grads(idx, [t.data_ptr() for t in grads_dev])
        cpu.set_grads(idx, [t.data_ptr() for t in grads_host])
        before = launches(drv)
        if step == 3:  # torch's "parameter without gradient": one at a time
            for i in (0, 2):
                cuda.step_param(i)
                cpu.step_param(i)
        else:
            cuda.step()
            cpu.step()
            assert launches(drv) == before + 1, "one launch per step, whatever the tensors"
        cuda.synchronize()
        assert not drv.mockcuda_last_error(), drv.mockcuda_last_error()
        for d, h in zip(dev, host):
            assert torch.equal(d, h), step
    assert [cuda.get_step(i) for i in range(3)] == [4, 3, 4]
    assert drv.mockcuda_lane_instructions() > 0  # the PTX ran, in the interpreter
    for i in range(3):
        assert torch.equal(cuda.export_master(i), cpu.export_master(i))
    # The checkpoint of the device state is the CPU bundle's, byte for byte.
    blob = cuda.checkpoint_bytes(L.CHECKPOINT_COMPRESSED)
    assert blob == cpu.checkpoint_bytes(L.CHECKPOINT_COMPRESSED)
    cpu.load_checkpoint_bytes(blob)


def test_master_weights_go_through_host_memory(mem):
    cuda, cpu, dev, host = pair("adamw_bf16_m24", torch.bfloat16, mem)
    v = torch.linspace(-1, 1, SIZES[1])
    for b in (cuda, cpu):
        b.import_master(1, v)
    # The 24-bit master is v within bf16's 2^-8 ulp / 256; the same bits as on the CPU.
    assert torch.equal(cuda.export_master(1), cpu.export_master(1))
    assert (cuda.export_master(1) - v).abs().max() <= 2.0 ** -15
    assert torch.equal(dev[1], v.to(torch.bfloat16)) and torch.equal(dev[1], host[1])


class FakeStream:
    def __init__(self, handle):
        self.cuda_stream, self.synced = handle, 0

    def synchronize(self):
        self.synced += 1


def test_steps_on_the_default_stream_need_no_synchronization(mem):
    cuda, _, _, _ = pair("adamw_bf16_m24", torch.bfloat16, mem)
    assert cuda.order_after(None) is False  # the CPU
    s = FakeStream(0)  # torch's default stream: the legacy stream libflashopt uses
    assert cuda.order_after(s) is False and s.synced == 0


def test_a_side_stream_is_ordered_by_hand_without_set_stream(mem, monkeypatch):
    cuda, _, _, _ = pair("adamw_bf16_m24", torch.bfloat16, mem)
    monkeypatch.setattr(L, "has", lambda name: False)
    s = FakeStream(0x1234)
    assert cuda.order_after(s) is True and s.synced == 1


def test_a_side_stream_is_passed_on_with_set_stream(mem, monkeypatch):
    """With flashopt_set_stream (proposed, not in flashopt.h yet), launches
    go on torch's stream: no synchronization, one call per stream change."""
    cuda, _, _, _ = pair("adamw_bf16_m24", torch.bfloat16, mem)
    calls = []

    class Lib:
        def __getattr__(self, name):
            return getattr(L.lib(), name)

        def flashopt_set_stream(self, handle, stream):
            calls.append(stream.value)
            return 0
    monkeypatch.setattr(L, "has", lambda name: name == "flashopt_set_stream")
    monkeypatch.setattr(cuda, "_lib", Lib())
    s, t = FakeStream(0x1234), FakeStream(0x5678)
    for stream in (s, s, t, t, s):
        assert cuda.order_after(stream) is False
    assert calls == [0x1234, 0x5678, 0x1234] and s.synced == t.synced == 0


def test_devices_get_their_own_context():
    # One context per device for the process; the stand-in has one device,
    # so device 1 is refused with the library's device error.
    a = L.context(L.DEVICE_CUDA, 0)
    assert L.context(L.DEVICE_CUDA, 0) is a
    with pytest.raises(L.FlashOptError) as e:
        _Bundle("test", "adamw_bf16_m24", torch.bfloat16, torch.device("cuda", 1), "test")
    assert e.value.status == "FLASHOPT_ERROR_DEVICE"
    assert (L.DEVICE_CUDA, 1) not in L._contexts
