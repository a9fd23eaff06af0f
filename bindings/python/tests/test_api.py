"""torch.optim behaviour: param groups, add_param_group, zero_grad, closure, LR
schedulers, one library call per step, and clear errors that change nothing."""

import pytest
import torch

import flashopt
from flashopt import _lib as L
from helpers import make_params, rel_inf, set_grads


def test_is_a_torch_optimizer_with_torch_defaults():
    p = [torch.zeros(8, requires_grad=True)]
    o = flashopt.FlashAdamW(p)
    assert isinstance(o, torch.optim.Optimizer)
    ref = torch.optim.AdamW([torch.zeros(8, requires_grad=True)])
    for k in ("lr", "betas", "eps", "weight_decay"):
        assert o.param_groups[0][k] == ref.param_groups[0][k], k
    ref = torch.optim.Adam([torch.zeros(8, requires_grad=True)])
    a = flashopt.FlashAdam(p)
    for k in ("lr", "betas", "eps", "weight_decay"):
        assert a.param_groups[0][k] == ref.param_groups[0][k], k
    ref = torch.optim.SGD([torch.zeros(8, requires_grad=True)])
    s = flashopt.FlashSGD(p)
    for k in ("lr", "momentum", "dampening", "weight_decay", "nesterov"):
        assert s.param_groups[0][k] == ref.param_groups[0][k], k
    assert flashopt.FlashLion(p).param_groups[0]["betas"] == (0.9, 0.99)


def test_param_groups_and_add_param_group_match_torch():
    mine, theirs = make_params(5), make_params(5)
    o = flashopt.FlashAdamW([{"params": mine[:2]}, {"params": mine[2:3], "lr": 1e-2,
                                                    "weight_decay": 0.0}],
                            lr=1e-3, quantize=False)
    r = torch.optim.AdamW([{"params": theirs[:2]}, {"params": theirs[2:3], "lr": 1e-2,
                                                     "weight_decay": 0.0}], lr=1e-3)
    for s in range(10):
        set_grads(mine[:3], s)
        set_grads(theirs[:3], s)
        o.step()
        r.step()
    o.add_param_group({"params": mine[3:], "betas": (0.5, 0.6)})
    r.add_param_group({"params": theirs[3:], "betas": (0.5, 0.6)})
    for s in range(10, 20):
        set_grads(mine, s)
        set_grads(theirs, s)
        o.step()
        r.step()
    for a, b in zip(mine, theirs):
        assert rel_inf(a, b) <= 1e-6


def test_params_without_grad_are_skipped_like_torch():
    mine, theirs = make_params(6), make_params(6)
    o = flashopt.FlashAdam(mine, quantize=False)
    r = torch.optim.Adam(theirs)
    for s in range(6):
        set_grads(mine, s)
        set_grads(theirs, s)
        if s % 2:  # the second parameter gets no gradient every other step
            mine[1].grad = None
            theirs[1].grad = None
        o.step()
        r.step()
    for a, b in zip(mine, theirs):
        assert rel_inf(a, b) <= 1e-6


def test_zero_grad_and_closure():
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 3)
    ref = torch.nn.Linear(8, 3)
    ref.load_state_dict(model.state_dict())
    x, y = torch.randn(16, 8), torch.randn(16, 3)
    o = flashopt.FlashSGD(model.parameters(), lr=0.1, momentum=0.9, quantize=False)
    r = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for set_to_none in (True, False, True):
        for m, opt in ((model, o), (ref, r)):
            def closure():
                opt.zero_grad(set_to_none=set_to_none)
                loss = torch.nn.functional.mse_loss(m(x), y)
                loss.backward()
                return loss
            loss = opt.step(closure)
            assert torch.is_tensor(loss)
    for a, b in zip(model.parameters(), ref.parameters()):
        assert rel_inf(a, b) <= 1e-6
    o.zero_grad(set_to_none=False)
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())
    o.zero_grad()
    assert all(p.grad is None for p in model.parameters())


