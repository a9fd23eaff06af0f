"""state_dict()/load_state_dict() and safetensors checkpoints: exact round
trip and exact resume."""

import copy
import os

import pytest
import torch

import flashopt
from flashopt import _nibbles
from helpers import cos_nmse, make_params, rel_inf, set_grads, train


def clone_params(ps):
    return [p.detach().clone().requires_grad_() for p in ps]


def exact(sd):
    """The exact entries of a state dict: (parameter, key) -> tensor."""
    return {(i, k): v for i, st in sd["state"].items() for k, v in st.items()
            if isinstance(v, torch.Tensor)}


def assert_same_state(a, b):
    ea, eb = exact(a), exact(b)
    assert ea.keys() == eb.keys()
    for k, v in ea.items():
        assert torch.equal(eb[k], v), k


SETUPS = [
    ("adamw-bf16-m24", flashopt.FlashAdamW, torch.bfloat16, dict(lr=1e-2)),
    ("sgd-f32", flashopt.FlashSGD, torch.float32, dict(lr=1e-2, momentum=0.9)),
    ("lion-bf16-m32", flashopt.FlashLion, torch.bfloat16, dict(lr=1e-3, master_weight_bits=32)),
    ("adam-f32-unquantized", flashopt.FlashAdam, torch.float32, dict(quantize=False)),
    # 4-bit states (issue 42): codes packed per row in the entries.
    ("adamw-bf16-m24-4bit", flashopt.FlashAdamW, torch.bfloat16, dict(lr=1e-2, state_bits=4)),
    ("sgd-f32-4bit", flashopt.FlashSGD, torch.float32, dict(lr=1e-2, momentum=0.9,
                                                           state_bits=4)),
]


@pytest.mark.parametrize("name,cls,dtype,kw", SETUPS, ids=[s[0] for s in SETUPS])
def test_state_dict_round_trip_and_exact_resume(name, cls, dtype, kw):
    ps = make_params(11, dtype)
    opt = cls([{"params": ps[:2]}, {"params": ps[2:], "weight_decay": 0.05}], **kw)
    train(opt, ps, 5)
    sd = opt.state_dict()
    saved_params = clone_params(ps)
    # torch's layout: integer ids, per parameter its step, its bundle and its
    # exact state: codes and scales in their own dtypes, or fp32 states.
    assert sorted(sd["state"]) == list(range(len(ps)))
    assert sd["param_groups"][1]["params"] == list(range(2, len(ps)))
    (spec,) = opt.specs()
    for i, p in enumerate(ps):
        st = sd["state"][i]
        assert float(st["step"]) == 5 and st["flashopt.spec"] == spec
        for k, v in st.items():
            if k.endswith(".scales"):
                assert v.dim() == 1 and v.numel() == -(-p.numel() // 32)
            elif k.endswith(".codes") and opt.state_bits == 4:
                # Two codes per byte along the last dim (>= 2 dims), else one per byte.
                assert v.dtype == torch.uint8, k
                if p.dim() < 2:
                    assert int(v.max()) <= 15, k
                want = ((*p.shape[:-1], (p.shape[-1] + 1) // 2) if p.dim() >= 2
                        else (p.numel(),))
                assert tuple(v.shape) == want, (k, tuple(p.shape))
            elif k not in ("step", "flashopt.spec"):
                assert v.shape == p.shape, k
        if opt.quantize:
            assert any(v.dtype in (torch.int8, torch.uint8) for v in st.values()
                       if isinstance(v, torch.Tensor))
            assert any(k.endswith(".scales") for k in st)
        else:
            assert all(v.dtype == torch.float32 for k, v in st.items() if k != "flashopt.spec")
    # Continue the original 5 steps ...
    train(opt, ps, 5, start=5)
    # ... and a fresh optimizer loaded from the state dict (through a torch.save file).
    ps2 = saved_params
    opt2 = cls([{"params": ps2[:2]}, {"params": ps2[2:]}], **kw)
    buf = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"flashopt-sd-{os.getpid()}.pt")
    torch.save(sd, buf)
    opt2.load_state_dict(torch.load(buf, weights_only=False))
    os.unlink(buf)
    assert opt2.param_groups[1]["weight_decay"] == 0.05
    assert_same_state(sd, opt2.state_dict())
    train(opt2, ps2, 5, start=5)
    for a, b in zip(ps, ps2):
        assert torch.equal(a.detach(), b.detach()), name


def test_safetensors_checkpoint_exact_resume(tmp_path):
    ps = make_params(12, torch.bfloat16)
    opt = flashopt.FlashAdamW(ps, lr=1e-2)
    train(opt, ps, 4)
    path = tmp_path / "opt.safetensors"
    opt.save_checkpoint(path)
    ps2 = clone_params(ps)
    train(opt, ps, 4, start=4)
    opt2 = flashopt.FlashAdamW(ps2, lr=0.5)  # hyper-parameters come from the file
    opt2.load_checkpoint(path)
    assert opt2.param_groups[0]["lr"] == pytest.approx(1e-2)
    train(opt2, ps2, 4, start=4)
    for a, b in zip(ps, ps2):
        assert torch.equal(a.detach(), b.detach())
    # 5.125 B/param compressed (params 2 + correction 1 + states 2 + scales 0.125) plus header.
    n = sum(p.numel() for p in ps)
    size = path.stat().st_size
    assert 5 * n <= size <= 5.2 * n + 4096
    # Python's safetensors reads it.
    from safetensors.torch import load_file
    t = load_file(str(path))
    assert t["p0.exp_avg.codes"].dtype == torch.int8
    assert t["p0"].dtype == torch.bfloat16


def test_fp32_checkpoint_and_mixed_dtypes(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16),
                                torch.nn.Linear(16, 4))
    flashopt.cast_model(model)
    opt = flashopt.FlashAdamW(model.parameters(), lr=1e-2)
    assert sorted(opt.specs()) == ["adamw_bf16_m24", "adamw_f32"]
    x = torch.randn(32, 8, dtype=torch.bfloat16)

    def step():
        opt.zero_grad()
        model(x).float().pow(2).mean().backward()
        opt.step()
    for _ in range(3):
        step()
    path = tmp_path / "mixed.safetensors"
    opt.save_checkpoint(path, compressed=False)
    assert all(os.path.isfile(p) for p in opt.checkpoint_paths(path))
    snap = copy.deepcopy(model.state_dict())
    step()
    opt.load_checkpoint(path)
    # The fp32 form restores the master weights: fp32 parameters exactly, bf16
    # ones as the rounding of the master (within one bf16 ulp of the saved
    # parameter; the compressed form is the exact one).
    for k, v in model.state_dict().items():
        if v.dtype == torch.float32:
            assert torch.equal(v, snap[k]), k
        else:
            ref = snap[k].float()
            assert ((v.float() - ref).abs() <= ref.abs() * 2.0 ** -7).all(), k


