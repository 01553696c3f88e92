"""The weighted dynamic slot pool: how many jobs of each stream a worker may start now.

Pure policy, no I/O. Each stream owns a reserved share of the slots; an idle slot may be
borrowed by the other stream, and a borrowed slot is given back without waiting: when the
owner needs it, the owner starts anyway and the borrower starts nothing new until the pool is
back within its size. So a flood of long synthesis jobs can fill an idle worker, yet never
delays an interactive job behind it (no head-of-line blocking), and no slot idles while work
waits. The price is a bounded, temporary overcommit (at most the owner's reservation) while
borrowed jobs finish. A pool of a per-class process serves one class: every slot is that
class's, and nothing is lent to the other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from splatq.shared.engine.keys import STREAMS, StreamName


def reserve_slots(total: int, interactive_share: float) -> dict[StreamName, int]:
    """Split `total` slots by share; each stream keeps at least one when total >= 2 and its
    share is non-zero (a 0.0 or 1.0 share dedicates the pool to one stream's reservation,
    though borrowing still lets the other stream use idle slots)."""
    if total < 1:
        raise ValueError("a slot pool needs at least one slot")
    interactive = round(total * interactive_share)
    if total >= 2 and 0.0 < interactive_share < 1.0:
        interactive = min(max(interactive, 1), total - 1)
    return {
        StreamName.INTERACTIVE: interactive,
        StreamName.SYNTHESIS: total - interactive,
    }


@dataclass(slots=True)
class SlotPool:
    total: int
    reserved: Mapping[StreamName, int]
    running: dict[StreamName, int] = field(default_factory=lambda: dict.fromkeys(STREAMS, 0))
    # The classes this pool serves: both, or one (a per-class process, worker_classes.py).
    serves: tuple[StreamName, ...] = STREAMS

    @classmethod
    def create(
        cls, total: int, interactive_share: float, serves: tuple[StreamName, ...] = STREAMS
    ) -> SlotPool:
        if len(serves) == 1:
            reserved = {s: total if s in serves else 0 for s in STREAMS}
            return cls(total=total, reserved=reserved, serves=serves)
        return cls(total=total, reserved=reserve_slots(total, interactive_share))

    @property
    def in_use(self) -> int:
        return sum(self.running.values())

    @property
    def idle(self) -> int:
        return max(self.total - self.in_use, 0)

    @property
    def lendable(self) -> int:
        """Idle slots a take may offer to either class (take.lua's phase 2): none in a
        one-class pool, whose reservation is every slot already."""
        return self.idle if len(self.serves) > 1 else 0

    def own(self, stream: StreamName) -> int:
        """Unused reservation of `stream`: honoured even while the other stream borrows."""
        return max(self.reserved[stream] - self.running[stream], 0)

    def capacity(self, stream: StreamName) -> int:
        """Jobs of `stream` that may start now: its own unused slots, or any idle ones
        (none for a class the pool does not serve)."""
        if stream not in self.serves:
            return 0
        return max(self.own(stream), self.idle)

    def waits_on_all(self) -> bool:
        """Whether every class served has room (an idle worker may then block on a read)."""
        return all(self.capacity(s) for s in self.serves)

    def guaranteed_counts(self) -> dict[StreamName, int]:
        """Phase 1 of a fetch: each stream up to its unused reservation.

        Taken together these never exceed the pool except when an owner reclaims slots a
        borrower still occupies (the documented, temporary overcommit).
        """
        return {s: self.own(s) for s in STREAMS}

    def capacities(self) -> dict[StreamName, int]:
        return {s: self.capacity(s) for s in STREAMS}

    def has_capacity(self) -> bool:
        return any(self.capacity(s) > 0 for s in STREAMS)

    def acquire(self, stream: StreamName, n: int = 1) -> None:
        """Record `n` started jobs. Planning (the counts above) keeps this within bounds;
        two simultaneous wake-ups of a blocking read may exceed the pool by one job."""
        self.running[stream] += n

    def release(self, stream: StreamName, n: int = 1) -> None:
        if self.running[stream] < n:
            raise RuntimeError(f"slot pool released more {stream} slots than acquired")
        self.running[stream] -= n