def test_lr_scheduler_drives_set_hyper():
    mine, theirs = make_params(7), make_params(7)
    o = flashopt.FlashAdamW(mine, lr=1e-2, quantize=False)
    r = torch.optim.AdamW(theirs, lr=1e-2)
    so = torch.optim.lr_scheduler.OneCycleLR(o, max_lr=3e-2, total_steps=40)
    sr = torch.optim.lr_scheduler.OneCycleLR(r, max_lr=3e-2, total_steps=40)
    b = o._bundle_list()[0]
    for s in range(40):
        set_grads(mine, s)
        set_grads(theirs, s)
        o.step()
        r.step()
        got = L.ctypes.c_double()
        L.call("flashopt_get_hyper", b.handle, 0, b"lr", L.ctypes.byref(got))
        assert got.value == pytest.approx(o.param_groups[0]["lr"], rel=1e-6)
        so.step()
        sr.step()
    for a, c in zip(mine, theirs):
        assert rel_inf(a, c) <= 1e-6
    # A constant lr gives other weights.
    other = make_params(7)
    oc = flashopt.FlashAdamW(other, lr=1e-2, quantize=False)
    for s in range(40):
        set_grads(other, s)
        oc.step()
    assert any(rel_inf(a, c) > 1e-3 for a, c in zip(mine, other))


def test_one_library_step_call_per_step(monkeypatch):
    params = [torch.randn(5, requires_grad=True) for _ in range(50)]
    o = flashopt.FlashSGD(params, lr=0.1, momentum=0.9)
    calls = {}
    real = L.lib()

    class Counting:
        def __getattr__(self, name):
            fn = getattr(real, name)

            def wrapped(*a):
                calls[name] = calls.get(name, 0) + 1
                return fn(*a)
            return wrapped
    for b in o._bundle_list():
        monkeypatch.setattr(b, "_lib", Counting())
    for s in range(3):
        set_grads(params, s)
        o.step()
    assert calls.get("flashopt_step") == 3
    assert calls.get("flashopt_set_grads", 0) <= 3
    assert "flashopt_step_param" not in calls and "flashopt_set_grad" not in calls
    # Unchanged hyper-parameters are not passed again.
    assert calls.get("flashopt_set_hyper", 0) == 0


def snapshot(params):
    return [p.detach().clone() for p in params]


def test_unsupported_dtype_is_refused_and_changes_nothing():
    with pytest.raises(TypeError, match="torch.float64"):
        flashopt.FlashAdamW([torch.zeros(4, dtype=torch.float64, requires_grad=True)])
    ps = make_params(8)
    o = flashopt.FlashAdamW(ps)
    with pytest.raises(TypeError, match="torch.int32|float64"):
        o.add_param_group({"params": [torch.zeros(4, requires_grad=True),
                                      torch.zeros(4, dtype=torch.float64)]})
    assert len(o.param_groups) == 1
    assert sum(b.info.num_hypers > 0 and len(b.params) for b in o._bundle_list()) == len(ps)


def test_sparse_grad_is_refused_and_changes_nothing():
    ps = make_params(9)
    o = flashopt.FlashAdamW(ps)
    set_grads(ps, 0)
    o.step()
    before = snapshot(ps)
    set_grads(ps, 1)
    ps[2].grad = ps[2].grad.to_sparse()
    with pytest.raises(RuntimeError, match="sparse"):
        o.step()
    for a, b in zip(ps, before):
        assert torch.equal(a.detach(), b)
    assert all(b.get_step(i) == 1 for b in o._bundle_list() for i in range(len(b.params)))


def test_missing_bundle_is_a_clear_error(tmp_path, monkeypatch):
    # Every combination the constructors accept ships (test_every_combination_
    # has_a_bundle); a kernels directory without some (a custom build) is a
    # clear error naming what is missing, and a later group's changes nothing.
    # Bundles are found by what their manifests say, whatever their names.
    (tmp_path / "my_adamw").symlink_to(
        (flashopt._lib.kernels_dir() / "adamw_f32_f32states").resolve())
    monkeypatch.setenv("FLASHOPT_KERNELS", str(tmp_path))
    p = [torch.zeros(8, dtype=torch.bfloat16, requires_grad=True)]
    with pytest.raises(flashopt.MissingBundleError,
                       match="FlashAdam with torch.bfloat16 parameters, master_weight_bits=32, "
                             "state_bits=32.*rule 'adam'.*none of the 1 bundles"):
        flashopt.FlashAdam(p, master_weight_bits=32, quantize=False)
    with pytest.raises(flashopt.MissingBundleError,
                       match="FlashLion with torch.float16 parameters, master_weight_bits=None"):
        flashopt.FlashLion([torch.zeros(8, dtype=torch.float16)], master_weight_bits=None,
                           quantize=False)
    o = flashopt.FlashAdamW([torch.zeros(8, requires_grad=True)], quantize=False)
    assert o.specs() == ["my_adamw"]
    with pytest.raises(flashopt.MissingBundleError,
                       match="torch.float16 parameters.*Bundles of this rule: my_adamw"):
        o.add_param_group({"params": [torch.zeros(8, dtype=torch.float16)]})
    assert len(o.param_groups) == 1 and o.specs() == ["my_adamw"]


