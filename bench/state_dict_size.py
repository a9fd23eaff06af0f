"""Bytes per parameter of what users save, flashopt beside torch AdamW on the
same model: torch.save(opt.state_dict()), the HF Trainer's optimizer.pt and
its whole checkpoint directory, and a DCP checkpoint of FSDP2 at 2 ranks.

    PYTHONPATH=bindings/python .venv/bin/python bench/state_dict_size.py

A GPT-2 (6 layers, 384 wide: 11.6 M parameters) trained 2 steps on random
tokens on the CPU. flashopt: FlashAdamW with bf16 weights (cast_model: norms
fp32; all bf16 under FSDP2) and 24-bit master weights; torch:
torch.optim.AdamW with fp32 weights
(the usual mixed-precision setup) and, for reference, with bf16 weights.
Prints a markdown table (docs/PYTHON.md "The optimizer state" has one).
"""

from __future__ import annotations

import datetime
import io
import os
import socket
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import torch  # noqa: E402

import flashopt  # noqa: E402

VOCAB, SEQ = 512, 64


def gpt2(dtype):
    import transformers
    cfg = transformers.GPT2Config(n_layer=6, n_head=6, n_embd=384, vocab_size=VOCAB,
                                  n_positions=SEQ, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    m = transformers.GPT2LMHeadModel(cfg)
    if dtype == torch.bfloat16:
        flashopt.cast_model(m, torch.bfloat16)
    return m


def make_opt(kind, model):
    if kind == "flashopt":
        return flashopt.FlashAdamW(model.parameters(), lr=1e-3)
    return torch.optim.AdamW(model.parameters(), lr=1e-3)


def dataset(n=16):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (n, SEQ), generator=g)
    return [{"input_ids": x, "labels": x} for x in ids]


def nbytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def trainer_sizes(kind, dtype, out: Path):
    import transformers
    model = gpt2(dtype)
    n = sum(p.numel() for p in model.parameters())
    opt = make_opt(kind, model)
    args = transformers.TrainingArguments(
        output_dir=str(out), max_steps=2, per_device_train_batch_size=8, save_strategy="steps",
        save_steps=2, report_to=[], use_cpu=True, disable_tqdm=True, dataloader_num_workers=0)
    transformers.Trainer(model=model, args=args, train_dataset=dataset(),
                         optimizers=(opt, None)).train()
    ckpt = out / "checkpoint-2"
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    return n, buf.tell(), (ckpt / "optimizer.pt").stat().st_size, nbytes(ckpt)


def _dcp_rank(rank, W, port, kind, d):
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=W,
                            timeout=datetime.timedelta(seconds=120))
    try:
        mesh = init_device_mesh("cpu", (W,))
        # FSDP2 wants one dtype per sharded module: no fp32 norms here.
        model = gpt2(torch.float32).to(torch.bfloat16 if kind == "flashopt" else torch.float32)
        for block in model.transformer.h:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        opt = make_opt(kind, model)
        for s in range(2):
            ids = torch.randint(0, VOCAB, (4, SEQ), generator=torch.Generator().manual_seed(s))
            opt.zero_grad()
            model(input_ids=ids, labels=ids).loss.float().backward()
            opt.step()
        msd, osd = get_state_dict(model, opt)
        dcp.save({"optim": osd}, checkpoint_id=f"{d}/{kind}-optim")
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=f"{d}/{kind}-all")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def dcp_sizes(kind, d: Path, W=2):
    import torch.multiprocessing as mp
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    mp.spawn(_dcp_rank, args=(W, port, kind, str(d)), nprocs=W, join=True)
    return nbytes(d / f"{kind}-optim"), nbytes(d / f"{kind}-all")


def main():
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for kind, dtype, label in (("flashopt", torch.bfloat16, "flashopt AdamW, bf16 + 24-bit"),
                                   ("torch", torch.float32, "torch AdamW, fp32 weights"),
                                   ("torch", torch.bfloat16, "torch AdamW, bf16 weights")):
            n, sd, opt_pt, ckpt = trainer_sizes(kind, dtype, tmp / f"{kind}-{dtype}")
            dcp_opt = dcp_all = None
            if dtype == torch.bfloat16 and kind == "flashopt" or dtype == torch.float32:
                dcp_opt, dcp_all = dcp_sizes(kind, tmp)
            rows.append((label, n, sd, opt_pt, ckpt, dcp_opt, dcp_all))
    print(f"{rows[0][1] / 1e6:.1f} M parameters; bytes per parameter\n")
    print("| optimizer | torch.save(state_dict()) | Trainer optimizer.pt | Trainer checkpoint "
          "dir | DCP at 2 ranks: optimizer | DCP: model + optimizer |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, n, sd, opt_pt, ckpt, dcp_opt, dcp_all in rows:
        f = (lambda b: "–" if b is None else f"{b / n:.2f}")
        print(f"| {label} | {f(sd)} | {f(opt_pt)} | {f(ckpt)} | {f(dcp_opt)} | {f(dcp_all)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
