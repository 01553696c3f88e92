"""Exponential backoff without jitter, for resending one call whose answer is not yet
definite (a lost reply, a "not now" error reply): the first wait is short, each next one
twice as long up to a cap. One home for what each retry loop used to write by hand; job
retries (with full jitter, attempts counted) are shared/engine/retries.py."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field


@dataclass(slots=True)
class Backoff:
    first_s: float = 0.05
    cap_s: float = 1.0
    delay_s: float = field(init=False)

    def __post_init__(self) -> None:
        self.delay_s = self.first_s

    def next(self) -> float:
        """The wait to make now; the next one doubles (up to `cap_s`)."""
        delay = self.delay_s
        self.delay_s = min(delay * 2, self.cap_s)
        return delay

    def reset(self) -> None:
        """After a success: the next wait is the first one again."""
        self.delay_s = self.first_s

    async def sleep(self) -> None:
        await asyncio.sleep(self.next())
