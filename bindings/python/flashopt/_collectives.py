"""Errors every rank learns: a rank's failure raised on every rank.

A step, a registration or a load of DTensor parameters can fail on one rank
only (a piece the device cannot address, a state entry of the wrong shape).
If that rank raised alone, the others would wait forever in the next
collective. So each rank runs its part, and then all of them exchange their
error text at the same point (one all_gather_object) and raise together,
naming the first rank that failed.
"""

from __future__ import annotations

from typing import Callable, Optional, Tuple, TypeVar

import torch.distributed as dist

T = TypeVar("T")


def first_rank_error(err: str, group, world: int) -> Optional[Tuple[int, str]]:
    """Every rank's error message ("" for none), gathered: the first rank
    that has one and its message, or None. Each rank calls it at the same
    point, so all of them raise together and none waits in a collective."""
    got = [None] * world
    dist.all_gather_object(got, err, group=group)
    for q, e in enumerate(got):
        if e:
            return q, e
    return None


def raise_on_every_rank(err: str, group, world: int,
                        error: Callable[[int, str], BaseException]) -> None:
    """Collective: when some rank's `err` is not empty, every rank raises
    error(the first such rank, its message)."""
    failed = first_rank_error(err, group, world)
    if failed:
        raise error(*failed)


def on_every_rank(run: Callable[[], T], group, world: int,
                  error: Callable[[int, str], BaseException]) -> Optional[T]:
    """Collective: run() on this rank; when it raised on some rank, every
    rank raises error(the first such rank, "<exception type>: <message>").
    Returns run()'s result."""
    err, out = "", None
    try:
        out = run()
    except Exception as e:
        err = f"{type(e).__name__}: {e}"
    raise_on_every_rank(err, group, world, error)
    return out
