"""FSDP2 (torch.distributed.fsdp.fully_shard) and distributed checkpoints
(torch.distributed.checkpoint) on real processes: gloo on the CPU, 1, 2 and
3 ranks, a small transformer whose rows are not multiples of 32 elements and
whose smallest layers leave a rank with zero rows at W = 3.

- Given the same full gradients, a step is the same bits at W = 1, 2, 3 and
  in one process without FSDP (AdamW bf16 + 24-bit master, Lion bf16, SGD
  fp32 with momentum and L2 decay, Adam fp16 + 32-bit master; two param
  groups and an LR schedule).
- Trained by backward on per-rank batches, FSDP2 equals one process on the
  whole batch within the DDP tests' tolerances (test_distributed.py), with
  bf16 parameters and with MixedPrecisionPolicy(bf16, fp32) over fp32
  parameters.
- DCP: saved at W = 2, loaded at W = 1 and W = 3 (resharded), the run goes on
  bit for bit; the full state exported for one process loads into the
  non-FSDP optimizer and goes on bit for bit; a checkpoint of the other
  numerics is an error on every rank that changes nothing.
- Gradient clipping (torch's clip_grad_norm_ on DTensor gradients),
  GradScaler's found_inf on one rank only (every rank skips),
  check_numerics, fp32 master export/import, the memory report per rank.
- Gradient release (each reduce-scattered shard stepped and freed in backward)
  is bit-identical to stepping after backward, with a lower gradient peak.
- Errors on every rank and no hang: an unsupported placement (Shard(1)),
  options that differ across ranks, gradients on some ranks only, a bad
  gradient on one rank. Every collective has a 60 s timeout.
"""

import datetime
import os
import socket
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import flashopt  # noqa: E402
from helpers import cos_nmse  # noqa: E402

if not dist.is_available():  # pragma: no cover
    pytest.skip("torch.distributed is not available in this torch build", allow_module_level=True)

# The DDP tests' tolerances (test_distributed.py: fp32 quantized, bf16 quantized).
TOL = {torch.float32: (5e-4, 5e-4, 0.99999, 1e-5), torch.bfloat16: (1.5e-2, 2e-3, 0.9999, 1e-3)}
VOCAB, SEQ, BATCH = 37, 12, 3  # BATCH rows per rank


