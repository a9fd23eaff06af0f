"""The hazards of 8-bit optimizer states (docs/NUMERICS.md §8) on the
shipped kernels: each scenario runs in the default bounded numerics, where
the bound is asserted, and in FlashOptim's numerics (numerics="flashoptim",
bit-identical to the official kernels), where the same assertion fails — the
test checks that too, so the scenario keeps reaching the hazard. Every
scenario also runs with 4-bit states (state_bits=4: the *_4bit bundles,
docs/NUMERICS.md §2e), held to the 8-bit bar where the 4-bit kernels meet it
and to the 4-bit bar of BARS_4BIT where they do not (FlashOptim's numerics
have no 4-bit form). The scalar reference runs the same hazards in
unittests/Numerics/StateHazardsTest.cpp and StateHazards4Test.cpp.
bench/state_hazards/scorecard.py prints every scenario's numbers and marks
the 4-bit ones within BARS."""

import functools
import math

import pytest
import torch
from torch import nn

import flashopt

pytest.importorskip("sklearn")

# The bars the bounded 8-bit numerics are held to, one per hazard: the tests below assert
# them, and bench/state_hazards/scorecard.py marks a 4-bit entry within them (one place, so
# the mark and the tests cannot disagree). A number is an upper bound, a pair (lo, hi) a
# range; "stopped weights" is (factor, lrs): every stopped weight's move within
# max(factor x fp32's, fp32's + lrs lr).
BARS = {
    "rare inputs": 3.0,             # largest first-layer move / torch fp32 AdamW's
    "stopped weights": (2.0, 1.0),  # every stopped weight's move against fp32's
    "probe": 7.3 * 1.004 + 1e-3,    # largest |update| / lr after the probe: exact Adam's bound
    "spike": 0,                     # non-finite weights after a gradient of 1e6
    "lion pause": 0,                # of 64 paused Lion weights, moving against the gradient
    "outlier drift": 2.0,           # |small elements' mean signed move| (lr)
    "outlier max": 2.0,             # small elements' largest move / fp32's largest
    "absent v": (0.8, 1.25),        # decoded v of the absent rows / fp32's
    "absent update": (0.8, 1.25),   # their update on return / fp32's
}

# 4-bit states, where the 4-bit kernels miss the 8-bit bar (every other hazard and case is
# held to BARS; never looser than BARS elsewhere): each bar is set just above what the
# scalar reference measures for the shipped 4-bit codes (unittests/Numerics/
# StateHazards4Test.cpp, docs/NUMERICS.md §8.7; its scenarios step f32 parameters with
# their own random gradients, so its numbers differ from these a little), or, for a case
# the reference does not run, just above what the kernels measure here. Keyed
# (hazard, case) or hazard.
BARS_4BIT = {
    # A 4-bit decision per step is noisy: a stopped weight decays as fp32's on median
    # (kernels 0.88x Adam, 0.79x SGD) but its largest move goes up to 6.1 lr (Adam, kernels;
    # reference 7.8 lr) and 34 lr (SGD momentum, kernels; reference 67 lr) beyond fp32's.
    # Round-to-nearest 4-bit codes stick (reference: median 249x Adam, 90x SGD).
    ("stopped weights", "adam"): (2.0, 8.0),
    ("stopped weights", "sgd"): (2.0, 70.0),
    # v's dithered random walk under a power-of-two scale (§8.6): the first update of a
    # returning token is 1.35x fp32's at beta2 0.999 and 1.27x at 0.9995 (kernels;
    # reference 1.36x at 0.999, where StateHazards4Test allows 1.5). At 0.95, 0.99 and
    # 0.9999 it is within the 8-bit bar (1.00x, 1.00x, 1.11x).
    ("absent update", 0.999): (0.8, 1.4),
    ("absent update", 0.9995): (0.8, 1.4),
    # beta2 0.95 (270 absent steps; the reference runs 0.99, 0.999, 0.9999 only): the
    # absent rows' mean decoded v is 1.87x fp32's (the same scenario with seeds 1-3:
    # 1.98-2.03x), the per-element ratios spread from 0.006x to 74x; their update on return
    # is 1.00x fp32's, v being ~1e-6 of its start and (1 - beta2) g^2 dominating it.
    ("absent v", 0.95): (0.8, 2.0),
}

