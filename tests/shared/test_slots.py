"""The weighted slot pool's policy, exhaustively on small pools (pure, no Redis)."""

from __future__ import annotations

import itertools

import pytest

from shared.keys import StreamName
from shared.slots import SlotPool, reserve_slots

I, S = StreamName.INTERACTIVE, StreamName.SYNTHESIS


def test_default_split_is_seventy_thirty() -> None:
    """10 slots at the 0.7 default: 7 interactive, 3 synthesis."""
    assert reserve_slots(10, 0.7) == {I: 7, S: 3}


@pytest.mark.parametrize("total", range(2, 40))
def test_each_stream_keeps_a_slot_when_shares_are_fractional(total: int) -> None:
    """No stream is starved of reservations by rounding."""
    r = reserve_slots(total, 0.7)
    assert r[I] >= 1 and r[S] >= 1 and r[I] + r[S] == total


def test_synthesis_uses_every_slot_when_interactive_is_idle() -> None:
    """No slot idles while synthesis work waits."""
    pool = SlotPool.create(10, 0.7)
    while pool.capacity(S):
        pool.acquire(S)
    assert pool.running[S] == 10


def test_interactive_starts_even_when_synthesis_borrowed_everything() -> None:
    """A flood of long synthesis jobs never blocks interactive work: reservations hold."""
    pool = SlotPool.create(10, 0.7)
    pool.acquire(S, 10)
    assert pool.capacity(I) == 7
    assert pool.capacity(S) == 0


def test_borrower_admits_nothing_until_back_within_the_pool() -> None:
    """After an owner reclaims, the borrower waits until the pool is within its size."""
    pool = SlotPool.create(10, 0.7)
    pool.acquire(S, 10)
    pool.acquire(I, 7)
    for _ in range(7):
        pool.release(S)
        assert pool.capacity(S) == 0
    pool.release(S)  # 2 synthesis left: below its reservation of 3
    assert pool.capacity(S) == 1


@pytest.mark.parametrize("total", [1, 2, 3, 5, 10])
def test_overcommit_is_bounded_by_the_reservations(total: int) -> None:
    """Following the fetch plan, running jobs never exceed total + the larger reservation."""
    reserved = reserve_slots(total, 0.7)
    bound = total + max(reserved.values())
    for start_i, start_s in itertools.product(range(total + 1), repeat=2):
        if start_i + start_s > total:
            continue
        pool = SlotPool.create(total, 0.7)
        pool.acquire(I, start_i)
        pool.acquire(S, start_s)
        for stream in (I, S):
            pool.acquire(stream, pool.guaranteed_counts()[stream])
        for stream in (I, S):
            pool.acquire(stream, pool.idle)
        assert pool.in_use <= bound


def test_release_more_than_acquired_is_a_bug() -> None:
    pool = SlotPool.create(4, 0.5)
    with pytest.raises(RuntimeError):
        pool.release(I)
