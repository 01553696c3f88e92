"""`splatq submit | status | cancel | jobs`: the API client on the command line.

Exit codes scripts can rely on: 0 done (submitted, or completed with --wait), 1 the job
failed or was canceled, 2 usage, 3 the API refused the request (4xx), 4 the API was
unreachable or failed (5xx), 78 configuration (no API key).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

import orjson

from splatq.shared.client import ApiProblem, Event, Job, SplatqClient
from splatq.shared.client.query import statuses_of
from splatq.shared.engine.events import EventType
from splatq.shared.engine.states import JobStatus
from splatq.shared.settings import Settings
from splatq.shared.storage.store import ARTIFACT_FILES

EXIT_OK, EXIT_JOB_FAILED, EXIT_USAGE, EXIT_REFUSED, EXIT_UNAVAILABLE, EXIT_CONFIG = (
    0, 1, 2, 3, 4, 78)  # fmt: skip

_API_CODES = """\
  3   the API refused the request (4xx: the problem code is printed)
  4   the API was unreachable or failed (5xx)
  78  configuration error (no API key, an invalid SPLATQ_* value)

environment:
  SPLATQ_API_URL   gateway URL (default http://127.0.0.1:$SPLATQ_GATEWAY_PORT)
  SPLATQ_API_KEY   API key sent as a Bearer token
"""
CLIENT_EPILOG = (
    """\
exit codes:
  0   done: submitted (or, with --wait, completed)
  1   the job failed or was canceled
  2   usage error (bad arguments, --metadata that is not a JSON object)
"""
    + _API_CODES
)
JOBS_EPILOG = (
    """\
exit codes:
  0   listed (also when no job matched)
  2   usage error (an unknown --status, a --since/--until that is not ISO 8601)
"""
    + _API_CODES
)
JOBS_TABLE = ("ID", "STATUS", "QUALITY", "PROGRESS", "CREATED", "ERROR")
STAGES_TABLE = ("STAGE", "STATUS", "ATTEMPTS", "ERROR")

_EVENT_NAMES = [e.value for e in EventType]


def add_commands(sub: Any) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    s = sub.add_parser(
        "submit",
        help="submit an image (optionally wait and download)",
        description="Submit an image for reconstruction; with --wait, follow it to the end.",
        epilog=CLIENT_EPILOG,
        formatter_class=fmt,
    )
    s.add_argument(
        "image", type=Path, nargs="?", help="the image file (PNG, JPEG or WebP); or --url"
    )
    s.add_argument(
        "--url",
        default=None,
        metavar="URL",
        help="input by URL instead of a file: the gateway fetches the image (http or https)",
    )
    s.add_argument(
        "--quality",
        choices=["preview", "full"],
        default="full",
        help="preview (fast, 128 px) or full (default)",
    )
    s.add_argument("--wait", action="store_true", help="follow progress until the job ends")
    s.add_argument(
        "--wait-s",
        type=_seconds,
        default=None,
        metavar="N",
        help="ask the gateway to hold its answer until the job ends, at most N seconds "
        "(Prefer: wait=N; the gateway caps N, 60 s by default); with --wait, the events are "
        "followed only if it has not ended by then",
    )
    s.add_argument("--out", type=Path, default=None, help="download artifacts here (--wait)")
    s.add_argument("--webhook", default=None, help="webhook URL for this job's events")
    s.add_argument(
        "--webhook-events",
        default=None,
        metavar="NAMES",
        help="comma-separated events the webhook gets (default: all): "
        + ", ".join(n.rsplit(".", 1)[1] for n in _EVENT_NAMES)
        + " (short or full names)",
    )
    s.add_argument(
        "--metadata",
        default=None,
        metavar="JSON",
        help="a JSON object stored with the job and echoed in its events (at most 4 KB)",
    )
    s.add_argument(
        "--idempotency-key",
        default=None,
        help="a retry with the same key returns the same job instead of a new one",
    )
    s.add_argument("--no-cache", action="store_true", help="force a fresh computation")
    s.add_argument(
        "--progressive",
        action="store_true",
        help="a full job: a quick preview-resolution result first (a preview_ready event), "
        "then the full result",
    )
    for name, what in (
        ("status", "show a job (and, for a staged job, its stages)"),
        ("cancel", "cancel a job"),
    ):
        p = sub.add_parser(name, help=what, description=what, epilog=CLIENT_EPILOG,
                           formatter_class=fmt)  # fmt: skip
        p.add_argument("job_id", help="the job's id (job_...)")
    j = sub.add_parser(
        "jobs",
        help="list your jobs, newest first",
        description="List the API key's jobs, newest first, as a table (or --json).\n"
        "Without --all, one page; the cursor of the next one is printed on stderr.",
        epilog=JOBS_EPILOG,
        formatter_class=fmt,
    )
    j.add_argument(
        "--status",
        action="append",
        default=None,
        metavar="S",
        help="only jobs in this status (repeat, or comma-separate, for several): "
        + ", ".join(s.value for s in JobStatus),
    )
    j.add_argument(
        "--since",
        default=None,
        metavar="ISO",
        help="created at or after this time (ISO 8601; without a zone: UTC)",
    )
    j.add_argument(
        "--until",
        default=None,
        metavar="ISO",
        help="created before this time (ISO 8601; without a zone: UTC)",
    )
    j.add_argument(
        "--limit",
        type=int,
        default=None,
        metavar="N",
        help="jobs per page, 1-100 (the gateway's default: 20)",
    )
    j.add_argument("--cursor", default=None, help="continue from a previous page's cursor")
    j.add_argument("--all", action="store_true", help="follow the cursor through every page")
    for p in (s, sub.choices["status"], sub.choices["cancel"], j):
        p.add_argument("--api-url", default=None, help="gateway URL (SPLATQ_API_URL)")
        p.add_argument("--api-key", default=None, help="API key (SPLATQ_API_KEY)")
        p.add_argument("--json", action="store_true", help="machine-readable output")


def run_client_command(args: argparse.Namespace, settings: Settings) -> int:
    url = args.api_url or settings.api_url or settings.public_base_url
    key = args.api_key or settings.api_key
    if not key:
        print("splatq: no API key: pass --api-key or set SPLATQ_API_KEY", file=sys.stderr)
        return EXIT_CONFIG
    try:
        if args.command == "submit":
            if (args.image is None) == (args.url is None):
                raise ValueError("give an image file or --url URL (one of them)")
            args.metadata = _metadata(args.metadata)
            args.webhook_events = _webhook_events(args.webhook_events)
        if args.command == "jobs":
            args.status = statuses_of(args.status)
            args.since = _moment(args.since, "--since")
            args.until = _moment(args.until, "--until")
    except ValueError as exc:
        print(f"splatq {args.command}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return asyncio.run(_run(args, url, key))


def _metadata(raw: str | None) -> dict[str, Any] | None:
    if raw is None:
        return None
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"--metadata is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError('--metadata must be a JSON object, e.g. \'{"scene": "kitchen"}\'')
    return value


def _seconds(raw: str) -> int:
    if not raw.isdigit():
        raise argparse.ArgumentTypeError(f"not a whole number of seconds: {raw!r}")
    return int(raw)


def _moment(raw: str | None, flag: str) -> datetime | None:
    """An ISO 8601 time (a date alone is its midnight); without a zone, UTC."""
    if raw is None:
        return None
    try:
        moment = datetime.fromisoformat(raw)
    except ValueError:
        raise ValueError(f"{flag} is not an ISO 8601 time: {raw!r}") from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _webhook_events(raw: str | None) -> list[str] | None:
    if raw is None:
        return None
    names = []
    for part in (p.strip() for p in raw.split(",")):
        if not part:
            continue
        full = part if "." in part else f"3d_reconstruction.{part}"
        if full not in _EVENT_NAMES:
            raise ValueError(f"--webhook-events: unknown event {part!r}")
        names.append(full)
    if not names:
        raise ValueError("--webhook-events names no event")
    return names


async def _run(args: argparse.Namespace, url: str, key: str) -> int:
    async with SplatqClient(url, key) as client:
        try:
            if args.command == "status":
                return _report(await client.get(args.job_id), args.json, stages=True)
            if args.command == "cancel":
                return _report(await client.cancel(args.job_id), args.json, ok_canceled=True)
            if args.command == "jobs":
                return await _jobs(client, args)
            return await _submit(client, args)
        except ApiProblem as exc:
            if args.json:
                print(
                    orjson.dumps(
                        {"error": {"status": exc.status, "code": exc.code, "detail": exc.detail}}
                    ).decode()
                )
            else:
                print(f"splatq: {exc.code}: {exc.detail}", file=sys.stderr)
            return EXIT_REFUSED if 400 <= exc.status < 500 else EXIT_UNAVAILABLE


async def _submit(client: SplatqClient, args: argparse.Namespace) -> int:
    if args.image is not None and not args.image.is_file():
        print(f"splatq: no such file: {args.image}", file=sys.stderr)
        return EXIT_REFUSED
    job = await client.submit(
        args.image,
        image_url=args.url,
        wait_s=args.wait_s,
        quality=args.quality,
        webhook_url=args.webhook,
        webhook_events=args.webhook_events,
        metadata=args.metadata,
        cache=not args.no_cache,
        progressive=args.progressive,
        idempotency_key=args.idempotency_key,
    )
    if not args.json:
        print(f"{job.id} {job.status}{' (cached)' if job.cached else ''}", file=sys.stderr)
    if args.wait and not job.finished:
        progress = None if args.json else ProgressLine(sys.stderr)
        try:
            job = await client.wait(job.id, progress.show if progress else None)
        finally:
            if progress is not None:
                progress.clear()
    if args.out is not None and job.status == "completed":
        # the job's own artifacts (one finished before a format existed lacks it)
        for name in [n for n in ARTIFACT_FILES if n in (job.artifacts or {})]:
            path = await client.download(job.id, name, args.out)
            if not args.json:
                print(f"  {path}", file=sys.stderr)
    return _report(job, args.json)


class ProgressLine:
    """Progress on one terminal line, rewritten in place (`\\r`) and cleared before the next
    normal line; on a pipe or file, one line per event instead."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.tty = out.isatty()
        self._width = 0  # characters of the progress line now on screen

    def show(self, event: Event) -> None:
        data = event.data
        kind = event.name.rsplit(".", 1)[-1]
        if kind == "progress":
            pct = float(data.get("progress", 0))
            text = f"  [{'#' * int(pct * 30):<30}] {pct:4.0%} {data.get('stage', '')}"
            if self.tty:
                pad = " " * max(0, self._width - len(text))
                self.out.write(f"\r{text}{pad}")
                self._width = len(text)
                self.out.flush()
                return
            self.out.write(text + "\n")
        else:
            self.clear()
            self.out.write(f"  {kind}\n")
        self.out.flush()

    def clear(self) -> None:
        """Erase the in-place line, so what follows starts on a clean line."""
        if self._width:
            self.out.write("\r\x1b[2K")
            self.out.flush()
            self._width = 0


async def _jobs(client: SplatqClient, args: argparse.Namespace) -> int:
    filters: dict[str, Any] = {
        "status": args.status,
        "created_since": args.since,
        "created_until": args.until,
        "limit": args.limit,
    }
    if args.all:
        jobs = [job async for job in client.iter_jobs(**filters)]
        cursor = None
    else:
        page = await client.list_jobs(**filters, cursor=args.cursor)
        jobs, cursor = list(page.items), page.next_cursor
    if args.json:
        doc = {"items": [dict(job.raw) for job in jobs], "next_cursor": cursor}
        print(orjson.dumps(doc).decode())
    else:
        print(_table([JOBS_TABLE, *(_job_row(job) for job in jobs)]))
        if cursor is not None:
            print(f"more: --cursor {cursor} (or --all)", file=sys.stderr)
    return EXIT_OK


def _job_row(job: Job) -> tuple[str, ...]:
    created = (
        job.created_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ") if job.created_at else "-"
    )
    error = job.error.code if job.error is not None else ""
    return (job.id, job.status, job.quality, f"{job.progress:.0%}", created, error)


def _table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def _stage_rows(job: Job) -> list[tuple[str, ...]]:
    """A staged job's stages, one row each: name, status, attempts (and the error code)."""
    return [
        (name, s.status.value, str(s.attempts), s.error.code if s.error is not None else "")
        for name, s in job.stages.items()
    ]


def _report(job: Job, as_json: bool, ok_canceled: bool = False, stages: bool = False) -> int:
    if as_json:
        print(orjson.dumps(dict(job.raw)).decode())  # the whole job: `stages` included
    else:
        line = f"{job.id} {job.status} {job.progress:.0%}"
        if job.error is not None:
            line += f" {job.error.code}: {job.error.message}"
        print(line)
        if stages and job.stages:
            table = _table([STAGES_TABLE, *_stage_rows(job)])
            print("\n".join(f"  {row}" for row in table.splitlines()))
    if job.status == "failed" or (job.status == "canceled" and not ok_canceled):
        return EXIT_JOB_FAILED
    return EXIT_OK
