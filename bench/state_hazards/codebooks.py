"""The codebook comparison of issue 39: which 8-bit state codes track fp32 AdamW
where language models live (docs/NUMERICS.md §8.2).

A numpy emulation of the structure of docs/NUMERICS.md §2 and §2d — groups of
32, one scale per group, fp32 weights — not of its bits (test/reference and the
Conformance tests pin those). Every candidate runs the same gradients as fp32
Adam (float64 here) on five patterns:

  outlier   in every group of 32, element 0 gets N(0,1) gradients, the other 31
            N(0,1e-3); 1000 steps, 256 groups: mean signed move and largest move
            of the small elements, in lr (fp32: ~0 and ~125)
  absent    a 64x64 embedding, 200 steps with every row active, then 3000 steps
            where the odd rows get none (fewer where beta2^steps < 1e-6): mean
            decoded v of those rows / fp32's, and their update when they return
  small     elements at 1e-3..1e-2 of their group's scale, active 100 steps then
            stopped beside an active N(0,1) one: largest move over 900 steps
  stopped   one element per group stops after 200 steps (group scales
            10^-3..1): cumulative move over 1000 steps / fp32's (median, max)
  SGD       SGD momentum's m code alone: weights that stop after 200 steps and
            then move farther than max(2x fp32's move, fp32's + lr)
  noise     per-element scales e^U(-3,0), 300 steps: NMSE of the total update

    .venv/bin/python bench/state_hazards/codebooks.py            # every candidate
    .venv/bin/python bench/state_hazards/codebooks.py "softsign (bf16 scale)/e4m4 (ships)"

--bits 4 (docs/design/4bit-states.md §3.4, docs/NUMERICS.md §8.6): 4-bit codes for m
(e2m1, e3m0, Li et al.'s DE map rounded to nearest as torchao does, or dithered) and v
(e3m1, e4m0 zero-free; torchao's linear zero-free map, rounded to nearest) with
groups of G = 32, 64, 128; minifloat scales are bf16 powers of two (§2d) unless a row
says otherwise, table codes scale by the f32 absmax. Each state dithers with its own
stream (12367 i + H(t + k 0x9E3779B9), k = 0 for m, 1 for v), Adam's bound applies
as above. The scenarios keep their layout in units of 32 elements, except absent
tokens (rows of 128) and stopped weights (scales per 128): a group never straddles
two rows or two scales. Absent tokens run at the design's beta2 0.99, 0.999, 0.9999;
the stopped and SGD bars are 3x fp32's move or fp32's + lr (design §8 T2); NMSE over
three seeds, and with one scale for every element; the rare-input MLP of compare.py
(this file's Adam, tensors padded to groups of 128). Plus the shipped 8-bit row,
e2m1/e3m1 with the 8-bit dither (shared hash, v at phase 0.2113), round-to-nearest
rows, a torchao-AdamW4bit-like row, and rows whose scales are f32 absmax/top.

    .venv/bin/python bench/state_hazards/codebooks.py --bits 4    # ~8 min
    .venv/bin/python bench/state_hazards/codebooks.py --bits 4 "e2m1/e3m1, G 32"
"""
import sys

import numpy as np

G = 32
LR = 1e-3


def f16_rn(a):
    return a.astype(np.float16).astype(np.float32)


def f16_ru(a):
    s = a.astype(np.float16)
    s = np.where(s.astype(np.float32) < a, np.nextafter(s, np.float16(np.inf)), s)
    return s.astype(np.float32)


