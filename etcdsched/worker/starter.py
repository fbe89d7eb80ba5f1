"""Opening a prepared job's gate at its instant (ADR 0008).

A worker prepares a job shortly before its not-before instant (the fork
happens then, behind the gate, see :class:`~etcdsched.worker.executor.Prepared`)
and hands it to a starter, which opens the gate at the instant, if the
worker's session still holds then, and says when it did.

* :class:`ThreadStarter` (the agents) opens gates from a thread of its own:
  how late a job starts then depends on that thread getting a CPU and the
  GIL, not on how many callbacks the event loop has queued at that moment.
* :class:`LoopStarter` opens them from a task on the event loop, on the
  service's clock (tests with a fake clock).

Exactly one side decides each :class:`StartTicket`: the starter opens the
gate (or refuses, the session being lost), or the attempt withdraws it
first (revoked, cancelled, shutting down). A lock makes that one decision.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from etcdsched.runtime.clock import Clock
from etcdsched.worker.executor import Prepared

log = logging.getLogger(__name__)


class StartTicket:
    """One prepared job waiting for its instant. ``started`` resolves to the
    wall-clock ms at which the gate was opened, or None if the starter
    refused (the session no longer holds), or raises why the gate could not
    be opened; it never resolves once withdrawn."""

    def __init__(self, prepared: Prepared, may_start: Callable[[], bool]) -> None:
        self.prepared = prepared
        self._may_start = may_start
        self.loop = asyncio.get_running_loop()
        self.started: asyncio.Future[int | None] = self.loop.create_future()
        self._decided = False
        self._lock = threading.Lock()

    def fire(self, now_ms: Callable[[], int]) -> None:
        """Decide, then resolve ``started`` on its loop: see :meth:`decide`."""
        outcome = self.decide(now_ms)
        if outcome is not None:
            _post(self.loop, [outcome])

    def decide(self, now_ms: Callable[[], int]) -> Outcome | None:
        """Open the gate (unless withdrawn or the session is lost) and say
        when; None if the attempt withdrew first. The caller hands the
        outcome to :func:`_post`, on the thread it likes: a starter with a
        thousand jobs due at one instant opens every gate first and wakes
        the event loop once. A gate that cannot be opened (its process
        died: the watchdog kills gated jobs too) makes ``started`` raise
        that error; it never escapes here, where it would end the starter's
        thread."""
        with self._lock:
            if self._decided:
                return None
            self._decided = True
            stamp, error = None, None
            try:
                if self._may_start():
                    self.prepared.open()
                    stamp = now_ms()
            except Exception as exc:
                error = exc
        return Outcome(self, stamp, error)

    def withdraw(self) -> bool:
        """Take the job back if the gate has not been opened: True = it never
        will be (the caller aborts it); False = the starter decided first."""
        with self._lock:
            if self._decided:
                return False
            self._decided = True
            return True

    def _resolve(self, stamp: int | None, error: Exception | None) -> None:
        if self.started.done():
            return
        if error is not None:
            self.started.set_exception(error)
        else:
            self.started.set_result(stamp)


@dataclass(frozen=True)
class Outcome:
    """What the starter decided for one ticket, to be delivered on its loop."""

    ticket: StartTicket
    stamp: int | None
    error: Exception | None


def _post(loop: asyncio.AbstractEventLoop, outcomes: list[Outcome]) -> None:
    """Resolve ``outcomes`` (all of tickets made on ``loop``) with one
    callback on that loop: one wake-up however many opened together."""

    def resolve_all() -> None:
        for outcome in outcomes:
            try:
                outcome.ticket._resolve(outcome.stamp, outcome.error)
            except Exception:  # never leave the rest of the batch waiting
                log.exception("starter: a ticket's outcome could not be delivered")

    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
        loop.call_soon_threadsafe(resolve_all)


class Starter(Protocol):
    def schedule(
        self, prepared: Prepared, at_ms: int, may_start: Callable[[], bool]
    ) -> StartTicket:
        """Open ``prepared`` at wall-clock ``at_ms`` (at once if it passed),
        provided ``may_start()`` is true then. Call on the event loop."""
        ...

    def close(self) -> None:
        """Stop; tickets not yet fired stay undecided (their attempts withdraw them)."""
        ...


class LoopStarter:
    """Fires tickets from event-loop tasks, on the service's clock."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._tasks: set[asyncio.Task[None]] = set()

    def schedule(
        self, prepared: Prepared, at_ms: int, may_start: Callable[[], bool]
    ) -> StartTicket:
        ticket = StartTicket(prepared, may_start)
        task = asyncio.create_task(self._fire_at(ticket, at_ms), name="start-at")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return ticket

    async def _fire_at(self, ticket: StartTicket, at_ms: int) -> None:
        await self._clock.sleep_until_ms(at_ms)
        ticket.fire(self._clock.now_ms)

    def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


class ThreadStarter:
    """Fires tickets from one daemon thread, on the system clock."""

    def __init__(self) -> None:
        self._due: list[tuple[int, int, StartTicket]] = []
        self._seq = itertools.count()
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    def schedule(
        self, prepared: Prepared, at_ms: int, may_start: Callable[[], bool]
    ) -> StartTicket:
        ticket = StartTicket(prepared, may_start)
        with self._wake:
            if self._thread is None:
                self._thread = threading.Thread(target=self._main, name="starter", daemon=True)
                self._thread.start()
            heapq.heappush(self._due, (at_ms, next(self._seq), ticket))
            if self._due[0][2] is ticket:  # else the thread's wait already ends in time
                self._wake.notify()
        return ticket

    def close(self) -> None:
        with self._wake:
            self._closed = True
            self._wake.notify()

    def _main(self) -> None:
        while True:
            due = self._next_due()
            if due is None:
                return
            by_loop: dict[asyncio.AbstractEventLoop, list[Outcome]] = {}
            for ticket in due:
                try:
                    outcome = ticket.decide(_wall_ms)
                except Exception:  # never lose the thread: every later job would wait
                    log.exception("starter: a ticket failed to fire")
                    continue
                if outcome is not None:
                    by_loop.setdefault(ticket.loop, []).append(outcome)
            for loop, outcomes in by_loop.items():
                _post(loop, outcomes)

    def _next_due(self) -> list[StartTicket] | None:
        """Wait until the earliest ticket is due; all due ones. None = closed.
        Re-reads the wall clock after every wake-up (it may have been stepped)."""
        with self._wake:
            while not self._closed:
                now = _wall_ms()
                if self._due and self._due[0][0] <= now:
                    due = []
                    while self._due and self._due[0][0] <= now:
                        due.append(heapq.heappop(self._due)[2])
                    return due
                self._wake.wait((self._due[0][0] - now) / 1000 if self._due else None)
            return None
