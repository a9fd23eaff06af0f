"""Each optimizer against torch.optim (or, for SGDW and Lion, which torch.optim
lacks, a torch-ops reference of their definition): fp32 parameters and
unquantized states within 1e-6 relative over 100 steps; bf16 parameters with
24-bit master weights and 8-bit states within numerics.md §8's thresholds."""

import pytest
import torch

import flashopt
from helpers import RefLion, RefSGDW, cos_nmse, grads_for, make_params, rel_inf

STEPS = 100

# name -> (flashopt class, kwargs, reference factory)
CONFIGS = {
    "sgd": (flashopt.FlashSGD, dict(lr=1e-2),
            lambda ps: torch.optim.SGD(ps, lr=1e-2)),
    "sgd-momentum-wd": (flashopt.FlashSGD, dict(lr=1e-2, momentum=0.9, weight_decay=1e-2),
                        lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9, weight_decay=1e-2)),
    "sgd-nesterov": (flashopt.FlashSGD, dict(lr=1e-2, momentum=0.9, nesterov=True),
                     lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9, nesterov=True)),
    "sgdw": (flashopt.FlashSGDW, dict(lr=1e-2, momentum=0.9, weight_decay=1e-1),
             lambda ps: RefSGDW(ps, lr=1e-2, momentum=0.9, weight_decay=1e-1)),
    "adam": (flashopt.FlashAdam, dict(lr=1e-3, weight_decay=1e-2),
             lambda ps: torch.optim.Adam(ps, lr=1e-3, weight_decay=1e-2)),
    "adam-betas": (flashopt.FlashAdam, dict(lr=3e-3, betas=(0.8, 0.99), eps=1e-6),
                   lambda ps: torch.optim.Adam(ps, lr=3e-3, betas=(0.8, 0.99), eps=1e-6)),
    "adamw": (flashopt.FlashAdamW, dict(lr=1e-3),
              lambda ps: torch.optim.AdamW(ps, lr=1e-3)),
    "adamw-wd": (flashopt.FlashAdamW, dict(lr=2e-3, weight_decay=0.1),
                 lambda ps: torch.optim.AdamW(ps, lr=2e-3, weight_decay=0.1)),
    "lion": (flashopt.FlashLion, dict(lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1),
             lambda ps: RefLion(ps, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)),
}


def run(opt, params, steps, grad_scale=0.1):
    for s in range(steps):
        for p, g in zip(params, grads_for(s, params, grad_scale)):
            p.grad = g.to(p.dtype)
        opt.step()


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_fp32_unquantized_matches_torch(name):
    cls, kw, ref = CONFIGS[name]
    mine = make_params(1)
    theirs = make_params(1)
    opt = cls(mine, master_weight_bits=None, quantize=False, **kw)
    assert opt.specs() == [f"{cls._rule}_f32_f32states"]
    run(opt, mine, STEPS)
    run(ref(theirs), theirs, STEPS)
    for a, b in zip(mine, theirs):
        assert rel_inf(a, b) <= 1e-6, name


@pytest.mark.parametrize("name", ["sgd-momentum-wd", "sgdw", "adam", "adamw-wd", "lion"])
def test_bf16_m24_quantized_close_to_fp32(name):
    """numerics.md §8 (test_optimizers.py): quantized + ECC vs the fp32 "true"
    optimizer, bf16: cos-sim > 0.975 and NMSE < 0.05."""
    cls, kw, ref = CONFIGS[name]
    theirs = make_params(2)
    mine = [p.detach().to(torch.bfloat16).requires_grad_() for p in theirs]
    opt = cls(mine, **kw)  # the defaults: master_weight_bits=24, quantize=True
    assert opt.specs() == [f"{cls._rule}_bf16_m24"]
    run(opt, mine, 30)
    run(ref(theirs), theirs, 30)
    for a, b in zip(mine, theirs):
        cos, nmse = cos_nmse(opt.export_master(a), b)
        assert cos > 0.975 and nmse < 0.05, (name, cos, nmse)
        cos, nmse = cos_nmse(a.float(), b)
        assert cos > 0.975 and nmse < 0.05, (name, cos, nmse)


def test_quantized_close_to_unquantized_adamw():
    """numerics.md §8: quantized vs unquantized states, cos > 0.999, NMSE < 5e-4
    (the updates θ_T − θ_0, which are what quantization changes)."""
    base = make_params(3)
    a = [p.detach().to(torch.bfloat16).requires_grad_() for p in base]
    b = [p.detach().to(torch.bfloat16).requires_grad_() for p in base]
    oa = flashopt.FlashAdamW(a, lr=1e-2, weight_decay=0.1)
    ob = flashopt.FlashAdamW(b, lr=1e-2, weight_decay=0.1, quantize=False)
    assert ob.specs() == ["adamw_bf16_m24_f32states"]
    run(oa, a, 30)
    run(ob, b, 30)
    for p0, pa, pb in zip(base, a, b):
        cos, nmse = cos_nmse(oa.export_master(pa) - p0, ob.export_master(pb) - p0)
        assert cos > 0.999 and nmse < 5e-4, (cos, nmse)