STATE_BITS = [8, 4]


def bar(hazard, bits=8, case=None):
    """The bar of `hazard` (BARS) for states of `bits` bits: BARS_4BIT's where it has one
    for (hazard, case) or hazard, else the 8-bit one."""
    if bits == 4:
        for key in ((hazard, case), hazard):
            if key in BARS_4BIT:
                return BARS_4BIT[key]
    return BARS[hazard]


def within(value, b):
    """value within bar b: a number is an upper bound, a pair (lo, hi) a range."""
    if isinstance(b, tuple):
        return b[0] <= value <= b[1]
    return value <= b


def stopped_within(mine, ref, lr, b):
    """Every stopped weight's move within max(factor x fp32's, fp32's + lrs lr), b =
    (factor, lrs)."""
    factor, lrs = b
    return bool((mine <= torch.maximum(factor * ref, ref + lrs * lr)).all())


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


@pytest.mark.parametrize("bits,arithmetic", [(8, "exact"), (8, "fast"), (4, "exact")])
def test_rare_inputs_move_as_fp32_does(torch_rare_move, bits, arithmetic):
    """Quantized states with the bounded numerics: the largest first-layer
    move within 3x of torch's fp32 AdamW (FlashOptim's numerics: ~1500x).
    4-bit states (adamw_f32_4bit: e2m1 m, zero-free e3m1 v, docs/NUMERICS.md
    §2e) meet the 8-bit bar: 1.17x (issue 42)."""
    mine = first_layer_move(lambda p: flashopt.FlashAdamW(p, lr=1e-3, arithmetic=arithmetic,
                                                           state_bits=bits))
    print(f"rare inputs, {bits}-bit states: largest first-layer move {mine:.4g}, "
          f"torch fp32 {torch_rare_move:.4g} ({mine / torch_rare_move:.2f}x)")
    assert within(mine / torch_rare_move, bar("rare inputs", bits)), (mine, torch_rare_move)


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


@pytest.mark.parametrize("bits", STATE_BITS)
@pytest.mark.parametrize("rule,factory,lr", [("adam", ADAM, 1e-3), ("sgd", SGD, 1e-2)])
def test_a_stopped_gradient_moves_a_weight_as_fp32_does(rule, factory, lr, bits):
    """After a weight's gradient stops, its cumulative move over 1000 steps
    stays within 2x of fp32's (up to one lr, a code's resolution for the
    weights fp32 barely moves); FlashOptim's sticky codes keep pushing.
    4-bit states decay as fp32's on median, but a 4-bit decision per step
    takes the worst weight up to 6 lr (Adam) and 34 lr (SGD) beyond fp32's
    move: held to BARS_4BIT's 8 lr and 70 lr, above the reference's 7.8 and
    67 lr (docs/NUMERICS.md §8.7)."""
    mine, ref = stopped_moves(factory(state_bits=bits))
    ratio = mine / ref.clamp_min(1e-30)
    print(f"stopped {rule}, {bits}-bit states: move / fp32's median {float(ratio.median()):.3g}, "
          f"max {float(ratio.max()):.3g}, at most {float(((mine - ref) / lr).max()):.3g} lr "
          f"beyond fp32's")
    assert stopped_within(mine, ref, lr, bar("stopped weights", bits, rule)), \
        (rule, float(ratio.max()))
    if bits == 8:  # FlashOptim's numerics have 8-bit states only
        fo, ref = stopped_moves(factory(numerics="flashoptim"))
        assert float((fo / ref.clamp_min(1e-30)).median()) > 2, rule


def probe(g0, **opts):
    """The single-element probe of shared/reference/state-hazards.md: one
    small gradient g0 at step 201 in a group of N(0, 1) ones; element 0's
    largest |update| / lr over steps 202..260. opts: FlashAdam's options."""
    n = 4096
    p = torch.zeros(n, dtype=torch.bfloat16, requires_grad=True)
    opt = flashopt.FlashAdam([p], lr=1e-3, **opts)
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


