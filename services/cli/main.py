"""The `splatq` command: `up` (the local stack), and each service on its own.

Argument parsing and process wiring only; services hold their own logic.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from splatq.services.cli.client import add_commands, run_client_command
from splatq.services.cli.dlq import add_commands as add_dlq_commands
from splatq.services.cli.dlq import run_dlq_command
from splatq.services.cli.health import check_gateway, check_redis
from splatq.services.cli.info import add_command as add_info_command
from splatq.services.cli.info import run_info_command
from splatq.services.cli.tenant import COMMANDS as TENANT_COMMANDS
from splatq.services.cli.tenant import add_commands as add_tenant_commands
from splatq.services.cli.tenant import run_tenant_command
from splatq.services.dlq_redriver.parser import add_commands as add_redriver_commands
from splatq.services.stack import (
    DEFAULT_REDIS_PORT,
    METRICS_PORT_OFFSETS,
    WORKER_STAGES,
    WorkerProcess,
    run_stack,
)
from splatq.shared import __version__
from splatq.shared.engine.job_context import load_handler_factory
from splatq.shared.engine.keys import STREAMS, StreamName
from splatq.shared.engine.stages import PipelineStage, parse_stage_list
from splatq.shared.engine.worker_classes import parse_class_list
from splatq.shared.settings import Settings, SettingsError

EXIT_USAGE = 2
EXIT_CONFIG = 78  # EX_CONFIG from sysexits.h
DEFAULT_HANDLER = "splatq.services.gpu_worker.handler:make"  # image -> 3D Gaussians

_DEFAULTS = Settings()
_OFFSETS = textwrap.fill(
    "under `up` a base: "
    + ", ".join(f"{name} +{offset}" for name, offset in METRICS_PORT_OFFSETS.items()),
    width=90,
    initial_indent=" " * 24,
    subsequent_indent=" " * 24,
)
EPILOG = f"""\
exit codes (every command):
  0   success (a --check: healthy)
  1   the job failed or was canceled; a --check: unhealthy; a service stopped on error
  2   usage error
  3   refused: the API answered 4xx, or the operation was refused
  4   unavailable: the API or Redis could not be reached, or answered 5xx
  78  configuration error (an invalid SPLATQ_* value, no API key, a bad handler)

