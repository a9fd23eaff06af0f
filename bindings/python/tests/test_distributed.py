"""Under torch.distributed (gloo, 2 CPU processes via torch.multiprocessing):
FlashAdamW inside DistributedDataParallel (with no_sync() accumulation) and as
ZeroRedundancyOptimizer's optimizer_class. Replicas are bit-identical after
every step, and the result equals one process on the concatenated batch within
numerics.md §8's DDP tolerances (test_ddp.py: fp32 quantized rtol 5e-4, atol
5e-4, cos >= 0.99999, NMSE <= 1e-5; bf16 quantized rtol 1.5e-2, atol 2e-3,
cos >= 0.9999, NMSE <= 1e-3)."""

import os
import socket
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import flashopt  # noqa: E402
from helpers import cos_nmse  # noqa: E402

if not dist.is_available():  # pragma: no cover
    pytest.skip("torch.distributed is not available in this torch build", allow_module_level=True)

STEPS, ACCUM, WORLD = 4, 2, 2
TOL = {torch.float32: (5e-4, 5e-4, 0.99999, 1e-5), torch.bfloat16: (1.5e-2, 2e-3, 0.9999, 1e-3)}


def model_for(dtype):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.Tanh(), torch.nn.Linear(32, 5))
    return m.to(dtype)


def data(step, micro, rank):
    """Rank `rank`'s micro-batch (4 rows) of a step; ranks together = the whole batch."""
    g = torch.Generator().manual_seed(100 * step + 10 * micro + rank)
    return torch.randn(4, 12, generator=g), torch.randn(4, 5, generator=g)


def loss_of(model, x, y, dtype):
    return torch.nn.functional.mse_loss(model(x.to(dtype)).float(), y)


def flat(model):
    return torch.cat([p.detach().float().reshape(-1) for p in model.parameters()])


def worker(rank, port, mode, dtype_name, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    flashopt.set_cpu_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        dtype = getattr(torch, dtype_name)
        model = model_for(dtype)
        identical = []
        if mode == "ddp":
            net = torch.nn.parallel.DistributedDataParallel(model)
            opt = flashopt.FlashAdamW(net.parameters(), lr=1e-2, weight_decay=0.01)
            with pytest.raises(TypeError, match="DistributedDataParallel"):
                flashopt.enable_gradient_release(net, opt)
        else:
            from torch.distributed.optim import ZeroRedundancyOptimizer
            net = model
            opt = ZeroRedundancyOptimizer(net.parameters(), optimizer_class=flashopt.FlashAdamW,
                                          lr=1e-2, weight_decay=0.01)
        for s in range(STEPS):
            opt.zero_grad()
            for mi in range(ACCUM):
                x, y = data(s, mi, rank)
                if mode == "ddp" and mi < ACCUM - 1:
                    with net.no_sync():
                        loss_of(net, x, y, dtype).backward()
                else:
                    loss_of(net, x, y, dtype).backward()
            if mode == "zero":  # no DDP: average the gradients by hand
                for p in net.parameters():
                    dist.all_reduce(p.grad)
                    p.grad /= WORLD
            opt.step()
            v = flat(model)
            vs = [torch.empty_like(v) for _ in range(WORLD)]
            dist.all_gather(vs, v)
            identical.append(all(torch.equal(vs[0], w) for w in vs))
        if rank == 0:
            torch.save({"params": flat(model), "identical": identical}, out)
        # Both ranks leave together: gloo aborts a process whose peer tore the
        # connection down first ("terminate called without an active exception").
        dist.barrier()
    finally:
        dist.destroy_process_group()


def single_process(dtype):
    model = model_for(dtype)
    opt = flashopt.FlashAdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    for s in range(STEPS):
        opt.zero_grad()
        for mi in range(ACCUM):
            for r in range(WORLD):
                x, y = data(s, mi, r)
                (loss_of(model, x, y, dtype) / WORLD).backward()
        opt.step()
    return flat(model)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


@pytest.mark.parametrize("mode", ["ddp", "zero"])
@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
def test_two_processes(tmp_path, mode, dtype_name):
    out = str(tmp_path / "rank0.pt")
    mp.spawn(worker, args=(free_port(), mode, dtype_name, out), nprocs=WORLD, join=True)
    res = torch.load(out)
    assert res["identical"] == [True] * STEPS
    dtype = getattr(torch, dtype_name)
    ref = single_process(dtype)
    got = res["params"]
    rtol, atol, cmin, nmax = TOL[dtype]
    torch.testing.assert_close(got, ref, rtol=rtol, atol=atol)
    cos, nmse = cos_nmse(got, ref)
    assert cos >= cmin and nmse <= nmax, (cos, nmse)
    print(f"{mode} {dtype_name}: max |diff| {float((got - ref).abs().max()):.3g}, cos {cos:.8f}, nmse {nmse:.3g}")
    assert not torch.equal(got, flat(model_for(dtype)))  # it trained
