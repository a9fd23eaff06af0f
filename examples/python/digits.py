#!/usr/bin/env python3
"""FlashAdamW next to torch.optim.AdamW on scikit-learn's digits (8x8 images of
handwritten digits, bundled with scikit-learn: no download).

Both runs start from the same initialization and see the same batches:
  flashopt: the model in bf16 (flashopt.cast_model), FlashAdamW with 24-bit
            master weights (bf16 + int8 correction) and 8-bit states;
  torch:    the model in fp32, torch.optim.AdamW.
Prints a table (final loss and accuracy, optimizer bytes per parameter,
checkpoint bytes on disk, step time) and writes a PNG with both loss curves and
a memory breakdown.

  python examples/python/digits.py [--steps 300] [--out build/demo/digits.png]
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bindings" / "python"))

import torch  # noqa: E402
from torch import nn  # noqa: E402

import flashopt  # noqa: E402


def load_digits(seed=0):
    from sklearn.datasets import load_digits as sk_digits
    d = sk_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(d.target, dtype=torch.long)
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(len(y), generator=g)
    x, y = x[perm], y[perm]
    n_test = 400
    return (x[n_test:], y[n_test:]), (x[:n_test], y[:n_test])


def make_model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10))


def evaluate(model, x, y):
    """Test loss and accuracy, computed in fp32 for both models (the bf16
    model's weights are its bf16 parameters, upcast exactly)."""
    model = copy.deepcopy(model).float()
    with torch.no_grad():
        logits = model(x)
        return (nn.functional.cross_entropy(logits, y).item(),
                (logits.argmax(1) == y).float().mean().item())


def torch_optimizer_bytes(model, opt):
    """Bytes per parameter of fp32 training with torch AdamW: params, grads and states."""
    n = sum(p.numel() for p in model.parameters())
    pb = sum(p.numel() * p.element_size() for p in model.parameters())
    sb = sum(v.numel() * v.element_size() for st in opt.state.values() for k, v in st.items()
             if torch.is_tensor(v) and k != "step")
    return {"params": pb / n, "correction": 0.0, "grads": pb / n, "states": sb / n}


def train(steps=300, lr=1e-3, batch=64, seed=0, progress=True, workdir=None,
          arithmetic="exact", state_bits=8):
    """Trains both; returns a dict of results (losses per step, final metrics, sizes)."""
    (xtr, ytr), (xte, yte) = load_digits(seed)
    base = make_model(seed)
    runs = {
        "flashopt": flashopt.cast_model(copy.deepcopy(base), torch.bfloat16),
        "torch": copy.deepcopy(base),
    }
    dtypes = {"flashopt": torch.bfloat16, "torch": torch.float32}
    opts = {
        "flashopt": flashopt.FlashAdamW(runs["flashopt"].parameters(), lr=lr, weight_decay=1e-2,
                                        arithmetic=arithmetic,
                                        **({} if state_bits == 8 else {"state_bits": state_bits})),
        "torch": torch.optim.AdamW(runs["torch"].parameters(), lr=lr, weight_decay=1e-2),
    }
    g = torch.Generator().manual_seed(seed + 1)
    order = []
    while len(order) < steps * batch:
        order.extend(torch.randperm(len(ytr), generator=g).tolist())
    losses = {k: [] for k in runs}
    step_time = {k: 0.0 for k in runs}
    it = range(steps)
    bar = None
    if progress:
        try:
            from tqdm import tqdm
            bar = tqdm(it, desc="training", unit="step", file=sys.stdout,
                       # a line every 30 s in a log, not one per step
                       mininterval=0.1 if sys.stdout.isatty() else 30)
            it = bar
        except ImportError:
            pass
    for s in it:
        idx = torch.tensor(order[s * batch:(s + 1) * batch])
        xb, yb = xtr[idx], ytr[idx]
        for k, model in runs.items():
            opt = opts[k]
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(xb.to(dtypes[k])).float(), yb)
            loss.backward()
            t0 = time.perf_counter()
            opt.step()
            step_time[k] += time.perf_counter() - t0
            losses[k].append(loss.item())
        if bar is not None:
            bar.set_postfix(refresh=False, flashopt=f"{losses['flashopt'][-1]:.4f}",
                            torch=f"{losses['torch'][-1]:.4f}")
    res = {"steps": steps, "losses": losses, "final": {}, "memory": {}, "checkpoint": {},
           "step_ms": {k: 1e3 * v / steps for k, v in step_time.items()},
           "numel": sum(p.numel() for p in base.parameters())}
    for k, model in runs.items():
        tl, ta = evaluate(model, xte, yte)
        res["final"][k] = {"train_loss": sum(losses[k][-10:]) / 10, "test_loss": tl,
                           "test_acc": ta}
    m = opts["flashopt"].memory_report()
    n = m["numel"]
    res["memory"]["flashopt"] = {"params": m["param_bytes"] / n,
                                 "correction": m["correction_bytes"] / n,
                                 "grads": m["grad_bytes"] / n, "states": m["state_bytes"] / n}
    res["memory"]["torch"] = torch_optimizer_bytes(runs["torch"], opts["torch"])
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        fpath = os.path.join(tmp, "flash.safetensors")
        opts["flashopt"].save_checkpoint(fpath)
        res["checkpoint"]["flashopt"] = sum(os.path.getsize(p)
                                            for p in opts["flashopt"].checkpoint_paths(fpath))
        tpath = os.path.join(tmp, "torch.pt")
        torch.save({"model": runs["torch"].state_dict(), "optim": opts["torch"].state_dict()},
                   tpath)
        res["checkpoint"]["torch"] = os.path.getsize(tpath)
    return res


