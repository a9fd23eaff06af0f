#!/usr/bin/env python3
"""Python overhead of flashopt's torch binding per optimizer.step().

For N parameter tensors of 64 elements (bf16, FlashAdamW default mode) the
kernel work is negligible, so step() time is the binding's overhead: reading
param_groups, checking gradients, flashopt_set_grads when gradient memory
moved, one flashopt_step. Reported next to the bare flashopt_step call (ctypes)
and torch.optim.AdamW (foreach, fp32) on the same tensors. Never run as a test.

  .venv/bin/python bench/python_overhead.py [--repeats 200]
"""

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bindings" / "python"))

import torch  # noqa: E402

import flashopt  # noqa: E402


def timeit(fn, repeats):
    for _ in range(10):
        fn()
    best = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(repeats):
            fn()
        best.append((time.perf_counter() - t0) / repeats)
    return min(best) * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=200)
    args = ap.parse_args()
    torch.set_num_threads(1)
    flashopt.set_cpu_threads(1)
    print("| tensors | step(), same grads (us) | step(), new grads each step (us) | "
          "bare flashopt_step (us) | overhead (us) | torch AdamW foreach fp32 (us) |")
    print("|---|---|---|---|---|---|")
    for n in (100, 1000):
        ps = [torch.randn(64, dtype=torch.bfloat16, requires_grad=True) for _ in range(n)]
        for p in ps:
            p.grad = torch.randn_like(p)
        opt = flashopt.FlashAdamW(ps, lr=1e-4)
        same = timeit(opt.step, args.repeats)
        pool = [[torch.randn_like(p) for p in ps] for _ in range(2)]
        k = [0]

        def fresh():
            k[0] ^= 1
            for p, g in zip(ps, pool[k[0]]):
                p.grad = g
            opt.step()

        def regrad():
            k[0] ^= 1
            for p, g in zip(ps, pool[k[0]]):
                p.grad = g
        new = timeit(fresh, args.repeats) - timeit(regrad, args.repeats)
        (b,) = opt._bundle_list()
        lib = b._lib
        bare = timeit(lambda: lib.flashopt_step(b.handle), args.repeats)
        tp = [torch.randn(64, requires_grad=True) for _ in range(n)]
        for p in tp:
            p.grad = torch.randn_like(p)
        topt = torch.optim.AdamW(tp, lr=1e-4, foreach=True)
        tt = timeit(topt.step, args.repeats)
        print(f"| {n} | {same:.1f} | {new:.1f} | {bare:.1f} | {same - bare:.1f} / "
              f"{new - bare:.1f} | {tt:.1f} |")


if __name__ == "__main__":
    main()
