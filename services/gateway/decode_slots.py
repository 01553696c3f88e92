"""How many uploads the gateway decodes at once: per process and per tenant, on its own
thread pool, so one tenant's heavy images never queue ahead of another tenant's.

Admission only: it runs the validator it is given and knows nothing about images or Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from splatq.services.gateway.problems import ApiError

T = TypeVar("T")


class DecodeSlots:
    """A tenant first takes one of its own `per_tenant` slots, then one of the process's
    `total`. The order is the isolation: a tenant past its share waits in its own queue and
    never in the process queue, so with `per_tenant` < `total` it cannot fill the process, and
    the process queue holds at most `per_tenant` waiters of each tenant. Waits are bounded by
    `wait_s`: past it the tenant gets 429 too_many_decodes, or 503 overloaded when the whole
    process is busy. A slot is held until the decode thread really ends, even when the
    request is gone (a disconnected client must not free a slot its decode still uses).
    Decodes run on the pool (`run`), or, when cheaper than the hop there, on the event loop
    (`run_inline`), under the same slots either way."""

    def __init__(self, total: int, per_tenant: int, wait_s: float) -> None:
        self.total = total
        self.per_tenant = min(per_tenant, total)
        self.wait_s = wait_s
        self._process = asyncio.Semaphore(total)
        self._tenants: dict[str, asyncio.Semaphore] = {}
        self._holders: dict[str, int] = {}  # waiting or decoding, to drop idle semaphores
        self._pool = ThreadPoolExecutor(max_workers=total, thread_name_prefix="decode")
        self._retry_after = {"Retry-After": str(max(1, math.ceil(wait_s)))}

    async def run(self, tenant: str, fn: Callable[[bytes], T], data: bytes) -> T:
        """`fn(data)` on the decode pool once the tenant and the process have a slot."""
        tenant_sem = await self._admit(tenant)
        try:
            future = self._pool.submit(fn, data)
        except BaseException:
            self._release(tenant, tenant_sem)
            raise
        loop = asyncio.get_running_loop()

        def done(_: object) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed at shutdown
                loop.call_soon_threadsafe(self._release, tenant, tenant_sem)

        future.add_done_callback(done)
        return await asyncio.wrap_future(future)

    async def run_inline(self, tenant: str, fn: Callable[[bytes], T], data: bytes) -> T:
        """`fn(data)` on the calling (event loop) thread, under the same two slots: for
        decodes that cost less than the hop to a decode thread and back. The slots are
        taken, and waited for, exactly as `run` takes them, and held for the call: inline
        decodes count against both bounds and queue behind a busy tenant like any other."""
        tenant_sem = await self._admit(tenant)
        try:
            return fn(data)
        finally:
            self._release(tenant, tenant_sem)

    async def _admit(self, tenant: str) -> asyncio.Semaphore:
        """Take the tenant's slot, then the process's (429 / 503 past `wait_s`); the tenant's
        semaphore, to release both with `_release`."""
        tenant_sem = self._tenants.setdefault(tenant, asyncio.Semaphore(self.per_tenant))
        self._holders[tenant] = self._holders.get(tenant, 0) + 1
        try:
            if not await _acquire_within(tenant_sem, self.wait_s):
                raise ApiError(
                    429,
                    "too_many_decodes",
                    f"this API key already has {self.per_tenant} images being decoded",
                    dict(self._retry_after),
                )
            try:
                if not await _acquire_within(self._process, self.wait_s):
                    raise ApiError(
                        503,
                        "overloaded",
                        "the gateway is decoding as many images as it can; retry later",
                        dict(self._retry_after),
                    )
            except BaseException:
                tenant_sem.release()
                raise
        except BaseException:
            self._drop_holder(tenant)
            raise
        return tenant_sem

    def _release(self, tenant: str, tenant_sem: asyncio.Semaphore) -> None:
        self._process.release()
        tenant_sem.release()
        self._drop_holder(tenant)

    def _drop_holder(self, tenant: str) -> None:
        self._holders[tenant] -= 1
        if not self._holders[tenant]:
            del self._holders[tenant]
            del self._tenants[tenant]

    def close(self) -> None:
        """Stop taking work; running decodes finish on their threads."""
        self._pool.shutdown(wait=False, cancel_futures=True)


async def _acquire_within(sem: asyncio.Semaphore, timeout_s: float) -> bool:
    if not sem.locked():
        # Free, and nobody queued ahead: acquire() returns at once, so no timer is armed.
        await sem.acquire()
        return True
    # asyncio.timeout, not wait_for: a permit granted just as the timeout fires is handed on
    # by Semaphore.acquire's own cancellation handling instead of being lost.
    try:
        async with asyncio.timeout(timeout_s):
            await sem.acquire()
    except TimeoutError:
        return False
    return True
