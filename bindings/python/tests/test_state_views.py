"""opt.state[p] views and the compact state_dict() (docs/PYTHON.md "The
optimizer state"): the views decode one parameter's state when read and
encode when written; state_dict() holds the compressed states per
parameter (at FlashOptim's size, under torch's), and fp32 ones on request."""

import io

import pytest
import torch

import flashopt
from helpers import make_params, train


RULES = [
    ("adamw", flashopt.FlashAdamW, dict(lr=1e-2), ("exp_avg", "exp_avg_sq")),
    ("adam-unquantized", flashopt.FlashAdam, dict(lr=1e-2, quantize=False),
     ("exp_avg", "exp_avg_sq")),
    ("sgd-momentum", flashopt.FlashSGD, dict(lr=1e-2, momentum=0.9), ("momentum_buffer",)),
    ("lion", flashopt.FlashLion, dict(lr=1e-3), ("exp_avg",)),
    # 4-bit states (issue 42): the views are fp32, decoded by the library.
    ("adamw-4bit", flashopt.FlashAdamW, dict(lr=1e-2, state_bits=4), ("exp_avg", "exp_avg_sq")),
    ("sgd-momentum-4bit", flashopt.FlashSGD, dict(lr=1e-2, momentum=0.9, state_bits=4),
     ("momentum_buffer",)),
]


@pytest.mark.parametrize("name,cls,kw,states", RULES, ids=[r[0] for r in RULES])
def test_views_hold_torch_names_and_equal_the_fp32_state_dict(name, cls, kw, states):
    ps = make_params(3, torch.bfloat16)
    opt = cls(ps, **kw)
    train(opt, ps, 4)
    fp32 = opt.state_dict(fp32_states=True)
    assert len(opt.state) == len(ps)
    for i, p in enumerate(ps):
        st = opt.state[p]
        assert tuple(k for k in st if k not in ("step", "flashopt.spec")) == states
        assert float(st["step"]) == 4 and st["step"].dtype == torch.float32
        for k in states:
            v = st[k]
            assert v.dtype == torch.float32 and v.shape == p.shape
            assert torch.equal(v, fp32["state"][i][k]), (k, i)
            assert v.abs().max() > 0  # 4 steps of N(0, 0.01) gradients
        # torch.optim's layout: no compressed entries in the fp32 form.
        assert set(fp32["state"][i]) == {"step", *states}


def test_views_decode_only_what_is_read(monkeypatch):
    ps = make_params(4, torch.bfloat16)
    opt = flashopt.FlashAdamW(ps, lr=1e-2)
    train(opt, ps, 2)
    calls = []
    b = opt._bundle_list()[0]
    real = b.export_state
    monkeypatch.setattr(b, "export_state", lambda i, n: calls.append((i, n)) or real(i, n))
    # What code that only looks at the structure does: nothing is decoded.
    assert len(opt.state) == 4
    for p, st in opt.state.items():
        assert "exp_avg" in st and "momentum_buffer" not in st
        assert list(st) == ["step", "exp_avg", "exp_avg_sq", "flashopt.spec"]
        assert len(st) == 4
        repr(st)
    assert calls == []
    # A read decodes that state of that parameter only.
    opt.state[ps[2]]["exp_avg_sq"]
    assert calls == [(2, "exp_avg_sq")]


def test_write_through_a_view():
    ps = make_params(5, torch.bfloat16)
    opt = flashopt.FlashAdamW(ps, lr=1e-2)
    train(opt, ps, 3)
    p = ps[2]
    before = opt.state_dict()
    # Writing back what was read changes no bit of the compressed state.
    for k in ("exp_avg", "exp_avg_sq"):
        opt.state[p][k] = opt.state[p][k]
    after = opt.state_dict()
    for k, v in before["state"][2].items():
        if isinstance(v, torch.Tensor):
            assert torch.equal(after["state"][2][k], v), k
    # A new value is encoded: within half a code step (softsign's steps are
    # at most 2/127 of the group's scale, at the top) plus the bf16 scale's
    # rounding (2^-8 of it).
    m = torch.linspace(-1, 1, p.numel()).reshape(p.shape)
    opt.state[p]["exp_avg"] = m
    got = opt.state[p]["exp_avg"]
    err = float((got - m).abs().max())
    assert 0 < err <= 1 / 127 + 2 ** -8, err
    opt.state[p]["exp_avg"] = torch.zeros(p.shape)
    assert torch.equal(opt.state[p]["exp_avg"], torch.zeros(p.shape))
    # The other parameters' states and every step counter are untouched.
    sd = opt.state_dict()
    for i in (0, 1, 3):
        for k, v in before["state"][i].items():
            if isinstance(v, torch.Tensor):
                assert torch.equal(sd["state"][i][k], v), (i, k)
    # Mistakes are errors that change nothing.
    with pytest.raises(ValueError, match="takes 4160 values"):
        opt.state[p]["exp_avg"] = torch.zeros(3)
    with pytest.raises(TypeError, match="read-only"):
        opt.state[p]["step"] = torch.tensor(9.0)
    with pytest.raises(KeyError, match="keeps no state 'momentum_buffer'"):
        opt.state[p]["momentum_buffer"] = torch.zeros(p.shape)
    with pytest.raises(TypeError, match="cannot be deleted"):
        del opt.state[p]["exp_avg"]
    assert torch.equal(opt.state[p]["exp_avg"], torch.zeros(p.shape))
    train(opt, ps, 1, start=3)
    assert all(torch.isfinite(q).all() for q in ps)


