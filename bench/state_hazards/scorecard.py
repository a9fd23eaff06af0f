"""The numerics scorecard (docs/NUMERICS.md §8.1): every hazard of 8-bit
optimizer states, measured on the shipped kernels through the binding, in
fp32 states (quantize=False, or torch's fp32 AdamW where it says so), the
bounded numerics (the default) and FlashOptim's (numerics="flashoptim").
The scenarios are those of bindings/python/tests/test_state_hazards.py,
which asserts the bounded numerics' bounds.

    FLASHOPT_LIBRARY=build/lib/libflashopt.so FLASHOPT_KERNELS=build/kernels \\
      PYTHONPATH=bindings/python .venv/bin/python bench/state_hazards/scorecard.py

Prints one Markdown table (the one in docs/NUMERICS.md), with the date and
the commit it measured.
"""
import datetime
import math
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bindings/python/tests"))
import flashopt  # noqa: E402
import test_state_hazards as T  # noqa: E402

NUMERICS = ("bounded", "flashoptim")


def fmt(x):
    if isinstance(x, str):
        return x
    if x != x or math.isinf(x):
        return str(x)
    a = abs(x)
    return f"{x:.3g}" if a == 0 or 1e-3 <= a < 1e5 else f"{x:.2e}"


def rows():
    # Rare inputs (AdamW, a 64 -> 256 -> 10 MLP on the digits).
    ref = T.first_layer_move(lambda p: torch.optim.AdamW(p, lr=1e-3))
    got = [T.first_layer_move(lambda p, n=n: flashopt.FlashAdamW(p, lr=1e-3, numerics=n))
           for n in NUMERICS]
    yield ("rare inputs (MLP on digits)", "largest first-layer move (torch fp32)", ref, *got)

    # Stopped weights.
    for rule, factory in (("Adam", T.ADAM), ("SGD momentum", T.SGD)):
        out = []
        for n in NUMERICS:
            mine, r = T.stopped_moves(factory(numerics=n))
            ratio = mine / r.clamp_min(1e-30)
            out.append(f"{float(ratio.median()):.3g} / {float(ratio.max()):.3g}")
        yield (f"stopped weights, {rule}", "move / fp32's, median / max", "1 / 1", *out)

    # The outlier channel.
    ref = T.torch_outlier_channel()
    out = []
    for n in NUMERICS:
        m = T.outlier_channel(lambda p, n=n: flashopt.FlashAdamW(
            p, lr=1e-3, weight_decay=0.0, numerics=n))
        out.append((float(m.mean()), float(m.abs().max())))
    yield ("outlier channel (AdamW)", "small elements' mean signed move (lr)",
           float(ref.mean()), *(o[0] for o in out))
    yield ("outlier channel (AdamW)", "largest move of a small element (lr)",
           float(ref.abs().max()), *(o[1] for o in out))

    # Absent tokens, every beta2.
    for beta2 in (0.95, 0.99, 0.999, 0.9995, 0.9999):
        absent = int(min(3000, math.ceil(math.log(1e-6) / math.log(beta2))))
        kw = dict(lr=1e-3, betas=(0.9, beta2), weight_decay=0.0)
        v_ref, u_ref = T.absent_tokens(lambda p: torch.optim.AdamW(p, **kw), absent, fp32=True)
        out = []
        for n in NUMERICS:
            v, u = T.absent_tokens(lambda p, n=n: flashopt.FlashAdamW(p, numerics=n, **kw), absent)
            out.append(f"{v / v_ref:.3g} / {u / u_ref:.3g}")
        yield (f"absent tokens, beta2 {beta2} ({absent} steps)",
               "decoded v / fp32's; update on return / fp32's", "1 / 1", *out)

    # Betas torch accepts.
    def first_nonfinite(make, dtype):
        p = torch.zeros(256, dtype=dtype, requires_grad=True)
        opt = make([p])
        g = torch.Generator().manual_seed(23)
        for s in range(1, 301):
            if s > 250:
                opt.param_groups[0]["lr"] = 0.0
            p.grad = torch.randn(256, generator=g).to(torch.bfloat16).to(dtype)
            opt.step()
            if not bool(torch.isfinite(p.detach().float()).all()):
                return f"NaN at step {s}"
        return "finite"

    for betas in ((0.9, 0.0), (0.0, 0.0), (0.99, 0.5)):
        ref = first_nonfinite(lambda p: torch.optim.AdamW(p, lr=1e-3, betas=betas),
                              torch.float32)
        out = [first_nonfinite(lambda p, n=n: flashopt.FlashAdamW(
            p, lr=1e-3, betas=betas, numerics=n), torch.bfloat16) for n in NUMERICS]
        yield (f"betas {betas}, lr 0 after step 250", "300 steps (torch fp32 AdamW)",
               ref, *out)

    # betas (0.95, 0.9) for 33,100 steps, lr 0 from step 32,900: beta1^2 > beta2, where the
    # first bounded revision's geometric sum overflowed f32 and lr 0 gave 0 * inf.
    def long_run(make, dtype):
        p = torch.zeros(64, dtype=dtype, requires_grad=True)
        opt = make([p])
        g = torch.Generator().manual_seed(29)
        grads = torch.randn(64, 64, generator=g).to(torch.bfloat16).to(dtype)
        for s in range(1, 33101):
            if s == 32900:
                opt.param_groups[0]["lr"] = 0.0
            p.grad = grads[s % 64]
            opt.step()
        return "finite" if bool(torch.isfinite(p.detach().float()).all()) else "NaN"

    kw = dict(lr=1e-3, betas=(0.95, 0.9))
    yield ("betas (0.95, 0.9), lr 0 from step 32,900", "33,100 steps (torch fp32 AdamW)",
           long_run(lambda p: torch.optim.AdamW(p, **kw), torch.float32),
           *(long_run(lambda p, n=n: flashopt.FlashAdamW(p, numerics=n, **kw), torch.bfloat16)
             for n in NUMERICS))

    # A +inf gradient element in Lion (PROPAGATE, docs/NUMERICS.md section 5): its own
    # weight must turn non-finite in its step (sign(inf) = 1 once left it finite while the
    # group's scale was infinite, and the whole group turned non-finite one step later).
    def lion_inf(**kw):
        p = torch.zeros(64, dtype=torch.bfloat16, requires_grad=True)
        opt = flashopt.FlashLion([p], lr=1e-4, **kw)
        g = torch.Generator().manual_seed(31)
        p.grad = torch.randn(64, generator=g).to(torch.bfloat16)
        opt.step()
        grad = torch.randn(64, generator=g)
        grad[3] = float("inf")
        p.grad = grad.to(torch.bfloat16)
        opt.step()
        own = bool(torch.isfinite(opt.export_master(p)[3]))
        return "finite (hidden)" if own else "non-finite (seen)"

    yield ("+inf gradient element (Lion)", "its own weight in that step",
           lion_inf(quantize=False), *(lion_inf(numerics=n) for n in NUMERICS))

    # The single-element probe (fp32: the same gradients through quantize=False).
    yield ("v code 0 under m's (Adam probe, g0 = 1e-2)", "largest update magnitude / lr after it",
           T.probe(1e-2, quantize=False),
           *(T.probe(1e-2, numerics=n) for n in NUMERICS))


def main():
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    print(f"Numerics scorecard, {datetime.date.today()}, commit {commit} "
          f"(kernels through the binding, CPU)\n")
    print("| hazard | metric | fp32 | bounded | FlashOptim |")
    print("|---|---|---:|---:|---:|")
    for r in rows():
        print("| " + " | ".join(fmt(x) for x in r) + " |", flush=True)


if __name__ == "__main__":
    main()