# ---- the model ---------------------------------------------------------------------------
class Block(nn.Module):
    def __init__(self, d, heads, ff):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ff1, self.ff2 = nn.Linear(d, ff), nn.Linear(ff, d)

    def forward(self, x):
        B, T, D = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(D, dim=-1)
        q, k, v = (t.reshape(B, T, self.heads, D // self.heads).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(B, T, D))
        return x + self.ff2(F.gelu(self.ff1(self.ln2(x))))


class TinyLM(nn.Module):
    """Rows of 20 and 44 elements; `gate` (2 rows: a bias on the first two
    logits) leaves rank 2 of 3 empty."""

    def __init__(self, d=20, heads=2, ff=44, layers=2):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d)
        self.blocks = nn.ModuleList(Block(d, heads, ff) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, VOCAB)
        self.gate = nn.Linear(d, 2)

    def forward(self, idx):
        x = self.emb(idx)
        for b in self.blocks:
            x = b(x)
        x = self.ln(x)
        return self.head(x) + F.pad(self.gate(x), (0, VOCAB - 2))


def make_model(dtype=torch.float32):
    torch.manual_seed(0)
    return TinyLM().to(dtype)


def shard(model, mesh, mp_policy=None):
    from torch.distributed.fsdp import fully_shard
    kw = {"mesh": mesh} if mp_policy is None else {"mesh": mesh, "mp_policy": mp_policy}
    for b in model.blocks:
        fully_shard(b, **kw)
    fully_shard(model, **kw)
    return model


def groups_of(model, lr):
    """Two param groups: matrices with weight decay, vectors without."""
    mats = [p for p in model.parameters() if p.ndim == 2]
    vecs = [p for p in model.parameters() if p.ndim != 2]
    return [{"params": mats}, {"params": vecs, "weight_decay": 0.0, "lr": lr / 2}]


# Optimizers of the bitwise tests: (class, dtype, options).
CONFIGS = {
    "adamw_bf16_m24": ("FlashAdamW", torch.bfloat16, dict(lr=1e-2, weight_decay=0.1)),
    "lion_bf16": ("FlashLion", torch.bfloat16, dict(lr=1e-3, weight_decay=0.1,
                                                     master_weight_bits=None)),
    "sgd_f32": ("FlashSGD", torch.float32, dict(lr=1e-2, momentum=0.9, weight_decay=0.01,
                                                 nesterov=True)),
    "adam_f16_m32": ("FlashAdam", torch.float16, dict(lr=1e-2, weight_decay=0.01,
                                                       master_weight_bits=32)),
}


# Optimizers of the training tests. Adam and Lion normalize each element's
# update, so an element whose gradient is near zero (the one-process batch
# and the ranks' reduce-scatter round it differently) can move by ±lr: the
# comparisons use fp32 gradients for them, and bf16 with SGD.
TRAIN = {
    "adamw_f32": ("FlashAdamW", torch.float32, dict(lr=1e-2, weight_decay=0.1)),
    "sgd_bf16_m24": ("FlashSGD", torch.bfloat16, dict(lr=0.1, momentum=0.9)),
    "lion_f32": ("FlashLion", torch.float32, dict(lr=1e-3, weight_decay=0.1)),
    "sgd_f32": ("FlashSGD", torch.float32, dict(lr=0.1, momentum=0.9, weight_decay=0.01)),
}


def make_opt(name, params_or_groups):
    cls, _, kw = CONFIGS[name] if name in CONFIGS else TRAIN[name]
    return getattr(flashopt, cls)(params_or_groups, **kw)


def full_grads(step, model):
    g = torch.Generator().manual_seed(1000 + step)
    return [(torch.randn(p.shape, generator=g) * 0.05).to(p.dtype) for p in model.parameters()]


def set_grads(model, step, mesh):
    from torch.distributed.tensor import distribute_tensor
    for p, g in zip(model.parameters(), full_grads(step, model)):
        p.grad = g if mesh is None else distribute_tensor(g, mesh, p.placements)


def full_params(model):
    return [(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for p in model.parameters()]


def batch(step, rank):
    g = torch.Generator().manual_seed(10 * step + rank)
    return torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)


def loss_of(model, tokens):
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.float().reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


# ---- processes ---------------------------------------------------------------------------
def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def _entry(rank, W, port, target, args):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    flashopt.set_cpu_threads(1)
    # A collective that waits longer fails (on every rank) instead of hanging.
    dist.init_process_group("gloo", rank=rank, world_size=W,
                            timeout=datetime.timedelta(seconds=60))
    try:
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh("cpu", (W,))
        target(rank, W, mesh, *args)
        # Leave together: gloo aborts a process whose peer tore the
        # connection down first.
        dist.barrier()
    finally:
        dist.destroy_process_group()


def spawn(W, target, *args):
    mp.spawn(_entry, args=(W, free_port(), target, args), nprocs=W, join=True)


# ---- world-size invariance -----------------------------------------------------------------
STEPS = 4


def _invariance_worker(rank, W, mesh, out):
    res = {}
    for name, (_, dtype, kw) in CONFIGS.items():
        model = shard(make_model(dtype), mesh)
        opt = make_opt(name, groups_of(model, kw["lr"]))
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
        for s in range(STEPS):
            set_grads(model, s, mesh)
            opt.step()
            sched.step()
        res[name] = full_params(model)
        res[name + ".mem"] = opt.memory_report()
    if rank == 0:
        torch.save(res, out)


def single_process(name, steps=range(STEPS), model=None, opt=None):
    _, dtype, kw = CONFIGS[name]
    if model is None:
        model = make_model(dtype)
        opt = make_opt(name, groups_of(model, kw["lr"]))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    for s in steps:
        set_grads(model, s, None)
        opt.step()
        sched.step()
    return full_params(model)


def test_same_bits_at_every_world_size(tmp_path):
    ref = {name: single_process(name) for name in CONFIGS}
    for W in (1, 2, 3):
        out = tmp_path / f"w{W}.pt"
        spawn(W, _invariance_worker, str(out))
        got = torch.load(out)
        for name in CONFIGS:
            same = [torch.equal(a, b) for a, b in zip(got[name], ref[name])]
            assert all(same), (W, name, same)
            assert not torch.equal(got[name][0], make_model(CONFIGS[name][1]).emb.weight)
        print(f"W={W}: rank 0 {got['adamw_bf16_m24.mem']['bytes_per_param']:.3f} B/param "
              "(AdamW bf16 + 24-bit master)")


# ---- FSDP2 training against one process on the whole batch --------------------------------
def _train_worker(rank, W, mesh, name, policy, out):
    from torch.distributed.fsdp import MixedPrecisionPolicy
    _, dtype, kw = TRAIN[name]
    mp_policy = None
    if policy:
        mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    model = shard(make_model(dtype), mesh, mp_policy)
    opt = make_opt(name, model.parameters())
    for s in range(STEPS):
        opt.zero_grad()
        loss_of(model, batch(s, rank)).backward()
        opt.step()
    res = full_params(model)
    if rank == 0:
        torch.save(res, out)


def _reference_training(name, W, policy):
    """One process on the whole batch (every rank's rows). With the mixed
    precision policy, as FSDP2 computes: each rank's rows through a bf16 copy
    of the parameters, their gradients averaged in fp32."""
    _, dtype, kw = TRAIN[name]
    model = make_model(dtype)
    opt = make_opt(name, model.parameters())
    for s in range(STEPS):
        opt.zero_grad()
        if policy:
            grads = None
            for r in range(W):
                low = make_model(torch.bfloat16)
                low.load_state_dict({k: v.to(torch.bfloat16)
                                     for k, v in model.state_dict().items()})
                loss_of(low, batch(s, r)).backward()
                gs = [q.grad.float() for q in low.parameters()]
                grads = gs if grads is None else [a + b for a, b in zip(grads, gs)]
            for p, g in zip(model.parameters(), grads):
                p.grad = g / W
        else:
            loss_of(model, torch.cat([batch(s, r) for r in range(W)])).backward()
        opt.step()
    return full_params(model)


@pytest.mark.parametrize("name,W,policy", [("adamw_f32", 2, False),
                                           ("sgd_bf16_m24", 2, False),
                                           ("lion_f32", 3, False),
                                           ("sgd_f32", 3, True)])
def test_fsdp_training_matches_one_process(tmp_path, name, W, policy):
    # W = 3 leaves rank 2 without rows of `gate`; policy: fp32 parameters
    # under MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32).
    out = tmp_path / "params.pt"
    spawn(W, _train_worker, name, policy, str(out))
    got = torch.cat([t.float().reshape(-1) for t in torch.load(out)])
    ref = torch.cat([t.float().reshape(-1) for t in _reference_training(name, W, policy)])
    dtype = torch.bfloat16 if (policy or TRAIN[name][1] == torch.bfloat16) else torch.float32
    rtol, atol, cmin, nmax = TOL[dtype]
    cos, nmse = cos_nmse(got, ref)
    diff = (got - ref).abs()
    print(f"{name} W={W} policy={policy}: max |diff| {float(diff.max()):.3g}, "
          f"cos {cos:.8f}, nmse {nmse:.3g}")
    if name.startswith("lion"):
        # Lion's update is sign(β1·m + (1 − β1)·g) · lr: where that argument
        # is near zero, the two gradients' roundings can flip it, a move of
        # 2·lr per step. Everything else is within the tolerance.
        lr = TRAIN[name][2]["lr"]
        out_of_tol = diff > atol + rtol * ref.abs()
        assert int(out_of_tol.sum()) <= got.numel() // 200, int(out_of_tol.sum())
        assert float(diff.max()) <= 2 * lr * STEPS * 1.01
    else:
        torch.testing.assert_close(got, ref, rtol=rtol, atol=atol)
    assert cos >= cmin and nmse <= nmax, (cos, nmse)
    init = torch.cat([t.float().reshape(-1) for t in make_model(TRAIN[name][1]).parameters()])
    assert not torch.equal(got, init)  # it trained


# ---- distributed checkpoints -----------------------------------------------------------------
def _dcp_worker(rank, W, mesh, mode, d):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (StateDictOptions,
                                                         get_optimizer_state_dict,
                                                         get_state_dict, set_state_dict)
    name = "adamw_bf16_m24"
    _, dtype, kw = CONFIGS[name]
    model = shard(make_model(dtype), mesh)
    opt = make_opt(name, groups_of(model, kw["lr"]))
    res = {}
    if mode == "save":
        for s in range(3):
            set_grads(model, s, mesh)
            opt.step()
        msd, osd = get_state_dict(model, opt)
        # The compressed states are DTensors of the parameter's global shape
        # (the scales: the table of one row per parameter row).
        st = osd["state"]["blocks.0.qkv.weight"]
        assert st["exp_avg.codes"].shape == (60, 20) and st["correction"].dtype == torch.int8
        assert st["exp_avg.scales"].shape == (60, 2) and st["flashopt.spec"] == "adamw_bf16_m24"
        assert osd["state"]["gate.bias"]["exp_avg_sq.codes"].shape == (2,)
        # opt.state[p]: the decoded states as DTensors placed like p, read-only.
        from torch.distributed.tensor import DTensor
        views = {}
        for n, p in model.named_parameters():
            st = opt.state[p]
            assert list(st) == ["step", "exp_avg", "exp_avg_sq", "flashopt.spec"]
            assert float(st["step"]) == 3
            v = st["exp_avg"]
            assert isinstance(v, DTensor) and v.placements == p.placements and v.shape == p.shape
            views[n] = {k: st[k].full_tensor() for k in ("exp_avg", "exp_avg_sq")}
        with pytest.raises(TypeError, match="DTensor"):
            opt.state[p]["exp_avg"] = v
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=f"{d}/ckpt")
        full = get_optimizer_state_dict(
            model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        params = full_params(model)  # a collective
        if rank == 0:
            torch.save({"optim": full, "model": params, "views": views}, f"{d}/full.pt")
        # The other numerics' checkpoint, for the error below.
        model2 = shard(make_model(dtype), mesh)
        opt2 = flashopt.FlashAdamW(groups_of(model2, kw["lr"]), numerics="flashoptim",
                                   **{k: v for k, v in kw.items()})
        set_grads(model2, 0, mesh)
        opt2.step()
        m2, o2 = get_state_dict(model2, opt2)
        dcp.save({"model": m2, "optim": o2}, checkpoint_id=f"{d}/flashoptim")
    else:
        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd}
        dcp.load(state, checkpoint_id=f"{d}/ckpt")
        set_state_dict(model, opt, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
        if mode == "load-and-refuse":
            # A checkpoint of the other numerics: an error on every rank that
            # changes nothing.
            before = get_state_dict(model, opt)[1]
            # (The optimizer's part only: a model state dict loads in place
            # into the parameters.)
            other = {"optim": get_state_dict(model, opt)[1]}
            dcp.load(other, checkpoint_id=f"{d}/flashoptim")
            with pytest.raises(ValueError, match="numerics='flashoptim'"):
                set_state_dict(model, opt, model_state_dict=state["model"],
                               optim_state_dict=other["optim"])
            after = get_state_dict(model, opt)[1]
            for k, v in before["state"].items():
                for kk, t in v.items():
                    if isinstance(t, torch.Tensor):
                        a, b = t, after["state"][k][kk]
                        a = a.to_local() if hasattr(a, "to_local") else a
                        b = b.to_local() if hasattr(b, "to_local") else b
                        assert torch.equal(a, b), (k, kk)
            # DCP's full state (saved at W = 2), distributed to these 3 ranks,
            # is the same state as the resharded checkpoint.
            from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict
            full = torch.load(f"{d}/full.pt", weights_only=False)["optim"]
            set_optimizer_state_dict(model, opt, full,
                                     options=StateDictOptions(full_state_dict=True))
            again = get_state_dict(model, opt)[1]
            for k, v in before["state"].items():
                for kk, t in v.items():
                    if isinstance(t, torch.Tensor):
                        a, b = t, again["state"][k][kk]
                        a = a.to_local() if hasattr(a, "to_local") else a
                        b = b.to_local() if hasattr(b, "to_local") else b
                        assert torch.equal(a, b), ("full", k, kk)
    for s in range(3, 6):
        set_grads(model, s, mesh)
        opt.step()
    res["params"] = full_params(model)
    if rank == 0:
        torch.save(res, f"{d}/{mode}-{W}.pt")


def test_dcp_round_trip_and_resharding(tmp_path):
    d = str(tmp_path)
    spawn(2, _dcp_worker, "save", d)
    ref = torch.load(f"{d}/save-2.pt")["params"]
    for W, mode in ((1, "load"), (3, "load-and-refuse")):
        spawn(W, _dcp_worker, mode, d)
        got = torch.load(f"{d}/{mode}-{W}.pt")["params"]
        same = [torch.equal(a, b) for a, b in zip(got, ref)]
        assert all(same), (W, same)
    # The full state, exported for one process: the non-FSDP optimizer goes on
    # bit for bit.
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict
    full = torch.load(f"{d}/full.pt", weights_only=False)
    name = "adamw_bf16_m24"
    _, dtype, kw = CONFIGS[name]
    model = make_model(dtype)
    with torch.no_grad():
        for p, v in zip(model.parameters(), full["model"]):
            p.copy_(v)
    opt = make_opt(name, groups_of(model, kw["lr"]))
    set_optimizer_state_dict(model, opt, full["optim"])
    # The W = 2 views, gathered, are one process's views of the same state.
    for n, p in model.named_parameters():
        for k, v in full["views"][n].items():
            assert torch.equal(opt.state[p][k], v), (n, k)
    for s in range(3, 6):
        set_grads(model, s, None)
        opt.step()
    same = [torch.equal(a, b) for a, b in zip(full_params(model), ref)]
    assert all(same), same


# ---- the rest of the optimizer, sharded ------------------------------------------------------
def _features_worker(rank, W, mesh, out):
    from torch.distributed.tensor import DTensor
    name = "adamw_bf16_m24"
    _, dtype, kw = CONFIGS[name]
    res = {}
    model = shard(make_model(dtype), mesh)
    opt = make_opt(name, model.parameters())
    for s in range(2):
        set_grads(model, s, mesh)
        # Clipping by the global norm: torch's, over the DTensor gradients.
        res[f"norm{s}"] = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5))
        opt.step()
    # GradScaler's found_inf on one rank only: every rank skips, no counter moves.
    before = full_params(model)
    set_grads(model, 2, mesh)
    opt.found_inf = torch.tensor(1.0 if rank == 1 else 0.0)
    opt.grad_scale = torch.tensor(1.0)
    opt.step()
    del opt.found_inf, opt.grad_scale
    assert all(torch.equal(a, b) for a, b in zip(full_params(model), before))
    assert all(lay.step == 2 for lay in opt._param_set.layouts)
    # fp32 master weights: export (a DTensor placed like the parameter), then
    # import a changed copy (collective).
    p = model.blocks[0].qkv.weight
    m = opt.export_master(p)
    assert isinstance(m, DTensor) and m.placements == p.placements and m.shape == p.shape
    res["master"] = m.full_tensor()
    opt.import_master(p, m + 1e-3)
    res["reimported"] = opt.export_master(p).full_tensor()
    set_grads(model, 2, mesh)
    opt.step()
    res["params"] = full_params(model)
    # The memory report is this rank's.
    res["memory"] = opt.memory_report()
    sd = opt.get_fp32_model_state_dict(model)
    assert isinstance(sd["head.weight"], DTensor) and sd["head.weight"].dtype == torch.float32
    # check_numerics: one rank's element its lr cannot move is an error on
    # every rank.
    opt.check_numerics()  # lr 1e-2 moves every weight
    if rank == 1:
        with torch.no_grad():
            model.head.weight.to_local()[0, 0] = 1e4
    with pytest.raises(flashopt.NumericsError, match="rank 1"):
        opt.check_numerics()
    mems = [None] * W
    dist.all_gather_object(mems, res["memory"])
    if rank == 0:
        res["memories"] = mems
        torch.save(res, out)


