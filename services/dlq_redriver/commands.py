"""`splatq redriver [--dry-run]` and `splatq tasks list | run | history`.

Exit codes: 0 done, 1 nothing to show, 3 refused (a task busy, a failed run), 78 configuration
(the policies file is invalid: the message names the file, entry and key).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
from datetime import UTC, datetime
from typing import Any

import orjson

from splatq.services.dlq_redriver.service import Redriver, build_scheduler
from splatq.shared.engine.metrics import register_build_info
from splatq.shared.engine.queue import JobQueue
from splatq.shared.liveness import health_endpoint
from splatq.shared.logs import configure_logging
from splatq.shared.maintenance.config import (
    ConfigError,
    RedriverConfig,
    load_config,
    retention_defaults,
)
from splatq.shared.maintenance.deadletters import DeadLetterBook
from splatq.shared.maintenance.metrics import RedriverMetrics
from splatq.shared.maintenance.store import Refusal
from splatq.shared.maintenance.sweep import KINDS, RedriveSweep
from splatq.shared.maintenance.tasks import redrive_sweep
from splatq.shared.redis.client import connect
from splatq.shared.settings import Settings, SettingsError

EXIT_OK, EXIT_NONE, EXIT_REFUSED, EXIT_CONFIG = 0, 1, 3, 78


def _config(settings: Settings) -> RedriverConfig | None:
    try:
        return load_config(settings.redriver_config, retention_defaults(settings))
    except ConfigError as exc:
        print(f"splatq: invalid redriver configuration: {exc}", file=sys.stderr)
        return None


def run_redriver_command(args: argparse.Namespace, settings: Settings) -> int:
    config = _config(settings)
    if config is None:
        return EXIT_CONFIG
    if args.dry_run:
        return asyncio.run(_dry_run(settings, config, args.json))
    asyncio.run(_serve(settings, config))
    return EXIT_OK


def run_tasks_command(args: argparse.Namespace, settings: Settings) -> int:
    config = _config(settings)
    if config is None:
        return EXIT_CONFIG
    return asyncio.run(_tasks(args, settings, config))


async def _serve(settings: Settings, config: RedriverConfig) -> None:
    configure_logging(settings.log_level, settings.log_format, "redriver")
    register_build_info(service="redriver")
    redis = connect(settings.redis_url, client_name="splatq-redriver")
    redriver = Redriver(JobQueue(redis, settings), settings, config, RedriverMetrics.create())
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, redriver.stop)
    try:
        async with health_endpoint(settings.metrics_port, settings.liveness_max_age_s):
            await redriver.run()
    finally:
        await redis.aclose()


async def _dry_run(settings: Settings, config: RedriverConfig, as_json: bool) -> int:
    redis = connect(settings.redis_url, client_name="splatq-redriver")
    try:
        queue = JobQueue(redis, settings)
        sweep = redrive_sweep(queue, config, "dry-run", None)
        rows = await _decisions(sweep, sweep.book, settings.partitions)
    finally:
        await redis.aclose()
    if as_json:
        print(orjson.dumps(rows).decode())
    else:
        print(f"policies from {config.source}")
        for r in rows:
            print(f"{r['id']:<28} {r['kind']:<8} {r['codes']:<32} {r['policy']:<24} "
                  f"{r['verdict']:<9} {r['why']}")  # fmt: skip
    return EXIT_OK if rows else EXIT_NONE


async def _decisions(
    sweep: RedriveSweep, book: DeadLetterBook, partitions: int
) -> list[dict[str, str]]:
    rows = []
    for kind in KINDS:
        for p in range(partitions):
            after = ""
            while letters := await book.page(kind, p, after, 500):
                subjects = await book.subjects(kind, letters)
                for s, d in zip(subjects, sweep.decisions(subjects), strict=True):
                    rows.append({"id": s.letter.id, "kind": kind.value,
                                 "codes": ",".join(sorted(s.view().codes)),
                                 "policy": d.policy, "verdict": d.verdict.value,
                                 "why": d.why})  # fmt: skip
                after = letters[-1].entry_id
    return rows


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds") if ms else "-"


async def _tasks(args: argparse.Namespace, settings: Settings, config: RedriverConfig) -> int:
    configure_logging(settings.log_level, settings.log_format, "tasks")
    redis = connect(settings.redis_url, client_name="splatq-tasks")
    try:
        queue = JobQueue(redis, settings)
        await queue.setup()
        scheduler = build_scheduler(queue, settings, config, holder=f"cli:{time.time_ns()}")
        if args.tasks_command != "list" and args.task not in scheduler.tasks:
            known = ", ".join(sorted(scheduler.tasks))
            print(f"splatq tasks: no task {args.task!r} (known: {known})", file=sys.stderr)
            return EXIT_REFUSED
        if args.tasks_command == "list":
            rows = []
            now = time.time()
            for name, task in scheduler.tasks.items():
                state = await scheduler.store.state(name)
                rows.append({"task": name, "schedule": task.schedule.expression,
                             "last_success": _when(state.last_success_ms),
                             "last_failure": _when(state.last_failure_ms),
                             "running": state.running, "checkpoint": state.checkpoint,
                             "next": _when(int(task.schedule.next_slot(now) * 1000))})  # fmt: skip
            _print(rows, args.json)
            return EXIT_OK
        if args.tasks_command == "history":
            history = await scheduler.store.history(args.task, args.limit)
            _print(history, args.json)
            return EXIT_OK if history else EXIT_NONE
        result = await scheduler.run_now(args.task)
        if isinstance(result, Refusal):
            print(f"splatq tasks: {args.task} not run: {result.why} {result.detail}",
                  file=sys.stderr)  # fmt: skip
            return EXIT_REFUSED
        _print([{"task": result.task, "outcome": result.outcome.value,
                 "summary": result.summary, "duration_s": round(result.duration_s, 3)}],
               args.json)  # fmt: skip
        return EXIT_OK if result.outcome.value == "success" else EXIT_REFUSED
    finally:
        await redis.aclose()


def _print(rows: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        print(orjson.dumps(rows).decode())
        return
    for row in rows:
        print("  ".join(f"{k}={v}" for k, v in row.items() if v not in ("", None)))


def main() -> int:
    parser = argparse.ArgumentParser(prog="splatq-redriver")
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--json", action="store_true")
    try:
        settings = Settings.from_env()
    except SettingsError as exc:
        print(f"splatq: configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    return run_redriver_command(parser.parse_args(), settings)
