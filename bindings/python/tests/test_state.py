"""_state.py: what the binding assumes of libflashopt's checkpoint format
(runtime/src/checkpoint), pinned against checkpoints the library writes."""

import json

import pytest
import torch

import flashopt
from flashopt import _lib as L
from flashopt import _state
from helpers import grads_for, make_params


def stepped(opt_cls=flashopt.FlashAdamW, dtype=torch.float32, steps=3, **kw):
    ps = make_params(30, dtype)
    opt = opt_cls(ps, lr=1e-2, **kw)
    for s in range(steps):
        for p, g in zip(ps, grads_for(s, ps)):
            p.grad = g.to(p.dtype)
        opt.step()
    return opt, ps


def test_safetensors_bytes_round_trip():
    t = {"a": torch.arange(6, dtype=torch.int8).reshape(2, 3), "b": torch.ones(4)}
    data = _state.write(t, {"k": "v"})
    back, meta = _state.read(data)
    assert meta == {"k": "v"}
    assert set(back) == {"a", "b"} and all(torch.equal(back[k], t[k]) for k in t)


def test_the_library_writes_what_state_py_reads():
    opt, ps = stepped()
    (b,) = opt._bundle_list()
    f32, meta = _state.read(b.checkpoint_bytes(L.CHECKPOINT_F32))
    # __metadata__: per-parameter records with name and step; the step; checksums.
    params = json.loads(meta["params"])
    assert [e["name"] for e in params] == b.names == [f"p{i}" for i in range(len(ps))]
    assert all(e["step"] == 3 for e in params) and meta["step"] == "3"
    assert set(json.loads(meta["checksums"])) == set(f32)
    assert "metadata_checksum" in meta and meta["checkpoint"] == "f32"
    # Tensors: "<param>" (the fp32 master) and "<param>.<state>" for each
    # stored state (f32_checkpoint_from_torch_state writes those names).
    assert {k for k in f32 if k.split(".")[0] == "p0"} == \
        {"p0", *(f"p0.{s}" for s in b.state_names)} == {"p0", "p0.exp_avg", "p0.exp_avg_sq"}
    assert f32["p0"].dtype == torch.float32 and f32["p0.exp_avg"].numel() == ps[0].numel()
    exact, meta = _state.read(b.checkpoint_bytes(L.CHECKPOINT_COMPRESSED))
    assert meta["checkpoint"] == "compressed"
    # The compressed form: "<param>" and "<param>.<buffer>" for each buffer
    # the library describes (codes and scales, no fp32 state).
    assert {k for k in exact if k.split(".")[0] == "p0"} == \
        {"p0", *(f"p0.{n}" for n, _, _ in b.buffers())}
    assert any(k.endswith(".codes") for k in exact) and "p0.exp_avg" not in exact


def test_rewritten_steps_load_and_stale_checksums_do_not():
    opt, ps = stepped()
    (b,) = opt._bundle_list()
    tensors, meta = _state.read(b.checkpoint_bytes(L.CHECKPOINT_F32))
    steps = {"p0": 7, "p2": 1}
    m = _state.with_steps(meta, steps)
    got = {e["name"]: e["step"] for e in json.loads(m["params"])}
    assert got == {"p0": 7, "p1": 3, "p2": 1, "p3": 3} and m["step"] == "7"
    # The library checks the metadata checksum: edited metadata needs it gone.
    with pytest.raises(flashopt.FlashOptError, match="metadata_checksum|checksum"):
        b.load_checkpoint_bytes(_state.write(tensors, m))
    clean = _state.without_checksums(m)
    assert "checksums" not in clean and "metadata_checksum" not in clean
    b.load_checkpoint_bytes(_state.write(tensors, clean))
    assert [b.get_step(i) for i in range(4)] == [7, 3, 1, 3]


def test_changed_tensors_need_the_checksums_gone():
    opt, ps = stepped(quantize=False)  # fp32 states load as they are
    (b,) = opt._bundle_list()
    tensors, meta = _state.read(b.checkpoint_bytes(L.CHECKPOINT_F32))
    tensors["p1.exp_avg"] = tensors["p1.exp_avg"] + 1
    with pytest.raises(flashopt.FlashOptError):
        b.load_checkpoint_bytes(_state.write(tensors, meta))
    b.load_checkpoint_bytes(_state.write(tensors, _state.without_checksums(meta)))
    again, _ = _state.read(b.checkpoint_bytes(L.CHECKPOINT_F32))
    assert torch.equal(again["p1.exp_avg"], tensors["p1.exp_avg"])


