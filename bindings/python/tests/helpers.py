"""Shared helpers of the binding's tests."""

import torch


def rel_inf(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b| (fp32)."""
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def cos_nmse(x: torch.Tensor, ref: torch.Tensor):
    x, ref = x.detach().double().flatten(), ref.detach().double().flatten()
    cos = float(torch.nn.functional.cosine_similarity(x, ref, dim=0))
    nmse = float(((x - ref) ** 2).mean() / (ref ** 2).mean())
    return cos, nmse


def make_params(seed=0, dtype=torch.float32, sizes=((7, 13), (33,), (64, 65), (1,))):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g).to(dtype).requires_grad_() for s in sizes]


def grads_for(step, params, scale=0.1):
    g = torch.Generator().manual_seed(1000 + step)
    return [torch.randn(p.shape, generator=g) * scale for p in params]


def set_grads(params, step):
    """Step `step`'s gradients (grads_for) in each parameter's dtype."""
    for p, g in zip(params, grads_for(step, params)):
        p.grad = g.to(p.dtype)


def train(opt, params, steps, start=0):
    """`steps` optimizer steps on set_grads' gradients, from step `start`."""
    for s in range(start, start + steps):
        set_grads(params, s)
        opt.step()


class RefSGDW:
    """SGDW as flashopt and FlashOptim define it (numerics.md §3.5, §3.3),
    in fp32 torch ops: θ ← θ·(1 − lr·wd); m ← μ·m + (1−d)·g; θ ← θ − lr·m."""

    def __init__(self, params, lr, momentum, weight_decay, dampening=0.0, nesterov=False):
        self.p, self.lr, self.mu, self.wd = params, lr, momentum, weight_decay
        self.d, self.nesterov = dampening, nesterov
        self.m = [torch.zeros_like(p) for p in params]

    @torch.no_grad()
    def step(self):
        f = torch.float32
        lr, mu = torch.tensor(self.lr, dtype=f), torch.tensor(self.mu, dtype=f)
        one = torch.tensor(1.0, dtype=f)
        w = torch.tensor(self.lr * self.wd, dtype=f)
        for p, m in zip(self.p, self.m):
            g = p.grad
            m.copy_(m * mu + g * (one - torch.tensor(self.d, dtype=f)))
            p.copy_(p * (one - w))
            if self.nesterov:
                p.copy_(p - (g + mu * m) * lr)
            else:
                p.copy_(p - m * lr)


class RefLion:
    """Lion as numerics.md §3.6, in fp32 torch ops."""

    def __init__(self, params, lr, betas, weight_decay):
        self.p, self.lr, self.betas, self.wd = params, lr, betas, weight_decay
        self.m = [torch.zeros_like(p) for p in params]

    @torch.no_grad()
    def step(self):
        f = torch.float32
        b1, b2 = (torch.tensor(b, dtype=f) for b in self.betas)
        one = torch.tensor(1.0, dtype=f)
        lr = torch.tensor(self.lr, dtype=f)
        w = torch.tensor(self.lr * self.wd, dtype=f)
        for p, m in zip(self.p, self.m):
            g = p.grad
            u = torch.sign(m * b1 + g * (one - b1))
            m.copy_(m * b2 + g * (one - b2))
            p.copy_(p * (one - w))
            p.copy_(p - u * lr)
