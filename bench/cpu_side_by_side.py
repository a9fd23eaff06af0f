#!/usr/bin/env python3
# ===- cpu_side_by_side.py - flashopt vs torch's CPU optimizers ---------------===#
#
# Part of flashopt.
#
# ===--------------------------------------------------------------------------===#
"""flashopt's CPU step next to torch's CPU optimizers, in one process.

For each size (one tensor of 1e7 and of 1e8 parameters, and 1000 tensors of
4096) and each thread count (1 and all cores), steps every case in turn
(interleaved, R rounds, the median kept), next to a memcpy of the same bytes
that the case moves per step, timed in the same round:

  flashopt  FlashAdamW bf16 + 24-bit master + 8-bit states, exact and fast
            (docs/NUMERICS.md §7), FlashSGD (momentum) and FlashLion, bf16 + 24
  torch     AdamW(fused=True) fp32 and bf16 (params, grads, states bf16),
            AdamW(foreach=True) fp32, SGD(momentum, fused=True) fp32
  optional  DeepSpeedCPUAdam fp32 and bf16 (bf16 states), when the deepspeed package is importable

Prints one markdown table per size and thread count: ms/step, Mparams/s,
bytes moved per parameter, % of the memcpy of those bytes, and the ratio to
torch's fused fp32 AdamW (per round, then the median). With --cold, every
step and every copy runs right after a buffer twice the last-level cache is
written and read (the state of an optimizer step after a backward pass)
instead of a few cases after the previous step. A benchmark, not a test: it
asserts nothing. About 2-4 minutes on 2 cores (--cold: about twice that).

Usage: .venv/bin/python bench/cpu_side_by_side.py [--sizes 1e7,1e8,1000x4096]
       [--threads 1,0] [--rounds 5] [--cold] [--omp-active]
       (threads 0 = all cores)
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

# torch's OpenMP workers spin after each parallel region by default and take
# the cores from libflashopt's thread pool for the next step (measured on 2
# cores, 1e7 parameters: flashopt's AdamW step 22 ms instead of 14). Passive
# waiting leaves torch's own figures unchanged; --omp-active shows the other.
if "--omp-active" not in sys.argv:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bindings" / "python"))
import flashopt  # noqa: E402


def parse_size(s):
    if "x" in s:
        n, m = s.split("x")
        return int(float(n)), int(float(m))
    return 1, int(float(s))


def tensors(count, numel, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    ps = []
    for _ in range(count):
        p = (torch.randn(numel, generator=g) * 0.02).to(dtype)
        p.grad = (torch.randn(numel, generator=g) * 1e-3).to(dtype)
        ps.append(p)
    return ps


class Case:
    """One optimizer over its own parameters; `bytes` moved per parameter."""

    def __init__(self, name, make, dtype, bpp):
        self.name, self.make, self.dtype, self.bytes = name, make, dtype, bpp
        self.opt = None

    def setup(self, count, numel):
        self.params = tensors(count, numel, self.dtype)
        self.opt = self.make(self.params)
        for _ in range(2):  # warm-up: states allocated, pages touched
            self.opt.step()

    def step(self):
        t = time.perf_counter()
        self.opt.step()
        return time.perf_counter() - t

    def free(self):
        self.opt = None
        self.params = None


def cases():
    out = [
        Case("flashopt AdamW bf16+24, 8-bit, exact",
             lambda ps: flashopt.FlashAdamW(ps, lr=1e-3), torch.bfloat16, 12.25),
        Case("flashopt AdamW bf16+24, 8-bit, fast",
             lambda ps: flashopt.FlashAdamW(ps, lr=1e-3, arithmetic="fast"),
             torch.bfloat16, 12.25),
        Case("torch AdamW fused fp32",
             lambda ps: torch.optim.AdamW(ps, lr=1e-3, fused=True), torch.float32, 28.0),
        Case("torch AdamW fused bf16",
             lambda ps: torch.optim.AdamW(ps, lr=1e-3, fused=True), torch.bfloat16, 14.0),
        Case("torch AdamW foreach fp32",
             lambda ps: torch.optim.AdamW(ps, lr=1e-3, foreach=True), torch.float32, 28.0),
        Case("flashopt SGD momentum bf16+24, 8-bit",
             lambda ps: flashopt.FlashSGD(ps, lr=1e-2, momentum=0.9), torch.bfloat16, 10.125),
        Case("torch SGD momentum fused fp32",
             lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9, fused=True),
             torch.float32, 20.0),
        Case("flashopt Lion bf16+24, 8-bit",
             lambda ps: flashopt.FlashLion(ps, lr=1e-4), torch.bfloat16, 10.125),
    ]
    if DEEPSPEED is not None:
        out.append(Case("DeepSpeedCPUAdam fp32",
                        lambda ps: DEEPSPEED(ps, lr=1e-3), torch.float32, 28.0))
        # 16-bit parameters, gradients and states (the ambition).
        out.append(Case("DeepSpeedCPUAdam bf16, bf16 states",
                        lambda ps: DEEPSPEED(ps, lr=1e-3, fp32_optimizer_states=False),
                        torch.bfloat16, 14.0))
    return out


def find_deepspeed():
    """DeepSpeedCPUAdam, or None (it is an optional peer)."""
    try:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        from deepspeed.ops.adam import DeepSpeedCPUAdam  # noqa: PLC0415
        return DeepSpeedCPUAdam
    except Exception as e:  # noqa: BLE001
        print(f"(DeepSpeedCPUAdam not measured: {type(e).__name__}: {e})")
        return None


DEEPSPEED = None


def memcpy_seconds(nbytes, buf):
    """One copy moving `nbytes` (half read, half written)."""
    half = int(nbytes // 2)
    src, dst = buf[0][:half], buf[1][:half]
    t = time.perf_counter()
    dst.copy_(src)
    return time.perf_counter() - t


class Evictor:
    """A buffer twice the last-level cache (64 MiB to 2 GiB): written, then
    read once per 64-byte line, so that no step finds its data in a cache."""

    def __init__(self):
        self.nbytes = min(max(2 * last_level_cache(), 64 << 20), 2 << 30)
        self.buf = torch.zeros(self.nbytes // 8, dtype=torch.int64)
        self.passes = 0

    def __call__(self):
        self.passes += 1
        self.buf.fill_(self.passes)
        self.sink = int(self.buf[::8].max())


def run(size, threads, rounds, evict=None):
    count, numel = size
    n = count * numel
    torch.set_num_threads(threads)
    flashopt.set_cpu_threads(threads)
    cs = cases()
    for c in cs:
        c.setup(count, numel)
    maxbytes = max(c.bytes for c in cs) * n
    buf = (torch.empty(int(maxbytes // 2) + 64, dtype=torch.uint8).fill_(1),
           torch.empty(int(maxbytes // 2) + 64, dtype=torch.uint8).fill_(2))
    times = {c.name: [] for c in cs}
    copies = {c.name: [] for c in cs}
    for _ in range(rounds):
        for c in cs:
            if evict:
                evict()
            copies[c.name].append(memcpy_seconds(c.bytes * n, buf))
            if evict:
                evict()
            times[c.name].append(c.step())
    for c in cs:
        c.free()
    label = f"{count} x {numel}" if count > 1 else f"{numel:.0e}".replace("+0", "")
    print(f"\n### {label} parameters, {threads} thread{'s' if threads > 1 else ''}"
          f"{', cold' if evict else ''}\n")
    print("| case | ms/step | Mparams/s | B/param | % of memcpy | vs torch fused fp32 AdamW |")
    print("|---|---:|---:|---:|---:|---:|")
    # The ratio is taken round by round (both steps a few hundred ms apart,
    # under the same load on the host), then the median: a host whose speed
    # drifts during the run moves it less than a ratio of the two medians.
    ref = times["torch AdamW fused fp32"]
    for c in cs:
        t = statistics.median(times[c.name])
        cp = statistics.median(copies[c.name])
        ratio = statistics.median(r / x for r, x in zip(ref, times[c.name]))
        print(f"| {c.name} | {t * 1e3:.2f} | {n / t / 1e6:.0f} | {c.bytes:g} | "
              f"{100 * cp / t:.0f}% | {ratio:.2f}x |")
    sys.stdout.flush()


def host_cpu():
    """The CPU model and last-level cache, for reading numbers across hosts."""
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    llc = last_level_cache()
    return model + (f", last-level cache {llc / 2**20:.0f} MiB" if llc > 0 else "")


def last_level_cache():
    """Bytes of the highest cache level sysfs lists for cpu0 (0: unknown)."""
    llc, level = 0, 0
    for d in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            lv = int((d / "level").read_text())
            size = (d / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        mult = {"K": 2**10, "M": 2**20, "G": 2**30}.get(size[-1:], 1)
        digits = size.rstrip("KMG")
        if lv > level and digits.isdigit():
            llc, level = int(digits) * mult, lv
    return llc


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1e7,1e8,1000x4096")
    ap.add_argument("--threads", default="1,0")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cold", action="store_true",
                    help="stream twice the last-level cache through it before every "
                         "step and copy")
    ap.add_argument("--omp-active", action="store_true",
                    help="leave OMP_WAIT_POLICY unset (torch's workers spin between steps)")
    a = ap.parse_args()
    global DEEPSPEED
    DEEPSPEED = find_deepspeed()
    cores = os.cpu_count() or 1
    print(f"cpu_side_by_side: flashopt {flashopt.version()}, torch {torch.__version__}, "
          f"{cores} cores ({host_cpu()}), {a.rounds} rounds (median), "
          f"memcpy of the same bytes per round, "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}")
    evict = Evictor() if a.cold else None
    if evict:
        print(f"cold: every step and copy after writing and reading "
              f"{evict.nbytes / 2**20:.0f} MiB")
    for s in a.sizes.split(","):
        for t in a.threads.split(","):
            run(parse_size(s), int(t) or cores, a.rounds, evict)
    return 0


if __name__ == "__main__":
    sys.exit(main())
