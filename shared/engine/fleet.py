"""A worker process's membership in the fleet: one name, one fleet tick, one count of jobs.

A process is one failure domain: SIGKILL, the OOM killer or a segfault takes every job it
runs at once, whichever of its stage workers runs them. Crash attribution (reclaim.lua)
therefore counts processes: the job's `worker` field and the names in `<tag>:workers` (the
fleet tick's record of who is alive) name the process, and `co_running` (k: a death charges
each of the process's jobs 1/k) counts the process's jobs. A staged process
(`splatq worker --stages ...`: a `Worker` per stage) hands its stage workers one
`FleetMember`; a lone `Worker` makes its own.

The member's clock ticks each owned partition's fleet clock (fleet_tick.lua) every
`fleet_tick_interval_s` while at least one of its workers runs: the first to start starts it,
the last to stop stops it, so a process draining its last stage still ticks.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import orjson
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

REDIS_ERRORS = (RedisConnectionError, RedisTimeoutError, ConnectionError, OSError)


def new_consumer_name() -> str:
    """'<host>-<pid>-<hex>': unique per process start (services/stack.py reads the pid)."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


class FleetClock(Protocol):
    """What the member's clock needs of a queue (JobQueue.fleet_tick)."""

    async def fleet_tick(self, partitions: Sequence[int], consumer: str = "") -> None: ...

    async def fleet_card(self, consumer: str, card: bytes, ttl_ms: int) -> None: ...


@dataclass(slots=True, eq=False)
class FleetMember:
    """One process in the fleet, shared by the workers it runs."""

    name: str = field(default_factory=new_consumer_name)
    _counts: list[Callable[[], int]] = field(default_factory=list)
    _cards: list[Callable[[], Mapping[str, object]]] = field(default_factory=list)
    _started_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    _joined: int = 0
    _clock: asyncio.Task[None] | None = None

    def count(self, running: Callable[[], int]) -> None:
        """Count a worker's running jobs among the process's (see `running`)."""
        self._counts.append(running)

    def describe(self, card: Callable[[], Mapping[str, object]]) -> None:
        """Add a worker's own description (its stage, slots, jobs running) to the process's
        card, which every fleet tick writes for the admin API's worker view."""
        self._cards.append(card)

    def card(self) -> bytes:
        return orjson.dumps(
            {
                "name": self.name,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "started_at_ms": self._started_ms,
                "running": self.running(),
                "workers": [card() for card in self._cards],
            }
        )

    def running(self) -> int:
        """The jobs this process runs now, over all its workers (`co_running`'s k): those
        whose handler is running, whichever stage worker runs it."""
        return sum(count() for count in self._counts)

    def join(self, queue: FleetClock, partitions: Sequence[int], interval_s: float) -> None:
        """A worker of this process starts: the first one starts the process's clock."""
        self._joined += 1
        if self._clock is None:
            self._clock = asyncio.create_task(
                _tick(queue, tuple(partitions), self, interval_s), name="fleet-clock"
            )

    async def leave(self) -> None:
        """A worker of this process stopped: the last one stops the clock."""
        self._joined -= 1
        if self._joined > 0 or self._clock is None:
            return
        clock, self._clock = self._clock, None
        clock.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await clock

    @property
    def ticking(self) -> bool:
        return self._clock is not None and not self._clock.done()


async def _tick(
    queue: FleetClock, partitions: Sequence[int], member: FleetMember, interval_s: float
) -> None:
    """Tick each partition's fleet clock, busy or idle: gaps in the fleet's contact with Redis
    are what tells an outage (not charged to leases) from a dead process. The process's card
    goes with it, kept for a few ticks (a process that stops ticking drops out of view)."""
    card_ttl_ms = max(int(interval_s * 3000), 3000)
    while True:
        # Unreachable Redis is the point of the clock: nothing to do until it answers.
        with contextlib.suppress(*REDIS_ERRORS):
            await queue.fleet_tick(partitions, member.name)
            await queue.fleet_card(member.name, member.card(), card_ttl_ms)
        await asyncio.sleep(interval_s)