def test_load_torch_adamw_state_dict():
    """A torch.optim.AdamW state dict (fp32 exp_avg / exp_avg_sq) loads into
    FlashAdamW with unquantized states and continues like torch."""
    mine, theirs = make_params(13), make_params(13)
    ref = torch.optim.AdamW(theirs, lr=1e-3)
    train(ref, theirs, 5)
    for a, b in zip(mine, theirs):
        a.data.copy_(b.data)
    opt = flashopt.FlashAdamW(mine, lr=1e-3, quantize=False)
    opt.load_state_dict(ref.state_dict())
    assert float(opt.state_dict()["state"][0]["step"]) == 5
    train(ref, theirs, 5, start=5)
    train(opt, mine, 5, start=5)
    for a, b in zip(mine, theirs):
        assert rel_inf(a, b) <= 1e-6


def test_load_state_dict_errors_change_nothing():
    ps = make_params(14)
    opt = flashopt.FlashAdamW(ps)
    train(opt, ps, 2)
    good = opt.state_dict()
    other = flashopt.FlashSGD(make_params(14), momentum=0.9).state_dict()
    with pytest.raises(ValueError, match="adamw_f32"):
        opt.load_state_dict(other)
    bad = copy.deepcopy(good)
    bad["state"][3]["exp_avg.codes"] = bad["state"][3]["exp_avg.codes"][:-1]
    with pytest.raises(ValueError, match="exp_avg.codes.*nothing was loaded"):
        opt.load_state_dict(bad)
    assert_same_state(good, opt.state_dict())