def test_clipping_scaler_master_numerics_memory(tmp_path):
    out = tmp_path / "res.pt"
    spawn(3, _features_worker, str(out))
    got = torch.load(out, weights_only=False)
    name = "adamw_bf16_m24"
    _, dtype, kw = CONFIGS[name]
    model = make_model(dtype)
    opt = make_opt(name, model.parameters())
    for s in range(2):
        set_grads(model, s, None)
        norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5))
        assert abs(norm - got[f"norm{s}"]) <= 1e-5 * norm
        opt.step()
    p = model.blocks[0].qkv.weight
    assert torch.equal(opt.export_master(p), got["master"])
    opt.import_master(p, got["master"] + 1e-3)
    assert torch.equal(opt.export_master(p), got["reimported"])
    set_grads(model, 2, None)
    opt.step()
    # Clipping's norm differs in the last bits (its sums run in another
    # order), so the parameters agree to within one bf16 step, not bitwise.
    for a, b in zip(got["params"], full_params(model)):
        torch.testing.assert_close(a.float(), b.float(), rtol=1e-2, atol=1e-3)
    mems = got["memories"]
    total = sum(x.numel() for x in model.parameters())
    assert sum(m["numel"] for m in mems) == total
    single = opt.memory_report()
    for r, m in enumerate(mems):
        print(f"W=3 rank {r}: {m['numel']} elements, {m['bytes_per_param']:.3f} B/param "
              f"(one process: {single['bytes_per_param']:.3f})")
        assert m["state_bytes"] > 0 and m["bytes_per_param"] < 2 * single["bytes_per_param"]


