"""structlog configuration: JSON events in production, readable lines on a terminal.

Configures output once per process; call sites bind `job_id`, `trace_id`, `stream`,
`attempt` through contextvars and never format strings themselves. No line may carry a
secret: tracebacks never show local variables, and secret-named fields are redacted.
"""

from __future__ import annotations

import functools
import logging
import sys

import orjson
import structlog

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


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
    if use_console:
        # Plain tracebacks: the default (rich, with show_locals) printed every frame's local
        # variables, which hold API keys, the whole Settings and request headers.
        processors.append(
            structlog.dev.ConsoleRenderer(
                colors=sys.stderr.isatty(), exception_formatter=structlog.dev.plain_traceback
            )
        )
        factory: structlog.types.WrappedLogger = structlog.PrintLoggerFactory(file=sys.stderr)
    else:
        processors.append(structlog.processors.format_exc_info)
        processors.append(structlog.processors.JSONRenderer(serializer=orjson.dumps))
        factory = structlog.BytesLoggerFactory(file=sys.stderr.buffer)
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=factory,
        cache_logger_on_first_use=True,
    )


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
