"""Where PyTorch users train: transformers.Trainer (with checkpoint and
resume), torch.compile and bf16 autocast, each with FlashAdamW. A small
randomly initialized GPT-2 (no hub download)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

import flashopt  # noqa: E402
from helpers import rel_inf  # noqa: E402

try:
    import transformers  # noqa: E402
except ImportError as e:  # a failure, not a skip: scripts/setup.sh installs it
    raise ImportError("flashopt tests: transformers is missing; run scripts/setup.sh") from e

VOCAB, SEQ = 96, 16


def gpt2(seed=0):
    cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=VOCAB,
                                  n_positions=SEQ, resid_pdrop=0.0, embd_pdrop=0.0,
                                  attn_pdrop=0.0)
    torch.manual_seed(seed)
    return transformers.GPT2LMHeadModel(cfg)


def dataset(n=48, seed=1):
    g = torch.Generator().manual_seed(seed)
    # A learnable pattern: each sequence counts up from a random start.
    starts = torch.randint(0, VOCAB, (n, 1), generator=g)
    ids = (starts + torch.arange(SEQ)) % VOCAB
    return [{"input_ids": x, "labels": x} for x in ids]


def trainer(model, opt, out, max_steps, **kw):
    args = transformers.TrainingArguments(
        output_dir=str(out), max_steps=max_steps, per_device_train_batch_size=8,
        learning_rate=3e-3, save_strategy="steps", save_steps=3, logging_steps=1,
        report_to=[], use_cpu=True, seed=0, data_seed=0, disable_tqdm=True,
        dataloader_num_workers=0, **kw)
    return transformers.Trainer(model=model, args=args, train_dataset=dataset(),
                                optimizers=(opt, None))


def losses(tr):
    return [e["loss"] for e in tr.state.log_history if "loss" in e]


def test_trainer_trains_gpt2_with_flash_adamw(tmp_path):
    model = gpt2()
    opt = flashopt.FlashAdamW(model.parameters(), lr=3e-3)
    tr = trainer(model, opt, tmp_path, 8)
    tr.train()
    ls = losses(tr)
    assert len(ls) == 8 and ls[-1] < ls[0] * 0.9
    assert opt.specs() == ["adamw_f32"]
    # Trainer's scheduler drives the lr (linear decay to 0).
    assert opt.param_groups[0]["lr"] < 3e-3


def test_trainer_checkpoint_and_resume_continue_bit_for_bit(tmp_path):
    """bf16 weights with 24-bit master weights and fp32 norm layers (two
    bundles): 6 steps straight equal 3 steps, a Trainer checkpoint, and a
    new Trainer resuming from it for 3 more."""
    def run(out, resume=None):
        model = flashopt.cast_model(gpt2(), torch.bfloat16)
        opt = flashopt.FlashAdamW(model.parameters(), lr=3e-3)
        tr = trainer(model, opt, out, 6)
        tr.train(resume_from_checkpoint=resume)
        return model, opt, tr

    full, opt, tr = run(tmp_path / "a")
    assert sorted(opt.specs()) == ["adamw_bf16_m24", "adamw_f32"]
    ckpt = tmp_path / "a" / "checkpoint-3"
    assert (ckpt / "optimizer.pt").is_file()
    # The compact state dict: bf16 weights' correction terms, codes and scales
    # (3.125 B/param), the fp32 norms' fp32 states (8), pickle's framing.
    n = sum(p.numel() for p in full.parameters())
    n32 = sum(p.numel() for p in full.parameters() if p.dtype == torch.float32)
    size = (ckpt / "optimizer.pt").stat().st_size
    assert size <= 3.125 * (n - n32) + 8 * n32 + 40_000, (size, n, n32)
    resumed, opt2, tr2 = run(tmp_path / "b", resume=str(ckpt))
    assert tr2.state.global_step == 6
    for (n, a), (_, b) in zip(full.named_parameters(), resumed.named_parameters()):
        assert torch.equal(a.detach(), b.detach()), n
    for a, b in zip(full.parameters(), resumed.parameters()):
        assert torch.equal(opt.export_master(a), opt2.export_master(b))
    assert losses(tr2)[-1] == losses(tr)[-1]


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.LayerNorm(64),
                               torch.nn.Linear(64, 10))


def batches(n=8):
    """A learnable task: the labels of a fixed random linear teacher."""
    g = torch.Generator().manual_seed(2)
    teacher = torch.randn(32, 10, generator=g)
    xs = [torch.randn(32, 32, generator=g) for _ in range(n)]
    return [(x, (x @ teacher).argmax(1)) for x in xs]


def train(model, opt, data, forward=None, autocast=None):
    forward = forward or model
    out = []
    for x, y in data:
        opt.zero_grad()
        if autocast is not None:
            with torch.autocast("cpu", dtype=autocast):
                loss = torch.nn.functional.cross_entropy(forward(x), y)
        else:
            loss = torch.nn.functional.cross_entropy(forward(x), y)
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out


def test_torch_compile_model_with_flash_adamw():
    torch._dynamo.reset()
    eager, comp = mlp(), mlp()
    oe = flashopt.FlashAdamW(eager.parameters(), lr=1e-2, quantize=False)
    oc = flashopt.FlashAdamW(comp.parameters(), lr=1e-2, quantize=False)
    data = batches()
    le = train(eager, oe, data)
    lc = train(comp, oc, data, forward=torch.compile(comp))
    assert lc[-1] < lc[0]
    # Inductor's fused kernels round differently from eager; the optimizer
    # steps the compiled model's parameters in place all the same.
    for a, b in zip(le, lc):
        assert abs(a - b) <= 1e-4 * abs(a), (le, lc)
    for a, b in zip(eager.parameters(), comp.parameters()):
        assert rel_inf(b, a) <= 1e-3


def test_bf16_autocast_with_fp32_params_matches_torch():
    """Gradients of a bf16 autocast forward are fp32, like the parameters:
    FlashAdamW steps them as torch's AdamW does, given the same gradients
    (a forward under autocast amplifies 1-ulp parameter differences, so the
    reference takes FlashAdamW's gradients rather than its own)."""
    mine, ref = mlp(), mlp()
    o = flashopt.FlashAdamW(mine.parameters(), lr=1e-2, quantize=False)
    r = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    assert o.specs() == ["adamw_f32_f32states"]
    seen = []
    for x, y in batches():
        o.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = mine(x)
            loss = torch.nn.functional.cross_entropy(out, y)
        assert out.dtype == torch.bfloat16
        loss.backward()
        assert all(p.grad.dtype == torch.float32 for p in mine.parameters())
        for a, b in zip(mine.parameters(), ref.parameters()):
            b.grad = a.grad.clone()
        o.step()
        r.step()
        seen.append(loss.item())
        # 1e-6 of the largest weight would do for most tensors; the LayerNorm
        # bias starts at 0 and is a few updates large, each rounded in
        # another order by torch (measured 1.9e-6 after 2 steps).
        for a, b in zip(mine.parameters(), ref.parameters()):
            assert rel_inf(a, b) <= 1e-5
    assert seen[-1] < seen[0]


def test_trainer_checkpoint_directory_size(tmp_path):
    """A whole Trainer checkpoint (model, optimizer.pt, scheduler, RNG and
    trainer state) of a 3.2 M-parameter GPT-2: flashopt's (bf16 weights,
    fp32 norms, 24-bit masters, the compact state dict) is at most 5.5
    B/param; torch AdamW's with fp32 weights is about 12."""
    def size(kind):
        cfg = transformers.GPT2Config(n_layer=4, n_head=4, n_embd=256, vocab_size=VOCAB,
                                      n_positions=SEQ, bos_token_id=0, eos_token_id=0)
        torch.manual_seed(0)
        model = transformers.GPT2LMHeadModel(cfg)
        if kind == "flashopt":
            flashopt.cast_model(model, torch.bfloat16)
            opt = flashopt.FlashAdamW(model.parameters(), lr=1e-3)
        else:
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        out = tmp_path / kind
        args = transformers.TrainingArguments(
            output_dir=str(out), max_steps=1, per_device_train_batch_size=4,
            save_strategy="steps", save_steps=1, report_to=[], use_cpu=True,
            disable_tqdm=True, dataloader_num_workers=0)
        transformers.Trainer(model=model, args=args, train_dataset=dataset(8),
                             optimizers=(opt, None)).train()
        d = out / "checkpoint-1"
        n = sum(p.numel() for p in model.parameters())
        return sum(f.stat().st_size for f in d.rglob("*") if f.is_file()) / n, n

    flash, n = size("flashopt")
    ref, _ = size("torch")
    print(f"Trainer checkpoint, {n} parameters: flashopt {flash:.2f} B/param, "
          f"torch AdamW {ref:.2f}")
    assert n > 3_000_000
    assert flash <= 5.5, flash
    assert ref >= 11.5, ref