def table(res) -> str:
    f, t = res["final"]["flashopt"], res["final"]["torch"]
    mf, mt = res["memory"]["flashopt"], res["memory"]["torch"]
    rows = [
        ("", "FlashAdamW (bf16+24-bit)", "torch AdamW (fp32)"),
        ("final train loss (last 10 steps)", f"{f['train_loss']:.4f}", f"{t['train_loss']:.4f}"),
        ("final test loss", f"{f['test_loss']:.4f}", f"{t['test_loss']:.4f}"),
        ("final test accuracy", f"{100 * f['test_acc']:.2f}%", f"{100 * t['test_acc']:.2f}%"),
        ("optimizer bytes / param (params+grads+states)", f"{sum(mf.values()):.3f}",
         f"{sum(mt.values()):.3f}"),
        ("checkpoint bytes on disk (params + optimizer)", f"{res['checkpoint']['flashopt']}",
         f"{res['checkpoint']['torch']}"),
        ("optimizer step time (ms, mean)", f"{res['step_ms']['flashopt']:.3f}",
         f"{res['step_ms']['torch']:.3f}"),
    ]
    return format_rows(rows)


def format_rows(rows) -> str:
    """Three-column rows (label, flashopt, torch) as an aligned text table,
    a rule under the header row (also charlm.py's)."""
    w = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [f"{r[0]:<{w[0]}}  {r[1]:>{w[1]}}  {r[2]:>{w[2]}}" for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def plot(res, out: Path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [3, 2]})
    colors = {"flashopt": "tab:orange", "torch": "tab:blue"}
    labels = {"flashopt": "FlashAdamW (bf16 + 24-bit master, 8-bit states)",
              "torch": "torch AdamW (fp32)"}
    for k, ls in res["losses"].items():
        a.plot(range(1, len(ls) + 1), ls, color=colors[k], alpha=0.25, lw=0.8)
        w = 10
        sm = [sum(ls[max(0, i - w + 1):i + 1]) / len(ls[max(0, i - w + 1):i + 1])
              for i in range(len(ls))]
        a.plot(range(1, len(ls) + 1), sm, color=colors[k], lw=1.8,
               label=f"{labels[k]}: test acc {100 * res['final'][k]['test_acc']:.1f}%")
    a.set_yscale("log")
    a.set_xlabel("step")
    a.set_ylabel("training loss (cross-entropy, log scale)")
    a.set_title(f"sklearn digits, small CNN ({res['numel']} params), same init and batches\n"
                "thin: per batch, thick: 10-step mean", fontsize=10)
    a.legend(fontsize=8)
    a.grid(alpha=0.3)
    parts = [("params", "tab:blue"), ("correction", "tab:purple"), ("grads", "tab:gray"),
             ("states", "tab:green")]
    names = ["FlashAdamW", "torch AdamW"]
    keys = ["flashopt", "torch"]
    bottom = [0.0, 0.0]
    for part, c in parts:
        vals = [res["memory"][k][part] for k in keys]
        b.bar(names, vals, bottom=bottom, color=c, label=part)
        for i, v in enumerate(vals):
            if v > 0.2:
                b.text(i, bottom[i] + v / 2, f"{v:.3g}", ha="center", va="center",
                       color="white", fontsize=9)
        bottom = [x + v for x, v in zip(bottom, vals)]
    for i, tot in enumerate(bottom):
        b.text(i, tot + 0.2, f"{tot:.3f} B/param", ha="center", fontsize=10)
    b.set_ylabel("bytes per parameter")
    b.set_ylim(0, max(bottom) * 1.15)
    b.set_title("training memory per parameter\n(params, master-weight correction, grads, "
                "optimizer states)", fontsize=10)
    b.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--out", default=str(ROOT / "build" / "demo" / "digits.png"))
    ap.add_argument("--threads", type=int, default=0,
                    help="CPU threads for torch and libflashopt (0: torch's default)")
    ap.add_argument("--arithmetic", choices=("exact", "fast"), default="exact",
                    help="FlashAdamW's arithmetic (docs/NUMERICS.md §7)")
    ap.add_argument("--state-bits", type=int, choices=(4, 8, 32), default=8,
                    help="FlashAdamW's optimizer states: 4- or 8-bit codes, or fp32")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
        flashopt.set_cpu_threads(args.threads)
    print(f"flashopt {flashopt.version()} ({flashopt.library_path()}), torch {torch.__version__}")
    res = train(args.steps, args.lr, arithmetic=args.arithmetic, state_bits=args.state_bits)
    print()
    print(table(res))
    out = Path(args.out)
    plot(res, out)
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