# ---- errors on every rank, never a hang -------------------------------------------------------
def _errors_worker(rank, W, mesh, out):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
    seen = []
    # A placement flashopt does not step (tensor parallelism's Shard(1)),
    # refused by name.
    tp = nn.Parameter(distribute_tensor(torch.zeros(4, 40), mesh, [Shard(1)]))
    with pytest.raises(TypeError, match=r"Shard\(dim=1\)"):
        flashopt.FlashAdamW([tp])
    seen.append("Shard(1)")
    # A 2-D mesh (HSDP, tensor + data parallelism).
    mesh2 = init_device_mesh("cpu", (1, W), mesh_dim_names=("replicate", "shard"))
    hp = nn.Parameter(distribute_tensor(torch.zeros(8, 40), mesh2, [Replicate(), Shard(0)]))
    with pytest.raises(TypeError, match="2-D device mesh"):
        flashopt.FlashAdamW([hp])
    seen.append("2-D mesh")
    # Options that differ across ranks.
    model = shard(make_model(torch.bfloat16), mesh)
    with pytest.raises(ValueError, match="differs across ranks.*rank 1"):
        flashopt.FlashAdamW(model.parameters(), lr=1e-3 * (1 + rank))
    with pytest.raises(ValueError, match="differs across ranks"):
        flashopt.FlashAdamW(model.parameters(), master_weight_bits=24 if rank else 32)
    seen.append("options")
    opt = flashopt.FlashAdamW(model.parameters(), lr=1e-3)
    before = full_params(model)
    # Gradients on some ranks only.
    set_grads(model, 0, mesh)
    if rank == 1:
        model.head.weight.grad = None
    # The library's Stepper agrees on every step (flashopt_step_external).
    with pytest.raises(RuntimeError, match="rank 1 differs from rank 0 in which "
                                           "parameters step.*MISMATCH"):
        opt.step()
    seen.append("gradients on some ranks")
    # A bad gradient on one rank: every rank reports it.
    set_grads(model, 0, mesh)
    if rank == 0:  # a gradient whose local shard is not contiguous
        g = model.head.weight.grad
        loc = g.to_local()
        odd = torch.empty(loc.shape[::-1], dtype=loc.dtype).t()
        odd.copy_(loc)
        model.head.weight.grad = DTensor.from_local(odd, mesh, g.placements, run_check=False,
                                                    shape=g.shape, stride=g.stride())
    with pytest.raises(RuntimeError, match="rank 0 of 2 cannot step: ValueError: .*contiguous"
                                           ".*nothing was stepped on any rank"):
        opt.step()
    seen.append("a bad gradient")
    # Hyper-parameters that drift apart (a scheduler run on one rank).
    set_grads(model, 0, mesh)
    if rank == 1:
        opt.param_groups[0]["lr"] = 5e-4
    with pytest.raises(RuntimeError, match="rank 1 differs from rank 0 in the "
                                           "hyper-parameters"):
        opt.step()
    seen.append("hyper-parameters")
    # Nothing was stepped; agreeing again, the ranks step.
    assert all(torch.equal(a, b) for a, b in zip(full_params(model), before))
    opt.param_groups[0]["lr"] = 1e-3
    set_grads(model, 0, mesh)
    opt.step()
    assert not torch.equal(full_params(model)[0], before[0])
    seen.append("recovered")
    got = [None] * W
    dist.all_gather_object(got, seen)
    if rank == 0:
        torch.save(got, out)


