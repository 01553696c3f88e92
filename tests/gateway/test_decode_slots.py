"""DecodeSlots: per-tenant then per-process admission of decodes, bounded waits, and slots
held until the decode thread really ends (decode threads blocked on an Event, no sleeps)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator

import pytest

from splatq.services.gateway.decode_slots import DecodeSlots
from splatq.services.gateway.problems import ApiError
from splatq.shared.testing import eventually


class Gate:
    """A validator stand-in that blocks its decode thread until released."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.running = 0
        self.lock = threading.Lock()

    def __call__(self, data: bytes) -> bytes:
        with self.lock:
            self.running += 1
        try:
            self.release.wait(10)
        finally:
            with self.lock:
                self.running -= 1
        return data


@contextlib.asynccontextmanager
async def holding(
    slots: DecodeSlots, *tenants: str
) -> AsyncIterator[tuple[Gate, list[asyncio.Task[bytes]]]]:
    """One blocked decode per entry of `tenants` running on `slots`; always released after."""
    gate = Gate()
    held = [asyncio.create_task(slots.run(t, gate, t.encode())) for t in tenants]
    try:
        await eventually(lambda: gate.running == len(tenants), timeout=5, interval=0.01)
        yield gate, held
    finally:
        gate.release.set()
        await asyncio.gather(*held, return_exceptions=True)
        slots.close()


async def test_a_tenant_at_its_limit_gets_429_and_others_are_unaffected() -> None:
    """acme holds its 2 slots: its 3rd decode waits the bounded time then gets 429
    too_many_decodes, while beta decodes at once in the process's free slots."""
    slots = DecodeSlots(total=4, per_tenant=2, wait_s=0.3)
    async with holding(slots, "acme", "acme") as (gate, held):
        with pytest.raises(ApiError) as info:
            await slots.run("acme", gate, b"a")
        assert (info.value.status, info.value.code) == (429, "too_many_decodes")
        assert info.value.headers["Retry-After"] == "1"
        started = time.monotonic()
        assert await slots.run("beta", lambda data: data + b"!", b"b") == b"b!"
        assert time.monotonic() - started < 0.2  # beta never waited behind acme
        gate.release.set()
        assert await asyncio.gather(*held) == [b"acme", b"acme"]


async def test_a_full_process_answers_503_after_the_bounded_wait() -> None:
    """With every process slot taken by other tenants, a new tenant waits wait_s, then 503."""
    slots = DecodeSlots(total=2, per_tenant=1, wait_s=0.2)
    async with holding(slots, "acme", "beta") as (gate, held):
        with pytest.raises(ApiError) as info:
            await slots.run("gamma", gate, b"x")
        assert (info.value.status, info.value.code) == (503, "overloaded")
        gate.release.set()
        await asyncio.gather(*held)
        assert await slots.run("gamma", lambda data: data, b"ok") == b"ok"


async def test_a_canceled_request_keeps_its_slot_until_the_decode_thread_ends() -> None:
    """A client that disconnects mid-decode does not free the slot its thread still uses."""
    slots = DecodeSlots(total=1, per_tenant=1, wait_s=0.2)
    async with holding(slots, "acme") as (gate, held):
        held[0].cancel()
        with pytest.raises(asyncio.CancelledError):
            await held[0]
        with pytest.raises(ApiError) as info:
            await slots.run("acme", lambda data: data, b"y")
        assert info.value.code == "too_many_decodes"
        gate.release.set()
        await eventually(lambda: gate.running == 0, timeout=5, interval=0.01)
        await asyncio.sleep(0.05)  # the release is scheduled on the loop from the thread
        assert await slots.run("acme", lambda data: data, b"y") == b"y"


async def test_an_inline_decode_takes_the_same_slots_on_the_loop_thread() -> None:
    """run_inline calls the validator on the event loop's thread, under the same slots as
    run: a tenant whose slots are busy with pooled decodes gets 429 for an inline one too,
    and with every process slot busy another tenant's inline decode gets 503."""
    slots = DecodeSlots(total=2, per_tenant=1, wait_s=0.1)
    async with holding(slots, "acme") as (gate, _):
        with pytest.raises(ApiError) as info:
            await slots.run_inline("acme", gate, b"a")
        assert info.value.code == "too_many_decodes"
        assert gate.running == 1  # the inline validator never ran
        loop_thread = threading.get_ident()
        assert await slots.run_inline("beta", lambda d: (d, threading.get_ident()), b"b") == (
            b"b",
            loop_thread,
        )
    slots = DecodeSlots(total=2, per_tenant=1, wait_s=0.1)
    async with holding(slots, "acme", "beta"):
        with pytest.raises(ApiError) as info:
            await slots.run_inline("gamma", lambda d: d, b"c")
        assert info.value.code == "overloaded"


async def test_inline_decodes_release_their_slots_even_when_they_raise() -> None:
    """A rejected inline decode frees both slots at once: the next decode runs at once."""
    slots = DecodeSlots(total=1, per_tenant=1, wait_s=0.0)

    def refuse(data: bytes) -> bytes:
        raise ValueError("refused")

    for _ in range(3):
        with pytest.raises(ValueError, match="refused"):
            await slots.run_inline("acme", refuse, b"x")
    assert await slots.run_inline("acme", lambda d: d, b"ok") == b"ok"
    assert await slots.run("acme", lambda d: d, b"pooled") == b"pooled"
    slots.close()
