"""Time as a parameter.

Services take a :class:`Clock`; pure logic takes ``now_ms``. Wall time (epoch
milliseconds) decides *when slots are due*; monotonic time decides *whether a
lease may have expired*, because wall clocks jump and monotonic ones do not.
Tests use :class:`FakeClock`, whose :meth:`FakeClock.advance` wakes sleepers.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from typing import Protocol


class Clock(Protocol):
    """What services may ask about time."""

    def now_ms(self) -> int:
        """Wall-clock time in epoch milliseconds (UTC)."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards (for lease safety)."""

    async def sleep(self, seconds: float) -> None:
        """Sleep ``seconds`` of this clock's time."""

    async def sleep_until_ms(self, wall_ms: int) -> None:
        """Sleep until wall time ``wall_ms`` (returns at once if it has passed)."""


class SystemClock:
    """The real clock."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    async def sleep_until_ms(self, wall_ms: int) -> None:
        # Re-check after waking: the wall clock may have been stepped.
        while True:
            remaining = wall_ms - self.now_ms()
            if remaining <= 0:
                return
            await asyncio.sleep(remaining / 1000)


class FakeClock:
    """A clock that only moves when a test calls :meth:`advance`.

    Wall and monotonic time move together. Sleepers are woken in deadline
    order when ``advance`` passes their deadline.
    """

    def __init__(self, start_ms: int = 1_767_225_600_000) -> None:
        self._wall_ms = start_ms
        self._mono = 1000.0
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def now_ms(self) -> int:
        return self._wall_ms

    def monotonic(self) -> float:
        return self._mono

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._mono + seconds, next(self._seq), future))
        await future

    async def sleep_until_ms(self, wall_ms: int) -> None:
        await self.sleep((wall_ms - self._wall_ms) / 1000)

    async def advance(self, seconds: float) -> None:
        """Move time forward and let every sleeper whose deadline passed run."""
        target = self._mono + seconds
        while self._sleepers and self._sleepers[0][0] <= target:
            deadline, _, future = heapq.heappop(self._sleepers)
            self._set(deadline)
            if not future.done():
                future.set_result(None)
            for _ in range(5):
                await asyncio.sleep(0)
        self._set(target)
        await asyncio.sleep(0)

    def _set(self, mono: float) -> None:
        self._wall_ms += round((mono - self._mono) * 1000)
        self._mono = mono

    @property
    def sleepers(self) -> int:
        """How many tasks are sleeping on this clock (for tests)."""
        return sum(1 for *_, f in self._sleepers if not f.done())