def test_errors_on_every_rank_without_a_hang(tmp_path):
    out = tmp_path / "seen.pt"
    spawn(2, _errors_worker, str(out))
    seen = torch.load(out)
    want = ["Shard(1)", "2-D mesh", "options", "gradients on some ranks", "a bad gradient",
            "hyper-parameters", "recovered"]
    assert seen == [want, want]


# ---- gradient release -----------------------------------------------------------------------
def _grad_storage_bytes(params):
    """Bytes of the storages that the (sharded) parameters' local gradients
    hold. (During backward, model.parameters() are FSDP's unsharded ones.)"""
    seen = {}
    for p in params:
        if p.grad is not None:
            st = p.grad.to_local().untyped_storage()
            seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


def _release_worker(rank, W, mesh, out):
    name = "adamw_bf16_m24"
    _, dtype, kw = CONFIGS[name]
    runs = {}
    for release in (False, True):
        model = shard(make_model(dtype), mesh)
        opt = make_opt(name, model.parameters())
        peak = [0]
        params = list(model.parameters())
        if release:
            # Measured before the release hook frees each gradient.
            for p in params:
                p.register_post_accumulate_grad_hook(
                    lambda p, params=params: peak.__setitem__(
                        0, max(peak[0], _grad_storage_bytes(params))))
            flashopt.enable_gradient_release(model, opt)
        for s in range(STEPS):
            loss_of(model, batch(s, rank)).backward()
            if release:
                assert all(p.grad is None for p in model.parameters())
            else:
                peak[0] = max(peak[0], _grad_storage_bytes(params))
                opt.step()
                opt.zero_grad()
        runs[release] = (full_params(model), peak[0])
    if rank == 0:
        torch.save(runs, out)


@pytest.mark.parametrize("W", [2, 3])
def test_gradient_release_is_bit_identical(tmp_path, W):
    out = tmp_path / "runs.pt"
    spawn(W, _release_worker, str(out))
    runs = torch.load(out)
    (after, peak_after), (released, peak_released) = runs[False], runs[True]
    assert all(torch.equal(a, b) for a, b in zip(after, released))
    print(f"W={W}: rank 0 gradient bytes at the peak: {peak_after} stepping after backward, "
          f"{peak_released} with gradient release")
    assert peak_released < peak_after


# ---- the example ---------------------------------------------------------------------------------
def test_example_resumes_bit_for_bit(tmp_path):
    import subprocess
    script = Path(__file__).resolve().parents[3] / "examples" / "python" / "fsdp_charlm.py"
    p = subprocess.run([sys.executable, str(script), "--steps", "8", "--layers", "1",
                        "--dim", "32", "--heads", "2", "--corpus-bytes", "200000",
                        "--no-progress", "--dir", str(tmp_path)],
                       capture_output=True, text=True, env=dict(os.environ), timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "resumed run matches the uninterrupted one bit for bit: True" in p.stdout
