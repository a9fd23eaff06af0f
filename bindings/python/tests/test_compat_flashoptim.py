"""flashopt.compat.flashoptim: FlashOptim 0.1.4's public API over flashopt, on
a FlashOptim-style training loop (cast_model, gradient release with a
pre_step, a checkpoint and its resume, fp32 weights reconstructed for export)
and every argument flashopt cannot honour."""

import inspect
import io

import pytest
import torch

import flashopt
import flashopt.compat.flashoptim as flashoptim

# FlashOptim 0.1.4's __init__.py and signatures (positional order matters: a
# FlashOptim user may pass decouple_lr or quantize positionally).
PUBLIC = ["FlashAdam", "FlashAdamW", "FlashLion", "FlashOptimizer", "FlashSGD", "FlashSGDW",
          "GradientReleaseHandle", "NumericsError", "compute_ecc_bits", "cast_model",
          "enable_gradient_release", "reconstruct_fp32_param"]
OPTIONS = ["quantize", "compress_state_dict", "master_weight_bits", "check_numerics", "fused"]
SIGNATURES = {
    "FlashSGD": ["params", "lr", "momentum", "dampening", "weight_decay", "nesterov", *OPTIONS],
    "FlashSGDW": ["params", "lr", "momentum", "dampening", "weight_decay", "nesterov",
                  "decouple_lr", *OPTIONS],
    "FlashAdam": ["params", "lr", "betas", "eps", "weight_decay", *OPTIONS],
    "FlashAdamW": ["params", "lr", "betas", "eps", "weight_decay", "decouple_lr", *OPTIONS],
    "FlashLion": ["params", "lr", "betas", "weight_decay", "decouple_lr", *OPTIONS],
    "cast_model": ["model", "dtype", "selective", "full_precision_keywords"],
    "enable_gradient_release": ["model", "optimizer", "grad_scaler", "pre_step"],
    "compute_ecc_bits": ["fp32_param", "narrow_param"],
    "reconstruct_fp32_param": ["param", "error_bits"],
}


def test_every_public_name_with_its_signature():
    assert sorted(flashoptim.__all__) == sorted(PUBLIC)
    for name in PUBLIC:
        assert hasattr(flashoptim, name), name
    for name, want in SIGNATURES.items():
        obj = getattr(flashoptim, name)
        params = inspect.signature(obj.__init__ if inspect.isclass(obj) else obj).parameters
        got = [p for p in params if p not in ("self", "numerics")]
        assert got == want, name
    assert issubclass(flashoptim.FlashAdamW, flashopt.FlashAdamW)
    assert flashoptim.FlashOptimizer is flashopt.FlashOptimizer
    assert flashoptim.NumericsError is flashopt.NumericsError


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(),
                                        torch.nn.LayerNorm(64), torch.nn.Linear(64, 64))
        self.head = torch.nn.Linear(64, 4)

    def forward(self, x):
        return self.head(self.body(x))


def batches(n, seed=3):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(32, 16, generator=g), torch.randint(0, 4, (32,), generator=g))
            for _ in range(n)]


def run(model, opt, data, release=None):
    for x, y in data:
        if release is None:
            opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x.to(torch.bfloat16)).float(), y)
        loss.backward()
        if release is None:
            opt.step()


@pytest.mark.parametrize("compress", [False, True])
def test_a_flashoptim_training_loop(compress):
    # FlashOptim's recipe: cast to bf16 keeping the head fp32, AdamW with
    # 24-bit masters, gradient release (with a pre_step), checkpoint, resume.
    def build():
        m = Net()
        flashoptim.cast_model(m, dtype=torch.bfloat16, full_precision_keywords=["head"])
        o = flashoptim.FlashAdamW(m.parameters(), lr=1e-2, weight_decay=0.01,
                                  master_weight_bits=24, compress_state_dict=compress)
        return m, o

    model, opt = build()
    assert model.head.weight.dtype == torch.float32
    assert model.body[0].weight.dtype == torch.bfloat16
    skipped = []

    def pre_step(p, group):
        assert group is opt.param_groups[0]
        if p is model.body[3].bias and len(skipped) < 2:
            skipped.append(p)
            return False  # FlashOptim's contract: skip this parameter's step
        return True

    handle = flashoptim.enable_gradient_release(model, opt, pre_step=pre_step)
    assert handle.active
    frozen = model.body[3].bias.detach().clone()
    data = batches(6)
    run(model, opt, data[:1], release=handle)
    assert torch.equal(model.body[3].bias.detach(), frozen)  # skipped, its gradient kept
    assert model.body[3].bias.grad is not None
    assert model.body[0].weight.grad is None  # stepped and released
    run(model, opt, data[1:3], release=handle)
    handle.remove()
    assert not handle.active
    sd = opt.state_dict()
    st = sd["state"][0]
    if compress:
        assert "exp_avg.codes" in st and "error_bits" not in st
    else:  # FlashOptim's default: dequantized states and the correction term
        assert st["exp_avg"].dtype == torch.float32 and st["error_bits"].dtype == torch.int8
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "optim": sd}, buf)

    # FlashOptim's export of fp32 weights, three ways, the same bits.
    fp32 = opt.get_fp32_model_state_dict(model)
    for name, p in model.named_parameters():
        if p.dtype == torch.bfloat16:
            w = flashoptim.reconstruct_fp32_param(p, opt.state[p]["error_bits"])
            assert torch.equal(w, fp32[name]) and torch.equal(w, opt.export_master(p)), name
            assert opt.state[p]["exp_avg"].materialize().shape == p.shape

    # Resume in a fresh process's objects; both go on alike, bit for bit.
    model2, opt2 = build()
    buf.seek(0)
    ck = torch.load(buf, weights_only=False)
    model2.load_state_dict(ck["model"])
    opt2.load_state_dict(ck["optim"])
    run(model, opt, data[3:])
    run(model2, opt2, data[3:])
    for (n, a), (_, b) in zip(model.named_parameters(), model2.named_parameters()):
        assert torch.equal(a.detach(), b.detach()), n
        assert torch.equal(opt.export_master(a), opt2.export_master(b)), n


