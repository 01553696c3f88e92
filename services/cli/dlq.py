"""`splatq dlq list | show | redrive | purge`: operate the dead-letter streams of jobs
(`--kind jobs`, the default) and of webhook messages (`--kind webhooks`).

Talks to Redis directly (SPLATQ_REDIS_URL), through `JobQueue` / `WebhookStore`. Redrives and
purges are recorded in the entry's audit trail as done by a person (`--as NAME`, else the
login), in the same script as the action; `show` prints the trail. Exit codes:
0 done, 1 nothing matched, 3 some entries could not be redriven/purged (or a bad id),
78 configuration.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from datetime import UTC, datetime
from typing import Any, Protocol

import orjson

from splatq.shared.engine.queue import DeadLetter, JobQueue
from splatq.shared.engine.stages import PIPELINE, PipelineStage
from splatq.shared.maintenance.audit import person_actor
from splatq.shared.maintenance.deadletters import DeadLetterBook
from splatq.shared.maintenance.dlq_ops import AuditedDeadLetters, describe
from splatq.shared.maintenance.keys import DeadLetterKind
from splatq.shared.redis.client import connect
from splatq.shared.settings import Settings
from splatq.shared.webhooks.store import WebhookStore

EXIT_OK, EXIT_NONE, EXIT_REFUSED = 0, 1, 3


def add_commands(sub: Any) -> None:
    dlq = sub.add_parser(
        "dlq", help="inspect, redrive or purge dead-lettered jobs and webhook messages"
    )
    verbs = dlq.add_subparsers(dest="dlq_command", required=True)
    lst = verbs.add_parser("list", help="list dead-letter entries")
    show = verbs.add_parser("show", help="show one entry")
    show.add_argument("id", help="<partition>/<entry id>, as `list` prints")
    for name in ("redrive", "purge"):
        p = verbs.add_parser(name, help=f"{name} entries (by id, or --all with filters)")
        p.add_argument("ids", nargs="*", help="<partition>/<entry id> ...")
        p.add_argument("--all", action="store_true", help="every entry matching the filters")
        p.add_argument("--dry-run", action="store_true", help="say what would happen, do nothing")
        p.add_argument("--as", dest="actor", default="", help="who acts (for the audit trail)")
    verbs.choices["redrive"].add_argument(
        "--from-stage",
        choices=[s.value for s in PIPELINE],
        default=None,
        help="staged jobs: run this stage and every later one again (their ledger records "
        "are cleared; earlier stages that succeeded are skipped). Default: resume at the "
        "stage that failed",
    )
    for p in verbs.choices.values():
        p.add_argument(
            "--kind",
            choices=["jobs", "webhooks"],
            default="jobs",
            help="dead-lettered jobs (default) or webhook messages",
        )
    for p in (lst, *(verbs.choices[n] for n in ("redrive", "purge"))):
        p.add_argument("--code", default=None, help="only entries with this reason code")
        p.add_argument("--since", default=None, help="only entries since (ISO 8601 or Unix s)")
    for p in verbs.choices.values():
        p.add_argument("--json", action="store_true", help="machine-readable output")


def run_dlq_command(args: argparse.Namespace, settings: Settings) -> int:
    try:
        since_ms = _parse_since(args.since) if getattr(args, "since", None) else None
    except ValueError as exc:
        print(f"splatq dlq: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    return asyncio.run(_run(args, settings, since_ms))


def _parse_since(value: str) -> int:
    if value.replace(".", "", 1).isdigit():
        return int(float(value) * 1000)
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"--since must be ISO 8601 or Unix seconds, got {value!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


class DeadLetters(Protocol):
    """What the commands need of a dead-letter kind (JobQueue for jobs, WebhookStore for
    webhook messages)."""

    async def dead_letters(self, partition: int, count: int = ...) -> list[DeadLetter]: ...
    async def dead_letter(self, dlq_id: str) -> DeadLetter | None: ...
    async def redrive(self, letter: DeadLetter) -> tuple[str, str]: ...
    async def purge_dead_letter(self, letter: DeadLetter) -> bool: ...


async def _run(args: argparse.Namespace, settings: Settings, since_ms: int | None) -> int:
    redis = connect(settings.redis_url, client_name="splatq-dlq")
    jobs = JobQueue(redis, settings)
    queue: DeadLetters = WebhookStore(jobs) if args.kind == "webhooks" else jobs
    raw_stage = getattr(args, "from_stage", None)
    audited = AuditedDeadLetters(
        DeadLetterBook(jobs),
        DeadLetterKind(args.kind),
        person_actor(getattr(args, "actor", "")),
        PipelineStage(raw_stage) if raw_stage else None,
    )
    try:
        await jobs.scripts.load()
        if args.dlq_command == "show":
            try:
                letter = await queue.dead_letter(args.id)
            except ValueError as exc:
                print(f"splatq dlq: {exc}", file=sys.stderr)
                return EXIT_REFUSED
            if letter is None:
                print(f"splatq dlq: no entry {args.id}", file=sys.stderr)
                return EXIT_NONE
            described = describe(letter)
            described["audit"] = await audited.audit_trail(letter)
            print(orjson.dumps(described, option=orjson.OPT_INDENT_2).decode())
            return EXIT_OK
        letters = await _select(queue, args, since_ms, settings.partitions)
        if letters is None:
            return EXIT_REFUSED
        if args.dlq_command == "list":
            return _print_list(letters, args.json)
        return await _act(audited, args, letters)
    finally:
        await redis.aclose()


async def _select(
    queue: DeadLetters, args: argparse.Namespace, since_ms: int | None, partitions: int
) -> list[DeadLetter] | None:
    if args.dlq_command in {"redrive", "purge"} and not args.all and not args.ids:
        print(f"splatq dlq {args.dlq_command}: give entry ids or --all", file=sys.stderr)
        return None
    if args.dlq_command in {"redrive", "purge"} and args.ids:
        letters = []
        for dlq_id in args.ids:
            try:
                letter = await queue.dead_letter(dlq_id)
            except ValueError as exc:
                print(f"splatq dlq: {exc}", file=sys.stderr)
                return None
            if letter is None:
                print(f"splatq dlq: no entry {dlq_id}", file=sys.stderr)
                return None
            letters.append(letter)
    else:
        letters = [letter for p in range(partitions) for letter in await queue.dead_letters(p)]
    return [
        letter for letter in letters
        if (args.code is None or letter.reason == args.code)
        and (since_ms is None or letter.at_ms >= since_ms)
    ]  # fmt: skip


def _print_list(letters: list[DeadLetter], as_json: bool) -> int:
    if as_json:
        print(orjson.dumps([describe(x) for x in letters]).decode())
    else:
        for x in letters:
            print(f"{x.id}  {x.reason:<26} {x.job_id or '-':<36} {describe(x)['at']}")
    return EXIT_OK if letters else EXIT_NONE


async def _act(
    queue: AuditedDeadLetters, args: argparse.Namespace, letters: list[DeadLetter]
) -> int:
    results: list[dict[str, Any]] = []
    refused = 0
    for letter in letters:
        if args.dry_run:
            outcome, detail = "would_" + args.dlq_command, ""
        elif args.dlq_command == "redrive":
            outcome, detail = await queue.redrive(letter)
        else:
            outcome = "purged" if await queue.purge_dead_letter(letter) else "gone"
            detail = ""
        refused += outcome in {"not_redrivable", "gone"}
        results.append(
            {"id": letter.id, "job_id": letter.job_id or None, "outcome": outcome, "detail": detail}
        )
    if args.json:
        print(orjson.dumps(results).decode())
    else:
        for r in results:
            print(f"{r['id']}  {r['outcome']}  {r['job_id'] or ''} {r['detail']}".rstrip())
    if not letters:
        return EXIT_NONE
    return EXIT_REFUSED if refused else EXIT_OK
