"""Compares the candidate fixes for the hazards of 8-bit states (issue 32) on the
emulator (emulator.py) and prints the table of docs/NUMERICS.md §8.

    .venv/bin/python bench/state_hazards/compare.py            # all candidates (~3 min)
    .venv/bin/python bench/state_hazards/compare.py dither fp32

Metrics (columns):
  rare      AdamW on the rare-input MLP (scikit-learn digits, 64-256-10, lr 1e-3,
            400 steps of 64): largest |dW1| of the first layer; and the test loss
            (the dense task: every input of the test set)
  probe     Adam single-element probe: 4095 N(0,1) gradients, element 0 gets 1e-2
            at step 201 only; largest |update| / lr afterwards
  drift     cumulative move of weights whose gradient stops (2 per group of 32,
            1000 steps after 200) over fp32's: median and max ratio
  sec8      worst cos / NMSE of the total update against fp32 over the numerics.md §8
            matrix (3 seeds, 30 and 300 steps, 4 tensor shapes)
"""
import sys

import torch
from torch import nn

from emulator import CANDIDATES, SimOpt

ADAM_ONLY = ("zero-top", "floor", "clamp")


def rare(cand):
    from sklearn.datasets import load_digits
    d = load_digits()
    X = torch.tensor(d.images, dtype=torch.float32).flatten(1) / 16.0
    Y = torch.tensor(d.target)
    perm = torch.randperm(len(Y), generator=torch.Generator().manual_seed(0))
    tr, te = perm[:1400], perm[1400:]
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    w0 = model[0].weight.detach().clone()
    ps = list(model.parameters())
    opt = (torch.optim.AdamW(ps, lr=1e-3) if cand is None else
           SimOpt(ps, "adamw", lr=1e-3, weight_decay=1e-2, cand=cand))
    g = torch.Generator().manual_seed(2)
    for _ in range(400):
        idx = tr[torch.randint(0, len(tr), (64,), generator=g)]
        opt.zero_grad()
        nn.functional.cross_entropy(model(X[idx]), Y[idx]).backward()
        opt.step()
    with torch.no_grad():
        loss = float(nn.functional.cross_entropy(model(X[te]), Y[te]))
    return float((model[0].weight.detach() - w0).abs().max()), loss


def probe(cand, g0=1e-2, n=4096):
    p = torch.zeros(n)
    opt = SimOpt([p], "adam", lr=1e-3, cand=cand)
    gen = torch.Generator().manual_seed(0)
    worst = 0.0
    for s in range(1, 261):
        g = torch.randn(n, generator=gen)
        g[0] = g0 if s == 201 else 0.0
        p.grad = g
        before = float(p[0])
        opt.step()
        if s >= 202:
            worst = max(worst, abs(float(p[0]) - before) / 1e-3)
    return worst


def drift(cand, rule, n=4096, before=200, after=1000):
    gen = torch.Generator().manual_seed(1)
    stop = torch.arange(0, n, 16)
    sig = torch.ones(n)
    sig[stop] = 10 ** torch.empty(len(stop)).uniform_(-3, 0, generator=gen)
    p = torch.zeros(n)
    kw = dict(betas=(0.9, 0.99)) if rule == "lion" else {}
    lr = 1e-2 if rule == "sgd" else 1e-3
    opt = SimOpt([p], rule, lr=lr, cand=cand, **kw)
    for s in range(1, before + after + 1):
        g = torch.randn(n, generator=gen) * sig
        if s > before:
            g[stop] = 0
        if s == before + 1:
            start = p[stop].clone()
        p.grad = g
        opt.step()
    return (p[stop] - start).abs()


SEC8 = {
    "adamw": ("adamw", dict(lr=1e-2, weight_decay=0.1)),
    "sgd": ("sgd", dict(lr=1e-2, momentum=0.9, weight_decay=1e-2)),
    "lion": ("lion", dict(lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)),
}


def sec8(cand, name):
    rule, kw = SEC8[name]
    worst_cos, worst_nmse = 1.0, 0.0
    for seed in (2, 3, 4):
        for steps in (30, 300):
            outs = []
            for c in (CANDIDATES["fp32"], cand):
                g = torch.Generator().manual_seed(seed)
                ps = [torch.randn(s, generator=g) for s in ((7, 13), (33,), (64, 65))]
                p0 = [p.clone() for p in ps]
                opt = SimOpt(ps, rule, cand=c, **kw)
                for s in range(steps):
                    gg = torch.Generator().manual_seed(1000 + s)
                    for p in ps:
                        p.grad = torch.randn(p.shape, generator=gg) * 0.1
                    opt.step()
                outs.append([(p - q).double().flatten() for p, q in zip(ps, p0)])
            for ref, x in zip(*outs):
                cos = float(nn.functional.cosine_similarity(x, ref, dim=0))
                nmse = float(((x - ref) ** 2).mean() / (ref ** 2).mean())
                worst_cos, worst_nmse = min(worst_cos, cos), max(worst_nmse, nmse)
    return worst_cos, worst_nmse


def main():
    names = sys.argv[1:] or list(CANDIDATES)
    ref_drift = {r: drift(CANDIDATES["fp32"], r) for r in ("adam", "sgd", "lion")}
    tw, tl = rare(None)
    print(f"torch AdamW fp32: rare max|dW1| {tw:.3g}, test loss {tl:.4f}")
    print("| candidate | rare max\\|ΔW1\\| | test loss | probe max\\|upd\\|/lr | drift "
          "Adam median/max | drift SGD median/max | drift Lion median/max | §8 AdamW "
          "cos/NMSE | §8 SGD cos/NMSE | §8 Lion cos/NMSE |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in names:
        cand = CANDIDATES[name]
        w, l = rare(cand)
        row = [name, f"{w:.3g}", f"{l:.4f}", f"{probe(cand):.3g}"]
        for r in ("adam", "sgd", "lion"):
            if r != "adam" and name in ADAM_ONLY:
                row.append("= flashoptim")
                continue
            ratio = drift(cand, r) / ref_drift[r].clamp_min(1e-12)
            row.append(f"{ratio.median():.3g} / {ratio.max():.3g}")
        for r in ("adamw", "sgd", "lion"):
            if r != "adamw" and name in ADAM_ONLY:
                row.append("= flashoptim")
                continue
            cos, nmse = sec8(cand, r)
            row.append(f"{cos:.5f} / {nmse:.2g}")
        print("| " + " | ".join(row) + " |", flush=True)


if __name__ == "__main__":
    main()
