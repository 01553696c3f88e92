"""One exception hierarchy for job outcomes: every error carries a stable `code`.

Mapped once to retry decisions (`splatq.shared.engine.retries`) and, in the gateway, once
to HTTP problems.
"""

from __future__ import annotations

from dataclasses import dataclass

# Stable codes the engine itself produces (handlers add their own, e.g. CUDA_OUT_OF_MEMORY).
DEAD_LETTERED = "dead_lettered"
UNEXPECTED_ERROR = "UNEXPECTED_ERROR"
REDIS_UNAVAILABLE = "REDIS_UNAVAILABLE"
TIMEOUT = "TIMEOUT"
CORRUPT_JOB_RECORD = "CORRUPT_JOB_RECORD"
# A handler returned an outcome that cannot be stored (a None or non-string field value).
INVALID_OUTCOME = "INVALID_OUTCOME"


class SplatqError(Exception):
    """Base class: an error with a stable machine-readable code."""

    code: str = UNEXPECTED_ERROR
    retryable: bool = False

    def __init__(self, message: str = "", *, code: str | None = None) -> None:
        super().__init__(message or self.__class__.__name__)
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class PermanentError(SplatqError):
    """Retrying cannot help (corrupt input, a model that cannot fit): fail the job now."""

    retryable = False


class TransientError(SplatqError):
    """Retrying later may help (a storage timeout, a busy dependency): back off and retry."""

    retryable = True


class Deferred(Exception):
    """Raised by a handler: the job cannot run now for a reason outside it (a vendor said
    "later", its circuit is open). The job goes back on the delayed set for `delay_ms`, and
    the attempt and the delivery this run used are given back: it did nothing wrong. The
    handler bounds how long a job may keep deferring (e.g. UPSTREAM_UNAVAILABLE after a wait)."""

    def __init__(self, delay_ms: int, reason: str) -> None:
        super().__init__(f"deferred {delay_ms} ms: {reason}")
        self.delay_ms = max(0, int(delay_ms))
        self.reason = reason


class JobCanceled(Exception):
    """Raised inside a handler when the user canceled the job; ends it `canceled`."""


class LeaseLost(Exception):
    """This worker no longer holds the job's lease: stop and commit nothing."""


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """What is stored on the job and sent in the `failed` event."""

    code: str
    message: str
    retryable: bool


def classify(exc: BaseException) -> ErrorInfo:
    """Map any exception to a code and a retry class.

    Unknown exceptions are treated as transient: a bug retried a few times costs compute,
    a flaky dependency wrongly failed costs the user's job.
    """
    if isinstance(exc, SplatqError):
        return ErrorInfo(exc.code, exc.message, exc.retryable)
    if isinstance(exc, TimeoutError):
        return ErrorInfo(TIMEOUT, str(exc) or "operation timed out", True)
    message = f"{type(exc).__name__}: {exc}"[:500]
    return ErrorInfo(UNEXPECTED_ERROR, message, True)
