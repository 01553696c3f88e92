"""`splatq submit | status | cancel`: the API client on the command line.

Exit codes scripts can rely on: 0 done (submitted, or completed with --wait), 1 the job
failed or was canceled, 3 the API refused the request (4xx), 4 the API was unreachable or
failed (5xx), 78 configuration (no API key).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

import orjson

from splatq.shared.client import ApiProblem, Event, SplatqClient
from splatq.shared.settings import Settings
from splatq.shared.storage.store import ARTIFACT_FILES

EXIT_OK, EXIT_JOB_FAILED, EXIT_REFUSED, EXIT_UNAVAILABLE, EXIT_CONFIG = 0, 1, 3, 4, 78


def add_commands(sub: Any) -> None:
    s = sub.add_parser("submit", help="submit an image (optionally wait and download)")
    s.add_argument("image", type=Path)
    s.add_argument("--quality", choices=["preview", "full"], default="full")
    s.add_argument("--wait", action="store_true", help="follow progress until the job ends")
    s.add_argument("--out", type=Path, default=None, help="download artifacts here (--wait)")
    s.add_argument("--webhook", default=None, help="webhook URL for this job's events")
    s.add_argument("--idempotency-key", default=None)
    s.add_argument("--no-cache", action="store_true", help="force a fresh computation")
    for name in ("status", "cancel"):
        p = sub.add_parser(name, help=f"{name} a job")
        p.add_argument("job_id")
    for p in (s, sub.choices["status"], sub.choices["cancel"]):
        p.add_argument("--api-url", default=None, help="gateway URL (SPLATQ_API_URL)")
        p.add_argument("--api-key", default=None, help="API key (SPLATQ_API_KEY)")
        p.add_argument("--json", action="store_true", help="machine-readable output")


def run_client_command(args: argparse.Namespace, settings: Settings) -> int:
    url = args.api_url or settings.api_url or settings.public_base_url
    key = args.api_key or settings.api_key
    if not key:
        print("splatq: no API key: pass --api-key or set SPLATQ_API_KEY", file=sys.stderr)
        return EXIT_CONFIG
    return asyncio.run(_run(args, url, key))


async def _run(args: argparse.Namespace, url: str, key: str) -> int:
    async with SplatqClient(url, key) as client:
        try:
            if args.command == "status":
                return _report(await client.get(args.job_id), args.json)
            if args.command == "cancel":
                return _report(await client.cancel(args.job_id), args.json, ok_canceled=True)
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
    if not args.image.is_file():
        print(f"splatq: no such file: {args.image}", file=sys.stderr)
        return EXIT_REFUSED
    job = await client.submit(
        args.image,
        quality=args.quality,
        webhook_url=args.webhook,
        cache=not args.no_cache,
        idempotency_key=args.idempotency_key,
    )
    if not args.json:
        print(
            f"{job['id']} {job['status']}{' (cached)' if job.get('cached') else ''}",
            file=sys.stderr,
        )
    if args.wait and job["status"] not in {"completed", "failed", "canceled"}:
        job = await client.wait(job["id"], None if args.json else _progress)
    if args.out is not None and job["status"] == "completed":
        for name in ARTIFACT_FILES:
            path = await client.download(job["id"], name, args.out)
            if not args.json:
                print(f"  {path}", file=sys.stderr)
    return _report(job, args.json)


def _progress(event: Event) -> None:
    data = event.payload.get("data", {})
    kind = event.name.rsplit(".", 1)[-1]
    if kind == "progress":
        pct = float(data.get("progress", 0))
        bar = "#" * int(pct * 30)
        end = "\r" if sys.stderr.isatty() else "\n"
        print(f"  [{bar:<30}] {pct:4.0%} {data.get('stage', '')}", end=end, file=sys.stderr)
    else:
        print(f"  {kind:<10}", file=sys.stderr)


def _report(job: dict[str, Any], as_json: bool, ok_canceled: bool = False) -> int:
    if as_json:
        print(orjson.dumps(job).decode())
    else:
        err = job.get("error") or {}
        line = f"{job['id']} {job['status']} {job.get('progress', 0):.0%}"
        if err:
            line += f" {err.get('code')}: {err.get('message')}"
        print(line)
    if job["status"] == "failed" or (job["status"] == "canceled" and not ok_canceled):
        return EXIT_JOB_FAILED
    return EXIT_OK