def test_ecc_helpers_are_the_codec():
    torch.manual_seed(1)
    w = torch.randn(1000) * 3
    narrow = w.to(torch.bfloat16)
    ecc = flashoptim.compute_ecc_bits(w, narrow)
    assert ecc.dtype == torch.int16  # 0.1.4: fp32 minus a 2-byte parameter
    p, c = flashopt.encode_master(w, torch.bfloat16, 32)
    assert torch.equal(p.view(torch.int16), narrow.view(torch.int16)) and torch.equal(c, ecc)
    back = flashoptim.reconstruct_fp32_param(narrow, ecc)
    assert (back - w).abs().max() <= w.abs().max() * 2.0 ** -22
    p8, c8 = flashopt.encode_master(w, torch.bfloat16, 24)
    assert c8.dtype == torch.int8
    assert (flashopt.decode_master(p8, c8) - w).abs().max() <= w.abs().max() * 2.0 ** -14
    with pytest.raises(ValueError, match="round-to-nearest-even of fp32_param at 1 elements"):
        bad = narrow.clone()
        bad[7] = bad[7] * 2
        flashoptim.compute_ecc_bits(w, bad)
    with pytest.raises(ValueError, match="int8 or int16"):
        flashoptim.reconstruct_fp32_param(narrow, ecc.float())


def test_arguments_flashopt_cannot_honour_raise_by_name():
    ps = [torch.zeros(8, dtype=torch.bfloat16, requires_grad=True)]
    with pytest.raises(ValueError, match="fused=False"):
        flashoptim.FlashAdamW(ps, fused=False)
    with pytest.raises(ValueError, match="compress_state_dict=True requires quantize=True"):
        flashoptim.FlashSGD(ps, compress_state_dict=True, quantize=False)
    with pytest.raises(ValueError, match="quantize=False.*per optimizer"):
        flashoptim.FlashAdamW([{"params": ps, "quantize": False}])
    with pytest.raises(ValueError, match="master_bytewidth=4.*per optimizer"):
        flashoptim.FlashLion([{"params": ps, "master_bytewidth": 4}])
    opt = flashoptim.FlashAdamW(ps)
    assert opt.param_groups[0]["master_bytewidth"] == 3 and opt.param_groups[0]["quantize"]
    model = torch.nn.Linear(4, 4).to(torch.bfloat16)
    o2 = flashoptim.FlashAdamW(model.parameters())
    with pytest.raises(NotImplementedError, match="grad_scaler"):
        flashoptim.enable_gradient_release(model, o2, grad_scaler=torch.amp.GradScaler("cpu"))
    # selective=False casts the norms too (FlashOptim's meaning).
    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    flashoptim.cast_model(m, selective=False)
    assert m[1].weight.dtype == torch.bfloat16


def test_flashoptim_uncompressed_state_dicts_load():
    """A state dict as FlashOptim 0.1.4 writes it by default: bf16 states and
    the int8 correction term cast to bf16 by value (master_bytewidth 3 in the
    param group); the master weights come back from it."""
    torch.manual_seed(2)
    p = torch.randn(64, 32).to(torch.bfloat16).requires_grad_()
    src = flashoptim.FlashAdamW([p], lr=1e-2)
    for s in range(3):
        p.grad = torch.randn(64, 32, generator=torch.Generator().manual_seed(s)).to(p.dtype)
        src.step()
    theirs = src.state_dict()
    st = theirs["state"][0]
    st["exp_avg"] = st["exp_avg"].to(torch.bfloat16)
    st["exp_avg_sq"] = st["exp_avg_sq"].to(torch.bfloat16)
    st["error_bits"] = st["error_bits"].to(torch.bfloat16)
    assert theirs["param_groups"][0]["master_bytewidth"] == 3
    q = p.detach().clone().requires_grad_()
    dst = flashopt.FlashAdamW([q], lr=1e-2)
    dst.load_state_dict(theirs)
    assert torch.equal(dst.export_master(q), src.export_master(p))
    assert float(dst.state[q]["step"]) == 3
    # Their compressed form is refused by name, nothing loaded.
    st2 = dict(st)
    st2["exp_avg::quantized"] = torch.zeros(64, 32, dtype=torch.int8)
    with pytest.raises(ValueError, match="compress_state_dict=False"):
        dst.load_state_dict({"state": {0: st2}, "param_groups": theirs["param_groups"]})
