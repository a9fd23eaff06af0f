"""CUDA tensors through a CUDA context: the same steps as on the CPU, bit for
bit (the kernels of one spec agree across back ends). GPU only: skipped with
a message where torch sees no GPU."""

import pytest
import torch

import flashopt
from helpers import grads_for, make_params

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(),
                               reason="GPU only: torch sees no CUDA device on this machine")


@needs_gpu
@pytest.mark.parametrize("cls,kw", [(flashopt.FlashAdamW, {}), (flashopt.FlashSGD,
                                                               {"momentum": 0.9}),
                                    (flashopt.FlashLion, {})])
def test_cuda_step_matches_cpu(cls, kw):
    cpu = make_params(20, torch.bfloat16)
    gpu = [p.detach().cuda().requires_grad_() for p in cpu]
    oc, og = cls(cpu, lr=1e-2, **kw), cls(gpu, lr=1e-2, **kw)
    for s in range(5):
        for pc, pg, g in zip(cpu, gpu, grads_for(s, cpu)):
            pc.grad = g.to(torch.bfloat16)
            pg.grad = g.to(torch.bfloat16).cuda()
        oc.step()
        og.step()
    for a, b in zip(cpu, gpu):
        assert torch.equal(a.detach(), b.detach().cpu())
    for a, b in zip(cpu, gpu):
        assert torch.equal(oc.export_master(a), og.export_master(b).cpu())