def test_every_combination_has_a_bundle():
    """The constructors' whole matrix (issue 35): rule x parameter dtype x
    master_weight_bits x quantize x arithmetic x numerics. Each accepted
    combination builds its optimizer and takes one finite step that moves the
    parameters; the rejected ones (FlashOptim numerics with the fast
    arithmetic) are a ValueError."""
    classes = {"sgd": flashopt.FlashSGD, "sgdw": flashopt.FlashSGDW, "adam": flashopt.FlashAdam,
               "adamw": flashopt.FlashAdamW, "lion": flashopt.FlashLion}
    seen = set()
    for rule, cls in classes.items():
        kw = {"momentum": 0.9} if rule.startswith("sgd") else {}
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            for mwb in (None, 24, 32):
                for quantize in (True, False):
                    for arithmetic in ("exact", "fast"):
                        for numerics in ("bounded", "flashoptim"):
                            mode = dict(master_weight_bits=mwb, quantize=quantize,
                                        arithmetic=arithmetic, numerics=numerics)
                            p = torch.full((40,), 0.5, dtype=dtype, requires_grad=True)
                            if numerics == "flashoptim" and arithmetic == "fast":
                                with pytest.raises(ValueError, match="fast"):
                                    cls([p], lr=1e-2, **kw, **mode)
                                continue
                            o = cls([p], lr=1e-2, **kw, **mode)
                            p.grad = torch.linspace(-1, 1, 40).to(dtype)
                            o.step()
                            assert bool(torch.isfinite(p).all()), (rule, dtype, mode)
                            assert not bool((p == 0.5).all()), (rule, dtype, mode)
                            seen.update(o.specs())
    # 4-bit states (issue 42): every rule with bf16 + 24-bit masters (exact
    # and fast arithmetic) and f32 (exact).
    for rule, cls in classes.items():
        kw = {"momentum": 0.9} if rule.startswith("sgd") else {}
        for dtype, mwb, mode, arith in ((torch.bfloat16, 24, "bf16_m24", "exact"),
                                        (torch.bfloat16, 24, "bf16_m24", "fast"),
                                        (torch.float32, None, "f32", "exact")):
            p = torch.full((40,), 0.5, dtype=dtype, requires_grad=True)
            o = cls([p], lr=1e-2, master_weight_bits=mwb, state_bits=4, arithmetic=arith, **kw)
            suffix = "_fast" if arith == "fast" else ""
            assert o.specs() == [f"{rule}_{mode}_4bit{suffix}"] and o.state_bits == 4 \
                and o.quantize
            p.grad = torch.linspace(-1, 1, 40).to(dtype)
            o.step()
            assert bool(torch.isfinite(p).all()) and not bool((p == 0.5).all()), (rule, dtype)
            seen.update(o.specs())
    shipped = {d.name for d in flashopt._lib.kernels_dir().iterdir()
               if (d / "manifest.json").is_file()}
    assert seen <= shipped
    # Every spec of the matrix (specs/generate.py) is reached by some mode.
    assert len(seen) == 204, sorted(shipped - seen)