def test_a_state_dict_of_the_other_numerics_is_refused_by_name():
    """A run saved with numerics='flashoptim' does not resume in the bounded
    numerics (nor the other way round): a clear error, nothing loaded. Its
    fp32 states alone (without the exact entry) load as a conversion."""
    ps = make_params(14)
    bounded = flashopt.FlashAdamW(ps)
    train(bounded, ps, 2)
    before = bounded.state_dict()
    qs = make_params(14)
    fo = flashopt.FlashAdamW(qs, numerics="flashoptim")
    train(fo, qs, 3)
    theirs = fo.state_dict()
    with pytest.raises(ValueError, match="written with numerics='flashoptim'.*nothing was loaded"):
        bounded.load_state_dict(theirs)
    with pytest.raises(ValueError, match="written with numerics='bounded'"):
        fo.load_state_dict(before)
    assert_same_state(before, bounded.state_dict())
    # The conversion the message offers: the fp32 states, re-encoded here.
    theirs = fo.state_dict(fp32_states=True)
    bounded.load_state_dict(theirs)
    # Re-encoded with the bounded numerics' minifloat codes, rounded to
    # nearest (docs/NUMERICS.md §2d): within half a step of the coarsest
    # binade of a 4-bit mantissa, 2^-5 of the value (e3m4 for m, e4m4 for v).
    mine = bounded.state_dict(fp32_states=True)["state"]
    for i, st in theirs["state"].items():
        assert float(mine[i]["step"]) == float(st["step"]) == 3.0
        for k in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(mine[i][k], st[k], rtol=2 ** -5, atol=1e-6)


def test_changing_betas_resume_bit_for_bit():
    """Adam's bound follows the betas' running extremes (docs/NUMERICS.md
    §8.4), which the runtime keeps beside the hyper-parameters: a run whose
    beta1 cycles as OneCycleLR's cycle_momentum moves it, resumed from a
    state dict half-way, matches the uninterrupted run bit for bit (the
    envelopes travel in the state dict); they cannot be set by hand."""
    def beta1(s):
        return 0.85 + 0.1 * abs((s % 20) - 10) / 10

    def run(opt, params, start, steps):
        for s in range(start, start + steps):
            opt.param_groups[0]["betas"] = (beta1(s), 0.999)
            set_grads(params, s)
            opt.step()

    ps = make_params(21, torch.bfloat16)
    opt = flashopt.FlashAdamW(ps, lr=1e-2)
    run(opt, ps, 0, 15)
    sd = copy.deepcopy(opt.state_dict())
    qs = clone_params(ps)
    run(opt, ps, 15, 15)
    fresh = flashopt.FlashAdamW(qs, lr=1e-2)
    fresh.load_state_dict(sd)
    run(fresh, qs, 15, 15)
    for p, q in zip(ps, qs):
        assert torch.equal(opt.export_master(p), fresh.export_master(q))
    (b,) = opt._bundle_list()
    assert b.get_hyper(0, "beta1_min") == pytest.approx(0.85, abs=1e-6)
    assert b.get_hyper(0, "beta1_max") == pytest.approx(0.95, abs=1e-6)
    with pytest.raises(flashopt.FlashOptError, match="running max of \"beta1\""):
        b.set_hyper(0, "beta1_max", 0.5)


def test_four_bit_entries_hold_the_librarys_codes_row_by_row():
    # The entries of a 4-bit state are the library's packed codes, re-packed
    # along the last dimension with a zero pad nibble per odd row; 1-D ones
    # one code per byte.
    ps = make_params(13, torch.bfloat16)  # (7, 13), (33,), (64, 65), (1,)
    opt = flashopt.FlashAdamW(ps, lr=1e-2, state_bits=4)
    train(opt, ps, 3)
    (b,) = opt._bundle_list()
    assert b.packed == {"exp_avg.codes", "exp_avg_sq.codes"}
    sd = opt.state_dict()
    for i, p in enumerate(ps):
        for name in sorted(b.packed):
            raw = b.read_buffer(i, name)  # the library's flat packing
            assert raw.dtype == torch.uint8 and raw.numel() == (p.numel() + 1) // 2
            if p.numel() % 2:
                assert int(raw[-1]) >> 4 == 0  # the pad nibble
            codes = _nibbles.unpack(raw, p.numel())
            e = sd["state"][i][name]
            if p.dim() >= 2:
                rows = codes.reshape(-1, p.shape[-1])
                # byte j of row r: element 2j low, 2j + 1 high
                assert torch.equal(e[..., 0].reshape(-1) & 0xF, rows[:, 0])
                assert torch.equal(e[..., 0].reshape(-1) >> 4, rows[:, 1])
                if p.shape[-1] % 2:
                    assert torch.equal(e[..., -1].reshape(-1) >> 4,
                                       torch.zeros_like(rows[:, 0]))
            else:
                assert torch.equal(e, codes)
            assert torch.equal(_nibbles.unpack_rows(e, p.shape), codes)
        # Codes differ from zero after 3 steps (the entries are not padding).
        assert int(sd["state"][i]["exp_avg.codes"].max()) > 0


