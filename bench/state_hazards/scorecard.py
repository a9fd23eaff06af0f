"""The numerics scorecard (docs/NUMERICS.md §8.1): every hazard of quantized
optimizer states, measured on the shipped kernels through the binding, in
fp32 states (quantize=False, or torch's fp32 AdamW where it says so) and in
each configuration of CONFIGS: the bounded numerics (the default) with 8-bit
and 4-bit states (state_bits=4: the *_4bit bundles), and FlashOptim's
(numerics="flashoptim", 8-bit only). The scenarios are those of
bindings/python/tests/test_state_hazards.py, which asserts the bounded
numerics' bars (its BARS at 8 bits; at 4 bits BARS where the 4-bit kernels
meet them, BARS_4BIT where they do not). A 4-bit entry within the 8-bit bar
of its hazard (BARS, the same predicate the test asserts) is marked " ✓".

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

# The columns after fp32: a name and the optimizer options each row adds to its own.
CONFIGS = (
    ("bounded 8-bit", dict(state_bits=8)),
    ("bounded 4-bit", dict(state_bits=4)),
    ("FlashOptim", dict(numerics="flashoptim")),
)
# The column whose entries are marked when within the 8-bit bar (T.BARS).
MARKED = "bounded 4-bit"
MARK = " ✓"


def fmt(x):
    if isinstance(x, str):
        return x
    if x != x or math.isinf(x):
        return str(x)
    a = abs(x)
    return f"{x:.3g}" if a == 0 or 1e-3 <= a < 1e5 else f"{x:.2e}"


def times(x, ref):
    """x and its factor against fp32's ref."""
    return f"{fmt(x)} ({x / ref:.3g}×)"


def row(hazard, metric, fp32, measure, show=fmt, ok=None):
    """One table row: `measure(opts)` for every configuration, shown by `show`;
    the MARKED column's entry gets MARK where `ok` of its measurement holds."""
    cells = []
    for name, opts in CONFIGS:
        got = measure(dict(opts))
        cell = show(got)
        if name == MARKED and ok is not None and ok(got):
            cell += MARK
        cells.append(cell)
    return (hazard, metric, fp32 if isinstance(fp32, str) else fmt(fp32), *cells)


