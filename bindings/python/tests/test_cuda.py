"""CUDA tensors through a CUDA context: the same steps as on the CPU, bit for
bit (the kernels of one spec agree across back ends), on torch's current
stream without a synchronization per step, on every device, and with
GradScaler. GPU only: skipped with a message where torch sees no GPU
(scripts/device-check.sh runs them on a GPU machine; test_cuda_emulated.py
covers the bundle's CUDA calls without one)."""

import pytest
import torch

import flashopt
from flashopt import _lib as L
from helpers import grads_for, make_params

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(),
                               reason="GPU only: torch sees no CUDA device on this machine")
needs_two = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                               reason="needs two GPUs")


def twins(dtype=torch.bfloat16, device="cuda", seed=20):
    cpu = make_params(seed, dtype)
    return cpu, [p.detach().to(device).requires_grad_() for p in cpu]


def give(params, step, device=None):
    for p, g in zip(params, grads_for(step, params)):
        p.grad = g.to(p.dtype).to(device or p.device)


@needs_gpu
@pytest.mark.parametrize("cls,kw", [(flashopt.FlashAdamW, {}), (flashopt.FlashSGD,
                                                               {"momentum": 0.9}),
                                    (flashopt.FlashLion, {})])
def test_cuda_step_matches_cpu(cls, kw):
    cpu, gpu = twins()
    oc, og = cls(cpu, lr=1e-2, **kw), cls(gpu, lr=1e-2, **kw)
    for s in range(5):
        for pc, pg, g in zip(cpu, gpu, grads_for(s, cpu)):
            pc.grad = g.to(torch.bfloat16)
            pg.grad = g.to(torch.bfloat16).cuda()
        oc.step()
        og.step()
    for a, b in zip(cpu, gpu):
        assert torch.equal(a.detach(), b.detach().cpu())
    for a, b in zip(cpu, gpu):
        assert torch.equal(oc.export_master(a), og.export_master(b).cpu())


class Counting:
    """The bundle's library with its calls counted."""

    def __init__(self, calls):
        self.calls, self.real = calls, L.lib()

    def __getattr__(self, name):
        fn = getattr(self.real, name)

        def wrapped(*a):
            self.calls[name] = self.calls.get(name, 0) + 1
            return fn(*a)
        return wrapped


@needs_gpu
def test_no_synchronization_per_step_on_the_default_stream(monkeypatch):
    cpu, gpu = twins()
    oc, og = flashopt.FlashAdamW(cpu, lr=1e-2), flashopt.FlashAdamW(gpu, lr=1e-2)
    calls, syncs = {}, []
    for b in og._bundle_list():
        monkeypatch.setattr(b, "_lib", Counting(calls))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: syncs.append("device"))
    monkeypatch.setattr(torch.cuda.Stream, "synchronize", lambda self: syncs.append("stream"))
    for s in range(4):
        give(cpu, s)
        give(gpu, s)
        oc.step()
        og.step()  # queued on torch's stream; the next reads are ordered after it
    assert calls.get("flashopt_step") == 4
    assert "flashopt_synchronize" not in calls and syncs == []
    monkeypatch.undo()
    for a, b in zip(cpu, gpu):
        assert torch.equal(a.detach(), b.detach().cpu())


@needs_gpu
def test_side_stream_steps_are_ordered():
    cpu, gpu = twins()
    oc, og = flashopt.FlashSGD(cpu, lr=1e-2, momentum=0.9), \
        flashopt.FlashSGD(gpu, lr=1e-2, momentum=0.9)
    side = torch.cuda.Stream()
    for s in range(4):
        give(cpu, s)
        oc.step()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            # Gradients written on the side stream, stepped on it, then
            # read on it: each in order without a device-wide wait.
            for p, g in zip(gpu, grads_for(s, cpu)):
                p.grad = g.to(torch.bfloat16).to("cuda", non_blocking=True)
            og.step()
            got = [p.detach().clone() for p in gpu]
        torch.cuda.current_stream().wait_stream(side)
    for a, b in zip(cpu, got):
        assert torch.equal(a.detach(), b.cpu())


@needs_gpu
def test_gradient_on_another_device_is_refused():
    cpu, gpu = twins()
    og = flashopt.FlashAdamW(gpu)
    give(gpu, 0)
    gpu[1].grad = gpu[1].grad.cpu()
    before = [p.detach().clone() for p in gpu]
    with pytest.raises(ValueError, match="is on cpu"):
        og.step()
    assert all(torch.equal(a.detach(), b) for a, b in zip(gpu, before))


@needs_gpu
def test_cuda_and_cuda0_are_one_bundle_and_cpu_another():
    a = torch.zeros(64, device="cuda", requires_grad=True)
    b = torch.zeros(64, device=f"cuda:{torch.cuda.current_device()}", requires_grad=True)
    c = torch.zeros(64, requires_grad=True)
    o = flashopt.FlashAdamW([a, b, c])
    assert len(o._bundle_list()) == 2


@needs_two
def test_two_devices_in_one_optimizer():
    cpu = make_params(21, torch.bfloat16)
    gpu = [p.detach().to(f"cuda:{i % 2}").requires_grad_() for i, p in enumerate(cpu)]
    oc, og = flashopt.FlashAdamW(cpu, lr=1e-2), flashopt.FlashAdamW(gpu, lr=1e-2)
    assert len(og._bundle_list()) == 2
    for s in range(3):
        give(cpu, s)
        for p, g in zip(gpu, grads_for(s, cpu)):
            p.grad = g.to(torch.bfloat16).to(p.device)
        oc.step()
        og.step()
    for a, b in zip(cpu, gpu):
        assert torch.equal(a.detach(), b.detach().cpu())


@needs_gpu
def test_gradscaler_on_cuda_fp16_equals_the_unscaled_step():
    cpu = make_params(22, torch.float16)
    gpu = [p.detach().cuda().requires_grad_() for p in cpu]
    plain = [p.detach().cuda().requires_grad_() for p in cpu]
    og, op = flashopt.FlashAdamW(gpu, lr=1e-3), flashopt.FlashAdamW(plain, lr=1e-3)
    sc = torch.amp.GradScaler("cuda", init_scale=2.0 ** 12, growth_interval=2)
    for s in range(6):
        gs = [g.to(torch.float16).float().cuda() for g in grads_for(s, cpu)]
        if s == 3:
            gs[0][0] = float("inf")
        for p in gpu:
            p.grad = None
        sc.scale(sum((p.float() * g).sum() for p, g in zip(gpu, gs))).backward()
        sc.step(og)
        sc.update()
        if s != 3:
            for p, g in zip(plain, gs):
                p.grad = g.half()
            op.step()
        for a, b in zip(gpu, plain):
            assert torch.equal(a.detach(), b.detach()), s


@needs_gpu
def test_state_dict_round_trip_on_cuda():
    _, gpu = twins(seed=23)
    o = flashopt.FlashAdamW(gpu, lr=1e-2)
    for s in range(3):
        give(gpu, s)
        o.step()
    sd = o.state_dict()
    copy = [p.detach().clone().requires_grad_() for p in gpu]
    o2 = flashopt.FlashAdamW(copy, lr=1e-2)
    o2.load_state_dict(sd)
    for s in range(3, 5):
        give(gpu, s)
        give(copy, s)
        o.step()
        o2.step()
    for a, b in zip(gpu, copy):
        assert torch.equal(a.detach(), b.detach())