@pytest.mark.parametrize("bits", STATE_BITS)
def test_adam_update_never_exceeds_exact_adams_bound(bits):
    """One small gradient in a group of large ones: FlashOptim divides m by
    eps, the bounded numerics stay within exact Adam's own bound (~7.3 lr);
    4-bit v is zero-free (no code 0 to divide by) and bounded too."""
    # g0 = 1e-2 (the example): v's code rounds to 0 while m's does
    # not, and FlashOptim moves the weight by ~2.5e5 lr per step.
    if bits == 8:
        assert probe(1e-2, numerics="flashoptim") > 1e4
    for g0 in (1e-2, 3e-2):
        assert within(probe(g0, state_bits=bits), bar("probe", bits)), g0


@pytest.mark.parametrize("bits", STATE_BITS)
def test_a_gradient_spike_leaves_its_neighbours_finite(bits):
    """A finite gradient of 1e6 makes its group's momentum absmax overflow
    FlashOptim's f16 scale: its group then decodes inf and NaN, and its 31
    neighbours become NaN. The bounded numerics' bf16 scales hold it (and
    saturate a finite absmax beyond 3.4e38); 4-bit codes have bf16 scales."""
    runs = [(dict(state_bits=bits), False)]
    if bits == 8:
        runs.insert(0, (dict(numerics="flashoptim"), True))
    for opts, want_nonfinite in runs:
        p = torch.zeros(64, dtype=torch.bfloat16, requires_grad=True)
        opt = flashopt.FlashAdam([p], lr=1e-3, **opts)
        g = torch.Generator().manual_seed(3)
        for s in range(3):
            grad = torch.randn(64, generator=g)
            if s == 0:
                grad[5] = 1e6
            p.grad = grad.to(torch.bfloat16)
            opt.step()
        nonfinite = int((~torch.isfinite(p.detach().float())).sum())
        if want_nonfinite:
            assert nonfinite >= 31, (opts, nonfinite)
        else:
            assert within(nonfinite, bar("spike", bits)), (opts, nonfinite)


def lion_pause(**opts):
    """Lion (beta2 = 0.99): 64 weights (one per two groups) get no gradient
    for 300 steps, then a small one of the other sign for 300: how many of
    them still move against it over those 300 steps, and their mean move
    along it (lr)."""
    n, stride = 4096, 64
    p = torch.zeros(n, dtype=torch.bfloat16, requires_grad=True)
    opt = flashopt.FlashLion([p], lr=1e-3, **opts)
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
    return int((along < 0).sum()), float(along.mean())


@pytest.mark.parametrize("bits", STATE_BITS)
def test_lion_follows_a_returning_gradient(bits):
    """Lion (beta2 = 0.99): a paused weight's momentum freezes at a few codes
    in FlashOptim's numerics, and a small gradient of the other sign then
    cannot turn its update around; in the bounded numerics the momentum
    decays as fp32's does."""
    if bits == 8:
        assert lion_pause(numerics="flashoptim")[0] >= 10
    assert within(lion_pause(state_bits=bits)[0], bar("lion pause", bits))


def outlier_channel(make_opt, steps=1000, groups=256):
    """Issue 39's outlier channel: in every group of 32, element 0 gets N(0, 1)
    gradients and the other 31 N(0, 1e-3) (a massive activation's weight
    column); AdamW, lr 1e-3, no decay. Returns the small elements' moves / lr
    (signed), bf16 parameters with the 24-bit master, from 0."""
    n = groups * 32
    p = torch.zeros(n, dtype=torch.bfloat16, requires_grad=True)
    opt = make_opt([p])
    g = torch.Generator().manual_seed(17)
    scale = torch.full((n,), 1e-3)
    scale[::32] = 1.0
    for _ in range(steps):
        p.grad = (torch.randn(n, generator=g) * scale).to(torch.bfloat16)
        opt.step()
    small = torch.ones(n, dtype=torch.bool)
    small[::32] = False
    return opt.export_master(p)[small].double() / 1e-3


@functools.lru_cache(maxsize=None)
def torch_outlier_channel(steps=1000, groups=256):
    """The same gradients (rounded to bf16, as the kernels read them) through
    torch's fp32 AdamW (computed once)."""
    n = groups * 32
    p = torch.zeros(n, requires_grad=True)
    opt = torch.optim.AdamW([p], lr=1e-3, weight_decay=0.0)
    g = torch.Generator().manual_seed(17)
    scale = torch.full((n,), 1e-3)
    scale[::32] = 1.0
    for _ in range(steps):
        p.grad = (torch.randn(n, generator=g) * scale).to(torch.bfloat16).float()
        opt.step()
    small = torch.ones(n, dtype=torch.bool)
    small[::32] = False
    return p.detach()[small].double() / 1e-3


