"""An emulator of 8-bit optimizer states with the candidate fixes of issue 32.

It follows the structure of docs/NUMERICS.md §2 (groups of 32, f16 scales, softsign
i8 momentum, sqrt ui8 variance, fp32 parameters) in torch, not its bits: it is the
tool that chose the bounded numerics (docs/NUMERICS.md §8), not a reference. The
kernels' bits are pinned by test/reference and the Conformance tests.

A candidate is a dict:
  m, v        rounding of the momentum / variance codes: 'rtn' (FlashOptim),
              'sr' (stochastic rounding from a torch generator), 'dither' (the
              shipped counter dither u = ((12367 i + 10125 t) mod 2^14) / 2^14),
              'trunc_dec' (round toward zero when the magnitude decays);
              None keeps the state in fp32
  zero_top    decode v's code 0 as the top of its rounding interval (0.5/N)
  floor       floor v by Adam's invariant v >= m^2 (1-b2)(1-b1^2/b2)/(1-b1)^2
  clamp       clamp the Adam update to exact Adam's bound (the shipped `flashopt.bound`)
"""
import math

import torch

G = 32


def _groups(x):
    n = x.numel()
    flat = x.reshape(-1)
    if (-n) % G:
        flat = torch.cat([flat, flat.new_zeros((-n) % G)])
    return flat.view(-1, G), n


def dither(step, n):
    """The shipped dither (docs/NUMERICS.md §8): element index i, step t."""
    idx = torch.arange(n, dtype=torch.int64)
    return ((idx * 12367 + step * 10125) & 0x3FFF).float() / 16384.0


class Quant:
    def __init__(self, signed, compand):
        self.signed, self.compand = signed, compand
        self.N = 127.0 if signed else 255.0

    def decode(self, q, s, shape, n, zero_top=False):
        t = q / self.N
        if zero_top and not self.signed:
            t = torch.where(q == 0, torch.full_like(t, 0.5 / self.N), t)
        if self.compand == "softsign":
            t = t / (2.0 - t.abs())
        x = t * s.float()[:, None]
        if self.compand == "sqrt":
            x = x * x
        return x.reshape(-1)[:n].view(shape)

    def encode(self, x, mode, old, u):
        xg, n = _groups(x)
        y = xg.sqrt() if self.compand == "sqrt" else xg
        a = y.abs().amax(1).clamp_min(1e-12)
        s = a.to(torch.float16)
        nn_ = y / a[:, None]
        t = 2 * nn_ / (1 + nn_.abs()) if self.compand == "softsign" else nn_
        tn = t * self.N
        if mode == "rtn":
            f = torch.floor(tn + 0.5)
        elif mode in ("sr", "dither"):
            f = torch.floor(tn + _groups(u)[0])
        elif mode == "trunc_dec":
            dec = xg.abs() < _groups(old)[0].abs()
            f = torch.where(dec, torch.trunc(tn), torch.floor(tn + 0.5))
        else:
            raise ValueError(mode)
        lo = -self.N if self.signed else 0.0
        return torch.nan_to_num(f, nan=0.0).clamp(lo, self.N), s


class QState:
    def __init__(self, shape, quant, mode, zero_top=False):
        self.shape, self.quant, self.mode, self.zt = shape, quant, mode, zero_top
        self.n = math.prod(shape)
        ng = (self.n + G - 1) // G
        self.q, self.s = torch.zeros(ng, G), torch.zeros(ng, dtype=torch.float16)

    def get(self):
        return self.quant.decode(self.q, self.s, self.shape, self.n, self.zt)

    def set(self, x, old, step, gen):
        u = None
        if self.mode == "sr":
            u = torch.rand(self.n, generator=gen)
        elif self.mode == "dither":
            u = dither(step, self.n)
        self.q, self.s = self.quant.encode(x.reshape(-1), self.mode, old.reshape(-1), u)


class Plain:
    def __init__(self, shape):
        self.v = torch.zeros(shape)

    def get(self):
        return self.v.clone()

    def set(self, x, old, step, gen):
        self.v = x.clone()


class SimOpt:
    """rule in {'adamw', 'adam', 'sgd', 'lion'}; parameters stay fp32."""

    def __init__(self, params, rule="adamw", lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                 weight_decay=0.0, momentum=0.9, cand=None, seed=0):
        self.params = list(params)
        self.rule, self.lr, self.betas, self.eps = rule, lr, betas, eps
        self.wd, self.mu, self.cand, self.t = weight_decay, momentum, cand or {}, 0
        self.gen = torch.Generator().manual_seed(seed)
        self.st = []
        for p in self.params:
            c = self.cand
            m = Plain(p.shape) if c.get("m") is None else QState(
                p.shape, Quant(True, "softsign"), c["m"])
            v = None
            if rule in ("adam", "adamw"):
                v = Plain(p.shape) if c.get("v") is None else QState(
                    p.shape, Quant(False, "sqrt"), c["v"], c.get("zero_top", False))
            self.st.append((m, v))

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        self.t += 1
        t, (b1, b2), c = self.t, self.betas, self.cand
        for p, (ms, vs) in zip(self.params, self.st):
            g = (p.grad if p.grad is not None else torch.zeros_like(p)).float()
            m = ms.get()
            if self.rule in ("adam", "adamw"):
                if self.rule == "adam" and self.wd:
                    g = g + self.wd * p
                v = vs.get()
                mn = m * b1 + g * (1 - b1)
                vn = v * b2 + g * g * (1 - b2)
                bc1, bc2 = 1 - b1 ** t, 1 - b2 ** t
                vu = vn
                if c.get("floor"):
                    vu = torch.maximum(vn, mn * mn * (1 - b2) * (1 - b1 * b1 / b2) / (1 - b1) ** 2)
                upd = self.lr * (mn / bc1) / ((vu / bc2).sqrt() + self.eps)
                if c.get("clamp"):
                    r = b1 * b1 / b2
                    S = (1 - r ** t) / (1 - r)
                    K = ((1 - b1) ** 2 * S / (1 - b2)) ** 0.5
                    bound = abs(self.lr) * 1.00390625 * K * bc2 ** 0.5 / bc1
                    upd = upd.clamp(-bound, bound)
                if self.rule == "adamw":
                    p.mul_(1 - self.lr * self.wd)
                p.sub_(upd)
                ms.set(mn, m, t, self.gen)
                vs.set(vn, v, t, self.gen)
            elif self.rule == "sgd":
                if self.wd:
                    g = g + self.wd * p
                mn = m * self.mu + g
                p.sub_(self.lr * mn)
                ms.set(mn, m, t, self.gen)
            elif self.rule == "lion":
                d = torch.sign(m * b1 + g * (1 - b1))
                mn = m * b2 + g * (1 - b2)
                p.mul_(1 - self.lr * self.wd)
                p.sub_(self.lr * d)
                ms.set(mn, m, t, self.gen)


CANDIDATES = {
    "fp32": dict(),
    "flashoptim": dict(m="rtn", v="rtn"),
    "zero-top": dict(m="rtn", v="rtn", zero_top=True),
    "floor": dict(m="rtn", v="rtn", floor=True),
    "clamp": dict(m="rtn", v="rtn", clamp=True),
    "stochastic": dict(m="sr", v="sr"),
    "dither": dict(m="dither", v="dither"),
    "floor+trunc": dict(m="trunc_dec", v="rtn", floor=True),
    "clamp+dither (shipped)": dict(m="dither", v="dither", clamp=True),
}
