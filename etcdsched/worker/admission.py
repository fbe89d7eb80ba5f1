"""How many attempts a worker takes through its start path at once.

A worker may be assigned far more runs due at one instant than it can
start in a second: 50,000 one-off jobs at midnight on one worker with
50,000 slots. Claimed and forked all at once, they would keep its event
loop busy for minutes (a fork, three pipes, a gate and two writes each),
and every run would be claimed long before it could start. Instead each
attempt waits for its turn before it claims: at most
``worker_start_window`` (256 by default) are between their claim and
their start, so claims follow the worker's measured start rate (a closed
loop: a turn is given back when its job has started), and the rest wait
in memory, unclaimed, in the order they are due: earliest not-before
first, then higher priority.

An attempt that is not due soon takes no turn until shortly before its
instant, so runs far ahead never hold a turn a due one needs.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools

from etcdsched.worker.interrupts import Interrupt, wait_or_interrupt


class StartAdmission:
    """Turns through the start path, handed out in due order."""

    def __init__(self, window: int) -> None:
        self.window = window
        self.inside = 0
        self._waiting: list[tuple[int, int, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def turn(self, not_before_ms: int, priority: int) -> Turn:
        """An attempt's turn: :meth:`Turn.take` it, :meth:`Turn.give_back` it."""
        return Turn(self, (not_before_ms, -priority, next(self._seq)))

    def _request(self, order: tuple[int, int, int]) -> asyncio.Future[None]:
        """A future resolved when the turn is granted (at once if one is
        free and nobody waits); cancel it to leave the queue."""
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.inside < self.window and not self._waiting:
            self.inside += 1
            granted.set_result(None)
        else:
            heapq.heappush(self._waiting, (*order, granted))
        return granted

    def _release(self) -> None:
        self.inside -= 1
        while self._waiting and self.inside < self.window:
            *_, granted = heapq.heappop(self._waiting)
            if not granted.done():  # else its attempt stopped waiting
                self.inside += 1
                granted.set_result(None)


class Turn:
    """One attempt's place in the start path."""

    def __init__(self, admission: StartAdmission, order: tuple[int, int, int]) -> None:
        self._admission = admission
        self._order = order
        self._held = False

    async def take(self, *interrupts: Interrupt) -> bool:
        """Wait for the turn, or until one of ``interrupts`` is set (then
        the attempt goes on without one, only to end unstarted). True if
        the turn is held."""
        granted = self._admission._request(self._order)
        try:
            if not granted.done():
                await wait_or_interrupt(granted, *interrupts)
        finally:
            if granted.done() and not granted.cancelled():
                self._held = True
            else:
                granted.cancel()
        return self._held

    def give_back(self) -> None:
        """Let the next attempt in (the job started, or the attempt ended).
        Idempotent."""
        if self._held:
            self._held = False
            self._admission._release()