@pytest.mark.parametrize("bits", STATE_BITS)
def test_an_outlier_channel_does_not_push_its_small_neighbours(bits):
    """Bounded: the small elements' mean signed move within +-2 lr and none
    moved twice as far as fp32's farthest; FlashOptim's codes (1/254 of the
    group's scale) let them run away. 4-bit codes meet the 8-bit bars (their
    small elements move less than fp32's: 0.41x)."""
    ref = torch_outlier_channel()
    mine = outlier_channel(lambda p: flashopt.FlashAdamW(p, lr=1e-3, weight_decay=0.0,
                                                         state_bits=bits))
    ref_max = float(ref.abs().max())
    assert abs(float(ref.mean())) < 2
    assert within(abs(float(mine.mean())), bar("outlier drift", bits)), float(mine.mean())
    assert within(float(mine.abs().max()) / ref_max, bar("outlier max", bits)), \
        (float(mine.abs().max()), ref_max)
    if bits == 8:
        fo = outlier_channel(lambda p: flashopt.FlashAdamW(p, lr=1e-3, weight_decay=0.0,
                                                           numerics="flashoptim"))
        assert float(fo.abs().max()) > 10 * ref_max, (float(fo.abs().max()), ref_max)


def absent_tokens(make_opt, absent, fp32=False):
    """Issue 39's absent tokens: a 64 x 64 embedding, 200 steps with every row
    active, then `absent` steps where the odd rows get no gradient, then one
    step with every row active. Returns (mean v of the absent rows before
    they return, their mean |update| on return / lr)."""
    n = 64 * 64
    p = torch.zeros(64, 64, dtype=torch.float32 if fp32 else torch.bfloat16, requires_grad=True)
    opt = make_opt([p])
    g = torch.Generator().manual_seed(19)
    odd = torch.zeros(64, 64, dtype=torch.bool)
    odd[1::2] = True
    for s in range(200 + absent):
        grad = torch.randn(64, 64, generator=g).to(torch.bfloat16)
        if s >= 200:
            grad[odd] = 0
        p.grad = grad.to(p.dtype)
        opt.step()
    v = opt.state[p]["exp_avg_sq"][odd].mean()
    if fp32:
        before = p.detach().clone()
    else:
        before = opt.export_master(p).view(64, 64).clone()
    p.grad = torch.randn(64, 64, generator=g).to(torch.bfloat16).to(p.dtype)
    opt.step()
    after = p.detach() if fp32 else opt.export_master(p).view(64, 64)
    return float(v), float((after - before)[odd].abs().mean() / 1e-3)


def absent_steps(beta2):
    """3000 absent steps, or fewer where beta2^steps < 1e-6."""
    return int(min(3000, math.ceil(math.log(1e-6) / math.log(beta2))))


@functools.lru_cache(maxsize=None)
def torch_absent_tokens(beta2):
    """absent_tokens() through torch's fp32 AdamW (computed once per beta2)."""
    kw = dict(lr=1e-3, betas=(0.9, beta2), weight_decay=0.0)
    return absent_tokens(lambda p: torch.optim.AdamW(p, **kw), absent_steps(beta2), fp32=True)


@pytest.mark.parametrize("bits", STATE_BITS)
@pytest.mark.parametrize("beta2", [0.95, 0.99, 0.999, 0.9995, 0.9999])
def test_absent_tokens_keep_their_second_moment(beta2, bits):
    """After the absent steps (3000, or fewer where beta2^steps < 1e-6), the
    absent rows' decoded v and their update when they return are within
    [0.8, 1.25] of fp32 AdamW's; FlashOptim's f16 scales, rounded to nearest,
    fall an ulp a step (beta2 0.999: 0.34x) or freeze (0.9995: 4.5x). 4-bit
    states: the update on return within [0.8, 1.4] at 0.999 and 0.9995 (1.35x,
    1.27x) and v within [0.8, 2.0] at 0.95 (1.87x), BARS_4BIT."""
    absent = absent_steps(beta2)
    kw = dict(lr=1e-3, betas=(0.9, beta2), weight_decay=0.0)
    v_ref, u_ref = torch_absent_tokens(beta2)
    v, u = absent_tokens(lambda p: flashopt.FlashAdamW(p, state_bits=bits, **kw), absent)
    print(f"absent tokens, beta2 {beta2}, {bits}-bit states: decoded v / fp32's "
          f"{v / v_ref:.3g}, update on return / fp32's {u / u_ref:.3g}")
    assert within(v / v_ref, bar("absent v", bits, beta2)), (v, v_ref)
    assert within(u / u_ref, bar("absent update", bits, beta2)), (u, u_ref)
    if bits == 8 and beta2 in (0.999, 0.9995):
        v_fo, _ = absent_tokens(lambda p: flashopt.FlashAdamW(p, numerics="flashoptim", **kw),
                                absent)
        assert not 0.5 <= v_fo / v_ref <= 2.0, (v_fo, v_ref)