def test_state_bits_option_and_quantize():
    """state_bits=4|8|32 (issue 42); quantize=True/False still mean 8/32;
    both given and disagreeing is a ValueError naming both; the bundle is
    chosen by the width its manifest says (flashopt_bundle_desc.state_bits)."""
    def mk(**kw):
        return flashopt.FlashAdamW([torch.zeros(64, dtype=torch.bfloat16, requires_grad=True)],
                                   **kw)
    for kw, spec, bits in (({}, "adamw_bf16_m24", 8),
                           ({"state_bits": 8}, "adamw_bf16_m24", 8),
                           ({"quantize": True}, "adamw_bf16_m24", 8),
                           ({"state_bits": 4}, "adamw_bf16_m24_4bit", 4),
                           ({"state_bits": 32}, "adamw_bf16_m24_f32states", 32),
                           ({"quantize": False}, "adamw_bf16_m24_f32states", 32),
                           ({"state_bits": 8, "quantize": True}, "adamw_bf16_m24", 8),
                           ({"state_bits": 32, "quantize": False}, "adamw_bf16_m24_f32states",
                            32)):
        o = mk(**kw)
        assert (o.specs(), o.state_bits, o.quantize) == ([spec], bits, bits != 32), kw
    for sb, q in ((4, True), (4, False), (8, False), (32, True)):
        with pytest.raises(ValueError, match=f"state_bits={sb} and quantize={q}"):
            mk(state_bits=sb, quantize=q)
    for bad in (16, 2, True, "4"):
        with pytest.raises(ValueError, match="state_bits must be 4, 8 or 32"):
            mk(state_bits=bad)
    # The selection reads the width from the library, not from the name.
    from flashopt import _specs
    idx = _specs.index()
    assert idx[_specs.Attrs("adamw", "bf16", 24, 4, "exact", "bounded")] == "adamw_bf16_m24_4bit"
    assert idx[_specs.Attrs("sgd", "f32", None, 4, "exact", "bounded")] == "sgd_f32_4bit"
    assert {a.state_bits for a in idx} == {4, 8, 32}
    # spec_name: the positional quantize as before, and state_bits.
    assert flashopt.spec_name("adamw", torch.bfloat16, 24, True) == "adamw_bf16_m24"
    assert flashopt.spec_name("adamw", torch.bfloat16, 24, False) == "adamw_bf16_m24_f32states"
    assert flashopt.spec_name("adamw", torch.bfloat16, 24) == "adamw_bf16_m24"
    assert flashopt.spec_name("lion", torch.float32, None, state_bits=4) == "lion_f32_4bit"
    assert flashopt.spec_name("adam", torch.bfloat16, 24, state_bits=32) == \
        "adam_bf16_m24_f32states"
    with pytest.raises(ValueError, match="state_bits=4 and quantize=True"):
        flashopt.spec_name("adamw", torch.bfloat16, 24, True, state_bits=4)
    # The option is documented with the others.
    assert "state_bits (4, 8 or 32)" in flashopt.FlashAdamW.__doc__


def test_four_bit_combinations_that_do_not_ship_are_missing_bundles():
    # 4-bit bundles ship for bf16 + 24-bit masters (exact and fast) and f32
    # (exact), bounded numerics; the rest is a MissingBundleError naming what
    # is missing and what ships, and changes nothing.
    for dtype, kw, what in (
            (torch.bfloat16, {"master_weight_bits": None}, "master_weight_bits=None"),
            (torch.bfloat16, {"master_weight_bits": 32}, "master_weight_bits=32"),
            (torch.float16, {}, "torch.float16 parameters, master_weight_bits=24"),
            (torch.float32, {"arithmetic": "fast", "master_weight_bits": None},
             "arithmetic='fast'"),
            (torch.bfloat16, {"numerics": "flashoptim"}, "numerics='flashoptim'")):
        p = torch.zeros(8, dtype=dtype, requires_grad=True)
        with pytest.raises(flashopt.MissingBundleError) as e:
            flashopt.FlashAdamW([p], state_bits=4, **kw)
        msg = str(e.value)
        assert what in msg and "state_bits=4" in msg, msg
        assert "4-bit states ship for bf16 parameters with master_weight_bits=24" in msg, msg
        assert "adamw_bf16_m24_4bit" in msg, msg  # the rule's bundles
    with pytest.raises(flashopt.MissingBundleError, match="state_bits=4"):
        flashopt.spec_name("sgd", torch.float16, 24, state_bits=4)
    # A group of another dtype is refused before anything changes.
    o = flashopt.FlashAdamW([torch.zeros(8, dtype=torch.bfloat16, requires_grad=True)],
                            state_bits=4)
    with pytest.raises(flashopt.MissingBundleError, match="torch.float16.*state_bits=4"):
        o.add_param_group({"params": [torch.zeros(8, dtype=torch.float16)]})
    assert len(o.param_groups) == 1 and o.specs() == ["adamw_bf16_m24_4bit"]


def test_bad_arguments():
    p = [torch.zeros(8, requires_grad=True)]
    with pytest.raises(ValueError):
        flashopt.FlashAdamW(p, lr=-1.0)
    with pytest.raises(ValueError):
        flashopt.FlashAdamW(p, betas=(1.5, 0.9))
    with pytest.raises(ValueError):
        flashopt.FlashAdamW(p, master_weight_bits=16)
    with pytest.raises(NotImplementedError):
        flashopt.FlashAdam(p, amsgrad=True)
    with pytest.raises(ValueError):
        flashopt.FlashSGD(p, nesterov=True)
    with pytest.raises(ValueError, match="contiguous"):
        flashopt.FlashSGD([torch.zeros(4, 6).t()])
    base = torch.zeros(64, requires_grad=True)
    with pytest.raises(ValueError):
        flashopt.FlashSGD([base, base[:16]])


