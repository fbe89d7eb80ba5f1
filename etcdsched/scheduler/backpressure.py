"""Firing waits for placement when placement falls behind.

Firing a slot (one batched transaction per granule) is cheaper than placing
its run, and firing goes first. Past the ceiling a scheduler kept firing at
the offered rate while its runs piled up in the queues, and that firing took
CPU the rest of the pipeline needed: with the bench's 256-slot worker, 2,000
no-op slots/s offered fired 1,495/s and finished 1,276/s, below the 1,600/s
the same machine carries in full (ADR 0014). Holding firing while the runs
it made wait unread keeps the CPU on runs that finish (1,639/s at 2,000
offered); the slots not yet fired wait in the due index, where waiting costs
nothing, and are fired as placement catches up, the job's misfire policy
deciding about any later than its grace.

The brake counts only runs this scheduler fired that placement has not yet
looked at (:meth:`~etcdsched.scheduler.placer.PartitionPlacer.unexamined`): runs it
looked at and could not place (no worker with the labels, ``queue_one``) do
not hold firing, and neither do retries waiting out their backoff. With
every worker full, placement looks at nothing, so at most
:data:`BACKLOG_LIMIT` fired runs wait in the queue for room and the later
slots wait unfired.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from etcdsched.config import BACKLOG_LIMIT
from etcdsched.runtime.clock import Clock, SystemClock
from etcdsched.runtime.metrics import FIRING_HELD

log = logging.getLogger(__name__)

RECHECK_S = 1.0
"""A held firer looks again at least this often even unwoken (a queued run
cancelled meanwhile lowers the backlog without placement looking at it)."""
LOG_EVERY_S = 60.0
"""Holds are logged at most this often (past its ceiling a scheduler holds
many times a second), with how many there were since the last line."""


class FiringBrake:
    """Shared by a scheduler's partition firers, checked before each batch;
    placement calls :meth:`poke` whenever it has looked at runs."""

    def __init__(
        self, backlog: Callable[[], int], clock: Clock, limit: int = BACKLOG_LIMIT
    ) -> None:
        """``backlog``: fired runs not yet looked at by placement."""
        self.backlog = backlog
        self.clock = clock
        self.limit = limit
        self._free = asyncio.Event()
        self._free.set()
        self._holds = 0
        self._logged_at: float | None = None

    def engaged(self) -> bool:
        held = self.backlog() >= self.limit
        if held:
            self._free.clear()
        else:
            self._free.set()
        return held

    def poke(self) -> None:
        """Look again (wakes held firers once it is released)."""
        self.engaged()

    async def released(self) -> None:
        """Return once firing may go on."""
        if not self.engaged():
            return
        self._count_hold()
        while self.engaged():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(RECHECK_S):
                    await self._free.wait()

    def _count_hold(self) -> None:
        FIRING_HELD.inc()
        self._holds += 1
        now = self.clock.monotonic()
        if self._logged_at is not None and now - self._logged_at < LOG_EVERY_S:
            return
        since = "" if self._logged_at is None else f" in the last {now - self._logged_at:.0f} s"
        log.warning(
            "firing held %d time(s)%s: %d fired runs wait unread by placement (limit %d);"
            " their slots wait in the due index (ADR 0014)",
            self._holds,
            since,
            self.backlog(),
            self.limit,
        )
        self._holds, self._logged_at = 0, now


class NoBrake(FiringBrake):
    """Never engaged: a firer on its own (tools and tests)."""

    def __init__(self) -> None:
        super().__init__(lambda: 0, SystemClock())
