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
looked at (:meth:`~etcdsched.placer.PartitionPlacer.unexamined`): runs it
looked at and could not place (no worker with the labels, ``queue_one``) do
not hold firing, and neither do retries waiting out their backoff. With
every worker full, placement looks at nothing, so at most
:data:`BACKLOG_LIMIT` fired runs wait in the queue for room and the later
slots wait unfired.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from etcdsched.metrics import FIRING_HELD

BACKLOG_LIMIT = 1000
"""Fired runs placement has not looked at, across the scheduler's
partitions, at which firing waits. Below saturation placement looks at each
fired run within one gathering wait (50 ms, about 80 runs at the ceiling),
so the brake never engages; 1,000 keeps placement fed across a firing
round trip while bounding the pile."""
RECHECK_S = 1.0
"""A held firer looks again at least this often even unwoken (a queued run
cancelled meanwhile lowers the backlog without placement looking at it)."""


class FiringBrake:
    """Shared by a scheduler's partition firers, checked before each batch;
    placement calls :meth:`poke` whenever it has looked at runs."""

    def __init__(self, backlog: Callable[[], int], limit: int = BACKLOG_LIMIT) -> None:
        """``backlog``: fired runs not yet looked at by placement."""
        self.backlog = backlog
        self.limit = limit
        self._free = asyncio.Event()
        self._free.set()

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
        FIRING_HELD.inc()
        while self.engaged():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(RECHECK_S):
                    await self._free.wait()


class NoBrake(FiringBrake):
    """Never engaged: a firer on its own (tools and tests)."""

    def __init__(self) -> None:
        super().__init__(lambda: 0)
