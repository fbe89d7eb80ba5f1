"""Starting an attempt's job at its instant (ADR 0008).

The job is *prepared* shortly before its not-before instant: forked behind
its gate (:class:`~etcdsched.worker.executor.Prepared`), its process group already
guarded by the watchdog. At the instant the worker's starter opens the gate,
if the session still holds. Forking ahead takes the fork, the pipes and the
event loop's queue off the critical instant; the gate keeps the job itself
from running a moment early.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from etcdsched.logs.store import LogWriter
from etcdsched.model.records import RunRecord
from etcdsched.store.session import Session
from etcdsched.worker.executor import Prepared
from etcdsched.worker.host import WorkerHost
from etcdsched.worker.interrupts import wait_or_interrupt
from etcdsched.worker.running import Running

PRESTART_MS = 500
"""How long before its instant a job is prepared."""
PRESTART_LIMIT = 256
"""At most this many prepared jobs wait at their gates per worker (each is
a process and three pipes); more due at once are prepared at the instant."""
WATCHDOG_HANG_MARGIN_S = 2.0
"""The watchdog kills a job with a timeout this long before its hang
deadline (recovery's hung verdict, ``HUNG_SLACK_MS`` after timeout + grace,
on the scheduler's clock): the rerun a verdict allows must find it dead."""


async def until(worker: WorkerHost, item: Running, wall_ms: int) -> None:
    """Sleep until ``wall_ms``, or until the attempt is revoked or shut down."""
    sleep = asyncio.create_task(worker.clock.sleep_until_ms(wall_ms))
    try:
        await wait_or_interrupt(sleep, item.revoked, item.shutdown)
    finally:
        sleep.cancel()


class InstantStart:
    """One attempt's way from prepared to started. ``make_room``, then
    ``prepare``, then ``started_ms``."""

    def __init__(self, worker: WorkerHost, item: Running, session: Session) -> None:
        self.w = worker
        self.item = item
        self.session = session
        self.at_ms = item.assignment.not_before_ms
        self._early = False
        """We count in ``worker.gated`` (prepared ahead, gate still shut)."""

    async def make_room(self) -> None:
        """Before the instant, take a place among the jobs waiting at their
        gates; if ``PRESTART_LIMIT`` already wait, wait for the instant.
        Then check the session: raises (leaving the place) if it is lost."""
        if self.w.clock.now_ms() < self.at_ms:
            if self.w.gated < PRESTART_LIMIT:
                self.w.gated += 1
                self._early = True
            else:
                await until(self.w, self.item, self.at_ms)
        if not self.session.holds():
            self._leave_room()
            self.session.check()

    async def prepare(self, run: RunRecord, writer: LogWriter) -> Prepared:
        """The executor's prepared job; raises what the executor raises."""
        try:
            prepared = await self.w.executor.prepare(
                run, run.attempt, self.w.member_id, writer, guard=self._guard()
            )
        except BaseException:
            self._leave_room()
            raise
        if not prepared.holds_process:
            self._leave_room()
        return prepared

    def _guard(self) -> Callable[[int], None]:
        """How the job's process group is handed to the watchdog: with the
        attempt's hang deadline, if it has one, on the monotonic clock."""
        deadline_ms = self.item.hang_deadline_ms
        if deadline_ms is None:
            return self.w.watchdog.add
        left_s = (deadline_ms - self.w.clock.now_ms()) / 1000 - WATCHDOG_HANG_MARGIN_S
        kill_at = time.monotonic() + left_s
        return lambda pgid: self.w.watchdog.add(pgid, kill_at)

    async def started_ms(self, prepared: Prepared) -> int | None:
        """Wall ms at which the starter opened the gate; None if it never
        will: the attempt was revoked, cancelled or shut down first, or the
        session was lost by the instant. Then the job is aborted at its
        gate without having run."""
        try:
            if self.item.interrupted():
                return None  # e.g. cancelled while it was being prepared
            return await self._opened(prepared)
        finally:
            prepared.abort()  # closes a gate that did not open; a no-op once it opened
            self._leave_room()

    async def _opened(self, prepared: Prepared) -> int | None:
        ticket = self.w.starter.schedule(prepared, self.at_ms, self.session.holds)
        try:
            await wait_or_interrupt(ticket.started, *self.item.interrupts())
            return None if ticket.withdraw() else await ticket.started
        finally:
            ticket.withdraw()  # cancelled meanwhile: it never opens after this

    def abandon(self, prepared: Prepared) -> None:
        """Give a prepared job up before its gate was handed to the starter."""
        prepared.abort()
        self._leave_room()

    def _leave_room(self) -> None:
        if self._early:
            self._early = False
            self.w.gated -= 1
