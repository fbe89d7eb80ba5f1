"""Gathering windows: requests that may wait a moment, released together.

Below saturation, writes that could share a transaction rarely meet: at
300 runs a second each run's report went out alone, about one etcd
transaction per run (ADR 0012). A :class:`GatherWindow` holds back the
writes that can afford a short wait so that they reach the coalescing store
(``etcdsched.store.coalesce``) in the same event-loop turn and travel as one.
"""

from __future__ import annotations

import asyncio

from etcdsched.runtime.clock import Clock


class GatherWindow:
    """The first caller of :meth:`wait` opens a window of ``span_s``; it and
    everyone who calls while the window is open are released together when
    it closes. With nobody waiting, no window is open and nothing runs."""

    def __init__(self, clock: Clock, span_s: float) -> None:
        self.clock = clock
        self.span_s = span_s
        self._released: asyncio.Event | None = None
        self._closer: asyncio.Task[None] | None = None
        """Kept so the task is not garbage-collected while it sleeps."""

    async def wait(self) -> None:
        """Return when the current window closes (opening one if none is)."""
        if self._released is None:
            self._released = asyncio.Event()
            self._closer = asyncio.create_task(self._close(self._released))
        await self._released.wait()

    async def _close(self, released: asyncio.Event) -> None:
        try:
            await self.clock.sleep(self.span_s)
        finally:  # cancelled with its loop: release the waiters, never strand them
            if self._released is released:
                self._released = None
            released.set()
