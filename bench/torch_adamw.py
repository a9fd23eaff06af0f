#!/usr/bin/env python3
# ===- torch_adamw.py - PyTorch fused AdamW baseline --------------------------===#
#
# Part of flashopt.
#
# ===--------------------------------------------------------------------------===#
"""The baseline for flashopt-gpu-bench: torch.optim.AdamW(fused=True) on fp32
parameters on CUDA, for one tensor of 1e6, 1e8 and 1e9 parameters (a size
that does not fit in free device memory is skipped) and for 300 tensors of
65536, timed with CUDA events over warm-up + N steps. GB/s counts 28 bytes
per parameter (param, exp_avg, exp_avg_sq read and written, grad read), next
to a device-to-device copy moving as many bytes. Prints the same markdown
table as flashopt-gpu-bench.

Exit status: 0, or 77 with "no CUDA in torch: <reason>" when torch is missing
or has no CUDA device. A benchmark, not a test.

Usage: python3 bench/torch_adamw.py [--sizes 1e6,1e8,1e9] [--iters N]
"""

import argparse
import sys

BYTES_PER_PARAM = 28.0  # fp32 AdamW: p, m, v read + written (24), g read (4)


def size_name(n):
    m, e = n, 0
    while m >= 10 and m % 10 == 0:
        m //= 10
        e += 1
    return f"{m}e{e}" if e >= 3 else str(n)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1e6,1e8,1e9")
    ap.add_argument("--iters", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()
    sizes = [int(float(s)) for s in args.sizes.split(",") if s]

    try:
        import torch
    except Exception as e:  # noqa: BLE001 - any import failure means "skip"
        print(f"no CUDA in torch: cannot import torch: {e}")
        return 77
    if not torch.cuda.is_available():
        print(f"no CUDA in torch: torch {torch.__version__} sees no CUDA device")
        return 77

    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    print(f"torch_adamw: torch {torch.__version__} (CUDA {torch.version.cuda}) on "
          f"{props.name} (sm_{props.major}{props.minor}, "
          f"{props.multi_processor_count} SMs, {props.total_memory / 2**30:.0f} GiB): "
          f"AdamW(fused=True), fp32; {BYTES_PER_PARAM:g} bytes moved per param\n")
    print("| case | params | tensors | launches/step | ms/step | GB/s | copy GB/s | "
          "% of copy | note |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    sys.stdout.flush()

    def timed(fn, warmup, iters):
        for _ in range(warmup):
            fn()
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        stop.record()
        stop.synchronize()
        return start.elapsed_time(stop) / iters

    def copy_gbs(nbytes, iters):
        half = max(16, int(nbytes // 2))
        src = torch.ones(half, dtype=torch.uint8, device=dev)
        dst = torch.empty_like(src)
        ms = timed(lambda: dst.copy_(src), args.warmup, iters)
        del src, dst
        return 2.0 * half / (ms * 1e-3) / 1e9

    def row(name, params, tensors, launches, ms, gbs, cgbs, note):
        if ms is None:
            print(f"| {name} | {params} | {tensors} | {launches} | - | - | - | - | {note} |")
        else:
            print(f"| {name} | {params} | {tensors} | {launches} | {ms:.4f} | {gbs:.1f} | "
                  f"{cgbs:.0f} | {100 * gbs / cgbs:.0f}% | {note} |")
        sys.stdout.flush()

    def run_case(name, shapes, launches_note):
        n = sum(shapes)
        iters = args.iters or (200 if n <= 10**7 else 50 if n <= 2 * 10**8 else 20)
        # params, grads, 2 states (16 B) + the copy's two halves (28 B).
        need = n * (16 + BYTES_PER_PARAM) * 1.05 + (256 << 20)
        free, _ = torch.cuda.mem_get_info()
        tensors = str(len(shapes))
        pname = size_name(n) if len(shapes) == 1 else f"{len(shapes)}x{shapes[0]}"
        if need > free:
            row(name, pname, tensors, launches_note, None, 0, 0,
                f"skipped: needs {need / 2**30:.0f} GiB, {free / 2**30:.0f} GiB free")
            return
        try:
            params = [torch.nn.Parameter(torch.randn(s, device=dev)) for s in shapes]
            for p in params:
                p.grad = torch.randn_like(p) * 1e-2
            try:
                opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=1e-2, fused=True)
            except (TypeError, RuntimeError) as e:  # torch < 2.0: no fused AdamW
                row(name, pname, tensors, launches_note, None, 0, 0,
                    f"skipped: AdamW(fused=True) unavailable: {str(e)[:60]}")
                return
            ms = timed(opt.step, args.warmup, iters)
            del opt, params
            torch.cuda.empty_cache()
            gbs = BYTES_PER_PARAM * n / (ms * 1e-3) / 1e9
            cgbs = copy_gbs(BYTES_PER_PARAM * n, iters)
            row(name, pname, tensors, launches_note, ms, gbs, cgbs, f"{iters} steps")
        except RuntimeError as e:  # torch.cuda.OutOfMemoryError is one
            if "out of memory" not in str(e):
                raise
            torch.cuda.empty_cache()
            row(name, pname, tensors, launches_note, None, 0, 0,
                f"skipped: out of memory ({str(e).splitlines()[0][:60]})")

    for n in sizes:
        run_case("torch AdamW fused fp32", [n], "1")
    run_case("torch AdamW fused fp32 (300 tensors)", [65536] * 300, "few (chunked)")
    print(f"\nGB/s counts {BYTES_PER_PARAM:g} bytes per param; copy GB/s counts read + "
          "write of a device copy of half as many bytes.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