@pytest.mark.parametrize("bits", STATE_BITS)
@pytest.mark.parametrize("betas", [(0.9, 0.0), (0.0, 0.0), (0.0, 0.999), (0.99, 0.5)])
def test_every_beta_torch_accepts_gives_finite_weights(betas, bits):
    """beta2 = 0 made the bound NaN at step 1; beta1^2 > beta2 made it
    overflow, and lr = 0 then gave 0 * inf = NaN."""
    p = torch.zeros(256, dtype=torch.bfloat16, requires_grad=True)
    opt = flashopt.FlashAdamW([p], lr=1e-3, betas=betas, state_bits=bits)
    g = torch.Generator().manual_seed(23)
    for s in range(1, 301):
        if s > 250:
            opt.param_groups[0]["lr"] = 0.0
        p.grad = torch.randn(256, generator=g).to(torch.bfloat16)
        opt.step()
        assert bool(torch.isfinite(p.detach().float()).all()), (betas, s)


@pytest.mark.parametrize("bits", STATE_BITS)
def test_a_long_run_with_beta1_squared_above_beta2_and_lr_zero_stays_finite(bits):
    """betas (0.95, 0.9), lr set to 0 at the end: the issue's NaN at step
    32,991 (the bound's geometric sum overflowing f32)."""
    p = torch.zeros(64, dtype=torch.bfloat16, requires_grad=True)
    opt = flashopt.FlashAdamW([p], lr=1e-3, betas=(0.95, 0.9), state_bits=bits)
    g = torch.Generator().manual_seed(29)
    grads = torch.randn(64, 64, generator=g).to(torch.bfloat16)
    for s in range(1, 33101):
        if s == 32900:
            opt.param_groups[0]["lr"] = 0.0
        p.grad = grads[s % 64]
        opt.step()
    assert bool(torch.isfinite(p.detach().float()).all())


@pytest.mark.parametrize("bits", STATE_BITS)
@pytest.mark.parametrize("make", [
    lambda p, **kw: flashopt.FlashAdamW(p, lr=1e-3, **kw),
    lambda p, **kw: flashopt.FlashSGD(p, lr=1e-2, momentum=0.9, **kw),
    lambda p, **kw: flashopt.FlashLion(p, lr=1e-4, **kw),
], ids=["adamw", "sgd", "lion"])
@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_a_non_finite_gradient_is_seen_in_its_own_step(make, bad, bits):
    """docs/NUMERICS.md §5 under the PROPAGATE policy: a NaN or infinite
    gradient element makes its own weight non-finite in that step and its
    group's weights at the next; the other group is untouched. (Lion's
    sign(inf) = 1 once left the weight finite while its group's scale was
    infinite.)"""
    p = torch.zeros(64, dtype=torch.bfloat16, requires_grad=True)
    opt = make([p], state_bits=bits)  # the binding runs the runtime's default policy, PROPAGATE
    g = torch.Generator().manual_seed(31)
    p.grad = torch.randn(64, generator=g).to(torch.bfloat16)
    opt.step()
    grad = torch.randn(64, generator=g)
    grad[3] = bad
    p.grad = grad.to(torch.bfloat16)
    opt.step()
    w = opt.export_master(p)
    assert not bool(torch.isfinite(w[3]))
    assert bool(torch.isfinite(w[32:]).all())
    p.grad = torch.randn(64, generator=g).to(torch.bfloat16)
    opt.step()
    assert not bool(torch.isfinite(opt.export_master(p)[:32]).any())
