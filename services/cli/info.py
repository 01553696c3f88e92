"""`splatq info`: per partition and stream, what waits and what runs (read from Redis).

Columns: depth (stream length, acknowledged entries included until trimmed), queued (in
the tenants' fair queues, not yet in the stream), ready (in the stream, not handed to a
worker yet: the consumer group's lag), waiting (queued + ready), oldest waiting age,
pending (handed out, not acknowledged: running or about to be redelivered), consumers; and
per partition the retries waiting for their due time (delayed). With the staged pipeline,
each later stage's streams that exist get rows of their own (`<stage>:<class>`; `ingest`
reads the entry streams).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

import orjson

from splatq.shared.engine.backlog import PartitionBacklog, read_stage_backlogs
from splatq.shared.engine.keys import KeySchema
from splatq.shared.redis.client import connect
from splatq.shared.settings import Settings

EXIT_OK, EXIT_UNAVAILABLE = 0, 4


def add_command(sub: Any) -> None:
    p = sub.add_parser(
        "info",
        help="queue depth, oldest waiting age, consumers, lag and pending per stream",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")


def run_info_command(args: argparse.Namespace, settings: Settings) -> int:
    try:
        backlogs = asyncio.run(_read(settings))
    except Exception as exc:
        print(f"splatq info: cannot read Redis: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    rows = _rows(backlogs)
    if args.json:
        print(orjson.dumps(rows).decode())
        return EXIT_OK
    header = ("partition", "stream", "depth", "queued", "ready", "waiting", "oldest_waiting_s",
              "pending", "consumers", "delayed")  # fmt: skip
    table = [header] + [tuple(_cell(r[h]) for h in header) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        print("  ".join(c.rjust(w) if i > 1 else c.ljust(w) for i, (c, w) in
                        enumerate(zip(row, widths, strict=True))).rstrip())  # fmt: skip
    return EXIT_OK


async def _read(settings: Settings) -> list[tuple[str, PartitionBacklog]]:
    redis = connect(settings.redis_url, client_name="splatq-info")
    try:
        keys = KeySchema(partitions=settings.partitions)
        return await read_stage_backlogs(redis, keys, settings.consumer_group, settings.partitions)
    finally:
        await redis.aclose()


def _rows(backlogs: list[tuple[str, PartitionBacklog]]) -> list[dict[str, Any]]:
    return [
        {
            "partition": b.partition,
            "stream": f"{stage}:{s.stream.value}" if stage else s.stream.value,
            "depth": s.length,
            "queued": s.queued,
            "ready": s.ready,
            "waiting": s.queued + s.ready if s.ready is not None else None,
            "oldest_waiting_s": (
                round(s.oldest_waiting_age_s, 3) if s.oldest_waiting_age_s is not None else None
            ),
            "pending": s.pending,
            "consumers": s.consumers,
            "delayed": b.delayed,
        }
        for stage, b in backlogs
        for s in b.streams
    ]


def _cell(value: object) -> str:
    return "-" if value is None else str(value)
