"""Dead-letter depth and oldest entry per (kind, reason), counted by each whole sweep and kept
in Redis, so every redriver replica exports the same gauges without reading the queues."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import orjson

from splatq.shared.maintenance.keys import DeadLetterKind

if TYPE_CHECKING:
    from splatq.shared.maintenance.deadletters import DeadLetterBook, Subject


@dataclass(slots=True)
class DeadLetterSummary:
    # (kind, reason) -> [count, oldest at_ms]
    groups: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    at_ms: int = 0

    def add_all(self, kind: DeadLetterKind, subjects: Iterable[Subject]) -> None:
        for s in subjects:
            group = self.groups.setdefault((kind.value, s.letter.reason or "unknown"), [0, 0])
            group[0] += 1
            at = s.letter.at_ms
            group[1] = at if group[1] == 0 else min(group[1], at)

    def ages_s(self, now_ms: int) -> dict[tuple[str, str], tuple[int, float]]:
        return {
            k: (c, max(0.0, (now_ms - oldest) / 1000)) for k, (c, oldest) in self.groups.items()
        }

    async def store(self, book: DeadLetterBook) -> None:
        rows = [[k, r, c, o] for (k, r), (c, o) in sorted(self.groups.items())]
        payload = {"at_ms": int(time.time() * 1000), "groups": rows}
        await book.redis.set(book.keys.dead_letter_summary(), orjson.dumps(payload))

    @classmethod
    async def load(cls, book: DeadLetterBook) -> DeadLetterSummary:
        raw = await book.redis.get(book.keys.dead_letter_summary())
        if not raw:
            return cls()
        data = orjson.loads(raw)
        groups = {(str(k), str(r)): [int(c), int(o)] for k, r, c, o in data.get("groups", [])}
        return cls(groups, int(data.get("at_ms", 0)))