def saved_bytes(obj) -> int:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.tell()


def model(dtype):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.GELU(),
                               torch.nn.LayerNorm(512), torch.nn.Linear(512, 512)).to(dtype)


def test_compact_state_dict_size_and_exact_round_trip():
    m = model(torch.bfloat16)
    ps = list(m.parameters())
    n = sum(p.numel() for p in ps)
    opt = flashopt.FlashAdamW(ps, lr=1e-3)
    train(opt, ps, 3)
    sd = opt.state_dict()
    # Per parameter: step, bundle, correction term, codes and scales; no
    # parameter and no fp32 state.
    st = sd["state"][0]
    assert set(st) == {"step", "flashopt.spec", "correction", "exp_avg.codes", "exp_avg.scales",
                       "exp_avg_sq.codes", "exp_avg_sq.scales"}
    assert st["correction"].dtype == torch.int8 and st["exp_avg_sq.codes"].dtype == torch.uint8
    assert "flashopt" not in sd
    compact = saved_bytes(sd) / n
    # 1 (correction) + 2 x 1 (codes) + 2 x 2/32 (bf16 scales) = 3.125 B/param.
    assert compact <= 3.2, compact
    fp32 = saved_bytes(opt.state_dict(fp32_states=True)) / n
    ref = torch.optim.AdamW([p.detach().float().requires_grad_() for p in ps], lr=1e-3)
    for q in ref.param_groups[0]["params"]:
        q.grad = torch.ones_like(q)
    ref.step()
    torch_bytes = saved_bytes(ref.state_dict()) / n
    assert 8.0 <= fp32 < 8.1 and 8.0 <= torch_bytes < 8.1, (fp32, torch_bytes)
    # Bit for bit: a fresh optimizer loads it and both continue alike.
    ps2 = [p.detach().clone().requires_grad_() for p in ps]
    opt2 = flashopt.FlashAdamW(ps2, lr=1e-3)
    opt2.load_state_dict(torch.load(io.BytesIO(_save(sd)), weights_only=True))
    sd2 = opt2.state_dict()
    for i in sd["state"]:
        for k, v in sd["state"][i].items():
            if isinstance(v, torch.Tensor):
                assert torch.equal(sd2["state"][i][k], v), (i, k)
    train(opt, ps, 3, start=3)
    train(opt2, ps2, 3, start=3)
    for a, b in zip(ps, ps2):
        assert torch.equal(a.detach(), b.detach())
        assert torch.equal(opt.export_master(a), opt2.export_master(b))


