"""structlog configuration: JSON events in production, readable lines on a terminal.

Configures output once per process; call sites bind `job_id`, `trace_id`, `stream`,
`attempt` through contextvars and never format strings themselves. No line may carry a
secret: tracebacks never show local variables, and secret-named fields are redacted.

Standard-library logging (aiohttp, asyncio, botocore, redis) goes through the same
processors and renderer, and so does a crash (an uncaught exception in the main thread or
another thread): in production every line on stderr is one JSON object.
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
from types import TracebackType
from typing import Any

import orjson
import structlog

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


# Libraries whose INFO lines are noise in a service's log (credential lookups, every retry).
_QUIET_LIBRARIES = ("botocore", "aiobotocore", "urllib3", "s3transfer")


def configure_logging(level: str = "info", fmt: str = "auto", service: str = "") -> None:
    """JSON (one object per line, orjson-encoded) unless `fmt` is console or a TTY in auto."""
    use_console = fmt == "console" or (fmt == "auto" and sys.stderr.isatty())
    processors: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        redact_secret_fields,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if service:
        processors.insert(0, _add_service(service))
    renderer: structlog.types.Processor
    if use_console:
        # Plain tracebacks: the default (rich, with show_locals) printed every frame's local
        # variables, which hold API keys, the whole Settings and request headers.
        renderer = structlog.dev.ConsoleRenderer(
            colors=sys.stderr.isatty(), exception_formatter=structlog.dev.plain_traceback
        )
        structlog.configure(
            processors=[*processors, renderer],
            wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
            logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
            cache_logger_on_first_use=True,
        )
    else:
        renderer = structlog.processors.JSONRenderer(serializer=_json_text)
        structlog.configure(
            processors=[
                *processors,
                structlog.processors.format_exc_info,
                structlog.processors.JSONRenderer(serializer=orjson.dumps),
            ],
            wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
            logger_factory=structlog.BytesLoggerFactory(file=sys.stderr.buffer),
            cache_logger_on_first_use=True,
        )
    _route_stdlib_logging(_LEVELS[level], processors, renderer, use_console)
    _log_crashes()


def _route_stdlib_logging(
    level: int,
    processors: list[structlog.types.Processor],
    renderer: structlog.types.Processor,
    use_console: bool,
) -> None:
    """The root logger's only handler renders records with structlog's processors."""
    pre_chain: list[structlog.types.Processor] = [
        *processors,
        structlog.stdlib.add_logger_name,
        structlog.stdlib.ExtraAdder(),
    ]
    if not use_console:
        pre_chain.append(structlog.processors.format_exc_info)
    handler = _StderrHandler()
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=pre_chain,
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        )
    )
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    for name in _QUIET_LIBRARIES:
        logging.getLogger(name).setLevel(max(level, logging.WARNING))
    logging.captureWarnings(True)  # warnings.warn() lines, too


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever `sys.stderr` is at the time of the record (as logging's own
    last-resort handler does), not the stream of the moment it was configured."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        """Ignored: the stream is always the current stderr."""


def _log_crashes() -> None:
    """An uncaught exception is logged as one `process.crashed` event, not a raw traceback."""
    crash_log = structlog.get_logger("splatq.crash")

    def excepthook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        if issubclass(kind, KeyboardInterrupt):
            sys.__excepthook__(kind, exc, tb)
            return
        crash_log.critical("process.crashed", exc_info=(kind, exc, tb))

    def thread_excepthook(args: threading.ExceptHookArgs) -> None:
        if args.exc_value is None or issubclass(args.exc_type, SystemExit):
            return
        crash_log.critical(
            "thread.crashed",
            thread=args.thread.name if args.thread is not None else "",
            exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
        )

    sys.excepthook = excepthook
    threading.excepthook = thread_excepthook


def _json_text(obj: Any, **kw: Any) -> str:
    """orjson for the stdlib handler, which writes text."""
    return orjson.dumps(obj, default=kw.get("default")).decode()


_SECRET_FIELDS = ("authorization", "api_key", "secret", "password", "token")


def redact_secret_fields(
    _logger: object, _name: str, event: structlog.types.EventDict
) -> structlog.types.EventDict:
    """Replace the value of any field whose name names a secret (a safety net: call sites
    should never pass one)."""
    for name in event:
        if _names_a_secret(name):
            event[name] = "<redacted>"
    return event


@functools.lru_cache(maxsize=4096)
def _names_a_secret(name: str) -> bool:
    """Cached: a process logs the same few dozen field names millions of times."""
    lowered = name.lower()
    return any(part in lowered for part in _SECRET_FIELDS)


def _add_service(service: str) -> structlog.types.Processor:
    def add(
        _logger: object, _name: str, event: structlog.types.EventDict
    ) -> structlog.types.EventDict:
        event.setdefault("service", service)
        return event

    return add