def bf16_rn(a):
    b = np.asarray(a, np.float32).view(np.uint32).astype(np.uint64)
    return (((b + 0x7FFF + ((b >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)


def bf16_ru(a):
    b = np.asarray(a, np.float32).view(np.uint32).astype(np.uint64)
    hi = (b >> 16) << 16
    hi = np.where((b & 0xFFFF) != 0, hi + 0x10000, hi)
    return hi.astype(np.uint32).view(np.float32)


def step_hash(t):
    """H(t): the top 14 bits of the step's 32-bit hash (docs/NUMERICS.md §8.3)."""
    x = t & 0xFFFFFFFF
    x ^= x >> 16
    x = (x * 0x21F0AAAD) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x735A2D97) & 0xFFFFFFFF
    x ^= x >> 15
    return x >> 18


def dither(n, t, phase=0, B=None, stream=None):
    """The element offsets of step t: h = (12367 i + H(t) + phase) mod 2^14 (the
    shipped dither), or with B a rotation in time, 12367 i + B t (the first
    bounded numerics': B = 10125); with a stream k (the 4-bit states'),
    12367 i + H(t + k 0x9E3779B9)."""
    i = np.arange(n, dtype=np.int64)
    if stream is not None:
        time = step_hash((t + stream * 0x9E3779B9) & 0xFFFFFFFF)
    else:
        time = step_hash(t) if B is None else t * B
    return ((i * 12367 + time + phase) & 0x3FFF) / 16384.0


class Linear:
    """FlashOptim's codes (docs/NUMERICS.md §2): floor(N * comp(y / a) + u),
    y = sqrt(v) for v, comp = softsign for m; f16 scales rounded to nearest
    (rn), bf16 ones (bf16), or f16 ones rounded up with the codes against the
    stored scale (ru); zero_free decodes v's code 0 as half a code."""

    def __init__(self, signed, scale="rn", zero_free=False):
        self.signed, self.scale, self.zf = signed, scale, zero_free
        self.N = 127.0 if signed else 255.0

    def decode(self, q, s):
        t = q / self.N
        if self.zf:
            t = np.where(q == 0, 0.5 / self.N, t)
        if self.signed:
            return t / (2 - np.abs(t)) * s[:, None]
        return (t * s[:, None]) ** 2

    def encode(self, x, u):
        y = x if self.signed else np.sqrt(np.maximum(x, 0))
        a = np.maximum(np.abs(y).max(1), 1e-12).astype(np.float32)
        st = (f16_ru(a) if self.scale == "ru" else
              bf16_rn(a) if self.scale == "bf16" else f16_rn(a))
        n = y / (st if self.scale == "ru" else a)[:, None]
        t = 2 * n / (1 + np.abs(n)) if self.signed else n
        lo = -self.N if self.signed else 0
        return np.clip(np.floor(np.float32(t * self.N) + u), lo, self.N), st


class Minifloat:
    """Minifloat codes (docs/NUMERICS.md §2d): E exponent and M mantissa bits;
    codes with e = 0 are subnormals (sub) or decode to 0, and an unsigned
    (zero_free) code 0 decodes to half the smallest step; scale =
    RU(absmax / top), codes of |x| / scale rounded in linear space by adding
    the dither to the dropped mantissa bits (a subnormal as r + 2^(1-emax))."""

    def __init__(self, E, M, signed, zero_free=False, stype="bf16", sub=False):
        self.E, self.M, self.signed, self.stype, self.sub = E, M, signed, stype, sub
        self.emax = 2 ** E - 1
        vals = []
        for c in range(2 ** (E + M)):
            e, f = c >> M, c & (2 ** M - 1)
            if e:
                vals.append(2.0 ** (e - self.emax) * (1 + f / 2 ** M))
            elif sub:
                vals.append(f * 2.0 ** (1 - self.emax - M))
            else:
                vals.append(0.0)
        if zero_free:
            vals[0] = (0.5 * 2.0 ** (1 - self.emax - M)) if sub else 2.0 ** -self.emax
        self.vals, self.top = np.array(vals), vals[-1]

    def decode(self, q, s):
        return np.sign(q) * self.vals[np.abs(q).astype(np.int64)] * s[:, None] if self.signed \
            else self.vals[q.astype(np.int64)] * s[:, None]

    def encode(self, x, u):
        x = x.astype(np.float32)
        a = np.abs(x).max(1)
        if self.stype == "pow2":  # the shipped scales: the least power of two
            e = np.ceil(np.log2(np.maximum(a, 1e-30) / self.top)).astype(np.int64)
            st = np.ldexp(np.float32(1), np.clip(e, -126, self.emax + 22)).astype(np.float32)
        elif self.stype == "bf16":
            st = np.maximum(bf16_ru(a * np.float32(1 / self.top)), np.float32(2.0 ** -126))
        elif self.stype == "f32":  # not rounded: absmax / top
            st = np.maximum(a / np.float32(self.top), np.float32(2.0 ** -126)).astype(np.float32)
        else:
            st = np.maximum(f16_ru(a * np.float32(1 / self.top)), np.float32(2.0 ** -14))
        r = (np.abs(x) * (np.float32(1) / st)[:, None]).astype(np.float32)
        T = np.float32(2.0 ** (1 - self.emax))
        below = (r < T) & self.sub
        r = np.where(below, r + T, r).astype(np.float32)
        bits = r.view(np.uint32).astype(np.int64)
        h = np.floor(u * 16384).astype(np.int64)
        sh = 23 - self.M
        q = ((bits + (h << (sh - 14))) >> sh) - ((127 - self.emax) << self.M)
        q = np.clip(np.where(below, q - 2 ** self.M, q), 0, 2 ** (self.E + self.M) - 1)
        return (np.where(x < 0, -q, q) if self.signed else q), st


class Table:
    """A general 16-entry codebook (Li et al.'s DE map, torchao's linear v):
    scale = the group's absmax (f32), r = x / scale, rounded between the
    adjacent entries c_k <= r < c_k+1: up where (r - c_k)/(c_k+1 - c_k) + u >= 1
    (the fraction clamped to [0, 1] at the table's ends)."""

    def __init__(self, vals):
        self.vals = np.array(sorted(vals))

    def decode(self, q, s):
        return self.vals[q.astype(np.int64)] * s[:, None]

    def encode(self, x, u):
        x = x.astype(np.float32)
        st = np.maximum(np.abs(x).max(1), np.float32(1e-30))
        r = x / st[:, None]
        T = self.vals
        k = np.clip(np.searchsorted(T, r, "right") - 1, 0, len(T) - 2)
        phi = np.clip((r - T[k]) / (T[k + 1] - T[k]), 0, 1)
        return k + (phi + u >= 1), st


class Nearest:
    """Round to nearest (ties down) in place of the dither."""

    def __init__(self, code):
        self.code = code

    def decode(self, q, s):
        return self.code.decode(q, s)

    def encode(self, x, u):
        return self.code.encode(x, np.full(u.shape, 8191 / 16384))


class State:
    def __init__(self, n, code, phase, g=G, stream=None):
        self.code, self.phase, self.g, self.stream = code, phase, g, stream
        self.ng = n // g
        self.q = np.zeros((self.ng, g))
        self.s = np.zeros(self.ng, np.float32)

    def get(self):
        return self.code.decode(self.q, self.s).reshape(-1)

    def set(self, x, t, B):
        u = dither(self.ng * self.g, t, self.phase, B, self.stream).reshape(self.ng, self.g)
        self.q, self.s = self.code.encode(x.reshape(self.ng, self.g), u)


class Plain:
    def __init__(self, n):
        self.v = np.zeros(n)

    def get(self):
        return self.v.copy()

    def set(self, x, t, B):
        self.v = x.copy()


class Adam:
    """AdamW without decay, clamped to Adam's bound (docs/NUMERICS.md §8.4)
    when the states are quantized."""

    def __init__(self, n, cand, b1=0.9, b2=0.999, eps=1e-8):
        self.b1, self.b2, self.eps, self.t, self.c = b1, b2, eps, 0, cand
        self.clamped = self.total = 0
        if cand is None:
            self.m, self.v, self.B = Plain(n), Plain(n), None
        else:
            g, st = cand.get("G", G), cand.get("streams")
            self.m = State(n, cand["m"](), 0, g, 0 if st else None)
            self.v = State(n, cand["v"](), cand.get("phase", 0), g, 1 if st else None)
            self.B = cand.get("B")

    def step(self, g):
        self.t += 1
        t, b1, b2 = self.t, self.b1, self.b2
        mn = b1 * self.m.get() + (1 - b1) * g
        vn = b2 * self.v.get() + (1 - b2) * g * g
        bc1, bc2 = 1 - b1 ** t, 1 - b2 ** t
        upd = LR * (mn / bc1) / (np.sqrt(vn / bc2) + self.eps)
        if self.c is not None and not self.c.get("no_bound"):
            r = b1 * b1 / b2
            K = ((1 - b1) ** 2 * ((1 - r ** t) / (1 - r)) / (1 - b2)) ** 0.5
            bound = LR * 1.00390625 * K * bc2 ** 0.5 / bc1
            self.clamped += int((np.abs(upd) > bound).sum())
            self.total += upd.size
            upd = np.clip(upd, -bound, bound)
        self.m.set(mn, t, self.B)
        self.v.set(vn, t, self.B)
        return upd


def outlier(c, seed=0, info=None):
    rng = np.random.default_rng(seed)
    n = 256 * G
    big = np.zeros(n, bool)
    big[::G] = True
    ref, q = Adam(n, None), Adam(n, c)
    pr, pq = np.zeros(n), np.zeros(n)
    for _ in range(1000):
        g = np.where(big, rng.standard_normal(n), 1e-3 * rng.standard_normal(n))
        pr -= ref.step(g)
        pq -= q.step(g)
    s = ~big
    if info is not None:
        info["outlier"] = q.clamped / max(q.total, 1)
    return pq[s].mean() / LR, np.abs(pq[s]).max() / np.abs(pr[s]).max()


def absent(c, b2, seed=0, width=64):
    rng = np.random.default_rng(seed)
    n = 64 * 64
    odd = (np.arange(n) // width) % 2 == 1
    steps = int(min(3000, np.ceil(np.log(1e-6) / np.log(b2))))
    ref, q = Adam(n, None, b2=b2), Adam(n, c, b2=b2)
    for t in range(200 + steps):
        g = rng.standard_normal(n)
        if t >= 200:
            g = np.where(odd, 0.0, g)
        ref.step(g)
        q.step(g)
    vr, vq = ref.v.get()[odd].mean(), q.v.get()[odd].mean()
    g = rng.standard_normal(n)
    ur, uq = np.abs(ref.step(g)[odd]).mean(), np.abs(q.step(g)[odd]).mean()
    return vq / vr, uq / ur


def small(c, seed=0):
    rng = np.random.default_rng(seed)
    n = 256 * G
    big = np.zeros(n, bool)
    big[::G] = True
    sc = np.where(big, 1.0, 10 ** rng.uniform(-3, -2, n))
    ref, q = Adam(n, None), Adam(n, c)
    pr, pq = np.zeros(n), np.zeros(n)
    for t in range(1000):
        g = sc * rng.standard_normal(n)
        if t >= 100:
            g = np.where(big, g, 0.0)
        r, qq = ref.step(g), q.step(g)
        if t >= 100:
            pr -= r
            pq -= qq
    s = ~big
    return np.abs(pq[s]).max() / LR, np.abs(pr[s]).max() / LR


def stopped(c, seed=0, block=G, factor=2):
    rng = np.random.default_rng(seed)
    n = 256 * G
    stop = np.zeros(n, bool)
    stop[::G] = True
    sc = (10 ** rng.uniform(-3, 0, n // block)).repeat(block)
    ref, q = Adam(n, None), Adam(n, c)
    pr, pq = np.zeros(n), np.zeros(n)
    for t in range(1200):
        g = sc * rng.standard_normal(n)
        if t >= 200:
            g = np.where(stop, 0.0, g)
        r, qq = ref.step(g), q.step(g)
        if t >= 200:
            pr -= r
            pq -= qq
    rat = np.abs(pq[stop]) / np.maximum(np.abs(pr[stop]), 1e-12)
    over = np.abs(pq[stop]) - np.maximum(factor * np.abs(pr[stop]), np.abs(pr[stop]) + LR)
    return np.median(rat), rat.max(), over.max() <= 0


def sgd_stopped(c, seed=0, lr=1e-2, mu=0.9, factors=None):
    """SGD momentum (0.9, lr 1e-2), the m code of c: 256 weights (one per two
    groups) stop after 200 steps; how many then move farther than max(2x
    fp32's move, fp32's + lr) over 1000 steps (the bar of the kernels' test);
    with factors, the counts over max(f x fp32's move, fp32's + lr) for each f."""
    rng = np.random.default_rng(seed)
    n = 16384
    stop = np.zeros(n, bool)
    stop[::64] = True
    st = State(n, c["m"](), 0, c.get("G", G), 0 if c.get("streams") else None)
    m32, p32, pq = np.zeros(n), np.zeros(n), np.zeros(n)
    for t in range(1, 1201):
        g = rng.standard_normal(n)
        if t > 200:
            g = np.where(stop, 0.0, g)
        m32 = mu * m32 + g
        mq = mu * st.get() + g
        if t > 200:
            p32 -= lr * m32
            pq -= lr * mq
        st.set(mq, t, c.get("B"))
    r, f = np.abs(pq[stop]), np.abs(p32[stop])
    if factors is not None:
        return tuple(int((r > np.maximum(k * f, f + lr)).sum()) for k in factors)
    return int((r > np.maximum(2 * f, f + lr)).sum())


def noise(c, seed=0, info=None, spread=3):
    rng = np.random.default_rng(seed)
    n = 4096
    sc = np.exp(rng.uniform(-spread, 0, n))
    ref, q = Adam(n, None), Adam(n, c)
    tr = tq = 0
    for _ in range(300):
        g = sc * rng.standard_normal(n) + 0.1 * sc
        tr = tr + ref.step(g)
        tq = tq + q.step(g)
    if info is not None:
        info["noise"] = q.clamped / max(q.total, 1)
    return ((tq - tr) ** 2).sum() / (tr ** 2).sum()


PHASE = 3462  # round(0.2113 * 2^14): u_v = frac(u + 0.2113)


def mf(E, M, signed, zf=False, stype="pow2", sub=False):
    return lambda: Minifloat(E, M, signed, zf, stype, sub)


E3M4 = mf(3, 4, True, sub=True)           # the shipped momentum code
E4M4 = mf(4, 4, False, True, sub=True)    # the shipped second-moment code
WEYL = 10127  # a rotation in time in place of the step hash
CANDIDATES = {
    "shipped (FlashOptim's codes, dither in time)": dict(
        m=lambda: Linear(True), v=lambda: Linear(False), B=10125),
    "+phase": dict(m=lambda: Linear(True), v=lambda: Linear(False), phase=PHASE, B=10125),
    "+phase+ru": dict(m=lambda: Linear(True, "ru"), v=lambda: Linear(False, "ru"),
                      phase=PHASE, B=10125),
    "+phase+ru+zf": dict(m=lambda: Linear(True, "ru"), v=lambda: Linear(False, "ru", True),
                         phase=PHASE, B=10125),
    "softsign (bf16 scale)/e4m4 (ships)": dict(m=lambda: Linear(True, "bf16"), v=E4M4,
                                                phase=PHASE),
    "softsign/e4m4, dither rotating in time": dict(m=lambda: Linear(True, "bf16"), v=E4M4,
                                                   phase=PHASE, B=WEYL),
    "e3m4/e4m4": dict(m=E3M4, v=E4M4, phase=PHASE),
    "e3m4/e4m4, no phase": dict(m=E3M4, v=E4M4),
    "e3m4/e4m4, dither rotating in time": dict(m=E3M4, v=E4M4, phase=PHASE, B=WEYL),
    "e3m4/e4m4, bf16 scales rounded up": dict(m=mf(3, 4, True, stype="bf16", sub=True),
                                              v=mf(4, 4, False, True, "bf16", sub=True),
                                              phase=PHASE),
    "e2m5/e4m4": dict(m=mf(2, 5, True, sub=True), v=E4M4, phase=PHASE),
    "e3m4/e5m3": dict(m=E3M4, v=mf(5, 3, False, True), phase=PHASE),
    "e4m3/e5m3": dict(m=mf(4, 3, True), v=mf(5, 3, False, True), phase=PHASE),
    "e3m4 without subnormals/e4m4": dict(m=mf(3, 4, True), v=E4M4, phase=PHASE),
    "e3m4/e4m4 without subnormals": dict(m=E3M4, v=mf(4, 4, False, True), phase=PHASE),
}


def main(names):
    print("| candidate | outlier drift (lr) | outlier max / fp32 | absent v, upd / fp32 "
          "(b2 .999) | (b2 .9995) | (b2 .9999) | small max (lr; fp32) | stopped median, "
          "max x fp32 (bound holds) | SGD stopped over the bar (of 256) | noise NMSE |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for k in names:
        c = CANDIDATES[k]
        od, om = outlier(c)
        ab = [absent(c, b) for b in (0.999, 0.9995, 0.9999)]
        sm, smr = small(c)
        smed, smax, ok = stopped(c)
        print(f"| {k} | {od:+.2f} | {om:.2f} | " +
              " | ".join(f"{v:.2f}, {u:.2f}" for v, u in ab) +
              f" | {sm:.1f} ({smr:.1f}) | {smed:.2f}, {smax:.2f} ({'yes' if ok else 'no'}) | "
              f"{sgd_stopped(c)} | {noise(c):.1e} |", flush=True)


# ---- 4-bit states (docs/design/4bit-states.md §3.4; docs/NUMERICS.md §8.6) ----

# Li et al.'s dynamic-exponent map, torchao's create_dynamic_map(True, 3, 4)
DE = [0.0, 1.0] + [s * x for x in (.0055, .0325, .0775, .2125, .4375, .6625, .8875)
                   for s in (1, -1)]
LINEAR_ZF = [k / 16 for k in range(1, 17)]  # torchao's 4-bit v: linspace(0, 1, 17)[1:]
M4 = {
    "e2m1": mf(2, 1, True, sub=True),
    "e3m0": mf(3, 0, True, sub=True),  # M = 0: dithered between 0 and 2^-6 as §2d's bits
    "DE": lambda: Nearest(Table(DE)),
    "DE dithered": lambda: Table(DE),
}
V4 = {
    "e3m1": mf(3, 1, False, True, sub=True),
    "e4m0": mf(4, 0, False, True, sub=True),
    "linear-zf": lambda: Nearest(Table(LINEAR_ZF)),
}
BETA2_4 = (0.99, 0.999, 0.9999)  # design §8 T2's


def cands4():
    c = {"8-bit: softsign (bf16 scale)/e4m4 (ships), G 32":
         dict(CANDIDATES["softsign (bf16 scale)/e4m4 (ships)"])}
    for g in (32, 64, 128):
        for mn, m in M4.items():
            for vn, v in V4.items():
                c[f"{mn}/{vn}, G {g}"] = dict(m=m, v=v, G=g, streams=True)
    c["e2m1/e3m1, G 32, shared hash + 0.2113 phase"] = dict(m=M4["e2m1"], v=V4["e3m1"],
                                                            G=32, phase=PHASE)
    for mn, vn in (("e2m1", "e3m1"), ("e3m0", "e4m0")):
        c[f"{mn}/{vn}, G 32, round to nearest"] = dict(
            m=lambda m=M4[mn]: Nearest(m()), v=lambda v=V4[vn]: Nearest(v()), G=32)
    c["torchao AdamW4bit-like: DE/linear-zf, G 128, no bound"] = dict(
        m=M4["DE"], v=V4["linear-zf"], G=128, no_bound=True)
    # not a design candidate: v's scale f32 absmax/top (not a power of two), so a
    # group's decay is carried by the scale instead of the dithered codes
    f32v, f32m = mf(3, 1, False, True, "f32", sub=True), mf(3, 0, True, stype="f32", sub=True)
    for mn in ("e2m1", "e3m0"):
        c[f"{mn}/e3m1 (v: f32 scale), G 32"] = dict(m=M4[mn], v=f32v, G=32, streams=True)
    for g in (32, 64, 128):
        c[f"e3m0/e3m1 (both f32 scales), G {g}"] = dict(m=f32m, v=f32v, G=g, streams=True)
    return c


_RARE = {}


def rare(c, steps=400, lr=1e-3, wd=1e-2):
    """compare.py's rare-input MLP (digits, 64-256-10, AdamW lr 1e-3, decay 1e-2,
    400 steps of 64) with this file's Adam (each tensor padded to whole groups of
    128): the largest first-layer move and the test loss."""
    import torch
    from sklearn.datasets import load_digits
    from torch import nn
    torch.set_num_threads(1)
    if "data" not in _RARE:
        d = load_digits()
        _RARE["data"] = (torch.tensor(d.images, dtype=torch.float32).flatten(1) / 16.0,
                         torch.tensor(d.target))
    X, Y = _RARE["data"]
    perm = torch.randperm(len(Y), generator=torch.Generator().manual_seed(0))
    tr, te = perm[:1400], perm[1400:]
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    w0 = model[0].weight.detach().clone()
    ps = list(model.parameters())
    pad = [-(-p.numel() // 128) * 128 for p in ps]
    opts = [Adam(n, c) for n in pad]
    gen = torch.Generator().manual_seed(2)
    for _ in range(steps):
        idx = tr[torch.randint(0, len(tr), (64,), generator=gen)]
        for p in ps:
            p.grad = None
        nn.functional.cross_entropy(model(X[idx]), Y[idx]).backward()
        with torch.no_grad():
            for p, n, o in zip(ps, pad, opts):
                g = np.zeros(n)
                g[:p.numel()] = p.grad.double().numpy().reshape(-1)
                u = o.step(g)[:p.numel()].reshape(p.shape)
                p.mul_(1 - lr * wd).sub_(torch.from_numpy(u).float())
    with torch.no_grad():
        loss = float(nn.functional.cross_entropy(model(X[te]), Y[te]))
    return float((model[0].weight.detach() - w0).abs().max()), loss


def bars4(od, om, ab, smed, smax, sok, sgd3):
    """The design's §8 T2 bars that fail."""
    f = []
    if abs(od) > 5 or om > 3:
        f.append("outlier")
    if any(not (0.8 <= x <= 1.25) for vu in ab for x in vu):
        f.append("absent")
    if not (0.8 <= smed <= 1.25) or not sok:
        f.append("stopped")
    if sgd3:
        f.append("SGD")
    return f


def main4(names, seeds=(0, 1, 2)):
    cands = cands4()
    rw, rl = rare(None)
    print(f"fp32 (this file's Adam, float64 states) on the rare-input MLP: largest "
          f"first-layer move {rw:.3g}, test loss {rl:.4f}")
    print("| candidate | outlier drift (lr) | outlier max / fp32 | absent v, upd / fp32 "
          "(b2 .99) | (b2 .999) | (b2 .9999) | small max (lr; fp32) | stopped median, "
          "max x fp32 (bar) | SGD stopped over the bar (3x; 2x) | noise NMSE (seeds "
          f"{', '.join(map(str, seeds))}) | NMSE, equal scales | clamped % (outlier; noise) | "
          "rare max / fp32 (test loss) | bars failed |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for k in names:
        c, info = cands[k], {}
        od, om = outlier(c, info=info)
        ab = [absent(c, b, width=128) for b in BETA2_4]
        sm, smr = small(c)
        smed, smax, sok = stopped(c, block=128, factor=3)
        s3, s2 = sgd_stopped(c, factors=(3, 2))
        nm, share = [], []
        for s in seeds:
            nm.append(noise(c, s, info))
            share.append(info["noise"])
        info["noise"] = np.mean(share)
        ne = noise(c, 0, spread=0)
        w, l = rare(c)
        fails = bars4(od, om, ab, smed, smax, sok, s3)
        print(f"| {k} | {od:+.2f} | {om:.2f} | " +
              " | ".join(f"{v:.2f}, {u:.2f}" for v, u in ab) +
              f" | {sm:.1f} ({smr:.1f}) | {smed:.2f}, {smax:.2f} ({'holds' if sok else 'fails'})"
              f" | {s3}; {s2} | " + ", ".join(f"{x:.2e}" for x in nm) + f" | {ne:.2e}"
              f" | {100 * info['outlier']:.2f}; {100 * info['noise']:.2f} | "
              f"{w / rw:.2f} ({l:.4f}) | {', '.join(fails) or 'none'} |", flush=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--bits"]:
        if args[1:2] == ["8"]:
            main(args[2:] or list(CANDIDATES))
        elif args[1:2] == ["4"]:
            main4(args[2:] or list(cands4()))
        else:
            sys.exit("--bits takes 4 or 8")
    else:
        main(args or list(CANDIDATES))
