"""The one-way flags that interrupt an attempt on its worker (cancel,
revoke, shutdown, halt), and waiting for whichever comes first.

Every attempt waits on all three at its gate, and a job's process on them
as well. With ``asyncio.Event`` that took a task per flag per wait: three
tasks and their wake-ups for every run, a visible share of a worker's CPU
at thousands of runs a second. Here a wait on several flags is one future,
resolved by whichever flag is set first.
"""

from __future__ import annotations

import asyncio
from typing import Any


class Interrupt:
    """A flag that is set once and stays set (like ``asyncio.Event``)."""

    __slots__ = ("_set", "_waiters")

    def __init__(self) -> None:
        self._set = False
        self._waiters: list[asyncio.Future[None]] = []
        """Futures of :func:`first_of` waiting on this flag (maybe on others too)."""

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        if self._set:
            return
        self._set = True
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def wait(self) -> None:
        if not self._set:
            await first_of(self)

    def add_waiter(self, waiter: asyncio.Future[None]) -> None:
        """Resolve ``waiter`` when this flag is set; waiters already done
        (their wait ended another way) are dropped here."""
        self._waiters = [w for w in self._waiters if not w.done()]
        self._waiters.append(waiter)


def first_of(*flags: Interrupt) -> asyncio.Future[None]:
    """A future resolved as soon as any of ``flags`` is set (at once if one
    already is). Cancel it when done waiting: a flag set later skips it."""
    waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    if any(flag.is_set() for flag in flags):
        waiter.set_result(None)
        return waiter
    for flag in flags:
        flag.add_waiter(waiter)
    return waiter


async def wait_or_interrupt(
    awaited: asyncio.Future[Any], *flags: Interrupt, timeout: float | None = None
) -> None:
    """Return when ``awaited`` is done, when any of ``flags`` is set (at
    once if one already is), or after ``timeout`` seconds, whichever comes
    first; the caller tells which by looking. ``awaited`` is left as it is."""
    interrupted = first_of(*flags)
    either: list[asyncio.Future[Any]] = [awaited, interrupted]
    try:
        await asyncio.wait(either, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        interrupted.cancel()
