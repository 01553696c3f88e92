"""The `splatq` command: `up` (the local stack), and each service on its own.

Argument parsing and process wiring only; services hold their own logic.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from splatq.services.client_cli import add_commands, run_client_command
from splatq.services.dlq_cli import add_commands as add_dlq_commands
from splatq.services.dlq_cli import run_dlq_command
from splatq.services.dlq_redriver.parser import add_commands as add_redriver_commands
from splatq.services.stack import DEFAULT_REDIS_PORT, run_stack
from splatq.services.tenant_cli import COMMANDS as TENANT_COMMANDS
from splatq.services.tenant_cli import add_commands as add_tenant_commands
from splatq.services.tenant_cli import run_tenant_command
from splatq.shared.engine.worker import load_handler_factory
from splatq.shared.settings import Settings, SettingsError

EXIT_USAGE = 2
EXIT_CONFIG = 78  # EX_CONFIG from sysexits.h
DEFAULT_HANDLER = "splatq.services.gpu_worker.handler:make"  # image -> 3D Gaussians


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="splatq", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="run the local stack in the foreground (Ctrl-C stops it)")
    up.add_argument("--data-dir", default=None, help="where var/redis lives (default ./var)")
    up.add_argument(
        "--redis-port",
        type=int,
        default=None,
        help="port of the embedded redis-server (default SPLATQ_EMBEDDED_REDIS_PORT, "
        f"else {DEFAULT_REDIS_PORT})",
    )
    sub.add_parser("gateway", help="run the REST gateway (SPLATQ_GATEWAY_PORT)")
    sub.add_parser("dispatcher", help="run the webhook dispatcher")
    sub.add_parser("settler", help="run the GPU-quota settler (settles/releases reservations)")
    add_commands(sub)
    add_dlq_commands(sub)
    add_tenant_commands(sub)
    add_redriver_commands(sub)
    d = sub.add_parser("demo", help="run the stack, reconstruct the bundled sample, verify")
    d.add_argument("--quality", choices=["preview", "full"], default="preview")
    d.add_argument("--out", default="out", help="where the artifacts go (default ./out)")
    w = sub.add_parser("worker", help="run one worker process")
    w.add_argument(
        "--handler",
        default=None,
        help="job handler factory 'package.module:factory' (default: SPLATQ_JOB_HANDLER, "
        "else the GPU reconstruction handler)",
    )
    w.add_argument("--concurrency", type=int, default=None, help="slots (default from env)")
    return p


def main(argv: Sequence[str] | None = None) -> int:  # noqa: PLR0911 - a branch per family
    args = _parser().parse_args(argv)
    try:
        settings = Settings.from_env()
    except SettingsError as exc:
        print(f"splatq: configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    if args.command in {"submit", "status", "cancel"}:
        return run_client_command(args, settings)
    if args.command == "dlq":
        return run_dlq_command(args, settings)
    if args.command in TENANT_COMMANDS:
        return run_tenant_command(args, settings)
    if args.command in {"redriver", "tasks"}:
        from splatq.services.dlq_redriver import commands as redriver  # noqa: PLC0415

        if args.command == "redriver":
            return redriver.run_redriver_command(args, settings)
        return redriver.run_tasks_command(args, settings)
    commands: dict[str, Callable[[argparse.Namespace, Settings], int]] = {
        "up": _up,
        "demo": _demo,
        "gateway": _gateway,
        "dispatcher": _dispatcher,
        "settler": _settler,
        "worker": lambda a, s: _worker(s, a.handler, a.concurrency),
    }
    return commands[args.command](args, settings) if args.command in commands else EXIT_USAGE


def _up(args: argparse.Namespace, settings: Settings) -> int:
    if args.data_dir:
        settings = settings.with_overrides(data_dir=Path(args.data_dir))
    port = args.redis_port or settings.embedded_redis_port
    return asyncio.run(run_stack(settings, redis_port=port))


def _demo(args: argparse.Namespace, settings: Settings) -> int:
    from splatq.services.gpu_worker.demo import run_demo  # noqa: PLC0415 - torch import is slow

    out = Path(args.out)
    return asyncio.run(run_stack(settings, lambda s: run_demo(s, out, args.quality)))


def _dispatcher(args: argparse.Namespace, settings: Settings) -> int:
    from splatq.services.webhook_dispatcher.__main__ import run  # noqa: PLC0415

    asyncio.run(run(settings))
    return 0


def _settler(args: argparse.Namespace, settings: Settings) -> int:
    from splatq.services.quota_settler.__main__ import run  # noqa: PLC0415

    asyncio.run(run(settings))
    return 0


def _gateway(args: argparse.Namespace, settings: Settings) -> int:
    from splatq.services.gateway.__main__ import main as gateway_main  # noqa: PLC0415

    gateway_main()
    return 0


def _worker(settings: Settings, handler: str | None, concurrency: int | None) -> int:
    # Imported here so `splatq --help` and `splatq up` stay fast (no torch, no prometheus).
    from splatq.shared.engine.runner import run_worker  # noqa: PLC0415

    spec = handler or settings.job_handler or DEFAULT_HANDLER
    try:
        factory = load_handler_factory(spec)
    except (ValueError, ImportError, AttributeError) as exc:
        print(f"splatq worker: cannot load handler {spec!r}: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    if concurrency is not None:
        settings = settings.with_overrides(worker_concurrency=concurrency)
    asyncio.run(run_worker(settings, factory))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