def _save(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def test_fp32_state_dict_loads_into_torch_and_back():
    ps = make_params(6, torch.float32)
    opt = flashopt.FlashAdamW(ps, lr=1e-2)
    train(opt, ps, 3)
    sd = opt.state_dict(fp32_states=True)
    ref_ps = [p.detach().clone().requires_grad_() for p in ps]
    ref = torch.optim.AdamW(ref_ps, lr=1e-2)
    ref.load_state_dict(sd)
    for i, q in enumerate(ref_ps):
        assert torch.equal(ref.state[q]["exp_avg"], opt.state[ps[i]]["exp_avg"])
    # And back into flashopt: the states re-encode to what they were.
    opt2 = flashopt.FlashAdamW([p.detach().clone().requires_grad_() for p in ps], lr=1e-2)
    opt2.load_state_dict(ref.state_dict())
    for a, b in zip(opt.state_dict()["state"].values(), opt2.state_dict()["state"].values()):
        for k, v in a.items():
            if isinstance(v, torch.Tensor):
                assert torch.equal(b[k], v), k


def test_first_format_state_dicts_still_load():
    """State dicts of flashopt 0.1's first format (fp32 states per parameter
    plus a top-level 'flashopt' entry with whole compressed checkpoints)."""
    from flashopt import _lib as L
    from flashopt import _state
    ps = make_params(7, torch.bfloat16)
    opt = flashopt.FlashAdamW(ps, lr=1e-2)
    train(opt, ps, 3)
    b = opt._bundle_list()[0]
    tensors, meta = _state.read(b.checkpoint_bytes(L.CHECKPOINT_COMPRESSED))
    old = opt.state_dict(fp32_states=True)
    old["flashopt"] = {"version": 1, "bundles": {b.spec: {"metadata": meta, "tensors": tensors}}}
    ps2 = [p.detach().clone().requires_grad_() for p in ps]
    opt2 = flashopt.FlashAdamW(ps2, lr=1e-2)
    opt2.load_state_dict(old)
    for a, c in zip(opt.state_dict()["state"].values(), opt2.state_dict()["state"].values()):
        for k, v in a.items():
            if isinstance(v, torch.Tensor):
                assert torch.equal(c[k], v), k


def test_compact_entries_are_checked_before_anything_loads():
    ps = make_params(8, torch.bfloat16)
    opt = flashopt.FlashAdamW(ps, lr=1e-2)
    train(opt, ps, 2)
    good = opt.state_dict()
    bad = opt.state_dict()
    bad["state"][3]["exp_avg.codes"] = bad["state"][3]["exp_avg.codes"].to(torch.int16)
    train(opt, ps, 1, start=2)
    keep = opt.state_dict()
    with pytest.raises(TypeError, match="exp_avg.codes"):
        opt.load_state_dict(bad)
    now = opt.state_dict()
    for i in keep["state"]:
        for k, v in keep["state"][i].items():
            if isinstance(v, torch.Tensor):
                assert torch.equal(now["state"][i][k], v), (i, k)
    bad = opt.state_dict()
    bad["state"][1]["exp_avg_sq.scales"] = bad["state"][1]["exp_avg_sq.scales"][:-1]
    with pytest.raises(ValueError, match="exp_avg_sq.scales"):
        opt.load_state_dict(bad)
    opt.load_state_dict(good)
    assert float(opt.state[ps[0]]["step"]) == 2


def test_four_bit_views_decode_and_write_through():
    """opt.state[p] of 4-bit states: fp32, and exactly the codes and scales
    of state_dict()'s entries decoded by docs/NUMERICS.md §2e's tables
    (m: e2m1, a two's-complement nibble, ±{0, 1/8, 1/4, 3/8, 1/2, 3/4, 1,
    3/2}·s; v: zero-free e3m1, {2^-8, 2^-7, 2^-6, 1.5·2^-6, ..., 1, 1.5}·s),
    scales per 32 consecutive elements: the row-packed entries hold the
    library's codes in the parameter's order."""
    from flashopt import _nibbles as N
    ps = make_params(9, torch.bfloat16)  # (7, 13), (33,), (64, 65), (1,)
    opt = flashopt.FlashAdamW(ps, lr=1e-2, state_bits=4)
    train(opt, ps, 3)
    sd = opt.state_dict()
    e2m1 = torch.tensor([0, 1 / 8, 1 / 4, 3 / 8, 1 / 2, 3 / 4, 1, 3 / 2])
    e3m1 = torch.tensor([2.0 ** -8, 2.0 ** -7] + [f * 2.0 ** e for e in range(-6, 1)
                                                   for f in (1, 1.5)])
    for i, p in enumerate(ps):
        st, n = sd["state"][i], p.numel()

        def scales(name):
            return st[name].float().repeat_interleave(32)[:n]
        c = N.unpack_rows(st["exp_avg.codes"], p.shape).long()
        k = torch.where(c >= 8, c - 16, c)
        m = (torch.sign(k) * e2m1[k.abs()] * scales("exp_avg.scales")).reshape(p.shape)
        v = (e3m1[N.unpack_rows(st["exp_avg_sq.codes"], p.shape).long()]
             * scales("exp_avg_sq.scales")).reshape(p.shape)
        view = opt.state[p]
        assert view["exp_avg"].dtype == torch.float32 and view["exp_avg"].shape == p.shape
        assert torch.equal(view["exp_avg"], m) and torch.equal(view["exp_avg_sq"], v), i
        assert m.abs().max() > 0
    p = ps[2]  # (64, 65): an odd last dimension
    v = opt.state[p]["exp_avg_sq"]
    opt.state[p]["exp_avg_sq"] = v  # decoded values re-encode to themselves
    assert torch.equal(opt.state[p]["exp_avg_sq"], v)
    opt.state[p]["exp_avg"] = torch.zeros(p.shape)
    assert torch.equal(opt.state[p]["exp_avg"], torch.zeros(p.shape))
    (b,) = opt._bundle_list()
    assert int(b.read_buffer(2, "exp_avg.codes").max()) == 0  # zero codes, pad zero
    train(opt, ps, 1, start=3)
    assert all(torch.isfinite(q).all() for q in ps)


def test_four_bit_compact_state_dict_size_and_memory():
    # The model above with 4-bit states: 2 x (512, 512) weights (2.125 B/param:
    # correction 1, codes 2 x 0.5, scales 2 x 2/32) and 2048 bias and norm
    # elements (3.125: a code per byte), plus torch.save's framing; the
    # memory report 6.125 B/param (4.125 with gradient release).
    m = model(torch.bfloat16)
    ps = list(m.parameters())
    n = sum(p.numel() for p in ps)
    opt = flashopt.FlashAdamW(ps, lr=1e-3, state_bits=4)
    train(opt, ps, 2)
    compact = saved_bytes(opt.state_dict()) / n
    assert 2.125 <= compact <= 2.16, compact  # measured 2.148
    r = opt.memory_report()
    assert r["bytes_per_param"] == pytest.approx(6.125, abs=1e-3)
    assert r["bytes_per_param_with_grad_release"] == pytest.approx(4.125, abs=1e-3)