def test_dtensor_placements():
    # DTensor parameters placed Shard(0) (FSDP2) or Replicate are stepped
    # (tests/test_fsdp.py); any other placement is refused by name.
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available():
        pytest.skip("torch.distributed is not available in this build")
    from torch.distributed.tensor import DTensor, Replicate, Shard, init_device_mesh
    import os
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        t = DTensor.from_local(torch.zeros(8, 4), mesh, [Shard(1)])
        with pytest.raises(TypeError, match=r"Shard\(dim=1\).*DTensor"):
            flashopt.FlashAdamW([torch.nn.Parameter(t)])
        p = torch.nn.Parameter(DTensor.from_local(torch.ones(8), mesh, [Replicate()]))
        opt = flashopt.FlashAdamW([p], lr=0.1)
        p.grad = DTensor.from_local(torch.ones(8), mesh, [Replicate()])
        opt.step()
        assert float(p.to_local().max()) < 1.0
        with pytest.raises(TypeError, match="not both"):
            opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(4))]})
        # The kind is chosen at the first parameter: plain tensors refuse
        # DTensors, alone or in one group; a refused group changes nothing.
        def replicated():
            return torch.nn.Parameter(DTensor.from_local(torch.ones(8), mesh, [Replicate()]))
        plain = flashopt.FlashAdamW([torch.nn.Parameter(torch.zeros(4))])
        for params in ([replicated()], [torch.nn.Parameter(torch.zeros(4)), replicated()]):
            with pytest.raises(TypeError, match="not both"):
                plain.add_param_group({"params": params})
        assert len(plain.param_groups) == 1 and plain.specs() == ["adamw_f32"]
        # An empty first group chooses nothing yet, nor does a refused one.
        empty = flashopt.FlashAdamW([{"params": []}], lr=0.1)
        with pytest.raises(TypeError, match=r"Shard\(dim=1\)"):
            empty.add_param_group({"params": [torch.nn.Parameter(t)]})
        empty.add_param_group({"params": [torch.nn.Parameter(torch.zeros(4))]})
        assert empty.specs() == ["adamw_f32"]
        late = flashopt.FlashAdamW([{"params": []}], lr=0.1)
        q = replicated()
        late.add_param_group({"params": [q]})
        q.grad = DTensor.from_local(torch.ones(8), mesh, [Replicate()])
        late.step()
        assert float(q.to_local().max()) < 1.0
    finally:
        dist.destroy_process_group()


def test_shared_and_duplicate_parameters_like_torch():
    a, b = torch.zeros(32, requires_grad=True), torch.zeros(32, requires_grad=True)
    o = flashopt.FlashSGD([a])
    with pytest.raises(ValueError, match="more than one parameter group"):
        o.add_param_group({"params": [a, b]})
    assert len(o.param_groups) == 1
    with pytest.warns(UserWarning, match="duplicate"):
        d = flashopt.FlashSGD([b, b], lr=0.5, quantize=False)
    b.grad = torch.ones(32)
    d.step()
    assert torch.equal(b.detach(), torch.full((32,), -0.5))  # stepped once
    many = [torch.zeros(16, requires_grad=True) for _ in range(3000)]
    assert len(flashopt.FlashSGD(many)._bundle_list()[0].params) == 3000


def test_ctypes_structs_are_as_large_as_the_library_writes():
    # A struct the C ABI fills that grew in flashopt.h but not in _lib.py
    # corrupted the Python heap (a crash at garbage collection, much later).
    # The library must write nothing past ctypes' idea of the struct.
    import ctypes
    p = torch.nn.Parameter(torch.zeros(64, dtype=torch.bfloat16))
    opt = flashopt.FlashAdamW([p])
    p.grad = torch.zeros_like(p)
    opt.step()
    b = opt._bundle_list()[0]
    for struct, fn in ((L.MemoryReport, "flashopt_memory_report_get"),
                       (L.NumericsReport, "flashopt_check_numerics")):
        n = ctypes.sizeof(struct)
        buf = (ctypes.c_uint8 * (n + 64))(*([0xA5] * (n + 64)))
        getattr(L.lib(), fn)(b.handle, ctypes.cast(buf, ctypes.POINTER(struct)))
        assert bytes(buf[n:]) == b"\xa5" * 64, f"{fn} writes past {struct.__name__}"
