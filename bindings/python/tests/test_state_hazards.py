"""The hazards of 8-bit optimizer states (docs/NUMERICS.md §8) on the
shipped kernels: each scenario runs in the default bounded numerics, where
the bound is asserted, and in FlashOptim's numerics (numerics="flashoptim",
bit-identical to the official kernels), where the same assertion fails — the
test checks that too, so the scenario keeps reaching the hazard. The scalar
reference runs the same hazards in unittests/Numerics/StateHazardsTest.cpp."""

import pytest
import torch
from torch import nn

import flashopt

pytest.importorskip("sklearn")


def digits():
    from sklearn.datasets import load_digits
    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).flatten(1) / 16.0
    return x, torch.tensor(d.target)


def first_layer_move(opt_factory, steps=400, batch=64):
    """AdamW-style training of a 64 -> 256 -> 10 MLP on the digits; the
    largest move of a first-layer weight. Pixels near the border are active
    in few images, so their weights get rare gradients."""
    x, y = digits()
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    w0 = model[0].weight.detach().clone()
    opt = opt_factory(model.parameters())
    g = torch.Generator().manual_seed(2)
    for _ in range(steps):
        idx = torch.randint(0, len(y), (batch,), generator=g)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()
    return float((model[0].weight.detach() - w0).abs().max())


@pytest.fixture(scope="module")
def torch_rare_move():
    return first_layer_move(lambda p: torch.optim.AdamW(p, lr=1e-3))


def test_unquantized_states_track_torch_on_rare_inputs(torch_rare_move):
    mine = first_layer_move(lambda p: flashopt.FlashAdamW(p, lr=1e-3, quantize=False))
    assert mine == pytest.approx(torch_rare_move, rel=1e-3)


@pytest.mark.parametrize("arithmetic", ["exact", "fast"])
def test_rare_inputs_move_as_fp32_does(torch_rare_move, arithmetic):
    """8-bit states with the bounded numerics: the largest first-layer move
    within 3x of torch's fp32 AdamW (FlashOptim's numerics: ~1500x)."""
    mine = first_layer_move(lambda p: flashopt.FlashAdamW(p, lr=1e-3, arithmetic=arithmetic))
    assert mine <= 3 * torch_rare_move, (mine, torch_rare_move)


def test_rare_inputs_blow_up_with_flashoptim_numerics(torch_rare_move):
    """The same test fails in FlashOptim's numerics: v rounds to code 0 while
    m keeps a code, and m / eps moves the weight by hundreds."""
    mine = first_layer_move(lambda p: flashopt.FlashAdamW(p, lr=1e-3, numerics="flashoptim"))
    assert mine > 100 * torch_rare_move, (mine, torch_rare_move)


def stopped_moves(make_opt, steps_before=200, steps_after=1000, n=4096, stride=64, lr=1e-3):
    """Every element gets N(0, 1) gradients for `steps_before` steps, then
    elements 0, stride, 2 stride, ... (beside 31 still active ones in their
    group) get 0 for `steps_after` steps: their cumulative moves meanwhile."""
    p = torch.zeros(n, dtype=torch.bfloat16, requires_grad=True)
    ref = torch.zeros(n, dtype=torch.float32, requires_grad=True)
    opt, ref_opt = make_opt([p]), make_opt.reference([ref])
    g = torch.Generator().manual_seed(11)
    stopped = torch.arange(0, n, stride)
    for s in range(steps_before + steps_after):
        grad = torch.randn(n, generator=g)
        if s >= steps_before:
            grad[stopped] = 0
        if s == steps_before:
            start, ref_start = opt.export_master(p)[stopped].clone(), ref.detach()[stopped].clone()
        p.grad, ref.grad = grad.to(torch.bfloat16), grad.clone()
        opt.step()
        ref_opt.step()
    return ((opt.export_master(p)[stopped] - start).abs().double(),
            (ref.detach()[stopped] - ref_start).abs().double())


class _Factory:
    def __init__(self, make, reference):
        self.make, self.reference = make, reference

    def __call__(self, params):
        return self.make(params)


ADAM = lambda **kw: _Factory(lambda p: flashopt.FlashAdam(p, lr=1e-3, **kw),  # noqa: E731
                             lambda p: torch.optim.Adam(p, lr=1e-3))
