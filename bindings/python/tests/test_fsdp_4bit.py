"""FSDP2 and DCP with 4-bit states (state_bits=4, issue 42; test_fsdp.py has
the harness): W = 2 and W = 3 give one process's bits across split groups, odd
shard starts and per-row pad nibbles, and DCP saved at W = 2 loads at W = 3
and into one process."""

import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import flashopt  # noqa: E402
from test_fsdp import spawn, full_params  # noqa: E402


# ---- 4-bit states (issue 42) ------------------------------------------------------------------
class Odd(nn.Module):
    """A (37, 33) matrix (rank boundaries at W = 2 and 3 fall inside groups
    of 32 and at odd elements; 33 codes per row: a pad nibble per row of the
    DCP entries) and a 1-D parameter of odd length (its shards start at odd
    elements; at W = 3 its first group spans three ranks)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.w = nn.Parameter(torch.randn(37, 33).to(torch.bfloat16))
        self.b = nn.Parameter(torch.randn(45).to(torch.bfloat16))


FOUR_KW = dict(lr=1e-2, weight_decay=0.1, state_bits=4)


def _four_grads(model, step, mesh):
    from torch.distributed.tensor import distribute_tensor
    g = torch.Generator().manual_seed(500 + step)
    for p in model.parameters():
        full = (torch.randn(p.shape, generator=g) * 0.05).to(p.dtype)
        p.grad = full if mesh is None else distribute_tensor(full, mesh, p.placements)


def _four_opt(model):
    return flashopt.FlashAdamW([{"params": [model.w]},
                                {"params": [model.b], "weight_decay": 0.0}], **FOUR_KW)


def _four_bit_worker(rank, W, mesh, d):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (StateDictOptions,
                                                         get_optimizer_state_dict,
                                                         get_state_dict, set_state_dict)
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor
    res = {}
    model = fully_shard(Odd(), mesh=mesh)
    opt = _four_opt(model)
    assert opt.specs() == ["adamw_bf16_m24_4bit"]
    for s in range(3):
        _four_grads(model, s, mesh)
        opt.step()
    res["params3"] = full_params(model)
    res["views3"] = {n: {k: opt.state[p][k].full_tensor() for k in ("exp_avg", "exp_avg_sq")}
                     for n, p in model.named_parameters()}
    msd, osd = get_state_dict(model, opt)
    w, b = osd["state"]["w"], osd["state"]["b"]
    # Codes: packed along the last dim (33 -> 17 bytes a row), sharded by rows
    # like the parameter; the 1-D parameter's a code per byte, sharded like it.
    for k in ("exp_avg.codes", "exp_avg_sq.codes"):
        assert isinstance(w[k], DTensor) and w[k].shape == (37, 17) and w[k].dtype == torch.uint8
        assert w[k].placements == model.w.placements
        assert w[k].to_local().shape[0] == model.w.to_local().shape[0]
        assert b[k].shape == (45,) and b[k].to_local().shape == model.b.to_local().shape
    if W == 2:
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=f"{d}/ckpt4")
        full = get_optimizer_state_dict(
            model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if rank == 0:
            res["full"] = full
    for s in range(3, 6):
        _four_grads(model, s, mesh)
        opt.step()
    res["params6"] = full_params(model)
    if W == 3:
        # The W = 2 checkpoint, resharded to 3 ranks, goes on bit for bit.
        model2 = fully_shard(Odd(), mesh=mesh)
        opt2 = _four_opt(model2)
        m2, o2 = get_state_dict(model2, opt2)
        state = {"model": m2, "optim": o2}
        dcp.load(state, checkpoint_id=f"{d}/ckpt4")
        set_state_dict(model2, opt2, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
        res["loaded_views3"] = {
            n: {k: opt2.state[p][k].full_tensor() for k in ("exp_avg", "exp_avg_sq")}
            for n, p in model2.named_parameters()}
        for s in range(3, 6):
            _four_grads(model2, s, mesh)
            opt2.step()
        res["resumed6"] = full_params(model2)
    if rank == 0:
        torch.save(res, f"{d}/four-{W}.pt")


def test_four_bit_states_fsdp_and_dcp(tmp_path):
    """state_bits=4 under FSDP2: W = 2 and W = 3 give one process's bits
    (split groups, odd shard starts, pad nibbles); DCP saved at W = 2 loads
    at W = 3 and goes on bit for bit; DCP's full state loads into one
    process, whose views equal the gathered W = 2 ones."""
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict
    d = str(tmp_path)
    model = Odd()
    opt = _four_opt(model)
    for s in range(3):
        _four_grads(model, s, None)
        opt.step()
    ref3 = full_params(model)
    views3 = {n: {k: opt.state[p][k] for k in ("exp_avg", "exp_avg_sq")}
              for n, p in model.named_parameters()}
    for s in range(3, 6):
        _four_grads(model, s, None)
        opt.step()
    ref6 = full_params(model)
    spawn(2, _four_bit_worker, d)
    spawn(3, _four_bit_worker, d)
    for W in (2, 3):
        got = torch.load(f"{d}/four-{W}.pt", weights_only=False)
        assert all(torch.equal(a, b) for a, b in zip(got["params3"], ref3)), W
        assert all(torch.equal(a, b) for a, b in zip(got["params6"], ref6)), W
        for n, st in views3.items():
            for k, v in st.items():
                assert torch.equal(got["views3"][n][k], v), (W, n, k)
    got3 = torch.load(f"{d}/four-3.pt", weights_only=False)
    for n, st in views3.items():
        for k, v in st.items():
            assert torch.equal(got3["loaded_views3"][n][k], v), ("dcp 2 -> 3", n, k)
    assert all(torch.equal(a, b) for a, b in zip(got3["resumed6"], ref6))
    # DCP's full state (W = 2) into one process: the same entries as its own
    # state_dict(), and the run goes on bit for bit.
    full = torch.load(f"{d}/four-2.pt", weights_only=False)["full"]
    model = Odd()
    with torch.no_grad():
        for p, v in zip(model.parameters(), ref3):
            p.copy_(v)
    opt = _four_opt(model)
    set_optimizer_state_dict(model, opt, full)
    own = opt.state_dict()["state"]
    for i, n in enumerate(("w", "b")):
        for k, v in full["state"][n].items():
            if isinstance(v, torch.Tensor) and not k.endswith(".scales"):
                assert torch.equal(own[i][k], v), (n, k)
        assert own[0]["exp_avg.codes"].shape == (37, 17)
    for s in range(3, 6):
        _four_grads(model, s, None)
        opt.step()
    assert all(torch.equal(a, b) for a, b in zip(full_params(model), ref6))