environment (the most used; README lists every SPLATQ_* variable):
  SPLATQ_REDIS_URL      Redis for the services, `info`, `dlq` (default: `up` runs its own)
  SPLATQ_API_URL        gateway URL for submit/status/cancel/jobs
  SPLATQ_API_KEY        API key for submit/status/cancel/jobs
  SPLATQ_API_KEYS       the gateway's keys, "tenant:key,..."
  SPLATQ_GATEWAY_PORT   the gateway's port (default {_DEFAULTS.gateway_port})
  SPLATQ_METRICS_PORT   /metrics (and /livez) of a worker, dispatcher, redriver, settler
                        or gateway (without it the gateway's is behind the admin key);
{_OFFSETS}
  SPLATQ_STORAGE_URL    file:///path or s3://bucket/prefix
  SPLATQ_LOG_FORMAT     json | console | auto
"""

CHECK_HELP = (
    "probe this service's health once and exit 0 (healthy) or 1: for Kubernetes exec probes"
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="splatq",
        description=__doc__.splitlines()[0],
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"splatq {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    up = sub.add_parser("up", help="run the local stack in the foreground (Ctrl-C stops it)")
    up.add_argument("--data-dir", default=None, help="where var/redis lives (default ./var)")
    up.add_argument(
        "--redis-port",
        type=int,
        default=None,
        help="port of the embedded redis-server (default SPLATQ_EMBEDDED_REDIS_PORT, "
        f"else {DEFAULT_REDIS_PORT})",
    )
    g = sub.add_parser("gateway", help="run the REST gateway (SPLATQ_GATEWAY_PORT)")
    g.add_argument("--check", action="store_true", help=CHECK_HELP + " (GET /readyz)")
    dsp = sub.add_parser("dispatcher", help="run the webhook dispatcher")
    dsp.add_argument("--check", action="store_true", help=CHECK_HELP + " (Redis PING)")
    st = sub.add_parser("settler", help="run the GPU-quota settler (settles/releases reservations)")
    st.add_argument("--check", action="store_true", help=CHECK_HELP + " (Redis PING)")
    add_commands(sub)
    add_tenant_commands(sub)
    add_info_command(sub)
    add_dlq_commands(sub)
    add_redriver_commands(sub)
    sub.choices["redriver"].add_argument(
        "--check", action="store_true", help=CHECK_HELP + " (Redis PING)"
    )
    d = sub.add_parser("demo", help="run the stack, reconstruct the bundled sample, verify")
    d.add_argument(
        "--quality", choices=["preview", "full"], default="preview", help="default preview"
    )
    d.add_argument("--out", default="out", help="where the artifacts go (default ./out)")
    w = sub.add_parser("worker", help="run one worker process")
    w.add_argument(
        "--handler",
        default=None,
        help="job handler factory 'package.module:factory' (default: SPLATQ_JOB_HANDLER, "
        "else the GPU reconstruction handler, which needs the `worker` extra)",
    )
    w.add_argument("--concurrency", type=int, default=None, help="slots (default from env)")
    w.add_argument(
        "--burst",
        action="store_true",
        help="drain: exit 0 once nothing waits, is delayed or runs in this worker's partitions",
    )
    w.add_argument(
        "--stages",
        default=None,
        help="run these pipeline stages instead of whole jobs: comma-separated among ingest, "
        "reconstruct, export, render, publish, cleanup, or `all` (default: SPLATQ_STAGES; "
        "unset = whole jobs). A GPU pod runs `reconstruct`, a CPU pod the rest",
    )
    w.add_argument(
        "--classes",
        default=None,
        help="serve these job classes only: interactive, synthesis, or both (default: "
        "SPLATQ_WORKER_CLASSES, else both); a synthesis-only process runs niced as a whole",
    )
    w.add_argument(
        "--stage-handlers",
        default=None,
        help="stage handlers factory 'package.module:factory' (default: SPLATQ_STAGE_HANDLERS, "
        "else the 3DGS stages)",
    )
    w.add_argument("--check", action="store_true", help=CHECK_HELP + " (Redis PING)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        settings = Settings.from_env()
    except SettingsError as exc:
        print(f"splatq: configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    if getattr(args, "check", False):
        if args.command == "gateway":
            return check_gateway(settings)
        return check_redis(args.command, settings)
    command = _COMMANDS.get(args.command)
    return command(args, settings) if command is not None else EXIT_USAGE


def _redriver(args: argparse.Namespace, settings: Settings) -> int:
    from splatq.services.dlq_redriver import commands as redriver  # noqa: PLC0415

    if args.command == "redriver":
        return redriver.run_redriver_command(args, settings)
    return redriver.run_tasks_command(args, settings)


def _up(args: argparse.Namespace, settings: Settings) -> int:
    if args.data_dir:
        settings = settings.with_overrides(data_dir=Path(args.data_dir))
    port = args.redis_port or settings.embedded_redis_port
    return asyncio.run(run_stack(settings, redis_port=port))


def _demo(args: argparse.Namespace, settings: Settings) -> int:
    try:  # torch import is slow: only here
        from splatq.services.demo import run_demo  # noqa: PLC0415
    except ImportError as exc:
        print(f"splatq demo: {exc}; install the worker extra: pip install 'splatq[worker]'",
              file=sys.stderr)  # fmt: skip
        return EXIT_CONFIG
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

    return _configured("gateway", gateway_main)


def _worker(args: argparse.Namespace, settings: Settings) -> int:
    # Imported here so `splatq --help` and `splatq up` stay fast (no torch, no prometheus).
    from splatq.shared.engine.runner import run_worker  # noqa: PLC0415

    if args.concurrency is not None:
        settings = settings.with_overrides(worker_concurrency=args.concurrency)
    try:
        classes = _names("--classes", parse_class_list, args.classes, settings.worker_classes)
        stages = _names("--stages", parse_stage_list, args.stages, settings.stages)
    except ValueError as exc:
        print(f"splatq worker: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    settings = settings.with_overrides(worker_classes=classes)
    if stages:
        if args.burst:
            print("splatq worker: --burst runs whole jobs; drop --stages", file=sys.stderr)
            return EXIT_CONFIG
        return _stage_worker(args, settings, tuple(PipelineStage(s) for s in stages))

    spec = args.handler or settings.job_handler or DEFAULT_HANDLER
    factory = _load_factory(spec, DEFAULT_HANDLER, "handler", "the default handler needs")
    if factory is None:
        return EXIT_CONFIG
    return _configured(
        "worker", lambda: asyncio.run(run_worker(settings, factory, burst=args.burst))
    )


def _names(
    option: str,
    parse: Callable[[str], tuple[Any, ...]],
    given: str | None,
    default: tuple[str, ...],
) -> tuple[str, ...]:
    """A comma-separated option's names, checked (ValueError names the option), else the
    setting's."""
    if given is None:
        return default
    try:
        return tuple(n.value for n in parse(given))
    except ValueError as exc:
        raise ValueError(f"{option}: {exc}") from None


def _load_factory(spec: str, default: str, what: str, needs: str) -> Any:
    """`package.module:factory`, or None after saying why on stderr (a config error)."""
    try:
        return load_handler_factory(spec)
    except (ValueError, ImportError, AttributeError) as exc:
        hint = ""
        if spec == default and isinstance(exc, ImportError):
            hint = f"; {needs} the worker extra: pip install 'splatq[worker]'"
        print(f"splatq worker: cannot load {what} {spec!r}: {exc}{hint}", file=sys.stderr)
        return None


def _stage_worker(
    args: argparse.Namespace, settings: Settings, stages: tuple[PipelineStage, ...]
) -> int:
    from splatq.shared.engine.stage_runner import (  # noqa: PLC0415
        DEFAULT_STAGE_HANDLERS,
        run_stage_workers,
    )

    spec = args.stage_handlers or settings.stage_handlers or DEFAULT_STAGE_HANDLERS
    factory = _load_factory(spec, DEFAULT_STAGE_HANDLERS, "stage handlers", "the 3DGS stages need")
    if factory is None:
        return EXIT_CONFIG
    service = stage_service(stages, parse_class_list(settings.worker_classes))
    return _configured(
        "worker", lambda: asyncio.run(run_stage_workers(settings, factory, stages, service))
    )


def _configured(command: str, run: Callable[[], object]) -> int:
    """Run a service; a configuration it finds unusable only as it starts (a handler
    factory's SettingsError, e.g. SPLATQ_FOREGROUND=learned without its model file; a hosted
    model's vendor file or its secret) is exit 78 with the reason on stderr, not a
    traceback."""
    from splatq.shared.vendor.config import VendorConfigError  # noqa: PLC0415

    try:
        run()
    except (SettingsError, VendorConfigError) as exc:
        print(f"splatq {command}: configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    return 0


def stage_service(
    stages: tuple[PipelineStage, ...], classes: tuple[StreamName, ...] = STREAMS
) -> str:
    """The service name a staged worker logs under and reports in splatq_build_info: that of
    its pod kind (`worker-gpu`: the device stages, `worker-cpu`: all the others, as
    `splatq up` and k8s/base run them) with its class when it serves one
    (`worker-cpu-synthesis`), else `worker`."""
    kind = next((name for name, kind in WORKER_STAGES.items() if kind == stages), None)
    if kind is None:
        return "worker"
    return WorkerProcess(kind, classes).name


_COMMANDS: dict[str, Callable[[argparse.Namespace, Settings], int]] = {
    "submit": run_client_command,
    "status": run_client_command,
    "cancel": run_client_command,
    "jobs": run_client_command,
    "info": run_info_command,
    "dlq": run_dlq_command,
    "redriver": _redriver,
    "tasks": _redriver,
    "up": _up,
    "demo": _demo,
    "gateway": _gateway,
    "dispatcher": _dispatcher,
    "settler": _settler,
    "worker": _worker,
    **dict.fromkeys(TENANT_COMMANDS, run_tenant_command),
}


if __name__ == "__main__":
    raise SystemExit(main())
