"""splatq.shared.testing, the helpers users test their handlers with: `eventually` returns
what it waited for and, on timeout, says what it last saw; the redis-server helper starts a
real server, and stops it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from splatq.shared.engine.queue import JobQueue
from splatq.shared.engine.worker import Worker
from splatq.shared.settings import Settings
from splatq.shared.testing import (
    eventually,
    eventually_sync,
    fresh_redis,
    run_burst,
    running_redis_server,
    wait_for_status,
)
from tests.handlers import BehaviourHandler
from tests.helpers import spec


async def test_eventually_returns_the_first_truthy_value_sync_or_async() -> None:
    seen: list[int] = []

    def grows() -> int | None:
        seen.append(len(seen))
        return seen[-1] if len(seen) >= 3 else None

    assert await eventually(grows, timeout=5, interval=0.001) == 2

    async def at_once() -> str:
        return "done"

    assert await eventually(at_once) == "done"


async def test_eventually_times_out_with_the_last_value_it_observed() -> None:
    async def never() -> list[int]:
        return []

    with pytest.raises(AssertionError, match=r"not met within 0.05s .*last value \[\]"):
        await eventually(never, timeout=0.05, interval=0.01)
    with pytest.raises(AssertionError, match=r"^the queue draining not met"):
        await eventually(lambda: 0, timeout=0, message="the queue draining")


async def test_an_exception_in_the_condition_ends_the_wait_at_once() -> None:
    """An assert inside a condition is an invariant of every poll: the first violation fails
    the test, a later poll that happens to pass cannot hide it."""
    calls = 0

    def invariant_broken_once() -> bool:
        nonlocal calls
        calls += 1
        assert calls != 2, "broken at the second poll"
        return calls >= 4

    with pytest.raises(AssertionError, match="broken at the second poll"):
        await eventually(invariant_broken_once, timeout=5, interval=0.001)
    assert calls == 2

    def broken() -> bool:
        raise KeyError("bug")

    with pytest.raises(KeyError):
        await eventually(broken, timeout=5)


async def test_retry_on_makes_an_assertion_mean_not_yet_and_the_cause() -> None:
    calls = 0

    def settles() -> bool:
        nonlocal calls
        calls += 1
        assert calls > 2, f"only {calls} calls"
        return True

    assert await eventually(settles, timeout=5, interval=0.001, retry_on=AssertionError)

    def fails() -> bool:
        raise AssertionError("status is processing")

    with pytest.raises(AssertionError, match=r"last raised .*status is processing") as info:
        await eventually(fails, timeout=0.02, interval=0.005, retry_on=AssertionError)
    assert isinstance(info.value.__cause__, AssertionError)


def test_eventually_sync_polls_without_a_loop_and_refuses_coroutine_functions() -> None:
    ticks = iter(range(10))
    assert eventually_sync(lambda: next(ticks) == 3, timeout=5, interval=0.001) is True
    with pytest.raises(AssertionError, match="last value 0"):
        eventually_sync(lambda: 0, timeout=0.02, interval=0.005)

    async def coro() -> bool:
        return True

    with pytest.raises(TypeError, match="await eventually"):
        eventually_sync(coro)  # type: ignore[arg-type]


async def test_running_redis_server_starts_a_fresh_server_and_stops_it() -> None:
    async with running_redis_server() as server:
        async with fresh_redis(server.url) as redis:
            await redis.set("k", "v")
        async with fresh_redis(server.url) as redis:
            assert await redis.get("k") is None  # flushed for the next user
            assert await redis.ping()
        process = server.process
    assert process is not None
    assert process.poll() is not None  # stopped on exit


def test_importing_the_helpers_does_not_import_pytest() -> None:
    code = "import sys, splatq.shared.testing; print('pytest' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=60
    )
    assert out.stdout.strip() == "False"


async def test_wait_for_status_times_out_showing_the_job_as_last_read(queue: JobQueue) -> None:
    job_id = (await queue.enqueue(spec())).job_id  # no worker: it stays queued
    with pytest.raises(AssertionError, match=r"reaching \['completed'\] \(last read: .*queued"):
        await wait_for_status(queue, job_id, {"completed"}, timeout=0.1)


async def test_eventually_sync_refuses_to_block_a_running_loop() -> None:
    with pytest.raises(RuntimeError, match="block the running event loop"):
        eventually_sync(lambda: True, timeout=1)


async def test_run_burst_returns_once_the_queue_has_drained(
    queue: JobQueue, settings: Settings
) -> None:
    ids = [(await queue.enqueue(spec(sleep_s=0.05))).job_id for _ in range(6)]
    await run_burst(Worker(queue, settings, BehaviourHandler()), timeout_s=30)
    jobs = [await queue.get(i) for i in ids]
    assert [j.status.value for j in jobs if j] == ["completed"] * 6


async def test_run_burst_gives_up_on_a_queue_that_does_not_drain(
    queue: JobQueue, settings: Settings
) -> None:
    await queue.enqueue(spec(sleep_s=30))
    with pytest.raises(TimeoutError):
        await run_burst(Worker(queue, settings, BehaviourHandler()), timeout_s=1)
