"""Poll a condition instead of sleeping a fixed time.

This is the only place in the tests allowed to sleep in a loop. A check is a
callable that returns a truthy value when the condition holds, and either
returns something falsy or raises ``AssertionError`` while it does not yet.
Any other exception is a real failure and propagates at once.

A check that only asserts passes by not raising: a ``None`` result counts as
success, while ``False``/``0``/empty results count as "not yet".
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

T = TypeVar("T")


class _Attempts:
    """What the last failed attempt said, to build the final error."""

    def __init__(self, timeout: float, message: str) -> None:
        self.timeout = timeout
        self.message = message
        self.error: AssertionError | None = None
        self.result: Any = None

    def failed(self, error: AssertionError | None, result: Any = None) -> None:
        self.error, self.result = error, result

    def final_error(self) -> AssertionError:
        if self.error is not None:
            if self.message:
                self.error.args = (f"{self.message}: {self.error}", *self.error.args[1:])
            return self.error
        hint = ""
        detail = f"condition not met within {self.timeout}s; last result {self.result!r}{hint}"
        return AssertionError(f"{self.message}: {detail}" if self.message else detail)


@overload
async def assert_eventually(
    check: Callable[[], Awaitable[T]],
    timeout: float = ...,
    interval: float = ...,
    message: str = ...,
) -> T: ...


@overload
async def assert_eventually(
    check: Callable[[], T],
    timeout: float = ...,
    interval: float = ...,
    message: str = ...,
) -> T: ...


async def assert_eventually(
    check: Callable[[], Any],
    timeout: float = 10.0,
    interval: float = 0.05,
    message: str = "",
) -> Any:
    """Retry ``check`` (sync or async) until it returns a truthy value, which is returned.

    After ``timeout`` seconds the last ``AssertionError`` is re-raised, or an
    ``AssertionError`` carrying ``message`` when the check only returned falsy.
    A check that hangs is not interrupted; keep each attempt short.
    """
    attempts = _Attempts(timeout, message)
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = check()
            if inspect.isawaitable(result):
                result = await result
        except AssertionError as error:
            attempts.failed(error)
        else:
            if result or result is None:
                return result
            attempts.failed(None, result)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise attempts.final_error()
        await asyncio.sleep(min(interval, remaining))


def wait_until(
    check: Callable[[], T],
    timeout: float = 10.0,
    interval: float = 0.05,
    message: str = "",
) -> T:
    """The blocking twin of :func:`assert_eventually`, for sync tests; ``check`` must be sync."""
    attempts = _Attempts(timeout, message)
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = check()
        except AssertionError as error:
            attempts.failed(error)
        else:
            if inspect.isawaitable(result):
                if inspect.iscoroutine(result):
                    result.close()  # never awaited: avoid the "never awaited" warning
                raise TypeError("wait_until() needs a sync check; use assert_eventually()")
            if result or result is None:
                return result
            attempts.failed(None, result)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise attempts.final_error()
        time.sleep(min(interval, remaining))