def test_master_weight_modes_choose_bundles():
    p16 = [torch.randn(40, dtype=torch.bfloat16, requires_grad=True)]
    assert flashopt.FlashAdamW(p16).specs() == ["adamw_bf16_m24"]
    assert flashopt.FlashAdamW(p16, master_weight_bits=32).specs() == ["adamw_bf16_m32"]
    assert flashopt.FlashAdamW(p16, master_weight_bits=None).specs() == ["adamw_bf16"]
    h = [torch.randn(40, dtype=torch.float16, requires_grad=True)]
    assert flashopt.FlashSGD(h).specs() == ["sgd_f16_m24"]
    f = [torch.randn(40, requires_grad=True)]
    assert flashopt.FlashLion(f).specs() == ["lion_f32"]
    assert flashopt.FlashLion(f, quantize=False).specs() == ["lion_f32_f32states"]


def test_master_weights_beat_plain_bf16():
    """24- and 32-bit master weights track fp32 better than plain bf16."""
    ref = make_params(4, sizes=((256, 64),))
    errs = {}
    for bits in (None, 24, 32):
        ps = [p.detach().to(torch.bfloat16).requires_grad_() for p in ref]
        opt = flashopt.FlashAdamW(ps, lr=1e-4, master_weight_bits=bits)
        run(opt, ps, 20, grad_scale=1.0)
        errs[bits] = opt.export_master(ps[0])
    truth = make_params(4, sizes=((256, 64),))
    tref = torch.optim.AdamW(truth, lr=1e-4)
    run(tref, truth, 20, grad_scale=1.0)
    e = {k: float((v - truth[0].detach()).abs().mean()) for k, v in errs.items()}
    assert e[24] < e[None] and e[32] < e[None], e


@pytest.mark.parametrize("bits", [8, 4])
def test_fast_arithmetic_adamw(bits):
    """arithmetic="fast" (docs/NUMERICS.md §7) picks the fast bundle, passes
    numerics.md §8's bf16 thresholds against fp32 AdamW, and stays far closer
    to the exact mode than either is to fp32 (the updates θ_T − θ_0); with
    8-bit and with 4-bit states (adamw_bf16_m24_4bit_fast: update NMSE
    against the exact 4-bit mode ~1e-9 here)."""
    base = make_params(5)
    fast = [p.detach().to(torch.bfloat16).requires_grad_() for p in base]
    exact = [p.detach().to(torch.bfloat16).requires_grad_() for p in base]
    truth = [p.detach().clone().requires_grad_() for p in base]
    of = flashopt.FlashAdamW(fast, lr=1e-2, weight_decay=0.1, arithmetic="fast",
                             state_bits=bits)
    oe = flashopt.FlashAdamW(exact, lr=1e-2, weight_decay=0.1, state_bits=bits)
    four = "_4bit" if bits == 4 else ""
    assert of.specs() == [f"adamw_bf16_m24{four}_fast"] and oe.specs() == [f"adamw_bf16_m24{four}"]
    run(of, fast, 30)
    run(oe, exact, 30)
    run(torch.optim.AdamW(truth, lr=1e-2, weight_decay=0.1), truth, 30)
    differ = 0
    for p0, pf, pe, pt in zip(base, fast, exact, truth):
        mf, me = of.export_master(pf), oe.export_master(pe)
        cos, nmse = cos_nmse(mf, pt)
        assert cos > 0.975 and nmse < 0.05, (cos, nmse)
        cos, nmse = cos_nmse(mf - p0, me - p0)
        assert cos > 0.9999 and nmse < 1e-4, (cos, nmse)
        differ += int((mf != me).sum())
    assert differ > 0  # the fast bundle really ran


def test_fast_arithmetic_errors():
    p = [torch.randn(40, dtype=torch.bfloat16, requires_grad=True)]
    with pytest.raises(ValueError, match="arithmetic must be 'exact' or 'fast'"):
        flashopt.FlashAdamW(p, arithmetic="approximate")
    # Every rule ships a fast bundle (the matrix of specs/generate.py); the
    # FlashOptim numerics have no fast arithmetic.
    assert flashopt.FlashSGD(p, arithmetic="fast").specs() == ["sgd_bf16_m24_fast"]
    assert flashopt.FlashLion(p, arithmetic="fast").specs() == ["lion_bf16_m24_fast"]
    assert flashopt.FlashAdam(p, arithmetic="fast").specs() == ["adam_bf16_m24_fast"]
    with pytest.raises(ValueError, match="fast"):
        flashopt.FlashAdam(p, arithmetic="fast", numerics="flashoptim")
