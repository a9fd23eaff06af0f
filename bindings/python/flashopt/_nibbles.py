"""4-bit state codes: packed bytes <-> one code per element.

libflashopt holds a 4-bit state's codes packed (docs/KERNEL-ABI.md "Packed
buffers"): two per byte, element 2k in the low nibble of byte k, element
2k + 1 in the high one, n codes in ceil(n/2) bytes, the pad nibble of an odd
n zero. Its buffers (flashopt_read_buffer) and checkpoints (safetensors U8
[ceil(n/2)], "packing": "nibbles:low-first") hold them flat like that.

The binding's state dicts pack per row instead (docs/PYTHON.md "The
optimizer state"): a parameter of >= 2 dims has its entry packed along the
last dimension, shape (*shape[:-1], ceil(shape[-1]/2)), with a zero pad
nibble per row when shape[-1] is odd, so FSDP2's Shard(0) row split and
DCP's resharding apply to the entry as to the parameter. 1-D and 0-D
parameters (FSDP chunks of them start at any element) keep one code per
byte, shape (numel,).

In between, the binding works on one code per element (uint8, 0..15):
split groups' codes cross ranks that way (_dtensor_state.py), and the
library boundary converts (_state.read_codes / write_codes).
"""

from __future__ import annotations

from typing import Sequence, Tuple

import torch


def packed_bytes(n: int) -> int:
    """Bytes of n packed codes."""
    return (n + 1) // 2


def unpack(t: torch.Tensor, n: int) -> torch.Tensor:
    """n codes (uint8, 0..15, one per element) from packed bytes `t`
    (flat, at least ceil(n/2) of them; the pad nibble is dropped)."""
    b = t.detach().reshape(-1).to(torch.uint8)
    if b.numel() < packed_bytes(n):
        raise ValueError(f"flashopt: {b.numel()} packed bytes hold fewer than {n} codes")
    b = b[:packed_bytes(n)]
    out = torch.stack((b & 0xF, b >> 4), dim=-1).reshape(-1)
    return out[:n].contiguous()


def check_codes(codes: torch.Tensor, what: str = "codes") -> None:
    """Raises ValueError unless `codes` are uint8 in 0..15."""
    if codes.dtype != torch.uint8:
        raise TypeError(f"flashopt: {what} are {codes.dtype}, 4-bit codes are torch.uint8")
    if codes.numel() and int(codes.max()) > 15:
        raise ValueError(f"flashopt: {what} hold {int(codes.max())}, not a 4-bit code "
                         f"(0..15)")


def pack(codes: torch.Tensor) -> torch.Tensor:
    """The packed bytes (flat, ceil(n/2)) of n codes (uint8, 0..15; any
    shape, flattened): even elements low, a zero pad nibble when n is odd."""
    c = codes.detach().reshape(-1)
    check_codes(c)
    if c.numel() % 2:
        c = torch.cat((c, c.new_zeros(1)))
    c = c.reshape(-1, 2)
    return (c[:, 0] | (c[:, 1] << 4)).contiguous()


def row_packed(shape: Sequence[int]) -> bool:
    """Whether a parameter of `shape` has its codes packed per row in state
    dicts (>= 2 dims), else one code per byte."""
    return len(shape) >= 2


def entry_shape(shape: Sequence[int]) -> Tuple[int, ...]:
    """The state-dict entry's shape of a 4-bit state of a parameter of
    `shape`: (*shape[:-1], ceil(shape[-1]/2)) for >= 2 dims, else
    (numel,)."""
    shape = tuple(int(d) for d in shape)
    if row_packed(shape):
        return (*shape[:-1], packed_bytes(shape[-1]))
    n = 1
    for d in shape:
        n *= d
    return (n,)


def pack_rows(codes: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """The state-dict entry (entry_shape(shape)) of the codes (one per
    element, row-major) of a tensor of `shape`."""
    shape = tuple(int(d) for d in shape)
    c = codes.detach().reshape(-1)
    check_codes(c)
    if not row_packed(shape):
        return c.contiguous().reshape(entry_shape(shape))
    C = shape[-1]
    rows = c.reshape(-1, C)
    if C % 2:
        rows = torch.cat((rows, rows.new_zeros(rows.shape[0], 1)), dim=1)
    rows = rows.reshape(rows.shape[0], -1, 2)
    out = rows[..., 0] | (rows[..., 1] << 4)
    return out.reshape(entry_shape(shape)).contiguous()


def unpack_rows(t: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """The codes (flat, one per element, row-major) of a state-dict entry
    `t` of a tensor of `shape` (the inverse of pack_rows; pad nibbles
    dropped). `shape` may be a shard's: whole rows of the parameter."""
    shape = tuple(int(d) for d in shape)
    if tuple(t.shape) != entry_shape(shape):
        raise ValueError(f"flashopt: a packed 4-bit entry of shape {tuple(t.shape)} for a "
                         f"tensor of shape {shape}: expected {entry_shape(shape)}")
    b = t.detach().to(torch.uint8)
    if not row_packed(shape):
        out = b.reshape(-1).contiguous()
        check_codes(out)
        return out
    C = shape[-1]
    rows = b.reshape(-1, packed_bytes(C))
    out = torch.stack((rows & 0xF, rows >> 4), dim=-1).reshape(rows.shape[0], -1)[:, :C]
    return out.reshape(-1).contiguous()