def test_state_dict_layout():
    opt, ps = stepped(flashopt.FlashSGD, momentum=0.9)
    sd = opt.state_dict()
    # Only torch's keys: tools that keep "state" and "param_groups" keep all.
    assert set(sd) == {"state", "param_groups"}
    (b,) = opt._bundle_list()
    assert [n for n, _, _ in b.buffers()] == ["momentum_buffer.codes", "momentum_buffer.scales"]
    assert set(sd["state"][0]) == {"step", "flashopt.spec", "momentum_buffer.codes",
                                   "momentum_buffer.scales"}
    assert set(opt.state_dict(fp32_states=True)["state"][0]) == {"step", "momentum_buffer"}


def test_nibbles_pack_low_first_with_a_zero_pad():
    from flashopt import _nibbles as N
    codes = torch.tensor([1, 2, 3, 4, 15], dtype=torch.uint8)
    assert N.pack(codes).tolist() == [0x21, 0x43, 0x0F]  # even low, pad nibble 0
    assert N.pack(codes[:4]).tolist() == [0x21, 0x43]
    assert torch.equal(N.unpack(N.pack(codes), 5), codes)
    assert torch.equal(N.unpack(torch.tensor([0xF1], dtype=torch.uint8), 1), codes[:1] * 0 + 1)
    with pytest.raises(ValueError, match="not a 4-bit code"):
        N.pack(torch.tensor([16], dtype=torch.uint8))
    with pytest.raises(ValueError, match="fewer than 5"):
        N.unpack(torch.zeros(2, dtype=torch.uint8), 5)
    # Rows: packed along the last dimension, a pad nibble per odd row; 1-D
    # and 0-D one code per byte.
    g = torch.Generator().manual_seed(0)
    for shape in ((3, 5), (2, 3, 4), (4, 1), (7,), (1,), ()):
        c = torch.randint(0, 16, shape, generator=g, dtype=torch.uint8)
        e = N.pack_rows(c, shape)
        assert tuple(e.shape) == N.entry_shape(shape)
        assert torch.equal(N.unpack_rows(e, shape), c.reshape(-1))
    assert N.entry_shape((3, 5)) == (3, 3) and N.entry_shape((2, 3, 4)) == (2, 3, 2)
    assert N.entry_shape((7,)) == (7,) and N.entry_shape(()) == (1,)
    e = N.pack_rows(torch.full((2, 3), 15, dtype=torch.uint8), (2, 3))
    assert e.tolist() == [[0xFF, 0x0F], [0xFF, 0x0F]]
    with pytest.raises(ValueError, match="expected"):
        N.unpack_rows(torch.zeros(3, 2, dtype=torch.uint8), (3, 5))


def test_four_bit_checkpoints_pack_flat_and_read_codes_unpacks():
    # The library's compressed checkpoint holds U8 [ceil(n/2)] per 4-bit
    # state (docs/RUNTIME.md); read_codes gives a code per element and
    # write_codes packs them back to bytes the library loads unchanged.
    opt, ps = stepped(state_bits=4)
    (b,) = opt._bundle_list()
    data = b.checkpoint_bytes(L.CHECKPOINT_COMPRESSED)
    raw, meta = _state.read(data)
    assert meta["packing"] == "nibbles:low-first"
    assert "exp_avg=quantized:i4" in meta["state_encodings"]
    codes, _ = _state.read_codes(b, data)
    for i, p in enumerate(ps):
        n = p.numel()
        for name in ("exp_avg.codes", "exp_avg_sq.codes"):
            key = f"p{i}.{name}"
            assert raw[key].dtype == torch.uint8 and raw[key].shape == ((n + 1) // 2,)
            assert torch.equal(raw[key], b.read_buffer(i, name))
            assert codes[key].shape == (n,) and int(codes[key].max()) <= 15
        assert torch.equal(codes[f"p{i}.exp_avg.scales"], raw[f"p{i}.exp_avg.scales"])
    again = _state.write_codes(b, codes, _state.without_checksums(meta))
    back, _ = _state.read(again)
    assert all(torch.equal(back[k], raw[k]) for k in raw)
    before = {n: b.read_buffer(0, n) for n, _, _ in b.buffers()}
    b.load_checkpoint_bytes(again)
    assert all(torch.equal(b.read_buffer(0, n), v) for n, v in before.items())
    codes["p0.exp_avg.codes"] = codes["p0.exp_avg.codes"][:-1]
    with pytest.raises(ValueError, match="p0.exp_avg.codes holds"):
        _state.write_codes(b, codes, meta)
