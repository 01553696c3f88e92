"""The weighted slot pool's policy, exhaustively on small pools (pure, no Redis)."""

from __future__ import annotations

import itertools

import pytest

from splatq.shared.engine.keys import StreamName
from splatq.shared.engine.slots import SlotPool, reserve_slots

INT, SYN = StreamName.INTERACTIVE, StreamName.SYNTHESIS


def test_default_split_is_seventy_thirty() -> None:
    """10 slots at the 0.7 default: 7 interactive, 3 synthesis."""
    assert reserve_slots(10, 0.7) == {INT: 7, SYN: 3}


@pytest.mark.parametrize("total", range(2, 40))
def test_each_stream_keeps_a_slot_when_shares_are_fractional(total: int) -> None:
    """No stream is starved of reservations by rounding."""
    r = reserve_slots(total, 0.7)
    assert r[INT] >= 1
    assert r[SYN] >= 1
    assert r[INT] + r[SYN] == total


def test_synthesis_uses_every_slot_when_interactive_is_idle() -> None:
    """No slot idles while synthesis work waits."""
    pool = SlotPool.create(10, 0.7)
    while pool.capacity(SYN):
        pool.acquire(SYN)
    assert pool.running[SYN] == 10


def test_interactive_starts_even_when_synthesis_borrowed_everything() -> None:
    """A flood of long synthesis jobs never blocks interactive work: reservations hold."""
    pool = SlotPool.create(10, 0.7)
    pool.acquire(SYN, 10)
    assert pool.capacity(INT) == 7
    assert pool.capacity(SYN) == 0


def test_borrower_admits_nothing_until_back_within_the_pool() -> None:
    """After an owner reclaims, the borrower waits until the pool is within its size."""
    pool = SlotPool.create(10, 0.7)
    pool.acquire(SYN, 10)
    pool.acquire(INT, 7)
    for _ in range(7):
        pool.release(SYN)
        assert pool.capacity(SYN) == 0
    pool.release(SYN)  # 2 synthesis left: below its reservation of 3
    assert pool.capacity(SYN) == 1


@pytest.mark.parametrize("total", [1, 2, 3, 5, 10])
def test_overcommit_is_bounded_by_the_reservations(total: int) -> None:
    """Following the fetch plan, running jobs never exceed total + the larger reservation."""
    reserved = reserve_slots(total, 0.7)
    bound = total + max(reserved.values())
    for start_i, start_s in itertools.product(range(total + 1), repeat=2):
        if start_i + start_s > total:
            continue
        pool = SlotPool.create(total, 0.7)
        pool.acquire(INT, start_i)
        pool.acquire(SYN, start_s)
        for stream in (INT, SYN):
            pool.acquire(stream, pool.guaranteed_counts()[stream])
        for stream in (INT, SYN):
            pool.acquire(stream, pool.idle)
        assert pool.in_use <= bound


def test_release_more_than_acquired_is_a_bug() -> None:
    pool = SlotPool.create(4, 0.5)
    with pytest.raises(RuntimeError):
        pool.release(INT)