SGD = lambda **kw: _Factory(  # noqa: E731
    lambda p: flashopt.FlashSGD(p, lr=1e-2, momentum=0.9, **kw),
    lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9))


@pytest.mark.parametrize("rule,factory,lr", [("adam", ADAM, 1e-3), ("sgd", SGD, 1e-2)])
def test_a_stopped_gradient_moves_a_weight_as_fp32_does(rule, factory, lr):
    """After a weight's gradient stops, its cumulative move over 1000 steps
    stays within 2x of fp32's (up to one lr, a code's resolution for the
    weights fp32 barely moves); FlashOptim's sticky codes keep pushing."""
    mine, ref = stopped_moves(factory())
    worst = float((mine / ref.clamp_min(1e-30)).max())
    assert bool((mine <= torch.maximum(2 * ref, ref + lr)).all()), (rule, worst)
    fo, ref = stopped_moves(factory(numerics="flashoptim"))
    assert float((fo / ref.clamp_min(1e-30)).median()) > 2, rule


def test_adam_update_never_exceeds_exact_adams_bound():
    """One small gradient in a group of large ones (the single-element probe
    of shared/reference/state-hazards.md): FlashOptim divides m by eps,
    the bounded numerics stay within exact Adam's own bound (~7.3 lr)."""
    def probe(numerics, g0):
        n = 4096
        p = torch.zeros(n, dtype=torch.bfloat16, requires_grad=True)
        opt = flashopt.FlashAdam([p], lr=1e-3, numerics=numerics)
        g = torch.Generator().manual_seed(7)
        worst = 0.0
        for s in range(1, 261):
            grad = torch.randn(n, generator=g)
            grad[0] = g0 if s == 201 else 0.0
            p.grad = grad.to(torch.bfloat16)
            before = float(opt.export_master(p)[0])
            opt.step()
            if s >= 202:
                worst = max(worst, abs(float(opt.export_master(p)[0]) - before) / 1e-3)
        return worst
    # g0 = 1e-2 (the example): v's code rounds to 0 while m's does
    # not, and FlashOptim moves the weight by ~2.5e5 lr per step.
    assert probe("flashoptim", 1e-2) > 1e4
    for g0 in (1e-2, 3e-2):
        assert probe("bounded", g0) <= 7.3 * 1.004 + 1e-3


def test_a_gradient_spike_leaves_its_neighbours_finite():
    """A finite gradient of 1e6 makes its group's momentum absmax overflow
    the f16 scale: FlashOptim's group then decodes inf and NaN, and its 31
    neighbours become NaN; the bounded numerics saturate the scale."""
    for numerics, want_nonfinite in (("flashoptim", True), ("bounded", False)):
        p = torch.zeros(64, dtype=torch.bfloat16, requires_grad=True)
        opt = flashopt.FlashAdam([p], lr=1e-3, numerics=numerics)
        g = torch.Generator().manual_seed(3)
        for s in range(3):
            grad = torch.randn(64, generator=g)
            if s == 0:
                grad[5] = 1e6
            p.grad = grad.to(torch.bfloat16)
            opt.step()
        nonfinite = int((~torch.isfinite(p.detach().float())).sum())
        assert (nonfinite >= 31) if want_nonfinite else (nonfinite == 0), (numerics, nonfinite)


def test_lion_follows_a_returning_gradient():
    """Lion (beta2 = 0.99): a paused weight's momentum freezes at a few codes
    in FlashOptim's numerics, and a small gradient of the other sign then
    cannot turn its update around; in the bounded numerics the momentum
    decays as fp32's does."""
    def run(numerics):
        n, stride = 4096, 64
        p = torch.zeros(n, dtype=torch.bfloat16, requires_grad=True)
        opt = flashopt.FlashLion([p], lr=1e-3, numerics=numerics)
        g = torch.Generator().manual_seed(13)
        stopped = torch.arange(0, n, stride)
        for s in range(1, 801):
            grad = torch.randn(n, generator=g)
            if s == 200:
                sign = grad[stopped].sign()
            if s > 200:
                grad[stopped] = 0.0 if s <= 500 else -0.01 * sign
            if s == 501:
                start = opt.export_master(p)[stopped].clone()
            p.grad = grad.to(torch.bfloat16)
            opt.step()
        along = (opt.export_master(p)[stopped] - start) * sign / 1e-3
        return int((along < 0).sum())
    assert run("flashoptim") >= 10
    assert run("bounded") == 0