def test_four_bit_state_dict_bytes_per_param():
    # AdamW bf16 + 24-bit masters, 4-bit states: 1 (correction) + 2 x 0.5
    # (codes) + 2 x 2/32 (bf16 scales) = 2.125 B/param of 2-D parameters;
    # 1-D ones keep a code per byte (3.125 B/param: biases, norms).
    def nbytes(sd):
        return sum(v.numel() * v.element_size() for st in sd["state"].values()
                   for v in st.values() if isinstance(v, torch.Tensor) and v.dim() > 0)
    w = [torch.zeros(256, 512, dtype=torch.bfloat16, requires_grad=True),
         torch.zeros(512, 255, dtype=torch.bfloat16, requires_grad=True)]
    bias = [torch.zeros(4096, dtype=torch.bfloat16, requires_grad=True)]
    for params, lo, hi in ((w, 2.125, 2.128), (bias, 3.125, 3.125)):
        opt = flashopt.FlashAdamW(params, lr=1e-2, state_bits=4)
        n = sum(p.numel() for p in params)
        got = nbytes(opt.state_dict()) / n
        assert lo <= got <= hi, got
    opt8 = flashopt.FlashAdamW(w, lr=1e-2)
    assert nbytes(opt8.state_dict()) / sum(p.numel() for p in w) == pytest.approx(3.125, abs=2e-3)


def test_four_bit_fp32_form_converts_to_and_from_eight_bit(tmp_path):
    """fp32_states=True, and the library's f32 checkpoint, load into 8- and
    4-bit optimizers alike (the states re-encoded at the other width, the
    steps kept); the exact forms are refused across widths, nothing loaded."""
    ps = make_params(14, torch.bfloat16)
    o8 = flashopt.FlashAdamW(ps, lr=1e-2)
    train(o8, ps, 5)
    ps4 = clone_params(ps)
    o4 = flashopt.FlashAdamW(ps4, lr=1e-2, state_bits=4)
    o4.load_state_dict(o8.state_dict(fp32_states=True))
    for a, b in zip(ps, ps4):
        assert float(o4.state[b]["step"]) == 5
        for k in ("exp_avg", "exp_avg_sq"):
            x, y = o4.state[b][k], o8.state[a][k]
            # within the 4-bit code's error (NUMERICS §2e); measured <= 0.2
            assert rel_inf(x, y) <= 0.25 and cos_nmse(x, y)[0] >= 0.99, (k, tuple(a.shape))
    # 4 -> 8: the 4-bit values are exact in neither code in general, but
    # 8-bit codes hold them closely; 4 -> 4 gives the same values back.
    sd4 = o4.state_dict(fp32_states=True)
    o8b = flashopt.FlashAdamW(clone_params(ps), lr=1e-2)
    o8b.load_state_dict(sd4)
    o4b = flashopt.FlashAdamW(clone_params(ps), lr=1e-2, state_bits=4)
    o4b.load_state_dict(sd4)
    for i, (p8, p4) in enumerate(zip(o8b.param_groups[0]["params"],
                                     o4b.param_groups[0]["params"])):
        assert float(o8b.state[p8]["step"]) == 5
        for k in ("exp_avg", "exp_avg_sq"):
            assert rel_inf(o8b.state[p8][k], sd4["state"][i][k]) <= 0.01, k
            assert torch.equal(o4b.state[p4][k], sd4["state"][i][k]), k
    # Exact forms across widths: refused by bundle, nothing changes.
    before = o4.state_dict()
    with pytest.raises(ValueError, match="adamw_bf16_m24.*adamw_bf16_m24_4bit"):
        o4.load_state_dict(o8.state_dict())
    with pytest.raises(ValueError, match="adamw_bf16_m24_4bit.*adamw_bf16_m24"):
        o8b.load_state_dict(before)
    assert_same_state(before, o4.state_dict())
    # The library's files: compressed refused across widths, f32 converts.
    o4.save_checkpoint(tmp_path / "c4.safetensors")
    o4.save_checkpoint(tmp_path / "f4.safetensors", compressed=False)
    with pytest.raises(flashopt.FlashOptError, match="4-bit"):
        o8b.load_checkpoint(tmp_path / "c4.safetensors")
    o8b.load_checkpoint(tmp_path / "f4.safetensors")
    for a, b in zip(o8b.param_groups[0]["params"], ps4):
        assert rel_inf(o8b.state[a]["exp_avg"], o4.state[b]["exp_avg"]) <= 0.01
    from safetensors import safe_open
    with safe_open(str(tmp_path / "c4.safetensors"), "pt") as f:
        meta = f.metadata()
        assert meta["packing"] == "nibbles:low-first" and "state_encodings" in meta
        assert tuple(f.get_slice("p2.exp_avg.codes").get_shape()) == ((64 * 65 + 1) // 2,)
