#!/usr/bin/env python3
"""FSDP2 + FlashAdamW on charlm.py's character-level GPT, in CPU processes
(gloo), with a distributed checkpoint saved half-way and resumed.

The model (charlm.CharGPT: token + position embeddings, pre-norm blocks,
tied output head) is bf16, sharded with torch.distributed.fsdp.fully_shard
(each block, then the root) over `init_device_mesh("cpu", (W,))`; FlashAdamW
(24-bit master weights, 8-bit states) steps each rank's shard, with weight
decay on matrices only, warmup + cosine LR (a torch LR scheduler) and
gradient-norm clipping (torch's clip_grad_norm_ over the DTensor gradients).
Every step's global batch is the same whatever W: rank r takes its rows.

Phase 1: --world processes train --steps steps and save a DCP checkpoint
(model, optimizer, LR scheduler, step: torch.distributed.checkpoint, every
rank writing its shards) at --save-at (default half-way).
Phase 2: --resume-world processes (default --world) load it and train the
remaining steps. At the same world size the resumed run ends with the same
parameters as phase 1, bit for bit (the printed hashes). At another world
size DCP reshards the checkpoint (flashopt's states too: their groups are
the single-process ones), and the run goes on; the gradients are then
averaged over other ranks in another order, so the two runs agree closely,
not bitwise.

  python examples/python/fsdp_charlm.py [--world 2] [--steps 200] [--resume-world 3]
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import shutil
import socket
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bindings" / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch.nn import functional as F  # noqa: E402

import flashopt  # noqa: E402
from charlm import (CharGPT, Vocab, batch_starts, load_corpus, lr_lambda,  # noqa: E402
                    param_groups, windows)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def full_hash(model):
    """sha256 of every parameter's full tensor (a collective)."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.full_tensor().detach().float().numpy().tobytes())
    return h.hexdigest()[:16]


def worker(rank, world, port, a, phase):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    flashopt.set_cpu_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))
    try:
        run(rank, world, a, phase)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run(rank, world, a, phase):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    text, _ = load_corpus(a.corpus_bytes)
    vocab = Vocab(text[:int(len(text) * 0.9)])
    ids = vocab.encode(text[:int(len(text) * 0.9)])
    torch.manual_seed(a.seed)
    model = CharGPT(len(vocab), a.seq, a.dim, a.layers, a.heads).to(torch.bfloat16)
    model.compute_dtype = torch.float32  # bf16 parameters, fp32 arithmetic (fast on CPUs)
    mesh = init_device_mesh("cpu", (world,))
    for blk in model.blocks:
        fully_shard(blk, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = flashopt.FlashAdamW(param_groups(model, a.weight_decay), lr=a.lr, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(a.steps, max(1, a.steps // 20)))
    starts = batch_starts(len(ids), a.seq, a.steps, a.batch, torch.Generator().manual_seed(1))
    rows = a.batch // world
    ckpt = str(Path(a.dir) / "checkpoint")

    first = 0
    if phase == 2:
        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd, "sched": sched.state_dict(), "step": 0}
        dcp.load(state, checkpoint_id=ckpt)
        set_state_dict(model, opt, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
        sched.load_state_dict(state["sched"])
        first = int(state["step"])
    bar, it = None, range(first, a.steps)
    if rank == 0 and not a.no_progress:
        try:
            from tqdm import tqdm
            bar = tqdm(it, desc=f"phase {phase}, {world} ranks", unit="step", file=sys.stdout,
                       # a line every 30 s in a log, not one per step
                       mininterval=0.1 if sys.stdout.isatty() else 30,
                       dynamic_ncols=True)
            it = bar
        except ImportError:
            pass
    t0 = time.perf_counter()
    loss_avg = torch.zeros(())
    for s in it:
        x, y = windows(ids, starts[s][rank * rows:(rank + 1) * rows], a.seq)
        loss = F.cross_entropy(model(x).float().reshape(-1, len(vocab)), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        opt.step()
        sched.step()
        loss_avg = loss.detach().clone()
        dist.all_reduce(loss_avg)
        loss_avg /= world
        if bar is not None:
            bar.set_postfix(refresh=False, loss=f"{float(loss_avg):.3f}")
        if phase == 1 and s + 1 == a.save_at:
            msd, osd = get_state_dict(model, opt)
            dcp.save({"model": msd, "optim": osd, "sched": sched.state_dict(), "step": s + 1},
                     checkpoint_id=ckpt)
            if bar is not None:
                bar.write(f"step {s + 1}: saved a DCP checkpoint in {ckpt}")
    if bar is not None:
        bar.close()
    digest = full_hash(model)
    mems = [None] * world
    dist.all_gather_object(mems, opt.memory_report())
    if rank == 0:
        res = {"phase": phase, "world": world, "first_step": first, "steps": a.steps,
               "final_loss": float(loss_avg), "params_sha256": digest,
               "seconds": time.perf_counter() - t0,
               "bytes_per_param_per_rank": [m["bytes_per_param"] for m in mems],
               "numel_per_rank": [m["numel"] for m in mems]}
        with open(Path(a.dir) / f"phase{phase}.json", "w") as f:
            json.dump(res, f, indent=1)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=int, default=2, help="processes of phase 1")
    ap.add_argument("--resume-world", type=int, default=None,
                    help="processes of phase 2 (default: --world)")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--save-at", type=int, default=None, help="default: half-way")
    ap.add_argument("--batch", type=int, default=12, help="global batch (rows), split over ranks")
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--dim", type=int, default=96)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--corpus-bytes", type=int, default=1_000_000)
    ap.add_argument("--dir", default=str(ROOT / "build" / "demo" / "fsdp_charlm"))
    ap.add_argument("--no-progress", action="store_true")
    a = ap.parse_args(argv)
    a.resume_world = a.resume_world or a.world
    a.save_at = a.save_at or a.steps // 2
    for w in (a.world, a.resume_world):
        if a.batch % w:
            ap.error(f"--batch {a.batch} is not a multiple of the world size {w}")
    if not 0 < a.save_at < a.steps:
        ap.error("--save-at must be between 0 and --steps")
    shutil.rmtree(Path(a.dir) / "checkpoint", ignore_errors=True)
    Path(a.dir).mkdir(parents=True, exist_ok=True)
    for phase, world in ((1, a.world), (2, a.resume_world)):
        mp.spawn(worker, args=(world, free_port(), a, phase), nprocs=world, join=True)
    r1, r2 = (json.loads((Path(a.dir) / f"phase{k}.json").read_text()) for k in (1, 2))
    size = sum(f.stat().st_size for f in (Path(a.dir) / "checkpoint").iterdir())
    print(f"phase 1 ({r1['world']} ranks, steps 0-{a.steps}): final loss {r1['final_loss']:.4f}, "
          f"parameters {r1['params_sha256']}")
    print(f"phase 2 ({r2['world']} ranks, resumed at step {r2['first_step']}): final loss "
          f"{r2['final_loss']:.4f}, parameters {r2['params_sha256']}")
    print(f"DCP checkpoint: {size} bytes; optimizer-side bytes/param per rank: "
          + ", ".join(f"{b:.3f}" for b in r2["bytes_per_param_per_rank"]))
    if r1["world"] == r2["world"]:
        same = r1["params_sha256"] == r2["params_sha256"]
        print("resumed run matches the uninterrupted one bit for bit:", same)
        return 0 if same else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
