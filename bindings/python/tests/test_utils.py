"""cast_model, gradient release, fp32 master export/import, check_numerics."""

import warnings

import pytest
import torch
from torch import nn

import flashopt


def small_net(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                         nn.Flatten(), nn.Linear(4 * 8 * 8, 16), nn.LayerNorm(16), nn.ReLU(),
                         nn.Linear(16, 10))


def test_cast_model_keeps_norm_layers_fp32():
    m = flashopt.cast_model(small_net())
    assert m[0].weight.dtype == torch.bfloat16 and m[4].weight.dtype == torch.bfloat16
    assert m[1].weight.dtype == torch.float32 and m[1].running_mean.dtype == torch.float32
    assert m[1].num_batches_tracked.dtype == torch.int64
    assert m[5].weight.dtype == torch.float32
    y = m(torch.randn(2, 1, 8, 8, dtype=torch.bfloat16))
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert m[1].weight.grad.dtype == torch.float32
    m2 = flashopt.cast_model(small_net(), full_precision_layers=["7"])
    assert m2[7].weight.dtype == torch.float32 and m2[4].weight.dtype == torch.bfloat16


def batches(n):
    g = torch.Generator().manual_seed(5)
    return [(torch.randn(8, 1, 8, 8, generator=g).to(torch.bfloat16),
             torch.randint(0, 10, (8,), generator=g)) for _ in range(n)]


def test_gradient_release_equals_step_after_backward():
    a, b = flashopt.cast_model(small_net(1)), flashopt.cast_model(small_net(1))
    oa = flashopt.FlashAdamW(a.parameters(), lr=1e-2)
    ob = flashopt.FlashAdamW(b.parameters(), lr=1e-2)
    handle = flashopt.enable_gradient_release(b, ob)
    for x, y in batches(4):
        oa.zero_grad()
        nn.functional.cross_entropy(a(x).float(), y).backward()
        oa.step()
        nn.functional.cross_entropy(b(x).float(), y).backward()
        assert all(p.grad is None for p in b.parameters())
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        ob.step()
        ob.zero_grad()
    assert len(w) == 2
    handle.remove()
    x, y = batches(1)[0]
    ob.zero_grad()
    nn.functional.cross_entropy(b(x).float(), y).backward()
    assert any(p.grad is not None for p in b.parameters())
    ob.step()


def test_gradient_release_steps_tied_weights_once():
    emb = nn.Linear(6, 6, bias=False)
    model = nn.Sequential(emb, nn.ReLU(), emb)
    ref = nn.Sequential(nn.Linear(6, 6, bias=False))
    ref[0].weight.data.copy_(emb.weight.data)
    o = flashopt.FlashSGD(model.parameters(), lr=0.1, quantize=False)
    r = flashopt.FlashSGD(ref.parameters(), lr=0.1, quantize=False)
    flashopt.enable_gradient_release(model, o)
    x = torch.randn(4, 6)
    model(x).sum().backward()
    y = emb.weight.detach().clone()
    ref2 = nn.Sequential(ref[0], nn.ReLU(), ref[0])
    ref2(x).sum().backward()
    r.step()
    assert torch.equal(y, ref[0].weight.detach())


def test_master_export_import_round_trip():
    m = flashopt.cast_model(small_net(2))
    opt = flashopt.FlashAdamW(m.parameters(), lr=1e-2)
    for x, y in batches(3):
        opt.zero_grad()
        nn.functional.cross_entropy(m(x).float(), y).backward()
        opt.step()
    sd = opt.get_fp32_model_state_dict(m)
    w = m[4].weight
    assert sd["4.weight"].dtype == torch.float32
    # The master weight is finer than the bf16 parameter, within about half a
    # bf16 ulp of it (the correction term's range, numerics.md §1.6).
    wf = w.detach().float()
    assert ((sd["4.weight"] - wf).abs() <= wf.abs() * 2.0 ** -8 + 1e-30).all()
    assert not torch.equal(sd["4.weight"], w.detach().float())
    m2 = flashopt.cast_model(small_net(3))
    opt2 = flashopt.FlashAdamW(m2.parameters(), lr=1e-2)
    opt2.set_fp32_model_state_dict(m2, sd)
    sd2 = opt2.get_fp32_model_state_dict(m2)
    for k in sd:
        assert torch.equal(sd[k], sd2[k]), k


def test_check_numerics():
    p = [torch.ones(64, dtype=torch.bfloat16, requires_grad=True)]
    ok = flashopt.FlashAdamW(p, lr=1e-3)
    (r,) = ok.check_numerics()
    assert r.params_checked == 1 and r.params_too_small == 0
    tiny = flashopt.FlashAdamW([torch.ones(64, dtype=torch.bfloat16, requires_grad=True)],
                               lr=1e-7)
    with pytest.raises(flashopt.NumericsError, match="lr") as e:
        tiny.check_numerics()
    assert e.value.report.params_too_small == 1
    # An LR schedule that decays too far is caught at the step that would stall.
    q = [torch.ones(64, dtype=torch.bfloat16, requires_grad=True)]
    o = flashopt.FlashAdamW(q, lr=1e-3, check_numerics=True)
    q[0].grad = torch.ones_like(q[0])
    o.step()
    o.param_groups[0]["lr"] = 1e-8
    with pytest.raises(flashopt.NumericsError):
        o.step()
