"""`eventually`: poll until a condition holds, the one wait every splatq test uses.

A condition is a callable that takes no argument and returns (or, async, resolves to) a value:
truthy means done, and that value is returned; falsy means not yet. An exception from the
condition ends the wait at once (an `assert` inside it is an invariant that must hold at every
poll), unless its type is in `retry_on` (`retry_on=AssertionError`: "assert what you expect,
until it holds"). On timeout an `AssertionError` names what was awaited, the time waited and
the last value observed (or the last retried exception, chained as its cause), so a failing
test says what it last saw, not only that it waited.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar, overload

T = TypeVar("T")
# What is waited for, in the timeout's message: a string, or a function called then (a log's
# tail, a process's output: what the test would print on failure).
Message = str | Callable[[], str] | None
# Exceptions from the condition that mean "not yet" instead of ending the wait.
RetryOn = type[Exception] | tuple[type[Exception], ...]

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_INTERVAL_S = 0.02


class _Attempts:
    """What the polls saw: the last value (or retried exception) for the timeout's message."""

    def __init__(
        self,
        condition: Callable[..., object],
        message: Message,
        retry_on: RetryOn,
        timeout: float,
        now: float,
    ) -> None:
        self.condition = condition
        self.message = message
        self.retry_on = retry_on
        self.timeout = timeout
        self.deadline = now + timeout
        self.last_value: object = None
        self.last_error: Exception | None = None
        self.polls = 0

    def observed(self, value: object) -> bool:
        self.polls += 1
        self.last_value, self.last_error = value, None
        return bool(value)

    @contextlib.contextmanager
    def attempt(self) -> Iterator[None]:
        """One call of the condition: an exception of `retry_on` is recorded (not yet)."""
        try:
            yield
        except self.retry_on as e:
            self.polls += 1
            self.last_value, self.last_error = None, e

    def give_up_at(self, now: float) -> None:
        if now >= self.deadline:
            raise self.timeout_error()

    def timeout_error(self) -> AssertionError:
        name = getattr(self.condition, "__qualname__", None) or repr(self.condition)
        message = self.message() if callable(self.message) else self.message
        what = message or f"condition {name}"
        last = (
            f"last raised {self.last_error!r}"
            if self.last_error is not None
            else f"last value {self.last_value!r}"
        )
        error = AssertionError(
            f"{what} not met within {self.timeout}s ({self.polls} polls); {last}"
        )
        error.__cause__ = self.last_error
        return error


@overload
async def eventually(
    condition: Callable[[], Awaitable[T]],
    timeout: float = ...,  # noqa: ASYNC109
    interval: float = ...,
    *,
    message: Message = ...,
    retry_on: RetryOn = ...,
) -> T: ...


@overload
async def eventually(
    condition: Callable[[], T],
    timeout: float = ...,  # noqa: ASYNC109
    interval: float = ...,
    *,
    message: Message = ...,
    retry_on: RetryOn = ...,
) -> T: ...


async def eventually(
    condition: Callable[[], Any],
    # ASYNC109: the bound is the poll's own (it calls between sleeps), not a cancellation
    timeout: float = DEFAULT_TIMEOUT_S,  # noqa: ASYNC109
    interval: float = DEFAULT_INTERVAL_S,
    *,
    message: Message = None,
    retry_on: RetryOn = (),
) -> Any:
    """Call `condition` every `interval` seconds until it returns a truthy value (awaited if
    it is awaitable), and return that value. An exception from `condition` propagates at once
    unless it is one of `retry_on` (then: not yet). After `timeout` seconds: `AssertionError`
    with `message` (what was awaited; a function is called then) and the last value observed.

    The condition is always called at least once, even with `timeout=0`."""
    loop = asyncio.get_running_loop()
    attempts = _Attempts(condition, message, retry_on, timeout, loop.time())
    while True:
        with attempts.attempt():
            value = condition()
            if inspect.isawaitable(value):
                value = await value
            if attempts.observed(value):
                return value
        attempts.give_up_at(loop.time())
        await asyncio.sleep(interval)


def eventually_sync(
    condition: Callable[[], T],
    timeout: float = DEFAULT_TIMEOUT_S,
    interval: float = DEFAULT_INTERVAL_S,
    *,
    message: Message = None,
    retry_on: RetryOn = (),
) -> T:
    """`eventually` for code without an event loop (a subprocess's readiness from a plain
    test or fixture): the same poll, run in an event loop of its own -- so it refuses to run
    where an event loop is already running (use `eventually` there). `condition` must not
    be async."""
    if _loop_running():
        raise RuntimeError("eventually_sync would block the running event loop: use eventually")

    def plain() -> T:
        return _not_awaitable(condition())

    name = getattr(condition, "__qualname__", None) or repr(condition)
    return asyncio.run(
        eventually(
            plain,
            timeout,
            interval,
            message=message if message is not None else f"condition {name}",
            retry_on=retry_on,
        )
    )


def _not_awaitable(value: T) -> T:
    if inspect.isawaitable(value):
        if inspect.iscoroutine(value):
            value.close()  # never awaited: no "was never awaited" warning
        raise TypeError("eventually_sync got an awaitable: use `await eventually(...)`")
    return value


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
