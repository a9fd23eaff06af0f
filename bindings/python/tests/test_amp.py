"""torch.amp.GradScaler: the scaler hands flashopt its scale and its inf
check (_step_supports_amp_scaling), as it does torch's fused Adam. The
gradients stay scaled; the kernels multiply them by 1/scale (their
"grad_scale" hyper-parameter), and a step with an inf changes nothing, step
counters included. Compared with torch's fused AdamW under the same scaler."""

import pytest
import torch

import flashopt
from helpers import grads_for, make_params, rel_inf

SIZES = ((7, 13), (33,), (64, 65), (1,))


def scaler(**kw):
    kw.setdefault("init_scale", 2.0 ** 10)
    kw.setdefault("growth_interval", 3)
    return torch.amp.GradScaler("cpu", **kw)


def scaled_step(opt, sc, params, grads, clip=None):
    """A training step whose loss has the gradients `grads` (an inf where
    they have one): they arrive multiplied by the scale."""
    for p in params:
        p.grad = None
    loss = sum((p.float() * g).sum() for p, g in zip(params, grads))
    sc.scale(loss).backward()
    if clip is not None:
        sc.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(params, clip)
    sc.step(opt)
    sc.update()


def grads_with_infs(step, params, inf_steps):
    gs = grads_for(step, params)
    if step in inf_steps:
        gs[1] = gs[1].clone()
        gs[1][3] = float("inf")
    return gs


INF_STEPS = {2, 3, 9}


@pytest.mark.parametrize("clip", [None, 0.5], ids=["plain", "clip"])
def test_matches_torch_fused_adamw_with_gradscaler(clip):
    mine, theirs = make_params(40, sizes=SIZES), make_params(40, sizes=SIZES)
    o = flashopt.FlashAdamW(mine, lr=1e-2, quantize=False)
    r = torch.optim.AdamW(theirs, lr=1e-2, fused=True)
    so, sr = scaler(), scaler()
    scales = []
    for s in range(15):
        before = [p.detach().clone() for p in mine]
        gs = grads_with_infs(s, mine, INF_STEPS)
        scaled_step(o, so, mine, gs, clip)
        scaled_step(r, sr, theirs, gs, clip)
        assert so.get_scale() == sr.get_scale()
        scales.append(so.get_scale())
        if s in INF_STEPS:  # skipped: nothing moved
            assert all(torch.equal(a.detach(), b) for a, b in zip(mine, before))
        for a, b in zip(mine, theirs):
            assert rel_inf(a, b) <= 1e-6, s
    # The schedule: halved at each inf, doubled after 3 finite steps.
    assert scales[:10] == [2.0 ** e for e in (10, 10, 9, 8, 8, 8, 9, 9, 9, 8)]
    # Skipped steps advance no counter, like torch's fused step.
    finite = 15 - len(INF_STEPS)
    sd = o.state_dict()
    assert all(float(st["step"]) == finite for st in sd["state"].values())
    assert all(float(st["step"]) == finite for st in r.state_dict()["state"].values())
    assert not hasattr(o, "grad_scale") and not hasattr(o, "found_inf")


def test_fp16_model_runs_on_the_f16_bundle_exactly():
    """fp16 gradients cannot be unscaled by the scaler itself; scaled by a
    power of two and multiplied by its inverse inside the kernel, they give
    the very same step as unscaled gradients."""
    mine = make_params(41, torch.float16, SIZES)
    plain = [p.detach().clone().requires_grad_() for p in mine]
    o = flashopt.FlashAdamW(mine, lr=1e-3)
    ref = flashopt.FlashAdamW(plain, lr=1e-3)
    assert o.specs() == ["adamw_f16_m24"]
    sc = scaler()
    for s in range(12):
        gs = [g.to(torch.float16).float() for g in grads_with_infs(s, mine, INF_STEPS)]
        scaled_step(o, sc, mine, gs)
        if s not in INF_STEPS:
            for p, g in zip(plain, gs):
                p.grad = g.to(torch.float16)
            ref.step()
        for a, b in zip(mine, plain):
            assert torch.equal(a.detach(), b.detach()), s
        for a, b in zip(mine, plain):
            assert torch.equal(o.export_master(a), ref.export_master(b)), s
    steps = [b.get_step(i) for b in o._bundle_list() for i in range(len(b.params))]
    assert steps == [12 - len(INF_STEPS)] * len(mine)


def test_scale_is_not_left_in_the_kernels():
    """A plain step() after a scaled one multiplies the gradients by 1 again,
    and a checkpoint taken in between loads into an unscaled optimizer."""
    ps = make_params(42, sizes=SIZES)
    twin = [p.detach().clone().requires_grad_() for p in ps]
    o = flashopt.FlashSGD(ps, lr=0.1, quantize=False)
    t = flashopt.FlashSGD(twin, lr=0.1, quantize=False)
    sc = scaler(init_scale=8.0)
    gs = grads_for(0, ps)
    scaled_step(o, sc, ps, gs)
    for p, g in zip(twin, gs):
        p.grad = g
    t.step()
    sd = o.state_dict()
    for p, g in zip(ps, grads_for(1, ps)):
        p.grad = g
    o.step()
    t2 = flashopt.FlashSGD(twin, lr=0.1, quantize=False)
    t2.load_state_dict(sd)
    for p, g in zip(twin, grads_for(1, twin)):
        p.grad = g
    t2.step()
    for a, b in zip(ps, twin):
        assert torch.equal(a.detach(), b.detach())


def test_amp_scaling_is_declared():
    assert flashopt.FlashOptimizer._step_supports_amp_scaling is True
    # The scaler reads `grad_scale` with getattr: the class must not define it.
    assert not hasattr(flashopt.FlashAdamW, "grad_scale")