def rows():
    # Rare inputs (AdamW, a 64 -> 256 -> 10 MLP on the digits).
    ref = T.first_layer_move(lambda p: torch.optim.AdamW(p, lr=1e-3))
    yield row("rare inputs (MLP on digits)", "largest first-layer move (torch fp32)", ref,
              lambda o: T.first_layer_move(lambda p: flashopt.FlashAdamW(p, lr=1e-3, **o)),
              show=lambda x: times(x, ref),
              ok=lambda x: T.within(x / ref, T.bar("rare inputs")))

    # Stopped weights.
    for rule, factory, lr in (("Adam", T.ADAM, 1e-3), ("SGD momentum", T.SGD, 1e-2)):
        def stopped(o, factory=factory):
            mine, r = T.stopped_moves(factory(**o))
            return mine, r

        def show(m, lr=lr):
            mine, r = m
            ratio = mine / r.clamp_min(1e-30)
            return (f"{float(ratio.median()):.3g} / {float(ratio.max()):.3g} "
                    f"(+{float(((mine - r) / lr).max()):.2g} lr)")
        yield row(f"stopped weights, {rule}",
                  "move / fp32's, median / max (largest excess over fp32's, lr)", "1 / 1",
                  stopped, show=show,
                  ok=lambda m, lr=lr: T.stopped_within(m[0], m[1], lr, T.bar("stopped weights")))

    # Lion after a pause (gradient 0 for 300 steps, then a small reversed one for 300).
    fp32 = T.lion_pause(state_bits=32)
    yield row("Lion after a 300-step pause", "of 64, moving against a returning gradient; "
              "mean move along it (lr)", f"{fp32[0]}; {fp32[1]:.3g}",
              lambda o: T.lion_pause(**o), show=lambda x: f"{x[0]}; {x[1]:.3g}",
              ok=lambda x: T.within(x[0], T.bar("lion pause")))

    # The outlier channel.
    ref = T.torch_outlier_channel()
    ref_max = float(ref.abs().max())
    moves = {}

    def outlier(o):
        key = tuple(sorted(o.items()))
        if key not in moves:
            moves[key] = T.outlier_channel(lambda p: flashopt.FlashAdamW(
                p, lr=1e-3, weight_decay=0.0, **o))
        return moves[key]
    yield row("outlier channel (AdamW)", "small elements' mean signed move (lr)",
              float(ref.mean()), lambda o: float(outlier(o).mean()),
              ok=lambda x: T.within(abs(x), T.bar("outlier drift")))
    yield row("outlier channel (AdamW)", "largest move of a small element (lr)",
              ref_max, lambda o: float(outlier(o).abs().max()),
              show=lambda x: times(x, ref_max),
              ok=lambda x: T.within(x / ref_max, T.bar("outlier max")))

    # Absent tokens, every beta2.
    for beta2 in (0.95, 0.99, 0.999, 0.9995, 0.9999):
        absent = T.absent_steps(beta2)
        kw = dict(lr=1e-3, betas=(0.9, beta2), weight_decay=0.0)
        v_ref, u_ref = T.torch_absent_tokens(beta2)

        def tokens(o, kw=kw, absent=absent, v_ref=v_ref, u_ref=u_ref):
            v, u = T.absent_tokens(lambda p: flashopt.FlashAdamW(p, **o, **kw), absent)
            return v / v_ref, u / u_ref
        yield row(f"absent tokens, beta2 {beta2} ({absent} steps)",
                  "decoded v / fp32's; update on return / fp32's", "1 / 1", tokens,
                  show=lambda x: f"{x[0]:.3g} / {x[1]:.3g}",
                  ok=lambda x, b=beta2: (T.within(x[0], T.bar("absent v", case=b))
                                         and T.within(x[1], T.bar("absent update", case=b))))

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

    for betas in ((0.9, 0.0), (0.0, 0.0), (0.0, 0.999), (0.99, 0.5)):
        ref = first_nonfinite(lambda p: torch.optim.AdamW(p, lr=1e-3, betas=betas),
                              torch.float32)
        yield row(f"betas {betas}, lr 0 after step 250", "300 steps (torch fp32 AdamW)", ref,
                  lambda o, betas=betas: first_nonfinite(lambda p: flashopt.FlashAdamW(
                      p, lr=1e-3, betas=betas, **o), torch.bfloat16),
                  ok=lambda x: x == "finite")

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
    yield row("betas (0.95, 0.9), lr 0 from step 32,900", "33,100 steps (torch fp32 AdamW)",
              long_run(lambda p: torch.optim.AdamW(p, **kw), torch.float32),
              lambda o: long_run(lambda p: flashopt.FlashAdamW(p, **o, **kw), torch.bfloat16),
              ok=lambda x: x == "finite")

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

    yield row("+inf gradient element (Lion)", "its own weight in that step",
              lion_inf(state_bits=32), lambda o: lion_inf(**o),
              ok=lambda x: x == "non-finite (seen)")

    # A finite gradient of 1e6 (Adam): FlashOptim's f16 momentum scale overflows.
    def spike(**kw):
        p = torch.zeros(64, dtype=torch.bfloat16, requires_grad=True)
        opt = flashopt.FlashAdam([p], lr=1e-3, **kw)
        g = torch.Generator().manual_seed(3)
        for s in range(3):
            grad = torch.randn(64, generator=g)
            if s == 0:
                grad[5] = 1e6
            p.grad = grad.to(torch.bfloat16)
            opt.step()
        return int((~torch.isfinite(p.detach().float())).sum())

    yield row("gradient spike 1e6 (Adam)", "non-finite weights of 64, 2 steps after it",
              str(spike(state_bits=32)), lambda o: spike(**o), show=str,
              ok=lambda x: T.within(x, T.bar("spike")))

    # The single-element probe (fp32: the same gradients through state_bits=32).
    yield row("v code 0 under m's (Adam probe, g0 = 1e-2)",
              "largest update magnitude / lr after it", T.probe(1e-2, state_bits=32),
              lambda o: T.probe(1e-2, **o), ok=lambda x: T.within(x, T.bar("probe")))


def main():
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    print(f"Numerics scorecard, {datetime.date.today()}, commit {commit} "
          f"(kernels through the binding, CPU). ✓: a {MARKED} entry within the bar the "
          f"bounded 8-bit numerics are held to on that hazard (test_state_hazards.BARS); "
          f"the others miss it and are held to their own 4-bit bar "
          f"(test_state_hazards.BARS_4BIT).\n")
    print("| hazard | metric | fp32 | " + " | ".join(n for n, _ in CONFIGS) + " |")
    print("|---|---|---:|" + "---:|" * len(CONFIGS))
    for r in rows():
        print("| " + " | ".join(fmt(x) for x in r) + " |", flush=True)


if __name__ == "__main__":
    main()
