#!/usr/bin/env python3
# ===- gpt_gpu_compare.py - A small GPT on the GPU: torch vs FlashAdamW -------===#
#
# Part of flashopt.
#
# ===--------------------------------------------------------------------------===#
"""End to end on one GPU: a small GPT (written here, no transformers needed)
trained for N steps on a learnable synthetic task, with
  - torch.optim.AdamW(fused=True) on fp32 parameters (bf16 autocast forward);
  - FlashAdamW, fp32 parameters and fp32 states (the same numerics as torch);
  - FlashAdamW exact: cast_model(bf16), 24-bit master weights, 8-bit states;
  - FlashAdamW fast: the same with arithmetic="fast" (fp32 norm layers on
    the exact bundle when no fast fp32 bundle is shipped).
Reports, per run, the median optimizer step and training step (CUDA events),
torch.cuda.max_memory_allocated, the optimizer memory libflashopt allocates
itself (outside torch's allocator, so not in the previous column), and the
mean loss of the last 10 steps. Prints a markdown table.

Exit status: 0, or 77 with "no CUDA in torch: <reason>" when torch has no
CUDA device. A benchmark, not a test (scripts/device-check.sh reports it).

Usage: python3 bench/gpt_gpu_compare.py [--steps 200] [--layers 6] [--width 512]
       (FLASHOPT_LIBRARY / FLASHOPT_KERNELS, or PYTHONPATH=bindings/python with build/)
"""

import argparse
import math
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "bindings", "python"))


def gpt(torch, vocab, width, layers, heads, seq):
    nn, F = torch.nn, torch.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
            self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
            self.fc, self.out = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
            q, k, v = (z.view(b, t, heads, c // heads).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
            return x + self.out(F.gelu(self.fc(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, width), nn.Embedding(seq, width)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln, self.head = nn.LayerNorm(width), nn.Linear(width, vocab, bias=False)

        def forward(self, idx):
            x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.ln(x))

    return GPT()


def batches(torch, vocab, seq, batch, n, device):
    """Sequences of a fixed random permutation walk (next = perm[cur]):
    learnable, the same for every run."""
    g = torch.Generator().manual_seed(7)
    perm = torch.randperm(vocab, generator=g)
    out = []
    for _ in range(n):
        x = torch.empty(batch, seq + 1, dtype=torch.long)
        x[:, 0] = torch.randint(0, vocab, (batch,), generator=g)
        for t in range(seq):
            x[:, t + 1] = perm[x[:, t]]
        out.append(x.to(device))
    return out


class CpuEvent:
    """torch.cuda.Event's timing, for --device cpu (a smoke run)."""

    def record(self):
        import time
        self.t = time.perf_counter()

    def elapsed_time(self, other):
        return (other.t - self.t) * 1e3


def run(torch, name, make_opt, bf16_model, args, data):
    import flashopt
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    torch.manual_seed(0)
    model = gpt(torch, args.vocab, args.width, args.layers, args.heads, args.seq)
    model.to(args.device)
    if bf16_model:
        flashopt.cast_model(model, torch.bfloat16)
    opts, note = make_opt(model)
    ev = (lambda: torch.cuda.Event(enable_timing=True)) if cuda else CpuEvent  # noqa: E731
    marks, losses = [], []
    for step, xy in enumerate(data):
        x, y = xy[:, :-1], xy[:, 1:]
        t0, t1, t2 = ev(), ev(), ev()
        t0.record()
        for o in opts:
            o.zero_grad(set_to_none=True)
        with torch.autocast(args.device, dtype=torch.bfloat16):
            logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        loss.backward()
        t1.record()
        for o in opts:
            o.step()
        t2.record()
        marks.append((t0, t1, t2))
        losses.append(loss.detach())
    if cuda:
        torch.cuda.synchronize()
    warm = marks[min(5, len(marks) - 1):]
    opt_ms = statistics.median(a.elapsed_time(c) - a.elapsed_time(b) for a, b, c in warm)
    step_ms = statistics.median(a.elapsed_time(c) for a, b, c in warm)
    lib_bytes = sum(o.memory_report()["allocated_bytes"] for o in opts
                    if isinstance(o, flashopt.FlashOptimizer))
    last = [float(v) for v in losses[-10:]]
    return dict(name=name, opt_ms=opt_ms, step_ms=step_ms,
                torch_mb=torch.cuda.max_memory_allocated() / 2 ** 20 if cuda else math.nan,
                lib_mb=lib_bytes / 2 ** 20, loss=sum(last) / len(last),
                first=float(losses[0]), note=note,
                params=sum(p.numel() for p in model.parameters()))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke run")
    args = ap.parse_args()
    try:
        import torch
        if args.device == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("torch.cuda.is_available() is False")
    except Exception as e:  # noqa: BLE001
        print(f"no CUDA in torch: {e}")
        return 77
    import flashopt

    data = batches(torch, args.vocab, args.seq, args.batch, args.steps, args.device)
    lr = args.lr

    def torch_fused(model):
        return [torch.optim.AdamW(model.parameters(), lr=lr, fused=args.device == "cuda")], ""

    def flash(**kw):
        def make(model):
            try:
                return [flashopt.FlashAdamW(model.parameters(), lr=lr, **kw)], ""
            except flashopt.MissingBundleError:  # no fast bundle for the fp32 norm layers
                lo = [p for p in model.parameters() if p.dtype == torch.float32]
                hi = [p for p in model.parameters() if p.dtype != torch.float32]
                return [flashopt.FlashAdamW(hi, lr=lr, **kw), flashopt.FlashAdamW(lo, lr=lr)], \
                    "fp32 norm layers on the exact bundle"
        return make

    runs = [
        ("torch AdamW fused, fp32", torch_fused, False),
        ("FlashAdamW fp32, fp32 states", flash(quantize=False), False),
        ("FlashAdamW exact, bf16 + 24-bit master", flash(), True),
        ("FlashAdamW fast, bf16 + 24-bit master", flash(arithmetic="fast"), True),
    ]
    results = [run(torch, name, make, bf16, args, data) for name, make, bf16 in runs]
    base = results[0]
    where = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    print(f"gpt_gpu_compare: {where}, torch {torch.__version__}, "
          f"flashopt {flashopt.version()}; GPT {args.layers}x{args.width}, "
          f"{results[0]['params'] / 1e6:.1f}M params, batch {args.batch}x{args.seq}, "
          f"{args.steps} steps, lr {lr}, bf16 autocast")
    print()
    print("| optimizer | opt step ms | train step ms | torch max_memory_allocated MiB "
          "| + libflashopt MiB | loss (last 10) | vs torch | note |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        rel = (r["loss"] - base["loss"]) / base["loss"]
        print(f"| {r['name']} | {r['opt_ms']:.2f} | {r['step_ms']:.2f} | {r['torch_mb']:.0f} "
              f"| {r['lib_mb']:.0f} | {r['loss']:.4f} (from {r['first']:.2f}) | {rel:+.2%} "
              f"| {r['note']} |")
    bad = [r["name"] for r in results if not math.isfinite(r["loss"]) or r["loss"] >= r["first"]]
    if bad:
        print(f"\ndid not learn: {', '.join(bad)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
